/* CUDA sampler (kernels/cpu/sample.c) and the Philox check kernel.  One
 * block per row: the K candidates are found by K rounds of a block argmax
 * under the reference's total order (descending logit, ascending index),
 * each round excluding what the previous one picked; then thread 0 runs the
 * reference's serial softmax / top-p / inverse-CDF steps over the K
 * candidates in the same order, with the same Philox draw.  K rounds over
 * the vocabulary cost K reads of the row; for serving's k <= 64 that is
 * cheaper than a device sort and keeps the result identical to the CPU's. */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/cpu/order.h"
#include "kernels/cpu/philox.h"

#define SAMPLE_THREADS 256


/* Rows sample with the launch's TEMP, K, TOP_P, SEED and COUNTER + row,
 * or, when PARAMS is not NULL, each with its own: PARAMS[3 * row] =
 * (temperature, top_k, top_p) and RNG[2 * row] = (seed, counter) in device
 * memory, read as the reference reads them (temperature <= 0: argmax; top_k
 * <= 0 or over N: all N).  A row whose top_k exceeds K_SAMPLE_MAX_K raises
 * FLAG and gets token 0: this kernel keeps its candidates in shared memory. */
__global__ static void sample_kernel(int32_t *out, const float *logits, int n, float temp,
                                     int k, float top_p, uint64_t seed, uint64_t counter,
                                     const float *params, const int64_t *rng, int32_t *flag)
{
    uint64_t ctr = counter + blockIdx.x;
    if (params) {
        const float *pr = params + 3 * (size_t)blockIdx.x;
        temp = pr[0];
        top_p = pr[2];
        int tk = (int)pr[1];
        k = temp <= 0 ? 1 : tk <= 0 || tk > n ? n : tk;
        seed = (uint64_t)rng[2 * (size_t)blockIdx.x];
        ctr = (uint64_t)rng[2 * (size_t)blockIdx.x + 1];
        if (k > K_SAMPLE_MAX_K) { /* the whole block leaves: no barrier is skipped */
            if (threadIdx.x == 0) {
                out[blockIdx.x] = 0;
                if (flag)
                    atomicExch(flag, ERANGE);
            }
            return;
        }
    }
    __shared__ float cl[K_SAMPLE_MAX_K];
    __shared__ int ci[K_SAMPLE_MAX_K];
    __shared__ float rv[32];
    __shared__ int ri[32];
    __shared__ float pw[K_SAMPLE_MAX_K];
    const float *x = logits + (size_t)blockIdx.x * n;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int s = 0; s < k; s++) {
        float bv = -INFINITY;
        int bi = -1;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            if (s > 0 && !k_logit_better(cl[s - 1], ci[s - 1], x[i], i))
                continue;
            if (bi < 0 || k_logit_better(x[i], i, bv, bi)) {
                bv = x[i];
                bi = i;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || k_logit_better(ov, oi, bv, bi))) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            rv[warp] = bv;
            ri[warp] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < (int)(blockDim.x >> 5); w++)
                if (ri[w] >= 0 && (bi < 0 || k_logit_better(rv[w], ri[w], bv, bi))) {
                    bv = rv[w];
                    bi = ri[w];
                }
            cl[s] = bv;
            ci[s] = bi;
        }
        __syncthreads();
    }
    if (threadIdx.x != 0)
        return;
    if (cl[0] != cl[0] || temp <= 0) {
        /* Every logit NaN (index 0, as the reference), or greedy. */
        out[blockIdx.x] = ci[0];
        return;
    }
    /* The reference's steps, serially, in its order.  The weights live in
     * shared memory: 1 KiB per thread of local memory would spill. */
    float *p = pw;
    float total = 0;
    for (int i = 0; i < k; i++) {
        p[i] = K_CAND_WEIGHT(cl[i], cl[0], temp);
        total += p[i];
    }
    int keep = k;
    if (top_p < 1.0f) {
        float run = 0;
        for (int i = 0; i < k; i++) {
            run += p[i];
            if (run >= top_p * total) {
                keep = i + 1;
                break;
            }
        }
    }
    float mass = 0;
    for (int i = 0; i < keep; i++)
        mass += p[i];
    float u = k_philox_uniform(seed, ctr) * mass;
    int tok = ci[keep - 1];
    float run = 0;
    for (int i = 0; i < keep; i++) {
        run += p[i];
        if (run > u) {
            tok = ci[i];
            break;
        }
    }
    out[blockIdx.x] = tok;
}

__global__ static void philox_kernel(float *out, uint64_t seed, uint64_t counter, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = k_philox_uniform(seed, counter + i);
}

extern "C" int k_cuda_sample(int32_t *out, const float *logits, int rows, int n,
                             float temperature, int top_k, float top_p, uint64_t seed,
                             uint64_t counter, void *stream)
{
    if (rows < 0 || n <= 0)
        return -EINVAL;
    if (!rows)
        return 0;
    if (temperature <= 0) /* the reference's rule: argmax */
        return k_cuda_argmax(out, logits, rows, n, stream);
    if (top_k <= 0 || top_k > K_SAMPLE_MAX_K)
        return -EINVAL;
    int k = top_k > n ? n : top_k;
    sample_kernel<<<rows, SAMPLE_THREADS, 0, K_STREAM(stream)>>>(
        out, logits, n, temperature, k, top_p, seed, counter, NULL, NULL, NULL);
    K_CUDA_LAUNCHED();
    return 0;
}

extern "C" int k_cuda_sample_rows(int32_t *out, const float *logits, const float *params,
                                  const int64_t *rng, int rows, int n, int32_t *flag,
                                  void *stream)
{
    if (rows < 0 || n <= 0 || (rows && (!params || !rng)))
        return -EINVAL;
    if (!rows)
        return 0;
    sample_kernel<<<rows, SAMPLE_THREADS, 0, K_STREAM(stream)>>>(out, logits, n, 0, 0, 0, 0, 0,
                                                                 params, rng, flag);
    K_CUDA_LAUNCHED();
    return 0;
}

extern "C" int k_cuda_philox_uniform(float *out, uint64_t seed, uint64_t counter, size_t n,
                                     void *stream)
{
    if (!n)
        return 0;
    philox_kernel<<<k_grid(n, 256), 256, 0, K_STREAM(stream)>>>(out, seed, counter, n);
    K_CUDA_LAUNCHED();
    return 0;
}
