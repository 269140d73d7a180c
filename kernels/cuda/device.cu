/* The CUDA device of executable graphs (kx_device in kernels/exec.h):
 * memory from cudaMalloc, streams and events created non-blocking and
 * without timing (timing events cost a little on every record), and stream
 * capture into CUDA graphs.  Every slot makes the executable's device
 * current first, so one worker thread may drive executables on different
 * GPUs.  Errors print file and line (kcuda.cuh) and return -EIO. */
#include "kernels/cuda/kcuda.cuh"

extern "C" {
#include "kernels/exec.h"
}

typedef struct cuda_dev {
    int ordinal;
} cuda_dev;

#define SET_DEVICE(dv) K_CUDA_CHECK(cudaSetDevice(((cuda_dev *)(dv))->ordinal))

/* Zeroed before it returns: the memset runs on the legacy default stream,
 * which the executables' non-blocking streams do not wait for, so without
 * the sync a kernel could run before the zeroing (allocation happens at
 * compile time, never on a run's path). */
static int cu_alloc(void *dv, size_t bytes, void **out)
{
    *out = NULL;
    SET_DEVICE(dv);
    K_CUDA_CHECK(cudaMalloc(out, bytes ? bytes : 1));
    cudaError_t e = cudaMemsetAsync(*out, 0, bytes ? bytes : 1, cudaStreamLegacy);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cudaStreamLegacy);
    if (e != cudaSuccess) {
        cudaFree(*out);
        *out = NULL;
        K_CUDA_CHECK(e);
    }
    return 0;
}

/* Whether P is memory of this device (what kx_param_borrow may borrow). */
static bool cu_owns(void *dv, const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice && a.device == ((cuda_dev *)dv)->ordinal;
}

static void cu_free(void *dv, void *p)
{
    if (p && cudaSetDevice(((cuda_dev *)dv)->ordinal) == cudaSuccess)
        cudaFree(p);
}

static int cu_copy(void *dv, void *dst, const void *src, size_t bytes, void *queue)
{
    SET_DEVICE(dv);
    if (queue) {
        K_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, K_STREAM(queue)));
        return 0;
    }
    /* cudaMemcpy may return before a device-to-device copy (or the DMA of
     * one from pageable memory) has landed, and the executables' streams are
     * non-blocking, so they would not wait for it: wait here, so that a copy
     * without a queue is done for every later reader. */
    K_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
    K_CUDA_CHECK(cudaStreamSynchronize(0));
    return 0;
}

static int cu_queue_create(void *dv, void **q)
{
    SET_DEVICE(dv);
    cudaStream_t s;
    K_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *q = s;
    return 0;
}

static void cu_queue_destroy(void *dv, void *q)
{
    (void)dv;
    cudaStreamDestroy(K_STREAM(q));
}

static int cu_event_create(void *dv, void **e)
{
    SET_DEVICE(dv);
    cudaEvent_t ev;
    K_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *e = ev;
    return 0;
}

static void cu_event_destroy(void *dv, void *e)
{
    (void)dv;
    cudaEventDestroy((cudaEvent_t)e);
}

static int cu_event_record(void *dv, void *e, void *q)
{
    (void)dv;
    K_CUDA_CHECK(cudaEventRecord((cudaEvent_t)e, K_STREAM(q)));
    return 0;
}

static int cu_queue_wait(void *dv, void *q, void *e)
{
    (void)dv;
    K_CUDA_CHECK(cudaStreamWaitEvent(K_STREAM(q), (cudaEvent_t)e, 0));
    return 0;
}

static int cu_queue_sync(void *dv, void *q)
{
    (void)dv;
    K_CUDA_CHECK(cudaStreamSynchronize(K_STREAM(q)));
    return 0;
}

/* Thread-local capture: another thread's unrelated CUDA calls (a second
 * executable compiling) neither join nor break this capture. */
static int cu_capture_begin(void *dv, void *q)
{
    SET_DEVICE(dv);
    K_CUDA_CHECK(cudaStreamBeginCapture(K_STREAM(q), cudaStreamCaptureModeThreadLocal));
    return 0;
}

static int cu_capture_end(void *dv, void *q, void **graph)
{
    (void)dv;
    *graph = NULL;
    cudaGraph_t g = NULL;
    K_CUDA_CHECK(cudaStreamEndCapture(K_STREAM(q), &g));
    cudaGraphExec_t ge = NULL;
    cudaError_t e = cudaGraphInstantiate(&ge, g, 0);
    cudaGraphDestroy(g);
    K_CUDA_CHECK(e);
    *graph = ge;
    return 0;
}

static int cu_graph_launch(void *dv, void *graph, void *q)
{
    (void)dv;
    K_CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, K_STREAM(q)));
    return 0;
}

static void cu_graph_destroy(void *dv, void *graph)
{
    (void)dv;
    cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

/* One device struct per ordinal, made on first use and kept for the life of
 * the process (executables hold pointers to it). */
extern "C" const kx_device *kx_device_cuda(int ordinal)
{
    enum { MAX_DEVICES = 16 };
    static cuda_dev state[MAX_DEVICES];
    static kx_device devs[MAX_DEVICES];
    int n = 0;
    if (ordinal < 0 || ordinal >= MAX_DEVICES || cudaGetDeviceCount(&n) != cudaSuccess ||
        ordinal >= n)
        return NULL;
    if (!devs[ordinal].name) {
        /* The cuBLAS handle now, before any capture can begin. */
        if (k_cuda_blas_init(ordinal))
            return NULL;
        state[ordinal].ordinal = ordinal;
        devs[ordinal] = (kx_device){"cuda", true, &state[ordinal], cu_alloc, cu_free, cu_copy,
                                    cu_queue_create, cu_queue_destroy, cu_event_create,
                                    cu_event_destroy, cu_event_record, cu_queue_wait,
                                    cu_queue_sync, cu_capture_begin, cu_capture_end,
                                    cu_graph_launch, cu_graph_destroy, cu_owns};
    }
    return &devs[ordinal];
}

extern "C" int k_cuda_copy(void *dst, const void *src, size_t bytes, void *stream)
{
    K_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, K_STREAM(stream)));
    return 0;
}
