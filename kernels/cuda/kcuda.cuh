/* Shared pieces of the CUDA kernels: error checks that name file and line
 * (llm.c's cudaCheck, but returning -EIO instead of exiting: the worker
 * reports a failed op, it does not die), launch geometry and block
 * reductions. */
#ifndef BATON_KERNELS_CUDA_KCUDA_CUH
#define BATON_KERNELS_CUDA_KCUDA_CUH

#include <errno.h>
#include <stdio.h>

#include <cuda_runtime.h>

extern "C" {
#include "kernels/kernels.h"
}

/* A failed call also leaves its error as the thread's last error; reading
 * it back here clears it (unless it is sticky), or the next launch's
 * K_CUDA_LAUNCHED would report it again for a launch that went fine. */
#define K_CUDA_CHECK(call)                                                                    \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            (void)cudaGetLastError();                                                         \
            fprintf(stderr, "%s:%d: CUDA error: %s\n", __FILE__, __LINE__,                    \
                    cudaGetErrorString(e_));                                                  \
            return -EIO;                                                                      \
        }                                                                                     \
    } while (0)

/* After a launch: a bad configuration shows up here, not at the next sync. */
#define K_CUDA_LAUNCHED() K_CUDA_CHECK(cudaGetLastError())

#define K_STREAM(s) ((cudaStream_t)(s))

static inline unsigned k_grid(size_t n, unsigned threads)
{
    size_t g = (n + threads - 1) / threads;
    return (unsigned)(g > 65535u * 16u ? 65535u * 16u : (g ? g : 1));
}

__device__ __forceinline__ float k_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float k_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum (or max) over the block; every thread gets the result.  SH holds 32
 * floats of shared memory; blockDim.x is a multiple of 32. */
__device__ __forceinline__ float k_block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = k_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = (int)threadIdx.x < (int)(blockDim.x >> 5) ? sh[threadIdx.x] : 0.0f;
    if (warp == 0)
        v = k_warp_sum(v);
    if (threadIdx.x == 0)
        sh[0] = v;
    __syncthreads();
    return sh[0];
}

__device__ __forceinline__ float k_block_max(float v, float *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = k_warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = (int)threadIdx.x < (int)(blockDim.x >> 5) ? sh[threadIdx.x] : -INFINITY;
    if (warp == 0)
        v = k_warp_max(v);
    if (threadIdx.x == 0)
        sh[0] = v;
    __syncthreads();
    return sh[0];
}

#endif
