/* CUDA kernels of kernels/cpu/elementwise.c: embedding, add, mul, SiLU,
 * GELU, casts, im2col.  Grid-stride loops; each is memory-bound, so the only goal is
 * full-width coalesced access. */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/cpu/half.h"

__global__ static void embed_kernel(float *out, const float *table, int vocab, int dim,
                                    const int32_t *ids, int n)
{
    size_t total = (size_t)n * dim;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(i / dim), c = (int)(i % dim);
        int id = ids[t];
        out[i] = id < 0 || id >= vocab ? 0.0f : table[(size_t)id * dim + c];
    }
}

enum { EW_ADD, EW_MUL, EW_SILU, EW_GELU, EW_GELU_ERF };

template <int OP>
__global__ static void ew_kernel(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = a[i];
        if (OP == EW_ADD)
            out[i] = x + b[i];
        else if (OP == EW_MUL)
            out[i] = x * b[i];
        else if (OP == EW_SILU)
            out[i] = x / (1.0f + expf(-x));
        else if (OP == EW_GELU_ERF)
            out[i] = 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
        else
            out[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    }
}

template <int OP>
static int ew(float *out, const float *a, const float *b, size_t n, void *stream)
{
    if (!n)
        return 0;
    ew_kernel<OP><<<k_grid(n, 256), 256, 0, K_STREAM(stream)>>>(out, a, b, n);
    K_CUDA_LAUNCHED();
    return 0;
}

__global__ static void add_bcast_kernel(float *out, const float *a, size_t n, const float *b,
                                        size_t nb)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i % nb];
}

/* One thread per element of COL, reading X where the window lies inside. */
__global__ static void im2col_kernel(float *col, const float *x, int batch, int t_in, int c,
                                     int k, int stride, int pad, int t_out)
{
    size_t ck = (size_t)c * k, total = (size_t)batch * t_out * ck;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / ck;
        int ci = (int)(i % ck / k), kk = (int)(i % k);
        int b = (int)(bt / t_out), t = (int)(bt % t_out);
        int src = t * stride + kk - pad;
        col[i] = src >= 0 && src < t_in ? x[((size_t)b * t_in + src) * c + ci] : 0.0f;
    }
}

__device__ __forceinline__ float cast_load(const void *src, int t, size_t i)
{
    if (t == KD_F16)
        return k_f16_to_f32(((const uint16_t *)src)[i]);
    if (t == KD_BF16)
        return k_bf16_to_f32(((const uint16_t *)src)[i]);
    return ((const float *)src)[i];
}

__global__ static void cast_kernel(void *dst, int dt, const void *src, int st, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = cast_load(src, st, i);
        if (dt == KD_F16)
            ((uint16_t *)dst)[i] = k_f32_to_f16(v);
        else if (dt == KD_BF16)
            ((uint16_t *)dst)[i] = k_f32_to_bf16(v);
        else
            ((float *)dst)[i] = v;
    }
}

extern "C" int k_cuda_embed(float *out, const float *table, int vocab, int dim,
                            const int32_t *ids, int n, void *stream)
{
    if (n <= 0 || dim <= 0)
        return n < 0 || dim < 0 ? -EINVAL : 0;
    embed_kernel<<<k_grid((size_t)n * dim, 256), 256, 0, K_STREAM(stream)>>>(out, table, vocab,
                                                                              dim, ids, n);
    K_CUDA_LAUNCHED();
    return 0;
}

extern "C" int k_cuda_add(float *out, const float *a, const float *b, size_t n, void *stream)
{
    return ew<EW_ADD>(out, a, b, n, stream);
}

extern "C" int k_cuda_mul(float *out, const float *a, const float *b, size_t n, void *stream)
{
    return ew<EW_MUL>(out, a, b, n, stream);
}

extern "C" int k_cuda_silu(float *out, const float *x, size_t n, void *stream)
{
    return ew<EW_SILU>(out, x, NULL, n, stream);
}

extern "C" int k_cuda_gelu(float *out, const float *x, size_t n, void *stream)
{
    return ew<EW_GELU>(out, x, NULL, n, stream);
}

extern "C" int k_cuda_gelu_erf(float *out, const float *x, size_t n, void *stream)
{
    return ew<EW_GELU_ERF>(out, x, NULL, n, stream);
}

extern "C" int k_cuda_add_bcast(float *out, const float *a, size_t n, const float *b, size_t nb,
                                void *stream)
{
    if (!nb || n % nb)
        return -EINVAL;
    if (!n)
        return 0;
    add_bcast_kernel<<<k_grid(n, 256), 256, 0, K_STREAM(stream)>>>(out, a, n, b, nb);
    K_CUDA_LAUNCHED();
    return 0;
}

extern "C" int k_cuda_im2col(float *col, const float *x, int batch, int t_in, int c, int k,
                             int stride, int pad, void *stream)
{
    if (batch < 0 || t_in < 0 || c <= 0 || k <= 0 || stride <= 0 || pad < 0 ||
        t_in + 2 * pad < k)
        return -EINVAL;
    int t_out = (t_in + 2 * pad - k) / stride + 1;
    size_t total = (size_t)batch * t_out * c * k;
    if (!total)
        return 0;
    im2col_kernel<<<k_grid(total, 256), 256, 0, K_STREAM(stream)>>>(col, x, batch, t_in, c, k,
                                                                      stride, pad, t_out);
    K_CUDA_LAUNCHED();
    return 0;
}

static bool cast_ok(kdtype t)
{
    return t == KD_F32 || t == KD_F16 || t == KD_BF16;
}

extern "C" int k_cuda_cast(void *dst, kdtype dt, const void *src, kdtype st, size_t n,
                           void *stream)
{
    if (!cast_ok(dt) || !cast_ok(st))
        return -EINVAL;
    if (!n)
        return 0;
    cast_kernel<<<k_grid(n, 256), 256, 0, K_STREAM(stream)>>>(dst, dt, src, st, n);
    K_CUDA_LAUNCHED();
    return 0;
}
