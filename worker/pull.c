/* Parked dispatches and the producer's side of pulls (pull.h). */
#include "worker/pull.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/log.h"
#include "common/status.h"
#include "worker/wire.h"
#include "worker/xfer.h"

/* One chunk to pull. */
typedef struct pull_entry {
    struct pull_job *job;
    Baton__V1__TensorPart *part;  /* the part it belongs to (transfer rewritten) */
    Baton__V1__TensorRef *ref;    /* the chunk reference (rewritten when done) */
    wk_tensor *dst;               /* own tensor receiving it, pinned until the job ends */
    wk_ref src;                   /* the reference as the conductor sent it */
    bool cached;                  /* DST is the request's copy from an earlier iteration */
    uint64_t xfer_id;             /* the pull in flight; 0 when none */
} pull_entry;

/* A dispatch parked until its pulls complete. */
typedef struct pull_job {
    wk_dispatch *disp;            /* a reference held */
    wk_request *req;
    pull_entry *e;
    size_t n, left;               /* entries; entries still pulling */
    struct pull_job *prev, *next; /* in p->jobs */
} pull_job;

struct wk_pull {
    wk_pull_options opt;
    wk_pull_hooks hooks;
    void *zctx;                   /* owned: the worker-to-worker sockets' context */
    wk_xfer *xfer;                /* owned: the worker-to-worker sockets */
    pull_job *jobs;               /* [L] parked dispatches */
};

bool wk_pull_needed(const Baton__V1__Dispatch *d)
{
    for (size_t k = 0; k < d->n_inputs; k++)
        for (size_t q = 0; q < d->inputs[k]->n_parts; q++)
            if (d->inputs[k]->parts[q]->transfer ==
                    BATON__V1__TRANSFER_KIND__TRANSFER_KIND_SOCKET &&
                d->inputs[k]->parts[q]->n_chunks)
                return true;
    return false;
}

/* Unlinks and frees JOB: cancels its pulls, releases its copies (none was
 * handed to the dispatch yet) and drops its dispatch reference; collects
 * its request record when GC (a caller that goes on using the record
 * collects it itself).  [L] */
static void job_free(wk_pull *p, pull_job *job, bool gc)
{
    for (size_t i = 0; i < job->n; i++) {
        pull_entry *e = &job->e[i];
        if (e->xfer_id)
            wk_xfer_cancel(p->xfer, e->xfer_id);
        if (e->dst) {
            uint64_t id = e->dst->ref.id;
            wk_store_tensor_unpin(p->opt.store, e->dst);
            if (!e->cached)
                wk_store_tensor_release(p->opt.store, id);
        }
    }
    if (job->prev)
        job->prev->next = job->next;
    else if (p->jobs == job)
        p->jobs = job->next;
    if (job->next)
        job->next->prev = job->prev;
    wk_item_dispatch_unref(job->disp);
    wk_request *req = job->req;
    free(job->e);
    free(job);
    if (gc)
        wk_store_request_gc(p->opt.store, req);
}

/* Fails JOB's dispatch with CODE and MESSAGE and frees it.  [L] */
static void job_fail(wk_pull *p, pull_job *job, baton_status code, const char *message)
{
    if (!job->req->closed && !atomic_load(p->opt.stopping))
        wk_wire_refuse(p->opt.sock, job->disp->d, code, message);
    job_free(p, job, true);
}

/* Every pull of JOB completed: its references now name the copies, and the
 * dispatch starts.  [L] */
static void job_finish(wk_pull *p, pull_job *job)
{
    wk_dispatch *disp = job->disp;
    uint64_t *ids = calloc(job->n, sizeof(*ids));
    if (!ids) {
        job_fail(p, job, BATON_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
        return;
    }
    size_t n_ids = 0;
    bool loop = disp->d->n_iteration > 0;
    for (size_t i = 0; i < job->n; i++) {
        pull_entry *e = &job->e[i];
        e->ref->owner = wk_store_self(p->opt.store);
        e->ref->pool = e->dst->ref.pool;
        e->ref->offset = e->dst->ref.offset;
        e->ref->id = e->dst->ref.id;
        e->part->transfer = BATON__V1__TRANSFER_KIND__TRANSFER_KIND_LOCAL;
        /* A copy kept for the request's next iterations is the request's;
         * any other is the dispatch's. */
        if (!e->cached && !(loop && wk_store_staged_add(job->req, &e->src, e->dst->ref.id) == 0))
            ids[n_ids++] = e->dst->ref.id;
        wk_store_tensor_unpin(p->opt.store, e->dst);
        e->dst = NULL;
    }
    free(disp->pulled);
    disp->pulled = ids;
    disp->n_pulled = n_ids;
    disp->refs++; /* held across the start, which may drop the last other reference */
    p->hooks.start(p->hooks.arg, disp, job->req);
    job_free(p, job, true);
    wk_item_dispatch_unref(disp);
}

/* xfer.c's pull_done: one chunk's pull ended.  I/O thread, without the lock. */
static void on_pull_done(void *arg, void *cookie, baton_status code, const char *message)
{
    wk_pull *p = arg;
    pull_entry *e = cookie;
    pull_job *job = e->job;
    pthread_mutex_lock(p->opt.lock);
    e->xfer_id = 0;
    if (code == BATON_STATUS_OK && !e->cached)
        wk_device_count_staged(p->opt.dev, e->src.nbytes);
    if (code != BATON_STATUS_OK) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "node '%s': %s", job->disp->d->node_name, message);
        job_fail(p, job, code, msg);
    } else if (--job->left == 0) {
        job_finish(p, job);
    }
    pthread_mutex_unlock(p->opt.lock);
}

void wk_pull_start(wk_pull *p, wk_dispatch *disp, wk_request *req)
{
    const Baton__V1__Dispatch *d = disp->d;
    Baton__V1__Dispatch *md = disp->msg->dispatch;
    char why[768];
    baton_status code = BATON_STATUS_RESOURCE_EXHAUSTED;
    pthread_mutex_lock(p->opt.lock);
    pull_job *job = calloc(1, sizeof(*job));
    size_t n = 0;
    for (size_t k = 0; k < d->n_inputs; k++)
        for (size_t q = 0; q < d->inputs[k]->n_parts; q++)
            if (d->inputs[k]->parts[q]->transfer == BATON__V1__TRANSFER_KIND__TRANSFER_KIND_SOCKET)
                n += d->inputs[k]->parts[q]->n_chunks;
    if (!job || !(job->e = calloc(n ? n : 1, sizeof(*job->e)))) {
        free(job);
        wk_wire_refuse(p->opt.sock, d, code, "out of host memory");
        wk_item_dispatch_unref(disp);
        wk_store_request_gc(p->opt.store, req);
        pthread_mutex_unlock(p->opt.lock);
        return;
    }
    job->disp = disp;
    job->req = req;
    job->next = p->jobs;
    if (job->next)
        job->next->prev = job;
    p->jobs = job;
    if (wk_device_space(p->opt.dev) != WK_SPACE_HOST) {
        code = BATON_STATUS_FAILED_PRECONDITION;
        snprintf(why, sizeof(why), "node '%s': worker %s is a GPU worker and an input lies on "
                 "another host: cross-host GPU transfers are not built", d->node_name,
                 p->opt.worker);
        goto fail;
    }
    /* Destinations first, under the lock; the pulls start after it is
     * dropped, since a pull may end (and call back) at once. */
    for (size_t k = 0; k < md->n_inputs; k++)
        for (size_t q = 0; q < md->inputs[k]->n_parts; q++) {
            Baton__V1__TensorPart *part = md->inputs[k]->parts[q];
            if (part->transfer != BATON__V1__TRANSFER_KIND__TRANSFER_KIND_SOCKET)
                continue;
            for (size_t c = 0; c < part->n_chunks; c++) {
                wk_ref r;
                char err[512];
                if (wk_wire_ref_from_proto(part->chunks[c], wk_store_self(p->opt.store), &r, err,
                                           sizeof(err)) != 0) {
                    code = BATON_STATUS_INVALID_ARGUMENT;
                    snprintf(why, sizeof(why), "node '%s' input '%s': %s", d->node_name,
                             md->inputs[k]->name, err);
                    goto fail;
                }
                pull_entry *e = &job->e[job->n];
                e->job = job;
                e->part = part;
                e->ref = part->chunks[c];
                e->src = r;
                wk_tensor *have =
                    d->n_iteration ? wk_store_staged_find(p->opt.store, req, &r) : NULL;
                if (have) {
                    have->pins++;
                    e->dst = have;
                    e->cached = true;
                } else if (!(e->dst = wk_store_tensor_new(p->opt.store, req, r.dtype, r.ndim,
                                                          r.dims, true))) {
                    wk_pool_stats st;
                    wk_store_pool_stats(p->opt.store, &st);
                    snprintf(why, sizeof(why), "node '%s' input '%s': no room in the pool of "
                             "worker %s for %" PRIu64 " bytes from worker %u (largest free "
                             "block %" PRIu64 ")", d->node_name, md->inputs[k]->name,
                             p->opt.worker, r.nbytes, r.owner, st.largest_free);
                    goto fail;
                }
                job->n++;
            }
        }
    job->left = job->n;
    pthread_mutex_unlock(p->opt.lock);
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(p->opt.lock);
        /* An earlier pull may have ended the job already (its producer
         * was found lost at once). */
        bool alive = false;
        for (pull_job *j = p->jobs; j && !alive; j = j->next)
            alive = j == job;
        if (!alive) {
            pthread_mutex_unlock(p->opt.lock);
            return;
        }
        pull_entry *e = &job->e[i];
        const Baton__V1__TensorRef *r = e->ref;
        wk_xfer_src src = {r->id, r->pool, r->offset, r->nbytes};
        void *dst = wk_store_tensor_data(p->opt.store, e->dst);
        uint32_t owner = r->owner;
        pthread_mutex_unlock(p->opt.lock);
        char err[512];
        if (src.nbytes == 0 || e->cached) {
            on_pull_done(p, e, BATON_STATUS_OK, "");
            continue;
        }
        /* A pull that returns an id may already have ended (and ended the
         * job) through its callback; one that returns 0 never called it. */
        e->xfer_id = UINT64_MAX;
        uint64_t id = wk_xfer_pull(p->xfer, owner, &src, dst, e, err, sizeof(err));
        if (!id) {
            e->xfer_id = 0;
            on_pull_done(p, e, BATON_STATUS_UNAVAILABLE, err);
            continue;
        }
        pthread_mutex_lock(p->opt.lock);
        for (pull_job *j = p->jobs; j; j = j->next)
            if (j == job && e->xfer_id == UINT64_MAX)
                e->xfer_id = id;
        pthread_mutex_unlock(p->opt.lock);
    }
    return;
fail:
    job_fail(p, job, code, why);
    pthread_mutex_unlock(p->opt.lock);
}

void wk_pull_request_closed(wk_pull *p, wk_request *req)
{
    for (pull_job *j = p->jobs, *nx; j; j = nx) {
        nx = j->next;
        if (j->req == req)
            job_free(p, j, false);
    }
}

/* Whether parked dispatch D is of request KEY's node (GRAPH, NODE). */
static bool job_is(const Baton__V1__Dispatch *d, uint64_t key, uint32_t graph, uint32_t node)
{
    return d->request_key == key && d->graph == graph && d->node == node;
}

void wk_pull_extend(wk_pull *p, const Baton__V1__Extend *e)
{
    /* The window opens when the dispatch starts: widen it in the message. */
    for (pull_job *j = p->jobs; j; j = j->next) {
        Baton__V1__Dispatch *md = j->disp->msg->dispatch;
        if (job_is(md, e->request_key, e->graph, e->node) &&
            (!e->dispatch_id || md->dispatch_id == e->dispatch_id) && e->upto > md->speculate_upto)
            md->speculate_upto = e->upto;
    }
}

void wk_pull_drop(wk_pull *p, const Baton__V1__Drop *dr)
{
    size_t depth = dr->n_from_iteration;
    for (pull_job *j = p->jobs, *nx; j; j = nx) {
        nx = j->next;
        Baton__V1__Dispatch *md = j->disp->msg->dispatch;
        if (!job_is(md, dr->request_key, dr->graph, dr->node) || md->n_iteration != depth)
            continue;
        if (depth && memcmp(md->iteration, dr->from_iteration,
                            sizeof(uint32_t) * (depth - 1)) != 0)
            continue;
        uint32_t from = depth ? dr->from_iteration[depth - 1] : 0;
        if (!depth || md->iteration[depth - 1] >= from) {
            /* Discarded: no Done is due for it. */
            job_free(p, j, true);
        } else if (md->speculate_upto >= from) {
            /* Its window must not run into the discarded iterations. */
            md->speculate_upto = from - 1;
        }
    }
}

void wk_pull_cancel_all(wk_pull *p)
{
    while (p->jobs)
        job_free(p, p->jobs, true);
}

/* --- the producer's side of the worker ---------------------------------- */

static baton_status xfer_pin(void *arg, uint64_t tensor_id, wk_xfer_src *held,
                             const uint8_t **data, void **pin, char *err, size_t errlen)
{
    wk_pull *p = arg;
    if (wk_device_space(p->opt.dev) != WK_SPACE_HOST) {
        snprintf(err, errlen, "worker %s is a GPU worker: cross-host GPU transfers are not "
                 "built", p->opt.worker);
        return BATON_STATUS_FAILED_PRECONDITION;
    }
    pthread_mutex_lock(p->opt.lock);
    wk_tensor *t = wk_store_tensor_find(p->opt.store, tensor_id);
    if (!t) {
        pthread_mutex_unlock(p->opt.lock);
        snprintf(err, errlen, "tensor %" PRIu64 " is not held by worker %s (released, or of "
                 "an earlier incarnation)", tensor_id, p->opt.worker);
        return BATON_STATUS_NOT_FOUND;
    }
    t->pins++;
    *held = (wk_xfer_src){t->ref.id, t->ref.pool, t->ref.offset, t->ref.nbytes};
    *data = wk_store_tensor_data(p->opt.store, t);
    *pin = t;
    pthread_mutex_unlock(p->opt.lock);
    return BATON_STATUS_OK;
}

static void xfer_unpin(void *arg, void *pin)
{
    wk_pull *p = arg;
    wk_tensor *t = pin;
    pthread_mutex_lock(p->opt.lock);
    wk_request *req = t->req;
    wk_store_tensor_unpin(p->opt.store, t);
    wk_store_request_gc(p->opt.store, req);
    pthread_mutex_unlock(p->opt.lock);
}

/* --- life ---------------------------------------------------------------------- */

int wk_pull_create(const wk_pull_options *opt, const wk_pull_hooks *hooks, wk_pull **out,
                   char *err, size_t errlen)
{
    static const wk_xfer_ops ops = {xfer_pin, xfer_unpin, on_pull_done};
    *out = NULL;
    wk_pull *p = calloc(1, sizeof(*p));
    if (!p)
        return bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
    p->opt = *opt;
    p->hooks = *hooks;
    if (!(p->zctx = zmq_ctx_new())) {
        free(p);
        return bt_errorf(err, errlen, BT_EIO, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    }
    int rc = wk_xfer_create(p->zctx, opt->loop, opt->listen, opt->own, opt->wake_fd, &ops, p,
                            &p->xfer, err, errlen);
    if (rc) {
        zmq_ctx_term(p->zctx);
        free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void wk_pull_close(wk_pull *p)
{
    if (!p)
        return;
    wk_xfer_close(p->xfer);
    if (p->zctx)
        zmq_ctx_term(p->zctx);
    p->zctx = NULL;
}

void wk_pull_destroy(wk_pull *p)
{
    if (!p)
        return;
    wk_xfer_destroy(p->xfer);
    free(p);
}

const char *wk_pull_endpoint(const wk_pull *p)
{
    return wk_xfer_endpoint(p->xfer);
}

int wk_pull_peer(wk_pull *p, const Baton__V1__PeerInfo *pi)
{
    int rc = wk_xfer_peer_update(p->xfer, pi->index, pi->name, pi->peer_endpoint,
                                 pi->incarnation, pi->up);
    return rc ? rc : wk_xfer_peer_key(p->xfer, pi->index, pi->curve_public_key);
}

void wk_pull_drain(wk_pull *p)
{
    wk_xfer_drain_unpins(p->xfer);
}

long wk_pull_tick(wk_pull *p, uint64_t now_ns)
{
    return wk_xfer_tick(p->xfer, now_ns);
}
