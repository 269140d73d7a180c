/* The baton_ctx a backend calls back into during execute(): allocation in
 * the pool, outputs (by value or by reference), stream chunks, finish,
 * errors, cancellation and sleeps.
 *
 * Everything a backend hands back is one of the item's *slots*: a tensor
 * the item reads (an input) or made (alloc, join).  A baton_tensor's handle
 * is its slot index + 1, which is how set_output tells "the input itself"
 * (a pass-through by reference) from a new tensor.
 *
 * A chunk is reported at once, through the env's chunk hook, which the
 * worker's top wires to the I/O thread; everything else a backend says
 * stays in the item until its execution ends. */
#ifndef BATON_WORKER_CTX_H
#define BATON_WORKER_CTX_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "baton/backend.h"
#include "worker/device.h"
#include "worker/item.h"
#include "worker/store.h"

/* A chunk an execution emitted on a stream output. */
typedef struct wk_chunk {
    uint32_t output;              /* output index */
    uint32_t index;               /* its number within the output */
    bool final;
    bool has_ref;                 /* false: an empty closing chunk */
    bool created;                 /* the execution made the tensor */
    wk_ref ref;
    void *host;                   /* a copy of its bytes for the Chunk (a small client-bound
                                     tensor in device memory), or NULL; whoever takes the
                                     chunk owns it */
} wk_chunk;

/* What a lane's ctx reaches; every pointer borrowed from the executor. */
typedef struct wk_ctx_env {
    pthread_mutex_t *lock;        /* the worker's lock */
    pthread_cond_t *wake;         /* broadcast under LOCK when an item is cancelled */
    const atomic_bool *stopping;  /* the worker is stopping: everything is cancelled */
    wk_store *store;
    wk_device *dev;
    const char *worker;           /* this worker's name, for messages */
    const char *device;           /* handed to backends as ctx->device */
    uint32_t threads;             /* handed to backends as ctx->threads */
    /* An execution emitted a chunk: called on the lane, with or without
     * the lock (it must not take it); C is valid during the call only.
     * 0, or BT_ENOMEM when the chunk cannot be taken. */
    int (*chunk)(void *arg, wk_item *it, const wk_chunk *c);
    void *arg;
} wk_ctx_env;

/* Binds CTX's callbacks to ENV and the lane's STREAM (NULL on the host). */
void wk_ctx_init(baton_ctx *ctx, const wk_ctx_env *env, void *stream);
/* Whether slot S of an execution is device memory. */
bool wk_ctx_slot_on_device(const wk_ctx_env *env, const wk_slot *s);
/* A host copy of the N bytes of device memory at DATA, made on STREAM
 * (malloc'd), when a client-bound output of that size goes inline; NULL
 * when it does not (too large, empty, host memory) or the copy failed. */
void *wk_ctx_inline_copy(const wk_ctx_env *env, void *stream, const void *data, bool device,
                         uint64_t n, bool client);

#endif
