/* The runtime's bottom layer (runtime/core.h): the action queue and the
 * arena its payloads live in, per-request tensor reference counts, slots,
 * bindings, and the memory of requests.  Nothing here knows how values
 * move through a graph. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"
#include "runtime/core.h"

/* ---- action queue and its arena ---------------------------------------- */

void *rtc_alloc(rt_runtime *rt, size_t size)
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

rt_action *rtc_push(rt_runtime *rt, rt_action_kind kind, const rt_request *r)
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
    rt_action *a = rtc_push(rt, RT_RELEASE, r);
    if (a)
        a->u.release = t;
}

void rtc_ref(rt_runtime *rt, rt_request *r, rt_tensor t)
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

void rtc_unref(rt_runtime *rt, rt_request *r, rt_tensor t)
{
    if (!t.id || r->ended)
        return;
    tref *e = tref_find(r, t, false, rt);
    /* Only an allocation that failed in rtc_ref (rt->oom, after which the
     * event ends every request) leaves an unref without its ref. */
    assert((e && e->refs > 0) || rt->oom);
    if (!e || e->refs == 0)
        return;
    if (--e->refs == 0) {
        rt->held--;
        emit_release(rt, r, t);
    }
}

void rtc_release_all(rt_runtime *rt, rt_request *r)
{
    for (uint32_t i = 0; i < r->cap_tensors; i++) {
        tref *e = &r->tensors[i];
        if (e->used && e->refs) {
            e->refs = 0;
            rt->held--;
            emit_release(rt, r, e->t);
        }
    }
}

void rtc_release_stray(rt_runtime *rt, uint64_t req, int gi, const rt_tensor *ts, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!ts[i].id || ts[i].worker == rt->lost_worker)
            continue;
        rt_action *a = rtc_push(rt, RT_RELEASE, NULL);
        if (!a)
            return;
        a->req = req;
        a->graph = gi;
        a->u.release = ts[i];
    }
}

int tvec_push(rt_runtime *rt, rt_request *r, tvec *v, rt_tensor t)
{
    if (BT_RESERVE(v->t, v->n, v->cap, 2) < 0) {
        rt->oom = 1;
        return BT_ENOMEM;
    }
    v->t[v->n++] = t;
    rtc_ref(rt, r, t);
    return 0;
}

void tvec_clear(rt_runtime *rt, rt_request *r, tvec *v)
{
    for (uint32_t i = 0; i < v->n; i++)
        rtc_unref(rt, r, v->t[i]);
    free(v->t);
    v->t = NULL;
    v->n = v->cap = 0;
}

/* ---- iteration vectors ------------------------------------------------- */

bool rtc_iter_eq(const rt_iter *a, const rt_iter *b)
{
    if (a->depth != b->depth)
        return false;
    for (uint32_t k = 0; k < a->depth; k++)
        if (a->v[k] != b->v[k])
            return false;
    return true;
}

bool rtc_prefix_eq(const rt_iter *a, const rt_iter *b, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++)
        if (a->v[k] != b->v[k])
            return false;
    return true;
}

void rtc_current_iter(const rt_request *r, int entity, rt_iter *out)
{
    const graph_entity *en = &r->g->entities[entity];
    out->depth = (uint32_t)en->depth;
    for (int k = 0; k < en->depth; k++)
        out->v[k] = r->loops[en->loops[k]].cur;
}

/* ---- slots ------------------------------------------------------------- */

slot *rtc_slot_find(rt_request *r, int node, const rt_iter *v)
{
    node_state *ns = &r->nodes[node];
    for (uint32_t i = 0; i < ns->n_slots; i++)
        if (rtc_iter_eq(&ns->slots[i].iter, v))
            return &ns->slots[i];
    return NULL;
}

slot *rtc_slot_get(rt_runtime *rt, rt_request *r, int node, const rt_iter *v)
{
    slot *s = rtc_slot_find(r, node, v);
    if (s)
        return s;
    node_state *ns = &r->nodes[node];
    if (BT_RESERVE(ns->slots, ns->n_slots, ns->cap_slots, 2) < 0) {
        rt->oom = 1;
        return NULL;
    }
    uint32_t n = rt->gx[r->graph_index].n_edge_slots[node];
    uint8_t *have = calloc(n + 1, 1);
    tvec *parts = calloc(n + 1, sizeof(*parts));
    if (!have || !parts) {
        free(have);
        free(parts);
        rt->oom = 1;
        return NULL;
    }
    s = &ns->slots[ns->n_slots++];
    memset(s, 0, sizeof(*s));
    s->iter = *v;
    s->have = have;
    s->parts = parts;
    return s;
}

void rtc_slot_remove(rt_runtime *rt, rt_request *r, int node, slot *s)
{
    node_state *ns = &r->nodes[node];
    uint32_t n = rt->gx[r->graph_index].n_edge_slots[node];
    for (uint32_t i = 0; i < n; i++)
        tvec_clear(rt, r, &s->parts[i]);
    tvec_clear(rt, r, &s->stream);
    tvec_clear(rt, r, &s->stream_running);
    free(s->have);
    free(s->parts);
    *s = ns->slots[--ns->n_slots];
}

/* ---- bindings (persisted external values) ------------------------------ */

binding *rtc_binding_find(rt_request *r, int edge, const rt_iter *v, uint32_t depth)
{
    for (uint32_t i = 0; i < r->n_bindings; i++)
        if (r->bindings[i].edge == edge && rtc_prefix_eq(&r->bindings[i].key, v, depth))
            return &r->bindings[i];
    return NULL;
}

binding *rtc_binding_add(rt_runtime *rt, rt_request *r, int edge, const rt_iter *key)
{
    if (BT_RESERVE(r->bindings, r->n_bindings, r->cap_bindings, 4) < 0) {
        rt->oom = 1;
        return NULL;
    }
    binding *b = &r->bindings[r->n_bindings++];
    memset(b, 0, sizeof(*b));
    b->edge = edge;
    b->key = *key;
    return b;
}

/* ---- requests ---------------------------------------------------------- */

rt_request *rtc_request_new(rt_runtime *rt, uint64_t key, int graph_index, bool stream,
                            const uint32_t *max_iters)
{
    const graph *g = &rt->gs->graphs[graph_index];
    rt_request *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->key = key;
    r->g = g;
    r->graph_index = graph_index;
    r->stream = stream;
    r->nodes = calloc(g->n_entities + 1, sizeof(*r->nodes));
    r->loops = calloc(g->n_entities + 1, sizeof(*r->loops));
    r->values = calloc(g->n_values + 1, sizeof(*r->values));
    if (!r->nodes || !r->loops || !r->values) {
        rtc_request_free(rt, r);
        return NULL;
    }
    for (size_t i = 0; i < g->n_entities; i++) {
        if (g->entities[i].kind != GRAPH_LOOP)
            continue;
        uint32_t m = g->entities[i].u.loop.max_iters;
        if (max_iters && max_iters[i] && max_iters[i] < m)
            m = max_iters[i];
        r->loops[i].max = m;
    }
    return r;
}

void rtc_request_free(rt_runtime *rt, rt_request *r)
{
    if (!r)
        return;
    const graph *g = r->g;
    if (r->nodes)
        for (size_t i = 0; i < g->n_entities; i++) {
            node_state *ns = &r->nodes[i];
            uint32_t n = rt->gx[r->graph_index].n_edge_slots[i];
            for (uint32_t k = 0; k < ns->n_slots; k++) {
                slot *s = &ns->slots[k];
                for (uint32_t x = 0; x < n; x++)
                    tvec_free(&s->parts[x]);
                tvec_free(&s->stream);
                tvec_free(&s->stream_running);
                free(s->have);
                free(s->parts);
            }
            free(ns->slots);
            for (uint32_t k = 0; k < ns->n_pend; k++) {
                free(ns->pend[k].outs);
                free(ns->pend[k].message);
            }
            free(ns->pend);
        }
    if (r->values)
        for (size_t i = 0; i < g->n_values; i++) {
            tvec_free(&r->values[i].parts);
            tvec_free(&r->values[i].last);
        }
    for (uint32_t i = 0; i < r->n_bindings; i++)
        tvec_free(&r->bindings[i].parts);
    for (uint32_t i = 0; i < r->n_outs; i++)
        tvec_free(&r->outs[i].parts);
    tvec_free(&r->inputs);
    free(r->bindings);
    free(r->outs);
    free(r->tensors);
    free(r->nodes);
    free(r->loops);
    free(r->values);
    free(r);
}

void rtc_request_retire(rt_runtime *rt, rt_request *r)
{
    u64map_del(&rt->requests, r->key);
    /* rt_request_start made room for every live request: no allocation. */
    int rc = BT_RESERVE(rt->dead, rt->n_dead, rt->cap_dead, 8);
    assert(rc == 0);
    (void)rc;
    rt->dead[rt->n_dead++] = r;
}

void rtc_bury(rt_runtime *rt)
{
    for (size_t i = 0; i < rt->n_dead; i++)
        rtc_request_free(rt, rt->dead[i]);
    rt->n_dead = 0;
}

void rtc_replay_push(rt_runtime *rt, const rt_request *r, int node, const rt_iter *it)
{
    if (BT_RESERVE(rt->replay, rt->n_replay, rt->cap_replay, 16) < 0) {
        rt->oom = 1;
        return;
    }
    rt->replay[rt->n_replay++] = (replay_item){r->key, node, *it};
}

/* ---- what is derived once per graph ------------------------------------ */

int rtc_extra_build(rt_runtime *rt)
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
        /* A replicated node may run on any replica: which one a request
         * uses is the dispatcher's to say (rt_worker_lost's ALSO). */
        for (size_t w = 0; w < nw; w++)
            for (size_t k = 0; k < gs->n_worker_nodes[w]; k++) {
                int code = gs->worker_nodes[w][k];
                if ((size_t)(code >> 16) == gi &&
                    !g->entities[code & 0xffff].u.node.replicated)
                    x->uses_worker[w] = 1;
            }
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

void rtc_extra_free(rt_runtime *rt)
{
    if (!rt->gx)
        return;
    for (size_t gi = 0; gi < rt->gs->n_graphs; gi++) {
        free(rt->gx[gi].client_values);
        free(rt->gx[gi].joins);
        free(rt->gx[gi].uses_worker);
        free(rt->gx[gi].edge_pos);
        free(rt->gx[gi].n_edge_slots);
    }
    free(rt->gx);
    rt->gx = NULL;
}
