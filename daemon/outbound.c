/* The client's side of a request's results (daemon/outbound.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/utf8.h"
#include "common/vec.h"
#include "daemon/outbound.h"

/* A client-bound tensor waiting for its bytes. */
typedef struct out_bytes {
    uint64_t tkey;                /* tensor table key */
    int worker;                   /* owner */
    Baton__V1__DType dtype;
    uint32_t ndim;
    int64_t dims[TT_MAX_DIMS];
    uint8_t *data;                /* owned once ready */
    size_t ndata;
    bool ready;
} out_bytes;

/* A message to the client, held until every tensor it carries has bytes. */
struct out_msg {
    bool response;                /* else a chunk */
    char *name;                   /* chunk: value name; owned */
    char *modality;               /* chunk; owned */
    bt_code code;                 /* response */
    char *message;                /* response; owned */
    /* Tensors: a chunk has one; response output i has out_parts[i]. */
    out_bytes *bytes;             /* owned */
    size_t n_bytes;
    char **out_names;             /* response: output names; owned */
    char **out_modalities;
    size_t *out_parts;            /* response: tensors per output, in order */
    size_t n_outs;
    disp_timing *timings;         /* response: owned copy */
    size_t n_timings;
    rt_usage usage;               /* the tokens counted: the response's, or a chunk's so far */
    uint8_t *loop_ends;           /* response: per entity, rt_loop_end or 0; owned */
};

/* The streamed values of one name, kept for the response of a client that
 * asked for no stream (out_queue.keep). */
struct out_kept {
    const char *name;             /* borrowed from the graph */
    const char *modality;
    out_bytes *parts;             /* owned, in order */
    size_t n, cap;
};

/* A streamed chunk held while the socket is corked (out_cork). */
typedef struct out_held {
    uint8_t identity[256];        /* the client's routing id (ZeroMQ's are at most 255 bytes) */
    size_t identity_len;
    cl_frame *f;                  /* owned */
} out_held;

/* Chunks held at most: past it they go at once. */
#define OUT_HELD_MAX 64

struct outbound {
    void *socket;                 /* the client ROUTER; borrowed */
    bool corked;                  /* out_send holds chunks until out_uncork */
    out_held *held;               /* owned; the first n_held in use, in order */
    size_t n_held;
    const graph_set *gs;          /* borrowed */
    supervisor *sup;              /* borrowed: Fetches go through it */
    tensor_table *tt;             /* borrowed */
    metrics *m;                   /* borrowed */
    cl_table clients;             /* the backlogs of clients that do not read */
    long backlog_poll_ms;         /* how soon the loop looks at a backlog again: 1 when
                                     the backlogs changed, doubling to 16 while not */
    uint64_t last_backlog_bytes;  /* clients.backlog_bytes at the last look */
    uint64_t dropped;             /* clients dropped since start */
};

outbound *out_create(void *socket, const graph_set *gs, supervisor *sup, tensor_table *tt,
                     metrics *m)
{
    outbound *o = calloc(1, sizeof(*o));
    if (!o)
        return NULL;
    o->socket = socket;
    o->gs = gs;
    o->sup = sup;
    o->tt = tt;
    o->m = m;
    cl_init(&o->clients);
    return o;
}

void out_destroy(outbound *o)
{
    if (!o)
        return;
    for (size_t i = 0; i < o->n_held; i++)
        free(o->held[i].f);
    free(o->held);
    cl_free(&o->clients);
    free(o);
}

cl_table *out_clients(outbound *o)
{
    return &o->clients;
}

void out_drop_client(outbound *o, cl_client *c)
{
    /* Chunks held for it in this round go with it: delivered at the
     * uncork, a full pipe would make it a client again, with a backlog. */
    size_t k = 0;
    for (size_t i = 0; i < o->n_held; i++) {
        out_held *h = &o->held[i];
        if (h->identity_len == c->identity_len &&
            memcmp(h->identity, c->identity, c->identity_len) == 0)
            free(h->f);
        else
            o->held[k++] = *h;
    }
    o->n_held = k;
    metrics_client_dropped(o->m);
    o->dropped++;
    cl_remove(&o->clients, c);
}

uint64_t out_dropped(const outbound *o)
{
    return o->dropped;
}

/* Hands F to ZeroMQ for the client IDENTITY: 0, or the errno: EAGAIN when
 * the client's pipe is full (the ROUTER is ROUTER_MANDATORY with a finite
 * high-water mark), EHOSTUNREACH when the client went away. */
static int send_frame(outbound *o, const uint8_t *identity, size_t identity_len,
                      const cl_frame *f)
{
    /* A ROUTER takes a message whole or not at all: once the identity
     * frame is taken, the body is too. */
    if (zmq_send(o->socket, identity, identity_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(o->socket, f->data, f->len, ZMQ_DONTWAIT) < 0)
        return errno ? errno : EIO;
    return 0;
}

/* ZeroMQ learns that a reader made room from a command it handles only
 * inside its own calls (a send checks for commands at most about once a
 * millisecond): asking for the socket's events makes it read them now. */
static void process_commands(outbound *o)
{
    int events = 0;
    size_t len = sizeof(events);
    (void)zmq_getsockopt(o->socket, ZMQ_EVENTS, &events, &len);
}

/* Sends C's backlog on as far as ZeroMQ takes it; a client that went away
 * loses all of it. */
static void flush_client(outbound *o, cl_client *c, uint64_t now_ms)
{
    int err = 0;
    while (c->head && (err = send_frame(o, c->identity, c->identity_len, c->head)) == 0)
        free(cl_backlog_pop(&o->clients, c, now_ms));
    if (err && err != EAGAIN) {
        bt_debug("%zu replies to a client dropped: %s", c->n_backlog, zmq_strerror(err));
        while (c->head)
            free(cl_backlog_pop(&o->clients, c, now_ms));
    }
}

long out_flush_backlogs(outbound *o, uint64_t now_ms)
{
    if (o->clients.waiting) {
        process_commands(o);
        for (cl_client *c = o->clients.waiting, *next; c; c = next) {
            next = c->wait_next;
            flush_client(o, c, now_ms);
        }
    }
    if (!o->clients.waiting) {
        o->backlog_poll_ms = 0; /* the next backlog starts afresh */
        o->last_backlog_bytes = 0;
        return -1;
    }
    /* A client that stopped reading may take client_stall_timeout_ms to
     * be dropped: a backlog that did not change since the last look (no
     * reply left it, none joined it) is looked at less and less often. */
    uint64_t bl = o->clients.backlog_bytes;
    if (bl != o->last_backlog_bytes || !o->backlog_poll_ms)
        o->backlog_poll_ms = 1;
    else if (o->backlog_poll_ms < 16)
        o->backlog_poll_ms *= 2;
    o->last_backlog_bytes = bl;
    return o->backlog_poll_ms;
}

int out_room_fd(const outbound *o)
{
    int fd = -1;
    size_t len = sizeof(fd);
    return zmq_getsockopt(o->socket, ZMQ_FD, &fd, &len) == 0 ? fd : -1;
}

/* Hands F (owned) to ZeroMQ for the client IDENTITY, behind the client's
 * backlog if it has one; a client whose pipe is full gets it in its
 * backlog, one that went away loses it. */
static void deliver(outbound *o, const uint8_t *identity, size_t identity_len, cl_frame *f,
                    uint64_t now)
{
    /* Behind what already waits, to keep each client's order; what waits
     * goes first if ZeroMQ takes it now. */
    cl_client *c = cl_find(&o->clients, identity, identity_len);
    if (c && c->n_backlog) {
        flush_client(o, c, now);
        /* A burst of worker messages handled in one round can outrun the
         * pipe many times over, and ZeroMQ learns that the client made
         * room only from a command it reads in its own calls: every 16
         * replies kept, have it read them and try again, rather than let
         * the whole round's replies wait for its end. */
        if (c->n_backlog && c->n_backlog % 16 == 0) {
            process_commands(o);
            flush_client(o, c, now);
        }
    }
    if (c && c->n_backlog) {
        cl_backlog_push(&o->clients, c, f, now);
        return;
    }
    int err = send_frame(o, identity, identity_len, f);
    if (err == EAGAIN && (c = cl_get(&o->clients, identity, identity_len))) {
        cl_backlog_push(&o->clients, c, f, now);
        return;
    }
    /* A client that went away simply loses the reply. */
    if (err)
        bt_debug("reply to a client dropped: %s", zmq_strerror(err));
    free(f);
}

void out_cork(outbound *o)
{
    o->corked = true;
}

/* Sends the chunks held, in order. */
static void send_held(outbound *o)
{
    uint64_t now = bt_now_ms();
    for (size_t i = 0; i < o->n_held; i++)
        deliver(o, o->held[i].identity, o->held[i].identity_len, o->held[i].f, now);
    o->n_held = 0;
}

void out_uncork(outbound *o)
{
    o->corked = false;
    if (o->n_held)
        send_held(o);
}

void out_send(outbound *o, const uint8_t *identity, size_t identity_len,
              const Baton__V1__ServerMessage *m)
{
    size_t n = baton__v1__server_message__get_packed_size(m);
    cl_frame *f = malloc(sizeof(*f) + (n ? n : 1));
    if (!f) {
        bt_error("out of memory sending a %zu-byte reply", n);
        return;
    }
    f->len = n;
    baton__v1__server_message__pack(m, f->data);
    bool hold = o->corked && m->msg_case == BATON__V1__SERVER_MESSAGE__MSG_CHUNK &&
                identity_len <= sizeof(o->held[0].identity);
    if (hold && !o->held && !(o->held = malloc(OUT_HELD_MAX * sizeof(*o->held))))
        hold = false;
    if (hold) {
        if (o->n_held == OUT_HELD_MAX)
            send_held(o);
        out_held *h = &o->held[o->n_held++];
        memcpy(h->identity, identity, identity_len);
        h->identity_len = identity_len;
        h->f = f;
        return;
    }
    if (o->n_held)
        send_held(o); /* what is held goes first */
    deliver(o, identity, identity_len, f, bt_now_ms());
}

void out_tick(outbound *o, uint64_t now_ms)
{
    /* Nothing waits, and every client left has requests in flight. */
    if (!o->clients.backlog_bytes && o->clients.n == o->clients.busy)
        return;
    size_t n;
    cl_client **v = cl_list(&o->clients, &n);
    for (size_t i = 0; i < n; i++) {
        flush_client(o, v[i], now_ms);
        cl_release_if_idle(&o->clients, v[i], now_ms, CL_REFUSED_KEEP_MS);
    }
    free(v);
}

void out_reject(outbound *o, const uint8_t *identity, size_t identity_len,
                const char *request_id, bt_code code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* A long name cut by this buffer (or by the caller's) must not leave
     * half a character: the client's protobuf runtime would refuse the
     * whole reply. */
    size_t n = strlen(msg);
    msg[bt_utf8_cut(msg, n)] = '\0';
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = (Baton__V1__Code)code;
    st.message = msg;
    Baton__V1__InferResponse resp = BATON__V1__INFER_RESPONSE__INIT;
    resp.request_id = (char *)(request_id ? request_id : "");
    resp.status = &st;
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_RESPONSE;
    m.response = &resp;
    out_send(o, identity, identity_len, &m);
    metrics_rejected(o->m, code);
    bt_debug("request '%s' refused: %s: %s", request_id ? request_id : "", bt_code_name(code),
             msg);
}

/* ---- queueing ---------------------------------------------------------- */

static void msg_free(out_msg *o)
{
    for (size_t i = 0; i < o->n_bytes; i++)
        free(o->bytes[i].data);
    free(o->bytes);
    free(o->name);
    free(o->modality);
    free(o->message);
    for (size_t i = 0; i < o->n_outs; i++) {
        free(o->out_names[i]);
        free(o->out_modalities[i]);
    }
    free(o->out_names);
    free(o->out_modalities);
    free(o->out_parts);
    free(o->timings);
    free(o->loop_ends);
}

void out_queue_free(out_queue *q)
{
    for (size_t i = 0; i < q->n; i++)
        msg_free(&q->v[i]);
    free(q->v);
    if (q->limit)
        tl_free(q->limit);
    free(q->limit);
    for (size_t i = 0; i < q->n_kept; i++) {
        for (size_t k = 0; k < q->kept[i].n; k++)
            free(q->kept[i].parts[k].data);
        free(q->kept[i].parts);
    }
    free(q->kept);
    free(q->fail_message);
    memset(q, 0, sizeof(*q));
}

int out_queue_limit(out_queue *q, const graph *g, const char *text_output,
                    const char *const *stop, size_t n_stop, uint32_t max_tokens, bool stream)
{
    if (!(q->limit = malloc(sizeof(*q->limit))))
        return BT_ENOMEM;
    int rc = tl_init(q->limit, stop, n_stop, max_tokens);
    if (rc != 0) {
        free(q->limit);
        q->limit = NULL;
        return rc;
    }
    q->limit_name = text_output;
    q->keep = !stream;
    if (stream)
        return 0;
    /* Every new_token value the client gets, in the graph's order: one
     * that produced nothing still appears, as the runtime would send it. */
    if (!(q->kept = calloc(g->n_edges + 1, sizeof(*q->kept))))
        return BT_ENOMEM;
    for (size_t i = 0; i < g->n_edges; i++) {
        const graph_edge *e = &g->edges[i];
        if (e->consumer >= 0 || !e->new_token)
            continue;
        const char *name = e->client_name;
        bool seen = false;
        for (size_t k = 0; k < q->n_kept && !seen; k++)
            seen = strcmp(q->kept[k].name, name) == 0;
        if (seen)
            continue;
        q->kept[q->n_kept].name = name;
        q->kept[q->n_kept].modality = e->modality ? e->modality : "";
        q->n_kept++;
    }
    return 0;
}

static out_msg *queue_push(out_queue *q)
{
    if (BT_RESERVE(q->v, q->n, q->cap, 8) < 0)
        return NULL;
    out_msg *o = &q->v[q->n++];
    memset(o, 0, sizeof(*o));
    return o;
}

/* Captures a client-bound tensor's bytes now, or asks its worker for them. */
static void capture(outbound *ob, out_queue *q, rt_tensor t, out_bytes *o)
{
    memset(o, 0, sizeof(*o));
    o->tkey = tt_key(t);
    o->worker = t.worker;
    const ctensor *ct = tt_find_key(ob->tt, o->tkey);
    if (!ct) {
        o->ready = true; /* unknown: an empty value rather than a hang */
        return;
    }
    o->dtype = ct->dtype;
    o->ndim = ct->ndim;
    memcpy(o->dims, ct->dims, sizeof(o->dims));
    if (ct->data || ct->nbytes == 0) {
        o->ndata = ct->ndata;
        o->data = malloc(ct->ndata ? ct->ndata : 1);
        if (o->data && ct->ndata)
            memcpy(o->data, ct->data, ct->ndata);
        o->ready = true;
        return;
    }
    /* The Fetch goes out before this batch's Release of the same tensor, and
     * the worker answers in order, so the bytes are read before they go. */
    Baton__V1__Fetch f = BATON__V1__FETCH__INIT;
    f.tensor_id = t.id;
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_FETCH;
    m.fetch = &f;
    if (sup_worker_get(ob->sup, t.worker)->state == SUP_DOWN ||
        sup_send(ob->sup, t.worker, &m) < 0) {
        o->ready = true;
        return;
    }
    q->fetches_pending++;
}

void out_queue_chunk(outbound *ob, out_queue *q, const rt_action *a)
{
    out_msg *o = queue_push(q);
    if (!o)
        return;
    o->usage = a->u.chunk.usage;
    o->name = strdup(a->u.chunk.name);
    o->modality = strdup(a->u.chunk.modality);
    o->bytes = calloc(1, sizeof(*o->bytes));
    if (!o->bytes)
        return;
    if (a->u.chunk.tensor.id) {
        o->n_bytes = 1;
        capture(ob, q, a->u.chunk.tensor, &o->bytes[0]);
    }
}

void out_queue_response(outbound *ob, out_queue *q, const rt_action *a,
                        const disp_timing *timings, size_t n_timings)
{
    out_msg *o = queue_push(q);
    if (!o)
        return;
    o->response = true;
    o->code = a->u.response.code;
    o->message = strdup(a->u.response.message ? a->u.response.message : "");
    if (o->code == BT_CODE_OK && q->fail_code != BT_CODE_OK) {
        /* An output streamed before went out empty: not an OK. */
        o->code = q->fail_code;
        free(o->message);
        o->message = strdup(q->fail_message ? q->fail_message : "");
    }
    if (n_timings && (o->timings = malloc(n_timings * sizeof(*timings)))) {
        memcpy(o->timings, timings, n_timings * sizeof(*timings));
        o->n_timings = n_timings;
    }
    o->usage = a->u.response.usage;
    size_t ne = a->graph >= 0 ? ob->gs->graphs[a->graph].n_entities : 0;
    if (a->u.response.loop_ends && ne && (o->loop_ends = malloc(ne)))
        memcpy(o->loop_ends, a->u.response.loop_ends, ne);
    size_t total = 0, n = a->u.response.n_outputs;
    for (size_t i = 0; i < n; i++)
        total += a->u.response.outputs[i].value.n;
    o->bytes = calloc(total + 1, sizeof(*o->bytes));
    o->out_names = calloc(n + 1, sizeof(char *));
    o->out_modalities = calloc(n + 1, sizeof(char *));
    o->out_parts = calloc(n + 1, sizeof(size_t));
    if (!o->bytes || !o->out_names || !o->out_modalities || !o->out_parts)
        return;
    for (size_t i = 0; i < n; i++) {
        const rt_output *out = &a->u.response.outputs[i];
        o->out_names[i] = strdup(out->name);
        o->out_modalities[i] = strdup(out->modality);
        o->out_parts[i] = out->value.n;
        for (uint32_t k = 0; k < out->value.n; k++)
            capture(ob, q, out->value.t[k], &o->bytes[o->n_bytes++]);
    }
    o->n_outs = n;
}

/* ---- sending ----------------------------------------------------------- */

/* Joins the tensors of one output (chunks along dim 0) into a client
 * Tensor.  Returns false when they disagree on dtype or inner dims. */
static bool join_output(const out_bytes *parts, size_t n, Baton__V1__Tensor *t, uint8_t **owned)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += parts[i].ndata;
    *owned = NULL;
    t->dtype = n ? parts[0].dtype : BATON__V1__DTYPE__U8;
    if (n == 0) {
        static int64_t zero = 0;
        t->n_dims = 1;
        t->dims = &zero;
        return true;
    }
    if (n == 1) {
        t->n_dims = parts[0].ndim;
        t->dims = (int64_t *)parts[0].dims;
        t->data.len = parts[0].ndata;
        t->data.data = parts[0].data;
        return true;
    }
    for (size_t i = 1; i < n; i++) {
        if (parts[i].dtype != parts[0].dtype || parts[i].ndim != parts[0].ndim)
            return false;
        for (uint32_t d = 1; d < parts[0].ndim; d++)
            if (parts[i].dims[d] != parts[0].dims[d])
                return false;
    }
    uint8_t *buf = malloc(total ? total : 1);
    if (!buf)
        return false;
    size_t off = 0;
    int64_t dim0 = 0;
    for (size_t i = 0; i < n; i++) {
        if (parts[i].ndata)
            memcpy(buf + off, parts[i].data, parts[i].ndata);
        off += parts[i].ndata;
        dim0 += parts[i].ndim ? parts[i].dims[0] : 1;
    }
    /* dims point into parts[0], patched for the joined extent. */
    int64_t *dims = malloc(sizeof(int64_t) * (parts[0].ndim ? parts[0].ndim : 1));
    if (!dims) {
        free(buf);
        return false;
    }
    memcpy(dims, parts[0].dims, sizeof(int64_t) * parts[0].ndim);
    if (parts[0].ndim)
        dims[0] = dim0;
    t->n_dims = parts[0].ndim;
    t->dims = dims;
    t->data.len = total;
    t->data.data = buf;
    *owned = buf;
    return true;
}

static void send_chunk(outbound *ob, const char *name, const char *modality,
                       const out_bytes *b, const out_client *to, uint64_t seq)
{
    Baton__V1__Tensor t = BATON__V1__TENSOR__INIT;
    uint8_t *owned = NULL;
    join_output(b, 1, &t, &owned);
    t.name = (char *)name;
    t.modality = (char *)modality;
    Baton__V1__InferChunk ch = BATON__V1__INFER_CHUNK__INIT;
    ch.request_id = (char *)to->request_id;
    ch.seq = seq;
    ch.value = &t;
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_CHUNK;
    m.chunk = &ch;
    if (!to->discard)
        out_send(ob, to->identity, to->identity_len, &m);
}

/* Fills RESP's outputs and timings from O; arrays come from the caller.
 * Leaves ST saying what failed when parts disagree. */
static void fill_response(outbound *ob, const out_msg *o, const out_client *to,
                          Baton__V1__InferResponse *resp, Baton__V1__Status *st,
                          Baton__V1__Tensor *ts, Baton__V1__Tensor **tp, uint8_t **owned,
                          Baton__V1__NodeTiming *tim, Baton__V1__NodeTiming **timp)
{
    size_t at = 0;
    for (size_t i = 0; i < o->n_outs; i++) {
        baton__v1__tensor__init(&ts[i]);
        if (!join_output(&o->bytes[at], o->out_parts[i], &ts[i], &owned[i])) {
            st->code = BATON__V1__CODE__INTERNAL;
            st->message = "the parts of a client output disagree on dtype or shape";
        }
        ts[i].name = o->out_names[i];
        ts[i].modality = o->out_modalities[i];
        tp[i] = &ts[i];
        at += o->out_parts[i];
    }
    if (st->code == BATON__V1__CODE__OK) {
        resp->n_outputs = o->n_outs;
        resp->outputs = tp;
    }
    const graph *g = &ob->gs->graphs[to->graph];
    for (size_t i = 0; i < o->n_timings; i++) {
        baton__v1__node_timing__init(&tim[i]);
        tim[i].node = (char *)g->entities[o->timings[i].node].name;
        tim[i].iteration = o->timings[i].iteration;
        tim[i].worker = (char *)ob->gs->cfg->workers[o->timings[i].worker].name;
        tim[i].queue_us = o->timings[i].queue_us;
        tim[i].exec_us = o->timings[i].exec_us;
        timp[i] = &tim[i];
    }
    resp->n_timings = o->n_timings;
    resp->timings = timp;
}

/* Adds the values Q kept (a client that asked for no stream) to RESP's
 * outputs, at TS[AT...]. */
static void add_kept(const out_queue *q, Baton__V1__InferResponse *resp, Baton__V1__Status *st,
                     Baton__V1__Tensor *ts, Baton__V1__Tensor **tp, uint8_t **owned, size_t at)
{
    for (size_t i = 0; i < q->n_kept; i++, at++) {
        baton__v1__tensor__init(&ts[at]);
        if (!join_output(q->kept[i].parts, q->kept[i].n, &ts[at], &owned[at])) {
            st->code = BATON__V1__CODE__INTERNAL;
            st->message = "the parts of a client output disagree on dtype or shape";
            resp->n_outputs = 0;
            return;
        }
        ts[at].name = (char *)q->kept[i].name;
        ts[at].modality = (char *)q->kept[i].modality;
        tp[at] = &ts[at];
    }
    resp->n_outputs = at;
    resp->outputs = tp;
}

static void send_response(outbound *ob, const out_queue *q, const out_msg *o,
                          const out_client *to)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = (Baton__V1__Code)o->code;
    st.message = o->message ? o->message : "";
    Baton__V1__InferResponse resp = BATON__V1__INFER_RESPONSE__INIT;
    resp.request_id = (char *)to->request_id;
    resp.status = &st;
    size_t n_outs = o->n_outs + q->n_kept;
    Baton__V1__Tensor *ts = calloc(n_outs + 1, sizeof(*ts));
    Baton__V1__Tensor **tp = calloc(n_outs + 1, sizeof(*tp));
    uint8_t **owned = calloc(n_outs + 1, sizeof(*owned));
    Baton__V1__NodeTiming *tim = calloc(o->n_timings + 1, sizeof(*tim));
    Baton__V1__NodeTiming **timp = calloc(o->n_timings + 1, sizeof(*timp));
    if (!ts || !tp || !owned || !tim || !timp) {
        st.code = BATON__V1__CODE__RESOURCE_EXHAUSTED;
        st.message = "out of memory building the response";
    } else {
        fill_response(ob, o, to, &resp, &st, ts, tp, owned, tim, timp);
        if (st.code == BATON__V1__CODE__OK && q->keep)
            add_kept(q, &resp, &st, ts, tp, owned, o->n_outs);
    }
    resp.total_us = bt_now_us() - to->start_us;
    resp.seed = to->seed;
    /* The text limit that ended the request: the response says which, and
     * counts the tokens up to the one that ended the text (the runtime may
     * have kept a step or two more before the stop reached it). */
    rt_usage u = o->usage;
    if (q->end != TL_RUNNING) {
        u = q->end_usage;
        if (st.code == BATON__V1__CODE__OK)
            resp.finish_reason = q->end == TL_STOP ? BATON__V1__FINISH_REASON__FINISH_REASON_STOP
                                                   : BATON__V1__FINISH_REASON__FINISH_REASON_LENGTH;
    }
    /* Token counts, when a node counted any; how each loop that ran ended. */
    Baton__V1__Usage usage = BATON__V1__USAGE__INIT;
    if (u.prompt || u.generated) {
        usage.prompt_tokens = u.prompt;
        usage.completion_tokens = u.generated;
        usage.total_tokens = u.prompt > UINT32_MAX - u.generated ? UINT32_MAX
                                                                  : u.prompt + u.generated;
        usage.cached_tokens = u.cached;
        resp.usage = &usage;
    }
    const graph *g = to->graph >= 0 ? &ob->gs->graphs[to->graph] : NULL;
    size_t n_ends = 0;
    for (size_t e = 0; g && o->loop_ends && e < g->n_entities; e++)
        n_ends += o->loop_ends[e] != 0;
    Baton__V1__InferResponse__LoopEndsEntry *ends = calloc(n_ends + 1, sizeof(*ends));
    Baton__V1__InferResponse__LoopEndsEntry **endp = calloc(n_ends + 1, sizeof(*endp));
    if (ends && endp && n_ends) {
        for (size_t e = 0, k = 0; e < g->n_entities; e++) {
            if (!o->loop_ends[e])
                continue;
            baton__v1__infer_response__loop_ends_entry__init(&ends[k]);
            ends[k].key = (char *)g->entities[e].name;
            ends[k].value = o->loop_ends[e] == RT_LOOP_FINISH
                                ? BATON__V1__LOOP_END__LOOP_END_FINISH
                                : BATON__V1__LOOP_END__LOOP_END_MAX_ITERS;
            endp[k] = &ends[k];
            k++;
        }
        resp.loop_ends = endp;
        resp.n_loop_ends = n_ends;
    }
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_RESPONSE;
    m.response = &resp;
    if (!to->discard)
        out_send(ob, to->identity, to->identity_len, &m);
    metrics_request_done(ob->m, to->graph, (bt_code)st.code, resp.total_us);
    for (size_t i = 0; owned && i < n_outs; i++)
        if (owned[i]) {
            free(owned[i]);
            free(ts[i].dims);
        }
    free(ts);
    free(tp);
    free(owned);
    free(tim);
    free(timp);
    free(ends);
    free(endp);
}

static bool msg_ready(const out_msg *o)
{
    for (size_t i = 0; i < o->n_bytes; i++)
        if (!o->bytes[i].ready)
            return false;
    return true;
}

/* Makes B hold the N bytes at P (which may point into B's own): text, U8
 * of one dim. */
static void set_text(out_bytes *b, const uint8_t *p, size_t n)
{
    uint8_t *d = malloc(n ? n : 1);
    if (d && n)
        memcpy(d, p, n);
    free(b->data);
    b->data = d;
    b->ndata = d ? n : 0;
    b->dtype = BATON__V1__DTYPE__U8;
    b->ndim = 1;
    b->dims[0] = (int64_t)b->ndata;
    b->ready = true;
}

/* The bytes of chunk O that go to the client, after the text limit had its
 * say; NULL when nothing goes (an empty value, or text after its end). */
static out_bytes *chunk_bytes(out_queue *q, out_msg *o)
{
    out_bytes *b = o->n_bytes ? &o->bytes[0] : NULL;
    if (q->limit && strcmp(o->name, q->limit_name) == 0) {
        if (q->end != TL_RUNNING || !b || !b->ndata)
            return NULL;
        const uint8_t *p;
        size_t n;
        tl_end end = tl_feed(q->limit, b->data, b->ndata, &p, &n);
        set_text(b, p, n);
        if (end != TL_RUNNING) {
            q->end = end;
            q->stop_pending = true;
            q->end_usage = o->usage;
        }
    }
    return b && b->ndata ? b : NULL;
}

/* Sends the value B of NAME, or keeps it for the response (taking its
 * bytes). */
static void emit(outbound *ob, out_queue *q, const char *name, const char *modality,
                 out_bytes *b, const out_client *to)
{
    if (q->keep) {
        for (size_t i = 0; i < q->n_kept; i++) {
            out_kept *k = &q->kept[i];
            if (strcmp(k->name, name) != 0 || BT_RESERVE(k->parts, k->n, k->cap, 16) < 0)
                continue;
            k->parts[k->n++] = *b;
            b->data = NULL;
            b->ndata = 0;
            break;
        }
        return;
    }
    send_chunk(ob, name, modality, b, to, q->next_seq++);
    uint64_t now = bt_now_us();
    bool first = q->last_chunk_us == 0;
    metrics_token(ob->m, to->graph, first, now - (first ? to->start_us : q->last_chunk_us));
    q->last_chunk_us = now;
}

bool out_flush(outbound *ob, out_queue *q, const out_client *to)
{
    size_t sent = 0;
    bool responded = false;
    while (sent < q->n && msg_ready(&q->v[sent])) {
        out_msg *o = &q->v[sent];
        if (o->response) {
            /* The text held back for a stop string that never came. */
            const uint8_t *p;
            size_t n = 0;
            if (q->limit)
                tl_flush(q->limit, &p, &n);
            if (n) {
                out_bytes b = {0};
                set_text(&b, p, n);
                emit(ob, q, q->limit_name, "text", &b, to);
                free(b.data);
            }
            send_response(ob, q, o, to);
            responded = true;
        } else {
            out_bytes *b = chunk_bytes(q, o);
            if (b)
                emit(ob, q, o->name, o->modality, b, to);
        }
        sent++;
    }
    for (size_t i = 0; i < sent; i++)
        msg_free(&q->v[i]);
    memmove(q->v, q->v + sent, (q->n - sent) * sizeof(*q->v));
    q->n -= sent;
    return responded;
}

/* ---- bytes that arrive, or never will ---------------------------------- */

/* An output of Q cannot be had: its response, queued or to come, says
 * CODE and MESSAGE rather than OK (the first failure wins). */
static void fail_queue(out_queue *q, bt_code code, const char *message)
{
    if (q->fail_code == BT_CODE_OK) {
        q->fail_code = code;
        q->fail_message = strdup(message);
    }
    for (size_t i = 0; i < q->n; i++) {
        out_msg *o = &q->v[i];
        if (!o->response || o->code != BT_CODE_OK)
            continue;
        o->code = code;
        free(o->message);
        o->message = strdup(message);
    }
}

bool out_fetched(out_queue *q, uint64_t key, bt_code code, const char *message,
                 const uint8_t *data, size_t len)
{
    bool hit = false;
    for (size_t i = 0; i < q->n && q->fetches_pending; i++)
        for (size_t b = 0; b < q->v[i].n_bytes; b++) {
            out_bytes *o = &q->v[i].bytes[b];
            if (o->ready || o->tkey != key)
                continue;
            o->data = code == BT_CODE_OK ? malloc(len ? len : 1) : NULL;
            if (o->data && len)
                memcpy(o->data, data, len);
            o->ndata = o->data ? len : 0;
            o->ready = true;
            q->fetches_pending--;
            hit = true;
        }
    if (hit && code != BT_CODE_OK) {
        char why[320];
        snprintf(why, sizeof(why), "an output could not be read from its worker: %s",
                 message && *message ? message : bt_code_name(code));
        fail_queue(q, code, why);
    }
    return hit;
}

bool out_worker_lost(out_queue *q, int w)
{
    bool hit = false;
    for (size_t i = 0; i < q->n; i++)
        for (size_t b = 0; b < q->v[i].n_bytes; b++) {
            out_bytes *o = &q->v[i].bytes[b];
            if (o->ready || o->worker != w)
                continue;
            /* The bytes died with the worker; the message goes out with
             * an empty value rather than never. */
            o->ready = true;
            o->ndata = 0;
            q->fetches_pending--;
            hit = true;
        }
    if (hit)
        fail_queue(q, BT_CODE_UNAVAILABLE, "a worker holding an output was lost");
    return hit;
}
