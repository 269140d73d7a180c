/* How a request moves on (DESIGN.md sections 4.2, 4.4, 4.6): completions,
 * chunks and failures of nodes, the finish signal, loop iterations that
 * end or advance, speculation windows (EXTEND, DROP, events buffered for
 * iterations the loop has not reached) and the end of the request.  The
 * state it works on — slots, bindings, productions — is registry.c's. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/runtime_internal.h"
#include "common/vec.h"

static void entity_completed(rt_runtime *rt, rt_request *r, int entity);

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
        if (ns->done_valid && reg_prefix_eq(&ns->done_iter, &ns->spec_iter, d) &&
            ns->done_iter.v[d] + 1 > from)
            from = ns->done_iter.v[d] + 1;
        emit_drop(rt, r, (int)i, &ns->spec_iter, from);
        ns->spec_active = false;
    }
}

static void pend_push(rt_runtime *rt, rt_request *r, int node, const pend *src)
{
    node_state *ns = &r->nodes[node];
    if (BT_RESERVE(ns->pend, ns->n_pend, ns->cap_pend, 4) < 0) {
        rt->oom = 1;
        return;
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
        reg_slot_remove(rt, r, node, s);
    ns->done_valid = true;
    ns->done_iter = *v;
    if (en->depth > 0) {
        loop_state *ls = &r->loops[en->parent_loop];
        uint32_t inner = v->v[v->depth - 1];
        if (ns->spec_active && reg_prefix_eq(&ns->spec_iter, v, v->depth - 1)) {
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
    } else if (reg_in_window(r, node, v) && !rt__iter_eq(&cur, v)) {
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
    } else if (reg_in_window(r, node, v) && !rt__iter_eq(&cur, v)) {
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
    } else if (reg_in_window(r, node, v) && !rt__iter_eq(&cur, v)) {
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
            if (reg_prefix_eq(&ns->slots[k].iter, p, p->depth))
                reg_slot_remove(rt, r, i, &ns->slots[k]);
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
            reg_prefix_eq(&b->key, p, p->depth)) {
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

