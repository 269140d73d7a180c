/* The conductor's tensor messages (tensorio.h). */
#include "worker/tensorio.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "worker/join.h"
#include "worker/wire.h"

static void placed(const wk_tensorio *io, const Baton__V1__Put *p, const wk_ref *ref,
                   baton_status code, const char *message)
{
    wk_wire_placed(io->sock, p, ref, wk_store_self(io->store), code, message);
}

void wk_tensorio_put(const wk_tensorio *io, const Baton__V1__Put *p)
{
    const Baton__V1__Tensor *v = p->value;
    char why[512];
    if (!v || v->dtype < BATON__V1__DTYPE__F32 || v->dtype > BATON__V1__DTYPE__BOOL ||
        v->n_dims > BATON_MAX_DIMS) {
        placed(io, p, NULL, BATON_STATUS_INVALID_ARGUMENT,
                    "the tensor has no valid dtype or too many dims");
        return;
    }
    uint64_t bytes = wk_tensor_bytes((baton_dtype)v->dtype, (uint32_t)v->n_dims, v->dims);
    if (bytes == UINT64_MAX || bytes != v->data.len) {
        snprintf(why, sizeof(why), "its dims and dtype span %" PRIu64 " bytes but %zu were sent",
                 bytes, v->data.len);
        placed(io, p, NULL, BATON_STATUS_INVALID_ARGUMENT, why);
        return;
    }
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
        return;
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
        placed(io, p, NULL, closed ? BATON_STATUS_FAILED_PRECONDITION
                                       : BATON_STATUS_RESOURCE_EXHAUSTED, why);
        return;
    }
    pthread_mutex_unlock(io->lock);
    /* Copy outside the lock: inputs may be large.  The tensor is pinned
     * and nobody knows its id before Placed. */
    char cerr[256];
    int rc = wk_device_copy(io->dev, io->io_stream, wk_store_tensor_data(io->store, t),
                            v->data.data, bytes, cerr, sizeof(cerr));
    pthread_mutex_lock(io->lock);
    wk_ref ref = t->ref;
    wk_store_tensor_unpin(io->store, t);
    if (rc) {
        wk_store_tensor_release(io->store, ref.id);
        wk_store_request_gc(io->store, req);
    }
    pthread_mutex_unlock(io->lock);
    if (rc) {
        snprintf(why, sizeof(why), "copy into the pool of worker %s: %s", io->worker, cerr);
        placed(io, p, NULL, BATON_STATUS_INTERNAL, why);
        return;
    }
    placed(io, p, &ref, BATON_STATUS_OK, NULL);
}

void wk_tensorio_fetch(const wk_tensorio *io, const Baton__V1__Fetch *f)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    Baton__V1__Fetched out = BATON__V1__FETCHED__INIT;
    out.tensor_id = f->tensor_id;
    out.status = &st;
    pthread_mutex_lock(io->lock);
    wk_tensor *t = wk_store_tensor_find(io->store, f->tensor_id);
    if (t)
        t->pins++;
    pthread_mutex_unlock(io->lock);
    char why[128];
    void *copy = NULL;
    bool copied = false;
    if (t && !(copy = wk_device_to_host(io->dev, io->io_stream, wk_store_tensor_data(io->store, t),
                                        wk_device_space(io->dev) == WK_SPACE_CUDA,
                                        t->ref.nbytes, &copied)) &&
        t->ref.nbytes) {
        st.code = BATON__V1__CODE__INTERNAL;
        snprintf(why, sizeof(why), "tensor %" PRIu64 " could not be copied to the host",
                 f->tensor_id);
        st.message = why;
    } else if (t) {
        out.data.data = copy;
        out.data.len = t->ref.nbytes;
    } else {
        st.code = BATON__V1__CODE__NOT_FOUND;
        snprintf(why, sizeof(why), "tensor %" PRIu64 " is not held by worker %s", f->tensor_id,
                 io->worker);
        st.message = why;
    }
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_FETCHED;
    m.fetched = &out;
    wk_wire_send(io->sock, &m);
    if (copied)
        free(copy);
    if (t) {
        pthread_mutex_lock(io->lock);
        wk_request *req = t->req;
        wk_store_tensor_unpin(io->store, t);
        wk_store_request_gc(io->store, req);
        pthread_mutex_unlock(io->lock);
    }
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
