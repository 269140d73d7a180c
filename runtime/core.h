/* The bottom layer of the runtime: its state, and the operations on that
 * state that know nothing of graph semantics.
 *
 * The runtime is built in layers, each calling only the ones below it:
 *
 *   runtime.c      the public API: events in, validation, the end of an
 *                  event (replays, freeing ended requests, out of memory)
 *   progress.c     completions, chunks, failures, loops, the end of a request
 *   registry.c     delivery of values along edges, readiness, dispatch
 *   speculation.c  run-ahead windows and the events buffered inside them
 *   core.c         this header: the action queue and its arena, tensor
 *                  reference counts, slots, bindings, request memory
 *
 * Nothing outside runtime/ includes this header. */
#ifndef BATON_RUNTIME_CORE_H
#define BATON_RUNTIME_CORE_H

#include <stdlib.h>

#include "common/u64map.h"
#include "runtime/runtime.h"

/* A growable list of tensors.  Every list that stores a tensor holds one
 * reference on it (rtc_ref / rtc_unref), so a tensor is released exactly
 * when the last list that names it lets go. */
typedef struct tvec {
    rt_tensor *t;
    uint32_t n;           /* tensors in T */
    size_t cap;           /* tensors allocated (BT_RESERVE, common/vec.h) */
} tvec;

/* Per-request reference counts, keyed by (worker, id). */
typedef struct tref {
    rt_tensor t;
    uint32_t refs;
    uint8_t used;
} tref;

typedef enum slot_state { SLOT_WAITING = 0, SLOT_RUNNING = 1 } slot_state;

/* One (node, iteration) of a request: the values that arrived for it. */
typedef struct slot {
    rt_iter iter;
    slot_state state;
    bool spec;                 /* running inside a speculation window: no dispatch was sent */
    uint8_t *have;             /* per producer edge (flattened over inputs): delivered */
    tvec *parts;               /* per producer edge: the value's chunks */
    tvec stream;               /* buffered chunks of the stream input, not yet dispatched */
    tvec stream_running;       /* chunks the running dispatch took */
    bool stream_final_seen;    /* the final chunk is buffered (or was taken) */
    bool stream_final_running; /* the running dispatch took the final chunk */
} slot;

typedef enum pend_kind { PEND_DONE = 0, PEND_CHUNK = 1, PEND_FAIL = 2 } pend_kind;

/* An event of a speculative iteration the loop has not reached yet. */
typedef struct pend {
    pend_kind kind;
    rt_iter iter;
    rt_value_out *outs;        /* DONE: owned copy */
    uint32_t n_outs;
    bool finish;               /* DONE */
    rt_usage usage;            /* DONE */
    int value;                 /* CHUNK */
    rt_tensor tensor;          /* CHUNK */
    bool final;                /* CHUNK */
    bt_code code;              /* FAIL */
    char *message;             /* FAIL: owned */
} pend;

typedef struct node_state {
    slot *slots;
    uint32_t n_slots;
    size_t cap_slots;
    bool done_valid;           /* done_iter holds the last iteration that completed */
    rt_iter done_iter;
    /* Speculation window (speculation.c). */
    bool spec_active;
    rt_iter spec_iter;         /* prefix of the window: every index but the innermost */
    uint32_t spec_upto;        /* innermost iteration the worker may run to */
    pend *pend;
    uint32_t n_pend;
    size_t cap_pend;
} node_state;

typedef struct loop_state {
    uint32_t cur;              /* current iteration of the live instance */
    uint32_t max;              /* effective max_iters for this request */
    bool done;                 /* the live instance has ended */
    bool finish;               /* a finish signal was raised in iteration cur */
    uint8_t ended;             /* rt_loop_end of the last instance that ended; 0: none */
} loop_state;

/* The open production of a value: what it has emitted in the current
 * execution of its producer, kept for edges that want it joined. */
typedef struct value_state {
    bool open;
    bool closed;               /* closed_iter's production is complete */
    bool any;                  /* anything (a tensor or a chunk event) arrived */
    rt_iter iter;              /* producer iteration of the open production */
    rt_iter closed_iter;
    tvec parts;                /* chunks so far */
    tvec last;                 /* LOOP_LAST sources: the last complete iteration's parts */
} value_state;

/* A persisted external value, bound in every iteration of the loops it
 * enters for the consumer iteration prefix `key` (length: the edge's common
 * depth). */
typedef struct binding {
    int edge;
    rt_iter key;
    tvec parts;
} binding;

typedef struct out_entry {
    const char *name;
    const char *modality;
    tvec parts;
} out_entry;

typedef struct rt_request {
    uint64_t key;
    const graph *g;
    int graph_index;
    bool stream;
    uint64_t seq;              /* next InferChunk sequence number */
    tvec inputs;               /* graph inputs, in graph input order */
    node_state *nodes;         /* per entity (loops unused) */
    loop_state *loops;         /* per entity (nodes unused) */
    value_state *values;       /* per graph value */
    binding *bindings;
    uint32_t n_bindings;
    size_t cap_bindings;
    out_entry *outs;
    uint32_t n_outs;
    size_t cap_outs;
    tref *tensors;             /* open addressing on (worker, id) */
    uint32_t cap_tensors, n_tensors;
    rt_usage usage;            /* summed over the kept completions */
    bool ended;
} rt_request;

/* Work postponed to the top of the event loop, so that a chain of buffered
 * speculative completions does not recurse. */
typedef struct replay_item {
    uint64_t req;
    int node;
    rt_iter iter;
} replay_item;

typedef struct graph_extra {
    uint8_t *client_values;    /* per value: has an edge to the client */
    uint8_t *joins;            /* per value: some edge or loop takes it joined, so its
                                  open production must keep its chunks */
    uint8_t *uses_worker;      /* per worker: some node of the graph runs there (replicated
                                  nodes aside: a request picks one of their workers) */
    uint32_t *edge_pos;        /* per edge to a node: its index in the consumer's slot arrays */
    uint32_t *n_edge_slots;    /* per entity: producer edges over all its inputs */
} graph_extra;

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    max_align_t data[];
} arena_block;

struct rt_runtime {
    const graph_set *gs;
    rt_options opt;
    graph_extra *gx;           /* per graph */
    u64map requests;
    rt_action *actions;
    size_t n_actions, cap_actions;
    arena_block *arena;        /* payloads of queued actions */
    replay_item *replay;
    size_t n_replay, cap_replay;
    size_t held;               /* tensor references with refs > 0, all requests */
    int lost_worker;           /* while ending requests of a lost worker: skip its releases */
    rt_request **dead;         /* ended requests, freed after the event that ended them */
    size_t n_dead, cap_dead;
    int oom;
};

/* ---- the action queue ------------------------------------------------ */

/* SIZE bytes from the arena of action payloads, freed by rt_actions_clear;
 * NULL (and rt->oom set) when memory runs out. */
void *rtc_alloc(rt_runtime *rt, size_t size);
/* Appends an action of KIND for request R (NULL: no request). */
rt_action *rtc_push(rt_runtime *rt, rt_action_kind kind, const rt_request *r);

/* ---- tensors ------------------------------------------------------------ */

void rtc_ref(rt_runtime *rt, rt_request *r, rt_tensor t);
/* Drops one reference; the last one queues a RELEASE. */
void rtc_unref(rt_runtime *rt, rt_request *r, rt_tensor t);
/* Queues a RELEASE for every tensor R still references, whatever holds it. */
void rtc_release_all(rt_runtime *rt, rt_request *r);
/* Queues RELEASEs, outside any request's counts, for the tensors of an
 * event nobody expects (GRAPH: the request's graph, or -1). */
void rtc_release_stray(rt_runtime *rt, uint64_t req, int graph, const rt_tensor *ts, size_t n);
int tvec_push(rt_runtime *rt, rt_request *r, tvec *v, rt_tensor t);
void tvec_clear(rt_runtime *rt, rt_request *r, tvec *v);

static inline void tvec_free(tvec *v)
{
    free(v->t);
    v->t = NULL;
    v->n = v->cap = 0;
}

/* ---- iteration vectors -------------------------------------------------- */

bool rtc_iter_eq(const rt_iter *a, const rt_iter *b);
/* True when A and B agree on their first N indices. */
bool rtc_prefix_eq(const rt_iter *a, const rt_iter *b, uint32_t n);
/* The iteration ENTITY is at now: the current index of each loop around it. */
void rtc_current_iter(const rt_request *r, int entity, rt_iter *out);

/* ---- slots and bindings ------------------------------------------------- */

slot *rtc_slot_find(rt_request *r, int node, const rt_iter *v);
/* The slot of (NODE, V), made when missing; NULL when out of memory. */
slot *rtc_slot_get(rt_runtime *rt, rt_request *r, int node, const rt_iter *v);
/* Drops a slot and the references it holds. */
void rtc_slot_remove(rt_runtime *rt, rt_request *r, int node, slot *s);
binding *rtc_binding_find(rt_request *r, int edge, const rt_iter *v, uint32_t depth);
binding *rtc_binding_add(rt_runtime *rt, rt_request *r, int edge, const rt_iter *key);

/* ---- requests ----------------------------------------------------------- */

/* A request in its initial state on graph GRAPH (loops capped by MAX_ITERS
 * as rt_request_start says), not yet in rt->requests; NULL when out of
 * memory. */
rt_request *rtc_request_new(rt_runtime *rt, uint64_t key, int graph, bool stream,
                            const uint32_t *max_iters);
/* Frees R's memory; its references must have been released or forgotten. */
void rtc_request_free(rt_runtime *rt, rt_request *r);
/* Takes R out of the live requests; it is freed by rtc_bury, once the event
 * that ended it is over (its caller may still be inside its state). */
void rtc_request_retire(rt_runtime *rt, rt_request *r);
void rtc_bury(rt_runtime *rt);
/* Queues a replay of (NODE, IT) for after the current event. */
void rtc_replay_push(rt_runtime *rt, const rt_request *r, int node, const rt_iter *it);

/* What the runtime derives once per graph (graph_extra); 0 or BT_ENOMEM. */
int rtc_extra_build(rt_runtime *rt);
void rtc_extra_free(rt_runtime *rt);

#endif
