/* The transformer's prefix cache: the KV of requests that ended, kept for
 * later requests whose tokens begin the same way.
 *
 * An entry is the KV of one ended request's tokens (prompt and output):
 * its token ids, the chained hashes of their full blocks of
 * BT_PREFIX_TOKENS (common/prefix.h), and where its KV is: in a decode slot
 * that no session holds (resident: a later request takes the slot over and
 * reads the prefix in place), or in host memory, within the budget (moved
 * there when a session needed the slot).  A table from block hash to the
 * number of entries holding it finds the longest cached prefix of a new
 * prompt block by block; the ids are then compared, so a hash collision
 * cannot hand a request another prompt's KV, and the match is extended
 * token by token into the entry's last, partial block.
 *
 * This file keeps the index, the LRU order, the budget and the counters;
 * the backend moves the bytes (backends/transformer/backend.c).  It also
 * queues, for the worker's reports to the conductor, the routing keys of
 * entries that came and went (the hashes of the request's first input's
 * bytes, BT_PREFIX_BYTES a block), from which the conductor routes a new
 * request to the replica holding its prefix. */
#ifndef BATON_TRANSFORMER_PREFIX_H
#define BATON_TRANSFORMER_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pc_entry {
    int32_t *ids;               /* the tokens whose KV it holds; owned */
    int len;
    uint64_t *hashes;           /* of its len / BT_PREFIX_TOKENS full blocks; owned */
    int n_blocks;
    uint64_t *keys;             /* its routing key; owned */
    size_t n_keys;
    int slot;                   /* the decode slot holding its KV; -1: in host memory */
    void *host;                 /* slot < 0: the KV as an evicted session keeps it; owned */
    size_t host_bytes;
    uint64_t used;              /* the cache's clock at its last use */
    bool pinned;                /* being read: not to be evicted now */
} pc_entry;

typedef struct pc_stats {
    uint64_t hits, misses;      /* prompts that reused a cached prefix, and that did not */
    uint64_t hit_tokens;        /* prompt tokens read from the cache */
    uint64_t evictions;         /* entries dropped for room (slot or budget) */
    uint64_t host_bytes;        /* bytes of entries in host memory now */
    uint64_t bytes;             /* bytes of KV every entry holds, resident or not */
    uint64_t entries;           /* entries now, resident or not */
} pc_stats;

typedef struct pc_cache pc_cache;

/* A cache keeping at most BUDGET bytes in host memory, of KV that takes
 * BYTES_PER_TOKEN a token.  NULL when out of memory. */
pc_cache *pc_create(uint64_t budget, uint64_t bytes_per_token);
uint64_t pc_budget(const pc_cache *c);
void pc_destroy(pc_cache *c);

/* Adds the KV of LEN tokens IDS that sits in decode slot SLOT, with the
 * routing key KEYS (copied; reported stored by pc_keys_event when its
 * prompt ran, and reported removed with the entry).  NULL when out of memory, or LEN is under one
 * block (nothing a later prompt could find). */
pc_entry *pc_add(pc_cache *c, const int32_t *ids, int len, const uint64_t *keys,
                 size_t n_keys, int slot);
/* The same for KV in host memory (HOST, BYTES: taken over, freed by the
 * cache); the host entries least recently used are dropped to make room.
 * NULL (HOST still the caller's) when BYTES exceed the budget or memory is
 * short. */
pc_entry *pc_add_host(pc_cache *c, const int32_t *ids, int len, const uint64_t *keys,
                      size_t n_keys, void *host, size_t bytes);

/* The entry holding the longest prefix of the N tokens IDS, and in *LEN
 * how many of IDS it holds (at least one block; at most N - 1, since the
 * last token must run for its logits).  NULL when none holds a block.
 * Counts a hit or a miss. */
pc_entry *pc_match(pc_cache *c, const int32_t *ids, int n, int *len);
/* Marks E used now (LRU). */
void pc_touch(pc_cache *c, pc_entry *e);

/* The entry resident in SLOT, or NULL. */
pc_entry *pc_in_slot(pc_cache *c, int slot);
/* The resident entry least recently used and not pinned, or NULL. */
pc_entry *pc_oldest_resident(pc_cache *c);
/* Moves resident E to host memory HOST (BYTES, taken over), dropping the
 * oldest host entries to make room; false (E untouched, HOST still the
 * caller's) when it cannot fit. */
bool pc_move_to_host(pc_cache *c, pc_entry *e, void *host, size_t bytes);
/* Removes E: EVICTED counts it as an eviction (else it was taken over by
 * a request that reads it). */
void pc_remove(pc_cache *c, pc_entry *e, bool evicted);

/* Queues the routing key KEYS for the next pc_events: STORED (a prompt's
 * KV is now here) or removed (a session whose KV is not kept ended). */
void pc_keys_event(pc_cache *c, const uint64_t *keys, size_t n, bool stored);

void pc_stats_get(const pc_cache *c, pc_stats *out);
/* The routing keys stored and removed since the last call, in arrays the
 * cache owns until the next call.  True when there is anything. */
bool pc_events(pc_cache *c, const uint64_t **stored, size_t *n_stored, const uint64_t **removed,
               size_t *n_removed);

#endif
