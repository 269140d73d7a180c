/* The conductor's graph runtime: a pure state
 * machine with no I/O and no clock.
 *
 * It is fed events (a request accepted, a node completed, a stream chunk, a
 * node failed, a cancel, a deadline, a worker lost) and answers each with
 * actions (dispatch, extend a speculation window, drop, release a tensor,
 * send a chunk to the client, send the terminal response) that the caller
 * carries out in order.  Because it owns all per-request graph state and
 * does nothing else, its behaviour is reproducible and tested exhaustively
 * by feeding it event sequences (tests/unit/test_runtime*.c).
 *
 * Ordering guarantees the caller may rely on: within one batch of actions a
 * RELEASE of a tensor never precedes an action that names it; CHUNK actions
 * of a request come with seq 0, 1, 2, ...; exactly one RESPONSE per
 * accepted request, after which no action names the request except the
 * RELEASE and DROP actions that clean up after it. */
#ifndef BATON_RUNTIME_RUNTIME_H
#define BATON_RUNTIME_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "config/graph.h"

/* A tensor reference as the runtime sees it: which worker owns it and the
 * id the worker gave it.  The bytes never pass through here. */
typedef struct rt_tensor {
    uint64_t id;     /* unique per worker; 0 means "no tensor" */
    int32_t worker;  /* index into the config's workers */
} rt_tensor;

/* An iteration vector: one index per loop around an entity, outermost
 * first. */
typedef struct rt_iter {
    uint32_t depth;
    uint32_t v[GRAPH_MAX_DEPTH];
} rt_iter;

/* A list of tensors that the worker joins along one dimension. */
typedef struct rt_tlist {
    rt_tensor *t;    /* owned by the action queue */
    uint32_t n;
} rt_tlist;

/* One input of a dispatch: fan-in parts in producer order, each a list of
 * chunks joined along dim 0; the parts are then joined along shard_dim.
 * Most inputs are one part of one tensor. */
typedef struct rt_input {
    uint32_t input;      /* index into the node's inputs */
    rt_tlist *parts;
    uint32_t n_parts;
    uint32_t shard_dim;
    bool stream;         /* the node's stream input */
    bool stream_final;   /* the final chunk is among these */
} rt_input;

typedef enum rt_action_kind {
    RT_DISPATCH = 0, /* run (node, iteration) with these inputs */
    RT_EXTEND = 1,   /* a speculating node may now run up to `upto` */
    RT_DROP = 2,     /* discard speculative iterations >= `from` and free their outputs */
    RT_RELEASE = 3,  /* the tensor has no consumer left */
    RT_CHUNK = 4,    /* send an InferChunk to the client */
    RT_RESPONSE = 5  /* send the terminal InferResponse */
} rt_action_kind;

/* A client-bound output of the terminal response: chunks joined along
 * dim 0. */
typedef struct rt_output {
    const char *name;     /* borrowed from the graph */
    const char *modality; /* borrowed */
    rt_tlist value;
} rt_output;

/* Tokens a request's nodes counted (a node's prefill reads its prompt and
 * samples a token; each decode step samples one). */
typedef struct rt_usage {
    uint32_t prompt;
    uint32_t generated;
    uint32_t cached;           /* of PROMPT, tokens read from a prefix cache */
} rt_usage;

/* How a loop ended. */
typedef enum rt_loop_end {
    RT_LOOP_FINISH = 1,        /* a node of its body raised the finish signal */
    RT_LOOP_MAX_ITERS = 2,     /* it ran its max_iters iterations */
} rt_loop_end;

typedef struct rt_action {
    rt_action_kind kind;
    uint64_t req;         /* the request's key (0 for RELEASE of a stray tensor) */
    int graph;            /* graph index, -1 when not known */
    union {
        struct {
            int node;         /* entity index */
            rt_iter iter;
            rt_input *inputs; /* one per node input, in input order */
            uint32_t n_inputs;
            uint32_t spec_upto; /* >iter's innermost: the worker may run on to this iteration */
            const uint8_t *client_values; /* per node value: 1 when it is client-bound */
        } dispatch;
        struct {
            int node;
            rt_iter iter;     /* the current iteration; upto applies to its innermost index */
            uint32_t upto;
        } extend;
        struct {
            int node;
            rt_iter from;     /* drop this iteration and every later one */
        } drop;
        rt_tensor release;
        struct {
            uint64_t seq;
            const char *name;     /* value name; borrowed */
            const char *modality; /* borrowed */
            rt_tensor tensor;     /* id 0: an empty chunk */
            int node;             /* producing entity */
            rt_iter iter;
            rt_usage usage;       /* the request's tokens so far, this one's included:
                                   * what the response says if the request ends here */
        } chunk;
        struct {
            bt_code code;
            char *message;        /* owned by the queue; "" on success */
            rt_output *outputs;
            uint32_t n_outputs;
            rt_usage usage;       /* what the kept completions counted */
            uint8_t *loop_ends;   /* per entity: how a loop's last instance ended
                                   * (rt_loop_end; 0: it did not end); owned by the
                                   * queue, NULL when out of memory */
        } response;
    } u;
} rt_action;

/* One output tensor of a completion. */
typedef struct rt_value_out {
    int value;           /* index into the graph's values (a value of the node) */
    rt_tensor tensor;
} rt_value_out;

typedef struct rt_options {
    uint32_t speculation_window; /* iterations a worker may run ahead; 0 disables */
} rt_options;

typedef struct rt_runtime rt_runtime;

rt_runtime *rt_create(const graph_set *gs, const rt_options *opt);
void rt_destroy(rt_runtime *rt);

/* Starts request REQ on graph GRAPH.  INPUTS holds one tensor per graph
 * input, in the graph's input order (already placed on a worker by the
 * caller).  MAX_ITERS, when not NULL, holds per entity of the graph a cap
 * for loops (0: the config's); it can only lower max_iters.  Returns
 * BT_EEXIST for a key in use, BT_EINVAL for a bad graph index, BT_ENOMEM
 * when it could not take the request: on any error the inputs stay the
 * caller's and nothing is answered.  On success the runtime owns them and
 * the request gets exactly one RESPONSE (RESOURCE_EXHAUSTED at once when
 * memory ran out while its first nodes were dispatched); dispatches of the
 * ready nodes are queued. */
int rt_request_start(rt_runtime *rt, uint64_t req, int graph, const rt_tensor *inputs,
                     bool stream, const uint32_t *max_iters);

/* A node finished (node, iter): OUTS are its outputs; FINISH raises the
 * finish signal of its innermost loop; USAGE (may be NULL) the tokens it
 * counted, added to the request's once the completion is kept.  A
 * completion the runtime no longer expects (a dropped speculative
 * iteration, an ended request) is ignored and its tensors are released. */
int rt_node_done(rt_runtime *rt, uint64_t req, int node, const rt_iter *iter,
                 const rt_value_out *outs, size_t n_outs, bool finish, const rt_usage *usage);

/* A node emitted a chunk of VALUE while running (node, iter); TENSOR id 0
 * is an empty chunk.  FINAL closes the value's stream for this execution. */
int rt_chunk(rt_runtime *rt, uint64_t req, int node, const rt_iter *iter, int value,
             rt_tensor tensor, bool final);

/* A node failed: the request ends with CODE and a message naming the node. */
int rt_node_failed(rt_runtime *rt, uint64_t req, int node, const rt_iter *iter, bt_code code,
                   const char *message);

/* The client cancelled (CANCELLED) or the deadline passed
 * (DEADLINE_EXCEEDED).  Unknown keys are ignored (return BT_ENOENT). */
int rt_cancel(rt_runtime *rt, uint64_t req);
/* Ends REQ with CODE and MESSAGE (an input that could not be placed after
 * the request started).  BT_ENOENT for an unknown key. */
int rt_abort(rt_runtime *rt, uint64_t req, bt_code code, const char *message);
int rt_deadline(rt_runtime *rt, uint64_t req);
/* Ends REQ as done (OK), with the outputs it has, dropping its remaining
 * work as a cancel does: the client has every value it wants (its text hit
 * a stop string or max_tokens).  BT_ENOENT for an unknown key. */
int rt_stop(rt_runtime *rt, uint64_t req);

/* Ends with UNAVAILABLE every request that uses WORKER: a node placed
 * there, a tensor it holds there, or its key among the N_ALSO of ALSO (the
 * requests that picked WORKER as their replica of a model).  Tensors owned
 * by that worker are forgotten, not released: its pool is gone. */
int rt_worker_lost(rt_runtime *rt, int worker, const uint64_t *also, size_t n_also);

/* Ends every request with CODE and MESSAGE (daemon shutdown). */
void rt_end_all(rt_runtime *rt, bt_code code, const char *message);

/* The queued actions, in order; valid until rt_actions_clear or the next
 * event.  Events append to the queue; the caller clears it after acting. */
const rt_action *rt_actions(const rt_runtime *rt, size_t *n);
void rt_actions_clear(rt_runtime *rt);

/* Requests accepted and not yet ended. */
size_t rt_inflight(const rt_runtime *rt);
/* Tensors the runtime currently holds references to, all requests. */
size_t rt_tensors_held(const rt_runtime *rt);
bool rt_request_exists(const rt_runtime *rt, uint64_t req);

const char *rt_action_kind_name(rt_action_kind k);
void rt_iter_format(const rt_iter *it, char *buf, size_t len);

#endif
