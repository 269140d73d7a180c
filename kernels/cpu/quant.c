/* KOP_QMATVEC: GGUF Q8_0 / Q4_0 / Q4_1 quantization (the round trip the
 * loader and the tests need) and the scalar matrix-vector product, the
 * reference of the AVX2 path (quant_avx2.c) and of the CUDA kernel. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_avx2.h"
#include "kernels/kernels.h"

size_t k_block_bytes(kdtype t)
{
    switch (t) {
    case KD_Q8_0: return K_Q8_0_BYTES;
    case KD_Q4_0: return K_Q4_0_BYTES;
    case KD_Q4_1: return K_Q4_1_BYTES;
    default: return 0;
    }
}

static void quant_block(uint8_t *b, kdtype t, const float *x)
{
    if (t == KD_Q8_0) {
        float amax = 0;
        for (int i = 0; i < K_QK; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        k_store_f16(b, d);
        for (int i = 0; i < K_QK; i++)
            b[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
    } else if (t == KD_Q4_0) {
        float amax = 0, max = 0; /* max: the value of largest magnitude, signed */
        for (int i = 0; i < K_QK; i++)
            if (fabsf(x[i]) > amax) {
                amax = fabsf(x[i]);
                max = x[i];
            }
        float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
        k_store_f16(b, d);
        for (int i = 0; i < 16; i++) {
            int q0 = (int8_t)(x[i] * id + 8.5f), q1 = (int8_t)(x[16 + i] * id + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            b[2 + i] = (uint8_t)(q0 | (q1 << 4));
        }
    } else {
        float mn = FLT_MAX, mx = -FLT_MAX;
        for (int i = 0; i < K_QK; i++) {
            mn = fminf(mn, x[i]);
            mx = fmaxf(mx, x[i]);
        }
        float d = (mx - mn) / 15.0f, id = d != 0 ? 1.0f / d : 0.0f;
        k_store_f16(b, d);
        k_store_f16(b + 2, mn);
        for (int i = 0; i < 16; i++) {
            int q0 = (int8_t)((x[i] - mn) * id + 0.5f), q1 = (int8_t)((x[16 + i] - mn) * id + 0.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            b[4 + i] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void dequant_block(float *y, kdtype t, const uint8_t *b)
{
    float d = k_load_f16(b);
    if (t == KD_Q8_0) {
        for (int i = 0; i < K_QK; i++)
            y[i] = (int8_t)b[2 + i] * d;
    } else if (t == KD_Q4_0) {
        for (int i = 0; i < 16; i++) {
            y[i] = ((b[2 + i] & 0x0f) - 8) * d;
            y[16 + i] = ((b[2 + i] >> 4) - 8) * d;
        }
    } else {
        float m = k_load_f16(b + 2);
        for (int i = 0; i < 16; i++) {
            y[i] = (b[4 + i] & 0x0f) * d + m;
            y[16 + i] = (b[4 + i] >> 4) * d + m;
        }
    }
}

int k_quantize(void *dst, kdtype t, const float *src, size_t n)
{
    size_t bb = k_block_bytes(t);
    if (!bb || n % K_QK)
        return -EINVAL;
    for (size_t i = 0; i < n / K_QK; i++)
        quant_block((uint8_t *)dst + i * bb, t, src + i * K_QK);
    return 0;
}

int k_dequantize(float *dst, kdtype t, const void *src, size_t n)
{
    size_t bb = k_block_bytes(t);
    if (!bb || n % K_QK)
        return -EINVAL;
    for (size_t i = 0; i < n / K_QK; i++)
        dequant_block(dst + i * K_QK, t, (const uint8_t *)src + i * bb);
    return 0;
}

int k_widen(float *dst, kdtype t, const void *src, size_t n)
{
    if (t == KD_F32) {
        memcpy(dst, src, n * sizeof(float));
        return 0;
    }
    if (t == KD_Q8_0 || t == KD_Q4_0 || t == KD_Q4_1)
        return k_dequantize(dst, t, src, n);
    return k_cast(dst, KD_F32, src, t, n);
}

int k_qmatvec_ref(float *y, const void *w, kdtype t, const float *x, int rows, int cols)
{
    size_t bb = k_block_bytes(t);
    if (!bb || cols % K_QK || rows < 0)
        return -EINVAL;
    int nb = cols / K_QK;
    for (int r = 0; r < rows; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * nb * bb;
        double acc = 0;
        for (int blk = 0; blk < nb; blk++) {
            float v[K_QK];
            dequant_block(v, t, wr + (size_t)blk * bb);
            for (int i = 0; i < K_QK; i++)
                acc += (double)v[i] * x[blk * K_QK + i];
        }
        y[r] = (float)acc;
    }
    return 0;
}

int k_qmatmul(float *y, const void *w, kdtype t, const float *x, int m, int rows, int cols)
{
    if (!k_block_bytes(t) || cols % K_QK || rows < 0 || m < 0)
        return -EINVAL;
    if (k_have_avx2())
        return k__qmatmul_avx2(y, (size_t)rows, w, t, x, m, rows, cols);
    for (int j = 0; j < m; j++)
        k_qmatvec_ref(y + (size_t)j * rows, w, t, x + (size_t)j * cols, rows, cols);
    return 0;
}

int k_qmatvec(float *y, const void *w, kdtype t, const float *x, int rows, int cols)
{
    if (!k_block_bytes(t) || cols % K_QK || rows < 0)
        return -EINVAL;
    if (k_have_avx2())
        return k__qmatvec_avx2(y, w, t, x, rows, cols);
    return k_qmatvec_ref(y, w, t, x, rows, cols);
}
