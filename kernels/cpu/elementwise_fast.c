/* Fast CPU paths of elementwise ops.  KOP_GELU in its erf form (Whisper's
 * activation): erf from a rational polynomial on AVX2 (vmath_avx2.h),
 * spread over the kernels' thread pool.  Whisper base's encoder applies it to 21 million
 * values a window; libm's erff, one value at a time on one thread, took
 * about 0.4 s of a 1.5 s window on this project's 2-core test machine. */
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
