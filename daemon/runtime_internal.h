/* Internal state of the runtime, shared by runtime.c (requests, tensors,
 * actions) and registry.c (slots, delivery, readiness, loops).  Nothing
 * outside daemon/runtime*.c and daemon/registry.c includes this. */
#ifndef BATON_DAEMON_RUNTIME_INTERNAL_H
#define BATON_DAEMON_RUNTIME_INTERNAL_H

#include <stdlib.h>

#include "common/u64map.h"
#include "daemon/runtime.h"

/* A growable list of tensors.  Every list that stores a tensor holds one
 * reference on it (rt__ref / rt__unref), so a tensor is released exactly
 * when the last list that names it lets go. */
typedef struct tvec {
    rt_tensor *t;
    uint32_t n, cap;
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
    /* Speculation window (DESIGN.md section 4.4). */
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
    uint8_t *uses_worker;      /* per worker: some node of the graph runs there */
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

/* runtime.c */
void *rt__alloc(rt_runtime *rt, size_t size);
rt_action *rt__push(rt_runtime *rt, rt_action_kind kind, const rt_request *r);
void rt__ref(rt_runtime *rt, rt_request *r, rt_tensor t);
void rt__unref(rt_runtime *rt, rt_request *r, rt_tensor t);
int tvec_push(rt_runtime *rt, rt_request *r, tvec *v, rt_tensor t);
void tvec_clear(rt_runtime *rt, rt_request *r, tvec *v);
void rt__end(rt_runtime *rt, rt_request *r, bt_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void rt__replay_push(rt_runtime *rt, const rt_request *r, int node, const rt_iter *it);
bool rt__iter_eq(const rt_iter *a, const rt_iter *b);

static inline void tvec_free(tvec *v)
{
    free(v->t);
    v->t = NULL;
    v->n = v->cap = 0;
}

/* registry.c: slots, bindings, delivery, readiness, dispatch */
bool reg_prefix_eq(const rt_iter *a, const rt_iter *b, uint32_t n);
void reg_slot_remove(rt_runtime *rt, rt_request *r, int node, slot *s);
bool reg_in_window(const rt_request *r, int node, const rt_iter *v);
void reg_current_iter(const rt_request *r, int entity, rt_iter *out);
void reg_try_dispatch(rt_runtime *rt, rt_request *r, int node, const rt_iter *v);
void reg_try_dispatch_range(rt_runtime *rt, rt_request *r, int first, int last);
void reg_emit(rt_runtime *rt, rt_request *r, int value, const rt_iter *p, rt_tensor t,
              bool final);
/* progress.c: completions, loops, speculation windows, the end */
void reg_node_done(rt_runtime *rt, rt_request *r, int node, const rt_iter *v,
                   const rt_value_out *outs, size_t n_outs, bool finish);
void reg_node_chunk(rt_runtime *rt, rt_request *r, int node, const rt_iter *v, int value,
                    rt_tensor t, bool final);
slot *reg_slot_find(rt_request *r, int node, const rt_iter *v);
void reg_node_failed(rt_runtime *rt, rt_request *r, int node, const rt_iter *v, bt_code code,
                     const char *message);
void reg_replay(rt_runtime *rt, rt_request *r, int node, const rt_iter *v);
void reg_drop_speculation(rt_runtime *rt, rt_request *r);
void reg_request_free(rt_runtime *rt, rt_request *r);
void reg_check_request_done(rt_runtime *rt, rt_request *r);

#endif
