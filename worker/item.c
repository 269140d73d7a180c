/* Items and the dispatches they share (item.h). */
#include "worker/item.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/vec.h"

wk_dispatch *wk_item_dispatch_new(Baton__V1__ConductorMessage *msg, wk_store *store)
{
    wk_dispatch *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->msg = msg;
    d->d = msg->dispatch;
    d->refs = 1;
    d->store = store;
    if (d->d->remaining_ms)
        d->deadline_ns = bt_now_ns() + (uint64_t)d->d->remaining_ms * 1000000u;
    return d;
}

void wk_item_dispatch_unref(wk_dispatch *d)
{
    if (!d || --d->refs > 0)
        return;
    /* Inputs pulled from another host were this dispatch's copies. */
    for (size_t i = 0; i < d->n_pulled; i++)
        if (d->pulled[i])
            wk_store_tensor_release(d->store, d->pulled[i]);
    free(d->pulled);
    baton__v1__conductor_message__free_unpacked(d->msg, NULL);
    free(d);
}

void wk_item_dispatch_claim(wk_dispatch *d, uint64_t id)
{
    for (size_t i = 0; i < d->n_pulled; i++)
        if (d->pulled[i] == id)
            d->pulled[i] = 0;
}

void wk_item_refs_free(wk_ref **refs, size_t n)
{
    if (!refs)
        return;
    for (size_t i = 0; i < n; i++)
        free(refs[i]);
    free(refs);
}

/* Copies N optional refs; *OUT stays NULL when none is set. */
static int copy_refs(wk_ref *const *src, size_t n, wk_ref ***out)
{
    *out = NULL;
    bool any = false;
    for (size_t i = 0; src && i < n; i++)
        any |= src[i] != NULL;
    if (!any)
        return 0;
    wk_ref **r = calloc(n, sizeof(*r));
    if (!r)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (!src[i])
            continue;
        if (!(r[i] = malloc(sizeof(wk_ref)))) {
            wk_item_refs_free(r, n);
            return -1;
        }
        *r[i] = *src[i];
    }
    *out = r;
    return 0;
}

wk_item *wk_item_create(wk_dispatch *disp, wk_request *req, struct wk_model *model,
                        const uint32_t *iter, uint32_t depth, wk_ref *const *overrides)
{
    const Baton__V1__Dispatch *d = disp->d;
    if (depth > WK_MAX_DEPTH)
        return NULL;
    wk_item *it = calloc(1, sizeof(*it));
    if (!it)
        return NULL;
    if (copy_refs(overrides, d->n_inputs, &it->overrides) != 0) {
        free(it);
        return NULL;
    }
    it->disp = disp;
    disp->refs++;
    it->req = req;
    it->model = model;
    if (depth)
        memcpy(it->iter, iter, sizeof(uint32_t) * depth);
    atomic_init(&it->cancelled, false);
    it->b.request_key = req->key;
    it->b.request_id = d->request_id;
    it->b.node_name = d->node_name;
    it->b.mode = d->mode ? d->mode : "";
    it->b.graph = d->graph;
    it->b.node = d->node;
    it->b.iteration = it->iter;
    it->b.depth = depth;
    if (d->sampling)
        it->b.sampling = (baton_sampling){d->sampling->temperature, d->sampling->top_k,
                                          d->sampling->top_p, d->sampling->seed};
    it->arrive_ns = bt_now_ns();
    it->deadline_ns = disp->deadline_ns;
    it->req_next = req->items;
    if (req->items)
        req->items->req_prev = it;
    req->items = it;
    req->n_items++;
    return it;
}

void wk_item_destroy(wk_item *it)
{
    wk_request *req = it->req;
    if (it->req_prev)
        it->req_prev->req_next = it->req_next;
    else
        req->items = it->req_next;
    if (it->req_next)
        it->req_next->req_prev = it->req_prev;
    req->n_items--;
    wk_item_refs_free(it->overrides, it->disp->d->n_inputs);
    free(it->inputs);
    free(it->outputs);
    for (size_t i = 0; i < it->n_slots; i++)
        free(it->slots[i]);
    free(it->slots);
    for (uint32_t o = 0; it->results && o < it->b.n_outputs; o++)
        free(it->results[o].host);
    free(it->results);
    free(it->chunk_next);
    free(it->stream_closed);
    free(it->message);
    wk_item_dispatch_unref(it->disp);
    free(it);
}

void wk_item_fail(wk_item *it, baton_status code, const char *msg)
{
    if (it->status != BATON_STATUS_OK)
        return; /* the first error is the one that explains the others */
    it->status = code ? code : BATON_STATUS_UNKNOWN;
    free(it->message);
    it->message = strdup(msg ? msg : "");
}

wk_slot *wk_item_slot_add(wk_item *it)
{
    if (BT_RESERVE(it->slots, it->n_slots, it->cap_slots, 8) != 0)
        return NULL;
    wk_slot *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    it->slots[it->n_slots++] = s;
    s->t.handle = it->n_slots;
    return s;
}

void wk_item_slot_view(wk_slot *s, const void *data)
{
    s->t.dtype = s->ref.dtype;
    s->t.ndim = s->ref.ndim;
    memcpy(s->t.dims, s->ref.dims, sizeof(s->t.dims));
    s->t.data = (void *)data;
    s->t.nbytes = s->ref.nbytes;
}
