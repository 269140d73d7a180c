/* Executable graphs: an op graph compiled for a device into something
 * that runs.
 *
 *   kx_compile      plan the arena, cost and schedule the ops, start streams
 *   kx_param_set    set a parameter (weights) by name, typed
 *   kx_handle       persistent state (a KV cache) that outlives runs
 *   kx_input_bind   bind an input by slot (the caller's memory, not copied)
 *   kx_extent_set   run a bucketed executable at an actual extent
 *   kx_commit/sync  run asynchronously, then wait; kx_run does both
 *   kx_output       read an output in the arena, without a copy
 *
 * Devices (kx_device, a struct of function pointers over an opaque state):
 *   - the CPU device runs each stream as a thread, and an event (record/wait
 *     at a cross-stream edge) is a generation number under one mutex and
 *     condition variable;
 *   - a queued device (CUDA, kernels/cuda/device.cu) has real streams and
 *     events: the caller's thread enqueues every op in dispatch order onto
 *     the stream the schedule chose, with event record/wait at cross-stream
 *     edges only, and may capture that enqueued work once per extent as a
 *     graph and replay it (kx_options.graphs).  Inputs are copied into
 *     buffers the executable owns before the ops (or the graph) run, so the
 *     captured kernels always read the same addresses.
 * Ops run through a table of function pointers indexed by kop, which the
 * kernels fill (kernels/optable.h; tests fill their own), so this module
 * knows no kernel. */
#ifndef BATON_KERNELS_EXEC_H
#define BATON_KERNELS_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/graph.h"
#include "kernels/sched.h"

/* What an op implementation sees. */
typedef struct kx_op_ctx {
    const kg_graph *g;           /* the executable's copy of the graph */
    size_t op_id;
    const kg_op *op;
    void *in[KG_MAX_IO];         /* the inputs' memory, in op->in order */
    void *out[KG_MAX_IO];        /* the outputs' memory, in op->out order */
    int64_t extent;              /* actual extent of dynamic dims this run */
    int64_t upper;               /* the extent compiled for (0: none dynamic) */
    int stream;                  /* the stream running it */
    void *user;                  /* kx_op_table.user */
    void *queue;                 /* queued device: the native stream to launch on */
    int32_t *flag;               /* queued device: a device word an op sets to a
                                    positive errno when its data is bad (a position past
                                    the cache); the run then fails with BT_EOP */
} kx_op_ctx;

/* Runs one op; returns 0 or a negative status. */
typedef int (*kx_op_fn)(const kx_op_ctx *c);

typedef struct kx_op_table {
    kx_op_fn fn[KOP_COUNT];      /* NULL: that op is not available */
    void *user;                  /* handed to every op */
} kx_op_table;

/* A device.  Every slot takes DEV, the device's own state.  Memory is in
 * one address space with the host's pointers (CUDA unified addressing), so
 * COPY needs no direction. */
typedef struct kx_device {
    const char *name;            /* "cpu", "cuda" */
    bool queued;                 /* false: streams are host threads running ops */
    void *dev;                   /* the device's state, handed to every slot */
    int (*alloc)(void *dev, size_t bytes, void **out);  /* zeroed; 0 or -errno */
    void (*free)(void *dev, void *p);                   /* NULL is a no-op */
    /* Copies BYTES; asynchronous on QUEUE when it is not NULL, else done
     * when it returns, for the host and for every queue. */
    int (*copy)(void *dev, void *dst, const void *src, size_t bytes, void *queue);
    /* Queued devices only (NULL on the CPU): */
    int (*queue_create)(void *dev, void **q);
    void (*queue_destroy)(void *dev, void *q);
    int (*event_create)(void *dev, void **e);
    void (*event_destroy)(void *dev, void *e);
    int (*event_record)(void *dev, void *e, void *q);
    int (*queue_wait)(void *dev, void *q, void *e);
    int (*queue_sync)(void *dev, void *q);
    /* Graph capture of work enqueued on Q and the queues it forks to; NULL
     * when the device has none. */
    int (*capture_begin)(void *dev, void *q);
    int (*capture_end)(void *dev, void *q, void **graph);  /* *GRAPH NULL on error */
    int (*graph_launch)(void *dev, void *graph, void *q);
    void (*graph_destroy)(void *dev, void *graph);
    /* Whether P is memory of this device; NULL: all memory is (the CPU). */
    bool (*owns)(void *dev, const void *p);
} kx_device;

/* The CPU device (static; never freed). */
const kx_device *kx_device_cpu(void);

/* The CUDA device of ORDINAL (kernels/cuda/device.cu, only in builds with
 * BATON_CUDA; static, never freed), or NULL when there is no such GPU.
 * Call it first from one thread: the table is filled on first use. */
const kx_device *kx_device_cuda(int ordinal);

typedef struct kx_options {
    const ks_profile *profile;   /* NULL: ks_profile_builtin("cpu") */
    const double *cost_s;        /* per op, seconds; NULL: from the profile */
    int n_compute;               /* compute streams; 0: 1 */
    int n_comm;                  /* comm streams (0 or 1) */
    bool force_serial;           /* one stream, graph order */
    const kx_device *device;     /* NULL: kx_device_cpu() */
    bool graphs;                 /* queued device: capture once per extent, replay */
} kx_options;

typedef struct kx_exec kx_exec;

/* Compiles G (copied: the caller may destroy it after) with OPS (copied).
 * Every non-dynamic value keeps its shape; dynamic values are planned at
 * their compiled (upper) extent.  Returns 0 or a status; *OUT NULL on error. */
int kx_compile(const kg_graph *g, const kx_op_table *ops, const kx_options *opt, kx_exec **out);

/* Syncs a pending run, stops the stream threads, frees everything.  NULL is
 * a no-op. */
void kx_destroy(kx_exec *x);

/* Copies BYTES of DATA into parameter NAME, whose dtype must be DT and size
 * BYTES. */
int kx_param_set(kx_exec *x, const char *name, kdtype dt, const void *data, size_t bytes);

/* Makes parameter NAME read DATA in place, without a copy: DATA must stay
 * valid and unchanged until kx_destroy (or a later kx_param_set).  This is
 * how several executables of one model share one copy of the weights: a
 * mapped file on the CPU, one upload to device memory on a GPU.  DATA must
 * be memory of the executable's device (BT_EINVAL otherwise: a GPU kernel
 * cannot read host memory). */
int kx_param_borrow(kx_exec *x, const char *name, kdtype dt, const void *data, size_t bytes);

/* The memory of persistent handle NAME (zeroed at compile; kept across
 * runs), its size in *BYTES; NULL if there is none.  Read or write it only
 * while no run is pending; on a queued device it is device memory. */
void *kx_handle(kx_exec *x, const char *name, size_t *bytes);

/* Makes persistent handle NAME live in DATA (BYTES, its size) instead of
 * its own memory, which is freed: DATA must stay valid until kx_destroy or
 * the next borrow, and is not freed by the executable.  May be called
 * again between runs to move the handle, e.g. a prefill executable's KV
 * cache onto the decode slot its session will decode in, so the prefill
 * writes where the decode reads and nothing is copied.  On a queued device
 * DATA is device memory, and an executable that captures graphs must not
 * have its handles moved after the first capture.  Returns 0, BT_ENOENT (no
 * such handle), BT_ETYPE (size), BT_EINVAL (not the device's memory) or
 * BT_EBUSY (a run is pending). */
int kx_handle_borrow(kx_exec *x, const char *name, void *data, size_t bytes);

/* Binds input slot SLOT to DATA (BYTES long, at least the slot's size at the
 * current extent); the memory must stay valid until the run is synced. */
int kx_input_bind(kx_exec *x, int slot, const void *data, size_t bytes);

/* Sets the actual extent of the dynamic dims, 1..upper (0: upper). */
int kx_extent_set(kx_exec *x, int64_t extent);
int64_t kx_extent_upper(const kx_exec *x);

/* Starts a run on the streams and returns; kx_sync waits for it and returns
 * 0 or the first op's error (BT_EOP).  kx_run = commit + sync. */
int kx_commit(kx_exec *x);
int kx_sync(kx_exec *x);
int kx_run(kx_exec *x);

/* Output INDEX in the arena (valid until the next commit), its bytes at the
 * current extent in *BYTES; NULL if out of range.  Device memory on a queued
 * device. */
const void *kx_output(const kx_exec *x, int index, size_t *bytes);

/* After a run that failed with BT_EOP: the first failing op's id and the
 * status it returned (a negative errno from the op tables; 0 when the run
 * did not fail).  Returns -1 when no op failed, or when a queued device's
 * op flagged bad data and which one is not known. */
int kx_op_error(const kx_exec *x, int *status);

/* The arena, its size, and its peak-live lower bound. */
const void *kx_arena(const kx_exec *x);
size_t kx_arena_size(const kx_exec *x);
size_t kx_arena_lower_bound(const kx_exec *x);

/* The schedule in use (for tests and reports). */
const ks_schedule *kx_schedule(const kx_exec *x);

/* Graphs captured so far (one per extent run on a queued device with
 * kx_options.graphs), and runs that replayed one. */
int kx_graph_count(const kx_exec *x);
uint64_t kx_graph_replays(const kx_exec *x);

/* The compile report: schedule decision and streams, arena against bound. */
const char *kx_report(const kx_exec *x);


#endif
