/* The conductor (batond): one thread, one zmq_poll loop (daemon/evloop.c)
 * over the client ROUTER, the worker ROUTER, a signalfd, a timerfd and the
 * metrics listener.  All graph state lives in the runtime (daemon/runtime.h);
 * the modules here turn messages into runtime events and runtime actions
 * into messages:
 *
 *   conductor.c   setup, signals, timer tick, drain and shutdown
 *   frontend.c    client messages: checks at the door, admission, replies
 *   supervisor.c  worker processes: spawn, register, load, loss, restart
 *   dispatch.c    runtime actions -> worker messages; worker results ->
 *                 runtime events; the tensor table
 *   metrics.c     Prometheus text and the /metrics listener
 */
#ifndef BATON_DAEMON_CONDUCTOR_H
#define BATON_DAEMON_CONDUCTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/u64map.h"
#include "config/config.h"
#include "config/graph.h"
#include "daemon/evloop.h"
#include "runtime/runtime.h"
#include "proto/baton.pb-c.h"

#define COND_MAX_DIMS 8
#define COND_INLINE_MAX 65536 /* client-bound outputs up to this come inline */

typedef enum cworker_state {
    CW_DOWN = 0,       /* not running; maybe waiting for a restart */
    CW_STARTING = 1,   /* spawned (or expected), no Register yet */
    CW_LOADING = 2,    /* registered, Loads outstanding */
    CW_READY = 3       /* every model loaded */
} cworker_state;

typedef struct cworker {
    int index;
    const cfg_worker *cfg;        /* borrowed from the conductor's config */
    cworker_state state;
    pid_t pid;                    /* 0 for external workers or when not running */
    uint32_t incarnation;         /* 1, 2, ...: bumped at every spawn; < 2^16 */
    char shm_name[128];           /* its pool's POSIX shm name, unlinked when it dies */
    char hostname[64];
    uint64_t pool_bytes;
    Baton__V1__PoolHandle *pools; /* owned copies of its registered pools */
    size_t n_pools;
    uint32_t loads_pending;
    uint64_t last_seen_ms;        /* last message from it, monotonic ms */
    uint64_t started_ms;          /* spawn time, monotonic ms */
    uint64_t restart_at_ms;       /* when DOWN: when to spawn again (0: never) */
    uint32_t backoff_ms;          /* next restart delay */
    uint64_t restarts;            /* times it was restarted (metric) */
    bool told_to_restart;         /* external, lost, then heard from: Shutdown sent */
    /* From its last Heartbeat. */
    uint64_t pool_used, pool_free, largest_free;
    double fragmentation;
    uint32_t live_tensors, queued;
    /* What its Loaded messages of this incarnation said, one paragraph per
     * model (load time, weights, the backend's report), for inspect; owned,
     * NULL when nothing has loaded. */
    char *loads_text;
} cworker;

/* What the conductor knows of a tensor: enough to name it in a Dispatch and
 * to turn it into client bytes. */
typedef struct ctensor {
    rt_tensor t;
    uint32_t pool;
    uint64_t offset, nbytes;
    Baton__V1__DType dtype;
    uint32_t ndim;
    int64_t dims[COND_MAX_DIMS];
    uint8_t *data;                /* inline copy (client-bound, <= 64 KiB), or NULL */
    size_t ndata;
} ctensor;

/* A client-bound tensor waiting for its bytes. */
typedef struct obytes {
    uint64_t tkey;                /* tensor table key */
    int worker;
    uint64_t id;
    Baton__V1__DType dtype;
    uint32_t ndim;
    int64_t dims[COND_MAX_DIMS];
    uint8_t *data;                /* owned once ready */
    size_t ndata;
    bool ready;
} obytes;

/* A message to the client held until every tensor it carries has bytes. */
typedef struct outmsg {
    bool response;                /* else a chunk */
    uint64_t seq;                 /* chunk */
    char *name;                   /* chunk: value name */
    char *modality;
    bt_code code;                 /* response */
    char *message;                /* response */
    /* Tensors: a chunk has one; a response output i has n_parts[i]. */
    obytes *bytes;
    size_t n_bytes;
    char **out_names;             /* response: output names */
    char **out_modalities;
    size_t *out_parts;            /* response: tensors per output, in order */
    size_t n_outs;
} outmsg;

typedef struct ctiming {
    int node;
    uint32_t iteration;
    int worker;
    uint64_t queue_us, exec_us;
} ctiming;

typedef enum creq_phase {
    REQ_PLACING = 0,   /* inputs being Put on workers */
    REQ_RUNNING = 1,   /* in the runtime */
    REQ_FLUSHING = 2   /* ended in the runtime; client messages still waiting for bytes */
} creq_phase;

typedef struct creq {
    uint64_t key;                 /* conductor key, unique per run */
    uint64_t hkey;                /* hash of (client identity, request_id) */
    struct creq *hnext;           /* next request with the same hkey */
    uint8_t *identity;            /* client's ZeroMQ routing id */
    size_t identity_len;
    char *request_id;
    int graph;
    bool stream;
    creq_phase phase;
    uint64_t start_us;            /* monotonic us at acceptance */
    uint64_t deadline_ms;         /* monotonic ms */
    float temperature, top_p;
    uint32_t top_k;
    uint64_t seed;
    uint32_t *max_iters;          /* per entity, 0: config */
    rt_tensor *inputs;            /* per graph input */
    uint32_t puts_pending;        /* puts the request waits for before it starts */
    ctiming *timings;
    size_t n_timings, cap_timings;
    outmsg *outq;                 /* client messages in order */
    size_t n_outq, cap_outq;
    size_t fetches_pending;
} creq;

typedef struct deadline {
    uint64_t at_ms;
    uint64_t key;
} deadline;

/* An Extend held until the burst of worker messages is read. */
typedef struct pending_extend {
    uint64_t req;
    int graph, node;
    uint32_t upto;
} pending_extend;

typedef struct metrics metrics;

typedef struct conductor {
    char *config_path;            /* absolute */
    cfg_config *cfg;
    graph_set *gs;
    rt_runtime *rt;
    evloop *loop;
    void *zctx;
    void *front;                  /* client ROUTER */
    void *back;                   /* worker ROUTER */
    int sigfd, timerfd;
    char run_id[32];
    char worker_exe[4096];
    cworker *workers;
    size_t n_workers;
    int **graph_input_worker;     /* per graph, per input: worker of its first consumer, -1 */
    uint8_t **graph_input_local;  /* per graph, per input: every consumer is on that worker,
                                     so the request need not wait for its Placed */
    uint64_t next_put_tensor;     /* conductor-chosen ids of early puts (top bit set) */
    u64map requests;              /* key -> creq */
    u64map by_client;             /* hkey -> creq (chained) */
    u64map tensors;               /* tensor key -> ctensor */
    deadline *deadlines;          /* min-heap */
    size_t n_deadlines, cap_deadlines;
    uint64_t next_key;
    uint64_t next_dispatch;
    bool ready;                   /* every worker loaded */
    bool draining;
    uint64_t drain_deadline_ms;
    bool stopping;                /* workers told to shut down */
    uint64_t stop_deadline_ms;
    bool done;                    /* the loop should end */
    uint64_t last_watchdog_ms;
    uint64_t watchdog_usec;       /* from sd_watchdog_enabled; 0: off */
    /* Per worker, tensor ids to release, sent in one message per batch. */
    uint64_t **release_ids;
    size_t *n_release, *cap_release;
    bool in_burst;                /* reading worker messages: batch Releases and Extends */
    pending_extend *extends;      /* see disp_flush_extends */
    size_t n_extends, cap_extends;
    metrics *m;
    /* Limits that SIGHUP may change. */
    uint32_t max_inflight, request_timeout_ms, drain_timeout_ms;
    uint64_t max_message_bytes;
} conductor;

uint64_t cond_now_ms(void);
uint64_t cond_now_us(void);
uint64_t cond_tensor_key(int worker, uint64_t id);

/* conductor.c */
int conductor_create(const char *config_path, conductor **out);
int conductor_run(conductor *c);
void conductor_destroy(conductor *c);

/* frontend.c */
void front_on_readable(evloop *l, void *arg);
void front_send(conductor *c, const uint8_t *identity, size_t identity_len,
                const Baton__V1__ServerMessage *m);
void front_reject(conductor *c, const uint8_t *identity, size_t identity_len,
                  const char *request_id, bt_code code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
creq *front_find(conductor *c, const uint8_t *identity, size_t len, const char *request_id);
void front_request_free(conductor *c, creq *r);
void front_flush(conductor *c, creq *r);
/* Ends a request that has not reached the runtime (placing inputs). */
void front_end_placing(conductor *c, creq *r, bt_code code, const char *message);
/* Ends every request still placing inputs: all of them (WORKER -1), or
 * those with an input on WORKER (lost: its inputs are forgotten). */
void front_end_placing_all(conductor *c, int worker, bt_code code, const char *message);
void front_start_runtime(conductor *c, creq *r);
char *front_inspect_text(conductor *c, const char *graph);

/* supervisor.c */
void sup_on_readable(evloop *l, void *arg);
int sup_spawn(conductor *c, cworker *w);
void sup_child_exited(conductor *c, pid_t pid, int status);
void sup_tick(conductor *c, uint64_t now_ms);
int sup_send(conductor *c, int worker, const Baton__V1__ConductorMessage *m);
void sup_worker_lost(conductor *c, cworker *w, const char *why);
void sup_shutdown_all(conductor *c, const char *reason);
bool sup_all_ready(const conductor *c);

/* dispatch.c */
void disp_actions(conductor *c);
void disp_done(conductor *c, int worker, const Baton__V1__Done *d);
void disp_chunk(conductor *c, int worker, const Baton__V1__Chunk *k);
void disp_placed(conductor *c, int worker, const Baton__V1__Placed *p);
void disp_fetched(conductor *c, int worker, const Baton__V1__Fetched *f);
ctensor *disp_tensor_add(conductor *c, int worker, const Baton__V1__TensorRef *ref);
void disp_tensor_drop_worker(conductor *c, int worker);
void disp_flush_releases(conductor *c);
/* Sends the Extends coalesced while reading a burst of worker messages. */
void disp_flush_extends(conductor *c);
/* Forgets a tensor the runtime never saw (a placed input) and releases it. */
void disp_release_input(conductor *c, rt_tensor t);
/* Ends the waits of client messages for bytes from a lost worker. */
void disp_fetches_lost(conductor *c, int worker);

/* metrics.c */
metrics *metrics_create(const conductor *c);
void metrics_destroy(metrics *m);
void metrics_request_done(metrics *m, int gi, bt_code code, uint64_t latency_us);
void metrics_node_done(metrics *m, int gi, int node, uint64_t queue_us, uint64_t exec_us);
void metrics_rejected(metrics *m, bt_code code);
char *metrics_text(conductor *c);
int metrics_listen(conductor *c, const char *hostport);
/* Closes scrape connections that stayed idle too long. */
void metrics_tick(conductor *c, uint64_t now_ms);

#endif
