/* The floor of the dispatch round trip (floor.h). */
#include "tests/bench/floor.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/baton.pb-c.h"
#include "tests/bench/util.h"

#define FLOOR_SLOTS 1024 /* requests in flight the floor can hold */
#define FLOOR_POOL_ITEM 64 /* bytes the pattern worker keeps per placed input */

static void *floor_socket(void *ctx, int type)
{
    void *s = zmq_socket(ctx, type);
    int zero = 0;
    if (s) {
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof(zero));
        zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof(zero));
    }
    return s;
}

/* Packs M and sends it, after the routing frame ID when ID is set. */
static int send_packed(void *sock, const void *id, size_t idlen, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t stackbuf[1024];
    uint8_t *buf = n <= sizeof(stackbuf) ? stackbuf : malloc(n);
    if (!buf)
        return -1;
    protobuf_c_message_pack(m, buf);
    int rc = 0;
    if (id && zmq_send(sock, id, idlen, ZMQ_SNDMORE) < 0)
        rc = -1;
    if (rc == 0 && zmq_send(sock, buf, n, 0) < 0)
        rc = -1;
    if (buf != stackbuf)
        free(buf);
    return rc;
}

static int send_conductor_msg(void *back, Baton__V1__ConductorMessage *m)
{
    return send_packed(back, "w0", 2, &m->base);
}

static int send_worker_msg(void *sock, Baton__V1__WorkerMessage *m)
{
    return send_packed(sock, NULL, 0, &m->base);
}

/* Receives a ROUTER message: identity into ID, payload (the last frame) into
 * PART.  Returns 0, or -1 when nothing is waiting. */
static int recv_routed(void *sock, zmq_msg_t *id, zmq_msg_t *part)
{
    zmq_msg_init(id);
    if (zmq_msg_recv(id, sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(id);
        return -1;
    }
    zmq_msg_init(part);
    for (int more = zmq_msg_more(id); more; more = zmq_msg_more(part)) {
        zmq_msg_close(part);
        zmq_msg_init(part);
        if (zmq_msg_recv(part, sock, 0) < 0)
            break;
    }
    return 0;
}

/* ======================================================================== */
/* The worker                                                               */
/* ======================================================================== */

/* Inputs placed by Put (pattern requests only), by request key. */
typedef struct floor_pool {
    uint8_t bytes[FLOOR_SLOTS][FLOOR_POOL_ITEM];
    size_t len[FLOOR_SLOTS];
} floor_pool;

/* Put: keep the bytes, answer Placed with a reference to them. */
static void worker_on_put(void *s, floor_pool *pool, const Baton__V1__Put *p)
{
    const Baton__V1__Tensor *v = p->value;
    size_t k = (size_t)(p->request_key % FLOOR_SLOTS);
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    Baton__V1__TensorRef ref = BATON__V1__TENSOR_REF__INIT;
    Baton__V1__Placed pl = BATON__V1__PLACED__INIT;
    pl.request_key = p->request_key;
    pl.put_id = p->put_id;
    pl.status = &st;
    if (!v || v->data.len > FLOOR_POOL_ITEM) {
        st.code = BATON__V1__CODE__RESOURCE_EXHAUSTED;
        st.message = "floor worker: inputs of at most 64 bytes";
    } else {
        memcpy(pool->bytes[k], v->data.data, v->data.len);
        pool->len[k] = v->data.len;
        ref.offset = k * FLOOR_POOL_ITEM;
        ref.nbytes = v->data.len;
        ref.dtype = v->dtype;
        ref.n_dims = v->n_dims;
        ref.dims = v->dims;
        ref.id = p->request_key;
        pl.ref = &ref;
    }
    Baton__V1__WorkerMessage wm = BATON__V1__WORKER_MESSAGE__INIT;
    wm.msg_case = BATON__V1__WORKER_MESSAGE__MSG_PLACED;
    wm.placed = &pl;
    send_worker_msg(s, &wm);
}

/* Dispatch: echo.  The output is the input, its bytes inline (as a small
 * client-bound output of baton's is): carried in the dispatch by the plain
 * floor, taken from the pool for a pattern request. */
static void worker_on_dispatch(void *s, const floor_pool *pool, const Baton__V1__Dispatch *d,
                               uint64_t t0)
{
    Baton__V1__NamedRef out = BATON__V1__NAMED_REF__INIT;
    Baton__V1__NamedRef *outs[1] = {&out};
    Baton__V1__TensorRef ref;
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    Baton__V1__Done done = BATON__V1__DONE__INIT;
    done.request_key = d->request_key;
    done.node = d->node;
    done.graph = d->graph;
    done.dispatch_id = d->dispatch_id;
    done.status = &st;
    done.batch_size = 1;
    if (d->n_inputs && d->inputs[0]->n_parts && d->inputs[0]->parts[0]->n_chunks &&
        d->n_outputs) {
        ref = *d->inputs[0]->parts[0]->chunks[0];
        if (!ref.data.len) {
            size_t k = (size_t)(ref.id % FLOOR_SLOTS);
            ref.data.len = pool->len[k];
            ref.data.data = (uint8_t *)pool->bytes[k];
        }
        out.name = d->outputs[0]->name;
        out.ref = &ref;
        done.n_outputs = 1;
        done.outputs = outs;
    } else {
        st.code = BATON__V1__CODE__INVALID_ARGUMENT;
        st.message = "floor worker: a dispatch without input or output";
    }
    done.exec_us = (bench_now_ns() - t0) / 1000u;
    Baton__V1__WorkerMessage wm = BATON__V1__WORKER_MESSAGE__INIT;
    wm.msg_case = BATON__V1__WORKER_MESSAGE__MSG_DONE;
    wm.done = &done;
    send_worker_msg(s, &wm);
}

/* A stream request (graph "stream"): its input is two little-endian u32,
 * COUNT and INTERVAL_US.  The worker answers COUNT Dones, one every
 * INTERVAL_US (a model's step time), each with a few bytes of text inline
 * as baton's decode node streams its token; the last one says finish. */
static void worker_on_stream(void *s, const Baton__V1__Dispatch *d)
{
    uint32_t hdr[2] = {0, 0};
    const Baton__V1__TensorRef *in = d->inputs[0]->parts[0]->chunks[0];
    memcpy(hdr, in->data.data, in->data.len < sizeof(hdr) ? in->data.len : sizeof(hdr));
    int64_t dims[1] = {4};
    for (uint32_t i = 0; i < hdr[0]; i++) {
        struct timespec ts = {hdr[1] / 1000000u, (long)(hdr[1] % 1000000u) * 1000};
        nanosleep(&ts, NULL);
        Baton__V1__TensorRef ref = BATON__V1__TENSOR_REF__INIT;
        ref.dtype = BATON__V1__DTYPE__U8;
        ref.n_dims = 1;
        ref.dims = dims;
        ref.nbytes = 4;
        ref.data.len = 4;
        ref.data.data = (uint8_t *)" tok";
        Baton__V1__NamedRef out = BATON__V1__NAMED_REF__INIT;
        Baton__V1__NamedRef *outs[1] = {&out};
        out.name = "text";
        out.ref = &ref;
        Baton__V1__Status st = BATON__V1__STATUS__INIT;
        uint32_t iter[1] = {i};
        Baton__V1__Done done = BATON__V1__DONE__INIT;
        done.request_key = d->request_key;
        done.node = d->node;
        done.graph = d->graph;
        done.dispatch_id = d->dispatch_id;
        done.n_iteration = 1;
        done.iteration = iter;
        done.n_outputs = 1;
        done.outputs = outs;
        done.finish = i + 1 == hdr[0];
        done.status = &st;
        done.batch_size = 1;
        Baton__V1__WorkerMessage wm = BATON__V1__WORKER_MESSAGE__INIT;
        wm.msg_case = BATON__V1__WORKER_MESSAGE__MSG_DONE;
        wm.done = &done;
        send_worker_msg(s, &wm);
    }
}

int bench_floor_worker_main(void *arg)
{
    const bench_floor_args *a = arg;
    void *ctx = zmq_ctx_new();
    void *s = floor_socket(ctx, ZMQ_DEALER);
    floor_pool *pool = calloc(1, sizeof(*pool));
    if (!s || !pool || zmq_setsockopt(s, ZMQ_ROUTING_ID, "w0", 2) != 0 ||
        zmq_connect(s, a->back) != 0)
        return 1;
    Baton__V1__Register reg = BATON__V1__REGISTER__INIT;
    reg.worker = "w0";
    reg.device = "cpu";
    reg.pid = (uint32_t)getpid();
    Baton__V1__WorkerMessage hello = BATON__V1__WORKER_MESSAGE__INIT;
    hello.msg_case = BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION;
    hello.registration = &reg;
    if (send_worker_msg(s, &hello) != 0)
        return 1;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s, 0) < 0) {
            zmq_msg_close(&m);
            if (zmq_errno() == EINTR)
                continue;
            return 1;
        }
        uint64_t t0 = bench_now_ns();
        Baton__V1__ConductorMessage *cm =
            baton__v1__conductor_message__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
        zmq_msg_close(&m);
        if (!cm)
            continue;
        if (cm->msg_case == BATON__V1__CONDUCTOR_MESSAGE__MSG_DISPATCH &&
            !strcmp(cm->dispatch->node_name, "s") && cm->dispatch->n_inputs)
            worker_on_stream(s, cm->dispatch);
        else if (cm->msg_case == BATON__V1__CONDUCTOR_MESSAGE__MSG_DISPATCH)
            worker_on_dispatch(s, pool, cm->dispatch, t0);
        else if (cm->msg_case == BATON__V1__CONDUCTOR_MESSAGE__MSG_PUT)
            worker_on_put(s, pool, cm->put);
        /* SessionClose and Release are read and parsed, and need no more:
         * the pool slot is reused by the key that comes round again. */
        baton__v1__conductor_message__free_unpacked(cm, NULL);
    }
}

/* ======================================================================== */
/* The conductor                                                            */
/* ======================================================================== */

typedef struct floor_pending {
    bool used;
    bool pattern;        /* baton's message pattern: Put first, SessionClose + Release at the end */
    bool stream;         /* graph "stream": each Done is forwarded as a chunk */
    uint64_t seq;        /* stream: chunks sent so far */
    uint8_t id[256];     /* client routing identity */
    size_t idlen;
    char *request_id;    /* owned */
    char *input;         /* owned: the input's name (pattern: for the Dispatch after Placed) */
    uint64_t start_ns;   /* acceptance, for total_us */
} floor_pending;

typedef struct floor_conductor {
    void *front, *back;        /* ROUTERs: clients, the worker */
    floor_pending *slots;      /* FLOOR_SLOTS, by request key */
    uint64_t next_key;
    bool worker_up;            /* the worker said hello */
} floor_conductor;

static void answer_error(floor_conductor *c, const uint8_t *id, size_t idlen, const char *rid,
                         Baton__V1__Code code, const char *message)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = code;
    st.message = (char *)message;
    Baton__V1__InferResponse r = BATON__V1__INFER_RESPONSE__INIT;
    r.request_id = (char *)rid;
    r.status = &st;
    Baton__V1__ServerMessage sm = BATON__V1__SERVER_MESSAGE__INIT;
    sm.msg_case = BATON__V1__SERVER_MESSAGE__MSG_RESPONSE;
    sm.response = &r;
    send_packed(c->front, id, idlen, &sm.base);
}

/* Sends the Dispatch of request KEY: input NAME is REF (the plain floor
 * carries the bytes in REF.data; a pattern request's REF points into the
 * worker's pool). */
static void send_dispatch(floor_conductor *c, uint64_t key, const char *rid, const char *node,
                          const char *name, Baton__V1__TensorRef *ref)
{
    Baton__V1__TensorRef *chunks[1] = {ref};
    Baton__V1__TensorPart part = BATON__V1__TENSOR_PART__INIT;
    Baton__V1__TensorPart *parts[1] = {&part};
    part.n_chunks = 1;
    part.chunks = chunks;
    part.transfer = BATON__V1__TRANSFER_KIND__TRANSFER_KIND_LOCAL;
    Baton__V1__InputValue iv = BATON__V1__INPUT_VALUE__INIT;
    Baton__V1__InputValue *ivs[1] = {&iv};
    iv.name = (char *)name;
    iv.n_parts = 1;
    iv.parts = parts;
    iv.final = true;
    Baton__V1__OutputSpec os = BATON__V1__OUTPUT_SPEC__INIT;
    Baton__V1__OutputSpec *oss[1] = {&os};
    os.name = (char *)name;
    os.client = true;
    Baton__V1__Dispatch d = BATON__V1__DISPATCH__INIT;
    d.request_key = key;
    d.request_id = (char *)rid;
    d.node_name = (char *)node;
    d.model = "echo0";
    d.mode = "";
    d.n_inputs = 1;
    d.inputs = ivs;
    d.n_outputs = 1;
    d.outputs = oss;
    d.dispatch_id = key;
    d.remaining_ms = 20000;
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_DISPATCH;
    m.dispatch = &d;
    send_conductor_msg(c->back, &m);
}

static void on_infer(floor_conductor *c, const uint8_t *id, size_t idlen,
                     const Baton__V1__InferRequest *q)
{
    uint64_t key = ++c->next_key;
    floor_pending *p = &c->slots[key % FLOOR_SLOTS];
    if (!c->worker_up || p->used || q->n_inputs != 1 || idlen > sizeof(p->id)) {
        answer_error(c, id, idlen, q->request_id, BATON__V1__CODE__UNAVAILABLE,
                     "floor: no worker, too many in flight, or not one input");
        return;
    }
    const Baton__V1__Tensor *in = q->inputs[0];
    p->used = true;
    p->pattern = q->graph && !strcmp(q->graph, "pattern");
    p->stream = q->graph && !strcmp(q->graph, "stream");
    memcpy(p->id, id, idlen);
    p->idlen = idlen;
    p->request_id = strdup(q->request_id);
    p->input = strdup(in->name);
    p->start_ns = bench_now_ns();
    if (p->pattern) {
        Baton__V1__Put put = BATON__V1__PUT__INIT;
        put.request_key = key;
        put.put_id = key;
        put.value = (Baton__V1__Tensor *)in;
        Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_PUT;
        m.put = &put;
        send_conductor_msg(c->back, &m);
        return;
    }
    Baton__V1__TensorRef ref = BATON__V1__TENSOR_REF__INIT;
    ref.nbytes = in->data.len;
    ref.dtype = in->dtype;
    ref.n_dims = in->n_dims;
    ref.dims = in->dims;
    ref.id = key;
    ref.data = in->data;
    send_dispatch(c, key, q->request_id, p->stream ? "s" : "e", in->name, &ref);
}

/* One client frame: a health probe is answered here, an infer starts. */
static void on_client(floor_conductor *c, const uint8_t *id, size_t idlen, const void *data,
                      size_t len)
{
    Baton__V1__ClientMessage *cm = baton__v1__client_message__unpack(NULL, len, data);
    if (!cm) {
        answer_error(c, id, idlen, "", BATON__V1__CODE__INVALID_ARGUMENT, "does not parse");
        return;
    }
    if (cm->msg_case == BATON__V1__CLIENT_MESSAGE__MSG_HEALTH) {
        Baton__V1__HealthResponse h = BATON__V1__HEALTH_RESPONSE__INIT;
        h.live = true;
        h.ready = c->worker_up;
        Baton__V1__ServerMessage sm = BATON__V1__SERVER_MESSAGE__INIT;
        sm.msg_case = BATON__V1__SERVER_MESSAGE__MSG_HEALTH;
        sm.health = &h;
        send_packed(c->front, id, idlen, &sm.base);
    } else if (cm->msg_case == BATON__V1__CLIENT_MESSAGE__MSG_INFER) {
        on_infer(c, id, idlen, cm->infer);
    }
    baton__v1__client_message__free_unpacked(cm, NULL);
}

/* A Done: a pattern request first closes its session and releases its
 * input, as batond does before it answers; then the response goes out with
 * the output bytes and the node's timing. */
static void on_done(floor_conductor *c, const Baton__V1__Done *d)
{
    floor_pending *p = &c->slots[d->request_key % FLOOR_SLOTS];
    Baton__V1__Done last = BATON__V1__DONE__INIT; /* a stream's end: its status, no output */
    if (!p->used)
        return;
    if (p->stream && d->n_outputs) {
        /* What batond sends a client per streamed token: the value inline. */
        const Baton__V1__TensorRef *ref = d->outputs[0]->ref;
        Baton__V1__Tensor v = BATON__V1__TENSOR__INIT;
        v.name = d->outputs[0]->name;
        v.dtype = ref->dtype;
        v.n_dims = ref->n_dims;
        v.dims = ref->dims;
        v.data = ref->data;
        v.modality = "text";
        Baton__V1__InferChunk ch = BATON__V1__INFER_CHUNK__INIT;
        ch.request_id = p->request_id;
        ch.seq = p->seq++;
        ch.value = &v;
        Baton__V1__ServerMessage sm = BATON__V1__SERVER_MESSAGE__INIT;
        sm.msg_case = BATON__V1__SERVER_MESSAGE__MSG_CHUNK;
        sm.chunk = &ch;
        send_packed(c->front, p->id, p->idlen, &sm.base);
        if (!d->finish)
            return;
        last.status = d->status;
        d = &last;
    }
    if (p->pattern) {
        Baton__V1__SessionClose sc = BATON__V1__SESSION_CLOSE__INIT;
        sc.request_key = d->request_key;
        Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_SESSION_CLOSE;
        m.session_close = &sc;
        send_conductor_msg(c->back, &m);
        uint64_t ids[1] = {d->request_key};
        Baton__V1__Release rel = BATON__V1__RELEASE__INIT;
        rel.n_tensor_ids = 1;
        rel.tensor_ids = ids;
        Baton__V1__ConductorMessage m2 = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m2.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_RELEASE;
        m2.release = &rel;
        send_conductor_msg(c->back, &m2);
    }
    Baton__V1__Tensor out;
    Baton__V1__Tensor *outp[1] = {&out};
    Baton__V1__InferResponse r = BATON__V1__INFER_RESPONSE__INIT;
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    if (d->status)
        st = *d->status;
    if (d->n_outputs) {
        const Baton__V1__TensorRef *ref = d->outputs[0]->ref;
        baton__v1__tensor__init(&out);
        out.name = d->outputs[0]->name;
        out.dtype = ref->dtype;
        out.n_dims = ref->n_dims;
        out.dims = ref->dims;
        out.data = ref->data;
        out.modality = "tensor";
        r.n_outputs = 1;
        r.outputs = outp;
    }
    Baton__V1__NodeTiming tm = BATON__V1__NODE_TIMING__INIT;
    Baton__V1__NodeTiming *tms[1] = {&tm};
    tm.node = "e";
    tm.worker = "w0";
    tm.queue_us = d->queue_us;
    tm.exec_us = d->exec_us;
    r.request_id = p->request_id;
    r.status = &st;
    r.n_timings = 1;
    r.timings = tms;
    r.total_us = (bench_now_ns() - p->start_ns) / 1000u;
    Baton__V1__ServerMessage sm = BATON__V1__SERVER_MESSAGE__INIT;
    sm.msg_case = BATON__V1__SERVER_MESSAGE__MSG_RESPONSE;
    sm.response = &r;
    send_packed(c->front, p->id, p->idlen, &sm.base);
    free(p->request_id);
    free(p->input);
    memset(p, 0, sizeof(*p));
}

/* One worker frame: the hello marks the worker up; Placed sends the
 * Dispatch of a pattern request; Done ends a request. */
static void on_worker(floor_conductor *c, const void *data, size_t len)
{
    Baton__V1__WorkerMessage *wm = baton__v1__worker_message__unpack(NULL, len, data);
    if (!wm)
        return;
    if (wm->msg_case == BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION) {
        c->worker_up = true;
    } else if (wm->msg_case == BATON__V1__WORKER_MESSAGE__MSG_PLACED) {
        const Baton__V1__Placed *pl = wm->placed;
        floor_pending *p = &c->slots[pl->request_key % FLOOR_SLOTS];
        if (p->used && pl->ref) {
            send_dispatch(c, pl->request_key, p->request_id, "e", p->input, pl->ref);
        } else if (p->used) {
            answer_error(c, p->id, p->idlen, p->request_id, BATON__V1__CODE__INTERNAL,
                         "floor: the input could not be placed");
            free(p->request_id);
            free(p->input);
            memset(p, 0, sizeof(*p));
        }
    } else if (wm->msg_case == BATON__V1__WORKER_MESSAGE__MSG_DONE) {
        on_done(c, wm->done);
    }
    baton__v1__worker_message__free_unpacked(wm, NULL);
}

/* One thread, one zmq_poll over the two ROUTERs, as batond's loop is; each
 * readable socket is drained before polling again. */
int bench_floor_conductor_main(void *arg)
{
    const bench_floor_args *a = arg;
    floor_conductor c = {0};
    void *ctx = zmq_ctx_new();
    c.front = floor_socket(ctx, ZMQ_ROUTER);
    c.back = floor_socket(ctx, ZMQ_ROUTER);
    c.slots = calloc(FLOOR_SLOTS, sizeof(*c.slots));
    if (!c.front || !c.back || !c.slots || zmq_bind(c.front, a->front) != 0 ||
        zmq_bind(c.back, a->back) != 0)
        return 1;
    for (;;) {
        zmq_pollitem_t items[2] = {{c.front, 0, ZMQ_POLLIN, 0}, {c.back, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, 2, -1) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            return 1;
        }
        zmq_msg_t id, part;
        if (items[0].revents & ZMQ_POLLIN)
            while (recv_routed(c.front, &id, &part) == 0) {
                on_client(&c, zmq_msg_data(&id), zmq_msg_size(&id), zmq_msg_data(&part),
                          zmq_msg_size(&part));
                zmq_msg_close(&part);
                zmq_msg_close(&id);
            }
        if (items[1].revents & ZMQ_POLLIN)
            while (recv_routed(c.back, &id, &part) == 0) {
                on_worker(&c, zmq_msg_data(&part), zmq_msg_size(&part));
                zmq_msg_close(&part);
                zmq_msg_close(&id);
            }
    }
}

int bench_floor_start(bench_floor *f)
{
    if (bench_mkdtemp(f->dir, sizeof(f->dir)) != 0)
        return -1;
    snprintf(f->a.front, sizeof(f->a.front), "ipc://%s/floor.sock", f->dir);
    snprintf(f->a.back, sizeof(f->a.back), "ipc://%s/floor-workers.sock", f->dir);
    f->conductor = bench_spawn(bench_floor_conductor_main, &f->a);
    f->worker = bench_spawn(bench_floor_worker_main, &f->a);
    if (f->conductor < 0 || f->worker < 0) {
        bench_floor_stop(f);
        return -1;
    }
    return 0;
}

void bench_floor_stop(bench_floor *f)
{
    bench_reap(f->conductor);
    bench_reap(f->worker);
    bench_rmtree(f->dir);
}
