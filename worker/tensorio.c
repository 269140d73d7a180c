/* The conductor's tensor messages (tensorio.h). */
#include "worker/tensorio.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "worker/join.h"
#include "worker/wire.h"

/* A Put whose bytes are on their way into the pool. */
typedef struct put_job {
    wk_copy_job job;              /* first */
    const wk_tensorio *io;
    Baton__V1__ConductorMessage *msg; /* owned: its bytes are the copy's source */
    wk_tensor *t;                 /* pinned until the end */
} put_job;

/* A Fetch whose bytes are on their way to the host (a GPU worker's). */
typedef struct fetch_job {
    wk_copy_job job;              /* first */
    const wk_tensorio *io;
    uint64_t tensor_id;
    wk_tensor *t;                 /* pinned until the end */
    void *buf;                    /* owned: the copy */
} fetch_job;

static void placed(const wk_tensorio *io, const Baton__V1__Put *p, const wk_ref *ref,
                   baton_status code, const char *message)
{
    wk_wire_placed(io->sock, p, ref, wk_store_self(io->store), code, message);
}

/* The Put's copy ended: its tensor is placed, or goes.  I/O thread. */
static void put_done(wk_event *ev)
{
    put_job *pj = (put_job *)ev;
    const wk_tensorio *io = pj->io;
    const Baton__V1__Put *p = pj->msg->put;
    int rc = pj->job.status;
    pthread_mutex_lock(io->lock);
    wk_tensor *t = pj->t;
    wk_request *req = t->req;
    wk_ref ref = t->ref;
    t->filled = rc == 0;
    wk_store_tensor_unpin(io->store, t);
    if (rc) {
        wk_store_tensor_release(io->store, ref.id);
        wk_store_request_gc(io->store, req);
    }
    pthread_mutex_unlock(io->lock);
    if (rc) {
        char why[512], lost[256];
        snprintf(why, sizeof(why), "copy into the pool of worker %s: %s", io->worker,
                 pj->job.err);
        /* A copy that failed because the device's context is gone (a
         * kernel faulted) is not the request's fault: the worker is about
         * to exit and be restarted, and the request ends UNAVAILABLE as
         * every request of a lost worker does. */
        bool gone = io->dev && wk_device_lost(io->dev, lost, sizeof(lost));
        placed(io, p, NULL, gone ? BATON_STATUS_UNAVAILABLE : BATON_STATUS_INTERNAL, why);
    } else if (!p->tensor_id) {
        /* A tensor whose id the conductor chose is not answered when it is
         * placed: the conductor already runs the request, and only a
         * failure changes what it does. */
        placed(io, p, &ref, BATON_STATUS_OK, NULL);
    }
    baton__v1__conductor_message__free_unpacked(pj->msg, NULL);
    free(pj);
}

/* A new tensor of P's request for its value, pinned and given the id the
 * conductor chose; NULL after answering the Put with why not.  I/O
 * thread, without the lock. */
static wk_tensor *put_tensor(const wk_tensorio *io, const Baton__V1__Put *p, uint64_t bytes)
{
    const Baton__V1__Tensor *v = p->value;
    char why[512];
    pthread_mutex_lock(io->lock);
    wk_request *req = wk_store_request(io->store, p->request_key, true);
    wk_tensor *t = req && !req->closed ? wk_store_tensor_new(io->store, req, (baton_dtype)v->dtype,
                                                             (uint32_t)v->n_dims, v->dims, true)
                                       : NULL;
    if (t && p->tensor_id && wk_store_tensor_rekey(io->store, t, p->tensor_id) != 0) {
        uint64_t id = t->ref.id;
        wk_store_tensor_unpin(io->store, t);
        wk_store_tensor_release(io->store, id);
        wk_store_request_gc(io->store, req);
        pthread_mutex_unlock(io->lock);
        snprintf(why, sizeof(why), "tensor id %" PRIu64 " is taken or invalid", p->tensor_id);
        placed(io, p, NULL, BATON_STATUS_INVALID_ARGUMENT, why);
        return NULL;
    }
    if (!t) {
        wk_pool_stats st;
        wk_store_pool_stats(io->store, &st);
        bool closed = req && req->closed;
        wk_store_request_gc(io->store, req);
        pthread_mutex_unlock(io->lock);
        if (closed)
            snprintf(why, sizeof(why), "the request was closed");
        else
            snprintf(why, sizeof(why), "the pool of worker %s is full: %" PRIu64 " bytes asked, "
                     "largest free block %" PRIu64 " of %" PRIu64 " free", io->worker, bytes,
                     st.largest_free, st.free);
        placed(io, p, NULL,
               closed ? BATON_STATUS_FAILED_PRECONDITION : BATON_STATUS_RESOURCE_EXHAUSTED, why);
        return NULL;
    }
    pthread_mutex_unlock(io->lock);
    return t;
}

void wk_tensorio_put(const wk_tensorio *io, Baton__V1__ConductorMessage *msg)
{
    const Baton__V1__Put *p = msg->put;
    const Baton__V1__Tensor *v = p->value;
    char why[512];
    uint64_t bytes = 0;
    put_job *pj = NULL;
    wk_tensor *t = NULL;
    if (!v || v->dtype < BATON__V1__DTYPE__F32 || v->dtype > BATON__V1__DTYPE__BOOL ||
        v->n_dims > BATON_MAX_DIMS) {
        placed(io, p, NULL, BATON_STATUS_INVALID_ARGUMENT,
               "the tensor has no valid dtype or too many dims");
        goto out;
    }
    bytes = wk_tensor_bytes((baton_dtype)v->dtype, (uint32_t)v->n_dims, v->dims);
    if (bytes == UINT64_MAX || bytes != v->data.len) {
        snprintf(why, sizeof(why), "its dims and dtype span %" PRIu64 " bytes but %zu were sent",
                 bytes, v->data.len);
        placed(io, p, NULL, BATON_STATUS_INVALID_ARGUMENT, why);
        goto out;
    }
    if (!(pj = calloc(1, sizeof(*pj)))) {
        placed(io, p, NULL, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    if (!(t = put_tensor(io, p, bytes)))
        goto out;
    /* The tensor is pinned, and nobody but a Dispatch of this worker that
     * follows the Put knows its id before Placed.  The copy runs outside
     * the lock: inputs may be large. */
    void *data = wk_store_tensor_data(io->store, t);
    *pj = (put_job){.job.ev.run = put_done, .io = io, .msg = msg, .t = t};
    if (wk_copier_threaded(io->copier)) {
        /* A GPU pool: the copy is queued here, on the I/O thread's stream
         * (this waits for no kernel), and marked; a Dispatch that reads the
         * tensor waits for the mark on its lane's stream, and the copier
         * thread waits for it on the host before Placed. */
        void *mark = NULL;
        int rc = wk_device_copy_async(io->dev, io->io_stream, data, v->data.data, bytes,
                                      pj->job.err, sizeof(pj->job.err));
        if (!rc)
            rc = wk_device_mark(io->dev, io->io_stream, &mark, pj->job.err,
                                sizeof(pj->job.err));
        if (rc) {
            pj->job.status = rc;
            put_done(&pj->job.ev);
            return;
        }
        pthread_mutex_lock(io->lock);
        t->fill = mark;
        pthread_mutex_unlock(io->lock);
        pj->job.wait = mark;
    } else {
        pj->job.dst = data;
        pj->job.src = v->data.data;
        pj->job.n = bytes;
    }
    wk_copier_submit(io->copier, &pj->job);
    return;
out:
    free(pj);
    baton__v1__conductor_message__free_unpacked(msg, NULL);
}

static void send_fetched(const wk_tensorio *io, uint64_t id, baton_status code, const char *why,
                         const void *data, uint64_t n)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = (Baton__V1__Code)code;
    st.message = (char *)(why ? why : "");
    Baton__V1__Fetched out = BATON__V1__FETCHED__INIT;
    out.tensor_id = id;
    out.status = &st;
    if (code == BATON_STATUS_OK) {
        out.data.data = (uint8_t *)data;
        out.data.len = n;
    }
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_FETCHED;
    m.fetched = &out;
    wk_wire_send(io->sock, &m);
}

static void fetch_unpin(const wk_tensorio *io, wk_tensor *t)
{
    pthread_mutex_lock(io->lock);
    wk_request *req = t->req;
    wk_store_tensor_unpin(io->store, t);
    wk_store_request_gc(io->store, req);
    pthread_mutex_unlock(io->lock);
}

/* A GPU worker's Fetch copy ended.  I/O thread. */
static void fetch_done(wk_event *ev)
{
    fetch_job *fj = (fetch_job *)ev;
    const wk_tensorio *io = fj->io;
    if (fj->job.status) {
        char why[384];
        snprintf(why, sizeof(why), "tensor %" PRIu64 " could not be copied to the host: %s",
                 fj->tensor_id, fj->job.err);
        send_fetched(io, fj->tensor_id, BATON_STATUS_INTERNAL, why, NULL, 0);
    } else {
        send_fetched(io, fj->tensor_id, BATON_STATUS_OK, NULL, fj->buf, fj->job.n);
    }
    fetch_unpin(io, fj->t);
    free(fj->buf);
    free(fj);
}

void wk_tensorio_fetch(const wk_tensorio *io, const Baton__V1__Fetch *f)
{
    char why[256];
    pthread_mutex_lock(io->lock);
    wk_tensor *t = wk_store_tensor_find(io->store, f->tensor_id);
    void *fill = NULL;
    if (t) {
        t->pins++;
        fill = t->filled ? NULL : t->fill;
    }
    pthread_mutex_unlock(io->lock);
    if (!t) {
        snprintf(why, sizeof(why), "tensor %" PRIu64 " is not held by worker %s", f->tensor_id,
                 io->worker);
        send_fetched(io, f->tensor_id, BATON_STATUS_NOT_FOUND, why, NULL, 0);
        return;
    }
    const void *data = wk_store_tensor_data(io->store, t);
    uint64_t n = t->ref.nbytes;
    if (!wk_copier_threaded(io->copier)) {
        /* Host memory: the reply is packed from the pool itself. */
        send_fetched(io, f->tensor_id, BATON_STATUS_OK, NULL, data, n);
        fetch_unpin(io, t);
        return;
    }
    fetch_job *fj = calloc(1, sizeof(*fj));
    void *buf = fj ? malloc(n ? n : 1) : NULL;
    if (!buf) {
        free(fj);
        snprintf(why, sizeof(why), "tensor %" PRIu64 " could not be copied to the host: out "
                 "of memory", f->tensor_id);
        send_fetched(io, f->tensor_id, BATON_STATUS_INTERNAL, why, NULL, 0);
        fetch_unpin(io, t);
        return;
    }
    *fj = (fetch_job){.job = {.ev.run = fetch_done, .wait = fill, .dst = buf, .src = data, .n = n},
                      .io = io, .tensor_id = f->tensor_id, .t = t, .buf = buf};
    wk_copier_submit(io->copier, &fj->job);
}

void wk_tensorio_release(const wk_tensorio *io, const Baton__V1__Release *r)
{
    for (size_t i = 0; i < r->n_tensor_ids; i++) {
        wk_tensor *t = wk_store_tensor_find(io->store, r->tensor_ids[i]);
        if (!t)
            continue; /* unknown or already released: quietly ignored */
        wk_request *req = t->req;
        wk_store_tensor_release(io->store, r->tensor_ids[i]);
        wk_store_request_gc(io->store, req);
    }
}
