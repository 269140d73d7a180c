/* CUDA kernel of k_qmatvec (kernels/cpu/quant.c): y = W x with W in GGUF
 * Q8_0 / Q4_0 / Q4_1 blocks, dequantized on the fly.  One warp per output
 * row; lane l takes blocks l, l+32, ... of the row, so a warp reads 32
 * consecutive blocks (1088 / 576 / 640 bytes) per step.  Scales are read as
 * two bytes because blocks of 34 and 18 bytes are not 2-aligned in general
 * once rows are packed.  X is read through the read-only path. */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/cpu/quant.h"

template <int T>
__global__ static void qmatvec_kernel(float *y, const uint8_t *w, const float *__restrict__ x,
                                      int rows, int cols)
{
    const int bb = T == KD_Q8_0 ? K_Q8_0_BYTES : T == KD_Q4_0 ? K_Q4_0_BYTES : K_Q4_1_BYTES;
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (warp >= rows)
        return;
    int nb = cols / K_QK;
    const uint8_t *wr = w + (size_t)warp * nb * bb;
    float acc = 0;
    for (int blk = lane; blk < nb; blk += 32) {
        const uint8_t *b = wr + (size_t)blk * bb;
        const float *xb = x + blk * K_QK;
        float d = k_load_f16(b), dot = 0;
        if (T == KD_Q8_0) {
            for (int i = 0; i < K_QK; i++)
                dot += (float)(int8_t)b[2 + i] * __ldg(xb + i);
            acc += dot * d;
        } else if (T == KD_Q4_0) {
            for (int i = 0; i < 16; i++) {
                dot += (float)((b[2 + i] & 0x0f) - 8) * __ldg(xb + i);
                dot += (float)((b[2 + i] >> 4) - 8) * __ldg(xb + 16 + i);
            }
            acc += dot * d;
        } else {
            float sx = 0;
            for (int i = 0; i < 16; i++) {
                float x0 = __ldg(xb + i), x1 = __ldg(xb + 16 + i);
                dot += (float)(b[4 + i] & 0x0f) * x0 + (float)(b[4 + i] >> 4) * x1;
                sx += x0 + x1;
            }
            acc += dot * d + sx * k_load_f16(b + 2);
        }
    }
    acc = k_warp_sum(acc);
    if (lane == 0)
        y[warp] = acc;
}

extern "C" int k_cuda_qmatvec(float *y, const void *w, kdtype t, const float *x, int rows,
                              int cols, void *stream)
{
    if (cols % K_QK || rows < 0 || cols < 0)
        return -EINVAL;
    if (!rows)
        return 0;
    unsigned grid = (unsigned)(((size_t)rows * 32 + 255) / 256);
    const uint8_t *wb = (const uint8_t *)w;
    switch (t) {
    case KD_Q8_0:
        qmatvec_kernel<KD_Q8_0><<<grid, 256, 0, K_STREAM(stream)>>>(y, wb, x, rows, cols);
        break;
    case KD_Q4_0:
        qmatvec_kernel<KD_Q4_0><<<grid, 256, 0, K_STREAM(stream)>>>(y, wb, x, rows, cols);
        break;
    case KD_Q4_1:
        qmatvec_kernel<KD_Q4_1><<<grid, 256, 0, K_STREAM(stream)>>>(y, wb, x, rows, cols);
        break;
    default: return -EINVAL;
    }
    K_CUDA_LAUNCHED();
    return 0;
}
