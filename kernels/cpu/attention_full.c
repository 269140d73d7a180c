/* The fast CPU path of KOP_ATTN, attention without a mask or a cache.
 *
 * Whisper's encoder attends 1500 positions to 1500: as matrix products that
 * is two sgemm calls per (sequence, head), scores = Q K^T and out = P V,
 * which OpenBLAS runs on its own threads near the machine's peak, while a
 * query at a time reads every key once per query from memory.  The score
 * matrix of one head (T x S floats, 9 MB at 1500 x 1500) is the price.
 *
 * A decoder step's cross-attention has a query or a few per sequence: there
 * the products are too thin for sgemm to pay, and the queries are spread
 * over the kernels' thread pool instead, one (sequence, head, query) per
 * task.  With AVX2 a task is attention_fast.c's vectorized query (sums 8
 * lanes at a time, e^x from a polynomial), which took a cross-attention of
 * Whisper base from about 8 ms a token to a few tenths of one; without it,
 * the reference's arithmetic (k_attn_full_ref) in the same order, to the
 * last bit.  Either way a query is one task on one thread, so the number of
 * threads changes no bit. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "kernels/cpu/attention_fast.h"
#include "kernels/cpu/threads.h"
#include "kernels/kernels.h"

/* From this many queries per sequence on, the scores are one sgemm. */
#define FULL_GEMM_MIN_T 16

typedef struct full_job {
    float *out;
    const float *q, *k, *v;
    const uint16_t *k16, *v16;  /* non-NULL: K and V in f16 (then K, V are NULL) */
    int nb, t, s, n_head, hd;
    int failed;     /* set by a thread that found no memory */
} full_job;

/* One query of one head: the reference's loop (attention.c's attend_one),
 * with its scratch row SC of S floats. */
static void attend_row(float *out, const float *q, const float *k, const float *v, int s,
                       size_t row, int hd, float *sc)
{
    float scale = 1.0f / sqrtf((float)hd), m = -INFINITY;
    for (int j = 0; j < s; j++) {
        const float *kj = k + (size_t)j * row;
        float d = 0;
        for (int i = 0; i < hd; i++)
            d += q[i] * kj[i];
        sc[j] = d * scale;
        m = sc[j] > m ? sc[j] : m;
    }
    float sum = 0;
    for (int j = 0; j < s; j++) {
        sc[j] = expf(sc[j] - m);
        sum += sc[j];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < hd; i++)
        out[i] = 0;
    for (int j = 0; j < s; j++) {
        const float *vj = v + (size_t)j * row;
        float p = sc[j] * inv;
        for (int i = 0; i < hd; i++)
            out[i] += p * vj[i];
    }
}

static void full_rows(void *arg, int ith, int nth)
{
    full_job *j = arg;
    int n = j->nb * j->t * j->n_head, lo, hi;
    kth_split(n, 1, ith, nth, &lo, &hi);
    if (lo >= hi)
        return;
    float *sc = malloc((size_t)j->s * sizeof(float));
    if (!sc) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    size_t row = (size_t)j->n_head * j->hd;
    bool fast = k__attend_f32_ok(j->hd);
    for (int r = lo; r < hi; r++) {
        int h = r % j->n_head, i = r / j->n_head % j->t, b = r / j->n_head / j->t;
        size_t qo = ((size_t)b * j->t + i) * row + (size_t)h * j->hd;
        size_t ko = (size_t)b * j->s * row + (size_t)h * j->hd;
        if (j->k16)
            k__attend_f16(j->out + qo, j->q + qo, j->k16 + ko, j->v16 + ko, j->s, row, j->hd, sc);
        else if (fast)
            k__attend_f32(j->out + qo, j->q + qo, j->k + ko, j->v + ko, j->s, row, j->hd, sc);
        else
            attend_row(j->out + qo, j->q + qo, j->k + ko, j->v + ko, j->s, row, j->hd, sc);
    }
    free(sc);
}

/* J's queries on the threads of POOL (NULL or held elsewhere: the
 * caller's).  0, or -ENOMEM. */
static int run_rows(kth_pool *pool, full_job *j)
{
    if (pool && kth_acquire(pool) == 0) {
        kth_run(pool, full_rows, j);
        kth_release(pool);
    } else {
        full_rows(j, 0, 1);
    }
    return j->failed ? -ENOMEM : 0;
}

/* The softmax of rows of a score matrix, shared out over the pool. */
typedef struct softmax_job {
    float *p;
    int t, s;
} softmax_job;

static void softmax_rows(void *arg, int ith, int nth)
{
    softmax_job *j = arg;
    int lo, hi;
    kth_split(j->t, 8, ith, nth, &lo, &hi);
    if (lo >= hi)
        return;
    float *p = j->p + (size_t)lo * j->s;
    if (k__attend_f32_ok(8))
        k__softmax_f32(p, hi - lo, j->s);
    else
        k_softmax(p, p, hi - lo, j->s);
}

int k_attn_full(kth_pool *pool, float *out, const float *q, const float *k, const float *v, int nb,
                int t, int s, int n_head, int hd)
{
    if (nb <= 0 || t <= 0)
        return 0;
    if (t < FULL_GEMM_MIN_T) {
        full_job j = {out, q, k, v, NULL, NULL, nb, t, s, n_head, hd, 0};
        return run_rows(pool, &j);
    }
    int row = n_head * hd;
    float *p = malloc((size_t)t * s * sizeof(float));
    if (!p)
        return -ENOMEM;
    float scale = 1.0f / sqrtf((float)hd);
    /* The products run on OpenBLAS's threads, the softmax between them on
     * the pool's (each row as one call computes it, so the threads change
     * no bit). */
    bool held = pool && kth_acquire(pool) == 0;
    softmax_job sj = {p, t, s};
    for (int b = 0; b < nb; b++)
        for (int h = 0; h < n_head; h++) {
            const float *qb = q + (size_t)b * t * row + (size_t)h * hd;
            const float *kb = k + (size_t)b * s * row + (size_t)h * hd;
            const float *vb = v + (size_t)b * s * row + (size_t)h * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, s, hd, scale, qb, row, kb, row,
                        0.0f, p, s);
            if (held)
                kth_run(pool, softmax_rows, &sj);
            else
                softmax_rows(&sj, 0, 1);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, hd, s, 1.0f, p, s, vb, row,
                        0.0f, out + (size_t)b * t * row + (size_t)h * hd, row);
        }
    if (held)
        kth_release(pool);
    free(p);
    return 0;
}

int k_attn_full_kv16(kth_pool *pool, float *out, const float *q, const uint16_t *k,
                     const uint16_t *v, int nb, int t, int s, int n_head, int hd)
{
    if (nb <= 0 || t <= 0)
        return 0;
    if (t < FULL_GEMM_MIN_T && k__attend_f32_ok(hd)) {
        full_job j = {out, q, NULL, NULL, k, v, nb, t, s, n_head, hd, 0};
        return run_rows(pool, &j);
    }
    /* Many queries (a prompt), or no AVX2: K and V widened, then the f32
     * path. */
    size_t n = (size_t)nb * s * n_head * hd;
    float *kf = malloc(n * sizeof(float)), *vf = malloc(n * sizeof(float));
    int rc = kf && vf ? 0 : -ENOMEM;
    if (!rc && !(rc = k_cast(kf, KD_F32, k, KD_F16, n)) && !(rc = k_cast(vf, KD_F32, v, KD_F16, n)))
        rc = k_attn_full(pool, out, q, kf, vf, nb, t, s, n_head, hd);
    free(kf);
    free(vf);
    return rc;
}
