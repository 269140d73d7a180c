/* Run-ahead chains (runahead.h). */
#include "worker/runahead.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"

struct wk_runahead {
    wk_executor *ex;              /* borrowed: queues the next iterations */
    wk_store *store;              /* borrowed: request records */
    const atomic_bool *stopping;  /* borrowed */
};

int wk_runahead_create(wk_executor *ex, wk_store *st, const atomic_bool *stopping,
                       wk_runahead **out)
{
    *out = calloc(1, sizeof(**out));
    if (!*out)
        return BT_ENOMEM;
    **out = (wk_runahead){ex, st, stopping};
    return 0;
}

void wk_runahead_destroy(wk_runahead *ra)
{
    free(ra);
}

/* Frees C when it is inactive and has nothing pending. */
static void chain_maybe_free(wk_chain *c)
{
    if (c->active || c->pending)
        return;
    for (wk_chain **pp = &c->req->chains; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    wk_item_refs_free(c->next_inputs, c->disp->d->n_inputs);
    wk_item_dispatch_unref(c->disp);
    free(c);
}

static void chain_stop(wk_chain *c)
{
    c->active = false;
    chain_maybe_free(c);
}

wk_chain *wk_runahead_open(wk_runahead *ra, wk_request *req, wk_dispatch *disp)
{
    const Baton__V1__Dispatch *d = disp->d;
    /* A new window for the same node replaces the old one: the conductor
     * only opens one when it stopped relying on the previous. */
    for (wk_chain *c = req->chains, *nx; c; c = nx) {
        nx = c->next;
        if (c->graph == d->graph && c->node == d->node)
            chain_stop(c);
    }
    wk_chain *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->req = req;
    c->graph = d->graph;
    c->node = d->node;
    c->disp = disp;
    disp->refs++;
    c->model = wk_executor_model_find(ra->ex, d->model);
    c->upto = d->speculate_upto;
    c->active = true;
    c->next = req->chains;
    req->chains = c;
    return c;
}

/* A new item of DISP at ITER (DEPTH levels) on MODEL, queued; NULL when
 * memory is short (nothing queued). */
static wk_item *item_queue(wk_runahead *ra, wk_dispatch *disp, wk_request *req, wk_model *model,
                           const uint32_t *iter, uint32_t depth, wk_ref *const *overrides)
{
    wk_item *it = wk_item_create(disp, req, model, iter, depth, overrides);
    if (it && wk_executor_enqueue(ra->ex, it) != 0) {
        wk_item_destroy(it);
        it = NULL;
    }
    return it;
}

int wk_runahead_start(wk_runahead *ra, wk_dispatch *disp, wk_request *req, wk_model *model)
{
    const Baton__V1__Dispatch *d = disp->d;
    uint32_t depth = (uint32_t)d->n_iteration;
    wk_chain *chain = NULL;
    if (depth && d->speculate_upto > d->iteration[depth - 1])
        chain = wk_runahead_open(ra, req, disp);
    wk_item *it = item_queue(ra, disp, req, model, d->iteration, depth, NULL);
    if (!it) {
        if (chain)
            chain_stop(chain);
        return BT_ENOMEM;
    }
    it->chain = chain;
    if (chain)
        chain->pending = true;
    return 0;
}

/* Queues the chain's next iteration when the window allows it. */
static void chain_try_next(wk_runahead *ra, wk_chain *c)
{
    if (!c->active || c->pending || !c->have_last || c->last >= c->upto ||
        atomic_load(ra->stopping) || c->req->closed || !c->model)
        return;
    const Baton__V1__Dispatch *d = c->disp->d;
    uint32_t iter[WK_MAX_DEPTH];
    uint32_t depth = (uint32_t)d->n_iteration;
    memcpy(iter, d->iteration, sizeof(uint32_t) * depth);
    iter[depth - 1] = c->last + 1;
    wk_item *it = item_queue(ra, c->disp, c->req, c->model, iter, depth, c->next_inputs);
    if (!it) {
        bt_warn("node '%s' of request %s: cannot queue run-ahead iteration %u (out of memory); "
                "the conductor will dispatch it", d->node_name, d->request_id, c->last + 1);
        chain_stop(c);
        return;
    }
    it->chain = c;
    it->speculative = true;
    c->pending = true;
}

void wk_runahead_item_ended(wk_runahead *ra, wk_item *it)
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
        chain_stop(c);
        return;
    }
    const Baton__V1__Dispatch *d = c->disp->d;
    wk_ref **next = calloc(d->n_inputs ? d->n_inputs : 1, sizeof(*next));
    if (!next) {
        chain_stop(c);
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
            wk_item_refs_free(next, d->n_inputs);
            chain_stop(c);
            return;
        }
        free(next[k]);
        if (!(next[k] = malloc(sizeof(wk_ref)))) {
            wk_item_refs_free(next, d->n_inputs);
            chain_stop(c);
            return;
        }
        *next[k] = it->results[o].ref;
    }
    wk_item_refs_free(c->next_inputs, d->n_inputs);
    c->next_inputs = next;
    c->last = it->iter[it->b.depth - 1];
    c->have_last = true;
    chain_try_next(ra, c);
}

void wk_runahead_forget(wk_runahead *ra, wk_item *it, bool stop)
{
    (void)ra;
    wk_chain *c = it->chain;
    if (!c)
        return;
    c->pending = false;
    if (stop)
        c->active = false;
    chain_maybe_free(c);
}

void wk_runahead_extend(wk_runahead *ra, const Baton__V1__Extend *e)
{
    wk_request *req = wk_store_request(ra->store, e->request_key, false);
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
        chain_try_next(ra, c);
    }
}

void wk_runahead_drop(wk_runahead *ra, const Baton__V1__Drop *dr)
{
    wk_request *req = wk_store_request(ra->store, dr->request_key, false);
    if (!req)
        return;
    for (wk_chain *c = req->chains, *nx; c; c = nx) {
        nx = c->next;
        if (c->graph == dr->graph && c->node == dr->node)
            chain_stop(c);
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
            wk_executor_dequeue(ra->ex, it);
            wk_runahead_forget(ra, it, false);
            wk_item_destroy(it);
        } else {
            wk_executor_cancel(ra->ex, it);
        }
    }
    wk_store_request_gc(ra->store, req);
}

void wk_runahead_close(wk_runahead *ra, wk_request *req)
{
    (void)ra;
    for (wk_chain *c = req->chains, *nx; c; c = nx) {
        nx = c->next;
        chain_stop(c);
    }
}
