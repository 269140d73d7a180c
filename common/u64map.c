#include "common/u64map.h"

#include <stdlib.h>

#include "common/status.h"

#define TOMB UINT64_MAX

/* Request keys are often sequential: the finalizer spreads them. */
uint64_t u64map_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

void u64map_init(u64map *m)
{
    m->keys = NULL;
    m->vals = NULL;
    m->cap = m->n = m->used = 0;
}

void u64map_free(u64map *m)
{
    free(m->keys);
    free(m->vals);
    u64map_init(m);
}

static int grow(u64map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 16;
    if (m->n * 4 < m->cap)
        cap = m->cap; /* mostly tombstones: rehash at the same size */
    uint64_t *keys = calloc(cap, sizeof(*keys));
    void **vals = calloc(cap, sizeof(*vals));
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return BT_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        uint64_t k = m->keys[i];
        if (k == 0 || k == TOMB)
            continue;
        size_t j = u64map_mix(k) & (cap - 1);
        while (keys[j])
            j = (j + 1) & (cap - 1);
        keys[j] = k;
        vals[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    m->used = m->n;
    return 0;
}

static size_t find(const u64map *m, uint64_t key)
{
    if (!m->cap)
        return SIZE_MAX;
    size_t j = u64map_mix(key) & (m->cap - 1);
    while (m->keys[j]) {
        if (m->keys[j] == key)
            return j;
        j = (j + 1) & (m->cap - 1);
    }
    return SIZE_MAX;
}

int u64map_put(u64map *m, uint64_t key, void *val)
{
    size_t j = find(m, key);
    if (j != SIZE_MAX) {
        m->vals[j] = val;
        return 0;
    }
    if ((m->used + 1) * 4 > m->cap * 3) {
        int rc = grow(m);
        if (rc)
            return rc;
    }
    j = u64map_mix(key) & (m->cap - 1);
    while (m->keys[j] && m->keys[j] != TOMB)
        j = (j + 1) & (m->cap - 1);
    if (m->keys[j] == 0)
        m->used++;
    m->keys[j] = key;
    m->vals[j] = val;
    m->n++;
    return 0;
}

void *u64map_get(const u64map *m, uint64_t key)
{
    size_t j = find(m, key);
    return j == SIZE_MAX ? NULL : m->vals[j];
}

void *u64map_del(u64map *m, uint64_t key)
{
    size_t j = find(m, key);
    if (j == SIZE_MAX)
        return NULL;
    void *v = m->vals[j];
    m->keys[j] = TOMB;
    m->vals[j] = NULL;
    m->n--;
    return v;
}

int u64map_next(const u64map *m, size_t *pos, uint64_t *key, void **val)
{
    for (size_t i = *pos; i < m->cap; i++) {
        if (m->keys[i] && m->keys[i] != TOMB) {
            *key = m->keys[i];
            *val = m->vals[i];
            *pos = i + 1;
            return 1;
        }
    }
    *pos = m->cap;
    return 0;
}

int u64map_count_add(u64map *m, uint64_t key)
{
    uintptr_t n = (uintptr_t)u64map_get(m, key);
    return u64map_put(m, key, (void *)(n + 1));
}

void u64map_count_sub(u64map *m, uint64_t key)
{
    uintptr_t n = (uintptr_t)u64map_get(m, key);
    if (n > 1)
        u64map_put(m, key, (void *)(n - 1));
    else if (n == 1)
        u64map_del(m, key);
}
