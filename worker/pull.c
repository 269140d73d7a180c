/* Dispatches whose inputs lie on another host: parked while their
 * TRANSFER_KIND_SOCKET chunks are pulled into the own pool (xfer.c), then
 * started like any other dispatch.
 *
 * Each SOCKET chunk gets a tensor of the dispatching request in the own
 * pool, pinned while the bytes arrive.  When the last pull of the dispatch
 * completes, its chunk references are rewritten in place to name those
 * tensors (owner = this worker, transfer LOCAL), so input resolution,
 * joins and run-ahead iterations see ordinary local tensors.  The copies
 * belong to the dispatch: they are released when its last item or chain
 * lets go of it (wk_dispatch_unref), or with the request at SessionClose.
 * Inside a loop, where every iteration's dispatch names the same value (a
 * persisted one, such as a handed-off cache), the copy belongs to the
 * request instead and later iterations reuse it, as inputs.c does with
 * values it stages: one pull per request, not per step.
 *
 * A pull that fails fails its dispatch with one Done carrying the pull's
 * status (UNAVAILABLE naming the producer when it was lost); the other
 * pulls of that dispatch are cancelled.  Every pull of a dispatch
 * proceeds at once, and so do those of other dispatches: the I/O thread
 * never waits for bytes. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/worker_internal.h"
#include "worker/xfer.h"

/* One chunk to pull. */
typedef struct pull_entry {
    struct wk_pull_job *job;
    Baton__V1__TensorPart *part;  /* the part it belongs to (transfer rewritten) */
    Baton__V1__TensorRef *ref;    /* the chunk reference (rewritten when done) */
    wk_tensor *dst;               /* own tensor receiving it, pinned until the job ends */
    wk_ref src;                   /* the reference as the conductor sent it */
    bool cached;                  /* DST is the request's copy from an earlier iteration */
    uint64_t xfer_id;             /* the pull in flight; 0 when none */
} pull_entry;

/* A dispatch parked until its pulls complete. */
struct wk_pull_job {
    wk_dispatch *disp;            /* a reference held */
    wk_request *req;
    pull_entry *e;
    size_t n, left;               /* entries; entries still pulling */
    struct wk_pull_job *prev, *next; /* in w->pull_jobs */
};

bool wk_pull_needed(const Baton__V1__Dispatch *d)
{
    for (size_t k = 0; k < d->n_inputs; k++)
        for (size_t p = 0; p < d->inputs[k]->n_parts; p++)
            if (d->inputs[k]->parts[p]->transfer == BATON__V1__TRANSFER_KIND__TRANSFER_KIND_SOCKET &&
                d->inputs[k]->parts[p]->n_chunks)
                return true;
    return false;
}

/* Unlinks and frees JOB: cancels its pulls, releases its copies (none was
 * handed to the dispatch yet) and drops its dispatch reference; collects
 * its request record when GC (a caller that goes on using the record
 * collects it itself).  [L] */
static void job_free(wk_worker *w, wk_pull_job *job, bool gc)
{
    for (size_t i = 0; i < job->n; i++) {
        pull_entry *e = &job->e[i];
        if (e->xfer_id)
            wk_xfer_cancel(w->xfer, e->xfer_id);
        if (e->dst) {
            uint64_t id = e->dst->ref.id;
            wk_tensor_unpin(w, e->dst);
            if (!e->cached)
                wk_tensor_release(w, id);
        }
    }
    if (job->prev)
        job->prev->next = job->next;
    else if (w->pull_jobs == job)
        w->pull_jobs = job->next;
    if (job->next)
        job->next->prev = job->prev;
    wk_dispatch_unref(job->disp);
    wk_request *req = job->req;
    free(job->e);
    free(job);
    if (gc)
        wk_request_gc(w, req);
}

/* Fails JOB's dispatch with CODE and MESSAGE and frees it.  [L] */
static void job_fail(wk_worker *w, wk_pull_job *job, baton_status code, const char *message)
{
    if (!job->req->closed && !atomic_load(&w->stopping))
        wk_dispatch_refuse(w, job->disp->d, code, message);
    job_free(w, job, true);
}

/* Every pull of JOB completed: its references now name the copies, and the
 * dispatch starts.  [L] */
static void job_finish(wk_worker *w, wk_pull_job *job)
{
    wk_dispatch *disp = job->disp;
    uint64_t *ids = calloc(job->n, sizeof(*ids));
    if (!ids) {
        job_fail(w, job, BATON_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
        return;
    }
    size_t n_ids = 0;
    bool loop = disp->d->n_iteration > 0;
    for (size_t i = 0; i < job->n; i++) {
        pull_entry *e = &job->e[i];
        e->ref->owner = w->self_index;
        e->ref->pool = e->dst->ref.pool;
        e->ref->offset = e->dst->ref.offset;
        e->ref->id = e->dst->ref.id;
        e->part->transfer = BATON__V1__TRANSFER_KIND__TRANSFER_KIND_LOCAL;
        /* A copy kept for the request's next iterations is the request's;
         * any other is the dispatch's. */
        if (!e->cached && !(loop && wk_staged_add(job->req, &e->src, e->dst->ref.id) == 0))
            ids[n_ids++] = e->dst->ref.id;
        wk_tensor_unpin(w, e->dst);
        e->dst = NULL;
    }
    free(disp->pulled);
    disp->pulled = ids;
    disp->n_pulled = n_ids;
    disp->w = w;
    disp->refs++; /* held across the start, which may drop the last other reference */
    wk_dispatch_start(w, disp, job->req);
    job_free(w, job, true);
    wk_dispatch_unref(disp);
}

/* xfer.c's pull_done: one chunk's pull ended.  I/O thread, without the lock. */
static void on_pull_done(void *arg, void *cookie, baton_status code, const char *message)
{
    wk_worker *w = arg;
    pull_entry *e = cookie;
    wk_pull_job *job = e->job;
    pthread_mutex_lock(&w->lock);
    e->xfer_id = 0;
    if (code == BATON_STATUS_OK && !e->cached)
        wk_device_count_staged(w->dev, e->src.nbytes);
    if (code != BATON_STATUS_OK) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "node '%s': %s", job->disp->d->node_name, message);
        job_fail(w, job, code, msg);
    } else if (--job->left == 0) {
        job_finish(w, job);
    }
    pthread_mutex_unlock(&w->lock);
}

void wk_pull_start(wk_worker *w, wk_dispatch *disp, wk_request *req)
{
    const Baton__V1__Dispatch *d = disp->d;
    Baton__V1__Dispatch *md = disp->msg->dispatch;
    char why[768];
    baton_status code = BATON_STATUS_RESOURCE_EXHAUSTED;
    pthread_mutex_lock(&w->lock);
    wk_pull_job *job = calloc(1, sizeof(*job));
    size_t n = 0;
    for (size_t k = 0; k < d->n_inputs; k++)
        for (size_t p = 0; p < d->inputs[k]->n_parts; p++)
            if (d->inputs[k]->parts[p]->transfer == BATON__V1__TRANSFER_KIND__TRANSFER_KIND_SOCKET)
                n += d->inputs[k]->parts[p]->n_chunks;
    disp->refs++;
    if (!job || !(job->e = calloc(n ? n : 1, sizeof(*job->e)))) {
        free(job);
        wk_dispatch_refuse(w, d, code, "out of host memory");
        wk_dispatch_unref(disp);
        wk_request_gc(w, req);
        pthread_mutex_unlock(&w->lock);
        return;
    }
    job->disp = disp;
    job->req = req;
    job->next = w->pull_jobs;
    if (job->next)
        job->next->prev = job;
    w->pull_jobs = job;
    if (wk_device_space(w->dev) != WK_SPACE_HOST) {
        code = BATON_STATUS_FAILED_PRECONDITION;
        snprintf(why, sizeof(why), "node '%s': worker %s is a GPU worker and an input lies on "
                 "another host: cross-host GPU transfers are not built", d->node_name,
                 w->opt.name);
        goto fail;
    }
    /* Destinations first, under the lock; the pulls start after it is
     * dropped, since a pull may end (and call back) at once. */
    for (size_t k = 0; k < md->n_inputs; k++)
        for (size_t p = 0; p < md->inputs[k]->n_parts; p++) {
            Baton__V1__TensorPart *part = md->inputs[k]->parts[p];
            if (part->transfer != BATON__V1__TRANSFER_KIND__TRANSFER_KIND_SOCKET)
                continue;
            for (size_t c = 0; c < part->n_chunks; c++) {
                wk_ref r;
                char err[512];
                if (wk_ref_from_proto(w, part->chunks[c], &r, err, sizeof(err)) != 0) {
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
                wk_tensor *have = d->n_iteration ? wk_staged_find(w, req, &r) : NULL;
                if (have) {
                    have->pins++;
                    e->dst = have;
                    e->cached = true;
                } else if (!(e->dst = wk_tensor_new(w, req, r.dtype, r.ndim, r.dims, true))) {
                    wk_pool_stats st;
                    wk_pool_get_stats(w->pool, &st);
                    snprintf(why, sizeof(why), "node '%s' input '%s': no room in the pool of "
                             "worker %s for %" PRIu64 " bytes from worker %u (largest free "
                             "block %" PRIu64 ")", d->node_name, md->inputs[k]->name,
                             w->opt.name, r.nbytes, r.owner, st.largest_free);
                    goto fail;
                }
                job->n++;
            }
        }
    job->left = job->n;
    pthread_mutex_unlock(&w->lock);
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&w->lock);
        /* An earlier pull may have ended the job already (its producer
         * was found lost at once). */
        bool alive = false;
        for (wk_pull_job *j = w->pull_jobs; j && !alive; j = j->next)
            alive = j == job;
        if (!alive) {
            pthread_mutex_unlock(&w->lock);
            return;
        }
        pull_entry *e = &job->e[i];
        const Baton__V1__TensorRef *r = e->ref;
        wk_xfer_src src = {r->id, r->pool, r->offset, r->nbytes};
        void *dst = wk_tensor_data(w, e->dst);
        uint32_t owner = r->owner;
        pthread_mutex_unlock(&w->lock);
        char err[512];
        if (src.nbytes == 0 || e->cached) {
            on_pull_done(w, e, BATON_STATUS_OK, "");
            continue;
        }
        /* A pull that returns an id may already have ended (and ended the
         * job) through its callback; one that returns 0 never called it. */
        e->xfer_id = UINT64_MAX;
        uint64_t id = wk_xfer_pull(w->xfer, owner, &src, dst, e, err, sizeof(err));
        if (!id) {
            e->xfer_id = 0;
            on_pull_done(w, e, BATON_STATUS_UNAVAILABLE, err);
            continue;
        }
        pthread_mutex_lock(&w->lock);
        for (wk_pull_job *j = w->pull_jobs; j; j = j->next)
            if (j == job && e->xfer_id == UINT64_MAX)
                e->xfer_id = id;
        pthread_mutex_unlock(&w->lock);
    }
    return;
fail:
    job_fail(w, job, code, why);
    pthread_mutex_unlock(&w->lock);
}

void wk_pull_request_closed(wk_worker *w, wk_request *req)
{
    for (wk_pull_job *j = w->pull_jobs, *nx; j; j = nx) {
        nx = j->next;
        if (j->req == req)
            job_free(w, j, false);
    }
}

/* Whether parked dispatch D is of request KEY's node (GRAPH, NODE). */
static bool job_is(const Baton__V1__Dispatch *d, uint64_t key, uint32_t graph, uint32_t node)
{
    return d->request_key == key && d->graph == graph && d->node == node;
}

void wk_pull_extend(wk_worker *w, const Baton__V1__Extend *e)
{
    /* The window opens when the dispatch starts: widen it in the message. */
    for (wk_pull_job *j = w->pull_jobs; j; j = j->next) {
        Baton__V1__Dispatch *md = j->disp->msg->dispatch;
        if (job_is(md, e->request_key, e->graph, e->node) &&
            (!e->dispatch_id || md->dispatch_id == e->dispatch_id) && e->upto > md->speculate_upto)
            md->speculate_upto = e->upto;
    }
}

void wk_pull_drop(wk_worker *w, const Baton__V1__Drop *dr)
{
    size_t depth = dr->n_from_iteration;
    for (wk_pull_job *j = w->pull_jobs, *nx; j; j = nx) {
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
            job_free(w, j, true);
        } else if (md->speculate_upto >= from) {
            /* Its window must not run into the discarded iterations. */
            md->speculate_upto = from - 1;
        }
    }
}

void wk_pull_cancel_all(wk_worker *w)
{
    while (w->pull_jobs)
        job_free(w, w->pull_jobs, true);
}

/* --- the producer's side of the worker ---------------------------------- */

static baton_status xfer_pin(void *arg, uint64_t tensor_id, wk_xfer_src *held,
                             const uint8_t **data, void **pin, char *err, size_t errlen)
{
    wk_worker *w = arg;
    if (wk_device_space(w->dev) != WK_SPACE_HOST) {
        snprintf(err, errlen, "worker %s is a GPU worker: cross-host GPU transfers are not "
                 "built", w->opt.name);
        return BATON_STATUS_FAILED_PRECONDITION;
    }
    pthread_mutex_lock(&w->lock);
    wk_tensor *t = wk_tensor_find(w, tensor_id);
    if (!t) {
        pthread_mutex_unlock(&w->lock);
        snprintf(err, errlen, "tensor %" PRIu64 " is not held by worker %s (released, or of "
                 "an earlier incarnation)", tensor_id, w->opt.name);
        return BATON_STATUS_NOT_FOUND;
    }
    t->pins++;
    *held = (wk_xfer_src){t->ref.id, t->ref.pool, t->ref.offset, t->ref.nbytes};
    *data = wk_tensor_data(w, t);
    *pin = t;
    pthread_mutex_unlock(&w->lock);
    return BATON_STATUS_OK;
}

static void xfer_unpin(void *arg, void *pin)
{
    wk_worker *w = arg;
    wk_tensor *t = pin;
    pthread_mutex_lock(&w->lock);
    wk_request *req = t->req;
    wk_tensor_unpin(w, t);
    wk_request_gc(w, req);
    pthread_mutex_unlock(&w->lock);
}

int wk_pull_xfer_create(wk_worker *w, char *err, size_t errlen)
{
    static const wk_xfer_ops ops = {xfer_pin, xfer_unpin, on_pull_done};
    return wk_xfer_create(w->zctx, w->opt.peer_listen, w->opt.curve_own, w->event_fd, &ops, w,
                          &w->xfer, err, errlen);
}
