/* Embedding lookup, elementwise ops, casts, im2col and the one-rank
 * all-reduce: the C references of KOP_EMBED, KOP_ADD, KOP_MUL, KOP_SILU,
 * KOP_GELU, KOP_CAST, KOP_IM2COL and KOP_ALLREDUCE.  They are simple enough that the compiler's
 * vectorization is their fast path; there is no second version to check. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/cpu/half.h"
#include "kernels/kernels.h"

void k_embed(float *out, const float *table, int vocab, int dim, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)i * dim;
        if (ids[i] < 0 || ids[i] >= vocab)
            memset(o, 0, (size_t)dim * sizeof(float));
        else
            memcpy(o, table + (size_t)ids[i] * dim, (size_t)dim * sizeof(float));
    }
}

void k_add(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void k_add_bcast(float *out, const float *a, size_t n, const float *b, size_t nb)
{
    for (size_t i0 = 0; i0 < n; i0 += nb)
        for (size_t j = 0; j < nb && i0 + j < n; j++)
            out[i0 + j] = a[i0 + j] + b[j];
}

void k_mul(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] * b[i];
}

void k_silu(float *out, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = x[i] / (1.0f + expf(-x[i]));
}

void k_gelu(float *out, const float *x, size_t n)
{
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
}

static int cast_ok(kdtype t)
{
    return t == KD_F32 || t == KD_F16 || t == KD_BF16;
}

static float load(const void *src, kdtype t, size_t i)
{
    switch (t) {
    case KD_F16: return k_f16_to_f32(((const uint16_t *)src)[i]);
    case KD_BF16: return k_bf16_to_f32(((const uint16_t *)src)[i]);
    default: return ((const float *)src)[i];
    }
}

void k_gelu_erf(float *out, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

void k_im2col(float *col, const float *x, int batch, int t_in, int c, int k, int stride, int pad)
{
    int t_out = (t_in + 2 * pad - k) / stride + 1;
    for (int b = 0; b < batch; b++)
        for (int t = 0; t < t_out; t++) {
            float *row = col + ((size_t)b * t_out + t) * (size_t)c * k;
            for (int kk = 0; kk < k; kk++) {
                int src = t * stride + kk - pad;
                const float *xs = x + ((size_t)b * t_in + src) * c;
                bool in = src >= 0 && src < t_in;
                for (int ci = 0; ci < c; ci++)
                    row[(size_t)ci * k + kk] = in ? xs[ci] : 0.0f;
            }
        }
}

int k_cast(void *dst, kdtype dt, const void *src, kdtype st, size_t n)
{
    if (!cast_ok(dt) || !cast_ok(st))
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        float v = load(src, st, i);
        switch (dt) {
        case KD_F16: ((uint16_t *)dst)[i] = k_f32_to_f16(v); break;
        case KD_BF16: ((uint16_t *)dst)[i] = k_f32_to_bf16(v); break;
        default: ((float *)dst)[i] = v; break;
        }
    }
    return 0;
}

int k_allreduce_sum(float *buf, size_t n, int nranks)
{
    (void)buf;
    (void)n;
    /* One rank holds the whole sum already; more ranks need NCCL (CUDA). */
    return nranks == 1 ? 0 : -EINVAL;
}
