/* Integer quantized products: activations quantized to 8 bits per block
 * (k_q8a) times GGUF weight blocks, the scalar reference of the x86
 * instances in qdot_x86.c, and k_qmatmul_mt, which spreads a product over
 * the kernels' thread pool.
 *
 * Per block the reference computes the integer sum exactly and then
 *   Q8_0:  dw * da * sum(w q)
 *   Q4_0:  dw * da * sum(n q) - 8 dw * sa      (n: the nibbles 0..15)
 *   Q4_1:  dw * da * sum(n q) + mw * sa
 * where sa = da * sum(q) is stored with the activation block. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/qdot_x86.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_avx2.h"
#include "kernels/cpu/threads.h"
#include "kernels/kernels.h"

int k_cpu_isa(void)
{
    static int isa = -1; /* benign race: every thread computes the same value */
    if (isa < 0) {
        int best = k__cpu_isa();
        const char *cap = getenv("BATON_CPU_ISA");
        int want = !cap                        ? best
                   : strcmp(cap, "ref") == 0   ? K_ISA_REF
                   : strcmp(cap, "avx2") == 0  ? K_ISA_AVX2
                                               : best;
        isa = want < best ? want : best;
    }
    return isa;
}

void k_quantize_act(k_q8a *a, const float *x, size_t n, int isa)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (isa >= K_ISA_VNNI) {
        k__quant_act_vnni(a, x, n);
        return;
    }
    if (isa >= K_ISA_AVX2) {
        k__quant_act_avx2(a, x, n);
        return;
    }
#else
    (void)isa;
#endif
    for (size_t b = 0; b < n / K_QK; b++, x += K_QK) {
        float amax = 0;
        for (int i = 0; i < K_QK; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int i = 0; i < K_QK; i++) {
            int q = (int)nearbyintf(x[i] * id);
            a[b].q[i] = (int8_t)q;
            sum += q;
        }
        a[b].d = d;
        a[b].s = d * (float)sum;
    }
}

/* One weight block times one activation block, as the header comment
 * says. */
static float block_dot_ref(const uint8_t *b, kdtype t, const k_q8a *a)
{
    float dw = k_load_f16(b);
    int sum = 0;
    if (t == KD_Q8_0) {
        for (int i = 0; i < K_QK; i++)
            sum += (int8_t)b[2 + i] * a->q[i];
        return dw * a->d * (float)sum;
    }
    const uint8_t *qs = b + (t == KD_Q4_1 ? 4 : 2);
    for (int i = 0; i < 16; i++)
        sum += (qs[i] & 0x0f) * a->q[i] + (qs[i] >> 4) * a->q[16 + i];
    float c = t == KD_Q4_1 ? k_load_f16(b + 2) : -8.0f * dw;
    return dw * a->d * (float)sum + c * a->s;
}

int k_qmatmul_q8(float *y, size_t ldy, const void *w, kdtype t, const k_q8a *a, int m, int r0,
                 int r1, int cols, int isa)
{
    size_t bb = k_block_bytes(t);
    if (!bb || cols % K_QK || m < 0 || r0 < 0 || r1 < r0)
        return -EINVAL;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (isa >= K_ISA_VNNI) {
        k__qmm_q8_vnni(y, ldy, w, t, a, m, r0, r1, cols);
        return 0;
    }
    if (isa >= K_ISA_AVX2) {
        k__qmm_q8_avx2(y, ldy, w, t, a, m, r0, r1, cols);
        return 0;
    }
#else
    (void)isa;
#endif
    int nb = cols / K_QK;
    for (int r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * nb * bb;
        for (int j = 0; j < m; j++) {
            const k_q8a *aj = a + (size_t)j * nb;
            float acc = 0;
            for (int blk = 0; blk < nb; blk++)
                acc += block_dot_ref(wr + (size_t)blk * bb, t, aj + blk);
            y[(size_t)j * ldy + r] = acc;
        }
    }
    return 0;
}

/* ---- on the thread pool --------------------------------------------------------- */

/* Weight rows per share: a multiple of the x86 tile's 4, and enough that
 * a thread's share of a narrow product is not all overhead. */
#define ROW_GRAIN 16

typedef struct qmm_job {
    float *y;
    const void *w;
    kdtype t;
    const float *x;
    k_q8a *a;        /* the quantized X (scratch) */
    int m, rows, cols;
    int isa;
    int phase;       /* 0: quantize X; 1: integer products; 2: f32 products */
    bool invariant;  /* phase 1 a row of X at a time (K_QMM_INVARIANT) */
} qmm_job;

static void qmm_part(void *arg, int ith, int nth)
{
    qmm_job *j = arg;
    int lo, hi;
    if (j->phase == 0) {
        /* Rows of X, split evenly (each is cheap). */
        kth_split(j->m, 1, ith, nth, &lo, &hi);
        int nb = j->cols / K_QK;
        if (hi > lo)
            k_quantize_act(j->a + (size_t)lo * nb, j->x + (size_t)lo * j->cols,
                           (size_t)(hi - lo) * (size_t)j->cols, j->isa);
        return;
    }
    kth_split(j->rows, ROW_GRAIN, ith, nth, &lo, &hi);
    if (hi <= lo)
        return;
    if (j->phase == 1) {
        int nb = j->cols / K_QK;
        for (int r = 0; j->invariant && r < j->m; r++)
            k_qmatmul_q8(j->y + (size_t)r * j->rows, (size_t)j->rows, j->w, j->t,
                         j->a + (size_t)r * nb, 1, lo, hi, j->cols, j->isa);
        if (!j->invariant)
            k_qmatmul_q8(j->y, (size_t)j->rows, j->w, j->t, j->a, j->m, lo, hi, j->cols, j->isa);
        return;
    }
    size_t wrow = (size_t)(j->cols / K_QK) * k_block_bytes(j->t);
    const uint8_t *w = (const uint8_t *)j->w + (size_t)lo * wrow;
    if (j->isa >= K_ISA_AVX2) {
        k__qmatmul_avx2(j->y + lo, (size_t)j->rows, w, j->t, j->x, j->m, hi - lo, j->cols);
        return;
    }
    for (int r = 0; r < j->m; r++)
        k_qmatvec_ref(j->y + (size_t)r * j->rows + lo, w, j->t, j->x + (size_t)r * j->cols,
                      hi - lo, j->cols);
}

int k_qmatmul_mt(kth_pool *pool, float *y, const void *w, kdtype t, const float *x, int m,
                 int rows, int cols, int flags)
{
    if (!k_block_bytes(t) || cols % K_QK || rows < 0 || m < 0)
        return -EINVAL;
    bool act_q8 = flags & K_QMM_Q8;
    qmm_job j = {y, w, t, x, NULL, m, rows, cols, k_cpu_isa(), act_q8 ? 0 : 2,
                 (flags & K_QMM_INVARIANT) != 0};
    bool held = kth_acquire(pool) == 0;
    kth_pool *use = held ? pool : NULL;
    size_t abytes = (size_t)m * (size_t)(cols / K_QK) * sizeof(k_q8a);
    void *own = NULL;
    if (act_q8) {
        j.a = held ? kth_scratch(pool, abytes) : (own = malloc(abytes ? abytes : 1));
        if (!j.a) {
            kth_release(held ? pool : NULL);
            return -ENOMEM;
        }
        /* Quantizing a row costs about one weight row's product, so a few
         * rows are quantized here rather than woken threads for. */
        if (m >= 8)
            kth_run(use, qmm_part, &j);
        else
            qmm_part(&j, 0, 1);
        j.phase = 1;
    }
    kth_run(use, qmm_part, &j);
    if (held)
        kth_release(pool);
    free(own);
    return 0;
}
