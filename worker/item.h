/* Items: one (request, node, iteration) to run, made from a Dispatch (or,
 * for a run-ahead iteration, from the Dispatch that opened its window),
 * and what one execution of it reads and makes.
 *
 * A Dispatch message is shared by the items it gives rise to (its
 * run-ahead chain) through a reference-counted wk_dispatch.  An item
 * belongs to its request record (req->items) from creation to
 * destruction; the executor queues and runs it, and the I/O thread frees
 * it once its Done is answered.
 *
 * Everything marked [L] runs under the worker's lock.  The execution
 * scratch (inputs, outputs, slots, results) belongs to the lane running
 * the item, which uses it without the lock until it posts the item's end. */
#ifndef BATON_WORKER_ITEM_H
#define BATON_WORKER_ITEM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "baton/backend.h"
#include "proto/baton.pb-c.h"
#include "worker/peers.h"
#include "worker/store.h"

#define WK_MAX_DEPTH 16               /* iteration vector length accepted */
#define WK_MAX_PORTS 1024             /* inputs or outputs of one node accepted */
#define WK_INLINE_MAX (64u * 1024u)   /* client-bound outputs up to this many bytes go
                                         inline in the Done or Chunk that reports them */

/* A Dispatch shared by the items it gives rise to. */
typedef struct wk_dispatch {
    Baton__V1__ConductorMessage *msg; /* owned (protobuf-c unpacked) */
    const Baton__V1__Dispatch *d;     /* msg->dispatch */
    uint64_t deadline_ns;         /* CLOCK_MONOTONIC, from remaining_ms at arrival; 0: none */
    uint32_t refs;                /* [L] items, chains and parked pulls using it */
    uint64_t *pulled;             /* own tensors holding inputs pulled from another host
                                     (pull.c), released with the dispatch; owned; an id of
                                     0 was handed to the conductor */
    size_t n_pulled;
    wk_store *store;              /* borrowed: releases the pulled tensors */
} wk_dispatch;

/* A tensor one execution reads or made. */
typedef struct wk_slot {
    baton_tensor t;               /* what the backend sees; t.handle = slot index + 1 */
    wk_ref ref;
    wk_tensor *own;               /* own tensor pinned by the item, or NULL */
    wk_mapping *map;              /* peer mapping pinned by the item, or NULL */
    bool created;                 /* made by this execution (join, alloc) */
    bool writable;                /* from alloc: the backend may write it */
    bool chunked;                 /* emitted as a chunk (reported at once) */
} wk_slot;

/* A result of an execution, kept past the execution for the Done. */
typedef struct wk_result {
    bool set;
    bool created;                 /* the worker made it: free it if never reported */
    wk_ref ref;
    const void *data;             /* its element 0 where the backend saw it */
    bool device;                  /* DATA is device memory */
    void *host;                   /* a copy of its bytes made by the lane for the Done (a
                                     small client-bound output in device memory), so that
                                     the I/O thread never reads the device; owned */
} wk_result;

typedef enum wk_item_state { WK_ITEM_QUEUED, WK_ITEM_RUNNING } wk_item_state;

typedef struct wk_item wk_item;
struct wk_item {
    baton_item b;                 /* first: the backend sees it, the ctx casts back */
    wk_dispatch *disp;            /* a reference held */
    wk_request *req;
    struct wk_model *model;       /* executor.c's; loaded for as long as items exist */
    struct wk_queue *queue;       /* executor.c's: where it waits, when queued */
    struct wk_chain *chain;       /* [L] runahead.c's window it belongs to, or NULL
                                     (cleared when the item finishes executing) */
    bool speculative;             /* run ahead by the worker itself */
    uint32_t iter[WK_MAX_DEPTH];
    wk_ref **overrides;           /* per input: a loop-back value replacing it, or NULL */
    wk_item_state state;          /* [L] */
    atomic_bool cancelled;        /* set under [L]; read by lanes without it */
    uint64_t arrive_ns, start_ns, end_ns; /* CLOCK_MONOTONIC */
    uint64_t deadline_ns;         /* 0: none */
    /* Execution scratch, owned by the running lane. */
    baton_input *inputs;
    baton_output *outputs;
    wk_slot **slots;
    size_t n_slots, cap_slots;
    wk_result *results;           /* per output */
    uint32_t *chunk_next;         /* per output: next chunk index */
    bool *stream_closed;          /* per output */
    baton_status status;
    char *message;                /* owned: why it failed */
    bool finish;
    bool defer;                   /* the backend put it back (ctx defer) in this execution */
    bool deferred;                /* [L] queued again after a defer: runs only with room to
                                     spare, once its model changed (defer_epoch) */
    uint64_t defer_epoch;         /* [L] its model's epoch when it was put back */
    uint32_t batch_size;
    uint32_t prompt_tokens;       /* what the backend counted (count_tokens) */
    uint32_t generated_tokens;
    uint32_t cached_tokens;       /* of the prompt's, read from a prefix cache (count_cached) */
    wk_item *prev, *next;         /* [L] in its queue */
    wk_item *req_prev, *req_next; /* [L] in req->items */
};

/* A dispatch holding MSG (a Dispatch, now owned), one reference, its
 * deadline taken from remaining_ms now; NULL when memory is short (MSG is
 * still the caller's). */
wk_dispatch *wk_item_dispatch_new(Baton__V1__ConductorMessage *msg, wk_store *store);
/* Drops a reference; the last one frees the message and releases the
 * pulled copies no output took.  NULL is a no-op.  [L] */
void wk_item_dispatch_unref(wk_dispatch *d);
/* Tensor ID, one of D's pulled copies, was reported to the conductor (a
 * backend passed the input through as an output): the conductor now owns
 * it, and the dispatch no longer releases it.  [L] */
void wk_item_dispatch_claim(wk_dispatch *d, uint64_t id);

/* The item for (DISP, iteration vector ITER of DEPTH) on MODEL, in REQ's
 * list, not queued.  OVERRIDES (per input, may be NULL) are copied.  NULL
 * when memory is short or DEPTH is too deep.  [L] */
wk_item *wk_item_create(wk_dispatch *disp, wk_request *req, struct wk_model *model,
                        const uint32_t *iter, uint32_t depth, wk_ref *const *overrides);
/* Frees an item that is neither queued nor running.  [L] */
void wk_item_destroy(wk_item *it);
/* Frees a table of N optional refs (an item's overrides, a chain's next
 * inputs).  NULL is a no-op. */
void wk_item_refs_free(wk_ref **refs, size_t n);
/* Fails IT with CODE and MESSAGE unless it failed already (the first error
 * explains the rest). */
void wk_item_fail(wk_item *it, baton_status code, const char *msg);
/* A new slot of IT (its handle set), or NULL. */
wk_slot *wk_item_slot_add(wk_item *it);
/* Fills the slot's baton_tensor from its ref, with DATA as element 0. */
void wk_item_slot_view(wk_slot *s, const void *data);

#endif
