/* Tests of the CUDA emulator itself (cudaemu/): that it runs CUDA as CUDA
 * defines it, and that it reports code which breaks CUDA's rules.
 *
 * A test that expects a launch to fail, a fault, or a sticky error runs in
 * a child process (in_child), because a sticky error poisons the whole
 * process, as a real CUDA context does.  Tests of order-dependent bugs run
 * the same code under several seeds (CUDAEMU_SEED) in children and expect
 * both outcomes to appear. */
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern "C" {
#include <cmocka.h>
}

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#define CK(call) assert_int_equal((int)(call), (int)cudaSuccess)

/* ---- helpers ------------------------------------------------------------------ */

/* Runs FN in a child process; returns its exit status (0..255), or 128 +
 * the signal that killed it. */
static int in_child(int (*fn)(void), const char *seed = NULL)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (seed)
            cudaemu_seed(strtoull(seed, NULL, 10));
        /* CMocka catches SIGSEGV to resume the next test; a child must die
         * of it instead, after the emulator's report. */
        signal(SIGSEGV, SIG_DFL);
        cudaemu_install_fault_handler();
        /* The child's stderr: reports are expected here, keep them quiet. */
        if (!getenv("EMU_TEST_VERBOSE") && !freopen("/dev/null", "w", stderr))
            _exit(99);
        _exit(fn());
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

template <typename T>
static T *dev_alloc(size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess)
        abort();
    return (T *)p;
}

/* Child exit codes for "what happened to the launch". */
enum { LAUNCH_OK = 0, LAUNCH_FAILED = 10, LAUNCH_NO_PROBLEM = 11 };

/* After a launch expected to break a rule: LAUNCH_FAILED when the sync
 * reports the sticky launch failure and a problem was counted. */
static int launch_outcome(void)
{
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess)
        return LAUNCH_OK;
    if (!cudaemu_problems())
        return LAUNCH_NO_PROBLEM;
    /* Sticky: every later call fails the same way. */
    void *p;
    if (cudaMalloc(&p, 16) != e)
        return 12;
    return LAUNCH_FAILED;
}

/* ---- kernels --------------------------------------------------------------------- */

__global__ static void shuffle_kernel(int *out)
{
    int lane = threadIdx.x & 31;
    int base = blockIdx.x * 32 * 8 + lane * 8;
    out[base + 0] = __shfl_xor_sync(0xffffffffu, lane * 10, 5);
    out[base + 1] = __shfl_down_sync(0xffffffffu, lane * 10, 3);
    out[base + 2] = __shfl_up_sync(0xffffffffu, lane * 10, 2);
    out[base + 3] = __shfl_sync(0xffffffffu, lane * 10, 7);
    out[base + 4] = __shfl_down_sync(0xffffffffu, lane * 10, 3, 16);
    out[base + 5] = __shfl_sync(0xffffffffu, lane * 10, 3, 8);
    out[base + 6] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
    out[base + 7] = __any_sync(0xffffffffu, lane == 17) * 2 + __all_sync(0xffffffffu, lane < 31);
}

__device__ static float block_sum(float v, float *sh, bool with_barrier)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0)
        sh[warp] = v;
    if (with_barrier)
        __syncthreads();
    v = (int)threadIdx.x < (int)(blockDim.x >> 5) ? sh[threadIdx.x] : 0.0f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ static void sum_kernel(float *out, const float *x, int n, bool with_barrier)
{
    __shared__ float sh[32];
    float s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += x[i];
    s = block_sum(s, sh, with_barrier);
    if (threadIdx.x == 0)
        out[blockIdx.x] = s;
}

__global__ static void early_return_kernel(float *out)
{
    __shared__ float sh[64];
    if (threadIdx.x >= 32)
        return; /* half the block leaves, then the rest waits at a barrier */
    sh[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = sh[63 - threadIdx.x];
}

__global__ static void half_mask_kernel(float *out)
{
    float v = __shfl_xor_sync(0x0000ffffu, 1.0f, 1);
    out[threadIdx.x] = v;
}

__global__ static void exited_lane_kernel(float *out)
{
    if (threadIdx.x == 5)
        return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ static void two_barriers_kernel(float *out)
{
    if (threadIdx.x < 16)
        __syncthreads();
    else
        __syncthreads();
    out[threadIdx.x] = 1.0f;
}

__global__ static void smem_overrun_kernel(float *out, int n)
{
    __shared__ float sh[128];
    sh[threadIdx.x] = 1.0f;
    if (threadIdx.x == 0)
        sh[n] = 2.0f; /* n = 128: one past the end */
    __syncthreads();
    out[threadIdx.x] = sh[threadIdx.x];
}

__global__ static void big_static_kernel(float *out)
{
    __shared__ float sh[10000]; /* 40000 bytes of static shared memory */
    extern __shared__ float dyn[];
    sh[threadIdx.x] = 1.0f;
    dyn[threadIdx.x] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = sh[threadIdx.x] + dyn[threadIdx.x];
}

__global__ static void dyn_kernel(float *out, int n)
{
    extern __shared__ float dyn[];
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        dyn[i] = (float)i;
    __syncthreads();
    float s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += dyn[n - 1 - i];
    out[threadIdx.x] = s;
}

__global__ static void set_kernel(int *p, int v)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        *p = v;
}

__global__ static void copy_kernel(int *dst, const int *src)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        *dst = *src;
}

__global__ static void add_kernel(float *x, float v, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] += v;
}

/* ---- semantics -------------------------------------------------------------------- */

static void test_shuffles_and_votes(void **state)
{
    (void)state;
    int *d = dev_alloc<int>(2 * 32 * 8), h[2 * 32 * 8];
    shuffle_kernel<<<2, 32>>>(d);
    CK(cudaGetLastError());
    CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    unsigned ballot = 0;
    for (int l = 0; l < 32; l++)
        ballot |= (unsigned)(l % 3 == 0) << l;
    for (int b = 0; b < 2; b++)
        for (int l = 0; l < 32; l++) {
            int *o = h + b * 256 + l * 8;
            assert_int_equal(o[0], (l ^ 5) * 10);
            assert_int_equal(o[1], (l + 3 < 32 ? l + 3 : l) * 10);
            assert_int_equal(o[2], (l >= 2 ? l - 2 : l) * 10);
            assert_int_equal(o[3], 70);
            assert_int_equal(o[4], ((l & 15) + 3 < 16 ? l + 3 : l) * 10);
            assert_int_equal(o[5], ((l & ~7) + 3) * 10);
            assert_int_equal((unsigned)o[6], ballot);
            assert_int_equal(o[7], 2);
        }
    CK(cudaFree(d));
}

static void test_block_sum_with_barrier(void **state)
{
    (void)state;
    enum { N = 1000 };
    float hx[N], want = 0;
    for (int i = 0; i < N; i++)
        hx[i] = (float)(i % 7), want += hx[i];
    float *x = dev_alloc<float>(N), *out = dev_alloc<float>(3), got[3];
    CK(cudaMemcpy(x, hx, sizeof(hx), cudaMemcpyHostToDevice));
    sum_kernel<<<3, 256>>>(out, x, N, true);
    CK(cudaMemcpy(got, out, sizeof(got), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 3; i++)
        assert_float_equal(got[i], want, 1e-3);
    CK(cudaFree(x));
    CK(cudaFree(out));
}

/* Without the barrier the result depends on the order of warps: some seed
 * must show it wrong (thread 0 reads a slot no warp has written yet). */
static int missing_barrier_child(void)
{
    enum { N = 1000 };
    float hx[N], want = 0;
    for (int i = 0; i < N; i++)
        hx[i] = 1.0f, want += 1.0f;
    float *x = dev_alloc<float>(N), *out = dev_alloc<float>(4), got[4];
    cudaMemcpy(x, hx, sizeof(hx), cudaMemcpyHostToDevice);
    sum_kernel<<<4, 256>>>(out, x, N, false);
    if (cudaMemcpy(got, out, sizeof(got), cudaMemcpyDeviceToHost) != cudaSuccess)
        return 3;
    for (int i = 0; i < 4; i++)
        if (got[i] != want)
            return 1;
    return 0;
}

static void test_missing_barrier_shows_under_some_seed(void **state)
{
    (void)state;
    int wrong = 0, right = 0;
    const char *seeds[] = {"1", "2", "3", "4", "5", "6", "7", "8"};
    for (const char *s : seeds) {
        int r = in_child(missing_barrier_child, s);
        assert_true(r == 0 || r == 1);
        wrong += r == 1, right += r == 0;
    }
    assert_true(wrong > 0);
}

static int early_return_child(void)
{
    float *o = dev_alloc<float>(64);
    early_return_kernel<<<1, 64>>>(o);
    return launch_outcome();
}

static int half_mask_child(void)
{
    float *o = dev_alloc<float>(32);
    half_mask_kernel<<<1, 32>>>(o);
    return launch_outcome();
}

static int exited_lane_child(void)
{
    float *o = dev_alloc<float>(32);
    exited_lane_kernel<<<1, 32>>>(o);
    return launch_outcome();
}

static int two_barriers_child(void)
{
    float *o = dev_alloc<float>(32);
    two_barriers_kernel<<<1, 32>>>(o);
    return launch_outcome();
}

static int smem_overrun_child(void)
{
    float *o = dev_alloc<float>(128);
    smem_overrun_kernel<<<1, 128>>>(o, 128);
    return launch_outcome();
}

static int host_pointer_child(void)
{
    static int host_int;
    set_kernel<<<1, 1>>>(&host_int, 3);
    return cudaDeviceSynchronize() == cudaErrorIllegalAddress && cudaemu_problems() ? LAUNCH_FAILED
                                                                                   : LAUNCH_OK;
}

static int host_deref_child(void)
{
    float *d = dev_alloc<float>(16);
    cudaMemset(d, 0, 64);
    cudaDeviceSynchronize();
    return (int)*(volatile float *)d; /* faults: device memory from host code */
}

/* Copies open only the allocations they touch, and close them again. */
static int copy_then_deref_child(void)
{
    float *a = dev_alloc<float>(16), *b = dev_alloc<float>(16), h[16] = {0};
    if (cudaMemcpy(a, h, sizeof(h), cudaMemcpyHostToDevice) ||
        cudaMemcpy(b, a, sizeof(h), cudaMemcpyDeviceToDevice) ||
        cudaMemcpy(h, b, sizeof(h), cudaMemcpyDeviceToHost))
        return 1;
    return (int)*(volatile float *)a; /* faults */
}

static void test_rule_breaking_is_reported(void **state)
{
    (void)state;
    assert_int_equal(in_child(early_return_child), LAUNCH_FAILED);
    assert_int_equal(in_child(half_mask_child), LAUNCH_FAILED);
    assert_int_equal(in_child(exited_lane_child), LAUNCH_FAILED);
    assert_int_equal(in_child(two_barriers_child), LAUNCH_FAILED);
    assert_int_equal(in_child(host_pointer_child), LAUNCH_FAILED);
    /* Under a sanitizer the sanitizer reports the fault and the child
     * dies; otherwise the launch fails. */
    int r = in_child(smem_overrun_child);
    assert_true(r == LAUNCH_FAILED || r >= 128 || r == 1);
    assert_int_equal(in_child(host_deref_child), 128 + SIGSEGV);
    assert_int_equal(in_child(copy_then_deref_child), 128 + SIGSEGV);
}

/* ---- launch limits ---------------------------------------------------------------- */

static void test_launch_limits(void **state)
{
    (void)state;
    float *o = dev_alloc<float>(1024);
    add_kernel<<<1, 1025>>>(o, 1.0f, 1);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaSuccess); /* not sticky */
    add_kernel<<<dim3(1, 65536), 32>>>(o, 1.0f, 1);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    add_kernel<<<dim3(1, 1, 65535), dim3(4, 4, 64)>>>(o, 1.0f, 1);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    /* 64 KiB of dynamic shared memory needs the opt-in. */
    int n = 16384;
    dyn_kernel<<<1, 256, n * 4>>>(o, n);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    CK(cudaFuncSetAttribute(dyn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4));
    dyn_kernel<<<1, 256, n * 4>>>(o, n);
    CK(cudaGetLastError());
    float h[256], want = 0;
    CK(cudaMemcpy(h, o, sizeof(h), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i += 256)
        want += (float)(n - 1 - i);
    assert_float_equal(h[0], want, 1e-3);
    assert_int_equal(cudaFuncSetAttribute(dyn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          232448 + 1),
                     cudaErrorInvalidValue);
    cudaGetLastError();
    CK(cudaFree(o));
}

/* 40000 static bytes leave 9152 of 48 KiB: 10 KiB more dynamic needs the
 * attribute, and the launch that asks without it fails. */
static int static_plus_dynamic_child(void)
{
    float *o = dev_alloc<float>(32);
    big_static_kernel<<<1, 32, 10 * 1024>>>(o);
    if (cudaGetLastError() != cudaSuccess)
        return 13; /* the static size is not known before the first run */
    return launch_outcome();
}

static void test_static_shared_memory_counts(void **state)
{
    (void)state;
    assert_int_equal(in_child(static_plus_dynamic_child), LAUNCH_FAILED);
}

/* ---- streams, events, the legacy stream ------------------------------------------------ */

/* Two streams, no event between a write and a read: the order (hence the
 * value read) depends on the seed.  Exit code: the value read. */
static int race_child(void)
{
    int *x = dev_alloc<int>(1), *y = dev_alloc<int>(1), h = -1;
    cudaMemset(x, 0, 4);
    cudaDeviceSynchronize();
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    set_kernel<<<1, 1, 0, a>>>(x, 1);
    copy_kernel<<<1, 1, 0, b>>>(y, x);
    cudaDeviceSynchronize();
    cudaMemcpy(&h, y, 4, cudaMemcpyDeviceToHost);
    return h;
}

static int event_child(void)
{
    int *x = dev_alloc<int>(1), *y = dev_alloc<int>(1), h = -1;
    cudaMemset(x, 0, 4);
    cudaDeviceSynchronize();
    cudaStream_t a, b;
    cudaEvent_t e;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    set_kernel<<<1, 1, 0, a>>>(x, 1);
    cudaEventRecord(e, a);
    cudaStreamWaitEvent(b, e, 0);
    copy_kernel<<<1, 1, 0, b>>>(y, x);
    cudaStreamSynchronize(b);
    cudaMemcpy(&h, y, 4, cudaMemcpyDeviceToHost);
    return h;
}

/* A blocking stream and the legacy stream order each other; a
 * non-blocking one does not.  Exit: the value read after set(1) on the
 * stream, a legacy memset to 0, and a copy on the stream. */
static int legacy_child_with(unsigned flags)
{
    int *x = dev_alloc<int>(1), *y = dev_alloc<int>(1), h = -1;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, flags);
    set_kernel<<<1, 1, 0, s>>>(x, 1);
    cudaMemset(x, 0, 4);
    copy_kernel<<<1, 1, 0, s>>>(y, x);
    cudaDeviceSynchronize();
    cudaMemcpy(&h, y, 4, cudaMemcpyDeviceToHost);
    return h;
}

static int legacy_blocking_child(void)
{
    return legacy_child_with(cudaStreamDefault);
}

static int legacy_nonblocking_child(void)
{
    return legacy_child_with(cudaStreamNonBlocking);
}

static void test_stream_order(void **state)
{
    (void)state;
    int seen[2] = {0, 0}, seen_nb[2] = {0, 0};
    const char *seeds[] = {"1", "2", "3", "4", "5", "6", "7", "8", "9", "10"};
    for (const char *s : seeds) {
        int r = in_child(race_child, s);
        assert_true(r == 0 || r == 1);
        seen[r]++;
        assert_int_equal(in_child(event_child, s), 1);
        assert_int_equal(in_child(legacy_blocking_child, s), 0);
        r = in_child(legacy_nonblocking_child, s);
        assert_true(r == 0 || r == 1);
        seen_nb[r]++;
    }
    assert_true(seen[0] > 0 && seen[1] > 0);
    assert_true(seen_nb[0] > 0 && seen_nb[1] > 0);
}

static void test_queries_make_progress(void **state)
{
    (void)state;
    cudaStream_t s;
    cudaEvent_t e;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e));
    float *x = dev_alloc<float>(64);
    for (int i = 0; i < 5; i++)
        add_kernel<<<1, 64, 0, s>>>(x, 1.0f, 64);
    CK(cudaEventRecord(e, s));
    int polls = 0;
    while (cudaEventQuery(e) == cudaErrorNotReady)
        polls++;
    assert_true(polls > 0 && polls < 100);
    CK(cudaStreamQuery(s));
    float ms;
    assert_int_equal(cudaEventElapsedTime(&ms, e, e), cudaErrorNotSupported);
    cudaGetLastError();
    CK(cudaFree(x));
    CK(cudaEventDestroy(e));
    CK(cudaStreamDestroy(s));
}

/* ---- capture and graphs ------------------------------------------------------------- */

static void test_capture_fork_join_replay(void **state)
{
    (void)state;
    enum { N = 256 };
    float *x = dev_alloc<float>(N), *y = dev_alloc<float>(N), h[N];
    CK(cudaMemset(x, 0, sizeof(h)));
    CK(cudaMemset(y, 0, sizeof(h)));
    cudaStream_t s, t;
    cudaEvent_t fork, join;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    CK(cudaDeviceSynchronize());
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    add_kernel<<<2, 64, 0, s>>>(x, 1.0f, N);
    CK(cudaEventRecord(fork, s));
    CK(cudaStreamWaitEvent(t, fork, 0));
    add_kernel<<<2, 64, 0, t>>>(y, 2.0f, N);
    CK(cudaEventRecord(join, t));
    add_kernel<<<2, 64, 0, s>>>(x, 10.0f, N);
    CK(cudaStreamWaitEvent(s, join, 0));
    cudaStreamCaptureStatus st;
    CK(cudaStreamIsCapturing(t, &st));
    assert_int_equal(st, cudaStreamCaptureStatusActive);
    cudaGraph_t g;
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaStreamIsCapturing(t, &st));
    assert_int_equal(st, cudaStreamCaptureStatusNone);
    /* Capturing ran nothing. */
    CK(cudaMemcpy(h, x, sizeof(h), cudaMemcpyDeviceToHost));
    assert_float_equal(h[0], 0.0f, 0);
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    for (int i = 0; i < 3; i++)
        CK(cudaGraphLaunch(ge, s));
    CK(cudaGraphExecDestroy(ge)); /* launches already queued still run */
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h, x, sizeof(h), cudaMemcpyDeviceToHost));
    assert_float_equal(h[N - 1], 33.0f, 0);
    CK(cudaMemcpy(h, y, sizeof(h), cudaMemcpyDeviceToHost));
    assert_float_equal(h[N - 1], 6.0f, 0);
    CK(cudaFree(x));
    CK(cudaFree(y));
    CK(cudaEventDestroy(fork));
    CK(cudaEventDestroy(join));
    CK(cudaStreamDestroy(s));
    CK(cudaStreamDestroy(t));
}

static void test_capture_rules(void **state)
{
    (void)state;
    float *x = dev_alloc<float>(64);
    cudaStream_t s, t;
    cudaEvent_t fork;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    cudaGraph_t g = NULL;

    /* cudaMalloc inside a capture invalidates it. */
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    add_kernel<<<1, 64, 0, s>>>(x, 1.0f, 64);
    void *p;
    assert_int_equal(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
    add_kernel<<<1, 64, 0, s>>>(x, 1.0f, 64);
    assert_int_equal(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    assert_null(g);
    cudaGetLastError();

    /* So does creating a cuBLAS handle (it allocates). */
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cublasHandle_t h;
    assert_int_not_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();

    /* A fork that never joins back. */
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CK(cudaEventRecord(fork, s));
    CK(cudaStreamWaitEvent(t, fork, 0));
    add_kernel<<<1, 64, 0, t>>>(x, 1.0f, 64);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureUnjoined);
    cudaGetLastError();

    /* Synchronising a capturing stream is refused. */
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();

    /* The legacy stream cannot be captured. */
    assert_int_equal(cudaStreamBeginCapture(NULL, cudaStreamCaptureModeGlobal),
                     cudaErrorStreamCaptureUnsupported);
    cudaGetLastError();
    CK(cudaFree(x));
    CK(cudaEventDestroy(fork));
    CK(cudaStreamDestroy(s));
    CK(cudaStreamDestroy(t));
}

/* ---- memory and IPC ------------------------------------------------------------------- */

static void test_copies_and_bounds(void **state)
{
    (void)state;
    int *d = dev_alloc<int>(4), h[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_true(cudaemu_is_device_ptr(d));
    assert_false(cudaemu_is_device_ptr(h));
    /* Past the allocation, the wrong direction: refused. */
    assert_int_equal(cudaMemcpy(d, h, 8 * 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(h, d, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    cudaGetLastError();
    /* An async copy from host memory is staged: the buffer may change at once. */
    CK(cudaMemcpyAsync(d, h, 16, cudaMemcpyHostToDevice, NULL));
    h[0] = 100;
    CK(cudaMemcpy(h + 4, d, 16, cudaMemcpyDefault));
    assert_int_equal(h[4], 1);
    assert_int_equal(h[7], 4);
    assert_int_equal(cudaFree(h), cudaErrorInvalidDevicePointer);
    cudaGetLastError();
    size_t before = cudaemu_bytes_allocated();
    CK(cudaFree(d));
    assert_int_equal(cudaemu_bytes_allocated(), before - 16);
}

static cudaIpcMemHandle_t ipc_handle;

/* The "other process": opens the handle, checks what the parent wrote,
 * writes its own values in place, closes. */
static int ipc_child(void)
{
    int *p = NULL;
    if (cudaIpcOpenMemHandle((void **)&p, ipc_handle, cudaIpcMemLazyEnablePeerAccess))
        return 20;
    int *again = NULL;
    if (cudaIpcOpenMemHandle((void **)&again, ipc_handle, 0) || again != p)
        return 21;
    int h[4];
    if (cudaMemcpy(h, p, sizeof(h), cudaMemcpyDeviceToHost) || h[0] != 7 || h[3] != 10)
        return 22;
    set_kernel<<<1, 1>>>(p, 42);
    if (cudaDeviceSynchronize())
        return 23;
    if (cudaIpcCloseMemHandle(again) || cudaIpcCloseMemHandle(p))
        return 24;
    return 0;
}

static void test_ipc_between_processes(void **state)
{
    (void)state;
    int *d = dev_alloc<int>(1024), h[4] = {7, 8, 9, 10};
    CK(cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice));
    CK(cudaIpcGetMemHandle(&ipc_handle, d));
    /* Only an allocation's base exports; the exporter cannot open its own. */
    cudaIpcMemHandle_t bad;
    assert_int_equal(cudaIpcGetMemHandle(&bad, d + 1), cudaErrorInvalidValue);
    void *p;
    assert_int_equal(cudaIpcOpenMemHandle(&p, ipc_handle, 0), cudaErrorDeviceUninitialized);
    cudaGetLastError();
    assert_int_equal(in_child(ipc_child), 0);
    /* The child wrote the parent's memory in place: no copy was made. */
    CK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    assert_int_equal(h[0], 42);
    assert_int_equal(h[1], 8);
    CK(cudaFree(d));
}

/* ---- cuBLAS ------------------------------------------------------------------------------ */

static void test_cublas_column_major(void **state)
{
    (void)state;
    enum { M = 5, N = 3, K = 4 };
    float a[K * M], b[K * N], c[M * N], want[M * N];
    for (int i = 0; i < K * M; i++)
        a[i] = (float)(i % 5) - 2;
    for (int i = 0; i < K * N; i++)
        b[i] = (float)(i % 3) + 1;
    /* C (M x N, column-major) = A^T B with A stored K x M and B K x N. */
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            for (int k = 0; k < K; k++)
                s += a[i * K + k] * b[j * K + k];
            want[j * M + i] = s;
        }
    float *da = dev_alloc<float>(K * M), *db = dev_alloc<float>(K * N), *dc = dev_alloc<float>(M * N);
    CK(cudaMemcpy(da, a, sizeof(a), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b, sizeof(b), cudaMemcpyHostToDevice));
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    const float one = 1, zero = 0;
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, &one, da, K, db, K, &zero,
                                 dc, M),
                     CUBLAS_STATUS_SUCCESS);
    CK(cudaMemcpy(c, dc, sizeof(c), cudaMemcpyDeviceToHost));
    for (int i = 0; i < M * N; i++)
        assert_float_equal(c[i], want[i], 1e-5);
    /* A leading dimension too small for the stored shape is refused. */
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &one, da, M - 1, db, K,
                                 &zero, dc, M),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dc));
}

/* ---- NCCL ------------------------------------------------------------------------------- */

static ncclUniqueId nccl_id;

/* One rank of two joins; the other never does: init fails after the
 * timeout and leaves no shared-memory file behind. */
static int nccl_alone_child(void)
{
    setenv("CUDAEMU_NCCL_TIMEOUT", "1", 1);
    ncclComm_t c;
    return ncclCommInitRank(&c, 2, nccl_id, 0) == ncclSystemError ? 0 : 1;
}

/* Rank 0 of a formed pair all-reduces; rank 1 (nccl_quitter_child)
 * leaves without doing so.  Rank 0's sync must fail, not hang. */
static int nccl_waiter_child(void)
{
    setenv("CUDAEMU_NCCL_TIMEOUT", "1", 1);
    ncclComm_t c;
    if (ncclCommInitRank(&c, 2, nccl_id, 0) != ncclSuccess)
        return 2;
    float *d = dev_alloc<float>(64);
    cudaMemset(d, 0, 256);
    if (ncclAllReduce(d, d, 64, ncclFloat, ncclSum, c, NULL) != ncclSuccess)
        return 3;
    return launch_outcome();
}

static int nccl_quitter_child(void)
{
    ncclComm_t c;
    return ncclCommInitRank(&c, 2, nccl_id, 1) == ncclSuccess ? 0 : 1;
}

static void test_nccl_missing_peers(void **state)
{
    (void)state;
    assert_int_equal(ncclGetUniqueId(&nccl_id), ncclSuccess);
    assert_int_equal(in_child(nccl_alone_child), 0);
    char path[200];
    snprintf(path, sizeof(path), "/dev/shm%s", nccl_id.internal);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(ncclGetUniqueId(&nccl_id), ncclSuccess);
    snprintf(path, sizeof(path), "/dev/shm%s", nccl_id.internal);
    fflush(NULL);
    pid_t q = fork();
    if (q == 0)
        _exit(nccl_quitter_child());
    assert_int_equal(in_child(nccl_waiter_child), LAUNCH_FAILED);
    int st = 0;
    waitpid(q, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_not_equal(access(path, F_OK), 0);
}

/* Rank 0 of a pair, joined without blocking: sends 1001 bytes, then aborts
 * the communicator while the peer waits for a second message. */
static int nccl_abort_sender(void)
{
    ncclComm_t c = NULL;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    if (ncclCommInitRankConfig(&c, 2, nccl_id, 0, &config) != ncclInProgress)
        return 2;
    ncclResult_t st = ncclInProgress;
    for (int i = 0; i < 200000 && st == ncclInProgress; i++) {
        if (ncclCommGetAsyncError(c, &st) != ncclSuccess)
            return 3;
        usleep(50);
    }
    if (st != ncclSuccess)
        return 4;
    unsigned char h[1001];
    for (int i = 0; i < 1001; i++)
        h[i] = (unsigned char)(i * 7);
    unsigned char *d = dev_alloc<unsigned char>(1001);
    if (cudaMemcpy(d, h, 1001, cudaMemcpyHostToDevice) ||
        ncclSend(d, 1001, ncclUint8, 1, c, NULL) != ncclSuccess || cudaDeviceSynchronize())
        return 5;
    usleep(100000); /* the peer is waiting for a second message by now */
    return ncclCommAbort(c) == ncclSuccess ? 0 : 6;
}

/* Rank 1: receives the 1001 bytes, then a second receive that only the
 * peer's abort ends: it completes and the communicator reports
 * ncclRemoteError. */
static int nccl_abort_receiver(void)
{
    ncclComm_t c;
    if (ncclCommInitRank(&c, 2, nccl_id, 1) != ncclSuccess)
        return 2;
    unsigned char *d = dev_alloc<unsigned char>(1001);
    unsigned char h[1001];
    if (ncclRecv(d, 1001, ncclUint8, 0, c, NULL) != ncclSuccess ||
        cudaMemcpy(h, d, 1001, cudaMemcpyDeviceToHost))
        return 3;
    for (int i = 0; i < 1001; i++)
        if (h[i] != (unsigned char)(i * 7))
            return 4;
    cudaStream_t s;
    cudaEvent_t e;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) ||
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming) ||
        ncclRecv(d, 1001, ncclUint8, 0, c, s) != ncclSuccess || cudaEventRecord(e, s))
        return 5;
    cudaError_t q = cudaErrorNotReady;
    for (int i = 0; i < 100000 && q == cudaErrorNotReady; i++) {
        q = cudaEventQuery(e);
        usleep(100);
    }
    ncclResult_t st = ncclSuccess;
    if (q != cudaSuccess || ncclCommGetAsyncError(c, &st) != ncclSuccess ||
        st != ncclRemoteError)
        return 6;
    return ncclCommAbort(c) == ncclSuccess ? 0 : 7;
}

static void test_nccl_abort(void **state)
{
    (void)state;
    /* A non-blocking join that is aborted before its peer comes leaves no
     * shared-memory file. */
    assert_int_equal(ncclGetUniqueId(&nccl_id), ncclSuccess);
    ncclComm_t c = NULL;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    assert_int_equal(ncclCommInitRankConfig(&c, 2, nccl_id, 0, &config), ncclInProgress);
    ncclResult_t st = ncclSuccess;
    assert_int_equal(ncclCommGetAsyncError(c, &st), ncclSuccess);
    assert_int_equal(st, ncclInProgress);
    assert_int_equal(ncclCommAbort(c), ncclSuccess);
    char path[200];
    snprintf(path, sizeof(path), "/dev/shm%s", nccl_id.internal);
    assert_int_not_equal(access(path, F_OK), 0);
    /* Two processes: bytes cross, then an abort ends the peer's wait. */
    assert_int_equal(ncclGetUniqueId(&nccl_id), ncclSuccess);
    snprintf(path, sizeof(path), "/dev/shm%s", nccl_id.internal);
    fflush(NULL);
    pid_t q = fork();
    if (q == 0)
        _exit(nccl_abort_sender());
    usleep(20000); /* rank 0 waits in its non-blocking join for a while */
    assert_int_equal(in_child(nccl_abort_receiver), 0);
    int ws = 0;
    waitpid(q, &ws, 0);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    assert_int_not_equal(access(path, F_OK), 0);
}

/* Rank R of NR in a ring: a grouped exchange with both neighbours of a
 * buffer larger than a mailbox slot, then an ungrouped small send and
 * receive in opposite orders on the two sides.  Exit 0 when right. */
static int ring_rank(int r, int nr)
{
    ncclComm_t c;
    if (cudaSetDevice(r % 2) || ncclCommInitRank(&c, nr, nccl_id, r) != ncclSuccess)
        return 2;
    size_t n = (600 << 10) / 4 + 3;
    float *h = (float *)malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(r * 1000003 + (int)i);
    float *mine = dev_alloc<float>(n), *left = dev_alloc<float>(n), *right = dev_alloc<float>(n);
    cudaMemcpy(mine, h, n * 4, cudaMemcpyHostToDevice);
    int L = (r + nr - 1) % nr, R = (r + 1) % nr;
    ncclGroupStart();
    ncclSend(mine, n, ncclFloat, R, c, NULL);
    ncclSend(mine, n, ncclFloat, L, c, NULL);
    ncclRecv(left, n, ncclFloat, L, c, NULL);
    ncclRecv(right, n, ncclFloat, R, c, NULL);
    if (ncclGroupEnd() != ncclSuccess || cudaDeviceSynchronize())
        return 3;
    float *g = (float *)malloc(n * 4);
    cudaMemcpy(g, left, n * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i++)
        if (g[i] != (float)(L * 1000003 + (int)i))
            return 4;
    cudaMemcpy(g, right, n * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i++)
        if (g[i] != (float)(R * 1000003 + (int)i))
            return 5;
    /* Small messages need no group: one slot holds them. */
    if (nr == 2) {
        if (r == 0) {
            ncclSend(mine, 100, ncclFloat, 1, c, NULL);
            ncclRecv(left, 100, ncclFloat, 1, c, NULL);
        } else {
            ncclRecv(left, 100, ncclFloat, 0, c, NULL);
            ncclSend(mine, 100, ncclFloat, 0, c, NULL);
        }
        if (cudaDeviceSynchronize())
            return 6;
        cudaMemcpy(g, left, 400, cudaMemcpyDeviceToHost);
        for (int i = 0; i < 100; i++)
            if (g[i] != (float)((1 - r) * 1000003 + i))
                return 7;
    }
    ncclCommDestroy(c);
    return 0;
}

static void run_ring(int nr)
{
    assert_int_equal(ncclGetUniqueId(&nccl_id), ncclSuccess);
    pid_t pids[4];
    fflush(NULL);
    for (int r = 0; r < nr; r++)
        if ((pids[r] = fork()) == 0) {
            cudaemu_seed((unsigned long long)r + 11);
            _exit(ring_rank(r, nr));
        }
    for (int r = 0; r < nr; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
}

static void test_nccl_send_recv(void **state)
{
    (void)state;
    run_ring(2);
    run_ring(3);
}

static void test_device_properties(void **state)
{
    (void)state;
    int n = 0, v = 0;
    CK(cudaGetDeviceCount(&n));
    assert_true(n >= 1);
    struct cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    assert_non_null(strstr(p.name, "H100"));
    assert_int_equal(p.major, 9);
    assert_int_equal(p.warpSize, 32);
    CK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    assert_int_equal(v, 232448);
    assert_int_equal(cudaSetDevice(n), cudaErrorInvalidDevice);
    cudaGetLastError();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shuffles_and_votes),
        cmocka_unit_test(test_block_sum_with_barrier),
        cmocka_unit_test(test_missing_barrier_shows_under_some_seed),
        cmocka_unit_test(test_rule_breaking_is_reported),
        cmocka_unit_test(test_launch_limits),
        cmocka_unit_test(test_static_shared_memory_counts),
        cmocka_unit_test(test_stream_order),
        cmocka_unit_test(test_queries_make_progress),
        cmocka_unit_test(test_capture_fork_join_replay),
        cmocka_unit_test(test_capture_rules),
        cmocka_unit_test(test_copies_and_bounds),
        cmocka_unit_test(test_ipc_between_processes),
        cmocka_unit_test(test_cublas_column_major),
        cmocka_unit_test(test_nccl_missing_peers),
        cmocka_unit_test(test_nccl_abort),
        cmocka_unit_test(test_nccl_send_recv),
        cmocka_unit_test(test_device_properties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
