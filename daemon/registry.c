/* Per-request graph state (DESIGN.md section 4): slots keyed by iteration
 * vector, delivery along edges, readiness and dispatch, loop iterations,
 * streams and speculation windows.
 *
 * Values travel as "productions": a producer's execution emits a value as
 * a sequence of chunks closed by a final mark.  Stream edges and new_token
 * client edges take each chunk as it comes; every other edge takes the
 * joined chunks when the production closes.  A plain completion is the
 * one-chunk case, so nodes, stream consumers and loops share one path. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/runtime_internal.h"

static void entity_completed(rt_runtime *rt, rt_request *r, int entity);

static void tvec_free(tvec *v)
{
    free(v->t);
    v->t = NULL;
    v->n = v->cap = 0;
}

void reg_current_iter(const rt_request *r, int entity, rt_iter *out)
{
    const graph_entity *en = &r->g->entities[entity];
    out->depth = (uint32_t)en->depth;
    for (int k = 0; k < en->depth; k++)
        out->v[k] = r->loops[en->loops[k]].cur;
}

static bool prefix_eq(const rt_iter *a, const rt_iter *b, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++)
        if (a->v[k] != b->v[k])
            return false;
    return true;
}

/* ---- slots ------------------------------------------------------------- */

slot *reg_slot_find(rt_request *r, int node, const rt_iter *v)
{
    node_state *ns = &r->nodes[node];
    for (uint32_t i = 0; i < ns->n_slots; i++)
        if (rt__iter_eq(&ns->slots[i].iter, v))
            return &ns->slots[i];
    return NULL;
}

static slot *slot_get(rt_runtime *rt, rt_request *r, int node, const rt_iter *v)
{
    slot *s = reg_slot_find(r, node, v);
    if (s)
        return s;
    node_state *ns = &r->nodes[node];
    if (ns->n_slots == ns->cap_slots) {
        uint32_t cap = ns->cap_slots ? ns->cap_slots * 2 : 2;
        slot *ss = realloc(ns->slots, cap * sizeof(*ss));
        if (!ss) {
            rt->oom = 1;
            return NULL;
        }
        ns->slots = ss;
        ns->cap_slots = cap;
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

/* Drops a slot and the references it holds. */
static void slot_remove(rt_runtime *rt, rt_request *r, int node, slot *s)
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

static binding *binding_find(rt_request *r, int edge, const rt_iter *v, uint32_t depth)
{
    for (uint32_t i = 0; i < r->n_bindings; i++)
        if (r->bindings[i].edge == edge && prefix_eq(&r->bindings[i].key, v, depth))
            return &r->bindings[i];
    return NULL;
}

static binding *binding_add(rt_runtime *rt, rt_request *r, int edge, const rt_iter *key)
{
    if (r->n_bindings == r->cap_bindings) {
        uint32_t cap = r->cap_bindings ? r->cap_bindings * 2 : 4;
        binding *b = realloc(r->bindings, cap * sizeof(*b));
        if (!b) {
            rt->oom = 1;
            return NULL;
        }
        r->bindings = b;
        r->cap_bindings = cap;
    }
    binding *b = &r->bindings[r->n_bindings++];
    memset(b, 0, sizeof(*b));
    b->edge = edge;
    b->key = *key;
    return b;
}

/* ---- delivery ---------------------------------------------------------- */

/* The consumer iteration an edge's value (made in producer iteration P) is
 * for; false when there is none (a loop-back out of the last iteration). */
static bool edge_target(const rt_request *r, const graph_edge *e, const rt_iter *p, rt_iter *t)
{
    const graph_entity *c = &r->g->entities[e->consumer];
    int cd = e->common_depth;
    t->depth = (uint32_t)c->depth;
    for (int k = 0; k < cd; k++)
        t->v[k] = p->v[k];
    if (e->loopback) {
        t->v[cd - 1]++;
        if (t->v[cd - 1] >= r->loops[c->loops[cd - 1]].max)
            return false;
    }
    for (int k = cd; k < c->depth; k++)
        t->v[k] = 0;
    return true;
}

static void deliver_joined(rt_runtime *rt, rt_request *r, int ei, const rt_iter *p,
                           const tvec *parts)
{
    const graph_edge *e = &r->g->edges[ei];
    rt_iter t;
    if (!edge_target(r, e, p, &t))
        return;
    if (e->persist) {
        binding *b = binding_find(r, ei, &t, (uint32_t)e->common_depth);
        assert(!b);
        if (b)
            return;
        b = binding_add(rt, r, ei, &t);
        if (!b)
            return;
        for (uint32_t i = 0; i < parts->n; i++)
            tvec_push(rt, r, &b->parts, parts->t[i]);
        /* The consumer may be waiting in its current iteration. */
        rt_iter cur;
        reg_current_iter(r, e->consumer, &cur);
        reg_try_dispatch(rt, r, e->consumer, &cur);
        return;
    }
    slot *s = slot_get(rt, r, e->consumer, &t);
    if (!s)
        return;
    uint32_t pos = rt->gx[r->graph_index].edge_pos[ei];
    /* Each producer delivers once per consumer iteration; a second time is
     * a runtime bug, never an input error. */
    assert(!s->have[pos]);
    if (s->have[pos])
        return;
    for (uint32_t i = 0; i < parts->n; i++)
        if (tvec_push(rt, r, &s->parts[pos], parts->t[i]) < 0)
            return; /* out of memory: the event ends every request */
    s->have[pos] = 1;
    reg_try_dispatch(rt, r, e->consumer, &t);
}

static void deliver_chunk(rt_runtime *rt, rt_request *r, int ei, const rt_iter *p, rt_tensor t,
                          bool final)
{
    const graph_edge *e = &r->g->edges[ei];
    rt_iter target;
    if (!edge_target(r, e, p, &target))
        return;
    slot *s = slot_get(rt, r, e->consumer, &target);
    if (!s || s->stream_final_seen)
        return;
    if (t.id)
        tvec_push(rt, r, &s->stream, t);
    if (final) {
        s->stream_final_seen = true;
        s->have[rt->gx[r->graph_index].edge_pos[ei]] = 1;
    }
    reg_try_dispatch(rt, r, e->consumer, &target);
}

static void out_append(rt_runtime *rt, rt_request *r, const char *name, const char *modality,
                       rt_tensor t)
{
    out_entry *o = NULL;
    for (uint32_t i = 0; i < r->n_outs; i++)
        if (strcmp(r->outs[i].name, name) == 0)
            o = &r->outs[i];
    if (!o) {
        if (r->n_outs == r->cap_outs) {
            uint32_t cap = r->cap_outs ? r->cap_outs * 2 : 4;
            out_entry *no = realloc(r->outs, cap * sizeof(*no));
            if (!no) {
                rt->oom = 1;
                return;
            }
            r->outs = no;
            r->cap_outs = cap;
        }
        o = &r->outs[r->n_outs++];
        memset(o, 0, sizeof(*o));
        o->name = name;
        o->modality = modality;
    }
    if (t.id)
        tvec_push(rt, r, &o->parts, t);
}

static void send_chunk(rt_runtime *rt, rt_request *r, const graph_value *gv,
                       const graph_edge *e, const rt_iter *p, rt_tensor t)
{
    rt_action *a = rt__push(rt, RT_CHUNK, r);
    if (!a)
        return;
    a->u.chunk.seq = r->seq++;
    a->u.chunk.name = gv->name;
    a->u.chunk.modality = e->modality;
    a->u.chunk.tensor = t;
    a->u.chunk.node = gv->producer;
    a->u.chunk.iter = *p;
}

void reg_emit(rt_runtime *rt, rt_request *r, int vi, const rt_iter *p, rt_tensor t, bool final)
{
    const graph *g = r->g;
    const graph_value *gv = &g->values[vi];
    value_state *vs = &r->values[vi];
    if (r->ended)
        return;
    if (!vs->open) {
        if (vs->closed && rt__iter_eq(&vs->closed_iter, p))
            return; /* already complete: a stray part, released by its holder */
        vs->open = true;
        vs->any = false;
        vs->iter = *p;
    }
    if (t.id) {
        vs->any = true;
        /* Chunks that only stream on are not kept: a long stream would
         * otherwise pin every chunk until its producer ends. */
        if (rt->gx[r->graph_index].joins[vi])
            tvec_push(rt, r, &vs->parts, t);
        for (size_t k = 0; k < gv->n_edges; k++) {
            const graph_edge *e = &g->edges[gv->edges[k]];
            if (e->consumer < 0 && e->new_token) {
                if (r->stream)
                    send_chunk(rt, r, gv, e, p, t);
                else
                    out_append(rt, r, gv->name, e->modality, t);
            } else if (e->consumer >= 0 && e->stream) {
                /* The final mark rides on the last chunk: one dispatch less. */
                deliver_chunk(rt, r, gv->edges[k], p, t, final);
            }
        }
        for (size_t k = 0; k < gv->n_loop_uses; k++) {
            int w = gv->loop_uses[k];
            if (g->values[w].role != GRAPH_VALUE_LOOP_ACCUM)
                continue;
            rt_iter lp = *p;
            lp.depth = (uint32_t)g->entities[g->values[w].producer].depth;
            reg_emit(rt, r, w, &lp, t, false);
        }
    }
    if (!final || r->ended)
        return;
    for (size_t k = 0; k < gv->n_edges; k++) {
        const graph_edge *e = &g->edges[gv->edges[k]];
        if (e->consumer < 0) {
            if (!e->new_token) {
                out_append(rt, r, gv->name, e->modality, (rt_tensor){0, 0});
                for (uint32_t i = 0; i < vs->parts.n; i++)
                    out_append(rt, r, gv->name, e->modality, vs->parts.t[i]);
            } else if (!r->stream) {
                /* A client value that produced nothing still appears. */
                out_append(rt, r, gv->name, e->modality, (rt_tensor){0, 0});
            }
        } else if (e->stream) {
            if (!t.id)
                deliver_chunk(rt, r, gv->edges[k], p, (rt_tensor){0, 0}, true);
        } else {
            deliver_joined(rt, r, gv->edges[k], p, &vs->parts);
        }
        if (r->ended)
            return;
    }
    for (size_t k = 0; k < gv->n_loop_uses; k++) {
        int w = gv->loop_uses[k];
        if (g->values[w].role != GRAPH_VALUE_LOOP_LAST)
            continue;
        tvec *last = &r->values[w].last;
        tvec_clear(rt, r, last);
        for (uint32_t i = 0; i < vs->parts.n; i++)
            tvec_push(rt, r, last, vs->parts.t[i]);
    }
    tvec_clear(rt, r, &vs->parts);
    vs->open = false;
    vs->closed = true;
    vs->closed_iter = *p;
}

/* ---- readiness and dispatch ------------------------------------------- */

static bool input_ready(const rt_runtime *rt, rt_request *r, int node, const slot *s,
                        const rt_iter *v, size_t k)
{
    const graph *g = r->g;
    const graph_node *n = &g->entities[node].u.node;
    const graph_input *in = &n->inputs[k];
    if (in->graph_input >= 0)
        return true;
    if (in->is_stream) {
        if (n->consumes_stream)
            return s->stream.n > 0 || (s->stream_final_seen && !s->stream_final_running);
        return s->stream_final_seen;
    }
    for (size_t x = 0; x < in->n_edges; x++) {
        int ei = in->edges[x];
        const graph_edge *e = &g->edges[ei];
        if (!graph_edge_applies(e, v->v, (int)v->depth))
            continue;
        if (e->persist) {
            if (!binding_find(r, ei, v, (uint32_t)e->common_depth))
                return false;
        } else if (!s->have[rt->gx[r->graph_index].edge_pos[ei]]) {
            return false;
        }
    }
    return true;
}

static void copy_tvec(rt_runtime *rt, rt_tlist *dst, const tvec *src)
{
    dst->n = src->n;
    dst->t = rt__alloc(rt, (src->n + 1) * sizeof(rt_tensor));
    if (dst->t && src->n)
        memcpy(dst->t, src->t, src->n * sizeof(rt_tensor));
    else
        dst->n = 0;
}

static void build_dispatch(rt_runtime *rt, rt_request *r, int node, slot *s, const rt_iter *v)
{
    const graph *g = r->g;
    const graph_node *n = &g->entities[node].u.node;
    node_state *ns = &r->nodes[node];
    rt_action *a = rt__push(rt, RT_DISPATCH, r);
    if (!a)
        return;
    a->u.dispatch.node = node;
    a->u.dispatch.iter = *v;
    a->u.dispatch.client_values = rt->gx[r->graph_index].client_values;
    a->u.dispatch.n_inputs = (uint32_t)n->n_inputs;
    rt_input *ins = rt__alloc(rt, (n->n_inputs + 1) * sizeof(*ins));
    a->u.dispatch.inputs = ins;
    if (!ins)
        return;
    for (size_t k = 0; k < n->n_inputs; k++) {
        const graph_input *in = &n->inputs[k];
        rt_input *di = &ins[k];
        memset(di, 0, sizeof(*di));
        di->input = (uint32_t)k;
        di->parts = rt__alloc(rt, (in->n_edges + 1) * sizeof(*di->parts));
        if (!di->parts)
            return;
        if (in->graph_input >= 0) {
            /* Actions outlive the request when it ends in the same batch:
             * copy, never point into request state. */
            di->n_parts = 1;
            di->parts[0].t = rt__alloc(rt, sizeof(rt_tensor));
            if (!di->parts[0].t)
                return;
            di->parts[0].n = 1;
            di->parts[0].t[0] = r->inputs.t[in->graph_input];
            continue;
        }
        if (in->is_stream) {
            /* The dispatch takes every buffered chunk; they stay referenced
             * by the slot until this dispatch completes. */
            di->stream = true;
            di->n_parts = 1;
            copy_tvec(rt, &di->parts[0], &s->stream);
            /* Moved, not copied: no allocation, no reference changes. */
            assert(s->stream_running.n == 0);
            tvec_free(&s->stream_running);
            s->stream_running = s->stream;
            s->stream = (tvec){0};
            s->stream_final_running = s->stream_final_seen;
            di->stream_final = s->stream_final_seen;
            continue;
        }
        for (size_t x = 0; x < in->n_edges; x++) {
            int ei = in->edges[x];
            const graph_edge *e = &g->edges[ei];
            if (!graph_edge_applies(e, v->v, (int)v->depth))
                continue;
            di->shard_dim = e->shard_dim;
            if (e->persist)
                copy_tvec(rt, &di->parts[di->n_parts++],
                          &binding_find(r, ei, v, (uint32_t)e->common_depth)->parts);
            else
                copy_tvec(rt, &di->parts[di->n_parts++],
                          &s->parts[rt->gx[r->graph_index].edge_pos[ei]]);
        }
    }
    ns->spec_active = false;
    uint32_t w = rt->opt.speculation_window;
    const loop_state *ls = n->speculative ? &r->loops[g->entities[node].parent_loop] : NULL;
    if (ls && w > 0 && !ls->finish) {
        uint32_t inner = v->v[v->depth - 1];
        uint64_t want = (uint64_t)inner + w;
        uint32_t upto = want < ls->max - 1 ? (uint32_t)want : ls->max - 1;
        if (upto > inner) {
            ns->spec_active = true;
            ns->spec_iter = *v;
            ns->spec_upto = upto;
            a->u.dispatch.spec_upto = upto;
        }
    }
}

/* True when (node, v) lies inside the node's open speculation window, past
 * the iteration that was dispatched. */
static bool in_window(const rt_request *r, int node, const rt_iter *v)
{
    const node_state *ns = &r->nodes[node];
    if (!ns->spec_active || v->depth == 0)
        return false;
    uint32_t d = v->depth - 1;
    return prefix_eq(&ns->spec_iter, v, d) && v->v[d] > ns->spec_iter.v[d] &&
           v->v[d] <= ns->spec_upto;
}

void reg_try_dispatch(rt_runtime *rt, rt_request *r, int node, const rt_iter *v)
{
    if (r->ended)
        return;
    const graph_entity *en = &r->g->entities[node];
    rt_iter cur;
    reg_current_iter(r, node, &cur);
    if (!rt__iter_eq(&cur, v))
        return; /* buffered for a later iteration */
    for (int k = 0; k < en->depth; k++)
        if (r->loops[en->loops[k]].done)
            return;
    node_state *ns = &r->nodes[node];
    if (ns->done_valid && rt__iter_eq(&ns->done_iter, v))
        return;
    slot *s = slot_get(rt, r, node, v);
    if (!s || s->state == SLOT_RUNNING)
        return;
    for (size_t k = 0; k < en->u.node.n_inputs; k++)
        if (!input_ready(rt, r, node, s, v, k))
            return;
    s->state = SLOT_RUNNING;
    if (in_window(r, node, v)) {
        /* The worker is already running this iteration on its own; what it
         * reported early is replayed once this event is over. */
        s->spec = true;
        rt__replay_push(rt, r, node, v);
        return;
    }
    build_dispatch(rt, r, node, s, v);
}

void reg_try_dispatch_range(rt_runtime *rt, rt_request *r, int first, int last)
{
    for (int i = first; i <= last && !r->ended; i++) {
        if (r->g->entities[i].kind != GRAPH_NODE)
            continue;
        rt_iter v;
        reg_current_iter(r, i, &v);
        reg_try_dispatch(rt, r, i, &v);
    }
}

/* ---- speculation bookkeeping ------------------------------------------ */

static void pend_clear(rt_runtime *rt, rt_request *r, node_state *ns)
{
    for (uint32_t i = 0; i < ns->n_pend; i++) {
        pend *p = &ns->pend[i];
        for (uint32_t k = 0; k < p->n_outs; k++)
            rt__unref(rt, r, p->outs[k].tensor);
        if (p->kind == PEND_CHUNK)
            rt__unref(rt, r, p->tensor);
        free(p->outs);
        free(p->message);
    }
    ns->n_pend = 0;
}

static void emit_drop(rt_runtime *rt, rt_request *r, int node, const rt_iter *prefix,
                      uint32_t from)
{
    rt_action *a = rt__push(rt, RT_DROP, r);
    if (!a)
        return;
    a->u.drop.node = node;
    a->u.drop.from = *prefix;
    a->u.drop.from.v[prefix->depth - 1] = from;
}

/* Closes a node's window after iteration LAST, the last valid one. */
static void close_window(rt_runtime *rt, rt_request *r, int node, uint32_t last)
{
    node_state *ns = &r->nodes[node];
    if (!ns->spec_active)
        return;
    if (ns->spec_upto > last)
        emit_drop(rt, r, node, &ns->spec_iter, last + 1);
    ns->spec_active = false;
    pend_clear(rt, r, ns);
}

void reg_drop_speculation(rt_runtime *rt, rt_request *r)
{
    const graph *g = r->g;
    for (size_t i = 0; i < g->n_entities; i++) {
        node_state *ns = &r->nodes[i];
        if (g->entities[i].kind != GRAPH_NODE || !ns->spec_active)
            continue;
        /* Everything the conductor has not processed is void. */
        uint32_t d = ns->spec_iter.depth - 1;
        uint32_t from = ns->spec_iter.v[d];
        if (ns->done_valid && prefix_eq(&ns->done_iter, &ns->spec_iter, d) &&
            ns->done_iter.v[d] + 1 > from)
            from = ns->done_iter.v[d] + 1;
        emit_drop(rt, r, (int)i, &ns->spec_iter, from);
        ns->spec_active = false;
    }
}

static void pend_push(rt_runtime *rt, rt_request *r, int node, const pend *src)
{
    node_state *ns = &r->nodes[node];
    if (ns->n_pend == ns->cap_pend) {
        uint32_t cap = ns->cap_pend ? ns->cap_pend * 2 : 4;
        pend *p = realloc(ns->pend, cap * sizeof(*p));
        if (!p) {
            rt->oom = 1;
            return;
        }
        ns->pend = p;
        ns->cap_pend = cap;
    }
    pend *p = &ns->pend[ns->n_pend++];
    *p = *src;
    for (uint32_t k = 0; k < p->n_outs; k++)
        rt__ref(rt, r, p->outs[k].tensor);
    if (p->kind == PEND_CHUNK)
        rt__ref(rt, r, p->tensor);
}

/* ---- completions ------------------------------------------------------- */

static bool value_needs_tensor(const graph *g, const graph_value *gv)
{
    if (gv->n_loop_uses)
        return true;
    for (size_t k = 0; k < gv->n_edges; k++) {
        const graph_edge *e = &g->edges[gv->edges[k]];
        if (e->consumer >= 0 && !e->stream)
            return true;
        if (e->consumer < 0 && !e->new_token)
            return true;
    }
    return false;
}

static void process_done(rt_runtime *rt, rt_request *r, int node, const rt_iter *v,
                         const rt_value_out *outs, size_t n_outs, bool finish)
{
    const graph *g = r->g;
    const graph_entity *en = &g->entities[node];
    const graph_node *n = &en->u.node;
    node_state *ns = &r->nodes[node];
    slot *s = reg_slot_find(r, node, v);
    assert(s && s->state == SLOT_RUNNING);
    bool final_exec = !n->consumes_stream || s->stream_final_running;
    tvec_clear(rt, r, &s->stream_running);

    /* An output tensor of the last dispatch closes its value at once; the
     * loop below closes the values that came without one. */
    for (size_t i = 0; i < n_outs; i++)
        reg_emit(rt, r, outs[i].value, v, outs[i].tensor, final_exec);
    if (r->ended)
        return;
    /* A finish raised on any dispatch (a stream consumer hearing EOS
     * mid-stream) ends the loop after this iteration. */
    if (finish && en->depth > 0)
        r->loops[en->parent_loop].finish = true;
    if (!final_exec) {
        /* A stream consumer runs again on the chunks that came meanwhile;
         * its other inputs stay bound in the slot.  Emitting may have
         * grown the slot array: find the slot again. */
        s = reg_slot_find(r, node, v);
        s->state = SLOT_WAITING;
        s->spec = false;
        reg_try_dispatch(rt, r, node, v);
        return;
    }
    for (size_t k = 0; k < en->n_values; k++) {
        int vi = en->values[k];
        const value_state *vs = &r->values[vi];
        bool made = (vs->open && rt__iter_eq(&vs->iter, v) && vs->any) ||
                    (vs->closed && rt__iter_eq(&vs->closed_iter, v));
        if (!made && value_needs_tensor(g, &g->values[vi])) {
            rt__end(rt, r, BT_CODE_INTERNAL, "node '%s' completed without its output '%s'",
                    en->name, g->values[vi].name);
            return;
        }
    }
    for (size_t k = 0; k < en->n_values && !r->ended; k++)
        reg_emit(rt, r, en->values[k], v, (rt_tensor){0, 0}, true);
    if (r->ended)
        return;
    s = reg_slot_find(r, node, v);
    if (s)
        slot_remove(rt, r, node, s);
    ns->done_valid = true;
    ns->done_iter = *v;
    if (en->depth > 0) {
        loop_state *ls = &r->loops[en->parent_loop];
        uint32_t inner = v->v[v->depth - 1];
        if (ns->spec_active && prefix_eq(&ns->spec_iter, v, v->depth - 1)) {
            /* The loop ends with this iteration (finish here or from another
             * body node): nothing past it is worth running. */
            if (ls->finish || inner + 1 >= ls->max) {
                close_window(rt, r, node, inner);
            } else {
                /* Keep the worker `speculation_window` iterations ahead. */
                uint64_t want = (uint64_t)inner + rt->opt.speculation_window;
                uint32_t upto = want < ls->max - 1 ? (uint32_t)want : ls->max - 1;
                if (upto > ns->spec_upto) {
                    ns->spec_upto = upto;
                    rt_action *a = rt__push(rt, RT_EXTEND, r);
                    if (a) {
                        a->u.extend.node = node;
                        a->u.extend.iter = *v;
                        a->u.extend.upto = upto;
                    }
                }
            }
        }
    }
    entity_completed(rt, r, node);
}

void reg_node_done(rt_runtime *rt, rt_request *r, int node, const rt_iter *v,
                   const rt_value_out *outs, size_t n_outs, bool finish)
{
    /* A temporary hold on every tensor of the event: whatever no consumer
     * takes is released when the hold goes. */
    for (size_t i = 0; i < n_outs; i++)
        rt__ref(rt, r, outs[i].tensor);
    rt_iter cur;
    reg_current_iter(r, node, &cur);
    slot *s = reg_slot_find(r, node, v);
    if (s && s->state == SLOT_RUNNING && rt__iter_eq(&cur, v)) {
        process_done(rt, r, node, v, outs, n_outs, finish);
    } else if (in_window(r, node, v) && !rt__iter_eq(&cur, v)) {
        pend p = {.kind = PEND_DONE, .iter = *v, .finish = finish};
        p.outs = malloc((n_outs + 1) * sizeof(*p.outs));
        if (p.outs) {
            if (n_outs)
                memcpy(p.outs, outs, n_outs * sizeof(*outs));
            p.n_outs = (uint32_t)n_outs;
            pend_push(rt, r, node, &p);
        } else {
            rt->oom = 1;
        }
    }
    for (size_t i = 0; i < n_outs; i++)
        rt__unref(rt, r, outs[i].tensor);
}

void reg_node_chunk(rt_runtime *rt, rt_request *r, int node, const rt_iter *v, int value,
                    rt_tensor t, bool final)
{
    rt__ref(rt, r, t);
    rt_iter cur;
    reg_current_iter(r, node, &cur);
    slot *s = reg_slot_find(r, node, v);
    if (s && s->state == SLOT_RUNNING && rt__iter_eq(&cur, v)) {
        value_state *vs = &r->values[value];
        if (!vs->open && !(vs->closed && rt__iter_eq(&vs->closed_iter, v))) {
            vs->open = true;
            vs->iter = *v;
            vs->any = false;
        }
        if (vs->open)
            vs->any = true; /* an empty chunk still counts as the stream's word */
        reg_emit(rt, r, value, v, t, final);
    } else if (in_window(r, node, v) && !rt__iter_eq(&cur, v)) {
        pend p = {.kind = PEND_CHUNK, .iter = *v, .value = value, .tensor = t, .final = final};
        pend_push(rt, r, node, &p);
    }
    rt__unref(rt, r, t);
}

void reg_node_failed(rt_runtime *rt, rt_request *r, int node, const rt_iter *v, bt_code code,
                     const char *message)
{
    rt_iter cur;
    reg_current_iter(r, node, &cur);
    slot *s = reg_slot_find(r, node, v);
    if (s && s->state == SLOT_RUNNING && rt__iter_eq(&cur, v)) {
        rt__end(rt, r, code, "node '%s' failed: %s", r->g->entities[node].name, message);
    } else if (in_window(r, node, v) && !rt__iter_eq(&cur, v)) {
        /* A speculative iteration failed: it matters only if the loop
         * reaches it. */
        pend p = {.kind = PEND_FAIL, .iter = *v, .code = code, .message = strdup(message)};
        if (!p.message)
            rt->oom = 1;
        else
            pend_push(rt, r, node, &p);
    }
}

void reg_replay(rt_runtime *rt, rt_request *r, int node, const rt_iter *v)
{
    node_state *ns = &r->nodes[node];
    for (uint32_t i = 0; i < ns->n_pend && !r->ended;) {
        if (!rt__iter_eq(&ns->pend[i].iter, v)) {
            i++;
            continue;
        }
        pend p = ns->pend[i];
        memmove(&ns->pend[i], &ns->pend[i + 1], (ns->n_pend - i - 1) * sizeof(pend));
        ns->n_pend--;
        switch (p.kind) {
        case PEND_DONE:
            reg_node_done(rt, r, node, v, p.outs, p.n_outs, p.finish);
            for (uint32_t k = 0; k < p.n_outs; k++)
                rt__unref(rt, r, p.outs[k].tensor);
            break;
        case PEND_CHUNK:
            reg_node_chunk(rt, r, node, v, p.value, p.tensor, p.final);
            rt__unref(rt, r, p.tensor);
            break;
        case PEND_FAIL:
            rt__end(rt, r, p.code, "node '%s' failed: %s", r->g->entities[node].name,
                    p.message ? p.message : "");
            break;
        }
        free(p.outs);
        free(p.message);
        /* The list may have changed under us (a window closed): restart. */
        i = 0;
    }
}

/* ---- loops and completion ---------------------------------------------- */

/* Forgets every slot, binding and buffered event inside LOOP for the
 * instance with prefix P: what is left there can never be consumed. */
static void loop_purge(rt_runtime *rt, rt_request *r, int loop, const rt_iter *p)
{
    const graph *g = r->g;
    const graph_loop *l = &g->entities[loop].u.loop;
    for (int i = loop + 1; i <= l->last; i++) {
        if (g->entities[i].kind != GRAPH_NODE)
            continue;
        node_state *ns = &r->nodes[i];
        for (uint32_t k = 0; k < ns->n_slots;) {
            if (prefix_eq(&ns->slots[k].iter, p, p->depth))
                slot_remove(rt, r, i, &ns->slots[k]);
            else
                k++;
        }
    }
    for (uint32_t k = 0; k < r->n_bindings;) {
        binding *b = &r->bindings[k];
        const graph_edge *e = &g->edges[b->edge];
        /* Bindings of edges entering this loop from further out live on
         * for the next instance. */
        if (e->consumer > loop && e->consumer <= l->last && e->common_depth >= (int)p->depth &&
            prefix_eq(&b->key, p, p->depth)) {
            tvec_clear(rt, r, &b->parts);
            *b = r->bindings[--r->n_bindings];
        } else {
            k++;
        }
    }
}

static void loop_end(rt_runtime *rt, rt_request *r, int loop)
{
    const graph *g = r->g;
    const graph_entity *en = &g->entities[loop];
    loop_state *ls = &r->loops[loop];
    rt_iter p;
    reg_current_iter(r, loop, &p);
    ls->done = true;
    for (size_t k = 0; k < en->u.loop.n_body; k++) {
        int b = en->u.loop.body[k];
        if (g->entities[b].kind == GRAPH_NODE)
            close_window(rt, r, b, ls->cur);
    }
    for (size_t k = 0; k < en->n_values && !r->ended; k++) {
        int w = en->values[k];
        if (g->values[w].role == GRAPH_VALUE_LOOP_LAST) {
            tvec last = r->values[w].last;
            r->values[w].last = (tvec){0};
            for (uint32_t i = 0; i < last.n; i++)
                reg_emit(rt, r, w, &p, last.t[i], false);
            reg_emit(rt, r, w, &p, (rt_tensor){0, 0}, true);
            tvec_clear(rt, r, &last);
        } else {
            reg_emit(rt, r, w, &p, (rt_tensor){0, 0}, true);
        }
    }
    if (r->ended)
        return;
    loop_purge(rt, r, loop, &p);
    entity_completed(rt, r, loop);
}

static void loop_check(rt_runtime *rt, rt_request *r, int loop)
{
    const graph *g = r->g;
    const graph_entity *en = &g->entities[loop];
    loop_state *ls = &r->loops[loop];
    if (ls->done || r->ended)
        return;
    rt_iter v;
    reg_current_iter(r, loop, &v);
    v.v[v.depth++] = ls->cur;
    for (size_t k = 0; k < en->u.loop.n_body; k++) {
        int b = en->u.loop.body[k];
        if (g->entities[b].kind == GRAPH_NODE) {
            const node_state *ns = &r->nodes[b];
            if (!ns->done_valid || !rt__iter_eq(&ns->done_iter, &v))
                return;
        } else if (!r->loops[b].done) {
            return;
        }
    }
    if (ls->finish || ls->cur + 1 >= ls->max) {
        loop_end(rt, r, loop);
        return;
    }
    /* Next iteration: nested loops start again from 0, and whatever was
     * buffered for the new iteration becomes current. */
    ls->cur++;
    ls->finish = false;
    for (int i = loop + 1; i <= en->u.loop.last; i++)
        if (g->entities[i].kind == GRAPH_LOOP) {
            r->loops[i].cur = 0;
            r->loops[i].done = false;
            r->loops[i].finish = false;
        }
    reg_try_dispatch_range(rt, r, loop + 1, en->u.loop.last);
}

void reg_check_request_done(rt_runtime *rt, rt_request *r)
{
    const graph *g = r->g;
    if (r->ended)
        return;
    for (size_t k = 0; k < g->n_top; k++) {
        int e = g->top[k];
        if (g->entities[e].kind == GRAPH_NODE ? !r->nodes[e].done_valid : !r->loops[e].done)
            return;
    }
    rt__end(rt, r, BT_CODE_OK, "%s", "");
}

static void entity_completed(rt_runtime *rt, rt_request *r, int entity)
{
    int parent = r->g->entities[entity].parent_loop;
    if (parent >= 0)
        loop_check(rt, r, parent);
    else
        reg_check_request_done(rt, r);
}

void reg_request_free(rt_runtime *rt, rt_request *r)
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
