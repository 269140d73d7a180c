/* Between the runtime and the workers: runtime actions become worker
 * messages (Dispatch, Extend, Drop, batched Release, Fetch) and client
 * messages (queued per request in order); worker results (Done, Chunk,
 * Placed, Fetched) become runtime events.  The tensor table keeps, per
 * (worker, id), what a Dispatch must name and the inline bytes of small
 * client-bound values. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "daemon/conductor.h"
#include "common/vec.h"

uint64_t cond_tensor_key(int worker, uint64_t id)
{
    /* Worker ids keep the top byte free (incarnation < 2^16 << 40). */
    uint64_t k = ((uint64_t)(uint32_t)worker << 56) ^ id;
    return k == 0 || k == UINT64_MAX ? 1 : k;
}

ctensor *disp_tensor_add(conductor *c, int sender, const Baton__V1__TensorRef *ref)
{
    /* A pass-through output (echo) names a tensor another worker owns: the
     * owner, not the sender, holds it and gets its Release. */
    if (ref->owner >= c->n_workers || ref->id == 0) {
        bt_warn("worker %s sent a tensor with owner %u, which is no worker",
                c->workers[sender].cfg->name, ref->owner);
        return NULL;
    }
    int worker = (int)ref->owner;
    uint64_t key = cond_tensor_key(worker, ref->id);
    ctensor *t = u64map_get(&c->tensors, key);
    if (t) {
        /* A pass-through output names a tensor we know already. */
        if (!t->data && ref->data.len) {
            t->data = malloc(ref->data.len);
            if (t->data) {
                memcpy(t->data, ref->data.data, ref->data.len);
                t->ndata = ref->data.len;
            }
        }
        return t;
    }
    t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->t = (rt_tensor){ref->id, worker};
    t->pool = ref->pool;
    t->offset = ref->offset;
    t->nbytes = ref->nbytes;
    t->dtype = ref->dtype;
    t->ndim = ref->n_dims > COND_MAX_DIMS ? COND_MAX_DIMS : (uint32_t)ref->n_dims;
    for (uint32_t d = 0; d < t->ndim; d++)
        t->dims[d] = ref->dims[d];
    if (ref->data.len) {
        t->data = malloc(ref->data.len);
        if (t->data) {
            memcpy(t->data, ref->data.data, ref->data.len);
            t->ndata = ref->data.len;
        }
    }
    if (u64map_put(&c->tensors, key, t) < 0) {
        free(t->data);
        free(t);
        return NULL;
    }
    return t;
}

static void release_later(conductor *c, rt_tensor t)
{
    ctensor *ct = u64map_del(&c->tensors, cond_tensor_key(t.worker, t.id));
    if (ct) {
        free(ct->data);
        free(ct);
    }
    if (t.worker < 0 || (size_t)t.worker >= c->n_workers || c->workers[t.worker].state == CW_DOWN)
        return;
    size_t w = (size_t)t.worker;
    if (c->n_release[w] == c->cap_release[w]) {
        size_t cap = c->cap_release[w] ? c->cap_release[w] * 2 : 64;
        uint64_t *ids = realloc(c->release_ids[w], cap * sizeof(*ids));
        if (!ids) {
            bt_error("out of memory: tensor %llu on worker %s not released",
                     (unsigned long long)t.id, c->workers[w].cfg->name);
            return;
        }
        c->release_ids[w] = ids;
        c->cap_release[w] = cap;
    }
    c->release_ids[w][c->n_release[w]++] = t.id;
}

void disp_flush_releases(conductor *c)
{
    for (size_t w = 0; w < c->n_workers; w++) {
        if (!c->n_release[w])
            continue;
        Baton__V1__Release rel = BATON__V1__RELEASE__INIT;
        rel.n_tensor_ids = c->n_release[w];
        rel.tensor_ids = c->release_ids[w];
        Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_RELEASE;
        m.release = &rel;
        if (c->workers[w].state != CW_DOWN)
            sup_send(c, (int)w, &m);
        c->n_release[w] = 0;
    }
}

void disp_release_input(conductor *c, rt_tensor t)
{
    release_later(c, t);
}

void disp_tensor_drop_worker(conductor *c, int worker)
{
    size_t pos = 0;
    uint64_t key;
    void *val;
    uint64_t *doomed = malloc((c->tensors.n + 1) * sizeof(*doomed));
    size_t n = 0;
    if (!doomed)
        return;
    while (u64map_next(&c->tensors, &pos, &key, &val))
        if (((ctensor *)val)->t.worker == worker)
            doomed[n++] = key;
    for (size_t i = 0; i < n; i++) {
        ctensor *t = u64map_del(&c->tensors, doomed[i]);
        free(t->data);
        free(t);
    }
    free(doomed);
    c->n_release[worker] = 0;
}

/* ---- runtime actions --------------------------------------------------- */

static void fill_ref(const ctensor *t, Baton__V1__TensorRef *r)
{
    baton__v1__tensor_ref__init(r);
    r->owner = (uint32_t)t->t.worker;
    r->pool = t->pool;
    r->offset = t->offset;
    r->nbytes = t->nbytes;
    r->dtype = t->dtype;
    r->n_dims = t->ndim;
    r->dims = (int64_t *)t->dims;
    r->id = t->t.id;
}

static void send_dispatch(conductor *c, const rt_action *a)
{
    creq *r = u64map_get(&c->requests, a->req);
    const graph *g = &c->gs->graphs[a->graph];
    const graph_entity *en = &g->entities[a->u.dispatch.node];
    const graph_node *n = &en->u.node;
    int w = n->worker;
    size_t n_refs = 0;
    for (uint32_t k = 0; k < a->u.dispatch.n_inputs; k++)
        for (uint32_t p = 0; p < a->u.dispatch.inputs[k].n_parts; p++)
            n_refs += a->u.dispatch.inputs[k].parts[p].n;
    Baton__V1__InputValue *ins = calloc(n->n_inputs + 1, sizeof(*ins));
    Baton__V1__InputValue **insp = calloc(n->n_inputs + 1, sizeof(*insp));
    Baton__V1__TensorPart *parts = calloc(n_refs + n->n_inputs * 4 + 1, sizeof(*parts));
    Baton__V1__TensorPart **partp = calloc(n_refs + n->n_inputs * 4 + 1, sizeof(*partp));
    Baton__V1__TensorRef *refs = calloc(n_refs + 1, sizeof(*refs));
    Baton__V1__TensorRef **refp = calloc(n_refs + 1, sizeof(*refp));
    Baton__V1__OutputSpec *outs = calloc(en->n_values + 1, sizeof(*outs));
    Baton__V1__OutputSpec **outp = calloc(en->n_values + 1, sizeof(*outp));
    Baton__V1__LoopBack *lbs = calloc(n->n_inputs + 1, sizeof(*lbs));
    Baton__V1__LoopBack **lbp = calloc(n->n_inputs + 1, sizeof(*lbp));
    uint32_t iter[GRAPH_MAX_DEPTH];
    const char *fail = NULL;
    if (!ins || !insp || !parts || !partp || !refs || !refp || !outs || !outp || !lbs || !lbp) {
        fail = "out of memory building a dispatch";
        goto out;
    }
    size_t pi = 0, ri = 0;
    for (uint32_t k = 0; k < a->u.dispatch.n_inputs; k++) {
        const rt_input *in = &a->u.dispatch.inputs[k];
        Baton__V1__InputValue *iv = &ins[k];
        baton__v1__input_value__init(iv);
        iv->name = (char *)n->inputs[in->input].name;
        iv->shard_dim = in->shard_dim;
        iv->stream = in->stream;
        iv->final = in->stream ? in->stream_final : true;
        iv->parts = &partp[pi];
        for (uint32_t p = 0; p < in->n_parts; p++) {
            Baton__V1__TensorPart *tp = &parts[pi];
            baton__v1__tensor_part__init(tp);
            tp->chunks = &refp[ri];
            for (uint32_t x = 0; x < in->parts[p].n; x++) {
                rt_tensor t = in->parts[p].t[x];
                ctensor *ct = u64map_get(&c->tensors, cond_tensor_key(t.worker, t.id));
                if (!ct) {
                    fail = "a dispatch names a tensor the conductor does not know";
                    goto out;
                }
                fill_ref(ct, &refs[ri]);
                refp[ri] = &refs[ri];
                ri++;
                tp->n_chunks++;
                tp->transfer = ct->t.worker == w ? BATON__V1__TRANSFER_KIND__TRANSFER_KIND_LOCAL
                                                 : BATON__V1__TRANSFER_KIND__TRANSFER_KIND_IPC;
            }
            partp[pi] = tp;
            pi++;
            iv->n_parts++;
        }
        insp[k] = iv;
    }
    const uint8_t *client = a->u.dispatch.client_values;
    for (size_t k = 0; k < en->n_values; k++) {
        const graph_value *v = &g->values[en->values[k]];
        baton__v1__output_spec__init(&outs[k]);
        outs[k].name = (char *)v->name;
        outs[k].client = client && client[en->values[k]];
        for (size_t e = 0; e < v->n_edges; e++)
            outs[k].stream |= g->edges[v->edges[e]].stream;
        outp[k] = &outs[k];
    }
    /* A node that runs ahead feeds its own loop-back outputs to itself. */
    size_t n_lb = 0;
    if (a->u.dispatch.spec_upto)
        for (size_t k = 0; k < n->n_inputs; k++)
            for (size_t x = 0; x < n->inputs[k].n_edges; x++) {
                const graph_edge *e = &g->edges[n->inputs[k].edges[x]];
                if (e->loopback && e->producer == a->u.dispatch.node) {
                    baton__v1__loop_back__init(&lbs[n_lb]);
                    lbs[n_lb].output = (char *)g->values[e->value].name;
                    lbs[n_lb].input = (char *)n->inputs[k].name;
                    lbp[n_lb] = &lbs[n_lb];
                    n_lb++;
                }
            }
    for (uint32_t k = 0; k < a->u.dispatch.iter.depth; k++)
        iter[k] = a->u.dispatch.iter.v[k];
    Baton__V1__Sampling samp = BATON__V1__SAMPLING__INIT;
    Baton__V1__Dispatch d = BATON__V1__DISPATCH__INIT;
    d.request_key = a->req;
    d.request_id = r ? r->request_id : "";
    d.graph = (uint32_t)a->graph;
    d.node = (uint32_t)a->u.dispatch.node;
    d.node_name = (char *)en->name;
    d.model = (char *)n->model;
    d.mode = (char *)n->mode;
    d.n_iteration = a->u.dispatch.iter.depth;
    d.iteration = iter;
    d.n_inputs = a->u.dispatch.n_inputs;
    d.inputs = insp;
    d.n_outputs = en->n_values;
    d.outputs = outp;
    d.speculate_upto = a->u.dispatch.spec_upto;
    if (r) {
        samp.temperature = r->temperature;
        samp.top_k = r->top_k;
        samp.top_p = r->top_p;
        samp.seed = r->seed;
        uint64_t now = cond_now_ms();
        d.remaining_ms = r->deadline_ms > now ? (uint32_t)(r->deadline_ms - now) : 1;
    }
    d.sampling = &samp;
    d.dispatch_id = ++c->next_dispatch;
    d.n_loop_back = n_lb;
    d.loop_back = lbp;
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_DISPATCH;
    m.dispatch = &d;
    if (w < 0 || c->workers[w].state != CW_READY || sup_send(c, w, &m) < 0)
        fail = "its worker is not available";
out:
    if (fail) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s (worker %s)", fail,
                 w >= 0 ? c->cfg->workers[w].name : "?");
        rt_node_failed(c->rt, a->req, a->u.dispatch.node, &a->u.dispatch.iter,
                       BT_CODE_UNAVAILABLE, msg);
    }
    free(ins);
    free(insp);
    free(parts);
    free(partp);
    free(refs);
    free(refp);
    free(outs);
    free(outp);
    free(lbs);
    free(lbp);
}

/* Extends wait here until the burst of worker messages that caused them is
 * read: a worker that ran ahead reports several iterations at once, and one
 * Extend to the furthest of them unblocks it as well as one per iteration. */
static void extend_later(conductor *c, const rt_action *a)
{
    for (size_t i = 0; i < c->n_extends; i++) {
        pending_extend *p = &c->extends[i];
        if (p->req == a->req && p->node == a->u.extend.node) {
            if (a->u.extend.upto > p->upto)
                p->upto = a->u.extend.upto;
            return;
        }
    }
    if (BT_RESERVE(c->extends, c->n_extends, c->cap_extends, 16) < 0)
        return; /* the worker waits for the next one: slower, not wrong */
    c->extends[c->n_extends++] = (pending_extend){a->req, a->graph, a->u.extend.node,
                                                  a->u.extend.upto};
}

/* Forgets the pending Extend of (req, node): a Drop or a new Dispatch
 * supersedes it, and an Extend after a Drop would reopen a closed window. */
static void extend_forget(conductor *c, uint64_t req, int node)
{
    for (size_t i = 0; i < c->n_extends; i++)
        if (c->extends[i].req == req && (node < 0 || c->extends[i].node == node))
            c->extends[i--] = c->extends[--c->n_extends];
}

void disp_flush_extends(conductor *c)
{
    for (size_t i = 0; i < c->n_extends; i++) {
        const pending_extend *p = &c->extends[i];
        if (!u64map_get(&c->requests, p->req))
            continue;
        int w = c->gs->graphs[p->graph].entities[p->node].u.node.worker;
        Baton__V1__Extend ex = BATON__V1__EXTEND__INIT;
        ex.request_key = p->req;
        ex.graph = (uint32_t)p->graph;
        ex.node = (uint32_t)p->node;
        ex.upto = p->upto;
        Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_EXTEND;
        m.extend = &ex;
        if (w >= 0 && c->workers[w].state == CW_READY)
            sup_send(c, w, &m);
    }
    c->n_extends = 0;
}

static void send_window(conductor *c, const rt_action *a)
{
    const graph *g = &c->gs->graphs[a->graph];
    int node = a->kind == RT_EXTEND ? a->u.extend.node : a->u.drop.node;
    int w = g->entities[node].u.node.worker;
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    Baton__V1__Extend ex = BATON__V1__EXTEND__INIT;
    Baton__V1__Drop dr = BATON__V1__DROP__INIT;
    uint32_t from[GRAPH_MAX_DEPTH];
    if (a->kind == RT_EXTEND) {
        ex.request_key = a->req;
        ex.graph = (uint32_t)a->graph;
        ex.node = (uint32_t)node;
        ex.upto = a->u.extend.upto;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_EXTEND;
        m.extend = &ex;
    } else {
        dr.request_key = a->req;
        dr.graph = (uint32_t)a->graph;
        dr.node = (uint32_t)node;
        for (uint32_t k = 0; k < a->u.drop.from.depth; k++)
            from[k] = a->u.drop.from.v[k];
        dr.n_from_iteration = a->u.drop.from.depth;
        dr.from_iteration = from;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_DROP;
        m.drop = &dr;
    }
    if (w >= 0 && c->workers[w].state == CW_READY)
        sup_send(c, w, &m);
}

/* Captures a client-bound tensor's bytes now, or asks its worker for them. */
static void capture(conductor *c, creq *r, rt_tensor t, obytes *o)
{
    memset(o, 0, sizeof(*o));
    o->tkey = cond_tensor_key(t.worker, t.id);
    o->worker = t.worker;
    o->id = t.id;
    ctensor *ct = u64map_get(&c->tensors, o->tkey);
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
    if (c->workers[t.worker].state == CW_DOWN || sup_send(c, t.worker, &m) < 0) {
        o->ready = true;
        return;
    }
    r->fetches_pending++;
}

static outmsg *outq_push(creq *r)
{
    if (BT_RESERVE(r->outq, r->n_outq, r->cap_outq, 8) < 0)
        return NULL;
    outmsg *o = &r->outq[r->n_outq++];
    memset(o, 0, sizeof(*o));
    return o;
}

static void queue_chunk(conductor *c, creq *r, const rt_action *a)
{
    outmsg *o = outq_push(r);
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
        capture(c, r, a->u.chunk.tensor, &o->bytes[0]);
    }
}

static void queue_response(conductor *c, creq *r, const rt_action *a)
{
    outmsg *o = outq_push(r);
    if (!o)
        return;
    o->response = true;
    o->code = a->u.response.code;
    o->message = strdup(a->u.response.message ? a->u.response.message : "");
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
            capture(c, r, out->value.t[k], &o->bytes[o->n_bytes++]);
    }
    o->n_outs = n;
    r->phase = REQ_FLUSHING;
}

/* The request's sessions (KV caches) and queued work go on every worker its
 * graph uses.  Sent after the response: the client need not wait for it. */
static void close_sessions(conductor *c, uint64_t key, int gi)
{
    const graph *g = &c->gs->graphs[gi];
    for (size_t w = 0; w < c->n_workers; w++) {
        bool used = false;
        for (size_t i = 0; i < g->n_entities && !used; i++)
            used = g->entities[i].kind == GRAPH_NODE && g->entities[i].u.node.worker == (int)w;
        if (!used || c->workers[w].state == CW_DOWN)
            continue;
        Baton__V1__SessionClose sc = BATON__V1__SESSION_CLOSE__INIT;
        sc.request_key = key;
        Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_SESSION_CLOSE;
        m.session_close = &sc;
        sup_send(c, (int)w, &m);
    }
}

void disp_actions(conductor *c)
{
    /* Requests whose outbound queue grew; flushed once at the end.  Ended
     * ones have their sessions closed after their response went out. */
    uint64_t touched[64];
    size_t n_touched = 0;
    bool overflow = false;
    uint64_t ended[64];
    int ended_graph[64];
    size_t n_ended = 0;
    for (size_t i = 0;; i++) {
        size_t n;
        const rt_action *as = rt_actions(c->rt, &n);
        if (i >= n)
            break;
        /* Handling an action may add actions (a failed send): copy it, the
         * array may move; its payload stays in the arena until the clear. */
        rt_action a = as[i];
        creq *r = a.req ? u64map_get(&c->requests, a.req) : NULL;
        switch (a.kind) {
        case RT_DISPATCH:
            extend_forget(c, a.req, a.u.dispatch.node);
            send_dispatch(c, &a);
            break;
        case RT_EXTEND:
            extend_later(c, &a);
            break;
        case RT_DROP:
            extend_forget(c, a.req, a.u.drop.node);
            send_window(c, &a);
            break;
        case RT_RELEASE:
            release_later(c, a.u.release);
            break;
        case RT_CHUNK:
        case RT_RESPONSE:
            if (!r)
                break;
            if (a.kind == RT_CHUNK) {
                queue_chunk(c, r, &a);
            } else {
                queue_response(c, r, &a);
                extend_forget(c, a.req, -1);
                if (n_ended < 64) {
                    ended[n_ended] = r->key;
                    ended_graph[n_ended++] = r->graph;
                } else {
                    close_sessions(c, r->key, r->graph);
                }
            }
            bool seen = false;
            for (size_t k = 0; k < n_touched; k++)
                seen |= touched[k] == r->key;
            if (!seen && n_touched < 64)
                touched[n_touched++] = r->key;
            else if (!seen)
                overflow = true;
            break;
        }
    }
    rt_actions_clear(c->rt);
    /* Responses first: the Fetches they wait on are already out, ahead of
     * any Release or SessionClose of the same tensors. */
    for (size_t k = 0; k < n_touched; k++) {
        creq *r = u64map_get(&c->requests, touched[k]);
        if (r)
            front_flush(c, r);
    }
    for (size_t k = 0; k < n_ended; k++)
        close_sessions(c, ended[k], ended_graph[k]);
    /* Inside a burst of worker messages the releases wait for its end: one
     * Release per worker per burst. */
    if (!c->in_burst)
        disp_flush_releases(c);
    if (overflow) {
        size_t pos = 0;
        uint64_t key;
        void *val;
        uint64_t *keys = malloc((c->requests.n + 1) * sizeof(*keys));
        size_t nk = 0;
        while (keys && u64map_next(&c->requests, &pos, &key, &val))
            keys[nk++] = key;
        for (size_t k = 0; k < nk; k++) {
            creq *r = u64map_get(&c->requests, keys[k]);
            if (r && r->n_outq)
                front_flush(c, r);
        }
        free(keys);
    }
}

/* ---- worker results ---------------------------------------------------- */

static int value_of(const graph *g, int node, const char *name)
{
    const graph_entity *en = &g->entities[node];
    for (size_t k = 0; k < en->n_values; k++)
        if (strcmp(g->values[en->values[k]].name, name) == 0)
            return en->values[k];
    return -1;
}

static bool read_iter(const uint32_t *v, size_t n, rt_iter *it)
{
    if (n > GRAPH_MAX_DEPTH)
        return false;
    it->depth = (uint32_t)n;
    for (size_t k = 0; k < n; k++)
        it->v[k] = v[k];
    return true;
}

void disp_done(conductor *c, int worker, const Baton__V1__Done *d)
{
    creq *r = u64map_get(&c->requests, d->request_key);
    rt_iter it;
    bool ok = d->graph < c->gs->n_graphs && read_iter(d->iteration, d->n_iteration, &it);
    const graph *g = ok ? &c->gs->graphs[d->graph] : NULL;
    ok = ok && d->node < g->n_entities && g->entities[d->node].kind == GRAPH_NODE;
    rt_value_out stack[32];
    rt_value_out *outs = d->n_outputs <= 32 ? stack : malloc(d->n_outputs * sizeof(*outs));
    size_t n = 0;
    if (!outs) {
        bt_error("out of memory taking a Done of %zu outputs", d->n_outputs);
        return;
    }
    for (size_t i = 0; i < d->n_outputs; i++) {
        const Baton__V1__NamedRef *nr = d->outputs[i];
        if (!nr->ref || !disp_tensor_add(c, worker, nr->ref))
            continue;
        outs[n].tensor = (rt_tensor){nr->ref->id, (int32_t)nr->ref->owner};
        outs[n].value = ok ? value_of(g, (int)d->node, nr->name ? nr->name : "") : -1;
        n++;
    }
    if (!ok) {
        bt_warn("worker %s sent a Done for an unknown node; its tensors are released",
                c->workers[worker].cfg->name);
        for (size_t i = 0; i < n; i++)
            release_later(c, outs[i].tensor);
        disp_flush_releases(c);
        if (outs != stack)
            free(outs);
        return;
    }
    if (r && r->n_timings < 100000) {
        if (BT_RESERVE(r->timings, r->n_timings, r->cap_timings, 16) == 0)
            r->timings[r->n_timings++] = (ctiming){(int)d->node,
                                                   it.depth ? it.v[it.depth - 1] : 0, worker,
                                                   d->queue_us, d->exec_us};
    }
    metrics_node_done(c->m, (int)d->graph, (int)d->node, d->queue_us, d->exec_us);
    if (d->status && d->status->code != BATON__V1__CODE__OK) {
        for (size_t i = 0; i < n; i++)
            release_later(c, outs[i].tensor);
        rt_node_failed(c->rt, d->request_key, (int)d->node, &it, (bt_code)d->status->code,
                       d->status->message ? d->status->message : "");
    } else {
        rt_node_done(c->rt, d->request_key, (int)d->node, &it, outs, n, d->finish);
    }
    if (outs != stack)
        free(outs);
    disp_actions(c);
}

void disp_chunk(conductor *c, int worker, const Baton__V1__Chunk *k)
{
    rt_iter it;
    rt_tensor t = {0, 0};
    if (k->ref && disp_tensor_add(c, worker, k->ref))
        t = (rt_tensor){k->ref->id, (int32_t)k->ref->owner};
    if (k->graph >= c->gs->n_graphs || !read_iter(k->iteration, k->n_iteration, &it) ||
        k->node >= c->gs->graphs[k->graph].n_entities) {
        if (t.id)
            release_later(c, t);
        disp_flush_releases(c);
        return;
    }
    int v = value_of(&c->gs->graphs[k->graph], (int)k->node, k->name ? k->name : "");
    rt_chunk(c->rt, k->request_key, (int)k->node, &it, v, t, k->final);
    disp_actions(c);
}

void disp_placed(conductor *c, int worker, const Baton__V1__Placed *p)
{
    creq *r = u64map_get(&c->requests, p->request_key);
    bool ok = !p->status || p->status->code == BATON__V1__CODE__OK;
    size_t k = (size_t)(p->put_id % 64);
    /* An early put (its id chosen by the conductor, the request already
     * running): the runtime owns the tensor; only a failure matters. */
    bool early = r && r->graph >= 0 && c->graph_input_local[r->graph][k] &&
                 r->inputs[k].id >> 63;
    if (!r && p->ref && p->ref->id >> 63)
        return; /* ended already; the runtime released it */
    if (early) {
        if (ok && p->ref) {
            ctensor *ct = u64map_get(&c->tensors, cond_tensor_key(worker, p->ref->id));
            if (ct) {
                ct->pool = p->ref->pool;
                ct->offset = p->ref->offset;
            }
        } else if (!ok) {
            const char *msg = p->status->message ? p->status->message : "placing failed";
            if (r->phase == REQ_PLACING) {
                r->inputs[k] = (rt_tensor){0, 0};
                front_end_placing(c, r, (bt_code)p->status->code, msg);
            } else if (r->phase == REQ_RUNNING) {
                rt_abort(c->rt, r->key, (bt_code)p->status->code, msg);
                disp_actions(c);
            }
        }
        return;
    }
    rt_tensor t = {0, 0};
    if (ok && p->ref && disp_tensor_add(c, worker, p->ref))
        t = (rt_tensor){p->ref->id, (int32_t)p->ref->owner};
    if (!r || r->phase != REQ_PLACING) {
        if (t.id) {
            release_later(c, t);
            disp_flush_releases(c);
        }
        return;
    }
    r->puts_pending--;
    if (!ok || !t.id) {
        front_end_placing(c, r, ok ? BT_CODE_INTERNAL : (bt_code)p->status->code,
                          ok ? "an input could not be placed"
                             : (p->status->message ? p->status->message : "placing failed"));
        return;
    }
    r->inputs[k] = t;
    if (r->puts_pending == 0)
        front_start_runtime(c, r);
}

void disp_fetched(conductor *c, int worker, const Baton__V1__Fetched *f)
{
    uint64_t key = cond_tensor_key(worker, f->tensor_id);
    size_t pos = 0;
    uint64_t rk;
    void *val;
    /* Few requests wait for bytes at once; find the ones that do. */
    uint64_t waiting[64];
    size_t nw = 0;
    while (nw < 64 && u64map_next(&c->requests, &pos, &rk, &val)) {
        creq *r = val;
        if (!r->fetches_pending)
            continue;
        bool hit = false;
        for (size_t i = 0; i < r->n_outq; i++)
            for (size_t b = 0; b < r->outq[i].n_bytes; b++) {
                obytes *o = &r->outq[i].bytes[b];
                if (o->ready || o->tkey != key)
                    continue;
                o->data = malloc(f->data.len ? f->data.len : 1);
                if (o->data && f->data.len)
                    memcpy(o->data, f->data.data, f->data.len);
                o->ndata = o->data ? f->data.len : 0;
                o->ready = true;
                r->fetches_pending--;
                hit = true;
            }
        if (hit)
            waiting[nw++] = rk;
    }
    for (size_t i = 0; i < nw; i++) {
        creq *r = u64map_get(&c->requests, waiting[i]);
        if (r)
            front_flush(c, r);
    }
}

void disp_fetches_lost(conductor *c, int worker)
{
    size_t pos = 0;
    uint64_t rk;
    void *val;
    uint64_t *keys = malloc((c->requests.n + 1) * sizeof(*keys));
    size_t nk = 0;
    if (!keys)
        return;
    while (u64map_next(&c->requests, &pos, &rk, &val)) {
        creq *r = val;
        bool hit = false;
        for (size_t i = 0; i < r->n_outq; i++)
            for (size_t b = 0; b < r->outq[i].n_bytes; b++) {
                obytes *o = &r->outq[i].bytes[b];
                if (!o->ready && o->worker == worker) {
                    /* The bytes died with the worker; the message goes out
                     * with an empty value rather than never. */
                    o->ready = true;
                    o->ndata = 0;
                    if (r->outq[i].response && r->outq[i].code == BT_CODE_OK) {
                        r->outq[i].code = BT_CODE_UNAVAILABLE;
                        free(r->outq[i].message);
                        r->outq[i].message = strdup("a worker holding an output was lost");
                    }
                    r->fetches_pending--;
                    hit = true;
                }
            }
        if (hit)
            keys[nk++] = rk;
    }
    for (size_t i = 0; i < nk; i++) {
        creq *r = u64map_get(&c->requests, keys[i]);
        if (r)
            front_flush(c, r);
    }
    free(keys);
}
