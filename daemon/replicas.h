/* Replicas: a model placed on several workers without `tp` holds a full
 * copy on each, and every request runs on one of them.
 *
 * A request is pinned to a replica of a model the first time it needs that
 * model (an input placed there, or a node dispatched), and every later node
 * of the same request and model goes to the same replica: a decode loop
 * stays where its KV cache is.  The pick is made among the replicas that
 * are READY, by the model's `routing`:
 *   least_loaded  the fewest pinned requests per max_batch (a worker's load
 *                 counts the pins of every replicated model it holds);
 *   round_robin   the next ready replica in the order listed;
 *   cache_aware   the replica whose reported prefix cache holds the longest
 *                 prefix of the request's routing key, unless that replica
 *                 is loaded more than max_batch requests beyond the least
 *                 loaded one; with no match, least loaded.
 *
 * The prefix index of each replica is what its worker reported (block
 * hashes stored and evicted; replicas_cache_event): the conductor never
 * guesses what a worker holds.
 *
 * It owns the pins and the counters; the config is borrowed, and which
 * workers are READY it asks through a callback (the supervisor's states in
 * batond, a table in tests). */
#ifndef BATON_DAEMON_REPLICAS_H
#define BATON_DAEMON_REPLICAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config/config.h"

typedef struct replicas replicas;

/* What a pick was decided by. */
typedef enum replicas_reason {
    REPLICAS_BY_CACHE = 0,   /* the longest cached prefix */
    REPLICAS_BY_LOAD = 1,    /* the least loaded (no match, an overloaded match, or the policy) */
    REPLICAS_BY_TURN = 2,    /* round robin */
    REPLICAS_N_REASONS = 3
} replicas_reason;

/* A request's routing key: the chained hashes of its prompt's blocks
 * (common/prefix.h), longest last.  Borrowed for the call. */
typedef struct replicas_key {
    const uint64_t *hashes;
    size_t n;
} replicas_key;

/* Is worker W READY (registered, every model loaded)? */
typedef bool (*replicas_ready_fn)(void *arg, int w);

/* CFG is borrowed and must outlive it; READY(ARG, w) is asked at each
 * pick.  0 or BT_ENOMEM. */
int replicas_create(const cfg_config *cfg, replicas_ready_fn ready, void *arg, replicas **out);
void replicas_destroy(replicas *rs);

/* The replica (a worker index) of model MODEL for request REQ: the one REQ
 * is pinned to, else a new pick by the model's routing, which REQ is pinned
 * to from now on.  KEY may be NULL (no prefix to match).  -1 when no
 * replica is READY (nothing is pinned then), or MODEL is not replicated. */
int replicas_pick(replicas *rs, uint64_t req, int model, const replicas_key *key);
/* The replica REQ is pinned to for MODEL, or -1. */
int replicas_pinned(const replicas *rs, uint64_t req, int model);
/* REQ ended: its pins go, and with them their load.  Unknown keys are
 * ignored. */
void replicas_unpin(replicas *rs, uint64_t req);
/* The requests pinned to worker W, in *KEYS (malloc'ed, the caller frees).
 * 0 or BT_ENOMEM. */
int replicas_pinned_to(const replicas *rs, int w, uint64_t **keys, size_t *n);

/* Worker W reported that its copy of MODEL (a name) now holds the prefix
 * blocks STORED and no longer holds REMOVED.  Unknown models and workers
 * that are no replica of them are ignored.  0 or BT_ENOMEM (the index is
 * then incomplete, which only costs cache hits). */
int replicas_cache_event(replicas *rs, int w, const char *model, const uint64_t *stored,
                         size_t n_stored, const uint64_t *removed, size_t n_removed);
/* Worker W was lost or registered again: what it reported is gone. */
void replicas_worker_reset(replicas *rs, int w);

/* Per replica of model MODEL (index K in its workers list): requests pinned
 * now, picks by reason, and blocks in its reported index.  False past the
 * last replica or for a model that is not replicated. */
typedef struct replicas_stats {
    int worker;
    uint32_t pinned;
    uint64_t picks[REPLICAS_N_REASONS];
    size_t cached_blocks;
} replicas_stats;
bool replicas_stats_get(const replicas *rs, int model, size_t k, replicas_stats *out);

/* The replicas section of `batonctl inspect`: per replicated model its
 * routing, and per replica its state, pins, picks and reported blocks. */
void replicas_print(const replicas *rs, FILE *f);

const char *replicas_reason_name(replicas_reason r);

#endif
