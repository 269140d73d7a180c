#include "tests/unit/rt_harness.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"

/* Allocation failures that a test injects (tests/unit/failalloc.h) are
 * meant for the runtime, not for the harness playing the workers: when
 * failalloc.o is linked in, the harness holds them off around its own
 * allocations.  Weak, so that the other tests link without it. */
void fa_hold(bool on) __attribute__((weak));

static void *h_calloc(size_t n, size_t size)
{
    if (fa_hold)
        fa_hold(true);
    void *p = calloc(n, size);
    if (fa_hold)
        fa_hold(false);
    return p;
}

static void *h_realloc(void *old, size_t size)
{
    if (fa_hold)
        fa_hold(true);
    void *p = realloc(old, size);
    if (fa_hold)
        fa_hold(false);
    return p;
}

typedef struct h_round {
    uint64_t req;
    int node;
    rt_iter iter;
    int count;
} h_round;

/* The harness's speculation chains: what a worker runs on its own. */
typedef struct h_chain {
    uint64_t req;
    int node;
    rt_iter last;     /* last iteration completed on the "worker" */
    bool have_last;
    uint32_t upto;
    bool active;
} h_chain;

static h_round rounds[4096];
static size_t n_rounds;
static h_chain chains[256];
static size_t n_chains;

static void failf(harness *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failf(harness *h, const char *fmt, ...)
{
    if (h->failure[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->failure, sizeof(h->failure), fmt, ap);
    va_end(ap);
}

harness *h_create(const char *yaml, uint32_t window)
{
    harness *h = h_calloc(1, sizeof(*h));
    if (!h)
        abort();
    bt_diag *d = bt_diag_create("test.yaml");
    int rc = cfg_load_string(yaml, strlen(yaml), "test.yaml", d, &h->cfg);
    if (rc == 0)
        rc = graph_set_build(h->cfg, d, &h->gs);
    if (rc != 0) {
        bt_diag_print(d, stderr);
        fprintf(stderr, "harness: test graph is invalid\n%s\n", yaml);
        abort();
    }
    bt_diag_destroy(d);
    rt_options opt = {.speculation_window = window};
    h->rt = rt_create(h->gs, &opt);
    h->g = &h->gs->graphs[0];
    h->lost_worker = -1;
    n_rounds = 0;
    n_chains = 0;
    return h;
}

void h_destroy(harness *h)
{
    if (!h)
        return;
    rt_destroy(h->rt);
    graph_set_destroy(h->gs);
    cfg_config_destroy(h->cfg);
    free(h->tensors);
    free(h->inflight);
    free(h->responses);
    free(h);
}

int h_node(const harness *h, const char *name)
{
    int e = graph_entity_find(h->g, name);
    if (e < 0) {
        fprintf(stderr, "harness: no entity '%s'\n", name);
        abort();
    }
    return e;
}

int h_value(const harness *h, const char *node, const char *value)
{
    int e = h_node(h, node);
    const graph_entity *en = &h->g->entities[e];
    for (size_t k = 0; k < en->n_values; k++)
        if (strcmp(h->g->values[en->values[k]].name, value) == 0)
            return en->values[k];
    fprintf(stderr, "harness: node '%s' has no value '%s'\n", node, value);
    abort();
}

rt_iter h_iter(int depth, ...)
{
    rt_iter it = {0};
    va_list ap;
    va_start(ap, depth);
    it.depth = (uint32_t)depth;
    for (int k = 0; k < depth; k++)
        it.v[k] = va_arg(ap, unsigned);
    va_end(ap);
    return it;
}

rt_tensor h_tensor_new(harness *h, int worker, const char *label)
{
    if (h->n_tensors == h->cap_tensors) {
        h->cap_tensors = h->cap_tensors ? h->cap_tensors * 2 : 256;
        h->tensors = h_realloc(h->tensors, h->cap_tensors * sizeof(*h->tensors));
        if (!h->tensors)
            abort();
    }
    h_tensor *t = &h->tensors[h->n_tensors++];
    memset(t, 0, sizeof(*t));
    snprintf(t->label, sizeof(t->label), "%s", label);
    t->worker = worker < 0 ? 0 : worker;
    return (rt_tensor){h->n_tensors, t->worker};
}

static h_tensor *tensor_of(harness *h, rt_tensor t)
{
    if (t.id == 0 || t.id > h->n_tensors)
        return NULL;
    return &h->tensors[t.id - 1];
}

static void iter_label(const rt_iter *it, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = 0;
    for (uint32_t k = 0; k < it->depth && off < len; k++)
        off += (size_t)snprintf(buf + off, len - off, "%s%u", k ? "," : "@", it->v[k]);
}

static void cat(char *dst, size_t len, const char *s)
{
    size_t n = strlen(dst);
    if (n < len - 1)
        snprintf(dst + n, len - n, "%s", s);
}

static h_dispatch *push_inflight(harness *h)
{
    if (h->n_inflight == h->cap_inflight) {
        h->cap_inflight = h->cap_inflight ? h->cap_inflight * 2 : 64;
        h->inflight = h_realloc(h->inflight, h->cap_inflight * sizeof(*h->inflight));
        if (!h->inflight)
            abort();
    }
    h_dispatch *d = &h->inflight[h->n_inflight++];
    memset(d, 0, sizeof(*d));
    return d;
}

static h_chain *chain_of(uint64_t req, int node)
{
    for (size_t i = 0; i < n_chains; i++)
        if (chains[i].req == req && chains[i].node == node)
            return &chains[i];
    return NULL;
}

static void add_virtual(harness *h, uint64_t req, int node, const rt_iter *it, uint32_t upto)
{
    h_dispatch *d = push_inflight(h);
    d->req = req;
    d->node = node;
    d->iter = *it;
    d->spec_upto = upto;
    d->virtual_ = true;
}

static void record_dispatch(harness *h, const rt_action *a)
{
    const graph_entity *en = &h->g->entities[a->u.dispatch.node];
    if (en->u.node.n_inputs > H_MAX_INPUTS) {
        failf(h, "test graph has too many inputs");
        return;
    }
    for (size_t i = 0; i < h->n_inflight; i++) {
        h_dispatch *o = &h->inflight[i];
        if (o->req == a->req && o->node == a->u.dispatch.node && !o->virtual_ &&
            o->iter.depth == a->u.dispatch.iter.depth &&
            memcmp(o->iter.v, a->u.dispatch.iter.v, sizeof(uint32_t) * o->iter.depth) == 0)
            failf(h, "node %s dispatched twice for one iteration", en->name);
    }
    h_dispatch *d = push_inflight(h);
    d->req = a->req;
    d->node = a->u.dispatch.node;
    d->iter = a->u.dispatch.iter;
    d->spec_upto = a->u.dispatch.spec_upto;
    h->n_dispatch_total++;
    for (uint32_t k = 0; k < a->u.dispatch.n_inputs; k++) {
        const rt_input *in = &a->u.dispatch.inputs[k];
        if (in->stream && in->stream_final)
            d->stream_final = true;
        for (uint32_t p = 0; p < in->n_parts; p++) {
            if (p)
                cat(d->inputs[k], H_LABEL, "|");
            for (uint32_t c = 0; c < in->parts[p].n; c++) {
                rt_tensor t = in->parts[p].t[c];
                h_tensor *ht = tensor_of(h, t);
                if (!ht || ht->released)
                    failf(h, "dispatch of %s names a %s tensor %llu", en->name,
                          ht ? "released" : "unknown", (unsigned long long)t.id);
                if (c)
                    cat(d->inputs[k], H_LABEL, ",");
                cat(d->inputs[k], H_LABEL, ht ? ht->label : "?");
                if (d->n_in_ids < 64)
                    d->in_ids[d->n_in_ids++] = t;
            }
        }
    }
    if (d->spec_upto) {
        h_chain *c = chain_of(d->req, d->node);
        if (!c && n_chains < 256)
            c = &chains[n_chains++];
        if (c) {
            memset(c, 0, sizeof(*c));
            c->req = d->req;
            c->node = d->node;
            c->upto = d->spec_upto;
            c->active = true;
        }
    }
}

static h_response *response_slot(harness *h, uint64_t req)
{
    for (size_t i = 0; i < h->n_responses; i++)
        if (h->responses[i].req == req)
            return &h->responses[i];
    if (h->n_responses == h->cap_responses) {
        h->cap_responses = h->cap_responses ? h->cap_responses * 2 : 16;
        h->responses = h_realloc(h->responses, h->cap_responses * sizeof(*h->responses));
        if (!h->responses)
            abort();
    }
    h_response *r = &h->responses[h->n_responses++];
    memset(r, 0, sizeof(*r));
    r->req = req;
    return r;
}

void h_pump(harness *h)
{
    size_t n;
    const rt_action *as = rt_actions(h->rt, &n);
    static int trace = -1;
    if (trace < 0)
        trace = getenv("BATON_TRACE") != NULL;
    for (size_t i = 0; i < n; i++) {
        const rt_action *a = &as[i];
        if (trace) {
            char it[64] = "";
            if (a->kind == RT_DISPATCH)
                iter_label(&a->u.dispatch.iter, it, sizeof(it));
            fprintf(stderr, "  action %s req %llu %s%s%s\n", rt_action_kind_name(a->kind),
                    (unsigned long long)a->req,
                    a->kind == RT_DISPATCH ? h->g->entities[a->u.dispatch.node].name
                    : a->kind == RT_RELEASE ? (tensor_of(h, a->u.release)
                                                   ? tensor_of(h, a->u.release)->label : "?")
                    : a->kind == RT_RESPONSE ? a->u.response.message : "",
                    it, a->kind == RT_DISPATCH && a->u.dispatch.spec_upto ? " (window)" : "");
        }
        switch (a->kind) {
        case RT_DISPATCH:
            if (h_response_of(h, a->req))
                failf(h, "dispatch after the response of request %llu",
                      (unsigned long long)a->req);
            record_dispatch(h, a);
            break;
        case RT_EXTEND: {
            h->n_extends++;
            h_chain *c = chain_of(a->req, a->u.extend.node);
            if (!c || !c->active)
                break;
            if (a->u.extend.upto <= c->upto)
                failf(h, "EXTEND does not extend (%u <= %u)", a->u.extend.upto, c->upto);
            c->upto = a->u.extend.upto;
            bool running = false;
            for (size_t k = 0; k < h->n_inflight; k++)
                if (h->inflight[k].req == a->req && h->inflight[k].node == a->u.extend.node)
                    running = true;
            if (!running && c->have_last) {
                rt_iter next = c->last;
                next.v[next.depth - 1]++;
                if (next.v[next.depth - 1] <= c->upto)
                    add_virtual(h, a->req, a->u.extend.node, &next, c->upto);
            }
            break;
        }
        case RT_DROP: {
            h->n_drops++;
            char it[64];
            iter_label(&a->u.drop.from, it, sizeof(it));
            snprintf(h->last_drop, sizeof(h->last_drop), "%s%s",
                     h->g->entities[a->u.drop.node].name, it);
            h_chain *c = chain_of(a->req, a->u.drop.node);
            if (c)
                c->active = false;
            uint32_t d = a->u.drop.from.depth - 1;
            for (size_t k = 0; k < h->n_inflight;) {
                h_dispatch *x = &h->inflight[k];
                if (x->req == a->req && x->node == a->u.drop.node && x->virtual_ &&
                    x->iter.v[d] >= a->u.drop.from.v[d] &&
                    !(h->drop_race && (h->drop_count++ & 1))) {
                    h->inflight[k] = h->inflight[--h->n_inflight];
                } else {
                    k++;
                }
            }
            break;
        }
        case RT_RELEASE: {
            h_tensor *t = tensor_of(h, a->u.release);
            if (!t) {
                failf(h, "release of unknown tensor %llu", (unsigned long long)a->u.release.id);
            } else if (t->released) {
                failf(h, "tensor %s released twice", t->label);
            } else if (t->lost) {
                failf(h, "tensor %s of a lost worker released", t->label);
            } else {
                t->released = true;
                for (size_t k = 0; k < h->n_inflight; k++) {
                    const h_dispatch *x = &h->inflight[k];
                    if (h_response_of(h, x->req))
                        continue;
                    for (size_t j = 0; j < x->n_in_ids; j++)
                        if (x->in_ids[j].id == a->u.release.id)
                            failf(h, "tensor %s released while %s still runs on it", t->label,
                                  h->g->entities[x->node].name);
                }
            }
            break;
        }
        case RT_CHUNK: {
            if (h_response_of(h, a->req))
                failf(h, "chunk after the response");
            uint64_t *want = a->req < 256 ? &h->next_seq[a->req] : NULL;
            if (want && a->u.chunk.seq != (*want)++)
                failf(h, "chunk seq %llu out of order", (unsigned long long)a->u.chunk.seq);
            h_tensor *t = tensor_of(h, a->u.chunk.tensor);
            if (!t || t->released)
                failf(h, "chunk names a released or unknown tensor");
            char buf[160];
            snprintf(buf, sizeof(buf), "%s%llu:%s", h->chunks[0] ? " " : "",
                     (unsigned long long)a->u.chunk.seq, t ? t->label : "?");
            cat(h->chunks, sizeof(h->chunks), buf);
            if (h->chunk_names[0])
                cat(h->chunk_names, sizeof(h->chunk_names), " ");
            cat(h->chunk_names, sizeof(h->chunk_names), a->u.chunk.name);
            break;
        }
        case RT_RESPONSE: {
            h_response *r = response_slot(h, a->req);
            if (++r->count > 1)
                failf(h, "request %llu got %d responses", (unsigned long long)a->req, r->count);
            r->code = a->u.response.code;
            snprintf(r->message, sizeof(r->message), "%s", a->u.response.message);
            r->outputs[0] = 0;
            for (uint32_t k = 0; k < a->u.response.n_outputs; k++) {
                const rt_output *o = &a->u.response.outputs[k];
                if (k)
                    cat(r->outputs, sizeof(r->outputs), ";");
                cat(r->outputs, sizeof(r->outputs), o->name);
                cat(r->outputs, sizeof(r->outputs), "=");
                for (uint32_t c = 0; c < o->value.n; c++) {
                    h_tensor *t = tensor_of(h, o->value.t[c]);
                    if (!t || t->released)
                        failf(h, "response names a released tensor");
                    if (c)
                        cat(r->outputs, sizeof(r->outputs), ",");
                    cat(r->outputs, sizeof(r->outputs), t ? t->label : "?");
                }
            }
            break;
        }
        }
    }
    rt_actions_clear(h->rt);
}

int h_start(harness *h, uint64_t req, bool stream, const char *max_iters_loop, uint32_t cap)
{
    rt_tensor ins[16];
    for (size_t k = 0; k < h->g->n_inputs && k < 16; k++) {
        char label[96];
        snprintf(label, sizeof(label), "in.%s", h->g->inputs[k]);
        ins[k] = h_tensor_new(h, 0, label);
    }
    uint32_t *mi = NULL;
    if (max_iters_loop) {
        mi = h_calloc(h->g->n_entities, sizeof(*mi));
        mi[h_node(h, max_iters_loop)] = cap;
    }
    int rc = rt_request_start(h->rt, req, 0, ins, stream, mi);
    free(mi);
    h_pump(h);
    return rc;
}

static bool iter_eq(const rt_iter *a, const rt_iter *b)
{
    return a->depth == b->depth && memcmp(a->v, b->v, a->depth * sizeof(uint32_t)) == 0;
}

h_dispatch *h_find(harness *h, uint64_t req, const char *node, const rt_iter *iter)
{
    int n = h_node(h, node);
    for (size_t i = 0; i < h->n_inflight; i++)
        if (h->inflight[i].req == req && h->inflight[i].node == n &&
            iter_eq(&h->inflight[i].iter, iter))
            return &h->inflight[i];
    return NULL;
}

h_dispatch *h_find_node(harness *h, uint64_t req, const char *node)
{
    int n = h_node(h, node);
    for (size_t i = 0; i < h->n_inflight; i++)
        if (h->inflight[i].req == req && h->inflight[i].node == n)
            return &h->inflight[i];
    return NULL;
}

size_t h_count_inflight(const harness *h, uint64_t req)
{
    size_t c = 0;
    for (size_t i = 0; i < h->n_inflight; i++)
        c += h->inflight[i].req == req;
    return c;
}

static int round_of(uint64_t req, int node, const rt_iter *it)
{
    for (size_t i = 0; i < n_rounds; i++)
        if (rounds[i].req == req && rounds[i].node == node && iter_eq(&rounds[i].iter, it))
            return rounds[i].count++;
    if (n_rounds < 4096)
        rounds[n_rounds++] = (h_round){req, node, *it, 1};
    return 0;
}

static void take(harness *h, h_dispatch *d, h_dispatch *out)
{
    *out = *d;
    *d = h->inflight[--h->n_inflight];
}

void h_complete_skip(harness *h, h_dispatch *dp, bool finish, const char *skip)
{
    h_dispatch d;
    take(h, dp, &d);
    const graph_entity *en = &h->g->entities[d.node];
    rt_value_out outs[16];
    size_t n = 0;
    char it[64], label[96];
    iter_label(&d.iter, it, sizeof(it));
    int round = round_of(d.req, d.node, &d.iter);
    for (size_t k = 0; k < en->n_values && n < 16; k++) {
        const graph_value *v = &h->g->values[en->values[k]];
        if (skip && strcmp(v->name, skip) == 0)
            continue;
        if (round)
            snprintf(label, sizeof(label), "%s%s#%d.%s", en->name, it, round, v->name);
        else
            snprintf(label, sizeof(label), "%s%s.%s", en->name, it, v->name);
        outs[n].value = en->values[k];
        outs[n].tensor = h_tensor_new(h, en->u.node.worker, label);
        n++;
    }
    /* The worker's own view of its chain moves first: an EXTEND that the
     * completion triggers must continue after this iteration. */
    h_chain *c = chain_of(d.req, d.node);
    bool chained = c && c->active && d.iter.depth;
    if (chained) {
        c->last = d.iter;
        c->have_last = true;
        if (finish)
            c->active = false;
    }
    if (getenv("BATON_TRACE"))
        fprintf(stderr, "event done req %llu %s%s%s%s\n", (unsigned long long)d.req, en->name, it,
                finish ? " finish" : "", d.virtual_ ? " (worker ran ahead)" : "");
    rt_node_done(h->rt, d.req, d.node, &d.iter, outs, n, finish, NULL);
    h_pump(h);
    /* Play the worker's side of a speculation window. */
    c = chain_of(d.req, d.node);
    if (chained && c && c->active) {
        rt_iter next = d.iter;
        next.v[next.depth - 1]++;
        if (next.v[next.depth - 1] <= c->upto && !h_find(h, d.req, en->name, &next))
            add_virtual(h, d.req, d.node, &next, c->upto);
    }
}

void h_complete(harness *h, h_dispatch *d, bool finish)
{
    h_complete_skip(h, d, finish, NULL);
}

void h_chunk(harness *h, h_dispatch *d, const char *value, bool empty, bool final)
{
    const graph_entity *en = &h->g->entities[d->node];
    char it[64], label[96];
    iter_label(&d->iter, it, sizeof(it));
    rt_tensor t = {0, 0};
    if (!empty) {
        snprintf(label, sizeof(label), "%s%s.%s[%d]", en->name, it, value, d->n_chunks++);
        t = h_tensor_new(h, en->u.node.worker, label);
    }
    rt_chunk(h->rt, d->req, d->node, &d->iter, h_value(h, en->name, value), t, final);
    h_pump(h);
}

void h_fail(harness *h, h_dispatch *dp, const char *msg)
{
    h_dispatch d;
    take(h, dp, &d);
    rt_node_failed(h->rt, d.req, d.node, &d.iter, BT_CODE_INTERNAL, msg);
    h_pump(h);
}

const h_response *h_response_of(const harness *h, uint64_t req)
{
    for (size_t i = 0; i < h->n_responses; i++)
        if (h->responses[i].req == req)
            return &h->responses[i];
    return NULL;
}

size_t h_tensors_unreleased(const harness *h)
{
    size_t c = 0;
    for (size_t i = 0; i < h->n_tensors; i++)
        c += !h->tensors[i].released && !h->tensors[i].lost;
    return c;
}
