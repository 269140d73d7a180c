/* A test harness around the runtime state machine: it plays the workers.
 *
 * It builds a graph set from YAML text, mints labelled tensors for every
 * output ("node@(i,j).value"), keeps the dispatches in flight, and after
 * every event checks the runtime's invariants: each tensor
 * released exactly once and never named after its release, one terminal
 * response per request, client chunks numbered 0, 1, 2, ... */
#ifndef BATON_TESTS_RT_HARNESS_H
#define BATON_TESTS_RT_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "config/graph.h"
#include "runtime/runtime.h"

#define H_MAX_INPUTS 8
#define H_LABEL 2048

typedef struct h_dispatch {
    uint64_t req;
    int node;
    rt_iter iter;
    uint32_t spec_upto;     /* from the dispatch (or EXTENDs) */
    bool virtual_;          /* a speculative iteration the "worker" runs on its own */
    bool stream_final;      /* the stream input's final chunk is among the inputs */
    char inputs[H_MAX_INPUTS][H_LABEL]; /* per input: parts '|'-joined, chunks ',' */
    rt_tensor in_ids[64];   /* every input tensor, for liveness checks */
    size_t n_in_ids;
    int n_chunks;           /* chunks emitted so far by this dispatch */
} h_dispatch;

typedef struct h_tensor {
    char label[96];
    int worker;
    bool released;
    bool lost;              /* its worker died: never to be released */
} h_tensor;

typedef struct h_response {
    uint64_t req;
    bt_code code;
    char message[256];
    char outputs[4096];     /* "name=label,label;name=..." in output order */
    int count;              /* responses seen for req (must stay 1) */
} h_response;

typedef struct harness {
    cfg_config *cfg;
    graph_set *gs;
    rt_runtime *rt;
    const graph *g;
    h_tensor *tensors;      /* by id - 1 */
    size_t n_tensors, cap_tensors;
    h_dispatch *inflight;
    size_t n_inflight, cap_inflight;
    h_response *responses;
    size_t n_responses, cap_responses;
    /* Client chunks, in order, for every request: "req:seq:label". */
    char chunks[16384];
    /* The names the client gets those chunks by, in the same order. */
    char chunk_names[4096];
    uint64_t next_seq[256]; /* expected next chunk seq by req (req < 256) */
    size_t n_dispatch_total;
    size_t n_drops, n_extends;
    char last_drop[128];
    char failure[512];      /* first invariant broken, "" if none */
    int lost_worker;
    bool drop_race;         /* keep some dropped iterations: their completions race the DROP */
    unsigned drop_count;
} harness;

/* Builds from YAML (asserting it is valid) with the given speculation window. */
harness *h_create(const char *yaml, uint32_t window);
void h_destroy(harness *h);

int h_node(const harness *h, const char *name);
int h_value(const harness *h, const char *node, const char *value);
rt_iter h_iter(int depth, ...);

/* Mints a tensor on WORKER labelled LABEL; returns it. */
rt_tensor h_tensor_new(harness *h, int worker, const char *label);

/* Starts request REQ with one fresh tensor per graph input. */
int h_start(harness *h, uint64_t req, bool stream, const char *max_iters_loop, uint32_t cap);

/* The in-flight dispatch of NODE at ITER for REQ, or NULL. */
h_dispatch *h_find(harness *h, uint64_t req, const char *node, const rt_iter *iter);
/* Any in-flight dispatch of NODE for REQ (the first), or NULL. */
h_dispatch *h_find_node(harness *h, uint64_t req, const char *node);
size_t h_count_inflight(const harness *h, uint64_t req);

/* Completes D (then forgets it): every value of the node gets a fresh
 * tensor labelled "node@iter.value" unless SKIP_VALUE names one to leave
 * out.  For a speculative node the harness then plays the worker and queues
 * the next iteration itself while it lies in the window. */
void h_complete(harness *h, h_dispatch *d, bool finish);
void h_complete_skip(harness *h, h_dispatch *d, bool finish, const char *skip_value);
/* Emits a chunk of VALUE from D (still running); returns its label. */
void h_chunk(harness *h, h_dispatch *d, const char *value, bool empty, bool final);
void h_fail(harness *h, h_dispatch *d, const char *msg);

const h_response *h_response_of(const harness *h, uint64_t req);
size_t h_tensors_unreleased(const harness *h);

/* Processes the queued actions (called by the event helpers). */
void h_pump(harness *h);

#endif
