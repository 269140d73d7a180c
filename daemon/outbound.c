/* The client's side of a request's results (daemon/outbound.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
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
    uint64_t seq;                 /* chunk */
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
    rt_usage usage;               /* response: the tokens counted */
    uint8_t *loop_ends;           /* response: per entity, rt_loop_end or 0; owned */
};

struct outbound {
    void *socket;                 /* the client ROUTER; borrowed */
    const graph_set *gs;          /* borrowed */
    supervisor *sup;              /* borrowed: Fetches go through it */
    tensor_table *tt;             /* borrowed */
    metrics *m;                   /* borrowed */
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
    return o;
}

void out_destroy(outbound *o)
{
    free(o);
}

void out_send(outbound *o, const uint8_t *identity, size_t identity_len,
              const Baton__V1__ServerMessage *m)
{
    size_t n = baton__v1__server_message__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        bt_error("out of memory sending a %zu-byte reply", n);
        return;
    }
    baton__v1__server_message__pack(m, buf);
    /* A client that went away simply loses the reply: ROUTER drops it. */
    if (zmq_send(o->socket, identity, identity_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(o->socket, buf, n, ZMQ_DONTWAIT) < 0)
        bt_debug("reply to a client dropped: %s", zmq_strerror(errno));
    free(buf);
}

void out_reject(outbound *o, const uint8_t *identity, size_t identity_len,
                const char *request_id, bt_code code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
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
    memset(q, 0, sizeof(*q));
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
    o->seq = a->u.chunk.seq;
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

static void send_chunk(outbound *ob, const out_msg *o, const out_client *to)
{
    Baton__V1__Tensor t = BATON__V1__TENSOR__INIT;
    uint8_t *owned = NULL;
    join_output(o->bytes, o->n_bytes, &t, &owned);
    t.name = o->name;
    t.modality = o->modality;
    Baton__V1__InferChunk ch = BATON__V1__INFER_CHUNK__INIT;
    ch.request_id = (char *)to->request_id;
    ch.seq = o->seq;
    ch.value = &t;
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_CHUNK;
    m.chunk = &ch;
    out_send(ob, to->identity, to->identity_len, &m);
    if (owned) {
        free(owned);
        free(t.dims);
    }
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

static void send_response(outbound *ob, const out_msg *o, const out_client *to)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = (Baton__V1__Code)o->code;
    st.message = o->message ? o->message : "";
    Baton__V1__InferResponse resp = BATON__V1__INFER_RESPONSE__INIT;
    resp.request_id = (char *)to->request_id;
    resp.status = &st;
    Baton__V1__Tensor *ts = calloc(o->n_outs + 1, sizeof(*ts));
    Baton__V1__Tensor **tp = calloc(o->n_outs + 1, sizeof(*tp));
    uint8_t **owned = calloc(o->n_outs + 1, sizeof(*owned));
    Baton__V1__NodeTiming *tim = calloc(o->n_timings + 1, sizeof(*tim));
    Baton__V1__NodeTiming **timp = calloc(o->n_timings + 1, sizeof(*timp));
    if (!ts || !tp || !owned || !tim || !timp) {
        st.code = BATON__V1__CODE__RESOURCE_EXHAUSTED;
        st.message = "out of memory building the response";
    } else {
        fill_response(ob, o, to, &resp, &st, ts, tp, owned, tim, timp);
    }
    resp.total_us = bt_now_us() - to->start_us;
    resp.seed = to->seed;
    /* Token counts, when a node counted any; how each loop that ran ended. */
    Baton__V1__Usage usage = BATON__V1__USAGE__INIT;
    if (o->usage.prompt || o->usage.generated) {
        usage.prompt_tokens = o->usage.prompt;
        usage.completion_tokens = o->usage.generated;
        usage.total_tokens = o->usage.prompt > UINT32_MAX - o->usage.generated
                                 ? UINT32_MAX : o->usage.prompt + o->usage.generated;
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
    out_send(ob, to->identity, to->identity_len, &m);
    metrics_request_done(ob->m, to->graph, (bt_code)st.code, resp.total_us);
    for (size_t i = 0; owned && i < o->n_outs; i++)
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

bool out_flush(outbound *ob, out_queue *q, const out_client *to)
{
    size_t sent = 0;
    bool responded = false;
    while (sent < q->n && msg_ready(&q->v[sent])) {
        if (q->v[sent].response) {
            send_response(ob, &q->v[sent], to);
            responded = true;
        } else {
            send_chunk(ob, &q->v[sent], to);
            uint64_t now = bt_now_us();
            bool first = q->last_chunk_us == 0;
            metrics_token(ob->m, to->graph, first, now - (first ? to->start_us : q->last_chunk_us));
            q->last_chunk_us = now;
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

bool out_fetched(out_queue *q, uint64_t key, const uint8_t *data, size_t len)
{
    bool hit = false;
    for (size_t i = 0; i < q->n && q->fetches_pending; i++)
        for (size_t b = 0; b < q->v[i].n_bytes; b++) {
            out_bytes *o = &q->v[i].bytes[b];
            if (o->ready || o->tkey != key)
                continue;
            o->data = malloc(len ? len : 1);
            if (o->data && len)
                memcpy(o->data, data, len);
            o->ndata = o->data ? len : 0;
            o->ready = true;
            q->fetches_pending--;
            hit = true;
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
            if (q->v[i].response && q->v[i].code == BT_CODE_OK) {
                q->v[i].code = BT_CODE_UNAVAILABLE;
                free(q->v[i].message);
                q->v[i].message = strdup("a worker holding an output was lost");
            }
            q->fetches_pending--;
            hit = true;
        }
    return hit;
}
