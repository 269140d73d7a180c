/* cudaemu: what a .cu file sees in the emulated build.
 *
 * The runtime API (cuda_runtime_api.h) plus, in C++, the device side:
 * dim3, threadIdx and friends, __syncthreads, warp shuffles and votes,
 * shared memory, atomics and the launch that cudaemu/rewrite.py writes in
 * place of `kernel<<<grid, block, smem, stream>>>(args)`.
 *
 * Every CUDA thread of a block runs as a fiber on the CPU.  Fibers switch
 * only at __syncthreads, __syncwarp, shuffles and votes, so those carry the
 * source file and line (the macros below) for the reports of
 * cudaemu/exec.cc: a barrier not reached by every live thread, a shuffle
 * whose mask leaves out its own lane or waits on a lane that has exited. */
#ifndef CUDAEMU_CUDA_RUNTIME_H
#define CUDAEMU_CUDA_RUNTIME_H

#include <math.h>
#include <string.h>

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __constant__ static

namespace cudaemu {

/* The running fiber's coordinates, set by the executor at every switch. */
extern uint3 thread_idx, block_idx;
extern dim3 block_dim, grid_dim;

enum warp_op {
    WARP_SYNC,
    SHFL_IDX,
    SHFL_UP,
    SHFL_DOWN,
    SHFL_XOR,
    VOTE_BALLOT,
    VOTE_ANY,
    VOTE_ALL
};

void syncthreads(const char *file, int line);
/* A warp-level meeting of the lanes in MASK: returns the 64 bits this lane
 * receives (a shuffled value, or a vote's result). */
uint64_t warp_meet(warp_op op, unsigned mask, uint64_t value, int arg, int width,
                   const char *file, int line);
void *dyn_smem(void);
void *static_smem(const void *key, size_t bytes, size_t align, const char *name);

struct launch_cfg {
    dim3 grid, block;
    size_t smem;         /* bytes of dynamic shared memory */
    cudaStream_t stream; /* NULL: the legacy default stream */
    launch_cfg(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = NULL)
        : grid(g), block(b), smem(s), stream(st)
    {
    }
};

/* One launch's kernel and arguments, copied at launch as CUDA copies them,
 * run once per thread.  Shared by a stream command and any graph that
 * captured it. */
struct kernel_call {
    virtual ~kernel_call() {}
    virtual void run() const = 0;
};

template <typename... P>
struct kernel_args final : kernel_call {
    void (*fn)(P...);
    std::tuple<typename std::decay<P>::type...> args;
    template <typename... A>
    kernel_args(void (*f)(P...), A &&...a) : fn(f), args(std::forward<A>(a)...)
    {
    }
    void run() const override { std::apply(fn, args); }
};

/* Checks the configuration, then queues the launch on its stream (or into
 * the graph the stream is capturing).  PTRS are the pointer arguments, which
 * must be device memory or NULL. */
void launch_enqueue(const char *name, const char *file, int line, const void *fn,
                    const launch_cfg &cfg, std::shared_ptr<const kernel_call> call,
                    const void *const *ptrs, int n_ptrs);

template <typename T>
static inline void collect_ptr(const void **ptrs, int *n, const T &v)
{
    if constexpr (std::is_pointer<T>::value)
        ptrs[(*n)++] = (const void *)v;
    else
        (void)ptrs, (void)n, (void)v;
}

template <typename... P, typename... A>
static inline void launch(const char *name, const char *file, int line, void (*fn)(P...),
                          const launch_cfg &cfg, A &&...a)
{
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong argument count");
    auto call = std::make_shared<kernel_args<P...>>(fn, std::forward<A>(a)...);
    const void *ptrs[sizeof...(P) + 1];
    int n = 0;
    std::apply([&](const auto &...v) { (collect_ptr(ptrs, &n, v), ...); }, call->args);
    launch_enqueue(name, file, line, (const void *)fn, cfg, std::move(call), ptrs, n);
}

static inline void syncwarp_at(const char *file, int line, unsigned mask = 0xffffffffu)
{
    (void)warp_meet(WARP_SYNC, mask, 0, 0, 32, file, line);
}

template <typename T>
static inline T shfl(warp_op op, const char *file, int line, unsigned mask, T v, int arg,
                     int width = 32)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "shuffle of a value wider than 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    bits = warp_meet(op, mask, bits, arg, width, file, line);
    T r;
    memcpy(&r, &bits, sizeof(T));
    return r;
}

} /* namespace cudaemu */

#define threadIdx (cudaemu::thread_idx)
#define blockIdx (cudaemu::block_idx)
#define blockDim (cudaemu::block_dim)
#define gridDim (cudaemu::grid_dim)
static constexpr int warpSize = 32;

#define __syncthreads() cudaemu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) cudaemu::syncwarp_at(__FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_sync(...) cudaemu::shfl(cudaemu::SHFL_IDX, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) cudaemu::shfl(cudaemu::SHFL_UP, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) cudaemu::shfl(cudaemu::SHFL_DOWN, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) cudaemu::shfl(cudaemu::SHFL_XOR, __FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(m, p) \
    ((unsigned)cudaemu::warp_meet(cudaemu::VOTE_BALLOT, m, (p) ? 1 : 0, 0, 32, __FILE__, __LINE__))
#define __any_sync(m, p) \
    ((int)cudaemu::warp_meet(cudaemu::VOTE_ANY, m, (p) ? 1 : 0, 0, 32, __FILE__, __LINE__))
#define __all_sync(m, p) \
    ((int)cudaemu::warp_meet(cudaemu::VOTE_ALL, m, (p) ? 1 : 0, 0, 32, __FILE__, __LINE__))

template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *func, enum cudaFuncAttribute attr, int value)
{
    return cudaemu_func_set_attribute((const void *)func, attr, value);
}

template <class T>
static inline cudaError_t cudaMalloc(T **ptr, size_t bytes)
{
    return cudaMalloc((void **)ptr, bytes);
}

/* Fibers of a block share one OS thread and switch only at barriers and
 * warp operations, so a plain read-modify-write is atomic here. */
template <class T> static inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <class T> static inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <class T> static inline T atomicMax(T *p, T v) { T o = *p; *p = o > v ? o : v; return o; }
template <class T> static inline T atomicMin(T *p, T v) { T o = *p; *p = o < v ? o : v; return o; }
template <class T> static inline T atomicCAS(T *p, T c, T v) { T o = *p; if (o == c) *p = v; return o; }
template <class T> static inline T __ldg(const T *p) { return *p; }

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
/* The fast intrinsics are computed exactly here (__expf and __logf are
 * glibc's own; __sincosf is declared but not exported by glibc, hence the
 * macro): the emulator cannot reproduce their error on a GPU (a few ulp),
 * so a check of them needs a tolerance that covers it. */
namespace cudaemu {
static inline void sincosf_exact(float x, float *s, float *c) { *s = sinf(x); *c = cosf(x); }
}
#define __sincosf(x, s, c) cudaemu::sincosf_exact(x, s, c)
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline size_t min(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t max(size_t a, size_t b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

#endif /* __cplusplus */
#endif
