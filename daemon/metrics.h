/* The conductor's counters and their Prometheus text: requests by graph
 * and status, refusals at the door, latency histograms, per-node execution
 * and queue time, streamed tokens (count, time to the first, time between
 * them).  Every family's lines come together under its HELP and TYPE, as
 * the text format requires.  Gauges (requests in flight, tensors held, the workers'
 * pools and queues) belong to the modules that know them; the caller reads
 * them into a metrics_gauges when it asks for the text. */
#ifndef BATON_DAEMON_METRICS_H
#define BATON_DAEMON_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "config/graph.h"

typedef struct metrics metrics;

/* What one worker last reported, for the text. */
typedef struct metrics_worker {
    const char *name;             /* borrowed */
    bool up;                      /* every model loaded */
    uint64_t restarts;
    uint64_t pool_used, pool_free; /* bytes */
    double fragmentation;         /* 0..1 */
    uint32_t queued;              /* items waiting on the worker */
    uint64_t staged_bytes;        /* bytes it copied to assemble inputs (this incarnation) */
    uint32_t sessions;            /* backend sessions open (KV caches) */
    uint64_t tp_steps;            /* leader steps run as a tensor-parallel follower */
    uint64_t inline_batches;      /* batches its I/O thread ran itself (this incarnation) */
    uint64_t ipc_ahead, ipc_on_request; /* peers' CUDA pools it opened, by when (this
                                           incarnation) */
    uint64_t msgs_out, msgs_in;   /* protocol messages to it and from it */
    uint64_t zmq_out, zmq_in;     /* the ZeroMQ messages that carried them */
} metrics_worker;

/* The picks of one replica of a replicated model, by reason. */
typedef struct metrics_route {
    const char *model, *worker;   /* borrowed */
    uint64_t by_cache, by_load, by_turn;
    uint32_t pinned;              /* requests pinned to it now */
    size_t blocks;                /* prefix blocks its worker reported */
} metrics_route;

/* What a worker's model reported of its prefix cache (CacheReport): counters
 * since the model loaded on that incarnation of the worker. */
typedef struct metrics_cache {
    uint64_t hits, misses, hit_tokens, evictions;
    uint64_t bytes, entries;      /* held now */
} metrics_cache;

/* A counter of one label value. */
typedef struct metrics_count {
    const char *label;            /* borrowed */
    uint64_t n;
} metrics_count;

typedef struct metrics_gauges {
    size_t inflight;              /* requests accepted, not yet answered */
    size_t placing;               /* of which still placing inputs */
    size_t tensors_held;          /* tensor references the runtime holds */
    size_t tensor_entries;        /* entries in the conductor's tensor table */
    uint64_t client_backlog_bytes; /* replies held for clients that do not read */
    const metrics_worker *workers;
    size_t n_workers;
    uint64_t auth_refused_client; /* peers the ZAP handler refused on the client socket */
    uint64_t auth_refused_worker; /* ... and on the worker socket (counters, daemon/zap.h) */
    const metrics_count *registrations_refused; /* Registers refused, by reason
                                     (counters, daemon/identity.h) */
    size_t n_registrations_refused;
    const metrics_route *routes;  /* per replica of each replicated model */
    size_t n_routes;
} metrics_gauges;

/* Counters for the graphs of GS (borrowed; it must outlive them). */
metrics *metrics_create(const graph_set *gs);
void metrics_destroy(metrics *m);

void metrics_request_done(metrics *m, int graph, bt_code code, uint64_t latency_us);
void metrics_node_done(metrics *m, int graph, int node, uint64_t queue_us, uint64_t exec_us);
void metrics_rejected(metrics *m, bt_code code);
/* A client connection was dropped for not reading its replies. */
void metrics_client_dropped(metrics *m);
/* A streamed new_token value of a request of GRAPH left for its client:
 * FIRST says it is the request's first (SINCE_US is then the time since
 * acceptance: time to first token), else SINCE_US is the time since the
 * previous one (inter-token latency). */
void metrics_token(metrics *m, int graph, bool first, uint64_t since_us);

/* Worker W's copy of model MODEL (indices into the config) reported its
 * prefix cache: C replaces what it reported before. */
void metrics_cache_report(metrics *m, int w, int model, const metrics_cache *c);

/* The Prometheus text (malloc'ed), or NULL when out of memory. */
char *metrics_text(const metrics *m, const metrics_gauges *g);

#endif
