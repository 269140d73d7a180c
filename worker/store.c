/* The worker's tensor table and request records (store.h). */
#include "worker/store.h"

#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/u64map.h"
#include "common/vec.h"
#include "worker/join.h"

#define COUNTER_BITS 40

struct wk_store {
    wk_device *dev;               /* borrowed: the pool's memory */
    wk_pool *pool;                /* owned: the allocator over it */
    uint64_t incarnation;         /* high bits of every id */
    uint32_t self;                /* this worker's index */
    u64map tensors;               /* id -> wk_tensor */
    u64map requests;              /* key + 1 -> wk_request */
    uint64_t next_counter;        /* low 40 bits of the next tensor id */
    uint32_t n_tensors;           /* live tensors */
};

int wk_store_create(wk_device *dev, uint64_t incarnation, uint32_t self, wk_store **out)
{
    *out = NULL;
    wk_store *s = calloc(1, sizeof(*s));
    if (!s || !(s->pool = wk_pool_create(wk_device_pool_size(dev)))) {
        free(s);
        return BT_ENOMEM;
    }
    s->dev = dev;
    s->incarnation = incarnation;
    s->self = self;
    s->next_counter = 1;
    u64map_init(&s->tensors);
    u64map_init(&s->requests);
    *out = s;
    return 0;
}

void wk_store_destroy(wk_store *s)
{
    if (!s)
        return;
    wk_pool_destroy(s->pool);
    u64map_free(&s->tensors);
    u64map_free(&s->requests);
    free(s);
}

uint32_t wk_store_self(const wk_store *s)
{
    return s->self;
}

void wk_store_set_self(wk_store *s, uint32_t self)
{
    s->self = self;
}

uint32_t wk_store_n_tensors(const wk_store *s)
{
    return s->n_tensors;
}

void wk_store_pool_stats(const wk_store *s, wk_pool_stats *out)
{
    wk_pool_get_stats(s->pool, out);
}

/* u64map reserves 0 and UINT64_MAX; request keys may be 0 (the conductor
 * chooses them), so records are keyed by key + 1 and the one key that
 * cannot be shifted is refused. */
wk_request *wk_store_request(wk_store *s, uint64_t key, bool create)
{
    if (key >= UINT64_MAX - 1)
        return NULL;
    wk_request *r = u64map_get(&s->requests, key + 1);
    if (r || !create)
        return r;
    if (!(r = calloc(1, sizeof(*r))))
        return NULL;
    r->key = key;
    if (u64map_put(&s->requests, key + 1, r) != 0) {
        free(r);
        return NULL;
    }
    return r;
}

void wk_store_request_gc(wk_store *s, wk_request *req)
{
    if (!req || req->tensors || req->n_items || req->sessions || req->chains)
        return;
    u64map_del(&s->requests, req->key + 1);
    free(req->staged);
    free(req);
}

bool wk_store_request_next(wk_store *s, size_t *pos, wk_request **out)
{
    uint64_t key;
    void *val;
    if (!u64map_next(&s->requests, pos, &key, &val))
        return false;
    *out = val;
    return true;
}

wk_tensor *wk_store_tensor_new(wk_store *s, wk_request *req, baton_dtype dtype, uint32_t ndim,
                               const int64_t *dims, bool pin)
{
    uint64_t nbytes = wk_tensor_bytes(dtype, ndim, dims);
    if (nbytes == UINT64_MAX)
        return NULL;
    wk_tensor *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    uint64_t off;
    t->blk = wk_pool_alloc(s->pool, nbytes, &off);
    if (!t->blk) {
        free(t);
        return NULL;
    }
    uint64_t counter = s->next_counter++ & ((UINT64_C(1) << COUNTER_BITS) - 1);
    t->ref = (wk_ref){.own = true, .pool = 0, .offset = off, .nbytes = nbytes,
                      .id = (s->incarnation << COUNTER_BITS) | counter, .dtype = dtype,
                      .ndim = ndim};
    if (ndim)
        memcpy(t->ref.dims, dims, sizeof(int64_t) * ndim);
    if (u64map_put(&s->tensors, t->ref.id, t) != 0) {
        wk_pool_free(s->pool, t->blk);
        free(t);
        return NULL;
    }
    t->req = req;
    t->pins = pin ? 1 : 0;
    t->next = req->tensors;
    if (t->next)
        t->next->prev = t;
    req->tensors = t;
    s->n_tensors++;
    return t;
}

int wk_store_tensor_rekey(wk_store *s, wk_tensor *t, uint64_t id)
{
    if (id == 0 || id == UINT64_MAX || u64map_get(&s->tensors, id))
        return BT_EEXIST;
    if (u64map_put(&s->tensors, id, t) != 0)
        return BT_ENOMEM;
    u64map_del(&s->tensors, t->ref.id);
    t->ref.id = id;
    return 0;
}

wk_tensor *wk_store_tensor_find(wk_store *s, uint64_t id)
{
    if (id == 0 || id == UINT64_MAX)
        return NULL;
    return u64map_get(&s->tensors, id);
}

static void tensor_free(wk_store *s, wk_tensor *t)
{
    wk_request *req = t->req;
    if (t->prev)
        t->prev->next = t->next;
    else
        req->tensors = t->next;
    if (t->next)
        t->next->prev = t->prev;
    wk_device_mark_free(s->dev, t->fill);
    wk_pool_free(s->pool, t->blk);
    free(t);
}

void wk_store_tensor_release(wk_store *s, uint64_t id)
{
    wk_tensor *t = wk_store_tensor_find(s, id);
    if (!t)
        return;
    u64map_del(&s->tensors, id);
    t->released = true;
    s->n_tensors--;
    if (t->pins == 0)
        tensor_free(s, t);
}

void wk_store_tensor_unpin(wk_store *s, wk_tensor *t)
{
    if (t->pins)
        t->pins--;
    if (t->released && t->pins == 0)
        tensor_free(s, t);
}

void *wk_store_tensor_data(const wk_store *s, const wk_tensor *t)
{
    return wk_device_pool_base(s->dev) + t->ref.offset;
}

void wk_store_request_release_all(wk_store *s, wk_request *req)
{
    /* A released tensor that is still pinned stays on the list until its
     * last unpin; skip those rather than loop on them. */
    wk_tensor *t = req->tensors;
    while (t) {
        wk_tensor *n = t->next;
        if (!t->released)
            wk_store_tensor_release(s, t->ref.id);
        t = n;
    }
}

wk_tensor *wk_store_staged_find(wk_store *s, const wk_request *req, const wk_ref *ref)
{
    for (size_t i = 0; i < req->n_staged; i++)
        if (req->staged[i].owner == ref->owner && req->staged[i].src_id == ref->id) {
            wk_tensor *t = wk_store_tensor_find(s, req->staged[i].id);
            return t && !t->released ? t : NULL;
        }
    return NULL;
}

int wk_store_staged_add(wk_request *req, const wk_ref *ref, uint64_t id)
{
    for (size_t i = 0; i < req->n_staged; i++)
        if (req->staged[i].owner == ref->owner && req->staged[i].src_id == ref->id) {
            req->staged[i].id = id;
            return 0;
        }
    if (BT_RESERVE(req->staged, req->n_staged, req->cap_staged, 4) != 0)
        return BT_ENOMEM;
    req->staged[req->n_staged++] = (wk_staged){ref->owner, ref->id, id};
    return 0;
}

wk_pool_blk *wk_store_block_alloc(wk_store *s, uint64_t nbytes, void **data)
{
    uint64_t off;
    wk_pool_blk *b = wk_pool_alloc(s->pool, nbytes, &off);
    if (b)
        *data = wk_device_pool_base(s->dev) + off;
    return b;
}

void wk_store_block_free(wk_store *s, wk_pool_blk *blk)
{
    wk_pool_free(s->pool, blk);
}
