/* The runtime's outer layer: requests, tensor reference counts, the action
 * queue and the event entry points.  The graph semantics (slots, readiness,
 * loops, speculation) are in registry.c. */
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/runtime_internal.h"
#include "common/vec.h"

/* ---- action queue and its arena ---------------------------------------- */

void *rt__alloc(rt_runtime *rt, size_t size)
{
    size = (size + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1);
    if (size == 0)
        size = sizeof(max_align_t);
    arena_block *b = rt->arena;
    if (!b || b->cap - b->used < size) {
        size_t cap = size > 65536 ? size : 65536;
        arena_block *nb = malloc(sizeof(*nb) + cap);
        if (!nb) {
            rt->oom = 1;
            return NULL;
        }
        nb->next = b;
        nb->used = 0;
        nb->cap = cap;
        rt->arena = b = nb;
    }
    void *p = (char *)b->data + b->used;
    b->used += size;
    return p;
}

rt_action *rt__push(rt_runtime *rt, rt_action_kind kind, const rt_request *r)
{
    if (BT_RESERVE(rt->actions, rt->n_actions, rt->cap_actions, 64) < 0) {
        rt->oom = 1;
        return NULL;
    }
    rt_action *a = &rt->actions[rt->n_actions++];
    memset(a, 0, sizeof(*a));
    a->kind = kind;
    a->req = r ? r->key : 0;
    a->graph = r ? r->graph_index : -1;
    return a;
}

const rt_action *rt_actions(const rt_runtime *rt, size_t *n)
{
    *n = rt->n_actions;
    return rt->actions;
}

void rt_actions_clear(rt_runtime *rt)
{
    rt->n_actions = 0;
    /* Keep one block for reuse: most batches fit in it. */
    arena_block *b = rt->arena;
    if (!b)
        return;
    arena_block *rest = b->next;
    b->next = NULL;
    b->used = 0;
    while (rest) {
        arena_block *nx = rest->next;
        free(rest);
        rest = nx;
    }
}

/* ---- tensors ----------------------------------------------------------- */

static uint64_t tkey(rt_tensor t)
{
    uint64_t x = t.id ^ ((uint64_t)(uint32_t)t.worker * 0x9e3779b97f4a7c15ULL);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    return x ^ (x >> 29);
}

static tref *tref_find(rt_request *r, rt_tensor t, bool create, rt_runtime *rt)
{
    if (create && (r->n_tensors + 1) * 4 > r->cap_tensors * 3) {
        uint32_t cap = r->cap_tensors ? r->cap_tensors * 2 : 32;
        tref *nt = calloc(cap, sizeof(*nt));
        if (!nt) {
            rt->oom = 1;
            return NULL;
        }
        for (uint32_t i = 0; i < r->cap_tensors; i++) {
            if (!r->tensors[i].used)
                continue;
            uint32_t j = (uint32_t)tkey(r->tensors[i].t) & (cap - 1);
            while (nt[j].used)
                j = (j + 1) & (cap - 1);
            nt[j] = r->tensors[i];
        }
        free(r->tensors);
        r->tensors = nt;
        r->cap_tensors = cap;
    }
    if (!r->cap_tensors)
        return NULL;
    uint32_t j = (uint32_t)tkey(t) & (r->cap_tensors - 1);
    while (r->tensors[j].used) {
        if (r->tensors[j].t.id == t.id && r->tensors[j].t.worker == t.worker)
            return &r->tensors[j];
        j = (j + 1) & (r->cap_tensors - 1);
    }
    if (!create)
        return NULL;
    r->tensors[j].used = 1;
    r->tensors[j].t = t;
    r->tensors[j].refs = 0;
    r->n_tensors++;
    return &r->tensors[j];
}

static void emit_release(rt_runtime *rt, const rt_request *r, rt_tensor t)
{
    if (t.worker == rt->lost_worker)
        return; /* its pool died with it */
    rt_action *a = rt__push(rt, RT_RELEASE, r);
    if (a)
        a->u.release = t;
}

void rt__ref(rt_runtime *rt, rt_request *r, rt_tensor t)
{
    /* An ended request has released everything; nothing may hold again. */
    if (!t.id || r->ended)
        return;
    tref *e = tref_find(r, t, true, rt);
    if (!e)
        return;
    if (e->refs++ == 0)
        rt->held++;
}

void rt__unref(rt_runtime *rt, rt_request *r, rt_tensor t)
{
    if (!t.id || r->ended)
        return;
    tref *e = tref_find(r, t, false, rt);
    /* Only an allocation that failed in rt__ref (rt->oom, after which the
     * event ends every request) leaves an unref without its ref. */
    assert((e && e->refs > 0) || rt->oom);
    if (!e || e->refs == 0)
        return;
    if (--e->refs == 0) {
        rt->held--;
        emit_release(rt, r, t);
    }
}

int tvec_push(rt_runtime *rt, rt_request *r, tvec *v, rt_tensor t)
{
    if (v->n == v->cap) {
        uint32_t cap = v->cap ? v->cap * 2 : 2;
        rt_tensor *nt = realloc(v->t, cap * sizeof(*nt));
        if (!nt) {
            rt->oom = 1;
            return BT_ENOMEM;
        }
        v->t = nt;
        v->cap = cap;
    }
    v->t[v->n++] = t;
    rt__ref(rt, r, t);
    return 0;
}

void tvec_clear(rt_runtime *rt, rt_request *r, tvec *v)
{
    for (uint32_t i = 0; i < v->n; i++)
        rt__unref(rt, r, v->t[i]);
    free(v->t);
    v->t = NULL;
    v->n = v->cap = 0;
}

/* Releases, outside any request, tensors of an event nobody expects. */
static void release_stray(rt_runtime *rt, uint64_t req, int gi, const rt_tensor *ts, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!ts[i].id || ts[i].worker == rt->lost_worker)
            continue;
        rt_action *a = rt__push(rt, RT_RELEASE, NULL);
        if (!a)
            return;
        a->req = req;
        a->graph = gi;
        a->u.release = ts[i];
    }
}

static void bury(rt_runtime *rt);
static void after_event(rt_runtime *rt);

/* ---- create / destroy -------------------------------------------------- */

static int extra_build(rt_runtime *rt)
{
    const graph_set *gs = rt->gs;
    size_t nw = gs->cfg->n_workers;
    rt->gx = calloc(gs->n_graphs ? gs->n_graphs : 1, sizeof(*rt->gx));
    if (!rt->gx)
        return BT_ENOMEM;
    for (size_t gi = 0; gi < gs->n_graphs; gi++) {
        const graph *g = &gs->graphs[gi];
        graph_extra *x = &rt->gx[gi];
        x->client_values = calloc(g->n_values + 1, 1);
        x->joins = calloc(g->n_values + 1, 1);
        x->uses_worker = calloc(nw + 1, 1);
        x->edge_pos = calloc(g->n_edges + 1, sizeof(uint32_t));
        x->n_edge_slots = calloc(g->n_entities + 1, sizeof(uint32_t));
        if (!x->client_values || !x->joins || !x->uses_worker || !x->edge_pos ||
            !x->n_edge_slots)
            return BT_ENOMEM;
        for (size_t e = 0; e < g->n_edges; e++) {
            const graph_edge *ge = &g->edges[e];
            if (ge->consumer < 0)
                x->client_values[ge->value] = 1;
            if (ge->consumer >= 0 ? !ge->stream : !ge->new_token)
                x->joins[ge->value] = 1;
        }
        for (size_t v = 0; v < g->n_values; v++)
            for (size_t k = 0; k < g->values[v].n_loop_uses; k++)
                if (g->values[g->values[v].loop_uses[k]].role == GRAPH_VALUE_LOOP_LAST)
                    x->joins[v] = 1;
        for (size_t w = 0; w < nw; w++)
            for (size_t k = 0; k < gs->n_worker_nodes[w]; k++)
                if ((size_t)(gs->worker_nodes[w][k] >> 16) == gi)
                    x->uses_worker[w] = 1;
        for (size_t i = 0; i < g->n_entities; i++) {
            if (g->entities[i].kind != GRAPH_NODE)
                continue;
            const graph_node *n = &g->entities[i].u.node;
            uint32_t total = 0;
            for (size_t k = 0; k < n->n_inputs; k++)
                for (size_t e = 0; e < n->inputs[k].n_edges; e++)
                    x->edge_pos[n->inputs[k].edges[e]] = total++;
            x->n_edge_slots[i] = total;
        }
    }
    return 0;
}

rt_runtime *rt_create(const graph_set *gs, const rt_options *opt)
{
    rt_runtime *rt = calloc(1, sizeof(*rt));
    if (!rt)
        return NULL;
    rt->gs = gs;
    if (opt)
        rt->opt = *opt;
    rt->lost_worker = -1;
    u64map_init(&rt->requests);
    if (extra_build(rt) < 0) {
        rt_destroy(rt);
        return NULL;
    }
    return rt;
}

void rt_destroy(rt_runtime *rt)
{
    if (!rt)
        return;
    size_t pos = 0;
    uint64_t key;
    void *val;
    while (u64map_next(&rt->requests, &pos, &key, &val))
        reg_request_free(rt, val);
    u64map_free(&rt->requests);
    bury(rt);
    free(rt->dead);
    if (rt->gx)
        for (size_t gi = 0; gi < rt->gs->n_graphs; gi++) {
            free(rt->gx[gi].client_values);
            free(rt->gx[gi].joins);
            free(rt->gx[gi].uses_worker);
            free(rt->gx[gi].edge_pos);
            free(rt->gx[gi].n_edge_slots);
        }
    free(rt->gx);
    rt_actions_clear(rt);
    free(rt->arena);
    free(rt->actions);
    free(rt->replay);
    free(rt);
}

/* ---- requests ---------------------------------------------------------- */

bool rt__iter_eq(const rt_iter *a, const rt_iter *b)
{
    if (a->depth != b->depth)
        return false;
    for (uint32_t k = 0; k < a->depth; k++)
        if (a->v[k] != b->v[k])
            return false;
    return true;
}

void rt__replay_push(rt_runtime *rt, const rt_request *r, int node, const rt_iter *it)
{
    if (BT_RESERVE(rt->replay, rt->n_replay, rt->cap_replay, 16) < 0) {
        rt->oom = 1;
        return;
    }
    rt->replay[rt->n_replay++] = (replay_item){r->key, node, *it};
}

/* Runs postponed replays until none is left; each may queue more. */
static void drain(rt_runtime *rt)
{
    for (size_t i = 0; i < rt->n_replay; i++) {
        replay_item it = rt->replay[i];
        rt_request *r = u64map_get(&rt->requests, it.req);
        if (r && !r->ended)
            reg_replay(rt, r, it.node, &it.iter);
    }
    rt->n_replay = 0;
}

/* Ends a request: one RESPONSE, DROPs for speculating nodes, a RELEASE for
 * every tensor it still holds, and the request is forgotten. */
void rt__end(rt_runtime *rt, rt_request *r, bt_code code, const char *fmt, ...)
{
    if (r->ended)
        return;
    r->ended = true;
    rt_action *a = rt__push(rt, RT_RESPONSE, r);
    if (a) {
        a->u.response.code = code;
        char *msg = NULL;
        va_list ap;
        va_start(ap, fmt);
        if (vasprintf(&msg, fmt, ap) < 0)
            msg = NULL;
        va_end(ap);
        size_t len = msg ? strlen(msg) : 0;
        a->u.response.message = rt__alloc(rt, len + 1);
        if (a->u.response.message) {
            memcpy(a->u.response.message, msg ? msg : "", len);
            a->u.response.message[len] = 0;
        }
        free(msg);
        /* Outputs only on success: a failed request's partial values would
         * mislead more than help. */
        if (code == BT_CODE_OK && r->n_outs) {
            rt_output *o = rt__alloc(rt, r->n_outs * sizeof(*o));
            if (o) {
                for (uint32_t i = 0; i < r->n_outs; i++) {
                    o[i].name = r->outs[i].name;
                    o[i].modality = r->outs[i].modality;
                    o[i].value.n = r->outs[i].parts.n;
                    o[i].value.t = rt__alloc(rt, (r->outs[i].parts.n + 1) * sizeof(rt_tensor));
                    if (o[i].value.t && r->outs[i].parts.n)
                        memcpy(o[i].value.t, r->outs[i].parts.t,
                               r->outs[i].parts.n * sizeof(rt_tensor));
                    else
                        o[i].value.n = 0;
                }
                a->u.response.outputs = o;
                a->u.response.n_outputs = r->n_outs;
            }
        }
    }
    reg_drop_speculation(rt, r);
    /* Every tensor still referenced goes back now, whatever holds it. */
    for (uint32_t i = 0; i < r->cap_tensors; i++) {
        tref *e = &r->tensors[i];
        if (e->used && e->refs) {
            e->refs = 0;
            rt->held--;
            emit_release(rt, r, e->t);
        }
    }
    u64map_del(&rt->requests, r->key);
    /* The caller may be deep inside this request's state (a completion
     * that failed it): free it only once the event is over. */
    if (BT_RESERVE(rt->dead, rt->n_dead, rt->cap_dead, 8) < 0) {
        rt->oom = 1;
        return; /* leaks this request's bookkeeping, never a tensor */
    }
    rt->dead[rt->n_dead++] = r;
}

static void bury(rt_runtime *rt)
{
    for (size_t i = 0; i < rt->n_dead; i++)
        reg_request_free(rt, rt->dead[i]);
    rt->n_dead = 0;
}

int rt_request_start(rt_runtime *rt, uint64_t req, int graph_index, const rt_tensor *inputs,
                     bool stream, const uint32_t *max_iters)
{
    if (graph_index < 0 || (size_t)graph_index >= rt->gs->n_graphs)
        return BT_EINVAL;
    if (req == 0 || req == UINT64_MAX)
        return BT_EINVAL;
    if (u64map_get(&rt->requests, req))
        return BT_EEXIST;
    const graph *g = &rt->gs->graphs[graph_index];
    rt_request *r = calloc(1, sizeof(*r));
    if (!r)
        return BT_ENOMEM;
    r->key = req;
    r->g = g;
    r->graph_index = graph_index;
    r->stream = stream;
    r->nodes = calloc(g->n_entities + 1, sizeof(*r->nodes));
    r->loops = calloc(g->n_entities + 1, sizeof(*r->loops));
    r->values = calloc(g->n_values + 1, sizeof(*r->values));
    if (!r->nodes || !r->loops || !r->values || u64map_put(&rt->requests, req, r) < 0) {
        reg_request_free(rt, r);
        return BT_ENOMEM;
    }
    for (size_t i = 0; i < g->n_entities; i++) {
        if (g->entities[i].kind != GRAPH_LOOP)
            continue;
        uint32_t m = g->entities[i].u.loop.max_iters;
        if (max_iters && max_iters[i] && max_iters[i] < m)
            m = max_iters[i];
        r->loops[i].max = m;
    }
    for (size_t k = 0; k < g->n_inputs; k++) {
        if (tvec_push(rt, r, &r->inputs, inputs ? inputs[k] : (rt_tensor){0, 0}) < 0 ||
            rt->oom) {
            /* Nothing was dispatched yet: forget the request; its inputs
             * stay the caller's to free. */
            rt->oom = 0;
            u64map_del(&rt->requests, req);
            if (r->tensors)
                for (uint32_t i = 0; i < r->cap_tensors; i++)
                    if (r->tensors[i].used && r->tensors[i].refs)
                        rt->held--;
            reg_request_free(rt, r);
            return BT_ENOMEM;
        }
    }
    reg_try_dispatch_range(rt, r, 0, (int)g->n_entities - 1);
    int rc = rt->oom ? BT_ENOMEM : 0;
    after_event(rt);
    return rc;
}

/* Looks up the request and checks that NODE names a node of its graph at
 * the depth of ITER.  On failure the event's tensors go back. */
static rt_request *event_request(rt_runtime *rt, uint64_t req, int node, const rt_iter *iter,
                                 const rt_tensor *ts, size_t n, int *rc)
{
    rt_request *r = u64map_get(&rt->requests, req);
    if (!r) {
        release_stray(rt, req, -1, ts, n);
        *rc = BT_ENOENT;
        return NULL;
    }
    const graph *g = r->g;
    if (node < 0 || (size_t)node >= g->n_entities || g->entities[node].kind != GRAPH_NODE ||
        !iter || iter->depth != (uint32_t)g->entities[node].depth) {
        release_stray(rt, req, r->graph_index, ts, n);
        *rc = BT_EINVAL;
        return NULL;
    }
    *rc = 0;
    return r;
}

static void after_event(rt_runtime *rt)
{
    drain(rt);
    bury(rt);
    if (rt->oom) {
        /* Out of memory mid-event leaves graph state unreliable: end every
         * request rather than risk a hang. */
        rt->oom = 0;
        rt_end_all(rt, BT_CODE_RESOURCE_EXHAUSTED, "out of memory in the conductor");
    }
}

int rt_node_done(rt_runtime *rt, uint64_t req, int node, const rt_iter *iter,
                 const rt_value_out *outs, size_t n_outs, bool finish)
{
    int rc;
    rt_tensor stack[16] = {{0, 0}};
    rt_tensor *ts = n_outs <= 16 ? stack : malloc(n_outs * sizeof(*ts));
    if (!ts)
        return BT_ENOMEM;
    for (size_t i = 0; i < n_outs; i++)
        ts[i] = outs[i].tensor;
    rt_request *r = event_request(rt, req, node, iter, ts, n_outs, &rc);
    if (r) {
        /* A value index outside the node's values is a worker bug: treat the
         * tensor as stray rather than corrupt state. */
        for (size_t i = 0; i < n_outs; i++) {
            int v = outs[i].value;
            if (v < 0 || (size_t)v >= r->g->n_values || r->g->values[v].producer != node) {
                release_stray(rt, req, r->graph_index, ts, n_outs);
                rt__end(rt, r, BT_CODE_INTERNAL,
                        "node '%s' completed with an output that is not one of its values",
                        r->g->entities[node].name);
                r = NULL;
                rc = BT_EINVAL;
                break;
            }
        }
    }
    if (r)
        reg_node_done(rt, r, node, iter, outs, n_outs, finish);
    if (ts != stack)
        free(ts);
    after_event(rt);
    return rc;
}

int rt_chunk(rt_runtime *rt, uint64_t req, int node, const rt_iter *iter, int value,
             rt_tensor tensor, bool final)
{
    int rc;
    rt_request *r = event_request(rt, req, node, iter, &tensor, 1, &rc);
    if (r && (value < 0 || (size_t)value >= r->g->n_values ||
              r->g->values[value].producer != node)) {
        release_stray(rt, req, r->graph_index, &tensor, 1);
        rt__end(rt, r, BT_CODE_INTERNAL, "node '%s' emitted a chunk of a value it does not make",
                r->g->entities[node].name);
        r = NULL;
        rc = BT_EINVAL;
    }
    if (r)
        reg_node_chunk(rt, r, node, iter, value, tensor, final);
    after_event(rt);
    return rc;
}

int rt_node_failed(rt_runtime *rt, uint64_t req, int node, const rt_iter *iter, bt_code code,
                   const char *message)
{
    int rc;
    rt_request *r = event_request(rt, req, node, iter, NULL, 0, &rc);
    if (!r)
        return rc;
    reg_node_failed(rt, r, node, iter, code == BT_CODE_OK ? BT_CODE_INTERNAL : code,
                    message ? message : "");
    after_event(rt);
    return 0;
}

static int end_one(rt_runtime *rt, uint64_t req, bt_code code, const char *msg)
{
    rt_request *r = u64map_get(&rt->requests, req);
    if (!r)
        return BT_ENOENT;
    rt__end(rt, r, code, "%s", msg);
    after_event(rt);
    return 0;
}

int rt_cancel(rt_runtime *rt, uint64_t req)
{
    return end_one(rt, req, BT_CODE_CANCELLED, "cancelled by the client");
}

int rt_abort(rt_runtime *rt, uint64_t req, bt_code code, const char *message)
{
    return end_one(rt, req, code == BT_CODE_OK ? BT_CODE_INTERNAL : code,
                   message ? message : "");
}

int rt_deadline(rt_runtime *rt, uint64_t req)
{
    return end_one(rt, req, BT_CODE_DEADLINE_EXCEEDED, "deadline exceeded");
}

static bool request_uses_worker(rt_runtime *rt, rt_request *r, int worker)
{
    if (rt->gx[r->graph_index].uses_worker[worker])
        return true;
    for (uint32_t i = 0; i < r->cap_tensors; i++)
        if (r->tensors[i].used && r->tensors[i].refs && r->tensors[i].t.worker == worker)
            return true;
    return false;
}

int rt_worker_lost(rt_runtime *rt, int worker)
{
    if (worker < 0 || (size_t)worker >= rt->gs->cfg->n_workers)
        return BT_EINVAL;
    size_t n = rt->requests.n, k = 0, pos = 0;
    uint64_t *keys = malloc((n + 1) * sizeof(*keys));
    if (!keys)
        return BT_ENOMEM;
    uint64_t key;
    void *val;
    while (u64map_next(&rt->requests, &pos, &key, &val))
        if (request_uses_worker(rt, val, worker))
            keys[k++] = key;
    rt->lost_worker = worker;
    for (size_t i = 0; i < k; i++) {
        rt_request *r = u64map_get(&rt->requests, keys[i]);
        if (r)
            rt__end(rt, r, BT_CODE_UNAVAILABLE, "worker '%s' was lost",
                    rt->gs->cfg->workers[worker].name);
    }
    rt->lost_worker = -1;
    free(keys);
    after_event(rt);
    return 0;
}

void rt_end_all(rt_runtime *rt, bt_code code, const char *message)
{
    size_t n = rt->requests.n, k = 0, pos = 0;
    uint64_t *keys = malloc((n + 1) * sizeof(*keys));
    uint64_t key;
    void *val;
    if (!keys)
        return;
    while (u64map_next(&rt->requests, &pos, &key, &val))
        keys[k++] = key;
    for (size_t i = 0; i < k; i++) {
        rt_request *r = u64map_get(&rt->requests, keys[i]);
        if (r)
            rt__end(rt, r, code, "%s", message);
    }
    free(keys);
    rt->n_replay = 0;
    bury(rt);
}

size_t rt_inflight(const rt_runtime *rt)
{
    return rt->requests.n;
}

size_t rt_tensors_held(const rt_runtime *rt)
{
    return rt->held;
}

bool rt_request_exists(const rt_runtime *rt, uint64_t req)
{
    return u64map_get(&rt->requests, req) != NULL;
}

const char *rt_action_kind_name(rt_action_kind k)
{
    switch (k) {
    case RT_DISPATCH: return "DISPATCH";
    case RT_EXTEND: return "EXTEND";
    case RT_DROP: return "DROP";
    case RT_RELEASE: return "RELEASE";
    case RT_CHUNK: return "CHUNK";
    case RT_RESPONSE: return "RESPONSE";
    }
    return "?";
}

void rt_iter_format(const rt_iter *it, char *buf, size_t len)
{
    size_t off = 0;
    if (len == 0)
        return;
    buf[0] = 0;
    off += (size_t)snprintf(buf, len, "(");
    for (uint32_t k = 0; k < it->depth && off < len; k++)
        off += (size_t)snprintf(buf + off, len - off, "%s%u", k ? "," : "", it->v[k]);
    if (off < len)
        snprintf(buf + off, len - off, ")");
}
