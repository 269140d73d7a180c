/* Fast CPU paths of elementwise ops.  KOP_ADD and KOP_LAYERNORM over the
 * kernels' thread pool when they are large.  KOP_GELU in its erf form
 * (Whisper's activation): erf from a rational polynomial on AVX2
 * (vmath_avx2.h), spread over the pool.  Whisper base's encoder applies it to 21 million
 * values a window; libm's erff, one value at a time on one thread, took
 * about 0.4 s of a 1.5 s window on this project's 2-core test machine. */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/threads.h"
#include "kernels/kernels.h"

/* Values per task: enough to amortize a task, few enough to share out a
 * decoder step's few thousand values. */
#define GELU_CHUNK 4096

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "kernels/cpu/vmath_avx2.h"

AVX2 static void gelu_erf_avx2(float *out, const float *x, size_t n)
{
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256 rsqrt2 = _mm256_set1_ps(0.70710678118654752f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 e = erf8(_mm256_mul_ps(v, rsqrt2));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, e)));
    }
    if (i < n)
        k_gelu_erf(out + i, x + i, n - i);
}

AVX2 static void to_f16_avx2(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n)
        k_cast(dst + i, KD_F16, src + i, KD_F32, n - i);
}

static int have_avx2(void)
{
    return k_cpu_isa() >= K_ISA_AVX2;
}
#else
static void to_f16_avx2(uint16_t *dst, const float *src, size_t n)
{
    k_cast(dst, KD_F16, src, KD_F32, n);
}

static void gelu_erf_avx2(float *out, const float *x, size_t n)
{
    k_gelu_erf(out, x, n);
}

static int have_avx2(void)
{
    return 0;
}
#endif

typedef struct gelu_job {
    float *out;
    const float *x;
    size_t n;
    int fast;
} gelu_job;

static void gelu_chunks(void *arg, int ith, int nth)
{
    gelu_job *j = arg;
    /* An int counts the chunks of up to 8 Ti values. */
    int chunks = (int)((j->n + GELU_CHUNK - 1) / GELU_CHUNK), lo, hi;
    kth_split(chunks, 1, ith, nth, &lo, &hi);
    size_t a = (size_t)lo * GELU_CHUNK, b = (size_t)hi * GELU_CHUNK;
    b = b < j->n ? b : j->n;
    if (a >= b)
        return;
    if (j->fast)
        gelu_erf_avx2(j->out + a, j->x + a, b - a);
    else
        k_gelu_erf(j->out + a, j->x + a, b - a);
}

void k_gelu_erf_mt(kth_pool *pool, float *out, const float *x, size_t n)
{
    gelu_job j = {out, x, n, have_avx2()};
    if (n > GELU_CHUNK && pool && kth_acquire(pool) == 0) {
        kth_run(pool, gelu_chunks, &j);
        kth_release(pool);
        return;
    }
    gelu_chunks(&j, 0, 1);
}

void k_cast_f16_fast(uint16_t *dst, const float *src, size_t n)
{
    /* F16C rounds to nearest even, as k_cast: the same bits.  Whisper's
     * cross-attention K and V in f16 are 9 million values a prompt, which
     * k_cast's conversion in C took tens of milliseconds over. */
    if (have_avx2())
        to_f16_avx2(dst, src, n);
    else
        k_cast(dst, KD_F16, src, KD_F32, n);
}

/* ---- additions and layer norms over the pool ------------------------------------ */

/* From this many values on, an addition or a layer norm is shared out over
 * the pool: Whisper's encoder adds a bias or a residual to 0.8 to 3
 * million values at a time, which took a tenth of a window on one thread,
 * while a decoder step's few thousand are not worth waking the pool. */
#define SPLIT_MIN 65536

typedef struct add_job {
    float *out;
    const float *a, *b;
    size_t n, nb, chunk; /* CHUNK: values a task, a multiple of NB */
} add_job;

static void add_chunks(void *arg, int ith, int nth)
{
    add_job *j = arg;
    int chunks = (int)((j->n + j->chunk - 1) / j->chunk), lo, hi;
    kth_split(chunks, 1, ith, nth, &lo, &hi);
    size_t a = (size_t)lo * j->chunk, b = (size_t)hi * j->chunk;
    b = b < j->n ? b : j->n;
    if (a >= b)
        return;
    if (j->nb == j->n)
        k_add(j->out + a, j->a + a, j->b + a, b - a);
    else
        k_add_bcast(j->out + a, j->a + a, b - a, j->b, j->nb);
}

void k_add_mt(kth_pool *pool, float *out, const float *a, size_t n, const float *b, size_t nb)
{
    assert(nb > 0 || n == 0);
    if (n == 0)
        return;
    /* Tasks start on whole rows of B, so each is one k_add_bcast. */
    size_t chunk = nb == n ? GELU_CHUNK : (GELU_CHUNK / nb > 0 ? GELU_CHUNK / nb : 1) * nb;
    add_job j = {out, a, b, n, nb, chunk};
    if (n >= SPLIT_MIN && pool && kth_acquire(pool) == 0) {
        kth_run(pool, add_chunks, &j);
        kth_release(pool);
        return;
    }
    add_chunks(&j, 0, 1);
}

typedef struct norm_job {
    float *out;
    const float *x, *w, *b;
    int rows, dim;
    float eps;
} norm_job;

static void norm_rows(void *arg, int ith, int nth)
{
    norm_job *j = arg;
    int lo, hi;
    kth_split(j->rows, 1, ith, nth, &lo, &hi);
    if (lo < hi)
        k_layernorm(j->out + (size_t)lo * j->dim, j->x + (size_t)lo * j->dim, j->w, j->b, hi - lo,
                    j->dim, j->eps);
}

void k_layernorm_mt(kth_pool *pool, float *out, const float *x, const float *w, const float *b,
                    int rows, int dim, float eps)
{
    norm_job j = {out, x, w, b, rows, dim, eps};
    if ((size_t)rows * (size_t)dim >= SPLIT_MIN && pool && kth_acquire(pool) == 0) {
        kth_run(pool, norm_rows, &j);
        kth_release(pool);
        return;
    }
    norm_rows(&j, 0, 1);
}
