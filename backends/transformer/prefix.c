/* The transformer's prefix cache: index, LRU and budget
 * (backends/transformer/prefix.h). */
#include "backends/transformer/prefix.h"

#include <stdlib.h>
#include <string.h>

#include "common/prefix.h"
#include "common/u64map.h"
#include "common/vec.h"

typedef struct u64vec {
    uint64_t *v;
    size_t n, cap;
} u64vec;

struct pc_cache {
    uint64_t budget;            /* bytes of host memory entries may hold */
    uint64_t bytes_per_token;   /* of KV, every layer */
    pc_entry **entries;         /* owned, in no order */
    size_t n_entries, cap_entries;
    u64map blocks;              /* block hash -> entries holding it (a count in the pointer) */
    uint64_t clock;             /* LRU */
    pc_stats st;
    u64vec stored, removed;     /* routing keys since the last pc_events */
    u64vec out_stored, out_removed; /* what pc_events handed out */
};

pc_cache *pc_create(uint64_t budget, uint64_t bytes_per_token)
{
    pc_cache *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->budget = budget;
    c->bytes_per_token = bytes_per_token;
    u64map_init(&c->blocks);
    return c;
}

static void entry_free(pc_entry *e)
{
    if (!e)
        return;
    free(e->ids);
    free(e->hashes);
    free(e->keys);
    free(e->host);
    free(e);
}

uint64_t pc_budget(const pc_cache *c)
{
    return c->budget;
}

void pc_destroy(pc_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_entries; i++)
        entry_free(c->entries[i]);
    free(c->entries);
    u64map_free(&c->blocks);
    free(c->stored.v);
    free(c->removed.v);
    free(c->out_stored.v);
    free(c->out_removed.v);
    free(c);
}

/* Appends the N keys to V; out of memory loses them (the conductor's index
 * then misses a prefix, which costs a cache hit, nothing else). */
static void keys_push(u64vec *v, const uint64_t *keys, size_t n)
{
    if (n && BT_RESERVE_N(v->v, v->n, v->cap, n, 64) == 0) {
        memcpy(v->v + v->n, keys, n * sizeof(*keys));
        v->n += n;
    }
}

static pc_entry *entry_make(pc_cache *c, const int32_t *ids, int len, const uint64_t *keys,
                            size_t n_keys)
{
    if (len < BT_PREFIX_TOKENS || BT_RESERVE(c->entries, c->n_entries, c->cap_entries, 16))
        return NULL;
    pc_entry *e = calloc(1, sizeof(*e));
    int nb = len / BT_PREFIX_TOKENS;
    if (!e || !(e->ids = malloc((size_t)len * sizeof(*ids))) ||
        !(e->hashes = malloc((size_t)nb * sizeof(*e->hashes))) ||
        (n_keys && !(e->keys = malloc(n_keys * sizeof(*keys))))) {
        entry_free(e);
        return NULL;
    }
    memcpy(e->ids, ids, (size_t)len * sizeof(*ids));
    e->len = len;
    e->n_blocks = (int)bt_prefix_hashes(ids, (size_t)len * sizeof(*ids),
                                        BT_PREFIX_TOKENS * sizeof(*ids), e->hashes, (size_t)nb);
    if (n_keys)
        memcpy(e->keys, keys, n_keys * sizeof(*keys));
    e->n_keys = n_keys;
    for (int j = 0; j < e->n_blocks; j++) {
        if (u64map_count_add(&c->blocks, e->hashes[j]) < 0) {
            /* Undo the blocks counted so far: the index must match the
             * entries exactly. */
            for (int x = 0; x < j; x++)
                u64map_count_sub(&c->blocks, e->hashes[x]);
            entry_free(e);
            return NULL;
        }
    }
    e->used = ++c->clock;
    c->entries[c->n_entries++] = e;
    c->st.entries++;
    c->st.bytes += (uint64_t)len * c->bytes_per_token;
    return e;
}

pc_entry *pc_add(pc_cache *c, const int32_t *ids, int len, const uint64_t *keys,
                 size_t n_keys, int slot)
{
    pc_entry *e = entry_make(c, ids, len, keys, n_keys);
    if (e)
        e->slot = slot;
    return e;
}

void pc_remove(pc_cache *c, pc_entry *e, bool evicted)
{
    size_t i = 0;
    while (i < c->n_entries && c->entries[i] != e)
        i++;
    if (i == c->n_entries)
        return;
    c->entries[i] = c->entries[--c->n_entries];
    for (int j = 0; j < e->n_blocks; j++)
        u64map_count_sub(&c->blocks, e->hashes[j]);
    keys_push(&c->removed, e->keys, e->n_keys);
    if (e->slot < 0)
        c->st.host_bytes -= e->host_bytes;
    c->st.evictions += evicted;
    c->st.entries--;
    c->st.bytes -= (uint64_t)e->len * c->bytes_per_token;
    entry_free(e);
}

/* Drops the host entries least recently used, not pinned, until BYTES more
 * fit the budget; false when they cannot. */
static bool make_room(pc_cache *c, size_t bytes)
{
    if (bytes > c->budget)
        return false;
    while (c->st.host_bytes + bytes > c->budget) {
        pc_entry *old = NULL;
        for (size_t i = 0; i < c->n_entries; i++) {
            pc_entry *e = c->entries[i];
            if (e->slot < 0 && !e->pinned && (!old || e->used < old->used))
                old = e;
        }
        if (!old)
            return false;
        pc_remove(c, old, true);
    }
    return true;
}

pc_entry *pc_add_host(pc_cache *c, const int32_t *ids, int len, const uint64_t *keys,
                      size_t n_keys, void *host, size_t bytes)
{
    if (len < BT_PREFIX_TOKENS || !make_room(c, bytes))
        return NULL;
    pc_entry *e = entry_make(c, ids, len, keys, n_keys);
    if (!e)
        return NULL;
    e->slot = -1;
    e->host = host;
    e->host_bytes = bytes;
    c->st.host_bytes += bytes;
    return e;
}

bool pc_move_to_host(pc_cache *c, pc_entry *e, void *host, size_t bytes)
{
    e->pinned = true; /* make_room must not drop the entry being moved */
    bool ok = make_room(c, bytes);
    e->pinned = false;
    if (!ok)
        return false;
    e->slot = -1;
    e->host = host;
    e->host_bytes = bytes;
    c->st.host_bytes += bytes;
    return true;
}

pc_entry *pc_match(pc_cache *c, const int32_t *ids, int n, int *len)
{
    *len = 0;
    int nb = n / BT_PREFIX_TOKENS;
    uint64_t *h = nb ? malloc((size_t)nb * sizeof(*h)) : NULL;
    pc_entry *best = NULL;
    if (h) {
        bt_prefix_hashes(ids, (size_t)n * sizeof(*ids), BT_PREFIX_TOKENS * sizeof(*ids), h,
                         (size_t)nb);
        /* The longest chain some entry holds; then, among the entries
         * holding it, the one whose ids go on matching furthest. */
        int j = nb;
        while (j > 0 && !u64map_get(&c->blocks, h[j - 1]))
            j--;
        for (size_t i = 0; j > 0 && i < c->n_entries; i++) {
            pc_entry *e = c->entries[i];
            if (e->n_blocks < j || e->hashes[j - 1] != h[j - 1])
                continue;
            int k = 0, lim = e->len < n ? e->len : n;
            while (k < lim && e->ids[k] == ids[k])
                k++;
            if (k < j * BT_PREFIX_TOKENS)
                continue; /* a hash collision: not this prefix */
            if (k > *len || (k == *len && best && e->used > best->used)) {
                best = e;
                *len = k;
            }
        }
    }
    free(h);
    if (best && *len >= n)
        *len = n - 1;
    if (best && *len < 1)
        best = NULL;
    if (best) {
        c->st.hits++;
        c->st.hit_tokens += (uint64_t)*len;
        best->used = ++c->clock;
    } else {
        c->st.misses++;
        *len = 0;
    }
    return best;
}

void pc_touch(pc_cache *c, pc_entry *e)
{
    e->used = ++c->clock;
}

pc_entry *pc_in_slot(pc_cache *c, int slot)
{
    for (size_t i = 0; i < c->n_entries; i++)
        if (c->entries[i]->slot == slot)
            return c->entries[i];
    return NULL;
}

pc_entry *pc_oldest_resident(pc_cache *c)
{
    pc_entry *old = NULL;
    for (size_t i = 0; i < c->n_entries; i++) {
        pc_entry *e = c->entries[i];
        if (e->slot >= 0 && !e->pinned && (!old || e->used < old->used))
            old = e;
    }
    return old;
}

void pc_keys_event(pc_cache *c, const uint64_t *keys, size_t n, bool stored)
{
    keys_push(stored ? &c->stored : &c->removed, keys, n);
}

void pc_stats_get(const pc_cache *c, pc_stats *out)
{
    *out = c->st;
}

bool pc_events(pc_cache *c, const uint64_t **stored, size_t *n_stored, const uint64_t **removed,
               size_t *n_removed)
{
    u64vec t = c->out_stored;
    c->out_stored = c->stored;
    c->stored = (u64vec){t.v, 0, t.cap};
    t = c->out_removed;
    c->out_removed = c->removed;
    c->removed = (u64vec){t.v, 0, t.cap};
    *stored = c->out_stored.v;
    *n_stored = c->out_stored.n;
    *removed = c->out_removed.v;
    *n_removed = c->out_removed.n;
    return *n_stored || *n_removed;
}
