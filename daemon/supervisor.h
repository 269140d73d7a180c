/* Worker supervision.  The supervisor owns the workers: it spawns the
 * `spawn: auto` ones as children running the baton-worker beside batond,
 * reads every message on the worker socket, takes Register (pools, host),
 * checks that a Register's key may speak for the worker it names
 * (identity.c), routes each worker's messages to the connection it
 * registered on, sends Peers and one Load per model, tracks readiness and
 * heartbeats, and
 * when a worker is lost (exit, kill, silence) unlinks its pool segment and
 * restarts it within a second, then with back-off.
 *
 * It is the face of the files below it, each with a concern and the state
 * that goes with it, which it creates, owns and wires together (lowest
 * first; each calls only those listed before it):
 *
 *   pairs.c     the pair communicators of cross-host GPU transfers
 *   workers.c   the worker records (sup_worker) and sending to a worker
 *   identity.c  which key may register as which worker
 *   spawner.c   the processes: posix_spawn, key pairs, exits, restart back-off
 *   tpgroups.c  the groups of tensor-parallel models: ids, their ranks' Loads,
 *               relayed steps, a group taken down when a member is lost
 *   roster.c    registration: Register, Peers, Load/Loaded, readiness,
 *               heartbeats and silence
 *
 * What one of them must have done above it (a rank's Load once its group
 * has an id, a worker taken down or lost) comes here through its hooks,
 * which only this file fills.  This file reads the worker socket and hands
 * each message to its module, and keeps what spans them: a worker lost
 * (every module forgets it), a worker taken down, the tick, and shutdown.
 *
 * It knows nothing of requests.  What the rest of the conductor must hear
 * goes out through sup_hooks: readiness changes, a lost worker, and the
 * result messages (Done, Chunk, Placed, Fetched) of live workers.  The
 * worker state others need is read through sup_worker_get(), never written. */
#ifndef BATON_DAEMON_SUPERVISOR_H
#define BATON_DAEMON_SUPERVISOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "config/config.h"
#include "config/graph.h"
#include "common/curve.h"
#include "common/evloop.h"
#include "daemon/workers.h"
#include "proto/baton.pb-c.h"

typedef struct sup_hooks {
    void *arg;
    /* Every worker is ready (READY), or one no longer is. */
    void (*ready_changed)(void *arg, bool ready);
    /* Worker W is lost (already DOWN): whatever it held is gone. */
    void (*worker_lost)(void *arg, int w, const char *why);
    /* A Done, Chunk, Placed or Fetched from live worker W. */
    void (*message)(void *arg, int w, const Baton__V1__WorkerMessage *m);
    /* Around the messages read in one go: whatever their handling sends
     * may be held until the end and sent in one message per worker. */
    void (*burst_begin)(void *arg);
    void (*burst_end)(void *arg);
    /* With CURVE on the worker socket (sup_options.curve_server_public):
     * a spawn made the key pair NEW_PUBLIC for its worker, whose previous
     * one, OLD_PUBLIC (NULL at the first spawn), goes.  The hook authorizes
     * the one and forgets the other; a negative bt_err fails the spawn.
     * NEW_PUBLIC NULL: the worker was lost, OLD_PUBLIC only goes.  May be
     * NULL without CURVE. */
    int (*authorize)(void *arg, const char *old_public, const char *new_public);
    /* With CURVE on the worker socket: the keys of its authorized-keys
     * file (worker_keys), whose names bind keys to workers
     * (daemon/identity.h).  May be NULL: no file. */
    const bt_curve_keyset *(*worker_keys)(void *arg);
} sup_hooks;

typedef struct sup_options {
    const cfg_config *cfg;        /* borrowed; outlives the supervisor */
    const char *config_path;      /* absolute; passed to the workers */
    const char *run_id;           /* names this run's shm segments */
    const char *worker_exe;       /* the baton-worker to spawn */
    void *socket;                 /* the bound worker ROUTER; borrowed */
    const char *curve_server_public; /* batond's public key (Z85) when the worker socket is
                                      * a CURVE server: each spawn then gets a fresh key
                                      * pair through an inherited pipe (see spawner.c);
                                      * NULL: none */
    bool curve_socket;            /* the worker socket itself is a CURVE server (a tcp://
                                     endpoint with daemon.curve): each Register is checked
                                     against the key its connection authenticated with */
    const graph_set *gs;          /* borrowed; outlives the supervisor: which peers' pools
                                     each worker reads (Peers.reads_from); NULL: none named */
} sup_options;

typedef struct supervisor supervisor;

/* The worker executable into BUF: $BATON_WORKER, else baton-worker beside
 * the running program.  0 or BT_EIO. */
int sup_worker_exe(char *buf, size_t len);

/* Checks that EXE can serve the device of every worker of CFG that batond
 * spawns: when one names cuda:N, runs `EXE --devices` once and reports
 * each worker it cannot serve into DIAG at its line, so that a deployment
 * is refused up front instead of a worker failing and restarting forever.
 * Returns 0 or BT_ECONFIG. */
int sup_check_devices(const cfg_config *cfg, const char *exe, bt_diag *diag);

/* 0 or BT_ENOMEM.  Spawns nothing yet: see sup_start. */
int sup_create(const sup_options *opt, const sup_hooks *hooks, supervisor **out);
void sup_destroy(supervisor *s);

/* Spawns every `spawn: auto` worker. */
void sup_start(supervisor *s);
/* The worker socket is readable (an evloop callback; ARG is the supervisor). */
void sup_on_readable(evloop *l, void *arg);
/* A child exited (from waitpid); ignored when it is no worker. */
void sup_child_exited(supervisor *s, pid_t pid, int status);
/* Restarts due workers, kills silent ones, loses external ones whose
 * heartbeat stopped. */
void sup_tick(supervisor *s, uint64_t now_ms);

/* Sends M to worker W.  0, or BT_EIO (logged) when it cannot go. */
int sup_send(supervisor *s, int w, const Baton__V1__ConductorMessage *m);
/* Between the two, what sup_send is given for a worker is kept and then
 * sent as one ZeroMQ message (daemon/workers.h): the conductor corks each
 * round of its loop.  A worker that cannot be sent to at the uncork is
 * taken down (declared lost; a spawned one is killed and restarted, an
 * external one told to restart). */
void sup_cork(supervisor *s);
void sup_uncork(supervisor *s);
/* As sup_send, for a message nobody waits for (Release, SessionClose): it
 * rides with the next message to W, or goes at the next tick. */
int sup_send_deferred(supervisor *s, int w, const Baton__V1__ConductorMessage *m);
/* Whether such a message waits for the next tick. */
bool sup_deferred(const supervisor *s);

size_t sup_n_workers(const supervisor *s);
const sup_worker *sup_worker_get(const supervisor *s, int w);
/* Why the tensor-parallel group of config model M is held back (a rank's
 * load failed), or NULL. */
const char *sup_group_held(const supervisor *s, size_t m);
/* Reserves N consecutive transfer numbers on the NCCL communicator of
 * workers A and B (daemon/pairs.h): the first in *SEQ, the communicator's
 * epoch in *EPOCH.  False when the pair has none (yet). */
bool sup_pair_reserve(supervisor *s, int a, int b, uint32_t n, uint32_t *epoch, uint64_t *seq);
bool sup_ready(const supervisor *s);
/* Registers refused for VERDICT (an ident_verdict) since start. */
uint64_t sup_registrations_refused(const supervisor *s, int verdict);

/* Shutdown: tells every worker to stop (REASON in the message) and stops
 * restarting them. */
void sup_stop(supervisor *s, const char *reason);
/* Every worker process has exited. */
bool sup_all_exited(const supervisor *s);
/* Kills what is still running and unlinks every pool segment. */
void sup_kill_all(supervisor *s);
/* batond goes without a drain (its loop failed, or it could not start), or
 * after one: the workers it spawned are killed and waited for, and their
 * pool segments unlinked, so that nothing of them outlives it.  Workers of
 * `spawn: external`, which batond does not own, are left alone.  After
 * sup_kill_all there is nothing left for it to do. */
void sup_kill_spawned(supervisor *s);

#endif
