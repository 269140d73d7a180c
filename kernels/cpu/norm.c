/* Row-wise ops: RMSNorm, LayerNorm, RoPE, softmax and argmax (KOP_RMSNORM,
 * KOP_LAYERNORM, KOP_ROPE, KOP_SOFTMAX, KOP_ARGMAX), and the host's
 * log-sum-exp of a row of logits.  Sums are accumulated in double: these
 * are the references the CUDA kernels are checked against, so they should
 * be the more accurate side. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/order.h"
#include "kernels/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "kernels/cpu/vmath_avx2.h"
#endif

void k_rmsnorm(float *out, const float *x, const float *w, int rows, int dim, float eps)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        float s = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++)
            o[i] = xr[i] * s * w[i];
    }
}

void k_layernorm(float *out, const float *x, const float *w, const float *b, int rows, int dim,
                 float eps)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
        double mean = 0, var = 0;
        for (int i = 0; i < dim; i++)
            mean += xr[i];
        mean /= dim;
        for (int i = 0; i < dim; i++)
            var += (xr[i] - mean) * (xr[i] - mean);
        var /= dim;
        float s = (float)(1.0 / sqrt(var + eps));
        float mf = (float)mean;
        for (int i = 0; i < dim; i++)
            o[i] = (xr[i] - mf) * s * w[i] + (b ? b[i] : 0.0f);
    }
}

int k_rope(float *x, const int32_t *pos, int n_tok, int n_head, int head_dim, float theta,
           int mode)
{
    int half = head_dim / 2;
    /* The angles depend on the token and the pair, not the head: computed
     * once per token for all heads (the same values in the same order as
     * per head, so the result is bit for bit the same). */
    float cs[512], sn[512];
    float *c = half <= 512 ? cs : malloc((size_t)half * sizeof(float));
    float *sv = half <= 512 ? sn : malloc((size_t)half * sizeof(float));
    if (!c || !sv) {
        /* A head of over 1024 dims and no memory for its angles. */
        if (c != cs)
            free(c);
        if (sv != sn)
            free(sv);
        return -ENOMEM;
    }
    for (int t = 0; t < n_tok; t++) {
        for (int i = 0; i < half; i++) {
            /* Angles in double: positions reach 10^5, where an f32 angle
             * has already lost most of its fractional bits. */
            double ang = pos[t] * pow((double)theta, -2.0 * i / head_dim);
            c[i] = (float)cos(ang);
            sv[i] = (float)sin(ang);
        }
        for (int h = 0; h < n_head; h++) {
            float *v = x + ((size_t)t * n_head + h) * head_dim;
            for (int i = 0; i < half; i++) {
                int i0 = mode == K_ROPE_NEOX ? i : 2 * i;
                int i1 = mode == K_ROPE_NEOX ? i + half : 2 * i + 1;
                float a = v[i0], b = v[i1];
                v[i0] = a * c[i] - b * sv[i];
                v[i1] = a * sv[i] + b * c[i];
            }
        }
    }
    if (c != cs)
        free(c);
    if (sv != sn)
        free(sv);
    return 0;
}

void k_softmax(float *out, const float *x, int rows, int n)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * n;
        float *o = out + (size_t)r * n;
        float m = -INFINITY;
        for (int i = 0; i < n; i++)
            m = xr[i] > m ? xr[i] : m;
        double sum = 0;
        for (int i = 0; i < n; i++) {
            o[i] = expf(xr[i] - m);
            sum += o[i];
        }
        float inv = (float)(1.0 / sum);
        for (int i = 0; i < n; i++)
            o[i] *= inv;
    }
}

void k_argmax(int32_t *out, const float *x, int rows, int n)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * n;
        int best = 0;
        for (int i = 1; i < n; i++)
            if (k_logit_better(xr[i], i, xr[best], best))
                best = i;
        out[r] = best;
    }
}

double k_logsumexp_ref(const float *x, int n)
{
    float m = -INFINITY;
    for (int i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    if (m == -INFINITY)
        return -INFINITY;
    double s = 0;
    for (int i = 0; i < n; i++)
        s += exp((double)x[i] - m);
    return m + log(s);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* Whisper's decoder asks this once a token of every sequence, over 51865
 * logits: libm's exp in double took about a tenth of a batched step. */
AVX2 static double logsumexp_avx2(const float *x, int n, float m)
{
    __m256 vm = _mm256_set1_ps(m);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        /* -inf - m is -inf, which exp_neg takes to 0. */
        __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(s0, s1));
    double s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; i++)
        s += exp((double)x[i] - m);
    return m + log(s);
}
#endif

double k_logsumexp(const float *x, int n)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (k_cpu_isa() >= K_ISA_AVX2) {
        float m = -INFINITY;
        if (n > 0)
            m = max_row(x, n);
        return m == -INFINITY ? -INFINITY : logsumexp_avx2(x, n, m);
    }
#endif
    return k_logsumexp_ref(x, n);
}
