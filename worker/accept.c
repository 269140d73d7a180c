/* Taking a Dispatch in (accept.h). */
#include "worker/accept.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"
#include "worker/wire.h"

void wk_accept_start(const wk_accept *a, wk_dispatch *disp, wk_request *req)
{
    const Baton__V1__Dispatch *d = disp->d;
    char why[512];
    baton_status code = BATON_STATUS_FAILED_PRECONDITION;
    disp->refs++; /* held across item creation, so a failure cannot free it under us */
    wk_model *model = wk_executor_model_find(a->ex, d->model);
    if (!model) {
        snprintf(why, sizeof(why), "model '%s' is not loaded on worker %s", d->model, a->worker);
    } else if (wk_runahead_start(a->ra, disp, req, model) != 0) {
        code = BATON_STATUS_RESOURCE_EXHAUSTED;
        snprintf(why, sizeof(why), "out of memory");
    } else {
        code = BATON_STATUS_OK;
    }
    if (code != BATON_STATUS_OK) {
        wk_wire_refuse(a->sock, d, code, why);
        wk_item_dispatch_unref(disp);
        wk_store_request_gc(a->store, req);
        return;
    }
    wk_item_dispatch_unref(disp);
}

/* Takes MSG in under the lock: its dispatch starts, or is returned in
 * *PARK (with its request in *REQ) to pull its inputs from other hosts
 * once the lock is dropped.  Returns OK when taken (MSG is the dispatch's
 * now), CANCELLED when its request is closed here already, or the code to
 * refuse it with, and WHY.  [L] */
static baton_status take(const wk_accept *a, Baton__V1__ConductorMessage *msg,
                         wk_dispatch **park, wk_request **preq, char *why, size_t len)
{
    const Baton__V1__Dispatch *d = msg->dispatch;
    if (!wk_executor_model_find(a->ex, d->model)) {
        snprintf(why, len, "model '%s' is not loaded on worker %s", d->model, a->worker);
        return BATON_STATUS_FAILED_PRECONDITION;
    }
    wk_request *req = wk_store_request(a->store, d->request_key, true);
    if (!req) {
        snprintf(why, len, "request key %" PRIu64 " is not usable", d->request_key);
        return BATON_STATUS_INVALID_ARGUMENT;
    }
    /* SessionClose came first: the request is over here. */
    if (req->closed)
        return BATON_STATUS_CANCELLED;
    wk_dispatch *disp = wk_item_dispatch_new(msg, a->store);
    if (!disp) {
        wk_store_request_gc(a->store, req);
        snprintf(why, len, "out of memory");
        return BATON_STATUS_RESOURCE_EXHAUSTED;
    }
    if (wk_pull_needed(d)) {
        /* Inputs on another host: parked until they are here. */
        *park = disp;
        *preq = req;
        return BATON_STATUS_OK;
    }
    wk_accept_start(a, disp, req);
    wk_item_dispatch_unref(disp);
    return BATON_STATUS_OK;
}

void wk_accept_received(const wk_accept *a, Baton__V1__ConductorMessage *msg)
{
    const Baton__V1__Dispatch *d = msg->dispatch;
    char why[512];
    baton_status code = BATON_STATUS_INVALID_ARGUMENT;
    wk_dispatch *park = NULL;
    wk_request *req = NULL;
    if (d->n_iteration > WK_MAX_DEPTH) {
        snprintf(why, sizeof(why), "iteration vector of %zu levels (at most %d)", d->n_iteration,
                 WK_MAX_DEPTH);
    } else if (d->n_inputs > WK_MAX_PORTS || d->n_outputs > WK_MAX_PORTS) {
        snprintf(why, sizeof(why), "%zu inputs and %zu outputs (at most %d each)", d->n_inputs,
                 d->n_outputs, WK_MAX_PORTS);
    } else {
        pthread_mutex_lock(a->lock);
        code = take(a, msg, &park, &req, why, sizeof(why));
        pthread_mutex_unlock(a->lock);
    }
    if (code == BATON_STATUS_OK) {
        if (park)
            wk_pull_start(a->pull, park, req);
        return;
    }
    if (code == BATON_STATUS_CANCELLED)
        bt_debug("dispatch of node '%s' for closed request %s ignored", d->node_name,
                 d->request_id);
    else
        wk_wire_refuse(a->sock, d, code, why);
    baton__v1__conductor_message__free_unpacked(msg, NULL);
}

void wk_accept_dispatch(const wk_accept *a, Baton__V1__ConductorMessage *msg)
{
    if (wk_nccl_on_dispatch(a->nccl, msg) == 0)
        wk_accept_received(a, msg);
}
