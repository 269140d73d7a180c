/* Executable graphs (DESIGN.md section 8; the interface of seed 002 in C):
 * an op graph compiled for a device into something that runs.
 *
 *   kx_compile      plan the arena, cost and schedule the ops, start streams
 *   kx_param_set    set a parameter (weights) by name, typed
 *   kx_handle       persistent state (a KV cache) that outlives runs
 *   kx_input_bind   bind an input by slot (the caller's memory, not copied)
 *   kx_extent_set   run a bucketed executable at an actual extent
 *   kx_commit/sync  run asynchronously, then wait; kx_run does both
 *   kx_output       read an output in the arena, without a copy
 *
 * Devices: this version has the CPU device, where each stream is a thread
 * and an event (record/wait at a cross-stream edge) is a generation number
 * under one mutex and condition variable.  Ops run through a table of
 * function pointers indexed by kop, which the kernels fill (and tests fill
 * with their own ops), so this module knows no kernel. */
#ifndef BATON_KERNELS_EXEC_H
#define BATON_KERNELS_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/graph.h"
#include "kernels/sched.h"

/* Status codes, beside graph.h's KG_E*. */
enum {
    KX_ENOOP = -20,     /* no function in the op table for an op of the graph */
    KX_ENOTFOUND = -21, /* no parameter, handle or slot of that name / index */
    KX_ETYPE = -22,     /* dtype or byte size differs from the value's */
    KX_EUNBOUND = -23,  /* an input slot or parameter was never set */
    KX_EBUSY = -24,     /* a commit is pending: sync first */
    KX_ETHREAD = -25,   /* a stream thread could not start */
    KX_EOP = -26        /* an op returned an error (see kx_op_error) */
};

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
} kx_op_ctx;

/* Runs one op; returns 0 or a negative status. */
typedef int (*kx_op_fn)(const kx_op_ctx *c);

typedef struct kx_op_table {
    kx_op_fn fn[KOP_COUNT];      /* NULL: that op is not available */
    void *user;                  /* handed to every op */
} kx_op_table;

typedef struct kx_options {
    const ks_profile *profile;   /* NULL: ks_profile_builtin("cpu") */
    const double *cost_s;        /* per op, seconds; NULL: from the profile */
    int n_compute;               /* compute streams; 0: 1 */
    int n_comm;                  /* comm streams (0 or 1) */
    bool force_serial;           /* one stream, graph order */
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

/* The memory of persistent handle NAME (zeroed at compile; kept across
 * runs), its size in *BYTES; NULL if there is none.  Read or write it only
 * while no run is pending. */
void *kx_handle(kx_exec *x, const char *name, size_t *bytes);

/* Binds input slot SLOT to DATA (BYTES long, at least the slot's size at the
 * current extent); the memory must stay valid until the run is synced. */
int kx_input_bind(kx_exec *x, int slot, const void *data, size_t bytes);

/* Sets the actual extent of the dynamic dims, 1..upper (0: upper). */
int kx_extent_set(kx_exec *x, int64_t extent);
int64_t kx_extent_upper(const kx_exec *x);

/* Starts a run on the streams and returns; kx_sync waits for it and returns
 * 0 or the first op's error (KX_EOP).  kx_run = commit + sync. */
int kx_commit(kx_exec *x);
int kx_sync(kx_exec *x);
int kx_run(kx_exec *x);

/* Output INDEX in the arena (valid until the next commit), its bytes at the
 * current extent in *BYTES; NULL if out of range. */
const void *kx_output(const kx_exec *x, int index, size_t *bytes);

/* After a run that failed with KX_EOP: the first failing op's id and the
 * status it returned (a negative errno from the op tables).  Returns -1
 * when the last run had no failing op. */
int kx_op_error(const kx_exec *x, int *status);

/* The arena, its size, and its peak-live lower bound. */
const void *kx_arena(const kx_exec *x);
size_t kx_arena_size(const kx_exec *x);
size_t kx_arena_lower_bound(const kx_exec *x);

/* The schedule in use (for tests and reports). */
const ks_schedule *kx_schedule(const kx_exec *x);

/* The compile report: schedule decision and streams, arena against bound. */
const char *kx_report(const kx_exec *x);

const char *kx_strerror(int status);

#endif
