/* Items (one per (request, node, iteration) to run) and run-ahead chains
 * (speculation windows).  Everything here runs under wk_worker.lock, on
 * the I/O thread, except wk_chain_after_done, which the lane that ran the
 * item calls.
 *
 * A chain is opened by a Dispatch whose speculate_upto lies past its own
 * innermost iteration.  When iteration i completes without the finish
 * signal, the lane that ran it queues i+1 at once, before the Done of i
 * has even left (it leaves first all the same: events go out in order).
 * Chaining on the lane rather than the I/O thread saves two thread
 * hand-offs per iteration, which is the whole cost of a run-ahead step of
 * a cheap node.  The next iteration is: the same
 * Dispatch, the innermost index raised, and each LoopBack pair's output of
 * i bound in place of its input.  Those tensors were reported in Done i, so
 * the conductor owns their lifetime (it releases them later); the chain
 * only borrows them.  Only one item of a chain exists at a time, so the
 * Dones of a chain go out in iteration order. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/worker_internal.h"

void wk_dispatch_unref(wk_dispatch *d)
{
    if (!d || --d->refs > 0)
        return;
    /* Inputs pulled from another host were this dispatch's copies. */
    for (size_t i = 0; i < d->n_pulled; i++)
        if (d->pulled[i])
            wk_tensor_release(d->w, d->pulled[i]);
    free(d->pulled);
    baton__v1__conductor_message__free_unpacked(d->msg, NULL);
    free(d);
}

void wk_dispatch_claim(wk_dispatch *d, uint64_t id)
{
    for (size_t i = 0; i < d->n_pulled; i++)
        if (d->pulled[i] == id)
            d->pulled[i] = 0;
}

static void free_refs(wk_ref **refs, size_t n)
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
            free_refs(r, n);
            return -1;
        }
        *r[i] = *src[i];
    }
    *out = r;
    return 0;
}

wk_item *wk_item_create(wk_worker *w, wk_dispatch *disp, wk_request *req, wk_model *model,
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
    if (wk_executor_enqueue(w, it) != 0) {
        disp->refs--;
        free_refs(it->overrides, d->n_inputs);
        free(it);
        return NULL;
    }
    it->req_next = req->items;
    if (req->items)
        req->items->req_prev = it;
    req->items = it;
    req->n_items++;
    return it;
}

void wk_item_destroy(wk_worker *w, wk_item *it)
{
    (void)w;
    wk_request *req = it->req;
    if (it->req_prev)
        it->req_prev->req_next = it->req_next;
    else
        req->items = it->req_next;
    if (it->req_next)
        it->req_next->req_prev = it->req_prev;
    req->n_items--;
    free_refs(it->overrides, it->disp->d->n_inputs);
    free(it->inputs);
    free(it->outputs);
    free(it->slots);
    free(it->results);
    free(it->chunk_next);
    free(it->stream_closed);
    free(it->message);
    wk_dispatch_unref(it->disp);
    free(it);
}

/* --- chains -------------------------------------------------------------- */

void wk_chain_maybe_free(wk_worker *w, wk_chain *c)
{
    (void)w;
    if (c->active || c->pending)
        return;
    for (wk_chain **pp = &c->req->chains; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    free_refs(c->next_inputs, c->disp->d->n_inputs);
    wk_dispatch_unref(c->disp);
    free(c);
}

static void chain_stop(wk_worker *w, wk_chain *c)
{
    c->active = false;
    wk_chain_maybe_free(w, c);
}

wk_chain *wk_chain_open(wk_worker *w, wk_request *req, wk_dispatch *disp)
{
    const Baton__V1__Dispatch *d = disp->d;
    /* A new window for the same node replaces the old one: the conductor
     * only opens one when it stopped relying on the previous. */
    for (wk_chain *c = req->chains, *nx; c; c = nx) {
        nx = c->next;
        if (c->graph == d->graph && c->node == d->node)
            chain_stop(w, c);
    }
    wk_chain *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->req = req;
    c->graph = d->graph;
    c->node = d->node;
    c->disp = disp;
    disp->refs++;
    c->model = wk_model_find(w, d->model);
    c->upto = d->speculate_upto;
    c->active = true;
    c->next = req->chains;
    req->chains = c;
    return c;
}

/* Queues the chain's next iteration when the window allows it. */
static void chain_try_next(wk_worker *w, wk_chain *c)
{
    if (!c->active || c->pending || !c->have_last || c->last >= c->upto ||
        atomic_load(&w->stopping) || c->req->closed || !c->model)
        return;
    const Baton__V1__Dispatch *d = c->disp->d;
    uint32_t iter[WK_MAX_DEPTH];
    uint32_t depth = (uint32_t)d->n_iteration;
    memcpy(iter, d->iteration, sizeof(uint32_t) * depth);
    iter[depth - 1] = c->last + 1;
    wk_item *it = wk_item_create(w, c->disp, c->req, c->model, iter, depth, c->next_inputs);
    if (!it) {
        bt_warn("node '%s' of request %s: cannot queue run-ahead iteration %u (out of memory); "
                "the conductor will dispatch it", d->node_name, d->request_id, c->last + 1);
        chain_stop(w, c);
        return;
    }
    it->chain = c;
    it->speculative = true;
    c->pending = true;
}

void wk_chain_after_done(wk_worker *w, wk_item *it)
{
    wk_chain *c = it->chain;
    if (!c)
        return;
    /* The item lets go of its chain here: the chain may be freed from now
     * on (by a Drop, say) while the item's Done is still on its way. */
    it->chain = NULL;
    c->pending = false;
    if (!c->active || it->status != BATON_STATUS_OK || it->finish || c->req->closed ||
        atomic_load(&it->cancelled)) {
        /* A finish (or an error, a drop) ends the loop: chain no further. */
        chain_stop(w, c);
        return;
    }
    const Baton__V1__Dispatch *d = c->disp->d;
    wk_ref **next = calloc(d->n_inputs ? d->n_inputs : 1, sizeof(*next));
    if (!next) {
        chain_stop(w, c);
        return;
    }
    for (size_t p = 0; p < d->n_loop_back; p++) {
        const Baton__V1__LoopBack *lb = d->loop_back[p];
        size_t o = 0, k = 0;
        while (o < d->n_outputs && strcmp(d->outputs[o]->name, lb->output) != 0)
            o++;
        while (k < d->n_inputs && strcmp(d->inputs[k]->name, lb->input) != 0)
            k++;
        if (o == d->n_outputs || k == d->n_inputs || !it->results || !it->results[o].set) {
            bt_warn("node '%s': loop-back %s -> %s has no value after iteration %u; run-ahead "
                    "stops", d->node_name, lb->output, lb->input, it->iter[it->b.depth - 1]);
            free_refs(next, d->n_inputs);
            chain_stop(w, c);
            return;
        }
        free(next[k]);
        if (!(next[k] = malloc(sizeof(wk_ref)))) {
            free_refs(next, d->n_inputs);
            chain_stop(w, c);
            return;
        }
        *next[k] = it->results[o].ref;
    }
    free_refs(c->next_inputs, d->n_inputs);
    c->next_inputs = next;
    c->last = it->iter[it->b.depth - 1];
    c->have_last = true;
    chain_try_next(w, c);
}

void wk_chain_extend(wk_worker *w, const Baton__V1__Extend *e)
{
    wk_request *req = wk_request_get(w, e->request_key, false);
    if (!req)
        return;
    /* chain_try_next stops and frees the chain when its next item cannot be
     * allocated, so the successor is taken first. */
    for (wk_chain *c = req->chains, *nx; c; c = nx) {
        nx = c->next;
        if (c->graph != e->graph || c->node != e->node || !c->active)
            continue;
        if (e->dispatch_id && c->disp->d->dispatch_id != e->dispatch_id)
            continue;
        if (e->upto > c->upto)
            c->upto = e->upto;
        chain_try_next(w, c);
    }
}

void wk_chain_drop(wk_worker *w, const Baton__V1__Drop *dr)
{
    wk_request *req = wk_request_get(w, dr->request_key, false);
    if (!req)
        return;
    for (wk_chain *c = req->chains, *nx; c; c = nx) {
        nx = c->next;
        if (c->graph == dr->graph && c->node == dr->node)
            chain_stop(w, c);
    }
    /* Items of the node at or past from_iteration: same outer indices, an
     * innermost index at least the last element.  Queued ones go now;
     * running ones are cancelled and their outputs freed when they end,
     * since nothing of them was reported. */
    size_t depth = dr->n_from_iteration;
    for (wk_item *it = req->items, *nx; it; it = nx) {
        nx = it->req_next;
        if (it->b.graph != dr->graph || it->b.node != dr->node || it->b.depth != depth)
            continue;
        if (depth && (memcmp(it->iter, dr->from_iteration, sizeof(uint32_t) * (depth - 1)) != 0 ||
                      it->iter[depth - 1] < dr->from_iteration[depth - 1]))
            continue;
        if (it->state == WK_ITEM_QUEUED) {
            wk_executor_dequeue(w, it);
            if (it->chain) {
                it->chain->pending = false;
                wk_chain_maybe_free(w, it->chain);
            }
            wk_item_destroy(w, it);
        } else {
            wk_item_cancel(w, it);
        }
    }
    wk_request_gc(w, req);
}

void wk_chain_close_all(wk_worker *w, wk_request *req)
{
    for (wk_chain *c = req->chains, *nx; c; c = nx) {
        nx = c->next;
        chain_stop(w, c);
    }
}
