/* The executor: queues per (model, mode), compute lanes, and the baton_ctx
 * that backends call back into (DESIGN.md section 7, "Batching").
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
#include <time.h>
#include <unistd.h>

#include "worker/join.h"
#include "worker/wlog.h"
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
        wk_error("eventfd write: %s", strerror(errno));
}

void wk_executor_close_sessions(wk_worker *w, wk_request *req)
{
    while (req->sessions) {
        wk_session *s = req->sessions;
        req->sessions = s->next;
        wk_close *c = calloc(1, sizeof(*c));
        if (c) {
            c->s = s->s;
            c->next = s->model->closing;
            s->model->closing = c;
        } else {
            wk_error("out of memory: a session of model %s is leaked", s->model->name);
        }
        free(s);
    }
    pthread_cond_broadcast(&w->work);
}

/* --- the ctx a backend calls back into ----------------------------------- */

static wk_worker *ctx_worker(baton_ctx *ctx)
{
    return ctx->impl;
}

static void item_fail(wk_item *it, baton_status code, const char *msg)
{
    if (it->status != BATON_STATUS_OK)
        return; /* the first error is the one that explains the others */
    it->status = code ? code : BATON_STATUS_UNKNOWN;
    free(it->message);
    it->message = strdup(msg ? msg : "");
}

static wk_slot *slot_add(wk_item *it)
{
    if (it->n_slots == it->cap_slots) {
        size_t cap = it->cap_slots ? 2 * it->cap_slots : 8;
        wk_slot **s = realloc(it->slots, cap * sizeof(*s));
        if (!s)
            return NULL;
        it->slots = s;
        it->cap_slots = cap;
    }
    wk_slot *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    it->slots[it->n_slots++] = s;
    s->t.handle = it->n_slots;
    return s;
}

/* The slot behind a tensor the backend hands back, or NULL. */
static wk_slot *slot_of(wk_item *it, const baton_tensor *t)
{
    if (!t || t->handle == 0 || t->handle > it->n_slots)
        return NULL;
    wk_slot *s = it->slots[t->handle - 1];
    return &s->t == t || s->t.data == t->data ? s : NULL;
}

static void slot_view(wk_slot *s, const void *data)
{
    s->t.dtype = s->ref.dtype;
    s->t.ndim = s->ref.ndim;
    memcpy(s->t.dims, s->ref.dims, sizeof(s->t.dims));
    s->t.data = (void *)data;
    s->t.nbytes = s->ref.nbytes;
}

static baton_tensor *ctx_alloc(baton_ctx *ctx, baton_item *item, baton_dtype dtype,
                               uint32_t ndim, const int64_t *dims)
{
    wk_worker *w = ctx_worker(ctx);
    wk_item *it = (wk_item *)item;
    char msg[256];
    if (ndim > BATON_MAX_DIMS || wk_tensor_bytes(dtype, ndim, dims) == UINT64_MAX) {
        snprintf(msg, sizeof(msg), "node '%s': backend asked for an invalid tensor shape",
                 item->node_name);
        item_fail(it, BATON_STATUS_INTERNAL, msg);
        return NULL;
    }
    wk_slot *s = slot_add(it);
    if (!s) {
        item_fail(it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
        return NULL;
    }
    pthread_mutex_lock(&w->lock);
    wk_tensor *t = wk_tensor_new(w, it->req, dtype, ndim, dims, true);
    wk_pool_stats st;
    if (!t)
        wk_pool_get_stats(w->pool, &st);
    pthread_mutex_unlock(&w->lock);
    if (!t) {
        snprintf(msg, sizeof(msg), "node '%s': the pool of worker %s is full (%llu bytes asked, "
                 "largest free block %llu)", item->node_name, w->opt.name,
                 (unsigned long long)wk_tensor_bytes(dtype, ndim, dims),
                 (unsigned long long)st.largest_free);
        item_fail(it, BATON_STATUS_RESOURCE_EXHAUSTED, msg);
        it->n_slots--;
        free(s);
        return NULL;
    }
    s->own = t;
    s->ref = t->ref;
    s->created = true;
    slot_view(s, wk_tensor_data(w, t));
    return &s->t;
}

static int ctx_emit_chunk(baton_ctx *ctx, baton_item *item, uint32_t output,
                          const baton_tensor *tensor, int final)
{
    wk_worker *w = ctx_worker(ctx);
    wk_item *it = (wk_item *)item;
    if (output >= item->n_outputs || !item->outputs[output].stream || it->stream_closed[output])
        return -1;
    wk_slot *s = NULL;
    if (tensor && !(s = slot_of(it, tensor)))
        return -1;
    if (!tensor && !final)
        return -1;
    wk_event *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return -1;
    ev->kind = WK_EV_CHUNK;
    ev->item = it;
    ev->output = output;
    ev->final = final != 0;
    ev->index = it->chunk_next[output]++;
    if (s) {
        ev->has_ref = true;
        ev->ref = s->ref;
        ev->created = s->created;
        s->chunked = true;
    }
    if (final)
        it->stream_closed[output] = true;
    pthread_mutex_lock(&w->lock);
    wk_event_push(w, ev);
    pthread_mutex_unlock(&w->lock);
    return 0;
}

static int ctx_set_output(baton_ctx *ctx, baton_item *item, uint32_t output,
                          const baton_tensor *tensor)
{
    wk_item *it = (wk_item *)item;
    if (output >= item->n_outputs)
        return -1;
    if (item->outputs[output].stream)
        return ctx_emit_chunk(ctx, item, output, tensor, 1);
    wk_slot *s = slot_of(it, tensor);
    if (!s)
        return -1;
    it->results[output] = (wk_result){.set = true, .created = s->created, .ref = s->ref};
    return 0;
}

static int ctx_forward(baton_ctx *ctx, baton_item *item, uint32_t output, uint32_t input)
{
    if (input >= item->n_inputs)
        return -1;
    return ctx_set_output(ctx, item, output, &item->inputs[input].tensor);
}

static void ctx_finish(baton_ctx *ctx, baton_item *item)
{
    (void)ctx;
    ((wk_item *)item)->finish = true;
}

static void ctx_fail(baton_ctx *ctx, baton_item *item, baton_status code, const char *message)
{
    (void)ctx;
    item_fail((wk_item *)item, code, message);
}

static baton_status item_cancelled(wk_worker *w, const wk_item *it, uint64_t now)
{
    if (atomic_load(&it->cancelled) || atomic_load(&w->stopping))
        return BATON_STATUS_CANCELLED;
    if (it->deadline_ns && now >= it->deadline_ns)
        return BATON_STATUS_DEADLINE_EXCEEDED;
    return BATON_STATUS_OK;
}

static baton_status ctx_cancelled(baton_ctx *ctx, const baton_item *item)
{
    return item_cancelled(ctx_worker(ctx), (const wk_item *)item, wk_now_ns());
}

static baton_status ctx_sleep_ms(baton_ctx *ctx, const baton_item *item, uint32_t ms)
{
    wk_worker *w = ctx_worker(ctx);
    const wk_item *it = (const wk_item *)item;
    uint64_t end = wk_now_ns() + (uint64_t)ms * 1000000u;
    if (it->deadline_ns && it->deadline_ns < end)
        end = it->deadline_ns;
    struct timespec ts = {(time_t)(end / 1000000000u), (long)(end % 1000000000u)};
    baton_status st;
    pthread_mutex_lock(&w->lock);
    /* wk_item_cancel broadcasts `wake` under the lock, so a cancel cannot
     * slip in between the check and the wait. */
    while ((st = item_cancelled(w, it, wk_now_ns())) == BATON_STATUS_OK && wk_now_ns() < end)
        pthread_cond_timedwait(&w->wake, &w->lock, &ts);
    pthread_mutex_unlock(&w->lock);
    return st;
}

/* --- preparing inputs ---------------------------------------------------- */

/* A join to carry out once the lock is dropped. */
typedef struct join_job {
    wk_jpart *parts;
    size_t n_parts;
    wk_tview *views;
    uint32_t shard_dim;
    wk_tview out;
    void *dst;
    struct join_job *next;
} join_job;

static void job_free(join_job *j)
{
    free(j->parts);
    free(j->views);
    free(j);
}

/* Pins REF into a new slot of IT.  [L]  NULL with *CODE and ERR when the
 * tensor cannot be had. */
static wk_slot *pin_ref(wk_worker *w, wk_item *it, const wk_ref *ref, baton_status *code,
                        char *err, size_t errlen)
{
    wk_slot *s = slot_add(it);
    *code = BATON_STATUS_RESOURCE_EXHAUSTED;
    if (!s) {
        snprintf(err, errlen, "out of host memory");
        return NULL;
    }
    if (ref->own) {
        wk_tensor *t = wk_tensor_find(w, ref->id);
        if (!t) {
            *code = BATON_STATUS_NOT_FOUND;
            snprintf(err, errlen, "tensor %llu is not held by worker %s (released or never "
                     "made)", (unsigned long long)ref->id, w->opt.name);
            return NULL;
        }
        t->pins++;
        s->own = t;
        s->ref = t->ref;
        slot_view(s, wk_tensor_data(w, t));
        return s;
    }
    *code = BATON_STATUS_FAILED_PRECONDITION;
    wk_mapping *m = wk_peers_pin(&w->peers, ref->owner, ref->pool, err, errlen);
    if (!m)
        return NULL;
    s->map = m;
    s->ref = *ref;
    if (ref->offset > m->size || ref->nbytes > m->size - ref->offset) {
        *code = BATON_STATUS_INVALID_ARGUMENT;
        snprintf(err, errlen, "tensor %llu of worker %u lies outside its pool",
                 (unsigned long long)ref->id, ref->owner);
        return NULL;
    }
    slot_view(s, (const uint8_t *)m->base + ref->offset);
    return s;
}

static int transfer_supported(Baton__V1__TransferKind k)
{
    return k == BATON__V1__TRANSFER_KIND__TRANSFER_KIND_UNSPECIFIED ||
           k == BATON__V1__TRANSFER_KIND__TRANSFER_KIND_LOCAL ||
           k == BATON__V1__TRANSFER_KIND__TRANSFER_KIND_IPC;
}

/* Resolves input K of IT into it->inputs[k]: in place when it is one
 * tensor, else through a new joined tensor whose copy is queued on JOBS.
 * [L]  Returns 0, or fails the item. */
static int prepare_input(wk_worker *w, wk_item *it, uint32_t k, join_job **jobs)
{
    const Baton__V1__InputValue *iv = it->disp->d->inputs[k];
    baton_input *in = &it->inputs[k];
    char err[512], msg[768];
    baton_status code = BATON_STATUS_INVALID_ARGUMENT;
    in->name = iv->name;
    in->stream = iv->stream;
    in->final = iv->stream ? iv->final : 1;
    if (it->overrides && it->overrides[k]) {
        wk_slot *s = pin_ref(w, it, it->overrides[k], &code, err, sizeof(err));
        if (!s)
            goto fail;
        in->tensor = s->t;
        in->final = 1;
        return 0;
    }
    size_t n_chunks = 0;
    for (size_t p = 0; p < iv->n_parts; p++) {
        if (!transfer_supported(iv->parts[p]->transfer)) {
            snprintf(err, sizeof(err), "part %zu needs transfer kind %d, which this worker does "
                     "not support (same-host shm only)", p, iv->parts[p]->transfer);
            code = BATON_STATUS_FAILED_PRECONDITION;
            goto fail;
        }
        n_chunks += iv->parts[p]->n_chunks;
    }
    join_job *j = calloc(1, sizeof(*j));
    if (!j || !(j->parts = calloc(iv->n_parts ? iv->n_parts : 1, sizeof(*j->parts))) ||
        !(j->views = calloc(n_chunks ? n_chunks : 1, sizeof(*j->views)))) {
        if (j)
            job_free(j);
        snprintf(err, sizeof(err), "out of host memory");
        code = BATON_STATUS_RESOURCE_EXHAUSTED;
        goto fail;
    }
    j->n_parts = iv->n_parts;
    j->shard_dim = iv->shard_dim;
    wk_slot *last = NULL;
    size_t at = 0;
    for (size_t p = 0; p < iv->n_parts; p++) {
        j->parts[p].chunks = j->views + at;
        j->parts[p].n = iv->parts[p]->n_chunks;
        for (size_t c = 0; c < iv->parts[p]->n_chunks; c++, at++) {
            wk_ref r;
            if (wk_ref_from_proto(w, iv->parts[p]->chunks[c], &r, err, sizeof(err)) != 0) {
                code = BATON_STATUS_INVALID_ARGUMENT;
                job_free(j);
                goto fail;
            }
            if (!(last = pin_ref(w, it, &r, &code, err, sizeof(err)))) {
                job_free(j);
                goto fail;
            }
            j->views[at] = (wk_tview){last->t.dtype, last->t.ndim, {0}, last->t.data,
                                      last->t.nbytes};
            memcpy(j->views[at].dims, last->t.dims, sizeof(j->views[at].dims));
        }
    }
    if (wk_join_is_trivial(j->parts, j->n_parts)) {
        /* One tensor: the backend reads it where it lies, own pool or peer. */
        in->tensor = last->t;
        job_free(j);
        return 0;
    }
    if (wk_join_shape(j->parts, j->n_parts, j->shard_dim, &j->out, err, sizeof(err)) != 0) {
        code = BATON_STATUS_INVALID_ARGUMENT;
        job_free(j);
        goto fail;
    }
    wk_slot *s = slot_add(it);
    wk_tensor *t = s ? wk_tensor_new(w, it->req, j->out.dtype, j->out.ndim, j->out.dims, true)
                     : NULL;
    if (!t) {
        snprintf(err, sizeof(err), "no room in the pool of worker %s for the joined %llu bytes",
                 w->opt.name, (unsigned long long)j->out.nbytes);
        code = BATON_STATUS_RESOURCE_EXHAUSTED;
        job_free(j);
        goto fail;
    }
    s->own = t;
    s->ref = t->ref;
    s->created = true;
    slot_view(s, wk_tensor_data(w, t));
    j->dst = s->t.data;
    j->next = *jobs;
    *jobs = j;
    in->tensor = s->t;
    return 0;
fail:
    snprintf(msg, sizeof(msg), "node '%s' input '%s': %s", it->b.node_name, iv->name, err);
    item_fail(it, code, msg);
    return -1;
}

/* Sets up IT's inputs and outputs.  [L] */
static void prepare_item(wk_worker *w, wk_item *it, join_job **jobs)
{
    const Baton__V1__Dispatch *d = it->disp->d;
    size_t ni = d->n_inputs, no = d->n_outputs;
    it->inputs = calloc(ni ? ni : 1, sizeof(*it->inputs));
    it->outputs = calloc(no ? no : 1, sizeof(*it->outputs));
    it->results = calloc(no ? no : 1, sizeof(*it->results));
    it->chunk_next = calloc(no ? no : 1, sizeof(*it->chunk_next));
    it->stream_closed = calloc(no ? no : 1, sizeof(*it->stream_closed));
    if (!it->inputs || !it->outputs || !it->results || !it->chunk_next || !it->stream_closed) {
        item_fail(it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
        return;
    }
    for (size_t o = 0; o < no; o++)
        it->outputs[o] = (baton_output){d->outputs[o]->name, d->outputs[o]->stream,
                                        d->outputs[o]->client};
    it->b.outputs = it->outputs;
    it->b.n_outputs = (uint32_t)no;
    it->b.inputs = it->inputs;
    it->b.n_inputs = (uint32_t)ni;
    for (uint32_t k = 0; k < ni; k++)
        if (prepare_input(w, it, k, jobs) != 0)
            return;
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
        item_fail(it, st, msg);
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
    if (!s && m->backend->session_close)
        m->backend->session_close(m->handle, bs);
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
        wk_error("out of memory posting a completion; exiting");
        abort();
    }
    ev->kind = WK_EV_DONE;
    ev->item = it;
    wk_event_push(w, ev);
}

static void run_batch(wk_worker *w, baton_ctx *ctx, wk_model *m, wk_item **batch, size_t n)
{
    uint64_t start = wk_now_ns();
    join_job *jobs = NULL;
    pthread_mutex_lock(&w->lock);
    for (size_t i = 0; i < n; i++) {
        batch[i]->start_ns = start;
        batch[i]->batch_size = (uint32_t)n;
        prepare_item(w, batch[i], &jobs);
    }
    pthread_mutex_unlock(&w->lock);
    /* Joins copy outside the lock: they may move many megabytes. */
    for (join_job *j = jobs, *nx; j; j = nx) {
        nx = j->next;
        wk_join_copy(j->parts, j->n_parts, j->shard_dim, &j->out, j->dst);
        job_free(j);
    }
    baton_item *run[n];
    size_t n_run = 0;
    for (size_t i = 0; i < n; i++) {
        wk_item *it = batch[i];
        if (it->status == BATON_STATUS_OK && !atomic_load(&it->cancelled))
            open_session(w, m, it);
        if (it->status == BATON_STATUS_OK && !atomic_load(&it->cancelled))
            run[n_run++] = &it->b;
    }
    if (n_run)
        m->backend->execute(m->handle, ctx, run, n_run);
    uint64_t end = wk_now_ns();
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
        bool work = m->closing != NULL;
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
    baton_ctx ctx = {ctx_alloc,     ctx_set_output, ctx_forward,  ctx_emit_chunk, ctx_finish,
                     ctx_fail,      ctx_cancelled,  ctx_sleep_ms, w->opt.threads, w};
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
        uint32_t closed = 0;
        for (wk_close *c = closing, *nx; c; c = nx, closed++) {
            nx = c->next;
            if (m->backend->session_close)
                m->backend->session_close(m->handle, c->s);
            free(c);
        }
        if (n)
            run_batch(w, &ctx, m, batch, n);
        pthread_mutex_lock(&w->lock);
        w->n_sessions -= closed;
        m->busy = false;
        /* Another lane may take this model now, or the I/O thread may wait
         * for it to be idle. */
        pthread_cond_broadcast(&w->work);
    }
    pthread_mutex_unlock(&w->lock);
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
