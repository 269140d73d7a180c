/* The client side of the conductor: every frame on the client ROUTER is
 * checked at the door (DESIGN.md section 9, in a fixed order: the first
 * failing check answers), admitted or refused at once, and every accepted
 * request gets exactly one terminal InferResponse.  Client messages of a
 * request leave in order through its outbound queue, which holds a message
 * until every tensor it carries has its bytes (inline or fetched). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/log.h"
#include "daemon/conductor.h"
#include "common/vec.h"

#define REQUEST_ID_MAX 256

static uint64_t hash_client(const uint8_t *id, size_t n, const char *rid)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ id[i]) * 0x100000001b3ULL;
    h = (h ^ 0xff) * 0x100000001b3ULL;
    for (const char *p = rid; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
    return h == 0 || h == UINT64_MAX ? 1 : h;
}

void front_send(conductor *c, const uint8_t *identity, size_t identity_len,
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
    if (zmq_send(c->front, identity, identity_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(c->front, buf, n, ZMQ_DONTWAIT) < 0)
        bt_debug("reply to a client dropped: %s", zmq_strerror(errno));
    free(buf);
}

void front_reject(conductor *c, const uint8_t *identity, size_t identity_len,
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
    front_send(c, identity, identity_len, &m);
    metrics_rejected(c->m, code);
    bt_debug("request '%s' refused: %s: %s", request_id ? request_id : "", bt_code_name(code),
             msg);
}

creq *front_find(conductor *c, const uint8_t *identity, size_t len, const char *request_id)
{
    uint64_t h = hash_client(identity, len, request_id);
    for (creq *r = u64map_get(&c->by_client, h); r; r = r->hnext)
        if (r->identity_len == len && memcmp(r->identity, identity, len) == 0 &&
            strcmp(r->request_id, request_id) == 0)
            return r;
    return NULL;
}

/* The one in-flight request with this id on any connection, or NULL when
 * there is none or several.  Lets an operator's `batonctl cancel ID` (its
 * own connection) stop a request another client sent. */
static creq *find_unique(conductor *c, const char *request_id)
{
    creq *found = NULL;
    size_t pos = 0;
    uint64_t key;
    void *val;
    while (u64map_next(&c->requests, &pos, &key, &val)) {
        creq *r = val;
        if (strcmp(r->request_id, request_id) != 0)
            continue;
        if (found)
            return NULL;
        found = r;
    }
    return found;
}

static void outmsg_free(outmsg *o)
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
}

void front_request_free(conductor *c, creq *r)
{
    if (!r)
        return;
    u64map_del(&c->requests, r->key);
    /* Unlink from its hash chain. */
    creq *head = u64map_get(&c->by_client, r->hkey);
    if (head == r) {
        if (r->hnext)
            u64map_put(&c->by_client, r->hkey, r->hnext);
        else
            u64map_del(&c->by_client, r->hkey);
    } else {
        for (creq *p = head; p; p = p->hnext)
            if (p->hnext == r) {
                p->hnext = r->hnext;
                break;
            }
    }
    for (size_t i = 0; i < r->n_outq; i++)
        outmsg_free(&r->outq[i]);
    free(r->outq);
    free(r->timings);
    free(r->inputs);
    free(r->max_iters);
    free(r->identity);
    free(r->request_id);
    free(r);
}

/* Joins the tensors of one output (chunks along dim 0) into a client
 * Tensor.  Returns false when they disagree on dtype or inner dims. */
static bool join_output(const obytes *parts, size_t n, Baton__V1__Tensor *t, uint8_t **owned)
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

static void send_outmsg(conductor *c, creq *r, outmsg *o)
{
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    if (!o->response) {
        Baton__V1__Tensor t = BATON__V1__TENSOR__INIT;
        uint8_t *owned = NULL;
        join_output(o->bytes, o->n_bytes, &t, &owned);
        t.name = o->name;
        t.modality = o->modality;
        Baton__V1__InferChunk ch = BATON__V1__INFER_CHUNK__INIT;
        ch.request_id = r->request_id;
        ch.seq = o->seq;
        ch.value = &t;
        m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_CHUNK;
        m.chunk = &ch;
        front_send(c, r->identity, r->identity_len, &m);
        if (owned) {
            free(owned);
            free(t.dims);
        }
        return;
    }
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = (Baton__V1__Code)o->code;
    st.message = o->message ? o->message : "";
    Baton__V1__InferResponse resp = BATON__V1__INFER_RESPONSE__INIT;
    resp.request_id = r->request_id;
    resp.status = &st;
    Baton__V1__Tensor *ts = calloc(o->n_outs + 1, sizeof(*ts));
    Baton__V1__Tensor **tp = calloc(o->n_outs + 1, sizeof(*tp));
    uint8_t **owned = calloc(o->n_outs + 1, sizeof(*owned));
    Baton__V1__NodeTiming *tim = calloc(r->n_timings + 1, sizeof(*tim));
    Baton__V1__NodeTiming **timp = calloc(r->n_timings + 1, sizeof(*timp));
    if (!ts || !tp || !owned || !tim || !timp) {
        st.code = BATON__V1__CODE__RESOURCE_EXHAUSTED;
        st.message = "out of memory building the response";
    } else {
        size_t at = 0;
        for (size_t i = 0; i < o->n_outs; i++) {
            baton__v1__tensor__init(&ts[i]);
            if (!join_output(&o->bytes[at], o->out_parts[i], &ts[i], &owned[i])) {
                st.code = BATON__V1__CODE__INTERNAL;
                st.message = "the parts of a client output disagree on dtype or shape";
            }
            ts[i].name = o->out_names[i];
            ts[i].modality = o->out_modalities[i];
            tp[i] = &ts[i];
            at += o->out_parts[i];
        }
        if (st.code == BATON__V1__CODE__OK) {
            resp.n_outputs = o->n_outs;
            resp.outputs = tp;
        }
        const graph *g = &c->gs->graphs[r->graph];
        for (size_t i = 0; i < r->n_timings; i++) {
            baton__v1__node_timing__init(&tim[i]);
            tim[i].node = (char *)g->entities[r->timings[i].node].name;
            tim[i].iteration = r->timings[i].iteration;
            tim[i].worker = (char *)c->cfg->workers[r->timings[i].worker].name;
            tim[i].queue_us = r->timings[i].queue_us;
            tim[i].exec_us = r->timings[i].exec_us;
            timp[i] = &tim[i];
        }
        resp.n_timings = r->n_timings;
        resp.timings = timp;
    }
    resp.total_us = cond_now_us() - r->start_us;
    m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_RESPONSE;
    m.response = &resp;
    front_send(c, r->identity, r->identity_len, &m);
    metrics_request_done(c->m, r->graph, (bt_code)st.code, resp.total_us);
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
}

static bool outmsg_ready(const outmsg *o)
{
    for (size_t i = 0; i < o->n_bytes; i++)
        if (!o->bytes[i].ready)
            return false;
    return true;
}

void front_flush(conductor *c, creq *r)
{
    size_t sent = 0;
    while (sent < r->n_outq && outmsg_ready(&r->outq[sent])) {
        send_outmsg(c, r, &r->outq[sent]);
        sent++;
    }
    for (size_t i = 0; i < sent; i++)
        outmsg_free(&r->outq[i]);
    memmove(r->outq, r->outq + sent, (r->n_outq - sent) * sizeof(*r->outq));
    r->n_outq -= sent;
    if (r->phase == REQ_FLUSHING && r->n_outq == 0)
        front_request_free(c, r);
}

/* Releases inputs already placed, for a request that never reached the
 * runtime. */
static void release_inputs(conductor *c, creq *r)
{
    const graph *g = &c->gs->graphs[r->graph];
    for (size_t k = 0; k < g->n_inputs; k++) {
        if (r->inputs[k].id)
            disp_release_input(c, r->inputs[k]);
        r->inputs[k] = (rt_tensor){0, 0};
    }
    disp_flush_releases(c);
}

void front_end_placing(conductor *c, creq *r, bt_code code, const char *message)
{
    release_inputs(c, r);
    front_reject(c, r->identity, r->identity_len, r->request_id, code, "%s", message);
    front_request_free(c, r);
}

void front_end_placing_all(conductor *c, int worker, bt_code code, const char *message)
{
    size_t pos = 0;
    uint64_t key;
    void *val;
    uint64_t *placing = malloc((c->requests.n + 1) * sizeof(*placing));
    size_t np = 0;
    while (placing && u64map_next(&c->requests, &pos, &key, &val))
        if (((creq *)val)->phase == REQ_PLACING)
            placing[np++] = key;
    /* Ending one removes it from the map: act on the keys gathered. */
    for (size_t i = 0; i < np; i++) {
        creq *r = u64map_get(&c->requests, placing[i]);
        if (!r)
            continue;
        const graph *g = &c->gs->graphs[r->graph];
        bool uses = worker < 0;
        for (size_t k = 0; k < g->n_inputs && !uses; k++)
            uses = c->graph_input_worker[r->graph][k] == worker;
        if (!uses)
            continue;
        /* Inputs placed on a dead worker are gone with it. */
        for (size_t k = 0; worker >= 0 && k < g->n_inputs; k++)
            if (r->inputs[k].worker == worker)
                r->inputs[k] = (rt_tensor){0, 0};
        front_end_placing(c, r, code, message);
    }
    free(placing);
}

void front_start_runtime(conductor *c, creq *r)
{
    int rc = rt_request_start(c->rt, r->key, r->graph, r->inputs, r->stream, r->max_iters);
    if (rc != 0) {
        front_end_placing(c, r, bt_err_to_code(rc), bt_strerror(rc));
        return;
    }
    r->phase = REQ_RUNNING;
    disp_actions(c);
}

static size_t dtype_size(Baton__V1__DType t)
{
    switch (t) {
    case BATON__V1__DTYPE__F32:
    case BATON__V1__DTYPE__I32: return 4;
    case BATON__V1__DTYPE__F16:
    case BATON__V1__DTYPE__BF16: return 2;
    case BATON__V1__DTYPE__I64: return 8;
    case BATON__V1__DTYPE__U8:
    case BATON__V1__DTYPE__BOOL: return 1;
    default: return 0;
    }
}

/* Checks one client tensor; returns NULL or what is wrong. */
static const char *check_tensor(const Baton__V1__Tensor *t, char *buf, size_t len)
{
    size_t es = dtype_size(t->dtype);
    if (!es) {
        snprintf(buf, len, "input '%s' has dtype %d, which is unspecified or not a DType",
                 t->name, (int)t->dtype);
        return buf;
    }
    if (t->n_dims > COND_MAX_DIMS) {
        snprintf(buf, len, "input '%s' has %zu dims; at most %d are supported", t->name,
                 t->n_dims, COND_MAX_DIMS);
        return buf;
    }
    uint64_t n = 1;
    for (size_t d = 0; d < t->n_dims; d++) {
        if (t->dims[d] < 0) {
            snprintf(buf, len, "input '%s' has negative dim %zu (%lld)", t->name, d,
                     (long long)t->dims[d]);
            return buf;
        }
        if (t->dims[d] && n > UINT64_MAX / (uint64_t)t->dims[d] / es) {
            snprintf(buf, len, "input '%s': the product of its dims overflows", t->name);
            return buf;
        }
        n *= (uint64_t)t->dims[d];
    }
    if (n * es != t->data.len) {
        snprintf(buf, len, "input '%s': dims give %llu bytes of %s but the data has %zu",
                 t->name, (unsigned long long)(n * es),
                 protobuf_c_enum_descriptor_get_value(&baton__v1__dtype__descriptor, t->dtype)
                     ->name,
                 t->data.len);
        return buf;
    }
    return NULL;
}

static void handle_infer(conductor *c, const uint8_t *id, size_t idlen,
                         const Baton__V1__InferRequest *q)
{
    char why[512];
    const char *rid = q->request_id ? q->request_id : "";
    if (!*rid) {
        front_reject(c, id, idlen, "", BT_CODE_INVALID_ARGUMENT, "request_id is empty");
        return;
    }
    if (strlen(rid) > REQUEST_ID_MAX) {
        front_reject(c, id, idlen, "", BT_CODE_INVALID_ARGUMENT,
                     "request_id is %zu bytes; at most %d are allowed", strlen(rid),
                     REQUEST_ID_MAX);
        return;
    }
    const graph *g = graph_set_find(c->gs, q->graph ? q->graph : "");
    if (!g) {
        front_reject(c, id, idlen, rid, BT_CODE_NOT_FOUND, "no graph named '%s'",
                     q->graph ? q->graph : "");
        return;
    }
    for (size_t i = 0; i < q->n_inputs; i++) {
        const Baton__V1__Tensor *t = q->inputs[i];
        const char *name = t->name ? t->name : "";
        if (graph_input_index(g, name) < 0) {
            front_reject(c, id, idlen, rid, BT_CODE_INVALID_ARGUMENT,
                         "graph '%s' has no input named '%s'", g->name, name);
            return;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(q->inputs[j]->name, name) == 0) {
                front_reject(c, id, idlen, rid, BT_CODE_INVALID_ARGUMENT,
                             "input '%s' is given twice", name);
                return;
            }
        if (check_tensor(t, why, sizeof(why))) {
            front_reject(c, id, idlen, rid, BT_CODE_INVALID_ARGUMENT, "%s", why);
            return;
        }
    }
    const Baton__V1__Tensor **by_input = calloc(g->n_inputs + 1, sizeof(*by_input));
    uint32_t *caps = calloc(g->n_entities + 1, sizeof(*caps));
    creq *r = NULL;
    if (!by_input || !caps) {
        front_reject(c, id, idlen, rid, BT_CODE_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < q->n_inputs; i++)
        by_input[graph_input_index(g, q->inputs[i]->name)] = q->inputs[i];
    for (size_t k = 0; k < g->n_inputs; k++)
        if (!by_input[k]) {
            front_reject(c, id, idlen, rid, BT_CODE_INVALID_ARGUMENT,
                         "graph '%s' needs input '%s', which the request does not give",
                         g->name, g->inputs[k]);
            goto out;
        }
    for (size_t i = 0; i < q->n_max_iters; i++) {
        const char *loop = q->max_iters[i]->key ? q->max_iters[i]->key : "";
        int e = graph_entity_find(g, loop);
        if (e < 0 || g->entities[e].kind != GRAPH_LOOP) {
            front_reject(c, id, idlen, rid, BT_CODE_INVALID_ARGUMENT,
                         "max_iters names '%s', which is not a loop of graph '%s'", loop,
                         g->name);
            goto out;
        }
        if (q->max_iters[i]->value == 0) {
            front_reject(c, id, idlen, rid, BT_CODE_INVALID_ARGUMENT,
                         "max_iters for loop '%s' is 0; a loop runs at least once", loop);
            goto out;
        }
        caps[e] = q->max_iters[i]->value;
    }
    if (front_find(c, id, idlen, rid)) {
        front_reject(c, id, idlen, rid, BT_CODE_ALREADY_EXISTS,
                     "request '%s' is already in flight on this connection", rid);
        goto out;
    }
    if (c->draining) {
        front_reject(c, id, idlen, rid, BT_CODE_UNAVAILABLE, "the daemon is shutting down");
        goto out;
    }
    if (!c->ready) {
        front_reject(c, id, idlen, rid, BT_CODE_UNAVAILABLE,
                     "not ready: waiting for workers to register and load their models");
        goto out;
    }
    if (c->requests.n >= c->max_inflight) {
        front_reject(c, id, idlen, rid, BT_CODE_RESOURCE_EXHAUSTED,
                     "%u requests are in flight, the limit (max_inflight)", c->max_inflight);
        goto out;
    }
    r = calloc(1, sizeof(*r));
    if (!r || !(r->identity = malloc(idlen ? idlen : 1)) || !(r->request_id = strdup(rid)) ||
        !(r->inputs = calloc(g->n_inputs + 1, sizeof(*r->inputs)))) {
        front_reject(c, id, idlen, rid, BT_CODE_RESOURCE_EXHAUSTED, "out of memory");
        front_request_free(c, r);
        r = NULL;
        goto out;
    }
    memcpy(r->identity, id, idlen);
    r->identity_len = idlen;
    r->key = ++c->next_key;
    r->hkey = hash_client(id, idlen, rid);
    r->graph = (int)g->index;
    r->stream = q->stream;
    r->start_us = cond_now_us();
    uint32_t timeout = q->timeout_ms ? q->timeout_ms : c->request_timeout_ms;
    r->deadline_ms = cond_now_ms() + timeout;
    if (q->sampling) {
        r->temperature = q->sampling->temperature;
        r->top_k = q->sampling->top_k;
        r->top_p = q->sampling->top_p;
        r->seed = q->sampling->seed;
    }
    r->max_iters = caps;
    caps = NULL;
    r->hnext = u64map_get(&c->by_client, r->hkey);
    if (u64map_put(&c->requests, r->key, r) < 0 || u64map_put(&c->by_client, r->hkey, r) < 0) {
        u64map_del(&c->requests, r->key);
        r->hnext = NULL;
        free(r->max_iters);
        free(r->inputs);
        free(r->identity);
        free(r->request_id);
        free(r);
        front_reject(c, id, idlen, rid, BT_CODE_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    /* Deadline heap (lazy: stale entries are skipped when they fire). */
    if (BT_RESERVE(c->deadlines, c->n_deadlines, c->cap_deadlines, 64) == 0) {
        size_t i = c->n_deadlines++;
        c->deadlines[i] = (deadline){r->deadline_ms, r->key};
        while (i > 0 && c->deadlines[(i - 1) / 2].at_ms > c->deadlines[i].at_ms) {
            deadline t = c->deadlines[i];
            c->deadlines[i] = c->deadlines[(i - 1) / 2];
            c->deadlines[(i - 1) / 2] = t;
            i = (i - 1) / 2;
        }
    }
    /* Place each input on the worker of its first consumer. */
    for (size_t k = 0; k < g->n_inputs; k++) {
        int w = c->graph_input_worker[g->index][k];
        if (w < 0)
            continue;
        Baton__V1__Put put = BATON__V1__PUT__INIT;
        put.request_key = r->key;
        put.put_id = r->key * 64 + k;
        put.value = (Baton__V1__Tensor *)by_input[k];
        /* An input read only on this worker need not wait for Placed: it
         * gets an id now, and the worker handles the Put before any
         * Dispatch that names it (one ZeroMQ pair keeps order).  A Put
         * that fails later ends the request then. */
        bool early = c->graph_input_local[g->index][k];
        if (early) {
            put.tensor_id = (UINT64_C(1) << 63) | ++c->next_put_tensor;
            const Baton__V1__Tensor *v = by_input[k];
            Baton__V1__TensorRef ref = BATON__V1__TENSOR_REF__INIT;
            ref.owner = (uint32_t)w;
            ref.id = put.tensor_id;
            ref.dtype = v->dtype;
            ref.n_dims = v->n_dims;
            ref.dims = v->dims;
            ref.nbytes = v->data.len;
            if (!disp_tensor_add(c, w, &ref)) {
                front_end_placing(c, r, BT_CODE_RESOURCE_EXHAUSTED, "out of memory");
                r = NULL;
                goto out;
            }
            r->inputs[k] = (rt_tensor){put.tensor_id, w};
        }
        Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_PUT;
        m.put = &put;
        if (c->workers[w].state != CW_READY || sup_send(c, w, &m) < 0) {
            front_end_placing(c, r, BT_CODE_UNAVAILABLE, "the worker for an input is down");
            r = NULL;
            goto out;
        }
        if (!early)
            r->puts_pending++;
    }
    if (r->puts_pending == 0)
        front_start_runtime(c, r);
out:
    free(by_input);
    free(caps);
}

char *front_inspect_text(conductor *c, const char *graph_name)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    if (graph_name && *graph_name && !graph_set_find(c->gs, graph_name))
        fprintf(f, "no graph named '%s'\n", graph_name);
    else
        graph_set_print(c->gs, f);
    /* What each worker's loads built: the executables' schedules (the
     * prediction and the decision DESIGN.md section 8 asks to show). */
    bool heading = false;
    for (size_t w = 0; w < c->n_workers; w++) {
        if (!c->workers[w].loads_text)
            continue;
        if (!heading)
            fputs("\nloaded models:\n", f);
        heading = true;
        fputs(c->workers[w].loads_text, f);
    }
    fclose(f);
    return text;
}

static void handle_message(conductor *c, const uint8_t *id, size_t idlen,
                           const Baton__V1__ClientMessage *cm)
{
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    switch (cm->msg_case) {
    case BATON__V1__CLIENT_MESSAGE__MSG_INFER:
        handle_infer(c, id, idlen, cm->infer);
        break;
    case BATON__V1__CLIENT_MESSAGE__MSG_CANCEL: {
        const char *rid = cm->cancel->request_id ? cm->cancel->request_id : "";
        creq *r = front_find(c, id, idlen, rid);
        if (!r)
            r = find_unique(c, rid);
        if (!r)
            break; /* unknown (or ambiguous across connections): ignored */
        if (r->phase == REQ_PLACING) {
            front_end_placing(c, r, BT_CODE_CANCELLED, "cancelled by the client");
        } else if (r->phase == REQ_RUNNING) {
            rt_cancel(c->rt, r->key);
            disp_actions(c);
        }
        break;
    }
    case BATON__V1__CLIENT_MESSAGE__MSG_HEALTH: {
        Baton__V1__HealthResponse h = BATON__V1__HEALTH_RESPONSE__INIT;
        char **names = calloc(c->n_workers + 1, sizeof(*names));
        char msg[512] = "";
        size_t off = 0;
        h.live = true;
        h.ready = c->ready && !c->draining;
        for (size_t w = 0; names && w < c->n_workers; w++) {
            if (c->workers[w].state == CW_READY)
                names[h.n_workers_ready++] = (char *)c->workers[w].cfg->name;
            else if (off < sizeof(msg))
                off += (size_t)snprintf(msg + off, sizeof(msg) - off, "%sworker %s is %s",
                                        off ? "; " : "", c->workers[w].cfg->name,
                                        c->workers[w].state == CW_DOWN ? "down"
                                        : c->workers[w].state == CW_STARTING ? "starting"
                                                                            : "loading");
        }
        if (c->draining)
            snprintf(msg, sizeof(msg), "draining: shutting down");
        h.workers_ready = names;
        h.message = msg;
        m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_HEALTH;
        m.health = &h;
        front_send(c, id, idlen, &m);
        free(names);
        break;
    }
    case BATON__V1__CLIENT_MESSAGE__MSG_STATS: {
        Baton__V1__StatsResponse s = BATON__V1__STATS_RESPONSE__INIT;
        char *text = metrics_text(c);
        s.text = text ? text : "";
        m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_STATS;
        m.stats = &s;
        front_send(c, id, idlen, &m);
        free(text);
        break;
    }
    case BATON__V1__CLIENT_MESSAGE__MSG_INSPECT: {
        Baton__V1__InspectResponse s = BATON__V1__INSPECT_RESPONSE__INIT;
        char *text = front_inspect_text(c, cm->inspect->graph);
        s.text = text ? text : "";
        m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_INSPECT;
        m.inspect = &s;
        front_send(c, id, idlen, &m);
        free(text);
        break;
    }
    default:
        front_reject(c, id, idlen, "", BT_CODE_INVALID_ARGUMENT,
                     "the ClientMessage has nothing set");
        break;
    }
}

void front_on_readable(evloop *l, void *arg)
{
    (void)l;
    conductor *c = arg;
    for (int budget = 0; budget < 256; budget++) {
        zmq_msg_t ident, part;
        zmq_msg_init(&ident);
        if (zmq_msg_recv(&ident, c->front, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ident);
            return;
        }
        /* The payload is the last frame; a client that sends several
         * (a REQ socket's empty delimiter, say) is read to the end. */
        zmq_msg_init(&part);
        int more = zmq_msg_more(&ident), frames = 0;
        while (more) {
            zmq_msg_close(&part);
            zmq_msg_init(&part);
            if (zmq_msg_recv(&part, c->front, 0) < 0)
                break;
            frames++;
            more = zmq_msg_more(&part);
        }
        const uint8_t *id = zmq_msg_data(&ident);
        size_t idlen = zmq_msg_size(&ident);
        size_t n = zmq_msg_size(&part);
        if (frames == 0) {
            front_reject(c, id, idlen, "", BT_CODE_INVALID_ARGUMENT, "empty message");
        } else if (n > c->max_message_bytes) {
            front_reject(c, id, idlen, "", BT_CODE_RESOURCE_EXHAUSTED,
                         "message of %zu bytes exceeds max_message_bytes (%llu)", n,
                         (unsigned long long)c->max_message_bytes);
        } else {
            Baton__V1__ClientMessage *cm =
                baton__v1__client_message__unpack(NULL, n, zmq_msg_data(&part));
            if (!cm)
                front_reject(c, id, idlen, "", BT_CODE_INVALID_ARGUMENT,
                             "the frame does not parse as a ClientMessage (%zu bytes)", n);
            else
                handle_message(c, id, idlen, cm);
            baton__v1__client_message__free_unpacked(cm, NULL);
        }
        zmq_msg_close(&part);
        zmq_msg_close(&ident);
    }
}
