/* The executor (executor.h): queues, lanes, batches. */
#include "worker/executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "worker/inputs.h"

/* An open backend session of one request on one model (req->sessions). */
typedef struct wk_session {
    wk_model *model;
    baton_session *s;
    struct wk_session *next;
} wk_session;

/* A session waiting to be closed when its model is idle. */
typedef struct wk_close {
    baton_session *s;
    uint64_t key;                 /* its request key (a tensor-parallel leader tells its
                                     followers to close theirs) */
    struct wk_close *next;
} wk_close;

typedef struct wk_queue {
    char *mode;                   /* owned */
    wk_item *head, *tail;         /* [L] */
    size_t n;
    struct wk_queue *next;
} wk_queue;

struct wk_executor {
    wk_executor_options opt;
    wk_executor_hooks hooks;
    wk_ctx_env ctx_env;           /* what the lanes' ctx reaches */
    wk_inputs_env inputs_env;     /* what input resolution reads */
    pthread_cond_t work;          /* [L] lanes wait for work */
    pthread_cond_t wake;          /* [L] sleeping items wait for a cancel */
    wk_model *models;             /* [L] owned */
    uint32_t n_queued;            /* [L] */
    uint32_t n_sessions;          /* [L] */
    pthread_t *lanes;
    uint32_t n_lanes;             /* running */
    pthread_t inline_thread;      /* runs quick models (wk_executor_inline_thread) */
    bool has_inline;              /* inline_thread is set */
    bool inline_due;              /* [L] work was left to the inline thread */
    uint64_t inline_batches;      /* [L] batches the inline thread ran */
    uint64_t inline_round;        /* [L] counts wk_executor_run_inline calls */
    baton_ctx inline_ctx;         /* its context: the host's streams are NULL */
};

/* --- models and queues ---------------------------------------------------- */

bool wk_model_leads(const wk_model *m)
{
    return m->tp_size > 1 && m->tp_rank == 0;
}

bool wk_model_follows(const wk_model *m)
{
    return m->tp_size > 1 && m->tp_rank > 0;
}

void wk_executor_model_add(wk_executor *ex, wk_model *m)
{
    m->next = ex->models;
    ex->models = m;
    if (m->jobs)
        pthread_cond_broadcast(&ex->work);
}

void wk_model_exit_if_broken(const wk_model *m, const char *role)
{
    if (m->tp_size <= 1 || !m->backend->model_broken || !m->backend->model_broken(m->handle))
        return;
    bt_error("model %s (%s): its tensor-parallel group failed during a step (a rank aborted "
             "it); the step's outputs are undefined: exiting so that the group is made again",
             m->name, role);
    _exit(WK_EXIT_GROUP_BROKEN);
}

wk_model *wk_executor_stuck(wk_executor *ex, uint64_t now_ns)
{
    for (wk_model *m = ex->models; m; m = m->next)
        if (m->tp_size > 1 && m->step_ms && m->busy &&
            now_ns - m->busy_since_ns > (uint64_t)m->step_ms * 1000000u)
            return m;
    return NULL;
}

wk_model *wk_executor_model_find(wk_executor *ex, const char *name)
{
    for (wk_model *m = ex->models; m; m = m->next)
        if (strcmp(m->name, name) == 0)
            return m;
    return NULL;
}

/* Whether M's batches run on the inline thread: its last WK_INLINE_AFTER
 * batches were quick (never true of a tensor-parallel model, whose ranks
 * step together on their lanes).  [L] */
static bool runs_inline(const wk_executor *ex, const wk_model *m)
{
    return ex->has_inline && m->quick >= WK_INLINE_AFTER;
}

/* Work for M was queued: true when it is left to the inline thread, which
 * is the caller and runs it itself before it sleeps.  That spares two
 * thread hand-offs, the lane's wake-up and the I/O thread's for the Done.
 * A lane that holds M when the work comes finds it when it looks for work
 * again, so skipping its wake-up loses none.  [L] */
static bool left_inline(wk_executor *ex, const wk_model *m)
{
    if (!runs_inline(ex, m) || !pthread_equal(pthread_self(), ex->inline_thread))
        return false;
    ex->inline_due = true;
    return true;
}

/* Work for M was queued: wakes a lane unless it is left inline.  [L] */
static void wake_for(wk_executor *ex, const wk_model *m)
{
    if (!left_inline(ex, m))
        pthread_cond_signal(&ex->work);
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

int wk_executor_enqueue(wk_executor *ex, wk_item *it)
{
    wk_queue *q = queue_for(it->model, it->b.mode);
    if (!q)
        return BT_ENOMEM;
    it->queue = q;
    it->state = WK_ITEM_QUEUED;
    it->next = NULL;
    it->prev = q->tail;
    if (q->tail)
        q->tail->next = it;
    else
        q->head = it;
    q->tail = it;
    q->n++;
    ex->n_queued++;
    wake_for(ex, it->model);
    return 0;
}

/* Puts IT, deferred by its backend, back in its queue in arrival order, so
 * that it keeps its place among the other deferred items.  [L] */
static void requeue(wk_executor *ex, wk_item *it)
{
    wk_queue *q = it->queue;
    wk_item *after = q->tail;
    while (after && after->arrive_ns > it->arrive_ns)
        after = after->prev;
    it->state = WK_ITEM_QUEUED;
    it->prev = after;
    it->next = after ? after->next : q->head;
    if (it->next)
        it->next->prev = it;
    else
        q->tail = it;
    if (after)
        after->next = it;
    else
        q->head = it;
    q->n++;
    ex->n_queued++;
}

/* Whether IT may run in the next batch of its model M: every item that
 * was not deferred, and a deferred one once M changed.  [L] */
static bool ready(const wk_model *m, const wk_item *it)
{
    return !it->deferred || it->defer_epoch != m->epoch;
}

/* The first item of Q that may run, or NULL.  [L] */
static wk_item *first_ready(const wk_model *m, const wk_queue *q)
{
    wk_item *it = q->head;
    while (it && !ready(m, it))
        it = it->next;
    return it;
}

void wk_executor_dequeue(wk_executor *ex, wk_item *it)
{
    wk_queue *q = it->queue;
    if (it->prev)
        it->prev->next = it->next;
    else
        q->head = it->next;
    if (it->next)
        it->next->prev = it->prev;
    else
        q->tail = it->prev;
    it->prev = it->next = NULL;
    q->n--;
    ex->n_queued--;
}

void wk_executor_cancel(wk_executor *ex, wk_item *it)
{
    atomic_store(&it->cancelled, true);
    pthread_cond_broadcast(&ex->wake);
}

void wk_executor_close_sessions(wk_executor *ex, wk_request *req)
{
    /* A request without sessions here (most) wakes no lane. */
    bool lanes = false;
    while (req->sessions) {
        wk_session *s = req->sessions;
        req->sessions = s->next;
        wk_close *c = calloc(1, sizeof(*c));
        if (c) {
            c->s = s->s;
            c->key = req->key;
            c->next = s->model->closing;
            s->model->closing = c;
            lanes |= !left_inline(ex, s->model);
        } else {
            bt_error("out of memory: a session of model %s is leaked", s->model->name);
        }
        free(s);
    }
    if (lanes)
        pthread_cond_broadcast(&ex->work);
}

void wk_executor_post_job(wk_executor *ex, wk_model *m, wk_job *job)
{
    job->next = NULL;
    if (m->jobs_tail)
        m->jobs_tail->next = job;
    else
        m->jobs = job;
    m->jobs_tail = job;
    pthread_cond_broadcast(&ex->work);
}

uint32_t wk_executor_n_queued(const wk_executor *ex)
{
    return ex->n_queued;
}

uint32_t wk_executor_n_sessions(const wk_executor *ex)
{
    return ex->n_sessions;
}

void wk_executor_count_session(wk_executor *ex, int delta)
{
    ex->n_sessions += (uint32_t)delta;
}

uint32_t wk_executor_lanes(const wk_executor *ex)
{
    return ex->opt.lanes ? ex->opt.lanes : 1;
}

/* --- running a batch -------------------------------------------------------- */

/* Opens IT's session on model M when the backend keeps sessions. */
static void open_session(wk_executor *ex, wk_model *m, wk_item *it)
{
    if (!m->backend->session_open)
        return;
    pthread_mutex_lock(ex->opt.lock);
    wk_session *s = it->req->sessions;
    while (s && s->model != m)
        s = s->next;
    pthread_mutex_unlock(ex->opt.lock);
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
    pthread_mutex_lock(ex->opt.lock);
    if (s) {
        s->model = m;
        s->s = bs;
        s->next = it->req->sessions;
        it->req->sessions = s;
        ex->n_sessions++;
    }
    pthread_mutex_unlock(ex->opt.lock);
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

/* Drops what IT's execution made and nobody took (no output, no chunk),
 * and unpins what it read.  [L] */
static void drop_slots(wk_executor *ex, wk_item *it)
{
    for (size_t i = 0; i < it->n_slots; i++) {
        wk_slot *s = it->slots[i];
        if (s->own) {
            if (s->created && !s->chunked && !in_results(it, &s->ref))
                wk_store_tensor_release(ex->opt.store, s->ref.id);
            wk_store_tensor_unpin(ex->opt.store, s->own);
        }
        if (s->map)
            wk_peers_unpin(ex->opt.peers, s->map);
        free(s);
    }
    it->n_slots = 0;
}

/* After execute: closes open streams, drops what the item made and nobody
 * took, unpins what it read, and reports its end.  [L] */
static void finish_item(wk_executor *ex, wk_item *it)
{
    bool ok = it->status == BATON_STATUS_OK && !atomic_load(&it->cancelled);
    if (it->results && it->status != BATON_STATUS_OK) {
        for (uint32_t o = 0; o < it->b.n_outputs; o++)
            free(it->results[o].host);
        memset(it->results, 0, sizeof(*it->results) * it->b.n_outputs);
    }
    for (uint32_t o = 0; ok && o < it->b.n_outputs; o++) {
        if (!it->outputs[o].stream || it->stream_closed[o])
            continue;
        /* The closing empty chunk of a stream the backend left open. */
        wk_chunk c = {.output = o, .index = it->chunk_next[o], .final = true};
        if (ex->hooks.chunk(ex->hooks.arg, it, &c) != 0)
            continue;
        it->chunk_next[o]++;
        it->stream_closed[o] = true;
    }
    drop_slots(ex, it);
    ex->hooks.item_ended(ex->hooks.arg, it);
}

/* Whether IT, which its backend deferred, can go back to the queue of its
 * model M: it ran without failing and left nothing behind (no output, no
 * chunk, no finish).  A defer after outputs fails it, and so does one on a
 * tensor-parallel model, whose ranks run every step together.  [L] */
static bool can_requeue(wk_model *m, wk_item *it)
{
    if (!it->defer || it->status != BATON_STATUS_OK || atomic_load(&it->cancelled))
        return false;
    bool left = it->finish;
    for (uint32_t o = 0; o < it->b.n_outputs && !left; o++)
        left = (it->results && it->results[o].set) || (it->chunk_next && it->chunk_next[o]);
    if (left || m->tp_size > 1) {
        char msg[400];
        if (left)
            snprintf(msg, sizeof(msg), "node '%s': the backend deferred an item after setting "
                     "its outputs", it->b.node_name);
        else
            snprintf(msg, sizeof(msg), "node '%s': model %s cannot run the item now, and a "
                     "tensor-parallel model cannot hold it back", it->b.node_name, m->name);
        wk_item_fail(it, left ? BATON_STATUS_INTERNAL : BATON_STATUS_RESOURCE_EXHAUSTED, msg);
        return false;
    }
    return true;
}

/* Undoes what running IT prepared (its inputs resolved, joins made, pins)
 * and queues it again, deferred, for its model's next change.  [L] */
static void defer_item(wk_executor *ex, wk_model *m, wk_item *it)
{
    drop_slots(ex, it);
    free(it->inputs);
    free(it->outputs);
    free(it->results);
    free(it->chunk_next);
    free(it->stream_closed);
    it->inputs = NULL, it->outputs = NULL, it->results = NULL;
    it->chunk_next = NULL, it->stream_closed = NULL;
    it->b.inputs = NULL, it->b.outputs = NULL;
    it->b.n_inputs = it->b.n_outputs = 0;
    it->prompt_tokens = it->generated_tokens = it->cached_tokens = 0;
    it->defer = false;
    it->deferred = true;
    it->defer_epoch = m->epoch;
    it->req->n_running--;
    requeue(ex, it);
}

/* On the lane that holds M, without the lock: what M's prefix cache did
 * since the last call goes to the cache hook. */
static void report_cache(wk_executor *ex, wk_model *m)
{
    baton_cache_report r = {0};
    if (m->backend->cache_report && ex->hooks.cache && m->backend->cache_report(m->handle, &r))
        ex->hooks.cache(ex->hooks.arg, m, &r);
}

/* Runs the N items of BATCH on model M.  A tensor-parallel leader first
 * hands the step to its followers: CLOSED (N_CLOSED request keys) are the
 * sessions it closed just before.  Returns whether the batch shows what
 * the model costs: execute() ran on items and deferred none (a batch that
 * only failed or deferred items was quick whatever the model is). */
static bool run_batch(wk_executor *ex, baton_ctx *ctx, wk_model *m, wk_item **batch, size_t n,
                      const uint64_t *closed, size_t n_closed)
{
    uint64_t start = bt_now_ns();
    wk_join_job *jobs = NULL;
    pthread_mutex_lock(ex->opt.lock);
    for (size_t i = 0; i < n; i++) {
        batch[i]->start_ns = start;
        batch[i]->batch_size = (uint32_t)n;
        wk_inputs_prepare(&ex->inputs_env, batch[i], &jobs);
    }
    pthread_mutex_unlock(ex->opt.lock);
    /* Joins copy outside the lock: they may move many megabytes. */
    wk_inputs_run_joins(&ex->inputs_env, jobs, ctx->stream);
    baton_item *run[n ? n : 1];
    size_t n_run = 0;
    for (size_t i = 0; i < n; i++) {
        wk_item *it = batch[i];
        if (it->status == BATON_STATUS_OK && !atomic_load(&it->cancelled))
            open_session(ex, m, it);
        if (it->status == BATON_STATUS_OK && !atomic_load(&it->cancelled))
            run[n_run++] = &it->b;
    }
    if (wk_model_leads(m) && ex->hooks.lead && (n_run || n_closed) &&
        ex->hooks.lead(ex->hooks.arg, ctx, m, closed, n_closed, run, n_run) != 0)
        n_run = 0;
    if (n_run)
        m->backend->execute(m->handle, ctx, run, n_run);
    /* Before the items' Dones: a prompt the cache now holds is known to
     * the conductor by the time a client hears back. */
    report_cache(ex, m);
    /* What the backend queued on the lane's stream is part of its outputs:
     * no Done leaves before it is written. */
    char err[384];
    int rc = wk_device_sync(ex->opt.dev, ctx->stream, err, sizeof(err));
    wk_device_exit_if_lost(ex->opt.dev, m->name);
    if (n_run)
        wk_model_exit_if_broken(m, "leader");
    for (size_t i = 0; rc && i < n; i++) {
        char msg[512];
        snprintf(msg, sizeof(msg), "node '%s': %s", batch[i]->b.node_name, err);
        wk_item_fail(batch[i], BATON_STATUS_INTERNAL, msg);
    }
    /* Small client-bound outputs in device memory are copied to the host
     * here, on the lane (they go inline in the Done), so that the I/O
     * thread that sends it never waits for the device. */
    for (size_t i = 0; !rc && i < n; i++) {
        wk_item *it = batch[i];
        if (it->status != BATON_STATUS_OK || atomic_load(&it->cancelled) || !it->results)
            continue;
        for (uint32_t o = 0; o < it->b.n_outputs; o++) {
            wk_result *r = &it->results[o];
            if (r->set && !it->outputs[o].stream && !r->host)
                r->host = wk_ctx_inline_copy(&ex->ctx_env, ctx->stream, r->data, r->device,
                                             r->ref.nbytes, it->outputs[o].client);
        }
    }
    uint64_t end = bt_now_ns();
    pthread_mutex_lock(ex->opt.lock);
    bool ended = false, deferred = false;
    for (size_t i = 0; i < n; i++) {
        if (!rc && can_requeue(m, batch[i])) {
            defer_item(ex, m, batch[i]);
            deferred = true;
            continue;
        }
        batch[i]->end_ns = end;
        finish_item(ex, batch[i]);
        ended = true;
    }
    /* An item's end may have given back what a deferred one waits for. */
    if (ended)
        m->epoch++;
    pthread_mutex_unlock(ex->opt.lock);
    return n_run > 0 && !deferred;
}

/* --- lanes ---------------------------------------------------------------- */


/* Whether M has work: queued items that may run, sessions to close, jobs.
 * [L] */
static bool has_work(const wk_model *m)
{
    bool work = m->closing != NULL || m->jobs != NULL;
    for (wk_queue *q = m->queues; q && !work; q = q->next)
        work = first_ready(m, q) != NULL;
    return work;
}

/* An idle model with work, moved to the end of the list so the next pick
 * starts after it.  A lane that is awake anyway may take a model that runs
 * inline too: whoever holds a model runs it.  [L] */
static wk_model *pick_model(wk_executor *ex)
{
    wk_model **pp = &ex->models;
    for (wk_model *m = ex->models; m; pp = &m->next, m = m->next) {
        if (m->busy || !has_work(m))
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

/* Closes the sessions of CLOSING on M (the lane holds M); a leader lists
 * their request keys into *KEYS (malloc'd; NULL when it cannot) for its
 * followers.  Returns how many were closed. */
static uint32_t close_sessions(wk_model *m, wk_close *closing, bool lead, uint64_t **keys)
{
    uint32_t n = 0;
    for (wk_close *c = closing; c; c = c->next)
        n++;
    *keys = lead && n ? calloc(n, sizeof(**keys)) : NULL;
    size_t k = 0;
    for (wk_close *c = closing, *nx; c; c = nx) {
        nx = c->next;
        if (*keys)
            (*keys)[k++] = c->key;
        if (m->backend->session_close)
            m->backend->session_close(m->handle, c->s);
        free(c);
    }
    return n;
}

/* Runs one step of M, which the caller has just picked, on CTX and STREAM:
 * the sessions due to close, a batch of one mode's items, then its jobs.
 * Entered and left with the lock held, which it drops meanwhile.  Returns
 * the items the batch took.  [L] */
static size_t lane_step(wk_executor *ex, baton_ctx *ctx, void *stream, wk_model *m)
{
    m->busy = true;
    m->busy_since_ns = bt_now_ns();
    wk_close *closing = m->closing;
    m->closing = NULL;
    wk_job *jobs = m->jobs;
    m->jobs = m->jobs_tail = NULL;
    /* The mode whose first item that may run has waited longest goes
     * first. */
    wk_queue *q = NULL;
    wk_item *oldest = NULL;
    for (wk_queue *c = m->queues; c; c = c->next) {
        wk_item *h = first_ready(m, c);
        if (h && (!oldest || h->arrive_ns < oldest->arrive_ns))
            q = c, oldest = h;
    }
    size_t cap = m->max_batch ? m->max_batch : 1, n = 0, n_def = 0;
    wk_item *batch[cap], *waited[cap];
    /* Places go to items never deferred first, in order; then to
     * deferred ones that may run now, in the places left: one that
     * waits for a decoding slot must not take the place of an item
     * holding one.  The deferred ones then go first in the batch, so
     * that a backend handing out what was given back in batch order
     * gives it to the item that has waited longest, not to one that
     * has just come. */
    for (int pass = 0; q && pass < 2; pass++)
        for (wk_item *it = q->head, *nx; it && n + n_def < cap; it = nx) {
            nx = it->next;
            if (it->deferred != (pass == 1) || !ready(m, it))
                continue;
            wk_executor_dequeue(ex, it);
            it->state = WK_ITEM_RUNNING;
            it->req->n_running++;
            if (pass == 1)
                waited[n_def++] = it;
            else
                batch[n++] = it;
        }
    if (n_def) {
        memmove(batch + n_def, batch, n * sizeof(*batch));
        memcpy(batch, waited, n_def * sizeof(*batch));
        n += n_def;
    }
    pthread_mutex_unlock(ex->opt.lock);
    /* The step is timed whole, session closes included: all of it runs on
     * the I/O thread when the model runs inline. */
    uint64_t t0 = bt_now_ns();
    /* A tensor-parallel leader names the sessions it closes in its
     * next step, so that its followers close theirs at the same point. */
    uint64_t *keys;
    bool lead = wk_model_leads(m);
    uint32_t closed = close_sessions(m, closing, lead, &keys);
    if (closed)
        report_cache(ex, m);
    size_t n_keys = lead ? closed : 0;
    bool shows = false;
    if (n || n_keys)
        shows = run_batch(ex, ctx, m, batch, n, keys, n_keys);
    uint64_t wall = bt_now_ns() - t0;
    free(keys);
    for (wk_job *j = jobs, *nx; j; j = nx) {
        nx = j->next;
        j->run(j, m, stream);
    }
    pthread_mutex_lock(ex->opt.lock);
    ex->n_sessions -= closed;
    /* A closed session may have given back what a deferred item waits
     * for. */
    if (closed)
        m->epoch++;
    /* Any slow step sends the model back to the lanes; only a batch that
     * shows what the model costs counts towards running it inline. */
    if (ex->opt.inline_ns && m->tp_size <= 1) {
        if (wall > ex->opt.inline_ns)
            m->quick = 0;
        else if (shows && m->quick < WK_INLINE_AFTER)
            m->quick++;
    }
    m->busy = false;
    return n;
}

static void *lane_main(void *arg)
{
    wk_executor *ex = arg;
    baton_ctx ctx;
    void *stream = NULL;
    char err[384];
    if (wk_device_stream_create(ex->opt.dev, &stream, err, sizeof(err)) != 0) {
        bt_error("a compute lane cannot create its stream: %s; exiting", err);
        _exit(WK_EXIT_DEVICE_LOST);
    }
    wk_ctx_init(&ctx, &ex->ctx_env, stream);
    pthread_mutex_lock(ex->opt.lock);
    for (;;) {
        wk_model *m = NULL;
        while (!atomic_load(ex->opt.stopping) && !(m = pick_model(ex)))
            pthread_cond_wait(&ex->work, ex->opt.lock);
        if (!m)
            break;
        lane_step(ex, &ctx, stream, m);
        /* Another lane may take this model now. */
        pthread_cond_broadcast(&ex->work);
    }
    pthread_mutex_unlock(ex->opt.lock);
    wk_device_stream_destroy(ex->opt.dev, stream);
    return NULL;
}

/* --- the inline thread ------------------------------------------------------ */

void wk_executor_inline_thread(wk_executor *ex)
{
    pthread_mutex_lock(ex->opt.lock);
    ex->inline_thread = pthread_self();
    ex->has_inline = ex->opt.inline_ns > 0;
    /* The inline thread runs host models only: their stream is NULL. */
    wk_ctx_init(&ex->inline_ctx, &ex->ctx_env, NULL);
    pthread_mutex_unlock(ex->opt.lock);
}

bool wk_executor_run_inline(wk_executor *ex)
{
    pthread_mutex_lock(ex->opt.lock);
    uint64_t t0 = bt_now_ns();
    /* Passes of one step per model, so that models take turns, until no
     * work is left to this thread or the passes have run for inline_ns:
     * then the caller reads its socket and sends the steps' Dones (in one
     * message) before it comes back.  A run-ahead chain thus advances
     * several iterations per message, as on a lane, without keeping the
     * socket waiting long. */
    do {
        ex->inline_due = false;
        uint64_t round = ++ex->inline_round;
        while (!atomic_load(ex->opt.stopping)) {
            wk_model *m = ex->models;
            while (m && (m->inline_round == round || m->busy || !runs_inline(ex, m) ||
                         !has_work(m)))
                m = m->next;
            if (!m)
                break;
            m->inline_round = round;
            if (lane_step(ex, &ex->inline_ctx, NULL, m))
                ex->inline_batches++;
            /* Work its step left for M (a successor it queued, a deferred
             * item its ended items or closed sessions made ready) is this
             * thread's while M runs inline; a slow step has just sent M
             * back to the lanes, and then a lane must take it, or it would
             * wait for work that may never come. */
            if (has_work(m))
                wake_for(ex, m);
        }
    } while (ex->inline_due && bt_now_ns() - t0 < ex->opt.inline_ns);
    bool due = ex->inline_due;
    pthread_mutex_unlock(ex->opt.lock);
    return due;
}

bool wk_executor_inline_due(wk_executor *ex)
{
    pthread_mutex_lock(ex->opt.lock);
    bool due = ex->inline_due;
    pthread_mutex_unlock(ex->opt.lock);
    return due;
}

uint64_t wk_executor_inline_batches(const wk_executor *ex)
{
    return ex->inline_batches;
}

/* --- life ------------------------------------------------------------------- */

int wk_executor_create(const wk_executor_options *opt, const wk_executor_hooks *hooks,
                       wk_executor **out)
{
    *out = NULL;
    wk_executor *ex = calloc(1, sizeof(*ex));
    if (!ex)
        return BT_ENOMEM;
    ex->opt = *opt;
    ex->hooks = *hooks;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    /* Sleeps measure monotonic time: a clock step must not stretch them. */
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ex->work, NULL);
    pthread_cond_init(&ex->wake, &ca);
    pthread_condattr_destroy(&ca);
    ex->ctx_env = (wk_ctx_env){opt->lock, &ex->wake, opt->stopping, opt->store, opt->dev,
                               opt->worker, opt->device, opt->threads, hooks->chunk, hooks->arg};
    ex->inputs_env = (wk_inputs_env){opt->store, opt->peers, opt->dev, opt->worker};
    *out = ex;
    return 0;
}

int wk_executor_start(wk_executor *ex)
{
    uint32_t n = wk_executor_lanes(ex);
    if (!(ex->lanes = calloc(n, sizeof(*ex->lanes))))
        return BT_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        if (pthread_create(&ex->lanes[i], NULL, lane_main, ex) != 0)
            return BT_ETHREAD;
        ex->n_lanes = i + 1;
    }
    return 0;
}

void wk_executor_stop(wk_executor *ex)
{
    if (!ex)
        return;
    pthread_mutex_lock(ex->opt.lock);
    pthread_cond_broadcast(&ex->work);
    pthread_cond_broadcast(&ex->wake);
    pthread_mutex_unlock(ex->opt.lock);
    for (uint32_t i = 0; i < ex->n_lanes; i++)
        pthread_join(ex->lanes[i], NULL);
    free(ex->lanes);
    ex->lanes = NULL;
    ex->n_lanes = 0;
}

void wk_executor_destroy(wk_executor *ex)
{
    if (!ex)
        return;
    wk_executor_stop(ex);
    while (ex->models) {
        wk_model *m = ex->models;
        ex->models = m->next;
        for (wk_close *c = m->closing, *nx; c; c = nx) {
            nx = c->next;
            if (m->backend->session_close)
                m->backend->session_close(m->handle, c->s);
            ex->n_sessions--;
            free(c);
        }
        for (wk_job *j = m->jobs, *nx; j; j = nx) {
            nx = j->next;
            j->drop(j);
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
    pthread_cond_destroy(&ex->wake);
    pthread_cond_destroy(&ex->work);
    free(ex);
}
