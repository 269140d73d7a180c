/* Building and sending the worker's messages (proto/baton.proto, "worker ->
 * conductor"), and reading tensor references from the conductor.
 *
 * Messages are packed straight into a zmq_msg_t, so the one copy of a
 * tensor's bytes that a Fetch or an inline output costs is the packing
 * itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "worker/join.h"
#include "common/log.h"
#include "worker/worker_internal.h"

int wk_send(wk_worker *w, const Baton__V1__WorkerMessage *msg)
{
    size_t n = baton__v1__worker_message__get_packed_size(msg);
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, n) != 0) {
        bt_error("cannot allocate a %zu-byte message: %s", n, zmq_strerror(zmq_errno()));
        return -1;
    }
    baton__v1__worker_message__pack(msg, zmq_msg_data(&m));
    if (zmq_msg_send(&m, w->sock, 0) < 0) {
        bt_error("send to the conductor failed: %s", zmq_strerror(zmq_errno()));
        zmq_msg_close(&m);
        return -1;
    }
    return 0;
}

const void *wk_ref_bytes(wk_worker *w, const wk_ref *ref, bool *device)
{
    if (ref->own) {
        wk_tensor *t = wk_tensor_find(w, ref->id);
        *device = wk_device_space(w->dev) == WK_SPACE_CUDA;
        return t ? wk_tensor_data(w, t) : NULL;
    }
    for (wk_mapping *m = w->peers.maps; m; m = m->next)
        if (!m->stale && m->peer == ref->owner && m->pool == ref->pool &&
            ref->offset <= m->size && ref->nbytes <= m->size - ref->offset) {
            *device = m->cuda_device >= 0;
            return (const uint8_t *)m->base + ref->offset;
        }
    return NULL;
}

void *wk_bytes_to_host(wk_worker *w, const void *p, bool device, uint64_t n, bool *copied)
{
    *copied = false;
    if (!p || !device)
        return (void *)p;
    char err[256];
    void *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    if (wk_device_copy(w->dev, w->io_stream, buf, p, n, err, sizeof(err)) != 0) {
        bt_error("cannot copy %llu bytes of device memory to the host: %s",
                 (unsigned long long)n, err);
        free(buf);
        return NULL;
    }
    *copied = true;
    return buf;
}

void wk_ref_to_proto(wk_worker *w, const wk_ref *ref, Baton__V1__TensorRef *t, int64_t *dims,
                     const wk_item *item)
{
    t->owner = ref->own ? w->self_index : ref->owner;
    t->pool = ref->pool;
    t->offset = ref->offset;
    t->nbytes = ref->nbytes;
    t->dtype = (Baton__V1__DType)ref->dtype;
    memcpy(dims, ref->dims, sizeof(int64_t) * ref->ndim);
    t->n_dims = ref->ndim;
    t->dims = dims;
    t->id = ref->id;
    if (item) {
        if (ref->own && item->model->tp_size > 1) {
            t->tp_rank = item->model->tp_rank;
            t->tp_size = item->model->tp_size;
        }
        t->node = item->b.node;
        t->graph = item->b.graph;
        t->n_iteration = item->b.depth;
        t->iteration = (uint32_t *)item->iter;
    }
}

int wk_ref_from_proto(wk_worker *w, const Baton__V1__TensorRef *t, wk_ref *out, char *err,
                      size_t errlen)
{
    *out = (wk_ref){0};
    if (!t) {
        snprintf(err, errlen, "a chunk has no tensor reference");
        return -1;
    }
    if (t->dtype < BATON__V1__DTYPE__F32 || t->dtype > BATON__V1__DTYPE__BOOL) {
        snprintf(err, errlen, "tensor %llu has dtype %d, which is not valid",
                 (unsigned long long)t->id, (int)t->dtype);
        return -1;
    }
    if (t->n_dims > BATON_MAX_DIMS) {
        snprintf(err, errlen, "tensor %llu has %zu dims (at most %d)", (unsigned long long)t->id,
                 t->n_dims, BATON_MAX_DIMS);
        return -1;
    }
    uint64_t bytes = wk_tensor_bytes((baton_dtype)t->dtype, (uint32_t)t->n_dims, t->dims);
    if (bytes == UINT64_MAX || bytes != t->nbytes) {
        snprintf(err, errlen, "tensor %llu: its dims and dtype span %llu bytes, not %llu",
                 (unsigned long long)t->id, (unsigned long long)bytes,
                 (unsigned long long)t->nbytes);
        return -1;
    }
    if (t->n_strides) {
        /* Only contiguous row-major tensors are produced anywhere; strides
         * equal to those are accepted, anything else would need a gather
         * no backend asked for. */
        int64_t want = 1;
        int ok = t->n_strides == t->n_dims;
        for (size_t i = t->n_dims; ok && i-- > 0;) {
            ok = t->dims[i] <= 1 || t->strides[i] == want;
            want *= t->dims[i];
        }
        if (!ok) {
            snprintf(err, errlen, "tensor %llu is strided; only contiguous tensors are supported",
                     (unsigned long long)t->id);
            return -1;
        }
    }
    out->own = t->owner == w->self_index;
    out->owner = t->owner;
    out->pool = t->pool;
    out->offset = t->offset;
    out->nbytes = t->nbytes;
    out->id = t->id;
    out->dtype = (baton_dtype)t->dtype;
    out->ndim = (uint32_t)t->n_dims;
    if (t->n_dims)
        memcpy(out->dims, t->dims, sizeof(int64_t) * t->n_dims);
    return 0;
}

/* Sets T->data to REF's bytes when the output is client-bound and small.
 * Returns a host copy the caller frees after sending (device memory), or
 * NULL (none made). */
static void *maybe_inline(wk_worker *w, const wk_ref *ref, bool client, Baton__V1__TensorRef *t)
{
    if (!client || ref->nbytes > WK_INLINE_MAX || ref->nbytes == 0)
        return NULL;
    bool copied, device = false;
    const void *at = wk_ref_bytes(w, ref, &device);
    void *p = wk_bytes_to_host(w, at, device, ref->nbytes, &copied);
    if (p) {
        t->data.data = p;
        t->data.len = ref->nbytes;
    }
    return copied ? p : NULL;
}

void wk_send_done(wk_worker *w, wk_item *it)
{
    const Baton__V1__Dispatch *d = it->disp->d;
    uint32_t n_out = it->b.n_outputs;
    Baton__V1__NamedRef named[n_out ? n_out : 1], *named_p[n_out ? n_out : 1];
    Baton__V1__TensorRef refs[n_out ? n_out : 1];
    int64_t dims[n_out ? n_out : 1][BATON_MAX_DIMS];
    void *copies[n_out ? n_out : 1];
    size_t n = 0;
    for (uint32_t o = 0; it->status == BATON_STATUS_OK && o < n_out; o++) {
        if (it->outputs[o].stream || !it->results[o].set)
            continue;
        baton__v1__named_ref__init(&named[n]);
        baton__v1__tensor_ref__init(&refs[n]);
        wk_ref_to_proto(w, &it->results[o].ref, &refs[n], dims[n], it);
        copies[n] = maybe_inline(w, &it->results[o].ref, it->outputs[o].client, &refs[n]);
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
    wk_send(w, &m);
    for (size_t k = 0; k < n; k++)
        free(copies[k]);
}

void wk_send_chunk(wk_worker *w, const wk_event *ev)
{
    const wk_item *it = ev->item;
    const Baton__V1__Dispatch *d = it->disp->d;
    Baton__V1__TensorRef ref = BATON__V1__TENSOR_REF__INIT;
    int64_t dims[BATON_MAX_DIMS];
    Baton__V1__Chunk c = BATON__V1__CHUNK__INIT;
    void *copy = NULL;
    c.request_key = it->req->key;
    c.node = d->node;
    c.graph = d->graph;
    c.n_iteration = it->b.depth;
    c.iteration = (uint32_t *)it->iter;
    c.name = (char *)it->outputs[ev->output].name;
    if (ev->has_ref) {
        wk_ref_to_proto(w, &ev->ref, &ref, dims, it);
        copy = maybe_inline(w, &ev->ref, it->outputs[ev->output].client, &ref);
        c.ref = &ref;
    }
    c.final = ev->final;
    c.index = ev->index;
    c.dispatch_id = d->dispatch_id;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_CHUNK;
    m.chunk = &c;
    wk_send(w, &m);
    free(copy);
}
