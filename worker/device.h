/* The memory a worker computes in: its pool, the copies into and out of
 * it, and the streams those copies run on.
 *
 * A CPU worker ("cpu") keeps its pool in a POSIX shm segment (segment.h) that
 * host code reads and writes directly.  A GPU worker ("cuda:N") keeps it in
 * one cudaMalloc slab, exported once with cudaIpcGetMemHandle when the
 * worker registers; its bytes are reachable only by kernels and CUDA
 * copies.  So every place where the worker itself touches tensor bytes
 * (client inputs, fetches, inline outputs, joins, an edge between a CPU and
 * a GPU worker) goes through wk_device_copy, never through memcpy.
 *
 * Two implementations behind one table of functions: the host one here
 * (device.c) and the CUDA one (device_cuda.c, in builds with BATON_CUDA).
 * A CPU worker of a CUDA build may still read a GPU peer's pool: it opens
 * the peer's IPC handle (wk_device_ipc_open) and from then on its copies
 * go through the CUDA runtime, which tells host from device pointers.
 *
 * Thread safety: every function may be called from any thread; a stream is
 * used by one thread at a time (each lane has its own, the I/O thread its
 * own). */
#ifndef BATON_WORKER_DEVICE_H
#define BATON_WORKER_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/baton.pb-c.h"

typedef enum wk_space {
    WK_SPACE_HOST = 0, /* host memory: memcpy reads it */
    WK_SPACE_CUDA = 1  /* device memory of one GPU */
} wk_space;

typedef struct wk_device wk_device;

/* Nonzero when this build can run workers on DEVICE ("cpu", "cuda:N");
 * otherwise 0 with the reason in WHY. */
int wk_device_supported(const char *device, char *why, size_t len);

/* Opens DEVICE with a pool of BYTES, named (for shm) after RUN_ID and
 * WORKER.  Returns 0, or a negative bt_err with the reason in ERR. */
int wk_device_open(wk_device **out, const char *device, const char *run_id, const char *worker,
                   uint64_t bytes, char *err, size_t errlen);
/* Frees the pool and the device's streams; NULL is a no-op. */
void wk_device_close(wk_device *d);

wk_space wk_device_space(const wk_device *d);
/* The CUDA ordinal, or -1 on the host. */
int wk_device_ordinal(const wk_device *d);
/* The pool: its first byte (a device pointer on CUDA) and its size. */
uint8_t *wk_device_pool_base(const wk_device *d);
uint64_t wk_device_pool_size(const wk_device *d);
/* What peers need to open the pool: fills PH (initialized by the caller);
 * its pointers point into D. */
void wk_device_pool_handle(const wk_device *d, Baton__V1__PoolHandle *ph);
/* A short description for logs ("shm /baton-x-cpu0", "cuda:0 slab"). */
const char *wk_device_pool_describe(const wk_device *d);

/* Creates a stream for the calling thread (NULL on the host: copies there
 * are synchronous).  Also makes the device current on this thread. */
int wk_device_stream_create(wk_device *d, void **out, char *err, size_t errlen);
void wk_device_stream_destroy(wk_device *d, void *stream);
/* Makes D's GPU current on the calling thread (no-op on the host). */
void wk_device_bind_thread(wk_device *d);

/* Queues a copy of N bytes from SRC to DST on STREAM.  Each side may be
 * host memory, the pool, or a peer's pool opened here. */
int wk_device_copy_async(wk_device *d, void *stream, void *dst, const void *src, uint64_t n,
                         char *err, size_t errlen);
/* Waits for everything queued on STREAM; 0, or BT_EIO with ERR. */
int wk_device_sync(wk_device *d, void *stream, char *err, size_t errlen);
/* wk_device_copy_async, then wk_device_sync. */
int wk_device_copy(wk_device *d, void *stream, void *dst, const void *src, uint64_t n, char *err,
                   size_t errlen);
/* Nonzero once the device context is unusable (a sticky CUDA error such
 * as an illegal address in a kernel), with the error in ERR.  Nothing can
 * be done on it any more: the worker exits and is restarted. */
int wk_device_lost(wk_device *d, char *err, size_t errlen);

/* The exit status of a worker whose device context is lost. */
#define WK_EXIT_DEVICE_LOST 3

/* Exits the process (WK_EXIT_DEVICE_LOST) when the device context is
 * unusable after a CUDA error met running model MODEL: nothing queued on
 * it will ever complete and none of its memory can be read, so the worker
 * cannot answer even the items it holds.  The conductor sees it die, ends
 * its requests UNAVAILABLE and starts it again on a fresh context.  An
 * error that is not sticky fails only the batch it hit, and this returns. */
void wk_device_exit_if_lost(wk_device *d, const char *model);

/* Opens a peer's CUDA pool from its IPC HANDLE (LEN bytes) on GPU
 * CUDA_DEVICE, into *BASE.  From then on D's copies go through the CUDA
 * runtime, even on a host device.  0, or a negative bt_err with ERR. */
int wk_device_ipc_open(wk_device *d, int cuda_device, const void *handle, size_t len,
                       void **base, char *err, size_t errlen);
void wk_device_ipc_close(wk_device *d, int cuda_device, void *base);

/* Two-rank NCCL communicators for transfers between GPU workers on
 * different hosts (worker/nccl.c).  Starts joining the one named by ID
 * (LEN bytes) as RANK (0 or 1) on D's GPU and returns at once; BT_EINVAL
 * on a CPU device or a build without CUDA.  wk_device_pair_ready is 1 once
 * the peer has joined, 0 before, a negative bt_err when the join failed;
 * until then COMM may only be polled or closed (aborted). */
int wk_device_pair_join(wk_device *d, void **comm, const void *id, size_t len, int rank,
                        char *err, size_t errlen);
int wk_device_pair_ready(wk_device *d, void *comm);
/* Frees COMM: ABORT when something may still wait on it (that never
 * waits for the peer).  NULL is a no-op. */
void wk_device_pair_close(wk_device *d, void *comm, bool abort);
/* Whether COMM failed asynchronously (its peer aborted it). */
bool wk_device_pair_failed(wk_device *d, void *comm);
/* Queues on STREAM a send (SEND) of the N bytes at BUF to rank PEER_RANK
 * of COMM, or a receive of N bytes into BUF from it. */
int wk_device_pair_p2p(wk_device *d, void *comm, void *stream, bool send, void *buf, uint64_t n,
                       int peer_rank, char *err, size_t errlen);
/* A mark of everything queued so far on STREAM (a CUDA event), polled by
 * wk_device_mark_query: 1 once that work is done, 0 before, a negative
 * bt_err when it failed.  NULL marks (the host) are always done. */
int wk_device_mark(wk_device *d, void *stream, void **mark, char *err, size_t errlen);
int wk_device_mark_query(wk_device *d, void *mark);
void wk_device_mark_free(wk_device *d, void *mark);
/* Makes everything queued on STREAM from now on wait for MARK, without
 * the host waiting (cudaStreamWaitEvent).  0, or BT_EIO with ERR. */
int wk_device_mark_wait(wk_device *d, void *stream, void *mark, char *err, size_t errlen);
/* Waits on the host until MARK is reached.  0, or BT_EIO with ERR. */
int wk_device_mark_sync(wk_device *d, void *mark, char *err, size_t errlen);

/* Bytes the worker copied to stage inputs (joins, and values moved between
 * a CPU and a GPU pool), since it started.  Counted by the callers. */
uint64_t wk_device_staged_bytes(const wk_device *d);
void wk_device_count_staged(wk_device *d, uint64_t n);

#endif
