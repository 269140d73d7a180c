/* CUDA kernels of kernels/cpu/norm.c: RMSNorm, LayerNorm, RoPE, softmax,
 * argmax.  Row ops run one block per row (rows are 576..49152 wide here: one
 * block keeps a row's reduction in shared memory without a second pass over
 * global memory). */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/cpu/order.h"

#define ROW_THREADS 256

__global__ static void rmsnorm_kernel(float *out, const float *x, const float *w, int dim,
                                      float eps)
{
    __shared__ float sh[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *o = out + (size_t)blockIdx.x * dim;
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = k_block_sum(ss, sh);
    float s = rsqrtf(ss / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        o[i] = xr[i] * s * w[i];
}

__global__ static void layernorm_kernel(float *out, const float *x, const float *w,
                                        const float *b, int dim, float eps)
{
    __shared__ float sh[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *o = out + (size_t)blockIdx.x * dim;
    float s = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        s += xr[i];
    float mean = k_block_sum(s, sh) / dim;
    float v = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        v += (xr[i] - mean) * (xr[i] - mean);
    float r = rsqrtf(k_block_sum(v, sh) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        o[i] = (xr[i] - mean) * r * w[i] + (b ? b[i] : 0.0f);
}

/* One thread per rotated pair.  The angle is computed in double, as in the
 * reference: positions in the tens of thousands need it.  It is then
 * reduced to [-pi, pi] in double and its sine and cosine taken in float by
 * the fast intrinsic (absolute error under 4e-7 there): the library's
 * double sin/cos keep a large-argument path in local memory, which the
 * build refuses (ptxas -warn-lmem-usage). */
__global__ static void rope_kernel(float *x, const int32_t *pos, int n_tok, int n_head,
                                   int head_dim, float theta, int mode)
{
    int half = head_dim / 2;
    size_t total = (size_t)n_tok * n_head * half;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < total;
         p += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(p % half);
        size_t th = p / half; /* token * n_head + head */
        int t = (int)(th / n_head);
        float *v = x + th * head_dim;
        double ang = pos[t] * exp2(-2.0 * i / head_dim * log2((double)theta));
        const double two_pi = 6.283185307179586;
        float s, c;
        __sincosf((float)(ang - two_pi * rint(ang / two_pi)), &s, &c);
        int i0 = mode == K_ROPE_NEOX ? i : 2 * i;
        int i1 = mode == K_ROPE_NEOX ? i + half : 2 * i + 1;
        float a = v[i0], bb = v[i1];
        v[i0] = a * c - bb * s;
        v[i1] = a * s + bb * c;
    }
}

__global__ static void softmax_kernel(float *out, const float *x, int n)
{
    __shared__ float sh[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *o = out + (size_t)blockIdx.x * n;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        m = fmaxf(m, xr[i]);
    m = k_block_max(m, sh);
    float s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float e = expf(xr[i] - m);
        o[i] = e;
        s += e;
    }
    float inv = 1.0f / k_block_sum(s, sh);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        o[i] *= inv;
}

/* The reference's order (kernels/cpu/order.h): highest logit, lowest index
 * among ties, NaN last.  BI < 0 is "none yet". */
__global__ static void argmax_kernel(int32_t *out, const float *x, int n)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float bv = 0;
    int bi = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (bi < 0 || k_logit_better(xr[i], i, bv, bi)) {
            bv = xr[i];
            bi = i;
        }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || k_logit_better(ov, oi, bv, bi))) {
            bv = ov;
            bi = oi;
        }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (si[w] >= 0 && (bi < 0 || k_logit_better(sv[w], si[w], bv, bi))) {
                bv = sv[w];
                bi = si[w];
            }
        out[blockIdx.x] = bi < 0 ? 0 : bi;
    }
}

extern "C" int k_cuda_rmsnorm(float *out, const float *x, const float *w, int rows, int dim,
                              float eps, void *stream)
{
    if (rows <= 0 || dim <= 0)
        return rows < 0 || dim < 0 ? -EINVAL : 0;
    rmsnorm_kernel<<<rows, ROW_THREADS, 0, K_STREAM(stream)>>>(out, x, w, dim, eps);
    K_CUDA_LAUNCHED();
    return 0;
}

extern "C" int k_cuda_layernorm(float *out, const float *x, const float *w, const float *b,
                                int rows, int dim, float eps, void *stream)
{
    if (rows <= 0 || dim <= 0)
        return rows < 0 || dim < 0 ? -EINVAL : 0;
    layernorm_kernel<<<rows, ROW_THREADS, 0, K_STREAM(stream)>>>(out, x, w, b, dim, eps);
    K_CUDA_LAUNCHED();
    return 0;
}

extern "C" int k_cuda_rope(float *x, const int32_t *pos, int n_tok, int n_head, int head_dim,
                           float theta, int mode, void *stream)
{
    if (head_dim % 2 || n_tok < 0 || n_head < 0)
        return -EINVAL;
    size_t pairs = (size_t)n_tok * n_head * (head_dim / 2);
    if (!pairs)
        return 0;
    rope_kernel<<<k_grid(pairs, 256), 256, 0, K_STREAM(stream)>>>(x, pos, n_tok, n_head,
                                                                   head_dim, theta, mode);
    K_CUDA_LAUNCHED();
    return 0;
}

extern "C" int k_cuda_softmax(float *out, const float *x, int rows, int n, void *stream)
{
    if (rows <= 0 || n <= 0)
        return rows < 0 || n < 0 ? -EINVAL : 0;
    softmax_kernel<<<rows, ROW_THREADS, 0, K_STREAM(stream)>>>(out, x, n);
    K_CUDA_LAUNCHED();
    return 0;
}

extern "C" int k_cuda_argmax(int32_t *out, const float *x, int rows, int n, void *stream)
{
    if (rows <= 0 || n <= 0)
        return rows < 0 || n < 0 ? -EINVAL : 0;
    argmax_kernel<<<rows, ROW_THREADS, 0, K_STREAM(stream)>>>(out, x, n);
    K_CUDA_LAUNCHED();
    return 0;
}
