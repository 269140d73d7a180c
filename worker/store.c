/* The worker's tensor table and request records.  Every function here runs
 * under wk_worker.lock.
 *
 * Tensor ids are (incarnation << 40) | counter, the counter starting at 1:
 * unique for the worker's lifetime and never reused by a restarted worker,
 * so a Release or Fetch that names a tensor of a dead incarnation can only
 * miss, never hit the wrong tensor. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/join.h"
#include "common/log.h"
#include "worker/worker_internal.h"

#define COUNTER_BITS 40

/* u64map reserves 0 and UINT64_MAX; request keys may be 0 (the conductor
 * chooses them), so records are keyed by key + 1 and the one key that
 * cannot be shifted is refused by the caller. */
wk_request *wk_request_get(wk_worker *w, uint64_t key, bool create)
{
    if (key >= UINT64_MAX - 1)
        return NULL;
    wk_request *r = u64map_get(&w->requests, key + 1);
    if (r || !create)
        return r;
    if (!(r = calloc(1, sizeof(*r))))
        return NULL;
    r->key = key;
    if (u64map_put(&w->requests, key + 1, r) != 0) {
        free(r);
        return NULL;
    }
    return r;
}

void wk_request_gc(wk_worker *w, wk_request *req)
{
    if (!req || req->tensors || req->n_items || req->sessions || req->chains)
        return;
    u64map_del(&w->requests, req->key + 1);
    free(req->staged);
    free(req);
}

wk_tensor *wk_tensor_new(wk_worker *w, wk_request *req, baton_dtype dtype, uint32_t ndim,
                         const int64_t *dims, bool pin)
{
    uint64_t nbytes = wk_tensor_bytes(dtype, ndim, dims);
    if (nbytes == UINT64_MAX)
        return NULL;
    wk_tensor *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    uint64_t off;
    t->blk = wk_pool_alloc(w->pool, nbytes, &off);
    if (!t->blk) {
        free(t);
        return NULL;
    }
    uint64_t counter = w->next_counter++ & ((UINT64_C(1) << COUNTER_BITS) - 1);
    t->ref = (wk_ref){.own = true, .pool = 0, .offset = off, .nbytes = nbytes,
                      .id = (w->opt.incarnation << COUNTER_BITS) | counter, .dtype = dtype,
                      .ndim = ndim};
    if (ndim)
        memcpy(t->ref.dims, dims, sizeof(int64_t) * ndim);
    if (u64map_put(&w->tensors, t->ref.id, t) != 0) {
        wk_pool_free(w->pool, t->blk);
        free(t);
        return NULL;
    }
    t->req = req;
    t->pins = pin ? 1 : 0;
    t->next = req->tensors;
    if (t->next)
        t->next->prev = t;
    req->tensors = t;
    w->n_tensors++;
    return t;
}

int wk_tensor_rekey(wk_worker *w, wk_tensor *t, uint64_t id)
{
    if (id == 0 || id == UINT64_MAX || u64map_get(&w->tensors, id))
        return -1;
    if (u64map_put(&w->tensors, id, t) != 0)
        return -1;
    u64map_del(&w->tensors, t->ref.id);
    t->ref.id = id;
    return 0;
}

wk_tensor *wk_tensor_find(wk_worker *w, uint64_t id)
{
    if (id == 0 || id == UINT64_MAX)
        return NULL;
    return u64map_get(&w->tensors, id);
}

static void tensor_free(wk_worker *w, wk_tensor *t)
{
    wk_request *req = t->req;
    if (t->prev)
        t->prev->next = t->next;
    else
        req->tensors = t->next;
    if (t->next)
        t->next->prev = t->prev;
    wk_pool_free(w->pool, t->blk);
    free(t);
}

void wk_tensor_release(wk_worker *w, uint64_t id)
{
    wk_tensor *t = wk_tensor_find(w, id);
    if (!t)
        return;
    u64map_del(&w->tensors, id);
    t->released = true;
    w->n_tensors--;
    if (t->pins == 0)
        tensor_free(w, t);
}

void wk_tensor_unpin(wk_worker *w, wk_tensor *t)
{
    if (t->pins)
        t->pins--;
    if (t->released && t->pins == 0)
        tensor_free(w, t);
}

void *wk_tensor_data(wk_worker *w, const wk_tensor *t)
{
    return wk_device_pool_base(w->dev) + t->ref.offset;
}

void wk_request_release_all(wk_worker *w, wk_request *req)
{
    /* A released tensor that is still pinned stays on the list until its
     * last unpin; skip those rather than loop on them. */
    wk_tensor *t = req->tensors;
    while (t) {
        wk_tensor *n = t->next;
        if (!t->released)
            wk_tensor_release(w, t->ref.id);
        t = n;
    }
}
