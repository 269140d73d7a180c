/* The static graph template, built once per graph
 * from the loaded config and then shared read-only by every request.
 *
 * Everything the runtime needs per request is derived here, once: entities
 * (nodes and loops) in section order, every edge with its kind and the
 * iterations it applies to, per (node, input) its producers in fan-in order,
 * per section its external inputs and outputs, per loop its loop-back edges,
 * and speculation eligibility.  Indices replace names so that the runtime
 * never compares strings on its hot path. */
#ifndef BATON_CONFIG_GRAPH_H
#define BATON_CONFIG_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config/config.h"

/* Loops may nest at most this deep; iteration vectors have this many slots. */
#define GRAPH_MAX_DEPTH 8
/* A graph takes at most this many inputs. */
#define GRAPH_MAX_INPUTS 64

typedef enum graph_entity_kind { GRAPH_NODE = 0, GRAPH_LOOP = 1 } graph_entity_kind;

/* How an edge relates producer and consumer (config/README.md, graphs). */
typedef enum graph_edge_kind {
    GRAPH_EDGE_FORWARD = 0,  /* same iteration, consumer later in section order */
    GRAPH_EDGE_LOOPBACK = 1, /* iteration i feeds i+1 of the innermost common loop */
    GRAPH_EDGE_EXTERNAL = 2, /* enters one or more loops around the consumer */
    GRAPH_EDGE_CLIENT = 3    /* to the client */
} graph_edge_kind;

/* Which values of a loop entity an edge carries. */
typedef enum graph_value_role {
    GRAPH_VALUE_NODE = 0,       /* a node's output */
    GRAPH_VALUE_LOOP_LAST = 1,  /* a loop's `outputs`: the last iteration's value */
    GRAPH_VALUE_LOOP_ACCUM = 2  /* a loop's `accumulate`: every iteration's value */
} graph_value_role;

typedef struct graph_value {
    const char *name;      /* borrowed from the config */
    int producer;          /* entity index */
    graph_value_role role;
    int source;            /* LOOP_*: the body value it takes; else -1 */
    int *edges;            /* owned; edges that carry it, config order */
    size_t n_edges;
    int *loop_uses;        /* owned; values of enclosing loops that take it */
    size_t n_loop_uses;
} graph_value;

typedef struct graph_edge {
    int value;             /* the value it carries */
    int producer;          /* entity index */
    int consumer;          /* node entity index, or -1 for the client */
    int input;             /* index into the consumer's inputs; -1 for the client */
    graph_edge_kind kind;
    bool loopback;         /* also true for a loop-back that enters deeper loops */
    int common_depth;      /* loops around both ends (== the producer's depth) */
    bool persist, stream, new_token;
    const char *modality;  /* borrowed */
    const char *client_name; /* borrowed; to the client: `as`, else the value's name; else NULL */
    uint32_t shard_dim;
    /* Applicability over the consumer's loop levels (bit k: level k,
     * outermost 0): the edge delivers to iteration vector v iff every level
     * in must_zero has v[k] == 0 and every level in must_nonzero v[k] >= 1. */
    uint32_t must_zero, must_nonzero;
    cfg_pos pos;
} graph_edge;

typedef struct graph_input {
    const char *name;      /* borrowed */
    int *edges;            /* owned; producers in fan-in (config) order */
    size_t n_edges;
    int graph_input;       /* index of the graph input bound here, or -1 */
    bool is_stream;        /* fed by a stream edge (then n_edges == 1) */
    uint8_t fanin_first;   /* producers that apply in iteration 0 of the innermost loop */
    uint8_t fanin_later;   /* ... in iterations >= 1 (equal to fanin_first outside loops) */
    cfg_pos pos;
} graph_input;

typedef struct graph_node {
    const char *model;     /* borrowed */
    int model_index;       /* into cfg_config.models */
    const char *mode;      /* borrowed */
    graph_input *inputs;   /* owned */
    size_t n_inputs;
    int stream_input;      /* index of the stream input, or -1 */
    bool consumes_stream;
    bool async;
    bool speculative;      /* eligible for a speculation window (section 4.4) */
    int worker;            /* primary worker index (tp rank 0; the first replica) */
    bool replicated;       /* its model has replicas: each request picks one at run time */
} graph_node;

typedef struct graph_loop {
    uint32_t max_iters;
    int *body;             /* owned; entities directly in the body, section order */
    size_t n_body;
    int *loopback_edges;   /* owned; loop-back edges whose innermost common loop is this */
    size_t n_loopback_edges;
    int first, last;       /* entity index range of everything inside (inclusive) */
} graph_loop;

typedef struct graph_entity {
    graph_entity_kind kind;
    const char *name;      /* borrowed */
    int parent_loop;       /* entity index of the innermost enclosing loop, or -1 */
    int depth;             /* loops around it (not counting itself) */
    int loops[GRAPH_MAX_DEPTH]; /* enclosing loop entities, outermost first */
    int section;           /* index of the section that is this entity */
    int *values;           /* owned; values it produces */
    size_t n_values;
    union {
        graph_node node;
        graph_loop loop;
    } u;
    cfg_pos pos;
} graph_entity;

/* A section of the shape tree, for derived I/O and the Parallel rule. */
typedef struct graph_section {
    cfg_section_kind kind;
    int parent;            /* section index, -1 for the body */
    int entity;            /* NODE/LOOP: the entity; else -1 */
    int first, last;       /* entity index range covered (inclusive) */
    int *ext_inputs;       /* owned; edges entering from outside the section */
    size_t n_ext_inputs;
    int *ext_outputs;      /* owned; edges leaving it */
    size_t n_ext_outputs;
    int *graph_inputs;     /* owned; graph inputs bound inside it */
    size_t n_graph_inputs;
} graph_section;

typedef struct graph {
    const char *name;      /* borrowed */
    size_t index;          /* in the graph set */
    const char **inputs;   /* owned array of borrowed names */
    size_t n_inputs;
    uint64_t optional;     /* bit K: a request may leave input K out, which its nodes then
                              read as an empty U8 tensor */
    graph_entity *entities; /* owned; section (pre-)order */
    size_t n_entities;
    graph_edge *edges;     /* owned; config order */
    size_t n_edges;
    graph_value *values;   /* owned */
    size_t n_values;
    graph_section *sections; /* owned; pre-order, 0 is the body */
    size_t n_sections;
    int *top;              /* owned; entities at depth 0 */
    size_t n_top;
    int max_depth;         /* deepest loop nesting in the graph */
} graph;

/* Transfers between workers, from the partition of a graph by worker. */
typedef enum graph_transfer_kind {
    GRAPH_XFER_SHM = 0,       /* CPU -> CPU on one host: the consumer maps the producer's shm pool */
    GRAPH_XFER_CUDA_IPC = 1,  /* GPU -> GPU on one host: cudaIpcOpenMemHandle once, read in place */
    GRAPH_XFER_HOST_STAGED = 2,/* CPU <-> GPU on one host: map the shm pool, copy to/from device */
    GRAPH_XFER_REMOTE = 3,    /* a host not known from the config: chosen at registration */
    GRAPH_XFER_SOCKET = 4,    /* CPU -> CPU on two hosts: the consumer pulls the bytes from the
                                 producer's peer_listen socket into its own pool */
    GRAPH_XFER_NCCL = 5,      /* GPU -> GPU on two hosts: NCCL send/receive over the pair's
                                 communicator */
    GRAPH_XFER_NONE = 6       /* CPU <-> GPU on two hosts: not built; such a dispatch fails
                                 with FAILED_PRECONDITION */
} graph_transfer_kind;

/* The kind of a transfer between workers of devices GPU_FROM and GPU_TO,
 * on one host or on two.  The conductor uses it again at dispatch time
 * with the hosts the workers registered from. */
graph_transfer_kind graph_transfer_kind_of(bool same_host, bool gpu_from, bool gpu_to);

/* Where a worker runs as far as the config tells: its `host:`, else, for a
 * worker batond spawns, batond's own host (LOCAL_HOST); NULL when unknown
 * (an external worker without `host:`). */
const char *graph_worker_host(const cfg_worker *w, const char *local_host);

typedef struct graph_transfer {
    int graph;             /* graph index */
    int edge;              /* edge index within that graph; -1 for a graph input */
    int graph_input;       /* graph input index when edge == -1 */
    int from_worker, to_worker;
    graph_transfer_kind kind;
} graph_transfer;

typedef struct graph_set {
    const cfg_config *cfg; /* borrowed; must outlive the set */
    graph *graphs;         /* owned */
    size_t n_graphs;
    int **worker_nodes;    /* owned; per worker: node entity indices encoded as (graph << 16 | entity) */
    size_t *n_worker_nodes;
    graph_transfer *transfers; /* owned */
    size_t n_transfers;
    bool *reaches;         /* owned; n_workers x n_workers: reaches[to * n_workers + from]
                              when a tensor in worker FROM's pool can come to worker TO,
                              by a transfer or a chain of them in one graph (a node may pass a tensor
                              on by reference, so its owner stays upstream) */
} graph_set;

/* Builds and validates every graph of CFG, and partitions them.  Errors go
 * to DIAG with their line and column; returns BT_ECONFIG if there were any
 * (and *out NULL). */
int graph_set_build(const cfg_config *cfg, bt_diag *diag, graph_set **out);
void graph_set_destroy(graph_set *gs);

const graph *graph_set_find(const graph_set *gs, const char *name);
/* Can a tensor in worker FROM's pool come to worker TO (graph_set.reaches)?
 * False for FROM == TO unless a chain leads back. */
bool graph_set_reaches(const graph_set *gs, int from, int to);
int graph_entity_find(const graph *g, const char *name);
int graph_input_index(const graph *g, const char *name);

/* True when edge E delivers a value to consumer iteration vector V (only
 * the consumer's depth levels are read). */
bool graph_edge_applies(const graph_edge *e, const uint32_t *v, int depth);

const char *graph_edge_kind_name(graph_edge_kind k);
const char *graph_transfer_kind_name(graph_transfer_kind k);

/* Writes the human-readable summary of --check-config and `inspect`. */
void graph_set_print(const graph_set *gs, FILE *out);

#endif
