/* Reports of executions and the end of requests (report.h). */
#include "worker/report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "proto/baton.pb-c.h"
#include "worker/wire.h"

/* A chunk on its way to the I/O thread. */
typedef struct chunk_event {
    wk_event ev;                  /* first */
    const wk_report *rp;
    wk_item *it;
    wk_chunk c;
} chunk_event;

/* An item's end on its way to the I/O thread. */
typedef struct done_event {
    wk_event ev;                  /* first */
    const wk_report *rp;
    wk_item *it;
} done_event;

/* Whether what IT made is to be reported: not when it was cancelled, its
 * request closed or the worker is stopping.  [L] */
static bool item_reported(const wk_report *rp, const wk_item *it)
{
    return !atomic_load(&it->cancelled) && !it->req->closed && !atomic_load(rp->stopping);
}

/* Fills T from REF, an output of IT.  [L] */
static void ref_to_proto(const wk_report *rp, const wk_ref *ref, Baton__V1__TensorRef *t,
                         int64_t *dims, const wk_item *it)
{
    wk_wire_ref_to_proto(ref, wk_store_self(rp->store), t, dims);
    const wk_model *m = it->model;
    if (ref->own && m->tp_size > 1) {
        t->tp_rank = m->tp_rank;
        t->tp_size = m->tp_size;
    }
    t->node = it->b.node;
    t->graph = it->b.graph;
    t->n_iteration = it->b.depth;
    t->iteration = (uint32_t *)it->iter;
}

/* Pointer to REF's bytes (own pool or a mapped peer), or NULL; *DEVICE
 * tells whether it is device memory.  [L] */
static const void *ref_bytes(const wk_report *rp, const wk_ref *ref, bool *device)
{
    if (ref->own) {
        wk_tensor *t = wk_store_tensor_find(rp->store, ref->id);
        *device = wk_device_space(rp->dev) == WK_SPACE_CUDA;
        return t ? wk_store_tensor_data(rp->store, t) : NULL;
    }
    return wk_peers_bytes(rp->peers, ref->owner, ref->pool, ref->offset, ref->nbytes, device);
}

/* Sets T->data to REF's bytes when the output is client-bound and small:
 * HOST, the copy the lane made of device memory, or the bytes in host
 * memory themselves.  Device memory without a copy is not read here (the
 * conductor fetches it).  [L] */
static void maybe_inline(const wk_report *rp, const wk_ref *ref, bool client, const void *host,
                         Baton__V1__TensorRef *t)
{
    if (!client || ref->nbytes > WK_INLINE_MAX || ref->nbytes == 0)
        return;
    bool device = false;
    const void *at = host ? host : ref_bytes(rp, ref, &device);
    if (at && !device) {
        t->data.data = (uint8_t *)at;
        t->data.len = ref->nbytes;
    }
}

static void send_done(const wk_report *rp, wk_item *it)
{
    const Baton__V1__Dispatch *d = it->disp->d;
    uint32_t n_out = it->b.n_outputs;
    Baton__V1__NamedRef named[n_out ? n_out : 1], *named_p[n_out ? n_out : 1];
    Baton__V1__TensorRef refs[n_out ? n_out : 1];
    int64_t dims[n_out ? n_out : 1][BATON_MAX_DIMS];
    size_t n = 0;
    for (uint32_t o = 0; it->status == BATON_STATUS_OK && o < n_out; o++) {
        if (it->outputs[o].stream || !it->results[o].set)
            continue;
        baton__v1__named_ref__init(&named[n]);
        baton__v1__tensor_ref__init(&refs[n]);
        ref_to_proto(rp, &it->results[o].ref, &refs[n], dims[n], it);
        maybe_inline(rp, &it->results[o].ref, it->outputs[o].client, it->results[o].host,
                     &refs[n]);
        named[n].name = (char *)it->outputs[o].name;
        named[n].ref = &refs[n];
        named_p[n] = &named[n];
        n++;
    }
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = (Baton__V1__Code)it->status;
    st.message = it->status != BATON_STATUS_OK && it->message ? it->message : "";
    Baton__V1__Done done = BATON__V1__DONE__INIT;
    done.request_key = it->req->key;
    done.node = d->node;
    done.graph = d->graph;
    done.n_iteration = it->b.depth;
    done.iteration = it->iter;
    done.n_outputs = n;
    done.outputs = named_p;
    done.finish = it->finish && it->status == BATON_STATUS_OK;
    done.status = &st;
    done.queue_us = it->start_ns > it->arrive_ns ? (it->start_ns - it->arrive_ns) / 1000u : 0;
    done.exec_us = it->end_ns > it->start_ns ? (it->end_ns - it->start_ns) / 1000u : 0;
    done.dispatch_id = d->dispatch_id;
    done.speculative = it->speculative;
    done.prompt_tokens = it->prompt_tokens;
    done.generated_tokens = it->generated_tokens;
    done.cached_tokens = it->cached_tokens;
    done.batch_size = it->batch_size;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_DONE;
    m.done = &done;
    if (bt_log_enabled(BT_LOG_DEBUG)) {
        char iters[96] = "";
        size_t at = 0;
        for (uint32_t i = 0; i < it->b.depth && at < sizeof(iters); i++)
            at += (size_t)snprintf(iters + at, sizeof(iters) - at, "%s%u", i ? "," : "",
                                   it->iter[i]);
        bt_debug("done %s/%s[%s]%s%s status %d, %zu outputs, batch %u", d->request_id,
                 d->node_name, iters, it->speculative ? " (run ahead)" : "",
                 done.finish ? " finish" : "", (int)it->status, n, it->batch_size);
    }
    wk_wire_send(rp->sock, &m);
}

static void send_chunk(const wk_report *rp, const wk_item *it, const wk_chunk *ch)
{
    const Baton__V1__Dispatch *d = it->disp->d;
    Baton__V1__TensorRef ref = BATON__V1__TENSOR_REF__INIT;
    int64_t dims[BATON_MAX_DIMS];
    Baton__V1__Chunk c = BATON__V1__CHUNK__INIT;
    c.request_key = it->req->key;
    c.node = d->node;
    c.graph = d->graph;
    c.n_iteration = it->b.depth;
    c.iteration = (uint32_t *)it->iter;
    c.name = (char *)it->outputs[ch->output].name;
    if (ch->has_ref) {
        ref_to_proto(rp, &ch->ref, &ref, dims, it);
        maybe_inline(rp, &ch->ref, it->outputs[ch->output].client, ch->host, &ref);
        c.ref = &ref;
    }
    c.final = ch->final;
    c.index = ch->index;
    c.dispatch_id = d->dispatch_id;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_CHUNK;
    m.chunk = &c;
    wk_wire_send(rp->sock, &m);
}

/* On the I/O thread: a chunk goes out, or what it carries is freed. */
static void on_chunk(wk_event *ev)
{
    chunk_event *ce = (chunk_event *)ev;
    const wk_report *rp = ce->rp;
    pthread_mutex_lock(rp->lock);
    if (!item_reported(rp, ce->it)) {
        if (ce->c.has_ref && ce->c.created)
            wk_store_tensor_release(rp->store, ce->c.ref.id);
    } else {
        if (ce->c.has_ref)
            wk_item_dispatch_claim(ce->it->disp, ce->c.ref.id);
        send_chunk(rp, ce->it, &ce->c);
    }
    pthread_mutex_unlock(rp->lock);
    free(ce->c.host);
    free(ce);
}

/* On the I/O thread: an item's Done goes out, or what it made is freed;
 * the item goes, and its request with it when that was closed. */
static void on_done(wk_event *ev)
{
    done_event *de = (done_event *)ev;
    const wk_report *rp = de->rp;
    wk_item *it = de->it;
    free(de);
    pthread_mutex_lock(rp->lock);
    wk_request *req = it->req;
    req->n_running--;
    if (item_reported(rp, it)) {
        for (uint32_t o = 0; it->results && o < it->b.n_outputs; o++)
            if (it->results[o].set)
                wk_item_dispatch_claim(it->disp, it->results[o].ref.id);
        send_done(rp, it);
    } else {
        /* Never reported: what this execution made is the worker's to free.
         * (A next iteration it was chained to, if any, was cancelled by the
         * same Drop or SessionClose, and finds these ids gone.) */
        for (uint32_t o = 0; it->results && o < it->b.n_outputs; o++)
            if (it->results[o].set && it->results[o].created)
                wk_store_tensor_release(rp->store, it->results[o].ref.id);
    }
    wk_item_destroy(it);
    if (req->closed && req->n_running == 0)
        wk_report_finalize(rp, req);
    else
        wk_store_request_gc(rp->store, req);
    pthread_mutex_unlock(rp->lock);
}

int wk_report_chunk(const wk_report *rp, wk_item *it, const wk_chunk *c)
{
    chunk_event *ce = calloc(1, sizeof(*ce));
    if (!ce)
        return BT_ENOMEM;
    *ce = (chunk_event){.ev.run = on_chunk, .rp = rp, .it = it, .c = *c};
    wk_events_post(rp->events, &ce->ev);
    return 0;
}

void wk_report_item_ended(const wk_report *rp, wk_item *it)
{
    done_event *de = calloc(1, sizeof(*de));
    if (!de) {
        /* Without an event the I/O thread never learns the item ended. */
        bt_error("out of memory posting a completion; exiting");
        abort();
    }
    *de = (done_event){.ev.run = on_done, .rp = rp, .it = it};
    wk_events_post(rp->events, &de->ev);
}

/* A CacheReport waiting for the I/O thread; its arrays follow it. */
typedef struct cache_event {
    wk_event ev;
    const wk_report *rp;
    Baton__V1__CacheReport msg;
    char model[];
} cache_event;

static void on_cache(wk_event *ev)
{
    cache_event *ce = (cache_event *)ev;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_CACHE_REPORT;
    m.cache_report = &ce->msg;
    wk_wire_send(ce->rp->sock, &m);
    free(ce->msg.stored);
    free(ce->msg.removed);
    free(ce);
}

void wk_report_cache(const wk_report *rp, const char *model, const baton_cache_report *r)
{
    size_t ln = strlen(model) + 1;
    cache_event *ce = calloc(1, sizeof(*ce) + ln);
    uint64_t *st = r->n_stored ? malloc(r->n_stored * sizeof(*st)) : NULL;
    uint64_t *rm = r->n_removed ? malloc(r->n_removed * sizeof(*rm)) : NULL;
    if (!ce || (r->n_stored && !st) || (r->n_removed && !rm)) {
        bt_warn("out of memory reporting the prefix cache of model %s", model);
        free(ce);
        free(st);
        free(rm);
        return;
    }
    memcpy(ce->model, model, ln);
    if (st)
        memcpy(st, r->stored, r->n_stored * sizeof(*st));
    if (rm)
        memcpy(rm, r->removed, r->n_removed * sizeof(*rm));
    baton__v1__cache_report__init(&ce->msg);
    ce->msg.model = ce->model;
    ce->msg.stored = st;
    ce->msg.n_stored = r->n_stored;
    ce->msg.removed = rm;
    ce->msg.n_removed = r->n_removed;
    ce->msg.hits = r->hits;
    ce->msg.misses = r->misses;
    ce->msg.hit_tokens = r->hit_tokens;
    ce->msg.evictions = r->evictions;
    ce->msg.cached_bytes = r->cached_bytes;
    ce->msg.entries = r->entries;
    ce->ev.run = on_cache;
    ce->rp = rp;
    wk_events_post(rp->events, &ce->ev);
}

void wk_report_finalize(const wk_report *rp, wk_request *req)
{
    wk_runahead_close(rp->ra, req);
    wk_store_request_release_all(rp->store, req);
    wk_executor_close_sessions(rp->ex, req);
    wk_store_request_gc(rp->store, req);
}

void wk_report_session_close(const wk_report *rp, uint64_t key)
{
    wk_request *req = wk_store_request(rp->store, key, false);
    if (!req)
        return;
    req->closed = true;
    wk_pull_request_closed(rp->pull, req);
    for (wk_item *it = req->items, *nx; it; it = nx) {
        nx = it->req_next;
        if (it->state == WK_ITEM_QUEUED) {
            wk_executor_dequeue(rp->ex, it);
            wk_runahead_forget(rp->ra, it, true);
            wk_item_destroy(it);
        } else {
            wk_executor_cancel(rp->ex, it);
        }
    }
    /* With items still running, the rest waits for their ends, which may
     * still make tensors; sessions may be in use until then. */
    if (req->n_running == 0)
        wk_report_finalize(rp, req);
    else
        wk_runahead_close(rp->ra, req);
}
