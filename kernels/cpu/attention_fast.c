/* The fast CPU path of KOP_ATTN_PREFILL and KOP_ATTN_DECODE: the same
 * arithmetic as the references in attention.c (scores, max-subtracted
 * softmax, weighted sum of V), vectorized with AVX2 over the head dimension
 * and spread over the kernels' thread pool, one task per (query head, block
 * of queries).
 *
 * Tasks are taken from a shared counter rather than split evenly: under
 * the causal mask the last queries of a prompt attend to many more keys
 * than the first, so equal counts of queries are unequal work.
 *
 * Scratch is one score row per query, on the stack up to SCORES_ON_STACK
 * keys and on the heap beyond: memory grows with the context, never with
 * the square of the prompt. */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/threads.h"
#include "kernels/kernels.h"

#define SCORES_ON_STACK 4096
/* Queries per prefill task: enough to amortize taking a task, few enough
 * that two threads share a short prompt evenly. */
#define QUERY_BLOCK 16

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x for x <= 0 (scores minus their maximum), Cephes' polynomial after
 * range reduction by ln 2: about 2 ulp, and 0 below -87 (where expf
 * underflows to subnormals, whose share of a softmax row is nothing). */
AVX2 static inline __m256 exp_neg(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.3f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    __m256 x2 = _mm256_mul_ps(x, x);
    y = _mm256_fmadd_ps(y, x2, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

/* OUT[HD] = softmax(Q . K[j] * scale, j < CTX) . V[j], K and V rows ROW
 * floats apart; HD a multiple of 8.  S: CTX floats of scratch. */
AVX2 static void attend_avx2(float *out, const float *q, const float *kc, const float *vc,
                             int ctx, size_t row, int hd, float *s)
{
    float scale = 1.0f / sqrtf((float)hd);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int j = 0;
    /* Two keys at a time: two independent chains of FMAs. */
    for (; j + 2 <= ctx; j += 2) {
        const float *k0 = kc + (size_t)j * row, *k1 = k0 + row;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int i = 0; i < hd; i += 8) {
            __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + i), a1);
        }
        s[j] = hsum8(a0) * scale;
        s[j + 1] = hsum8(a1) * scale;
    }
    for (; j < ctx; j++) {
        const float *k0 = kc + (size_t)j * row;
        __m256 a0 = _mm256_setzero_ps();
        for (int i = 0; i < hd; i += 8)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k0 + i), a0);
        s[j] = hsum8(a0) * scale;
    }
    float m = -INFINITY;
    j = 0;
    for (; j + 8 <= ctx; j += 8)
        vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    m = _mm_cvtss_f32(h);
    for (; j < ctx; j++)
        m = s[j] > m ? s[j] : m;
    __m256 vm = _mm256_set1_ps(m), vsum = _mm256_setzero_ps();
    float sum = 0;
    j = 0;
    for (; j + 8 <= ctx; j += 8) {
        __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    for (; j < ctx; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    sum += hsum8(vsum);
    float inv = 1.0f / sum;
    /* OUT = sum_j p_j V[j], in registers for up to 128 dims at a time. */
    for (int i0 = 0; i0 < hd; i0 += 64) {
        int w = hd - i0 < 64 ? hd - i0 : 64;
        __m256 acc[8];
        for (int v = 0; v < 8; v++)
            acc[v] = _mm256_setzero_ps();
        for (j = 0; j < ctx; j++) {
            const float *vj = vc + (size_t)j * row + i0;
            __m256 p = _mm256_set1_ps(s[j]);
            for (int v = 0; v < w / 8; v++)
                acc[v] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8 * v), acc[v]);
        }
        __m256 vinv = _mm256_set1_ps(inv);
        for (int v = 0; v < w / 8; v++)
            _mm256_storeu_ps(out + i0 + 8 * v, _mm256_mul_ps(acc[v], vinv));
    }
}

static int have_avx2(void)
{
    return k_cpu_isa() >= K_ISA_AVX2;
}

#else

static int have_avx2(void)
{
    return 0;
}

static void attend_avx2(float *out, const float *q, const float *kc, const float *vc, int ctx,
                        size_t row, int hd, float *s)
{
    (void)out, (void)q, (void)kc, (void)vc, (void)ctx, (void)row, (void)hd, (void)s;
    abort(); /* have_avx2() is 0: never called */
}

#endif

/* One attention problem: query rows at Q (QSTRIDE floats per token, head
 * H at H * HD), each token t of N_TOK seeing CTX0 + t + 1 cache rows. */
typedef struct attn_job {
    float *out;
    const float *q;
    const float *const *kc, *const *vc; /* per sequence */
    const int32_t *ctx0;                /* per sequence: rows before its first token */
    int n_seq, n_tok;                   /* sequences; tokens of each */
    int n_head, n_kv, hd;
    int blocks;                         /* query blocks per (sequence, head) */
    _Atomic int next;                   /* the next task */
    int err;                            /* -ENOMEM from a thread */
} attn_job;

static void attn_part(void *arg, int ith, int nth)
{
    (void)ith, (void)nth;
    attn_job *j = arg;
    size_t row = (size_t)j->n_kv * j->hd, qrow = (size_t)j->n_head * j->hd;
    int group = j->n_head / j->n_kv, tasks = j->n_seq * j->n_head * j->blocks;
    float stack[SCORES_ON_STACK], *heap = NULL;
    size_t heap_n = 0;
    for (;;) {
        /* Heaviest first: the last query block of each head. */
        int task = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (task >= tasks)
            break;
        int blk = j->blocks - 1 - task / (j->n_seq * j->n_head);
        int sh = task % (j->n_seq * j->n_head), seq = sh / j->n_head, h = sh % j->n_head;
        if (j->ctx0[seq] < 0) {
            /* A row of the batch with no sequence: zeros, as the reference. */
            memset(j->out + ((size_t)seq * j->n_tok) * qrow + (size_t)h * j->hd, 0,
                   (size_t)j->hd * sizeof(float));
            continue;
        }
        int t0 = blk * QUERY_BLOCK, t1 = t0 + QUERY_BLOCK < j->n_tok ? t0 + QUERY_BLOCK : j->n_tok;
        size_t need = (size_t)j->ctx0[seq] + (size_t)t1;
        float *s = stack;
        if (need > SCORES_ON_STACK) {
            if (need > heap_n) {
                free(heap);
                heap_n = need;
                if (!(heap = malloc(heap_n * sizeof(float)))) {
                    j->err = -ENOMEM;
                    heap_n = 0;
                    continue;
                }
            }
            s = heap;
        }
        const float *kc = j->kc[seq] + (size_t)(h / group) * j->hd;
        const float *vc = j->vc[seq] + (size_t)(h / group) * j->hd;
        for (int t = t0; t < t1; t++) {
            size_t qo = ((size_t)seq * j->n_tok + (size_t)t) * qrow + (size_t)h * j->hd;
            attend_avx2(j->out + qo, j->q + qo, kc, vc, j->ctx0[seq] + t + 1, row, j->hd, s);
        }
    }
    free(heap);
}

static int run_job(kth_pool *pool, attn_job *j)
{
    bool held = kth_acquire(pool) == 0;
    kth_run(held ? pool : NULL, attn_part, j);
    if (held)
        kth_release(pool);
    return j->err;
}

int k_attn_prefill_mt(kth_pool *pool, float *out, const float *q, const float *k, const float *v,
                      float *kc, float *vc, int pos0, int n_tok, int n_head, int n_kv, int hd)
{
    if (!have_avx2() || hd % 8) {
        k_attn_prefill(out, q, k, v, kc, vc, pos0, n_tok, n_head, n_kv, hd);
        return 0;
    }
    size_t row = (size_t)n_kv * hd;
    memcpy(kc + (size_t)pos0 * row, k, (size_t)n_tok * row * sizeof(float));
    memcpy(vc + (size_t)pos0 * row, v, (size_t)n_tok * row * sizeof(float));
    const float *kcs[1] = {kc}, *vcs[1] = {vc};
    int32_t ctx0[1] = {pos0};
    attn_job j = {out, q, kcs, vcs, ctx0, 1, n_tok, n_head, n_kv, hd,
                  (n_tok + QUERY_BLOCK - 1) / QUERY_BLOCK, 0, 0};
    return run_job(pool, &j);
}

int k_attn_decode_mt(kth_pool *pool, float *out, const float *q, const float *k, const float *v,
                     float *const *kc, float *const *vc, const int32_t *lens, int batch,
                     int n_head, int n_kv, int hd)
{
    size_t qrow = (size_t)n_head * hd;
    if (!have_avx2() || hd % 8) {
        for (int b = 0; b < batch; b++) {
            if (lens[b] < 0)
                memset(out + b * qrow, 0, qrow * sizeof(float));
            else
                k_attn_decode(out + b * qrow, q + b * qrow, k + (size_t)b * n_kv * hd,
                              v + (size_t)b * n_kv * hd, &kc[b], &vc[b], &lens[b], 1, n_head,
                              n_kv, hd);
        }
        return 0;
    }
    size_t row = (size_t)n_kv * hd;
    for (int b = 0; b < batch; b++) {
        if (lens[b] < 0)
            continue;
        memcpy(kc[b] + (size_t)lens[b] * row, k + (size_t)b * row, row * sizeof(float));
        memcpy(vc[b] + (size_t)lens[b] * row, v + (size_t)b * row, row * sizeof(float));
    }
    attn_job j = {out, q, (const float *const *)kc, (const float *const *)vc, lens, batch, 1,
                  n_head, n_kv, hd, 1, 0, 0};
    return run_job(pool, &j);
}
