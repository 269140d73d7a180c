/* The worker's device: the host implementation, and the CUDA one in builds
 * with BATON_CUDA (the real runtime, or cudaemu in the emulated flavour).
 * See device.h. */
#include "worker/device.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/builtin.h"
#include "common/log.h"
#include "common/status.h"
#include "worker/segment.h"

#ifdef BATON_CUDA
#include <cuda_runtime_api.h>
#endif

typedef struct wk_device_ops {
    int (*pool_open)(wk_device *d, const char *run_id, const char *worker, uint64_t bytes,
                     char *err, size_t errlen);
    void (*pool_close)(wk_device *d);
    int (*stream_create)(wk_device *d, void **out, char *err, size_t errlen);
    void (*stream_destroy)(wk_device *d, void *stream);
    int (*copy_async)(wk_device *d, void *stream, void *dst, const void *src, uint64_t n,
                      char *err, size_t errlen);
    int (*sync)(wk_device *d, void *stream, char *err, size_t errlen);
    int (*lost)(wk_device *d, char *err, size_t errlen);
    int (*pair_join)(wk_device *d, void **comm, const void *id, size_t len, int rank, char *err,
                     size_t errlen);
    int (*pair_ready)(wk_device *d, void *comm);
    int (*pair_p2p)(wk_device *d, void *comm, void *stream, bool send, void *buf, uint64_t n,
                    int peer_rank, char *err, size_t errlen);
    int (*mark)(wk_device *d, void *stream, void **mark, char *err, size_t errlen);
    int (*mark_query)(wk_device *d, void *mark);
    void (*mark_free)(wk_device *d, void *mark);
    int (*mark_wait)(wk_device *d, void *stream, void *mark, char *err, size_t errlen);
    int (*mark_sync)(wk_device *d, void *mark, char *err, size_t errlen);
} wk_device_ops;

struct wk_device {
    const wk_device_ops *ops;
    wk_space space;
    int ordinal;                 /* CUDA device; -1 on the host */
    wk_segment seg;              /* host: the shm segment */
    uint8_t *base;               /* the pool (device pointer on CUDA); owned */
    uint64_t size;               /* bytes */
    uint8_t ipc[64];             /* CUDA: cudaIpcMemHandle_t of base */
    size_t ipc_len;
    char describe[300];
    atomic_bool cuda_copies;     /* a peer's CUDA pool is open here: copy through CUDA */
    atomic_uint_fast64_t staged; /* bytes staged (wk_device_count_staged) */
};

static int parse_device(const char *device, int *ordinal)
{
    if (device && strcmp(device, "cpu") == 0) {
        *ordinal = -1;
        return 0;
    }
    char *end;
    if (!device || strncmp(device, "cuda:", 5) != 0 || device[5] < '0' || device[5] > '9')
        return BT_EINVAL;
    long n = strtol(device + 5, &end, 10);
    if (*end || n < 0 || n > 1023)
        return BT_EINVAL;
    *ordinal = (int)n;
    return 0;
}

/* --- host ------------------------------------------------------------------ */

static int host_pool_open(wk_device *d, const char *run_id, const char *worker, uint64_t bytes,
                          char *err, size_t errlen)
{
    if (wk_segment_create(&d->seg, run_id, worker, bytes, err, errlen) != 0)
        return BT_EIO;
    d->base = d->seg.base;
    d->size = d->seg.size;
    snprintf(d->describe, sizeof(d->describe), "shm %s", d->seg.name);
    return 0;
}

static void host_pool_close(wk_device *d)
{
    wk_segment_destroy(&d->seg);
    d->base = NULL;
}

static int host_stream_create(wk_device *d, void **out, char *err, size_t errlen)
{
    (void)d, (void)err, (void)errlen;
    *out = NULL;
    return 0;
}

static void host_stream_destroy(wk_device *d, void *stream)
{
    (void)d, (void)stream;
}

#ifdef BATON_CUDA
static int cuda_fail(cudaError_t e, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return BT_EIO;
}
#endif

static int host_copy_async(wk_device *d, void *stream, void *dst, const void *src, uint64_t n,
                           char *err, size_t errlen)
{
    (void)stream;
#ifdef BATON_CUDA
    /* A peer's device memory is open here: the runtime tells host from
     * device pointers (unified addressing) and copies either way. */
    if (atomic_load(&d->cuda_copies)) {
        cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
        return e ? cuda_fail(e, "cudaMemcpy", err, errlen) : 0;
    }
#else
    (void)d, (void)err, (void)errlen;
#endif
    if (n)
        memcpy(dst, src, n);
    return 0;
}

static int host_sync(wk_device *d, void *stream, char *err, size_t errlen)
{
    (void)d, (void)stream, (void)err, (void)errlen;
    return 0;
}

static int host_lost(wk_device *d, char *err, size_t errlen)
{
    (void)d, (void)err, (void)errlen;
    return 0;
}

/* Cross-host transfers of a CPU worker go over its peer socket, never over
 * NCCL: the conductor only asks GPU workers for these. */
static int host_pair_join(wk_device *d, void **comm, const void *id, size_t len, int rank,
                          char *err, size_t errlen)
{
    (void)d, (void)id, (void)len, (void)rank;
    *comm = NULL;
    snprintf(err, errlen, "a CPU worker has no NCCL communicator");
    return BT_EINVAL;
}

static int host_pair_ready(wk_device *d, void *comm)
{
    (void)d, (void)comm;
    return BT_EINVAL;
}

static int host_pair_p2p(wk_device *d, void *comm, void *stream, bool send, void *buf,
                         uint64_t n, int peer_rank, char *err, size_t errlen)
{
    (void)d, (void)comm, (void)stream, (void)send, (void)buf, (void)n, (void)peer_rank;
    snprintf(err, errlen, "a CPU worker has no NCCL communicator");
    return BT_EINVAL;
}

static int host_mark(wk_device *d, void *stream, void **mark, char *err, size_t errlen)
{
    (void)d, (void)stream, (void)err, (void)errlen;
    *mark = NULL; /* host work is done when queued */
    return 0;
}

static int host_mark_query(wk_device *d, void *mark)
{
    (void)d, (void)mark;
    return 1;
}

static void host_mark_free(wk_device *d, void *mark)
{
    (void)d, (void)mark;
}

/* A host device's marks are NULL, always reached: its copies are done
 * when they return. */
static int host_mark_wait(wk_device *d, void *stream, void *mark, char *err, size_t errlen)
{
    (void)d, (void)stream, (void)mark, (void)err, (void)errlen;
    return 0;
}

static int host_mark_sync(wk_device *d, void *mark, char *err, size_t errlen)
{
    (void)d, (void)mark, (void)err, (void)errlen;
    return 0;
}

static const wk_device_ops host_ops = {host_pool_open,   host_pool_close, host_stream_create,
                                       host_stream_destroy, host_copy_async, host_sync,
                                       host_lost,        host_pair_join,  host_pair_ready,
                                       host_pair_p2p,
                                       host_mark,        host_mark_query, host_mark_free,
                                       host_mark_wait,   host_mark_sync};

/* --- CUDA ------------------------------------------------------------------ */

#ifdef BATON_CUDA
static int cuda_pool_open(wk_device *d, const char *run_id, const char *worker, uint64_t bytes,
                          char *err, size_t errlen)
{
    (void)run_id, (void)worker;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e)
        return cuda_fail(e, "cudaGetDeviceCount", err, errlen);
    if (d->ordinal >= n) {
        snprintf(err, errlen, "device cuda:%d does not exist (this host has %d GPU%s)",
                 d->ordinal, n, n == 1 ? "" : "s");
        return BT_EINVAL;
    }
    if ((e = cudaSetDevice(d->ordinal)))
        return cuda_fail(e, "cudaSetDevice", err, errlen);
    void *p = NULL;
    if ((e = cudaMalloc(&p, bytes))) {
        cudaGetLastError();
        snprintf(err, errlen, "cudaMalloc of the %llu-byte pool on cuda:%d: %s",
                 (unsigned long long)bytes, d->ordinal, cudaGetErrorString(e));
        return BT_ENOMEM;
    }
    cudaIpcMemHandle_t h;
    if ((e = cudaIpcGetMemHandle(&h, p))) {
        cudaFree(p);
        return cuda_fail(e, "cudaIpcGetMemHandle", err, errlen);
    }
    _Static_assert(sizeof(h) <= sizeof(d->ipc), "IPC handle larger than its slot");
    memcpy(d->ipc, &h, sizeof(h));
    d->ipc_len = sizeof(h);
    d->base = p;
    d->size = bytes;
    snprintf(d->describe, sizeof(d->describe), "cuda:%d slab exported by IPC", d->ordinal);
    return 0;
}

static void cuda_pool_close(wk_device *d)
{
    if (d->base) {
        cudaSetDevice(d->ordinal);
        cudaFree(d->base);
    }
    d->base = NULL;
}

static int cuda_stream_create(wk_device *d, void **out, char *err, size_t errlen)
{
    cudaStream_t s = NULL;
    cudaError_t e = cudaSetDevice(d->ordinal);
    if (!e)
        e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e)
        return cuda_fail(e, "cudaStreamCreate", err, errlen);
    *out = s;
    return 0;
}

static void cuda_stream_destroy(wk_device *d, void *stream)
{
    (void)d;
    if (stream)
        cudaStreamDestroy((cudaStream_t)stream);
}

static int cuda_copy_async(wk_device *d, void *stream, void *dst, const void *src, uint64_t n,
                           char *err, size_t errlen)
{
    if (!n)
        return 0;
    cudaSetDevice(d->ordinal);
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, (cudaStream_t)stream);
    return e ? cuda_fail(e, "cudaMemcpyAsync", err, errlen) : 0;
}

static int cuda_sync(wk_device *d, void *stream, char *err, size_t errlen)
{
    cudaSetDevice(d->ordinal);
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    return e ? cuda_fail(e, "cudaStreamSynchronize", err, errlen) : 0;
}

static int cuda_lost(wk_device *d, char *err, size_t errlen)
{
    cudaSetDevice(d->ordinal);
    /* A sticky error survives being read: CUDA returns it again from
     * every later call, where an ordinary one is cleared by the first
     * cudaGetLastError. */
    cudaGetLastError();
    cudaError_t e = cudaGetLastError();
    if (!e)
        return 0;
    snprintf(err, errlen, "cuda:%d context is unusable: %s (%s)", d->ordinal,
             cudaGetErrorString(e), cudaGetErrorName(e));
    return 1;
}

static int cuda_pair_join(wk_device *d, void **comm, const void *id, size_t len, int rank,
                          char *err, size_t errlen)
{
    int rc = bk_comm_pair_join(comm, d->ordinal, id, len, rank, err, errlen);
    wk_device_bind_thread(d);
    return rc;
}

static int cuda_pair_ready(wk_device *d, void *comm)
{
    (void)d;
    return bk_comm_pair_ready(comm);
}

static int cuda_pair_p2p(wk_device *d, void *comm, void *stream, bool send, void *buf,
                         uint64_t n, int peer_rank, char *err, size_t errlen)
{
    cudaSetDevice(d->ordinal);
    return bk_comm_pair_p2p(comm, send, buf, n, peer_rank, stream, err, errlen);
}

static int cuda_mark(wk_device *d, void *stream, void **mark, char *err, size_t errlen)
{
    cudaEvent_t e = NULL;
    cudaSetDevice(d->ordinal);
    cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (!r && (r = cudaEventRecord(e, (cudaStream_t)stream)))
        cudaEventDestroy(e);
    if (r)
        return cuda_fail(r, "cudaEventRecord", err, errlen);
    *mark = e;
    return 0;
}

static int cuda_mark_query(wk_device *d, void *mark)
{
    (void)d;
    cudaError_t r = cudaEventQuery((cudaEvent_t)mark);
    if (r == cudaSuccess)
        return 1;
    if (r == cudaErrorNotReady)
        return 0;
    cudaGetLastError();
    return BT_EIO;
}

static void cuda_mark_free(wk_device *d, void *mark)
{
    (void)d;
    if (mark)
        cudaEventDestroy((cudaEvent_t)mark);
}

static int cuda_mark_wait(wk_device *d, void *stream, void *mark, char *err, size_t errlen)
{
    if (!mark)
        return 0;
    cudaSetDevice(d->ordinal);
    cudaError_t r = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)mark, 0);
    return r ? cuda_fail(r, "cudaStreamWaitEvent", err, errlen) : 0;
}

static int cuda_mark_sync(wk_device *d, void *mark, char *err, size_t errlen)
{
    if (!mark)
        return 0;
    cudaSetDevice(d->ordinal);
    cudaError_t r = cudaEventSynchronize((cudaEvent_t)mark);
    return r ? cuda_fail(r, "cudaEventSynchronize", err, errlen) : 0;
}

static const wk_device_ops cuda_ops = {cuda_pool_open,   cuda_pool_close, cuda_stream_create,
                                       cuda_stream_destroy, cuda_copy_async, cuda_sync,
                                       cuda_lost,        cuda_pair_join,  cuda_pair_ready,
                                       cuda_pair_p2p,
                                       cuda_mark,        cuda_mark_query, cuda_mark_free,
                                       cuda_mark_wait,   cuda_mark_sync};
#endif

/* --- the interface ---------------------------------------------------------- */

int wk_device_supported(const char *device, char *why, size_t len)
{
    int ordinal;
    if (parse_device(device, &ordinal) != 0) {
        snprintf(why, len, "device '%s' is neither 'cpu' nor 'cuda:N'", device ? device : "");
        return 0;
    }
#ifndef BATON_CUDA
    if (ordinal >= 0) {
        snprintf(why, len, "this baton-worker was built without CUDA (CPU devices only); "
                 "build it where nvcc is installed, or the emulated flavour (make emu)");
        return 0;
    }
#endif
    return 1;
}

int wk_device_open(wk_device **out, const char *device, const char *run_id, const char *worker,
                   uint64_t bytes, char *err, size_t errlen)
{
    *out = NULL;
    int ordinal;
    if (!wk_device_supported(device, err, errlen) || parse_device(device, &ordinal) != 0)
        return BT_EINVAL;
    wk_device *d = calloc(1, sizeof(*d));
    if (!d) {
        snprintf(err, errlen, "out of memory");
        return BT_ENOMEM;
    }
    d->ordinal = ordinal;
    d->space = ordinal >= 0 ? WK_SPACE_CUDA : WK_SPACE_HOST;
    d->ops = &host_ops;
#ifdef BATON_CUDA
    if (ordinal >= 0)
        d->ops = &cuda_ops;
#endif
    atomic_init(&d->cuda_copies, false);
    atomic_init(&d->staged, 0);
    int rc = d->ops->pool_open(d, run_id, worker, bytes, err, errlen);
    if (rc) {
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void wk_device_close(wk_device *d)
{
    if (!d)
        return;
    d->ops->pool_close(d);
    free(d);
}

wk_space wk_device_space(const wk_device *d)
{
    return d->space;
}

int wk_device_ordinal(const wk_device *d)
{
    return d->ordinal;
}

uint8_t *wk_device_pool_base(const wk_device *d)
{
    return d->base;
}

uint64_t wk_device_pool_size(const wk_device *d)
{
    return d->size;
}

const char *wk_device_pool_describe(const wk_device *d)
{
    return d->describe;
}

void wk_device_pool_handle(const wk_device *d, Baton__V1__PoolHandle *ph)
{
    ph->pool = 0;
    ph->pool_bytes = d->size;
    if (d->space == WK_SPACE_HOST) {
        ph->kind = BATON__V1__POOL_KIND__POOL_KIND_SHM;
        ph->shm_name = (char *)d->seg.name;
        ph->cuda_device = -1;
    } else {
        ph->kind = BATON__V1__POOL_KIND__POOL_KIND_CUDA_IPC;
        ph->cuda_ipc_handle.data = (uint8_t *)d->ipc;
        ph->cuda_ipc_handle.len = d->ipc_len;
        ph->cuda_device = d->ordinal;
    }
}

int wk_device_stream_create(wk_device *d, void **out, char *err, size_t errlen)
{
    return d->ops->stream_create(d, out, err, errlen);
}

void wk_device_stream_destroy(wk_device *d, void *stream)
{
    d->ops->stream_destroy(d, stream);
}

void wk_device_bind_thread(wk_device *d)
{
#ifdef BATON_CUDA
    if (d->ordinal >= 0)
        cudaSetDevice(d->ordinal);
#else
    (void)d;
#endif
}

int wk_device_copy_async(wk_device *d, void *stream, void *dst, const void *src, uint64_t n,
                         char *err, size_t errlen)
{
    return d->ops->copy_async(d, stream, dst, src, n, err, errlen);
}

int wk_device_sync(wk_device *d, void *stream, char *err, size_t errlen)
{
    return d->ops->sync(d, stream, err, errlen);
}

int wk_device_copy(wk_device *d, void *stream, void *dst, const void *src, uint64_t n, char *err,
                   size_t errlen)
{
    int rc = wk_device_copy_async(d, stream, dst, src, n, err, errlen);
    return rc ? rc : wk_device_sync(d, stream, err, errlen);
}

int wk_device_lost(wk_device *d, char *err, size_t errlen)
{
    return d->ops->lost(d, err, errlen);
}

void wk_device_exit_if_lost(wk_device *d, const char *model)
{
    char why[384];
    if (!wk_device_lost(d, why, sizeof(why)))
        return;
    bt_error("model %s: %s; exiting so that the worker is restarted", model, why);
    _exit(WK_EXIT_DEVICE_LOST);
}

int wk_device_ipc_open(wk_device *d, int cuda_device, const void *handle, size_t len,
                       void **base, char *err, size_t errlen)
{
#ifdef BATON_CUDA
    cudaIpcMemHandle_t h;
    if (len != sizeof(h)) {
        snprintf(err, errlen, "CUDA IPC handle of %zu bytes (want %zu)", len, sizeof(h));
        return BT_EINVAL;
    }
    memcpy(&h, handle, sizeof(h));
    cudaError_t e = cudaSetDevice(cuda_device);
    if (!e)
        e = cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess);
    if (e) {
        cudaGetLastError();
        wk_device_bind_thread(d);
        return cuda_fail(e, "cudaIpcOpenMemHandle", err, errlen);
    }
    atomic_store(&d->cuda_copies, true);
    wk_device_bind_thread(d);
    return 0;
#else
    (void)d, (void)cuda_device, (void)handle, (void)len, (void)base;
    snprintf(err, errlen, "the pool is GPU memory and this baton-worker was built without CUDA");
    return BT_EINVAL;
#endif
}

void wk_device_ipc_close(wk_device *d, int cuda_device, void *base)
{
#ifdef BATON_CUDA
    cudaSetDevice(cuda_device);
    cudaError_t e = cudaIpcCloseMemHandle(base);
    if (e) {
        cudaGetLastError();
        bt_warn("cudaIpcCloseMemHandle: %s", cudaGetErrorString(e));
    }
    wk_device_bind_thread(d);
#else
    (void)d, (void)cuda_device, (void)base;
#endif
}

int wk_device_pair_join(wk_device *d, void **comm, const void *id, size_t len, int rank,
                        char *err, size_t errlen)
{
    return d->ops->pair_join(d, comm, id, len, rank, err, errlen);
}

int wk_device_pair_ready(wk_device *d, void *comm)
{
    return d->ops->pair_ready(d, comm);
}

void wk_device_pair_close(wk_device *d, void *comm, bool abort)
{
    (void)d;
    bk_comm_pair_close(comm, abort);
}

bool wk_device_pair_failed(wk_device *d, void *comm)
{
    (void)d;
    return bk_comm_pair_failed(comm) != 0;
}

int wk_device_pair_p2p(wk_device *d, void *comm, void *stream, bool send, void *buf, uint64_t n,
                       int peer_rank, char *err, size_t errlen)
{
    return d->ops->pair_p2p(d, comm, stream, send, buf, n, peer_rank, err, errlen);
}

int wk_device_mark(wk_device *d, void *stream, void **mark, char *err, size_t errlen)
{
    return d->ops->mark(d, stream, mark, err, errlen);
}

int wk_device_mark_query(wk_device *d, void *mark)
{
    return d->ops->mark_query(d, mark);
}

void wk_device_mark_free(wk_device *d, void *mark)
{
    d->ops->mark_free(d, mark);
}

int wk_device_mark_wait(wk_device *d, void *stream, void *mark, char *err, size_t errlen)
{
    return d->ops->mark_wait(d, stream, mark, err, errlen);
}

int wk_device_mark_sync(wk_device *d, void *mark, char *err, size_t errlen)
{
    return d->ops->mark_sync(d, mark, err, errlen);
}

uint64_t wk_device_staged_bytes(const wk_device *d)
{
    return atomic_load(&((wk_device *)d)->staged);
}

void wk_device_count_staged(wk_device *d, uint64_t n)
{
    atomic_fetch_add(&d->staged, n);
}
