/* Delivery of values along edges, readiness and dispatch
 * (runtime/registry.h).
 *
 * Values travel as "productions": a producer's execution emits a value as
 * a sequence of chunks closed by a final mark.  Stream edges and new_token
 * client edges take each chunk as it comes; every other edge takes the
 * joined chunks when the production closes.  A plain completion is the
 * one-chunk case, so nodes, stream consumers and loops share one path. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"
#include "runtime/registry.h"
#include "runtime/speculation.h"

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
        binding *b = rtc_binding_find(r, ei, &t, (uint32_t)e->common_depth);
        assert(!b);
        if (b)
            return;
        b = rtc_binding_add(rt, r, ei, &t);
        if (!b)
            return;
        for (uint32_t i = 0; i < parts->n; i++)
            tvec_push(rt, r, &b->parts, parts->t[i]);
        /* The consumer may be waiting in its current iteration. */
        rt_iter cur;
        rtc_current_iter(r, e->consumer, &cur);
        reg_try_dispatch(rt, r, e->consumer, &cur);
        return;
    }
    slot *s = rtc_slot_get(rt, r, e->consumer, &t);
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
    slot *s = rtc_slot_get(rt, r, e->consumer, &target);
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
        if (BT_RESERVE(r->outs, r->n_outs, r->cap_outs, 4) < 0) {
            rt->oom = 1;
            return;
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
    rt_action *a = rtc_push(rt, RT_CHUNK, r);
    if (!a)
        return;
    a->u.chunk.seq = r->seq++;
    a->u.chunk.name = e->client_name;
    a->u.chunk.modality = e->modality;
    a->u.chunk.tensor = t;
    a->u.chunk.node = gv->producer;
    a->u.chunk.iter = *p;
    a->u.chunk.usage = r->usage;
}

void reg_emit(rt_runtime *rt, rt_request *r, int vi, const rt_iter *p, rt_tensor t, bool final)
{
    const graph *g = r->g;
    const graph_value *gv = &g->values[vi];
    value_state *vs = &r->values[vi];
    if (r->ended)
        return;
    if (!vs->open) {
        if (vs->closed && rtc_iter_eq(&vs->closed_iter, p))
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
                    out_append(rt, r, e->client_name, e->modality, t);
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
                out_append(rt, r, e->client_name, e->modality, (rt_tensor){0, 0});
                for (uint32_t i = 0; i < vs->parts.n; i++)
                    out_append(rt, r, e->client_name, e->modality, vs->parts.t[i]);
            } else if (!r->stream) {
                /* A client value that produced nothing still appears. */
                out_append(rt, r, e->client_name, e->modality, (rt_tensor){0, 0});
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
            if (!rtc_binding_find(r, ei, v, (uint32_t)e->common_depth))
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
    dst->t = rtc_alloc(rt, (src->n + 1) * sizeof(rt_tensor));
    if (dst->t && src->n)
        memcpy(dst->t, src->t, src->n * sizeof(rt_tensor));
    else
        dst->n = 0;
}

static void build_dispatch(rt_runtime *rt, rt_request *r, int node, slot *s, const rt_iter *v)
{
    const graph *g = r->g;
    const graph_node *n = &g->entities[node].u.node;
    rt_action *a = rtc_push(rt, RT_DISPATCH, r);
    if (!a)
        return;
    a->u.dispatch.node = node;
    a->u.dispatch.iter = *v;
    a->u.dispatch.client_values = rt->gx[r->graph_index].client_values;
    a->u.dispatch.n_inputs = (uint32_t)n->n_inputs;
    rt_input *ins = rtc_alloc(rt, (n->n_inputs + 1) * sizeof(*ins));
    a->u.dispatch.inputs = ins;
    if (!ins)
        goto err;
    for (size_t k = 0; k < n->n_inputs; k++) {
        const graph_input *in = &n->inputs[k];
        rt_input *di = &ins[k];
        memset(di, 0, sizeof(*di));
        di->input = (uint32_t)k;
        di->parts = rtc_alloc(rt, (in->n_edges + 1) * sizeof(*di->parts));
        if (!di->parts)
            goto err;
        if (in->graph_input >= 0) {
            /* Actions outlive the request when it ends in the same batch:
             * copy, never point into request state. */
            di->n_parts = 1;
            di->parts[0].t = rtc_alloc(rt, sizeof(rt_tensor));
            if (!di->parts[0].t)
                goto err;
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
                          &rtc_binding_find(r, ei, v, (uint32_t)e->common_depth)->parts);
            else
                copy_tvec(rt, &di->parts[di->n_parts++],
                          &s->parts[rt->gx[r->graph_index].edge_pos[ei]]);
        }
    }
    if (rt->oom)
        goto err;
    a->u.dispatch.spec_upto = spec_grant(rt, r, node, v);
    return;
err:
    /* A dispatch missing some of its inputs must not reach a worker (the
     * conductor would read the inputs it lacks): it is taken back.  The
     * failed allocation set rt->oom, so the event ends every request with
     * RESOURCE_EXHAUSTED (after_event). */
    assert(rt->oom && a == &rt->actions[rt->n_actions - 1]);
    rt->n_actions--;
}

void reg_try_dispatch(rt_runtime *rt, rt_request *r, int node, const rt_iter *v)
{
    if (r->ended)
        return;
    const graph_entity *en = &r->g->entities[node];
    rt_iter cur;
    rtc_current_iter(r, node, &cur);
    if (!rtc_iter_eq(&cur, v))
        return; /* buffered for a later iteration */
    for (int k = 0; k < en->depth; k++)
        if (r->loops[en->loops[k]].done)
            return;
    node_state *ns = &r->nodes[node];
    if (ns->done_valid && rtc_iter_eq(&ns->done_iter, v))
        return;
    slot *s = rtc_slot_get(rt, r, node, v);
    if (!s || s->state == SLOT_RUNNING)
        return;
    for (size_t k = 0; k < en->u.node.n_inputs; k++)
        if (!input_ready(rt, r, node, s, v, k))
            return;
    s->state = SLOT_RUNNING;
    if (spec_in_window(r, node, v)) {
        /* The worker is already running this iteration on its own; what it
         * reported early is replayed once this event is over. */
        s->spec = true;
        rtc_replay_push(rt, r, node, v);
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
        rtc_current_iter(r, i, &v);
        reg_try_dispatch(rt, r, i, &v);
    }
}
