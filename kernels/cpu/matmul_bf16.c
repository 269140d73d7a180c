/* Matrix products with bf16 weights on oneDNN (kernels.h, k_matmul_bf16).
 *
 * Whisper's encoder multiplies 1500 audio positions per window by every
 * matrix of its layers: 60 of its 87 GFLOP a window.  OpenBLAS runs them in
 * f32 at about 180 GFLOP/s on the 2-core machine this project is tested on
 * (a Xeon with AMX); oneDNN runs the same product with bf16 operands on the
 * AMX tiles at 300 to 600, and with AVX-512 BF16 on CPUs without AMX at
 * about twice f32.  OpenBLAS 0.3.21 as Debian builds it has no bf16 product,
 * and a hand-written AMX kernel would repeat what oneDNN already tunes.
 *
 * oneDNN has no product of f32 activations with bf16 weights: the
 * activations are first rounded to bf16 (to nearest even, as k_cast; with
 * AVX2 where the CPU has it), and the sums are kept in f32.  Primitives
 * are created per call; oneDNN's primitive cache makes a repeated shape a
 * lookup.
 *
 * Weights in plain rows ("ba" to oneDNN) are repacked by oneDNN on every
 * call into the blocks its AMX kernel reads: with a Whisper-sized matrix
 * that took most of a call, and for a block of rows that is no multiple of
 * 16 (the second thread's 732 of 1500 rows) a call ran ten times slower
 * than the whole product.  So a model packs its weights once, at load
 * (k_matmul_bf16_pack), into the layout oneDNN chooses for the shape, and
 * passes them packed.  That layout may depend on the number of rows and of
 * OpenMP threads oneDNN would use: it is always asked for ROW_GRAIN rows on
 * one thread, the products' own setting (packed_desc).
 *
 * oneDNN runs on OpenMP's threads (Debian builds it so).  On them, which
 * spin beside OpenBLAS's threads and the kernels' pool, the ops after each
 * product ran slower.  So each thread of the kernels' pool takes a block
 * of rows and runs oneDNN on itself alone (one OpenMP thread). */
#include <dnnl.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/half.h"
#include "kernels/cpu/threads.h"
#include "kernels/kernels.h"

/* Rows a thread takes at a time: whole AMX tiles of 16 rows, and enough
 * that a thread's block is worth a oneDNN call. */
#define ROW_GRAIN 64
/* Rows of one oneDNN call (rows() says why it is fixed). */
#define CHUNK 128

void omp_set_num_threads(int n);
int omp_get_max_threads(void);

static struct {
    pthread_once_t once;
    dnnl_engine_t engine; /* NULL: oneDNN could not start */
    bool native;          /* its bf16 product runs on AMX or AVX-512 BF16 */
} g = {PTHREAD_ONCE_INIT, NULL, false};

static void mm_desc(dnnl_memory_desc_t *a, dnnl_memory_desc_t *w, dnnl_memory_desc_t *y,
                    dnnl_memory_desc_t *af, int64_t m, int64_t n, int64_t k)
{
    dnnl_dims_t da = {m, k}, dw = {k, n}, dy = {m, n};
    /* Weights [N, K] row-major are the {K, N} matrix in order "ba". */
    dnnl_memory_desc_init_by_tag(a, 2, da, dnnl_bf16, dnnl_ab);
    dnnl_memory_desc_init_by_tag(w, 2, dw, dnnl_bf16, dnnl_ba);
    dnnl_memory_desc_init_by_tag(y, 2, dy, dnnl_f32, dnnl_ab);
    if (af)
        dnnl_memory_desc_init_by_tag(af, 2, da, dnnl_f32, dnnl_ab);
}

static void start(void)
{
    dnnl_engine_t e;
    if (dnnl_engine_create(&e, dnnl_cpu, 0) != dnnl_success)
        return;
    /* What oneDNN would run a Whisper-sized product on: its implementation
     * names the instructions ("brg:avx512_core_amx_bf16"); an emulated or
     * reference one would be slower than sgemm. */
    dnnl_memory_desc_t a, w, y;
    mm_desc(&a, &w, &y, NULL, 1500, 512, 512);
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    const char *impl = NULL;
    if (dnnl_matmul_desc_init(&md, &a, &w, NULL, &y) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &md, NULL, e, NULL) == dnnl_success) {
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
            impl)
            g.native = strstr(impl, "amx") || strstr(impl, "bf16");
        dnnl_primitive_desc_destroy(pd);
    }
    g.engine = e;
}

int k_matmul_bf16_native(void)
{
    pthread_once(&g.once, start);
    return g.native && k_cpu_isa() >= K_ISA_VNNI;
}

/* oneDNN's status as an error code. */
static int status_rc(dnnl_status_t s)
{
    return s == dnnl_success ? 0 : s == dnnl_out_of_memory ? -ENOMEM : -EIO;
}

/* Creates the primitive of descriptor OP_DESC (or a reorder from SRC to
 * DST when OP_DESC is NULL) and runs it with ARGS. */
static int run(const void *op_desc, const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dst,
               dnnl_stream_t st, int n_args, const dnnl_exec_arg_t *args)
{
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    dnnl_status_t s = op_desc ? dnnl_primitive_desc_create(&pd, op_desc, NULL, g.engine, NULL)
                              : dnnl_reorder_primitive_desc_create(&pd, src, g.engine, dst,
                                                                   g.engine, NULL);
    if (s == dnnl_success)
        s = dnnl_primitive_create(&p, pd);
    if (s == dnnl_success)
        s = dnnl_primitive_execute(p, st, n_args, args);
    if (s == dnnl_success)
        s = dnnl_stream_wait(st);
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
    return status_rc(s);
}

/* packed_desc on the OpenMP setting of the calling thread. */
static int packed_desc_one(dnnl_memory_desc_t *wd, int n, int k)
{
    dnnl_memory_desc_t a, y;
    mm_desc(&a, wd, &y, NULL, ROW_GRAIN, n, k);
    dnnl_dims_t dw = {k, n};
    dnnl_memory_desc_init_by_tag(wd, 2, dw, dnnl_bf16, dnnl_format_tag_any);
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    if (dnnl_matmul_desc_init(&md, &a, wd, NULL, &y) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &md, NULL, g.engine, NULL) != dnnl_success)
        return -EINVAL;
    const dnnl_memory_desc_t *q = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    int rc = q ? 0 : -EINVAL;
    if (q)
        *wd = *q;
    dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* The layout oneDNN's product of N x K bf16 weights prefers, into *WD, as
 * the products see it: for ROW_GRAIN rows on one OpenMP thread (oneDNN
 * narrows its blocks, and so the layout, when it has threads to spare). */
static int packed_desc(dnnl_memory_desc_t *wd, int n, int k)
{
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    int rc = packed_desc_one(wd, n, k);
    omp_set_num_threads(threads);
    return rc;
}

/* A[N] rounded to bf16 as k_cast rounds (to nearest even, NaN kept
 * quiet), sixteen at a time with AVX2 where the CPU has it. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "kernels/cpu/vmath_avx2.h"

/* The bf16 bits of finite X, rounded to nearest even, in the low halves. */
AVX2 static inline __m256i bf16_bits(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i r = _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                 _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
    return _mm256_srli_epi32(_mm256_add_epi32(u, r), 16);
}

/* Sixteen bf16 at P from the low halves of A and B. */
AVX2 static inline void store16(uint16_t *p, __m256i a, __m256i b)
{
    /* packus works within 128-bit halves: put the quarters back in order. */
    _mm256_storeu_si256((__m256i *)p, _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8));
}

AVX2 static void to_bf16_avx2(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 x0 = _mm256_loadu_ps(src + i), x1 = _mm256_loadu_ps(src + i + 8);
        /* A NaN lane takes the scalar rule's quiet NaN. */
        __m256 nan0 = _mm256_cmp_ps(x0, x0, _CMP_UNORD_Q), nan1 = _mm256_cmp_ps(x1, x1, _CMP_UNORD_Q);
        if (!_mm256_testz_ps(nan0, nan0) || !_mm256_testz_ps(nan1, nan1)) {
            for (size_t j = i; j < i + 16; j++)
                dst[j] = k_f32_to_bf16(src[j]);
            continue;
        }
        store16(dst + i, bf16_bits(x0), bf16_bits(x1));
    }
    for (; i < n; i++)
        dst[i] = k_f32_to_bf16(src[i]);
}
#endif

static void to_bf16(uint16_t *dst, const float *src, size_t n)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (k_cpu_isa() >= K_ISA_AVX2) {
        to_bf16_avx2(dst, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        dst[i] = k_f32_to_bf16(src[i]);
}

/* Rows [R0, R1) of Y on the calling thread, oneDNN on one thread; W packed
 * (k_matmul_bf16_pack) or in plain rows.  Every call to oneDNN takes CHUNK
 * rows (fewer rows rounded up to 16), the last chunk padded with zero
 * rows: oneDNN 2.6's AMX product runs some row counts ten times slower
 * than their neighbours (732, 1488 and 118 rows of K = 2048, against 736,
 * 1500 and 124), and one shape of call also makes one primitive. */
static int rows(float *y, const float *a, const void *w, bool packed, int r0, int r1, int n, int k)
{
    int m = r1 - r0, cm = m >= CHUNK ? CHUNK : (m + 15) / 16 * 16;
    omp_set_num_threads(1);
    dnnl_memory_desc_t ad, wd, yd;
    mm_desc(&ad, &wd, &yd, NULL, cm, n, k);
    if (packed && packed_desc(&wd, n, k))
        return -EINVAL;
    uint16_t *ab = malloc((size_t)cm * (size_t)k * sizeof(uint16_t));
    float *yt = malloc((size_t)cm * (size_t)n * sizeof(float)); /* a padded chunk's rows */
    dnnl_stream_t st = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    dnnl_memory_t mem[3] = {NULL, NULL, NULL}; /* a bf16, w, y */
    dnnl_matmul_desc_t md;
    int rc = ab && yt ? 0 : -ENOMEM;
    if (!rc && dnnl_matmul_desc_init(&md, &ad, &wd, NULL, &yd))
        rc = -EINVAL;
    dnnl_status_t s = dnnl_success;
    if (!rc) {
        s = dnnl_stream_create(&st, g.engine, dnnl_stream_default_flags);
        if (s == dnnl_success)
            s = dnnl_memory_create(&mem[0], &ad, g.engine, ab);
        if (s == dnnl_success)
            s = dnnl_memory_create(&mem[1], &wd, g.engine, (void *)w);
        if (s == dnnl_success)
            s = dnnl_memory_create(&mem[2], &yd, g.engine, yt);
        if (s == dnnl_success)
            s = dnnl_primitive_desc_create(&pd, &md, NULL, g.engine, NULL);
        if (s == dnnl_success)
            s = dnnl_primitive_create(&p, pd);
        rc = status_rc(s);
    }
    for (int r = r0; !rc && r < r1; r += cm) {
        int h = r1 - r < cm ? r1 - r : cm;
        to_bf16(ab, a + (size_t)r * k, (size_t)h * k);
        if (h < cm)
            memset(ab + (size_t)h * k, 0, (size_t)(cm - h) * k * sizeof(uint16_t));
        float *dst = h == cm ? y + (size_t)r * n : yt;
        dnnl_exec_arg_t args[3] = {
            {DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]}};
        if (dnnl_memory_set_data_handle(mem[2], dst) ||
            dnnl_primitive_execute(p, st, 3, args) || dnnl_stream_wait(st))
            rc = -EIO;
        else if (h < cm)
            memcpy(y + (size_t)r * n, yt, (size_t)h * n * sizeof(float));
    }
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
    for (int i = 0; i < 3; i++)
        dnnl_memory_destroy(mem[i]);
    dnnl_stream_destroy(st);
    free(yt);
    free(ab);
    return rc;
}

typedef struct bf16_job {
    float *y;
    const float *a;
    const void *w;
    bool packed;
    int m, n, k;
    int rc;                  /* the first thread's error, 0 while none */
} bf16_job;

static void bf16_rows(void *arg, int ith, int nth)
{
    bf16_job *j = arg;
    int lo, hi;
    kth_split(j->m, ROW_GRAIN, ith, nth, &lo, &hi);
    int rc = lo < hi ? rows(j->y, j->a, j->w, j->packed, lo, hi, j->n, j->k) : 0, none = 0;
    if (rc)
        __atomic_compare_exchange_n(&j->rc, &none, rc, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

static int product(kth_pool *pool, float *y, const float *a, const void *w, bool packed, int m,
                   int n, int k)
{
    if (m <= 0)
        return 0;
    pthread_once(&g.once, start);
    if (!g.engine || n <= 0 || k <= 0)
        return -EINVAL;
    if (m < 2 * ROW_GRAIN || !pool || kth_acquire(pool) != 0)
        return rows(y, a, w, packed, 0, m, n, k);
    bf16_job j = {y, a, w, packed, m, n, k, 0};
    kth_run(pool, bf16_rows, &j);
    kth_release(pool);
    return j.rc;
}


int k_matmul_bf16(kth_pool *pool, float *y, const float *a, const uint16_t *w, int m, int n, int k)
{
    return product(pool, y, a, w, false, m, n, k);
}

int k_matmul_bf16_packed(kth_pool *pool, float *y, const float *a, const void *w, int m, int n,
                         int k)
{
    return product(pool, y, a, w, true, m, n, k);
}

size_t k_matmul_bf16_packed_bytes(int n, int k)
{
    pthread_once(&g.once, start);
    dnnl_memory_desc_t wd;
    if (!g.engine || n <= 0 || k <= 0 || packed_desc(&wd, n, k))
        return 0;
    return dnnl_memory_desc_get_size(&wd);
}

int k_matmul_bf16_pack(void *dst, const uint16_t *w, int n, int k)
{
    pthread_once(&g.once, start);
    dnnl_memory_desc_t a, wd, y, pd;
    if (!g.engine || n <= 0 || k <= 0 || packed_desc(&pd, n, k))
        return -EINVAL;
    mm_desc(&a, &wd, &y, NULL, 1, n, k);
    dnnl_stream_t st = NULL;
    dnnl_memory_t from = NULL, to = NULL;
    dnnl_status_t s = dnnl_stream_create(&st, g.engine, dnnl_stream_default_flags);
    if (s == dnnl_success)
        s = dnnl_memory_create(&from, &wd, g.engine, (void *)w);
    if (s == dnnl_success)
        s = dnnl_memory_create(&to, &pd, g.engine, dst);
    int rc = status_rc(s);
    if (!rc) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
        rc = run(NULL, &wd, &pd, st, 2, args);
    }
    dnnl_memory_destroy(from);
    dnnl_memory_destroy(to);
    dnnl_stream_destroy(st);
    return rc;
}

/* ---- attention with bf16 products ------------------------------------------- */

/* e^(S[j] - max S) of a row of N scores, rounded to bf16 into P, and the
 * sum of the rounded values (the weights P . V then sums). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
AVX2 static float exp_row_bf16_avx2(const float *s, uint16_t *p, int n)
{
    float m = max_row(s, n);
    __m256 vm = _mm256_set1_ps(m), vs = _mm256_setzero_ps();
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        /* e^x is finite and positive: no NaN to keep. */
        __m256i u0 = bf16_bits(exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm)));
        __m256i u1 = bf16_bits(exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), vm)));
        store16(p + j, u0, u1);
        vs = _mm256_add_ps(vs, _mm256_castsi256_ps(_mm256_slli_epi32(u0, 16)));
        vs = _mm256_add_ps(vs, _mm256_castsi256_ps(_mm256_slli_epi32(u1, 16)));
    }
    float sum = hsum8(vs);
    for (; j < n; j++) {
        p[j] = k_f32_to_bf16(expf(s[j] - m));
        sum += k_bf16_to_f32(p[j]);
    }
    return sum;
}
#endif

static float exp_row_bf16(const float *s, uint16_t *p, int n)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (k_cpu_isa() >= K_ISA_AVX2)
        return exp_row_bf16_avx2(s, p, n);
#endif
    float m = -INFINITY, sum = 0;
    for (int j = 0; j < n; j++)
        m = s[j] > m ? s[j] : m;
    for (int j = 0; j < n; j++) {
        p[j] = k_f32_to_bf16(expf(s[j] - m));
        sum += k_bf16_to_f32(p[j]);
    }
    return sum;
}

/* X[N] as bf16 HI plus bf16 LO, the rounding error of HI: together about
 * 16 bits of X's 24. */
static void split_bf16(uint16_t *hi, uint16_t *lo, const float *x, int n)
{
    for (int i = 0; i < n; i++) {
        hi[i] = k_f32_to_bf16(x[i]);
        lo[i] = k_f32_to_bf16(x[i] - k_bf16_to_f32(hi[i]));
    }
}

/* The scores Q K^T are one bf16 product over three times the head's
 * dimension: [Qhi Qlo Qhi] . [Khi Khi Klo] = Qhi Khi + Qlo Khi + Qhi Klo,
 * all but the product of the two rounding errors.  Rounded once, Q and K
 * would give a score of tens an error of a tenth, which e^x turns into a
 * tenth of its weight; the weights themselves, rounded to bf16 after e^x,
 * are off by 2^-9 of themselves, and V's rows by as much, which the sum
 * over 1500 positions averages (splitting those too, tried, came no
 * closer to faster-whisper's words on the WER clips of tests/bench and
 * made the encoder a quarter slower). */
#define QK_SPLIT 3

typedef struct attn_job {
    float *out;
    const float *q, *k, *v;
    uint8_t *kp, *vp;      /* per (sequence, head): K^T and V packed for oneDNN */
    dnnl_memory_desc_t kd, vd; /* their packed layouts */
    size_t kb, vb;         /* bytes of one (sequence, head)'s packed K, V */
    int nb, t, s, n_head, hd;
    int rc;                /* the first thread's error, 0 while none */
} attn_job;

static void attn_fail(attn_job *j, int rc)
{
    int none = 0;
    __atomic_compare_exchange_n(&j->rc, &none, rc, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/* K and V of each (sequence, head) of this thread's share: gathered from
 * their rows, K split ([Khi Khi Klo] a row), V rounded, both packed. */
static void attn_pack(void *arg, int ith, int nth)
{
    attn_job *j = arg;
    int lo, hi, row = j->n_head * j->hd;
    kth_split(j->nb * j->n_head, 1, ith, nth, &lo, &hi);
    if (lo >= hi)
        return;
    omp_set_num_threads(1);
    size_t n = (size_t)j->s * j->hd, kw = (size_t)QK_SPLIT * j->hd;
    uint16_t *kb = malloc(QK_SPLIT * n * sizeof(uint16_t)), *vb = malloc(n * sizeof(uint16_t));
    dnnl_stream_t st = NULL;
    dnnl_memory_t mem[4] = {NULL, NULL, NULL, NULL}; /* k plain, k packed, v plain, v packed */
    dnnl_memory_desc_t kd, vd;
    dnnl_dims_t dk = {(dnnl_dim_t)kw, j->s}, dv = {j->s, j->hd};
    /* K^T as weights {3 HD, S} is the rows [S][3 HD]: order "ba". */
    dnnl_memory_desc_init_by_tag(&kd, 2, dk, dnnl_bf16, dnnl_ba);
    dnnl_memory_desc_init_by_tag(&vd, 2, dv, dnnl_bf16, dnnl_ab);
    int rc = kb && vb ? 0 : -ENOMEM;
    if (!rc && (dnnl_stream_create(&st, g.engine, dnnl_stream_default_flags) ||
                dnnl_memory_create(&mem[0], &kd, g.engine, kb) ||
                dnnl_memory_create(&mem[1], &j->kd, g.engine, DNNL_MEMORY_NONE) ||
                dnnl_memory_create(&mem[2], &vd, g.engine, vb) ||
                dnnl_memory_create(&mem[3], &j->vd, g.engine, DNNL_MEMORY_NONE)))
        rc = -ENOMEM;
    for (int bh = lo; !rc && bh < hi; bh++) {
        int b = bh / j->n_head, h = bh % j->n_head;
        for (int i = 0; i < j->s; i++) {
            size_t src = ((size_t)b * j->s + i) * row + (size_t)h * j->hd;
            uint16_t *kr = kb + (size_t)i * kw;
            split_bf16(kr, kr + 2 * j->hd, j->k + src, j->hd);
            memcpy(kr + j->hd, kr, (size_t)j->hd * sizeof(uint16_t));
            to_bf16(vb + (size_t)i * j->hd, j->v + src, (size_t)j->hd);
        }
        dnnl_exec_arg_t ka[2] = {{DNNL_ARG_FROM, mem[0]}, {DNNL_ARG_TO, mem[1]}};
        dnnl_exec_arg_t va[2] = {{DNNL_ARG_FROM, mem[2]}, {DNNL_ARG_TO, mem[3]}};
        if (dnnl_memory_set_data_handle(mem[1], j->kp + (size_t)bh * j->kb) ||
            dnnl_memory_set_data_handle(mem[3], j->vp + (size_t)bh * j->vb))
            rc = -EIO;
        if (!rc)
            rc = run(NULL, &kd, &j->kd, st, 2, ka);
        if (!rc)
            rc = run(NULL, &vd, &j->vd, st, 2, va);
    }
    for (int i = 0; i < 4; i++)
        dnnl_memory_destroy(mem[i]);
    dnnl_stream_destroy(st);
    free(kb);
    free(vb);
    if (rc)
        attn_fail(j, rc);
}

/* This thread's share of (sequence, head, chunk of CHUNK queries): scores
 * Q K^T by oneDNN, e^x rounded to bf16 (exp_row_bf16), their product with
 * V by oneDNN, each output row divided by its sum as it is copied out.  A
 * last chunk of fewer queries is padded with zero rows, as rows() pads. */
static void attn_chunks(void *arg, int ith, int nth)
{
    attn_job *j = arg;
    int row = j->n_head * j->hd, cm = j->t >= CHUNK ? CHUNK : (j->t + 15) / 16 * 16;
    int chunks = (j->t + cm - 1) / cm, lo, hi;
    kth_split(j->nb * j->n_head * chunks, 1, ith, nth, &lo, &hi);
    if (lo >= hi)
        return;
    omp_set_num_threads(1);
    size_t qw = (size_t)QK_SPLIT * j->hd;
    uint16_t *qb = malloc((size_t)cm * qw * sizeof(uint16_t));
    float *qs = malloc((size_t)j->hd * sizeof(float));
    float *sc = malloc((size_t)cm * j->s * sizeof(float));
    uint16_t *pb = malloc((size_t)cm * j->s * sizeof(uint16_t));
    float *ot = malloc((size_t)cm * j->hd * sizeof(float)); /* P V, dense */
    float *inv = malloc((size_t)cm * sizeof(float));
    dnnl_stream_t st = NULL;
    dnnl_primitive_desc_t pd[2] = {NULL, NULL};
    dnnl_primitive_t p[2] = {NULL, NULL};
    dnnl_memory_t mem[6] = {NULL, NULL, NULL, NULL, NULL, NULL}; /* q, k, s, p, v, o */
    dnnl_memory_desc_t qd, sd, pdd, od;
    dnnl_dims_t dq = {cm, (dnnl_dim_t)qw}, ds = {cm, j->s}, dout = {cm, j->hd};
    dnnl_memory_desc_init_by_tag(&qd, 2, dq, dnnl_bf16, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&sd, 2, ds, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&pdd, 2, ds, dnnl_bf16, dnnl_ab);
    /* P V into a dense block: with the output's row stride, oneDNN 2.6
     * takes its reference product, a hundred times slower. */
    dnnl_memory_desc_init_by_tag(&od, 2, dout, dnnl_f32, dnnl_ab);
    dnnl_matmul_desc_t m1, m2;
    int rc = qb && qs && sc && pb && ot && inv ? 0 : -ENOMEM;
    if (!rc && (dnnl_matmul_desc_init(&m1, &qd, &j->kd, NULL, &sd) ||
                dnnl_matmul_desc_init(&m2, &pdd, &j->vd, NULL, &od)))
        rc = -EINVAL;
    if (!rc) {
        dnnl_status_t s = dnnl_stream_create(&st, g.engine, dnnl_stream_default_flags);
        for (int i = 0; i < 2 && s == dnnl_success; i++) {
            s = dnnl_primitive_desc_create(&pd[i], i ? &m2 : &m1, NULL, g.engine, NULL);
            if (s == dnnl_success)
                s = dnnl_primitive_create(&p[i], pd[i]);
        }
        const dnnl_memory_desc_t *md[6] = {&qd, &j->kd, &sd, &pdd, &j->vd, &od};
        void *data[6] = {qb, DNNL_MEMORY_NONE, sc, pb, DNNL_MEMORY_NONE, ot};
        for (int i = 0; i < 6 && s == dnnl_success; i++)
            s = dnnl_memory_create(&mem[i], md[i], g.engine, data[i]);
        rc = status_rc(s);
    }
    float scale = 1.0f / sqrtf((float)j->hd);
    for (int task = lo; !rc && task < hi; task++) {
        int bh = task / chunks, r0 = task % chunks * cm;
        int b = bh / j->n_head, h = bh % j->n_head, n = j->t - r0 < cm ? j->t - r0 : cm;
        /* The queries, scaled as the reference scales the scores. */
        for (int i = 0; i < cm; i++) {
            uint16_t *qr = qb + (size_t)i * qw;
            if (i >= n) {
                memset(qr, 0, qw * sizeof(uint16_t));
                continue;
            }
            const float *src = j->q + ((size_t)b * j->t + r0 + i) * row + (size_t)h * j->hd;
            for (int d = 0; d < j->hd; d++)
                qs[d] = src[d] * scale;
            split_bf16(qr, qr + j->hd, qs, j->hd);
            memcpy(qr + 2 * j->hd, qr, (size_t)j->hd * sizeof(uint16_t));
        }
        dnnl_exec_arg_t a1[3] = {
            {DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]}};
        dnnl_exec_arg_t a2[3] = {
            {DNNL_ARG_SRC, mem[3]}, {DNNL_ARG_WEIGHTS, mem[4]}, {DNNL_ARG_DST, mem[5]}};
        if (dnnl_memory_set_data_handle(mem[1], j->kp + (size_t)bh * j->kb) ||
            dnnl_memory_set_data_handle(mem[4], j->vp + (size_t)bh * j->vb) ||
            dnnl_primitive_execute(p[0], st, 3, a1) ||
            dnnl_stream_wait(st)) {
            rc = -EIO;
            break;
        }
        for (int i = 0; i < n; i++)
            inv[i] = 1.0f / exp_row_bf16(sc + (size_t)i * j->s, pb + (size_t)i * j->s, j->s);
        if (n < cm)
            memset(pb + (size_t)n * j->s, 0, (size_t)(cm - n) * j->s * sizeof(uint16_t));
        if (dnnl_primitive_execute(p[1], st, 3, a2) || dnnl_stream_wait(st)) {
            rc = -EIO;
            break;
        }
        for (int i = 0; i < n; i++) {
            float *o = j->out + ((size_t)b * j->t + r0 + i) * row + (size_t)h * j->hd;
            const float *from = ot + (size_t)i * j->hd;
            for (int d = 0; d < j->hd; d++)
                o[d] = from[d] * inv[i];
        }
    }
    for (int i = 0; i < 6; i++)
        dnnl_memory_destroy(mem[i]);
    for (int i = 0; i < 2; i++) {
        dnnl_primitive_destroy(p[i]);
        dnnl_primitive_desc_destroy(pd[i]);
    }
    dnnl_stream_destroy(st);
    free(qb), free(qs), free(sc), free(pb), free(ot), free(inv);
    if (rc)
        attn_fail(j, rc);
}

int k_attn_full_bf16(kth_pool *pool, float *out, const float *q, const float *k, const float *v,
                     int nb, int t, int s, int n_head, int hd)
{
    if (nb <= 0 || t <= 0)
        return 0;
    pthread_once(&g.once, start);
    if (!g.engine || s <= 0 || n_head <= 0 || hd <= 0)
        return -EINVAL;
    attn_job j = {.out = out, .q = q, .k = k, .v = v, .nb = nb, .t = t, .s = s,
                  .n_head = n_head, .hd = hd};
    /* As weights {K, N}: K^T is {3 HD, S}, V is {S, HD}. */
    if (packed_desc(&j.kd, s, QK_SPLIT * hd) || packed_desc(&j.vd, hd, s))
        return -EINVAL;
    j.kb = dnnl_memory_desc_get_size(&j.kd), j.vb = dnnl_memory_desc_get_size(&j.vd);
    j.kp = malloc(j.kb * (size_t)nb * n_head);
    j.vp = malloc(j.vb * (size_t)nb * n_head);
    if (!j.kp || !j.vp) {
        free(j.kp), free(j.vp);
        return -ENOMEM;
    }
    bool held = pool && kth_acquire(pool) == 0;
    if (held) {
        kth_run(pool, attn_pack, &j);
        if (!j.rc)
            kth_run(pool, attn_chunks, &j);
        kth_release(pool);
    } else {
        attn_pack(&j, 0, 1);
        if (!j.rc)
            attn_chunks(&j, 0, 1);
    }
    free(j.kp), free(j.vp);
    return j.rc;
}
