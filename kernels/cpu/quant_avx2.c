/* The AVX2 + FMA path of KOP_QMATVEC.  Only these functions carry the
 * target attribute, so the rest of the build keeps its baseline x86-64 flags
 * and one binary runs on machines with and without AVX2 (k_have_avx2 asks
 * cpuid once).
 *
 * Unlike llama.cpp, X is not quantized to Q8 first: the products stay f32 x
 * dequantized weight, so this path agrees with the scalar reference up to
 * summation order and the tests can hold it to a tight bound. */
#include <errno.h>
#include <string.h>

#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_avx2.h"
#include "kernels/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

int k_have_avx2(void)
{
    static int have = -1; /* benign race: every thread computes the same value */
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return have;
}

#define AVX2 __attribute__((target("avx2,fma")))

/* Eight signed bytes at P as eight floats. */
AVX2 static inline __m256 i8x8_ps(__m128i v)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

AVX2 static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 32 weights of a Q4 block as signed bytes (nibbles minus BIAS):
 * elements 0..15 in LO, 16..31 in HI. */
AVX2 static inline void nibbles(const uint8_t *qs, int bias, __m128i *lo, __m128i *hi)
{
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(0x0f), b = _mm_set1_epi8((char)bias);
    *lo = _mm_sub_epi8(_mm_and_si128(q, m), b);
    *hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m), b);
}

/* sum_i q[i] * x[i] over one block, q given as 32 signed bytes in two
 * halves. */
AVX2 static inline __m256 dot32(__m128i lo, __m128i hi, const float *x)
{
    __m256 a = _mm256_mul_ps(i8x8_ps(lo), _mm256_loadu_ps(x));
    a = _mm256_fmadd_ps(i8x8_ps(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), a);
    a = _mm256_fmadd_ps(i8x8_ps(hi), _mm256_loadu_ps(x + 16), a);
    return _mm256_fmadd_ps(i8x8_ps(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), a);
}

AVX2 int k__qmatvec_avx2(float *y, const void *w, kdtype t, const float *x, int rows, int cols)
{
    size_t bb = k_block_bytes(t);
    int nb = cols / K_QK;
    for (int r = 0; r < rows; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * nb * bb;
        __m256 acc = _mm256_setzero_ps();
        for (int blk = 0; blk < nb; blk++) {
            const uint8_t *b = wr + (size_t)blk * bb;
            const float *xb = x + blk * K_QK;
            __m256 d = _mm256_set1_ps(k_load_f16(b));
            __m128i lo, hi;
            if (t == KD_Q8_0) {
                lo = _mm_loadu_si128((const __m128i *)(b + 2));
                hi = _mm_loadu_si128((const __m128i *)(b + 18));
                acc = _mm256_fmadd_ps(dot32(lo, hi, xb), d, acc);
            } else if (t == KD_Q4_0) {
                nibbles(b + 2, 8, &lo, &hi);
                acc = _mm256_fmadd_ps(dot32(lo, hi, xb), d, acc);
            } else {
                /* sum (q d + m) x = d sum q x + m sum x */
                nibbles(b + 4, 0, &lo, &hi);
                __m256 sx = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                                          _mm256_add_ps(_mm256_loadu_ps(xb + 16),
                                                        _mm256_loadu_ps(xb + 24)));
                acc = _mm256_fmadd_ps(dot32(lo, hi, xb), d, acc);
                acc = _mm256_fmadd_ps(sx, _mm256_set1_ps(k_load_f16(b + 2)), acc);
            }
        }
        y[r] = hsum(acc);
    }
    return 0;
}

/* Rows of X one pass over the weights serves: 8 accumulators and the 4
 * vectors of a dequantized block fit the 16 ymm registers. */
#define QMM_ROWS 8

/* One block of W (32 weights) dequantized to floats, in four vectors. */
AVX2 static inline void block_ps(const uint8_t *b, kdtype t, __m256 wv[4])
{
    __m256 d = _mm256_set1_ps(k_load_f16(b));
    __m256 mn = _mm256_setzero_ps();
    __m128i lo, hi;
    if (t == KD_Q8_0) {
        lo = _mm_loadu_si128((const __m128i *)(b + 2));
        hi = _mm_loadu_si128((const __m128i *)(b + 18));
    } else if (t == KD_Q4_0) {
        nibbles(b + 2, 8, &lo, &hi);
    } else {
        mn = _mm256_set1_ps(k_load_f16(b + 2));
        nibbles(b + 4, 0, &lo, &hi);
    }
    wv[0] = _mm256_fmadd_ps(i8x8_ps(lo), d, mn);
    wv[1] = _mm256_fmadd_ps(i8x8_ps(_mm_srli_si128(lo, 8)), d, mn);
    wv[2] = _mm256_fmadd_ps(i8x8_ps(hi), d, mn);
    wv[3] = _mm256_fmadd_ps(i8x8_ps(_mm_srli_si128(hi, 8)), d, mn);
}

/* Y[M, ROWS] = X[M, COLS] W[ROWS, COLS]^T, Y's rows LDY floats apart: each
 * block of a weight row is dequantized once and used for up to QMM_ROWS
 * rows of X, so M rows cost about one pass over the weights rather than M. */
AVX2 int k__qmatmul_avx2(float *y, size_t ldy, const void *w, kdtype t, const float *x, int m,
                         int rows, int cols)
{
    size_t bb = k_block_bytes(t);
    int nb = cols / K_QK;
    for (int j0 = 0; j0 < m; j0 += QMM_ROWS) {
        int mj = m - j0 < QMM_ROWS ? m - j0 : QMM_ROWS;
        const float *xj = x + (size_t)j0 * cols;
        for (int r = 0; r < rows; r++) {
            const uint8_t *wr = (const uint8_t *)w + (size_t)r * nb * bb;
            __m256 acc[QMM_ROWS];
            for (int j = 0; j < QMM_ROWS; j++)
                acc[j] = _mm256_setzero_ps();
            for (int blk = 0; blk < nb; blk++) {
                __m256 wv[4];
                block_ps(wr + (size_t)blk * bb, t, wv);
                const float *xb = xj + blk * K_QK;
                for (int j = 0; j < mj; j++, xb += cols) {
                    __m256 a = _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(xb), acc[j]);
                    a = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(xb + 8), a);
                    a = _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(xb + 16), a);
                    acc[j] = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(xb + 24), a);
                }
            }
            for (int j = 0; j < mj; j++)
                y[(size_t)(j0 + j) * ldy + r] = hsum(acc[j]);
        }
    }
    return 0;
}

#else

int k_have_avx2(void)
{
    return 0;
}

int k__qmatvec_avx2(float *y, const void *w, kdtype t, const float *x, int rows, int cols)
{
    return k_qmatvec_ref(y, w, t, x, rows, cols);
}

int k__qmatmul_avx2(float *y, size_t ldy, const void *w, kdtype t, const float *x, int m,
                    int rows, int cols)
{
    (void)y, (void)ldy, (void)w, (void)t, (void)x, (void)m, (void)rows, (void)cols;
    return -ENOSYS; /* k_have_avx2 is 0: never called */
}

#endif
