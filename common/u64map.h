/* An open-addressing hash map from nonzero 64-bit keys to pointers.
 * The conductor keys requests by it; lookups are O(1) on average and the
 * table never shrinks (deleted slots become tombstones, reclaimed on
 * growth). */
#ifndef BATON_COMMON_U64MAP_H
#define BATON_COMMON_U64MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct u64map {
    uint64_t *keys;  /* 0: empty, UINT64_MAX: tombstone */
    void **vals;
    size_t cap;      /* power of two */
    size_t n;        /* live entries */
    size_t used;     /* live + tombstones */
} u64map;

void u64map_init(u64map *m);
void u64map_free(u64map *m);
/* Inserts or replaces.  KEY must not be 0 or UINT64_MAX.  0 or BT_ENOMEM. */
int u64map_put(u64map *m, uint64_t key, void *val);
void *u64map_get(const u64map *m, uint64_t key);
/* Removes KEY; returns its value or NULL. */
void *u64map_del(u64map *m, uint64_t key);
/* Iteration: start with *pos = 0; returns 0 when done. */
int u64map_next(const u64map *m, size_t *pos, uint64_t *key, void **val);

/* A map used as a multiset: the value is a count (in the pointer).  Adds
 * one to KEY's count (0 or BT_ENOMEM), or takes one away (the key goes at
 * 0; absent keys are left alone). */
int u64map_count_add(u64map *m, uint64_t key);
void u64map_count_sub(u64map *m, uint64_t key);

/* splitmix64's finalizer: every bit of X reaches every bit of the result. */
uint64_t u64map_mix(uint64_t x);

#endif
