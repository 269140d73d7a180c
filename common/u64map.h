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

#endif
