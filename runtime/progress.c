/* How a request moves on (runtime/progress.h): completions, chunks and
 * failures of nodes, the finish signal, loop iterations that end or
 * advance, and the end of the request. */
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/progress.h"
#include "runtime/registry.h"
#include "runtime/speculation.h"

static void entity_completed(rt_runtime *rt, rt_request *r, int entity);

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

static uint32_t add_sat(uint32_t a, uint32_t b)
{
    return a > UINT32_MAX - b ? UINT32_MAX : a + b;
}

static void process_done(rt_runtime *rt, rt_request *r, int node, const rt_iter *v,
                         const rt_value_out *outs, size_t n_outs, bool finish,
                         const rt_usage *usage)
{
    const graph *g = r->g;
    const graph_entity *en = &g->entities[node];
    const graph_node *n = &en->u.node;
    node_state *ns = &r->nodes[node];
    slot *s = rtc_slot_find(r, node, v);
    assert(s && s->state == SLOT_RUNNING);
    bool final_exec = !n->consumes_stream || s->stream_final_running;
    tvec_clear(rt, r, &s->stream_running);
    if (usage) {
        r->usage.prompt = add_sat(r->usage.prompt, usage->prompt);
        r->usage.generated = add_sat(r->usage.generated, usage->generated);
        r->usage.cached = add_sat(r->usage.cached, usage->cached);
    }

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
        s = rtc_slot_find(r, node, v);
        s->state = SLOT_WAITING;
        s->spec = false;
        reg_try_dispatch(rt, r, node, v);
        return;
    }
    for (size_t k = 0; k < en->n_values; k++) {
        int vi = en->values[k];
        const value_state *vs = &r->values[vi];
        bool made = (vs->open && rtc_iter_eq(&vs->iter, v) && vs->any) ||
                    (vs->closed && rtc_iter_eq(&vs->closed_iter, v));
        if (!made && value_needs_tensor(g, &g->values[vi])) {
            prog_end(rt, r, BT_CODE_INTERNAL, "node '%s' completed without its output '%s'",
                     en->name, g->values[vi].name);
            return;
        }
    }
    for (size_t k = 0; k < en->n_values && !r->ended; k++)
        reg_emit(rt, r, en->values[k], v, (rt_tensor){0, 0}, true);
    if (r->ended)
        return;
    s = rtc_slot_find(r, node, v);
    if (s)
        rtc_slot_remove(rt, r, node, s);
    ns->done_valid = true;
    ns->done_iter = *v;
    spec_advance(rt, r, node, v);
    entity_completed(rt, r, node);
}

void prog_node_done(rt_runtime *rt, rt_request *r, int node, const rt_iter *v,
                    const rt_value_out *outs, size_t n_outs, bool finish, const rt_usage *usage)
{
    /* A temporary hold on every tensor of the event: whatever no consumer
     * takes is released when the hold goes. */
    for (size_t i = 0; i < n_outs; i++)
        rtc_ref(rt, r, outs[i].tensor);
    rt_iter cur;
    rtc_current_iter(r, node, &cur);
    slot *s = rtc_slot_find(r, node, v);
    if (s && s->state == SLOT_RUNNING && rtc_iter_eq(&cur, v)) {
        process_done(rt, r, node, v, outs, n_outs, finish, usage);
    } else if (spec_in_window(r, node, v) && !rtc_iter_eq(&cur, v)) {
        pend p = {.kind = PEND_DONE, .iter = *v, .finish = finish};
        if (usage)
            p.usage = *usage;
        p.outs = malloc((n_outs + 1) * sizeof(*p.outs));
        if (p.outs) {
            if (n_outs)
                memcpy(p.outs, outs, n_outs * sizeof(*outs));
            p.n_outs = (uint32_t)n_outs;
            spec_pend_push(rt, r, node, &p);
        } else {
            rt->oom = 1;
        }
    }
    for (size_t i = 0; i < n_outs; i++)
        rtc_unref(rt, r, outs[i].tensor);
}

void prog_node_chunk(rt_runtime *rt, rt_request *r, int node, const rt_iter *v, int value,
                     rt_tensor t, bool final)
{
    rtc_ref(rt, r, t);
    rt_iter cur;
    rtc_current_iter(r, node, &cur);
    slot *s = rtc_slot_find(r, node, v);
    if (s && s->state == SLOT_RUNNING && rtc_iter_eq(&cur, v)) {
        value_state *vs = &r->values[value];
        if (!vs->open && !(vs->closed && rtc_iter_eq(&vs->closed_iter, v))) {
            vs->open = true;
            vs->iter = *v;
            vs->any = false;
        }
        if (vs->open)
            vs->any = true; /* an empty chunk still counts as the stream's word */
        reg_emit(rt, r, value, v, t, final);
    } else if (spec_in_window(r, node, v) && !rtc_iter_eq(&cur, v)) {
        pend p = {.kind = PEND_CHUNK, .iter = *v, .value = value, .tensor = t, .final = final};
        spec_pend_push(rt, r, node, &p);
    }
    rtc_unref(rt, r, t);
}

void prog_node_failed(rt_runtime *rt, rt_request *r, int node, const rt_iter *v,
                      bt_code code, const char *message)
{
    rt_iter cur;
    rtc_current_iter(r, node, &cur);
    slot *s = rtc_slot_find(r, node, v);
    if (s && s->state == SLOT_RUNNING && rtc_iter_eq(&cur, v)) {
        prog_end(rt, r, code, "node '%s' failed: %s", r->g->entities[node].name, message);
    } else if (spec_in_window(r, node, v) && !rtc_iter_eq(&cur, v)) {
        /* A speculative iteration failed: it matters only if the loop
         * reaches it. */
        pend p = {.kind = PEND_FAIL, .iter = *v, .code = code, .message = strdup(message)};
        if (!p.message)
            rt->oom = 1;
        else
            spec_pend_push(rt, r, node, &p);
    }
}

void prog_replay(rt_runtime *rt, rt_request *r, int node, const rt_iter *v)
{
    node_state *ns = &r->nodes[node];
    for (uint32_t i = 0; i < ns->n_pend && !r->ended;) {
        if (!rtc_iter_eq(&ns->pend[i].iter, v)) {
            i++;
            continue;
        }
        pend p = ns->pend[i];
        memmove(&ns->pend[i], &ns->pend[i + 1], (ns->n_pend - i - 1) * sizeof(pend));
        ns->n_pend--;
        switch (p.kind) {
        case PEND_DONE:
            prog_node_done(rt, r, node, v, p.outs, p.n_outs, p.finish, &p.usage);
            for (uint32_t k = 0; k < p.n_outs; k++)
                rtc_unref(rt, r, p.outs[k].tensor);
            break;
        case PEND_CHUNK:
            prog_node_chunk(rt, r, node, v, p.value, p.tensor, p.final);
            rtc_unref(rt, r, p.tensor);
            break;
        case PEND_FAIL:
            prog_end(rt, r, p.code, "node '%s' failed: %s", r->g->entities[node].name,
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
            if (rtc_prefix_eq(&ns->slots[k].iter, p, p->depth))
                rtc_slot_remove(rt, r, i, &ns->slots[k]);
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
            rtc_prefix_eq(&b->key, p, p->depth)) {
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
    rtc_current_iter(r, loop, &p);
    ls->done = true;
    for (size_t k = 0; k < en->u.loop.n_body; k++) {
        int b = en->u.loop.body[k];
        if (g->entities[b].kind == GRAPH_NODE)
            spec_close(rt, r, b, ls->cur);
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
    rtc_current_iter(r, loop, &v);
    v.v[v.depth++] = ls->cur;
    for (size_t k = 0; k < en->u.loop.n_body; k++) {
        int b = en->u.loop.body[k];
        if (g->entities[b].kind == GRAPH_NODE) {
            const node_state *ns = &r->nodes[b];
            if (!ns->done_valid || !rtc_iter_eq(&ns->done_iter, &v))
                return;
        } else if (!r->loops[b].done) {
            return;
        }
    }
    if (ls->finish || ls->cur + 1 >= ls->max) {
        ls->ended = ls->finish ? RT_LOOP_FINISH : RT_LOOP_MAX_ITERS;
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

static void check_request_done(rt_runtime *rt, rt_request *r)
{
    const graph *g = r->g;
    if (r->ended)
        return;
    for (size_t k = 0; k < g->n_top; k++) {
        int e = g->top[k];
        if (g->entities[e].kind == GRAPH_NODE ? !r->nodes[e].done_valid : !r->loops[e].done)
            return;
    }
    prog_end(rt, r, BT_CODE_OK, "%s", "");
}

static void entity_completed(rt_runtime *rt, rt_request *r, int entity)
{
    int parent = r->g->entities[entity].parent_loop;
    if (parent >= 0)
        loop_check(rt, r, parent);
    else
        check_request_done(rt, r);
}

/* ---- the end ------------------------------------------------------------ */

void prog_end(rt_runtime *rt, rt_request *r, bt_code code, const char *fmt, ...)
{
    if (r->ended)
        return;
    r->ended = true;
    rt_action *a = rtc_push(rt, RT_RESPONSE, r);
    if (a) {
        a->u.response.code = code;
        char *msg = NULL;
        va_list ap;
        va_start(ap, fmt);
        if (vasprintf(&msg, fmt, ap) < 0)
            msg = NULL;
        va_end(ap);
        size_t len = msg ? strlen(msg) : 0;
        a->u.response.message = rtc_alloc(rt, len + 1);
        if (a->u.response.message) {
            memcpy(a->u.response.message, msg ? msg : "", len);
            a->u.response.message[len] = 0;
        }
        free(msg);
        a->u.response.usage = r->usage;
        a->u.response.loop_ends = rtc_alloc(rt, r->g->n_entities + 1);
        for (size_t e = 0; a->u.response.loop_ends && e < r->g->n_entities; e++)
            a->u.response.loop_ends[e] =
                r->g->entities[e].kind == GRAPH_LOOP ? r->loops[e].ended : 0;
        /* Outputs only on success: a failed request's partial values would
         * mislead more than help. */
        if (code == BT_CODE_OK && r->n_outs) {
            rt_output *o = rtc_alloc(rt, r->n_outs * sizeof(*o));
            if (o) {
                for (uint32_t i = 0; i < r->n_outs; i++) {
                    o[i].name = r->outs[i].name;
                    o[i].modality = r->outs[i].modality;
                    o[i].value.n = r->outs[i].parts.n;
                    o[i].value.t = rtc_alloc(rt, (r->outs[i].parts.n + 1) * sizeof(rt_tensor));
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
    spec_drop_all(rt, r);
    /* Every tensor still referenced goes back now, whatever holds it. */
    rtc_release_all(rt, r);
    rtc_request_retire(rt, r);
}
