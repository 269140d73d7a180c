/* CUDA kernel of k_attn_decode (kernels/cpu/attention.c): one query per
 * sequence over a batch of sequences of different lengths, each with its own
 * KV cache.  Two launches: append the step's K/V rows to the caches, then
 * one block per (sequence, query head) computes the scores of its context
 * into shared memory (one thread per key), softmaxes them with block
 * reductions, and accumulates P.V with threads over the head dimension (so
 * V rows are read coalesced).  A flash-style tiled kernel would cut the
 * shared memory bound on context length; at the contexts of this project
 * (a few thousand tokens, 4 bytes each) the scores fit, and this one is
 * simple to check against the reference. */
#include "kernels/cuda/kcuda.cuh"

#define ATT_THREADS 128

__global__ static void append_kernel(const float *k, const float *v, float *const *kc,
                                     float *const *vc, const int32_t *lens, int row)
{
    int b = blockIdx.x;
    size_t at = (size_t)lens[b] * row;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        kc[b][at + i] = k[(size_t)b * row + i];
        vc[b][at + i] = v[(size_t)b * row + i];
    }
}

__global__ static void decode_kernel(float *out, const float *q, float *const *kc,
                                     float *const *vc, const int32_t *lens, int n_head, int n_kv,
                                     int hd)
{
    extern __shared__ float s[]; /* [ctx] scores, then [hd] the query */
    __shared__ float red[32];
    int b = blockIdx.x / n_head, h = blockIdx.x % n_head;
    int ctx = lens[b] + 1;
    int row = n_kv * hd;
    const float *kb = kc[b] + (size_t)(h / (n_head / n_kv)) * hd;
    const float *vb = vc[b] + (size_t)(h / (n_head / n_kv)) * hd;
    const float *qh = q + ((size_t)b * n_head + h) * hd;
    float *qs = s + ctx;
    for (int i = threadIdx.x; i < hd; i += blockDim.x)
        qs[i] = qh[i];
    __syncthreads();
    float scale = rsqrtf((float)hd), m = -INFINITY;
    for (int j = threadIdx.x; j < ctx; j += blockDim.x) {
        const float *kj = kb + (size_t)j * row;
        float d = 0;
        for (int i = 0; i < hd; i++)
            d += qs[i] * kj[i];
        s[j] = d * scale;
        m = fmaxf(m, s[j]);
    }
    m = k_block_max(m, red);
    float sum = 0;
    for (int j = threadIdx.x; j < ctx; j += blockDim.x) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    float inv = 1.0f / k_block_sum(sum, red); /* also orders the s[] writes before reads */
    float *o = out + ((size_t)b * n_head + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float acc = 0;
        for (int j = 0; j < ctx; j++)
            acc += s[j] * vb[(size_t)j * row + i];
        o[i] = acc * inv;
    }
}

extern "C" int k_cuda_attn_decode(float *out, const float *q, const float *k, const float *v,
                                  float *const *kc, float *const *vc, const int32_t *lens,
                                  int batch, int n_head, int n_kv, int hd, int max_ctx,
                                  void *stream)
{
    if (batch < 0 || n_kv <= 0 || n_head % n_kv || hd <= 0 || max_ctx <= 0)
        return -EINVAL;
    if (!batch)
        return 0;
    size_t shmem = ((size_t)max_ctx + hd) * sizeof(float);
    if (shmem > 48 * 1024) {
        int dev, maxopt;
        K_CUDA_CHECK(cudaGetDevice(&dev));
        K_CUDA_CHECK(cudaDeviceGetAttribute(&maxopt, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        if (shmem > (size_t)maxopt)
            return -EINVAL; /* context too long for this kernel */
        K_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int)shmem));
    }
    append_kernel<<<batch, ATT_THREADS, 0, K_STREAM(stream)>>>(k, v, kc, vc, lens, n_kv * hd);
    K_CUDA_LAUNCHED();
    decode_kernel<<<batch * n_head, ATT_THREADS, shmem, K_STREAM(stream)>>>(out, q, kc, vc, lens,
                                                                             n_head, n_kv, hd);
    K_CUDA_LAUNCHED();
    return 0;
}
