/* The worker's side of the conductor protocol (wire.h). */
#include "worker/wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/log.h"
#include "common/pbwire.h"
#include "common/status.h"
#include "common/vec.h"
#include "worker/join.h"

/* The messages kept while a thread has its socket corked.  Per thread:
 * only the thread that owns a socket sends on it. */
static __thread struct {
    void *sock;                   /* corked socket; NULL: none */
    zmq_msg_t *msgs;              /* kept, in order; owned */
    size_t n, cap;
} cork;

void wk_wire_cork(void *sock)
{
    cork.sock = sock;
}

/* Sends what is kept on SOCK as one message. */
static void send_kept(void *sock)
{
    size_t i = 0;
    for (; i < cork.n; i++)
        if (zmq_msg_send(&cork.msgs[i], sock, i + 1 < cork.n ? ZMQ_SNDMORE : 0) < 0)
            break;
    if (i < cork.n) {
        bt_error("send to the conductor failed: %s (%zu messages lost)", zmq_strerror(zmq_errno()),
                 cork.n - i);
        for (; i < cork.n; i++)
            zmq_msg_close(&cork.msgs[i]);
    }
    cork.n = 0;
}

void wk_wire_uncork(void)
{
    send_kept(cork.sock);
    cork.sock = NULL;
    /* A burst that grew the array far leaves it to the next one only up
     * to a modest size. */
    if (cork.cap > 256) {
        free(cork.msgs);
        cork.msgs = NULL;
        cork.cap = 0;
    }
}

int wk_wire_send(void *sock, const Baton__V1__WorkerMessage *msg)
{
    size_t n = baton__v1__worker_message__get_packed_size(msg);
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, n) != 0) {
        bt_error("cannot allocate a %zu-byte message: %s", n, zmq_strerror(zmq_errno()));
        return BT_ENOMEM;
    }
    baton__v1__worker_message__pack(msg, zmq_msg_data(&m));
    if (sock == cork.sock) {
        if (BT_RESERVE(cork.msgs, cork.n, cork.cap, 16) == 0) {
            cork.msgs[cork.n++] = m;
            return 0;
        }
        /* No room to keep it: what is kept goes first, in order. */
        send_kept(sock);
    }
    if (zmq_msg_send(&m, sock, 0) < 0) {
        bt_error("send to the conductor failed: %s", zmq_strerror(zmq_errno()));
        zmq_msg_close(&m);
        return BT_EIO;
    }
    return 0;
}

void wk_wire_refuse(void *sock, const Baton__V1__Dispatch *d, baton_status code,
                    const char *message)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = (Baton__V1__Code)code;
    st.message = (char *)message;
    Baton__V1__Done done = BATON__V1__DONE__INIT;
    done.request_key = d->request_key;
    done.node = d->node;
    done.graph = d->graph;
    done.n_iteration = d->n_iteration;
    done.iteration = d->iteration;
    done.status = &st;
    done.dispatch_id = d->dispatch_id;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_DONE;
    m.done = &done;
    bt_warn("dispatch of node '%s' (request %s) refused: %s", d->node_name, d->request_id,
            message);
    wk_wire_send(sock, &m);
}

void wk_wire_placed(void *sock, const Baton__V1__Put *p, const wk_ref *ref, uint32_t self,
                    baton_status code, const char *message)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = (Baton__V1__Code)code;
    st.message = (char *)(message ? message : "");
    Baton__V1__TensorRef t = BATON__V1__TENSOR_REF__INIT;
    int64_t dims[BATON_MAX_DIMS];
    Baton__V1__Placed pl = BATON__V1__PLACED__INIT;
    pl.request_key = p->request_key;
    pl.put_id = p->put_id;
    pl.status = &st;
    if (ref) {
        wk_wire_ref_to_proto(ref, self, &t, dims);
        pl.ref = &t;
    }
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_PLACED;
    m.placed = &pl;
    if (code != BATON_STATUS_OK)
        bt_warn("put %" PRIu64 " of request %" PRIu64 " refused: %s", p->put_id, p->request_key,
                st.message);
    wk_wire_send(sock, &m);
}

void wk_wire_ref_to_proto(const wk_ref *ref, uint32_t self, Baton__V1__TensorRef *t,
                          int64_t *dims)
{
    t->owner = ref->own ? self : ref->owner;
    t->pool = ref->pool;
    t->offset = ref->offset;
    t->nbytes = ref->nbytes;
    t->dtype = (Baton__V1__DType)ref->dtype;
    memcpy(dims, ref->dims, sizeof(int64_t) * ref->ndim);
    t->n_dims = ref->ndim;
    t->dims = dims;
    t->id = ref->id;
}

int wk_wire_ref_from_proto(const Baton__V1__TensorRef *t, uint32_t self, wk_ref *out, char *err,
                           size_t errlen)
{
    *out = (wk_ref){0};
    if (!t)
        return bt_errorf(err, errlen, BT_EINVAL, "a chunk has no tensor reference");
    if (t->dtype < BATON__V1__DTYPE__F32 || t->dtype > BATON__V1__DTYPE__BOOL)
        return bt_errorf(err, errlen, BT_EINVAL, "tensor %llu has dtype %d, which is not valid",
                         (unsigned long long)t->id, (int)t->dtype);
    if (t->n_dims > BATON_MAX_DIMS)
        return bt_errorf(err, errlen, BT_EINVAL, "tensor %llu has %zu dims (at most %d)",
                         (unsigned long long)t->id, t->n_dims, BATON_MAX_DIMS);
    uint64_t bytes = wk_tensor_bytes((baton_dtype)t->dtype, (uint32_t)t->n_dims, t->dims);
    if (bytes == UINT64_MAX || bytes != t->nbytes)
        return bt_errorf(err, errlen, BT_EINVAL,
                         "tensor %llu: its dims and dtype span %llu bytes, not %llu",
                         (unsigned long long)t->id, (unsigned long long)bytes,
                         (unsigned long long)t->nbytes);
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
        if (!ok)
            return bt_errorf(err, errlen, BT_EINVAL,
                             "tensor %llu is strided; only contiguous tensors are supported",
                             (unsigned long long)t->id);
    }
    out->own = t->owner == self;
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

/* --- frames that do not parse ------------------------------------------------ */

/* The fields of a Put or a Dispatch that name its request, read from a
 * frame that does not parse as a whole. */
typedef struct salvaged {
    uint64_t member;              /* ConductorMessage field: 2 Dispatch, 9 Put; 0: neither */
    uint64_t request_key, put_id, dispatch_id;
    uint32_t graph, node;
    uint32_t iteration[16];
    size_t n_iteration;
} salvaged;

static void salvage_fields(salvaged *sv, const pbw_field *top)
{
    pbw_reader r = pbw_init(top->data, top->len);
    pbw_field f;
    bool put = sv->member == 9;
    while (pbw_next(&r, &f) > 0) {
        if (f.number == 1 && f.wire == PBW_VARINT)
            sv->request_key = f.value;
        else if (put && f.number == 2 && f.wire == PBW_VARINT)
            sv->put_id = f.value;
        else if (!put && f.number == 3 && f.wire == PBW_VARINT)
            sv->graph = (uint32_t)f.value;
        else if (!put && f.number == 4 && f.wire == PBW_VARINT)
            sv->node = (uint32_t)f.value;
        else if (!put && f.number == 13 && f.wire == PBW_VARINT)
            sv->dispatch_id = f.value;
        else if (!put && f.number == 8 && f.wire == PBW_VARINT && sv->n_iteration < 16)
            sv->iteration[sv->n_iteration++] = (uint32_t)f.value;
        else if (!put && f.number == 8 && f.wire == PBW_BYTES) {
            const uint8_t *p = f.data, *end = f.data + f.len;
            uint64_t v;
            while (p < end && sv->n_iteration < 16 && pbw_varint(&p, end, &v) == 0)
                sv->iteration[sv->n_iteration++] = (uint32_t)v;
        }
    }
}

/* A frame from the conductor that does not parse: when it is a Put or a
 * Dispatch whose request can still be read from it, that request fails at
 * once (a refused Placed, a failed Done), rather than wait for an answer
 * that would never come. */
void wk_wire_salvage(void *sock, const void *data, size_t len, const char *worker)
{
    salvaged sv = {0};
    pbw_reader r = pbw_init(data, len);
    pbw_field f;
    while (pbw_next(&r, &f) > 0)
        if ((f.number == 2 || f.number == 9) && f.wire == PBW_BYTES) {
            sv.member = f.number;
            salvage_fields(&sv, &f);
        }
    if (!sv.member || !sv.request_key) {
        bt_warn("dropped a frame of %zu bytes from the conductor that does not parse", len);
        return;
    }
    char why[160];
    snprintf(why, sizeof(why), "worker %s could not parse the %s of %zu bytes the conductor "
             "sent for this request", worker, sv.member == 9 ? "Put" : "Dispatch", len);
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = BATON__V1__CODE__INTERNAL;
    st.message = why;
    if (sv.member == 9) {
        Baton__V1__Put p = BATON__V1__PUT__INIT;
        p.request_key = sv.request_key;
        p.put_id = sv.put_id;
        wk_wire_placed(sock, &p, NULL, 0, BATON_STATUS_INTERNAL, why);
        return;
    }
    Baton__V1__Done d = BATON__V1__DONE__INIT;
    d.request_key = sv.request_key;
    d.graph = sv.graph;
    d.node = sv.node;
    d.iteration = sv.iteration;
    d.n_iteration = sv.n_iteration;
    d.dispatch_id = sv.dispatch_id;
    d.status = &st;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_DONE;
    m.done = &d;
    bt_warn("%s", why);
    wk_wire_send(sock, &m);
}
