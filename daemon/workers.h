/* The worker records and the worker socket: the bottom of the supervisor's
 * files (daemon/supervisor.h).
 *
 * One record per configured worker, in config order, holds what the
 * conductor knows of that worker.  The records are shared by the
 * supervisor's layers, each of which writes only the fields it owns (noted
 * at each field); the rest of the daemon reads them through
 * sup_worker_get(), which is why the types keep the supervisor's prefix.
 *
 * A worker's state moves as follows: DOWN -> STARTING when the spawner
 * starts its process (an external one starts out STARTING); STARTING ->
 * LOADING at its Register and LOADING -> READY once its models have loaded
 * (the roster); any state -> DOWN when it is lost (the supervisor), and an
 * external worker then waits in STARTING for its next Register; a spawn
 * that fails leaves it DOWN (the spawner). */
#ifndef BATON_DAEMON_WORKERS_H
#define BATON_DAEMON_WORKERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "config/config.h"
#include "proto/baton.pb-c.h"

/* The longest routing id a ZeroMQ ROUTER gives or takes. */
#define WORKERS_ROUTE_MAX 255

typedef enum sup_state {
    SUP_DOWN = 0,      /* not running; maybe waiting for a restart */
    SUP_STARTING = 1,  /* spawned (or expected), no Register yet */
    SUP_LOADING = 2,   /* registered, Loads outstanding */
    SUP_READY = 3      /* every model loaded */
} sup_state;

typedef struct sup_worker {
    int index;                    /* workers.c: its place in the config */
    const cfg_worker *cfg;        /* workers.c: borrowed from the config */
    sup_state state;              /* see the top of this file */
    /* spawner.c: its process. */
    pid_t pid;                    /* 0 for external workers or when not running */
    uint32_t incarnation;         /* 1, 2, ...: bumped at every spawn; < 2^16 */
    char shm_name[128];           /* its pool's POSIX shm name, unlinked when it dies; derived
                                     at a spawn, replaced by the registered one (roster.c) */
    uint64_t started_ms;          /* spawn time, monotonic ms */
    uint64_t restart_at_ms;       /* when DOWN: when to spawn again (0: never) */
    uint32_t backoff_ms;          /* next restart delay */
    uint64_t restarts;            /* times it was restarted (metric); an external worker's
                                     are counted by supervisor.c */
    char key_public[41];          /* its CURVE public key this incarnation, or "" */
    /* roster.c: what it registered and loaded, and what it last said. */
    char hostname[64];            /* as it registered (its `host:`, else gethostname) */
    char peer_endpoint[256];      /* as it registered: where peers on other hosts pull its
                                     tensors; "" when it has none */
    char curve_public_key[41];    /* as it registered (Z85), for its peers' CURVE; "" when none */
    uint64_t pool_bytes;
    Baton__V1__PoolHandle *pools; /* owned copies of its registered pools */
    size_t n_pools;
    uint32_t loads_pending;
    uint32_t registrations;       /* times it registered (names one registration) */
    uint64_t last_seen_ms;        /* last message from it, monotonic ms; set by supervisor.c
                                     as each message is read, restarted by a spawn */
    /* From its last Heartbeat. */
    uint64_t pool_used, pool_free, largest_free; /* bytes */
    double fragmentation;         /* 0..1 */
    uint32_t live_tensors, queued;
    uint64_t staged_bytes;        /* copied to assemble inputs, this incarnation */
    uint32_t sessions;            /* backend sessions open */
    uint64_t tp_steps;            /* tensor-parallel steps run as a follower, this incarnation */
    uint64_t ipc_ahead;           /* peers' CUDA pools opened when Peers came, this incarnation */
    uint64_t ipc_on_request;      /* ... opened on a request's path, this incarnation */
    uint64_t inline_batches;      /* batches its I/O thread ran, this incarnation */
    /* What its Loaded messages of this incarnation said, one paragraph per
     * model (load time, weights, the backend's report), for inspect; owned,
     * NULL when nothing has loaded. */
    char *loads_text;
    /* supervisor.c. */
    bool told_to_restart;         /* external, lost, then heard from: Shutdown sent */
    char auth_key[41];            /* the CURVE public key (Z85) its last accepted Register
                                     authenticated with; "" without CURVE or before one */
    uint64_t msgs_in, zmq_in;     /* WorkerMessages read from it, and the ZeroMQ messages
                                     that carried them (several when it corked); counters */
    /* workers.c. */
    uint64_t msgs_out, zmq_out;   /* ConductorMessages sent to it, and the ZeroMQ messages
                                     that carried them; counters */
    uint8_t route[WORKERS_ROUTE_MAX]; /* the worker ROUTER's routing id of the connection its
                                     last accepted Register came on; route_len 0: none yet */
    size_t route_len;
} sup_worker;

typedef struct worker_set worker_set;

/* The records of CFG's workers, each DOWN (spawned) or STARTING
 * (external), and SOCKET, the bound worker ROUTER; both borrowed.  0 or
 * BT_ENOMEM. */
int workers_create(const cfg_config *cfg, void *socket, worker_set **out);
/* Frees the records, not what the roster registered in them. */
void workers_destroy(worker_set *ws);

size_t workers_count(const worker_set *ws);
sup_worker *workers_at(worker_set *ws, int w);
/* The worker named NAME, or NULL. */
sup_worker *workers_named(worker_set *ws, const char *name);
/* The worker whose route (the routing id of the connection it registered
 * on) is ID, or NULL. */
sup_worker *workers_by_id(worker_set *ws, const void *id, size_t len);
/* Routes what goes to worker W to the connection whose routing id is ID
 * (LEN at most WORKERS_ROUTE_MAX: ZeroMQ's own limit): set when a Register
 * from that connection is accepted.  The routing ids are the worker
 * ROUTER's own, one per connection, never the worker's choice. */
void workers_set_route(worker_set *ws, int w, const void *id, size_t len);
/* Tells the connection whose routing id is ID, which no worker may
 * register on, to shut down, saying REASON (best effort). */
void workers_refuse(worker_set *ws, const void *id, size_t len, const char *reason);
/* Registered and not lost since: LOADING or READY. */
bool workers_live(const sup_worker *w);

/* Sends M to worker W.  0, or BT_EIO (logged) when it cannot go, or
 * BT_ENOMEM.  Between workers_cork and workers_uncork M is only packed
 * and kept (0, or BT_ENOMEM); a failure to send is then logged at the
 * uncork, and the worker's loss, seen as for any worker that vanished
 * after a send, ends what it held. */
int workers_send(worker_set *ws, int w, const Baton__V1__ConductorMessage *m);
/* From workers_cork to workers_uncork the messages for each worker are
 * kept, in order, and the uncork sends each worker's as the frames of one
 * ZeroMQ message: one wake-up of the worker and one send for what a round
 * of the conductor's loop had for it (a Put and its Dispatch, a request's
 * Releases and SessionClose, the Extends of a burst of Dones), where
 * separate messages each cost both processes a system call and a switch. */
void workers_cork(worker_set *ws);
/* Sends what the outboxes hold (see workers_send_deferred) and returns
 * how many workers it could not send to, their indices in *FAILED
 * (valid until the next uncork): a worker the ROUTER has no route to. */
size_t workers_uncork(worker_set *ws, const int **failed);
/* As workers_send, for a message nobody waits for (a Release, a
 * SessionClose): while corked it waits for the next other message to the
 * same worker and goes in front of it, or for workers_flush_deferred, or
 * for DEFER_MAX of its kind; so a request's closing messages, or a decode
 * loop's Releases, cost no wake-up of their own, riding with the next
 * Dispatch or Extend. */
int workers_send_deferred(worker_set *ws, int w, const Baton__V1__ConductorMessage *m);
/* The conductor's tick: deferred messages that waited through the tick
 * before go at the next uncork (nothing waits more than two ticks); the
 * others still get a tick's time to find company. */
void workers_flush_deferred(worker_set *ws);
/* Whether some deferred message waits. */
bool workers_deferred(const worker_set *ws);
/* Worker W was lost: its deferred messages go unsent, so that a restarted
 * incarnation never hears of the tensors and sessions of the one before. */
void workers_drop_deferred(worker_set *ws, int w);
/* Tells worker W to exit, saying why (REASON). */
void workers_send_shutdown(worker_set *ws, int w, const char *reason);

#endif
