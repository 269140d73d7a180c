/* Resolving a dispatched item's inputs before it runs: each chunk
 * reference is pinned where it lies (a tensor of the own pool by id, or an
 * offset into a peer's pool opened here), and an input made of several
 * pieces gets a joined tensor in the own pool, whose copy runs after the
 * lock is dropped.  A single piece is handed to the backend in place, zero
 * copy, when the backend can read the memory it lies in: a CPU worker
 * reads host memory, a GPU worker its own GPU's memory.  Otherwise (an
 * edge between a CPU and a GPU worker, or between two GPUs) the piece is
 * staged into the own pool like a join of one, a host<->device copy. */
#ifndef BATON_WORKER_INPUTS_H
#define BATON_WORKER_INPUTS_H

#include "worker/device.h"
#include "worker/item.h"
#include "worker/peers.h"
#include "worker/store.h"

/* What input resolution reads; every pointer borrowed. */
typedef struct wk_inputs_env {
    wk_store *store;
    wk_peers *peers;
    wk_device *dev;
    const char *worker;           /* this worker's name, for messages */
} wk_inputs_env;

/* The copies of the joins (and stagings) of a batch, to run once the lock
 * is dropped. */
typedef struct wk_join_job wk_join_job;

/* Allocates IT's input and output tables and resolves every input; joins
 * to copy are appended to *JOBS.  On failure the item is failed with a
 * status naming the node and input.  [L] */
void wk_inputs_prepare(const wk_inputs_env *env, wk_item *it, wk_join_job **jobs);
/* Copies and frees the joins on STREAM, the calling lane's, and waits for
 * them; a failed copy fails its item.  Runs without the lock. */
void wk_inputs_run_joins(const wk_inputs_env *env, wk_join_job *jobs, void *stream);

#endif
