/* The executor: queues per (model, mode) and the compute lanes that run
 * them (continuous batching).  The ctx backends call back into
 * is in ctx.c, input resolution in inputs.c.
 *
 * Continuous batching: a lane takes a model only when no other lane runs
 * it, and then takes up to max_batch queued items of one of its modes (the
 * mode whose head waited longest) into a single execute().  Items that
 * arrive while it runs wait for the next call, so decode steps of many
 * requests share launches without a batching timer.  Models are visited
 * round robin, so a model that always has work cannot starve the others.
 *
 * Running one model on one lane at a time is also what the ABI promises
 * backends: no concurrent execute()/session calls per model. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "worker/worker_internal.h"

/* --- queues -------------------------------------------------------------- */

wk_model *wk_model_find(wk_worker *w, const char *name)
{
    for (wk_model *m = w->models; m; m = m->next)
        if (strcmp(m->name, name) == 0)
            return m;
    return NULL;
}

static wk_queue *queue_for(wk_model *m, const char *mode)
{
    for (wk_queue *q = m->queues; q; q = q->next)
        if (strcmp(q->mode, mode) == 0)
            return q;
    wk_queue *q = calloc(1, sizeof(*q));
    if (!q || !(q->mode = strdup(mode))) {
        free(q);
        return NULL;
    }
    q->next = m->queues;
    m->queues = q;
    return q;
}

int wk_executor_enqueue(wk_worker *w, wk_item *item)
{
    wk_queue *q = queue_for(item->model, item->b.mode);
    if (!q)
        return -1;
    item->queue = q;
    item->state = WK_ITEM_QUEUED;
    item->next = NULL;
    item->prev = q->tail;
    if (q->tail)
        q->tail->next = item;
    else
        q->head = item;
    q->tail = item;
    q->n++;
    w->n_queued++;
    pthread_cond_signal(&w->work);
    return 0;
}

void wk_executor_dequeue(wk_worker *w, wk_item *item)
{
    wk_queue *q = item->queue;
    if (item->prev)
        item->prev->next = item->next;
    else
        q->head = item->next;
    if (item->next)
        item->next->prev = item->prev;
    else
        q->tail = item->prev;
    item->prev = item->next = NULL;
    q->n--;
    w->n_queued--;
}

void wk_item_cancel(wk_worker *w, wk_item *item)
{
    atomic_store(&item->cancelled, true);
    pthread_cond_broadcast(&w->wake);
}

void wk_event_push(wk_worker *w, wk_event *ev)
{
    ev->next = NULL;
    if (w->ev_tail)
        w->ev_tail->next = ev;
    else
        w->ev_head = ev;
    w->ev_tail = ev;
    uint64_t one = 1;
    /* Cannot fail short of a counter overflow; the I/O thread resets it. */
    if (write(w->event_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        bt_error("eventfd write: %s", strerror(errno));
}

void wk_executor_close_sessions(wk_worker *w, wk_request *req)
{
    while (req->sessions) {
        wk_session *s = req->sessions;
        req->sessions = s->next;
        wk_close *c = calloc(1, sizeof(*c));
        if (c) {
            c->s = s->s;
            c->key = req->key;
            c->next = s->model->closing;
            s->model->closing = c;
        } else {
            bt_error("out of memory: a session of model %s is leaked", s->model->name);
        }
        free(s);
    }
    pthread_cond_broadcast(&w->work);
}

/* Opens IT's session on model M when the backend keeps sessions. */
static void open_session(wk_worker *w, wk_model *m, wk_item *it)
{
    if (!m->backend->session_open)
        return;
    pthread_mutex_lock(&w->lock);
    wk_session *s = it->req->sessions;
    while (s && s->model != m)
        s = s->next;
    pthread_mutex_unlock(&w->lock);
    if (s) {
        it->b.session = s->s;
        return;
    }
    char err[512] = "";
    baton_session *bs = NULL;
    baton_status st = m->backend->session_open(m->handle, it->req->key, &bs, err, sizeof(err));
    if (st != BATON_STATUS_OK) {
        char msg[700];
        snprintf(msg, sizeof(msg), "node '%s': opening a session of model %s: %s",
                 it->b.node_name, m->name, err);
        wk_item_fail(it, st, msg);
        return;
    }
    s = calloc(1, sizeof(*s));
    pthread_mutex_lock(&w->lock);
    if (s) {
        s->model = m;
        s->s = bs;
        s->next = it->req->sessions;
        it->req->sessions = s;
        w->n_sessions++;
    }
    pthread_mutex_unlock(&w->lock);
    if (!s) {
        if (m->backend->session_close)
            m->backend->session_close(m->handle, bs);
        char msg[300];
        snprintf(msg, sizeof(msg), "node '%s': out of memory keeping a session of model %s",
                 it->b.node_name, m->name);
        wk_item_fail(it, BATON_STATUS_RESOURCE_EXHAUSTED, msg);
        return;
    }
    it->b.session = bs;
}

/* Is REF the value of some output of IT? */
static bool in_results(const wk_item *it, const wk_ref *ref)
{
    for (uint32_t o = 0; o < it->b.n_outputs; o++)
        if (it->results[o].set && it->results[o].ref.own && it->results[o].ref.id == ref->id)
            return true;
    return false;
}

/* After execute: closes open streams, drops what the item made and nobody
 * took, unpins what it read, and posts its DONE.  [L] */
static void finish_item(wk_worker *w, wk_item *it)
{
    bool ok = it->status == BATON_STATUS_OK && !atomic_load(&it->cancelled);
    if (it->results && it->status != BATON_STATUS_OK)
        memset(it->results, 0, sizeof(*it->results) * it->b.n_outputs);
    for (uint32_t o = 0; ok && o < it->b.n_outputs; o++) {
        if (!it->outputs[o].stream || it->stream_closed[o])
            continue;
        /* The closing empty chunk of a stream the backend left open. */
        wk_event *ev = calloc(1, sizeof(*ev));
        if (!ev)
            continue;
        *ev = (wk_event){.kind = WK_EV_CHUNK, .item = it, .output = o, .final = true,
                         .index = it->chunk_next[o]++};
        it->stream_closed[o] = true;
        wk_event_push(w, ev);
    }
    for (size_t i = 0; i < it->n_slots; i++) {
        wk_slot *s = it->slots[i];
        if (s->own) {
            if (s->created && !s->chunked && !in_results(it, &s->ref))
                wk_tensor_release(w, s->ref.id);
            wk_tensor_unpin(w, s->own);
        }
        if (s->map)
            wk_peers_unpin(&w->peers, s->map);
        free(s);
    }
    it->n_slots = 0;
    wk_chain_after_done(w, it);
    wk_event *ev = calloc(1, sizeof(*ev));
    if (!ev) {
        /* Without an event the I/O thread never learns the item ended. */
        bt_error("out of memory posting a completion; exiting");
        abort();
    }
    ev->kind = WK_EV_DONE;
    ev->item = it;
    wk_event_push(w, ev);
}

/* Exits when the device context is unusable after a CUDA error: nothing
 * queued on it will ever complete and none of its memory can be read, so
 * the worker cannot answer even the items it holds.  The conductor sees it
 * die, ends its requests with UNAVAILABLE and starts it again on a fresh
 * context.  An error that is not sticky fails only the batch it hit. */
void wk_executor_exit_if_lost(wk_worker *w, const wk_model *m)
{
    char why[384];
    if (!wk_device_lost(w->dev, why, sizeof(why)))
        return;
    bt_error("model %s: %s; exiting so that the worker is restarted", m->name, why);
    _exit(WK_EXIT_DEVICE_LOST);
}

/* Runs the N items of BATCH on model M.  A tensor-parallel leader first
 * hands the step to its followers: CLOSED (N_CLOSED request keys) are the
 * sessions it closed just before. */
static void run_batch(wk_worker *w, baton_ctx *ctx, wk_model *m, wk_item **batch, size_t n,
                      const uint64_t *closed, size_t n_closed)
{
    uint64_t start = bt_now_ns();
    wk_join_job *jobs = NULL;
    pthread_mutex_lock(&w->lock);
    for (size_t i = 0; i < n; i++) {
        batch[i]->start_ns = start;
        batch[i]->batch_size = (uint32_t)n;
        wk_item_prepare(w, batch[i], &jobs);
    }
    pthread_mutex_unlock(&w->lock);
    /* Joins copy outside the lock: they may move many megabytes. */
    wk_join_jobs_run(w, jobs, ctx->stream);
    baton_item *run[n ? n : 1];
    size_t n_run = 0;
    for (size_t i = 0; i < n; i++) {
        wk_item *it = batch[i];
        if (it->status == BATON_STATUS_OK && !atomic_load(&it->cancelled))
            open_session(w, m, it);
        if (it->status == BATON_STATUS_OK && !atomic_load(&it->cancelled))
            run[n_run++] = &it->b;
    }
    if (wk_model_leads(m) && (n_run || n_closed) &&
        wk_tp_lead(w, ctx, m, closed, n_closed, run, n_run) != 0)
        n_run = 0;
    if (n_run)
        m->backend->execute(m->handle, ctx, run, n_run);
    /* What the backend queued on the lane's stream is part of its outputs:
     * no Done leaves before it is written. */
    char err[384];
    int rc = wk_device_sync(w->dev, ctx->stream, err, sizeof(err));
    wk_executor_exit_if_lost(w, m);
    for (size_t i = 0; rc && i < n; i++) {
        char msg[512];
        snprintf(msg, sizeof(msg), "node '%s': %s", batch[i]->b.node_name, err);
        wk_item_fail(batch[i], BATON_STATUS_INTERNAL, msg);
    }
    uint64_t end = bt_now_ns();
    pthread_mutex_lock(&w->lock);
    for (size_t i = 0; i < n; i++) {
        batch[i]->end_ns = end;
        finish_item(w, batch[i]);
    }
    pthread_mutex_unlock(&w->lock);
}

/* --- lanes --------------------------------------------------------------- */

/* An idle model with work (queued items or sessions to close), moved to
 * the end of the list so the next pick starts after it.  [L] */
static wk_model *pick_model(wk_worker *w)
{
    wk_model **pp = &w->models;
    for (wk_model *m = w->models; m; pp = &m->next, m = m->next) {
        if (m->busy)
            continue;
        bool work = m->closing != NULL || m->tp_head != NULL;
        for (wk_queue *q = m->queues; q && !work; q = q->next)
            work = q->n > 0;
        if (!work)
            continue;
        if (m->next) {
            *pp = m->next;
            wk_model *t = m->next;
            while (t->next)
                t = t->next;
            t->next = m;
            m->next = NULL;
        }
        return m;
    }
    return NULL;
}

static void *lane_main(void *arg)
{
    wk_worker *w = arg;
    baton_ctx ctx;
    void *stream = NULL;
    char err[384];
    if (wk_device_stream_create(w->dev, &stream, err, sizeof(err)) != 0) {
        bt_error("a compute lane cannot create its stream: %s; exiting", err);
        _exit(WK_EXIT_DEVICE_LOST);
    }
    wk_ctx_init(&ctx, w, stream);
    pthread_mutex_lock(&w->lock);
    for (;;) {
        wk_model *m = NULL;
        while (!atomic_load(&w->stopping) && !(m = pick_model(w)))
            pthread_cond_wait(&w->work, &w->lock);
        if (!m)
            break;
        m->busy = true;
        wk_close *closing = m->closing;
        m->closing = NULL;
        wk_tp_step *steps = m->tp_head;
        m->tp_head = m->tp_tail = NULL;
        /* The mode whose head has waited longest goes first. */
        wk_queue *q = NULL;
        for (wk_queue *c = m->queues; c; c = c->next)
            if (c->head && (!q || c->head->arrive_ns < q->head->arrive_ns))
                q = c;
        size_t cap = m->max_batch ? m->max_batch : 1, n = 0;
        wk_item *batch[cap];
        while (q && q->head && n < cap) {
            wk_item *it = q->head;
            wk_executor_dequeue(w, it);
            it->state = WK_ITEM_RUNNING;
            it->req->n_running++;
            batch[n++] = it;
        }
        pthread_mutex_unlock(&w->lock);
        /* A tensor-parallel leader names the sessions it closes in its
         * next step, so that its followers close theirs at the same point. */
        bool lead = wk_model_leads(m);
        uint32_t closed = 0;
        for (wk_close *c = closing; c; c = c->next)
            closed++;
        uint64_t *keys = lead && closed ? calloc(closed, sizeof(*keys)) : NULL;
        if (lead && closed && !keys)
            wk_tp_broken(m->name, "out of memory naming the closed sessions");
        size_t k = 0;
        for (wk_close *c = closing, *nx; c; c = nx) {
            nx = c->next;
            if (keys)
                keys[k++] = c->key;
            if (m->backend->session_close)
                m->backend->session_close(m->handle, c->s);
            free(c);
        }
        if (n || k)
            run_batch(w, &ctx, m, batch, n, keys, k);
        free(keys);
        if (steps)
            wk_tp_follow(w, m, stream, steps);
        pthread_mutex_lock(&w->lock);
        w->n_sessions -= closed;
        m->busy = false;
        /* Another lane may take this model now, or the I/O thread may wait
         * for it to be idle. */
        pthread_cond_broadcast(&w->work);
    }
    pthread_mutex_unlock(&w->lock);
    wk_device_stream_destroy(w->dev, stream);
    return NULL;
}

int wk_executor_start(wk_worker *w)
{
    w->n_lanes = w->opt.streams ? w->opt.streams : 1;
    w->lanes = calloc(w->n_lanes, sizeof(*w->lanes));
    if (!w->lanes)
        return -1;
    for (uint32_t i = 0; i < w->n_lanes; i++) {
        if (pthread_create(&w->lanes[i], NULL, lane_main, w) != 0) {
            w->n_lanes = i;
            wk_executor_stop(w);
            return -1;
        }
    }
    return 0;
}

void wk_executor_stop(wk_worker *w)
{
    pthread_mutex_lock(&w->lock);
    atomic_store(&w->stopping, true);
    pthread_cond_broadcast(&w->work);
    pthread_cond_broadcast(&w->wake);
    pthread_mutex_unlock(&w->lock);
    for (uint32_t i = 0; i < w->n_lanes; i++)
        pthread_join(w->lanes[i], NULL);
    free(w->lanes);
    w->lanes = NULL;
    w->n_lanes = 0;
}

void wk_models_destroy(wk_worker *w)
{
    while (w->models) {
        wk_model *m = w->models;
        w->models = m->next;
        for (wk_close *c = m->closing, *nx; c; c = nx) {
            nx = c->next;
            if (m->backend->session_close)
                m->backend->session_close(m->handle, c->s);
            w->n_sessions--;
            free(c);
        }
        wk_tp_steps_free(m->tp_head);
        wk_tp_sessions_close(m);
        m->backend->model_unload(m->handle);
        for (wk_queue *q = m->queues, *nx; q; q = nx) {
            nx = q->next;
            free(q->mode);
            free(q);
        }
        free(m->name);
        free(m->backend_spec);
        free(m);
    }
}
