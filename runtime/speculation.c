/* Speculation windows and the events buffered inside them
 * (runtime/speculation.h). */
#include <stdlib.h>

#include "common/vec.h"
#include "runtime/speculation.h"

bool spec_in_window(const rt_request *r, int node, const rt_iter *v)
{
    const node_state *ns = &r->nodes[node];
    if (!ns->spec_active || v->depth == 0)
        return false;
    uint32_t d = v->depth - 1;
    return rtc_prefix_eq(&ns->spec_iter, v, d) && v->v[d] > ns->spec_iter.v[d] &&
           v->v[d] <= ns->spec_upto;
}

/* The furthest iteration a window from INNER may reach in a loop of MAX
 * iterations. */
static uint32_t window_end(const rt_runtime *rt, uint32_t inner, uint32_t max)
{
    uint64_t want = (uint64_t)inner + rt->opt.speculation_window;
    return want < max - 1 ? (uint32_t)want : max - 1;
}

uint32_t spec_grant(rt_runtime *rt, rt_request *r, int node, const rt_iter *v)
{
    const graph *g = r->g;
    node_state *ns = &r->nodes[node];
    ns->spec_active = false;
    if (!g->entities[node].u.node.speculative || rt->opt.speculation_window == 0)
        return 0;
    const loop_state *ls = &r->loops[g->entities[node].parent_loop];
    if (ls->finish)
        return 0;
    uint32_t inner = v->v[v->depth - 1];
    uint32_t upto = window_end(rt, inner, ls->max);
    if (upto <= inner)
        return 0;
    ns->spec_active = true;
    ns->spec_iter = *v;
    ns->spec_upto = upto;
    return upto;
}

static void pend_clear(rt_runtime *rt, rt_request *r, node_state *ns)
{
    for (uint32_t i = 0; i < ns->n_pend; i++) {
        pend *p = &ns->pend[i];
        for (uint32_t k = 0; k < p->n_outs; k++)
            rtc_unref(rt, r, p->outs[k].tensor);
        if (p->kind == PEND_CHUNK)
            rtc_unref(rt, r, p->tensor);
        free(p->outs);
        free(p->message);
    }
    ns->n_pend = 0;
}

static void emit_drop(rt_runtime *rt, rt_request *r, int node, const rt_iter *prefix,
                      uint32_t from)
{
    rt_action *a = rtc_push(rt, RT_DROP, r);
    if (!a)
        return;
    a->u.drop.node = node;
    a->u.drop.from = *prefix;
    a->u.drop.from.v[prefix->depth - 1] = from;
}

void spec_close(rt_runtime *rt, rt_request *r, int node, uint32_t last)
{
    node_state *ns = &r->nodes[node];
    if (!ns->spec_active)
        return;
    if (ns->spec_upto > last)
        emit_drop(rt, r, node, &ns->spec_iter, last + 1);
    ns->spec_active = false;
    pend_clear(rt, r, ns);
}

void spec_advance(rt_runtime *rt, rt_request *r, int node, const rt_iter *v)
{
    const graph_entity *en = &r->g->entities[node];
    node_state *ns = &r->nodes[node];
    if (en->depth == 0 || !ns->spec_active || !rtc_prefix_eq(&ns->spec_iter, v, v->depth - 1))
        return;
    const loop_state *ls = &r->loops[en->parent_loop];
    uint32_t inner = v->v[v->depth - 1];
    /* The loop ends with this iteration (finish here or from another body
     * node): nothing past it is worth running. */
    if (ls->finish || inner + 1 >= ls->max) {
        spec_close(rt, r, node, inner);
        return;
    }
    /* Keep the worker up to `speculation_window` iterations ahead, but
     * widen the window only once half of it is used (or the loop's last
     * iteration comes into reach): an Extend per accepted iteration would
     * cost a message each way per token, where one per half window lets the
     * worker report its iterations in bursts. */
    uint32_t upto = window_end(rt, inner, ls->max);
    uint32_t half = (rt->opt.speculation_window + 1) / 2;
    if (upto <= ns->spec_upto || (upto < ls->max - 1 && upto - ns->spec_upto < half))
        return;
    ns->spec_upto = upto;
    rt_action *a = rtc_push(rt, RT_EXTEND, r);
    if (a) {
        a->u.extend.node = node;
        a->u.extend.iter = *v;
        a->u.extend.upto = upto;
    }
}

void spec_drop_all(rt_runtime *rt, rt_request *r)
{
    const graph *g = r->g;
    for (size_t i = 0; i < g->n_entities; i++) {
        node_state *ns = &r->nodes[i];
        if (g->entities[i].kind != GRAPH_NODE || !ns->spec_active)
            continue;
        /* Everything the conductor has not processed is void. */
        uint32_t d = ns->spec_iter.depth - 1;
        uint32_t from = ns->spec_iter.v[d];
        if (ns->done_valid && rtc_prefix_eq(&ns->done_iter, &ns->spec_iter, d) &&
            ns->done_iter.v[d] + 1 > from)
            from = ns->done_iter.v[d] + 1;
        emit_drop(rt, r, (int)i, &ns->spec_iter, from);
        ns->spec_active = false;
    }
}

void spec_pend_push(rt_runtime *rt, rt_request *r, int node, const pend *src)
{
    node_state *ns = &r->nodes[node];
    if (BT_RESERVE(ns->pend, ns->n_pend, ns->cap_pend, 4) < 0) {
        rt->oom = 1;
        return;
    }
    pend *p = &ns->pend[ns->n_pend++];
    *p = *src;
    for (uint32_t k = 0; k < p->n_outs; k++)
        rtc_ref(rt, r, p->outs[k].tensor);
    if (p->kind == PEND_CHUNK)
        rtc_ref(rt, r, p->tensor);
}
