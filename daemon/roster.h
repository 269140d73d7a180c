/* The workers' registrations and what they report: Register (pools, host,
 * endpoints), Peers to every live worker, one Load per model placed on a
 * worker and its Loaded, readiness (every worker has loaded every model),
 * Heartbeats, and how long a worker may stay silent.
 *
 * It owns the registration fields of the worker records (daemon/workers.h)
 * and the daemon's readiness.  A Load of a tensor-parallel rank above 0
 * waits for its group's id (daemon/tpgroups.h).  What goes beyond a
 * registration goes out through roster_hooks: readiness changes, and a
 * worker that registers again while live, which must be lost or taken
 * down first. */
#ifndef BATON_DAEMON_ROSTER_H
#define BATON_DAEMON_ROSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "config/graph.h"
#include "daemon/pairs.h"
#include "daemon/tpgroups.h"
#include "daemon/workers.h"
#include "proto/baton.pb-c.h"

typedef struct roster_hooks {
    void *arg;
    /* Every worker is ready (READY), or one no longer is. */
    void (*ready_changed)(void *arg, bool ready);
    /* Live worker W registered again (WHY): what it held is gone.  LOST
     * declares it lost; TAKE_DOWN, for a rank of a tensor-parallel group,
     * also makes its process go, since it keeps models loaded on a
     * communicator the rest of its group is about to leave. */
    void (*lost)(void *arg, sup_worker *w, const char *why);
    void (*take_down)(void *arg, sup_worker *w, const char *why);
} roster_hooks;

typedef struct roster roster;

/* CFG, GS, WS, GROUPS and PAIRS are borrowed; GS (the graphs, for which
 * peers' pools each worker reads) may be NULL.  0 or BT_ENOMEM. */
int roster_create(const cfg_config *cfg, const graph_set *gs, worker_set *ws, tp_groups *groups,
                  pair_table *pairs, const roster_hooks *hooks, roster **out);
/* Frees what every worker registered, and the roster. */
void roster_destroy(roster *r);

/* Worker W sent Register: unless it speaks another protocol (told to shut
 * down) or must be taken down, it is LOADING, every live worker gets
 * Peers, and W its Loads. */
void roster_on_register(roster *r, sup_worker *w, const Baton__V1__Register *rg);
/* Worker W loaded a model, or failed to (it then stays LOADING: health
 * says why the daemon is not ready). */
void roster_on_loaded(roster *r, sup_worker *w, const Baton__V1__Loaded *ld);
void roster_on_heartbeat(sup_worker *w, const Baton__V1__Heartbeat *h);

/* Sends rank K of model M (an index into the config's models), worker W,
 * its Load.  0, or a negative bt_err. */
int roster_send_load(roster *r, sup_worker *w, size_t m, size_t k);
/* Sends every live worker the list of workers (Peers), with the peers
 * whose tensors the graphs can bring to it (Peers.reads_from). */
void roster_send_peers(roster *r);
/* Forgets what W's last incarnation registered and loaded. */
void roster_forget(sup_worker *w);

/* Reads the workers' states anew and tells roster_hooks.ready_changed
 * when readiness changed. */
void roster_update_ready(roster *r);
bool roster_ready(const roster *r);

/* W has been silent at NOW_MS longer than a worker of its kind may be: an
 * external one, live, missed three heartbeats (there is no pid to watch);
 * a running spawned one said nothing for 10 s and is presumed hung. */
bool roster_silent(const sup_worker *w, uint64_t now_ms);

#endif
