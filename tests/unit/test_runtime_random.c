/* Randomized test of the runtime: random valid graphs (chains, parallels
 * with fan-in, streams into stream consumers, loops with loop-back,
 * accumulate, nested loops, speculating async nodes) driven by random but
 * legal event orders (completions in any order, chunks, finish signals,
 * failures, cancels, deadlines, lost workers).  After every event the
 * harness checks: every tensor released exactly once and never named after
 * its release, one terminal response per request, chunks numbered in
 * order; the driver adds: no dispatch past a loop's max_iters, and no
 * request left without a response once nothing is running (liveness).
 *
 * BATON_RANDOM_GRAPHS overrides the number of graphs; BATON_RANDOM_SEED
 * the seed (the failing seed is printed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/rt_harness.h"

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
    /* xorshift64*: small, seedable, good enough for test shapes. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 33) % (n ? n : 1);
}

static bool chance(uint32_t percent)
{
    return rnd(100) < percent;
}

/* ---- graph generator --------------------------------------------------- */

typedef struct sb {
    char *s;
    size_t n, cap;
} sb;

static void sbf(sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sbf(sb *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        b->cap = (b->cap + (size_t)k + 1) * 2;
        b->s = realloc(b->s, b->cap);
        if (!b->s)
            abort();
        if (b->n == 0)
            b->s[0] = 0;
    }
}

typedef struct gen {
    int n_nodes, n_loops, n_values;
} gen;

typedef struct entries {
    char names[4][16];
    int n;
} entries;

static void indent(sb *b, int ind)
{
    sbf(b, "%*s", ind, "");
}

static const char *model(void)
{
    return chance(50) ? "m0" : "m1";
}

static void client_tok(sb *b, gen *g)
{
    if (chance(30))
        sbf(b, ", {name: tok%d, to: client, new_token: true}", g->n_values++);
}

static void gen_seq(sb *b, gen *g, int ind, int n_blocks, const char *in, const char *out,
                    const char *out_edges, int depth, entries *ent);

/* One block: takes value IN at its entries, sends OUT along OUT_EDGES (a
 * YAML list body such as "{name: v3, to: n7}"). */
static void gen_block(sb *b, gen *g, int ind, const char *in, const char *out,
                      const char *out_edges, int depth, entries *ent)
{
    int kind = rnd(depth < 2 ? 5 : 3);
    char xin[24] = "";
    if (chance(25))
        snprintf(xin, sizeof(xin), ", x");
    if (kind == 0) { /* node */
        int n = g->n_nodes++;
        indent(b, ind);
        sbf(b, "- node: {name: n%d, model: %s, inputs: [%s%s], outputs: [%s", n, model(), in, xin,
            out_edges);
        client_tok(b, g);
        sbf(b, "]}\n");
        ent->n = 1;
        snprintf(ent->names[0], 16, "n%d", n);
    } else if (kind == 1) { /* parallel + fan-in join */
        int a = g->n_nodes++, c = g->n_nodes++, j = g->n_nodes++, v = g->n_values++;
        indent(b, ind);
        sbf(b, "- parallel:\n");
        indent(b, ind + 4);
        sbf(b, "- node: {name: n%d, model: %s, inputs: [%s], outputs: [{name: p%d, to: n%d}",
            a, model(), in, v, j);
        client_tok(b, g);
        sbf(b, "]}\n");
        indent(b, ind + 4);
        sbf(b, "- node: {name: n%d, model: %s, inputs: [%s%s], outputs: [{name: p%d, to: n%d}]}\n",
            c, model(), in, xin, v, j);
        indent(b, ind);
        sbf(b, "- node: {name: n%d, model: %s, inputs: [p%d], outputs: [%s]}\n", j, model(), v,
            out_edges);
        ent->n = 2;
        snprintf(ent->names[0], 16, "n%d", a);
        snprintf(ent->names[1], 16, "n%d", c);
    } else if (kind == 2) { /* stream into a consumer */
        int p = g->n_nodes++, c = g->n_nodes++, v = g->n_values++;
        indent(b, ind);
        sbf(b, "- node: {name: n%d, model: %s, inputs: [%s], outputs: [{name: s%d, to: n%d, "
            "stream: true}", p, model(), in, v, c);
        if (chance(30))
            sbf(b, ", {name: s%d, to: client, new_token: true}", v);
        sbf(b, "]}\n");
        indent(b, ind);
        sbf(b, "- node: {name: n%d, model: %s, consumes_stream: %s, inputs: [s%d%s], "
            "outputs: [%s", c, model(), chance(70) ? "true" : "false", v, xin, out_edges);
        client_tok(b, g);
        sbf(b, "]}\n");
        ent->n = 1;
        snprintf(ent->names[0], 16, "n%d", p);
    } else { /* loop */
        int l = g->n_loops++, f = g->n_nodes++;
        bool accum = chance(40);
        /* Sometimes an encoder before the loop whose value every iteration
         * reads (persist). */
        int enc = -1, cv = -1;
        if (chance(35)) {
            enc = g->n_nodes++;
            cv = g->n_values++;
            indent(b, ind);
            sbf(b, "- node: {name: n%d, model: %s, inputs: [%s], outputs: [{name: c%d, to: n%d, "
                "persist: true}]}\n", enc, model(), in, cv, f);
            snprintf(xin, sizeof(xin), ", c%d", cv);
        }
        indent(b, ind);
        sbf(b, "- loop:\n");
        indent(b, ind + 4);
        sbf(b, "name: L%d\n", l);
        indent(b, ind + 4);
        sbf(b, "max_iters: %u\n", 1 + rnd(4));
        indent(b, ind + 4);
        sbf(b, "body:\n");
        indent(b, ind + 6);
        sbf(b, "sequential:\n");
        if (chance(40)) {
            /* One node that loops back to itself: a decode step. */
            indent(b, ind + 8);
            sbf(b, "- node: {name: n%d, model: %s, async: %s, inputs: [%s%s], outputs: "
                "[{name: %s, to: n%d}, {name: %s}", f, model(), chance(60) ? "true" : "false",
                in, xin, in, f, out);
            client_tok(b, g);
            sbf(b, "]}\n");
        } else {
            int z = 0, m1 = g->n_values++, m2 = g->n_values++;
            char edges[64], mid_in[16], mid_out[16];
            snprintf(mid_in, sizeof(mid_in), "v%d", m1);
            snprintf(mid_out, sizeof(mid_out), "v%d", m2);
            indent(b, ind + 8);
            /* F's output to the inner part is named after the entries of
             * what follows, known only once it is generated: generate the
             * middle into its own buffer first. */
            sb mid = {0};
            entries ment = {0};
            int zname = g->n_nodes++;
            snprintf(edges, sizeof(edges), "{name: %s, to: n%d}", mid_out, zname);
            gen_seq(&mid, g, ind + 8, 1 + (int)rnd(2), mid_in, mid_out, edges, depth + 1, &ment);
            sbf(b, "- node: {name: n%d, model: %s, inputs: [%s%s], outputs: [", f, model(), in,
                xin);
            for (int k = 0; k < ment.n; k++)
                sbf(b, "%s{name: %s, to: %s}", k ? ", " : "", mid_in, ment.names[k]);
            sbf(b, "]}\n");
            sbf(b, "%s", mid.s ? mid.s : "");
            free(mid.s);
            z = zname;
            indent(b, ind + 8);
            sbf(b, "- node: {name: n%d, model: %s, inputs: [%s], outputs: [{name: %s, to: n%d}, "
                "{name: %s}", z, model(), mid_out, in, f, out);
            client_tok(b, g);
            sbf(b, "]}\n");
        }
        indent(b, ind + 4);
        sbf(b, "%s: [%s]\n", accum ? "accumulate" : "outputs", out_edges);
        ent->n = 1;
        snprintf(ent->names[0], 16, "n%d", f);
        if (enc >= 0) {
            ent->n = 2;
            snprintf(ent->names[1], 16, "n%d", enc);
        }
    }
}

/* N blocks in sequence, generated last to first so that each knows the
 * entries of the one after it. */
static void gen_seq(sb *b, gen *g, int ind, int n_blocks, const char *in, const char *out,
                    const char *out_edges, int depth, entries *ent)
{
    sb parts[4] = {{0}};
    char ins[4][16], edges[4][256];
    if (n_blocks > 4)
        n_blocks = 4;
    snprintf(ins[0], 16, "%s", in);
    for (int k = 1; k < n_blocks; k++)
        snprintf(ins[k], 16, "v%d", g->n_values++);
    snprintf(edges[n_blocks - 1], 256, "%s", out_edges);
    entries e = {0};
    for (int k = n_blocks - 1; k >= 0; k--) {
        const char *o = k == n_blocks - 1 ? out : ins[k + 1];
        gen_block(&parts[k], g, ind, ins[k], o, edges[k], depth, &e);
        if (k > 0) {
            edges[k - 1][0] = 0;
            size_t off = 0;
            for (int j = 0; j < e.n; j++)
                off += (size_t)snprintf(edges[k - 1] + off, 256 - off, "%s{name: %s, to: %s}",
                                        j ? ", " : "", ins[k], e.names[j]);
        }
    }
    *ent = e;
    for (int k = 0; k < n_blocks; k++) {
        sbf(b, "%s", parts[k].s ? parts[k].s : "");
        free(parts[k].s);
    }
}

static char *gen_graph(void)
{
    sb b = {0};
    gen g = {0};
    sbf(&b, "version: 1\n"
            "workers:\n  - {name: w0, device: cpu}\n  - {name: w1, device: cpu}\n"
            "models:\n  - {name: m0, backend: echo, worker: w0}\n"
            "  - {name: m1, backend: echo, worker: w1}\n"
            "graphs:\n  - name: g\n    inputs: [x]\n    body:\n      sequential:\n");
    /* A source node first, so that no block's input is the graph input
     * itself (a loop needs an edge into its entry for iteration 0). */
    sb body = {0};
    entries e;
    gen_seq(&body, &g, 8, 1 + (int)rnd(4), "a0", "out", "{name: out, to: client}", 0, &e);
    sbf(&b, "        - node: {name: src, model: m0, inputs: [x], outputs: [");
    for (int k = 0; k < e.n; k++)
        sbf(&b, "%s{name: a0, to: %s}", k ? ", " : "", e.names[k]);
    sbf(&b, "]}\n%s", body.s);
    free(body.s);
    return b.s;
}

/* ---- driver ------------------------------------------------------------ */

static size_t n_events, n_graphs_run, n_requests, n_spec_dispatch;

/* CAPS: per request (by key), per entity, the request's max_iters (0: none). */
static void check_caps(harness *h, uint32_t *const *caps)
{
    for (size_t i = 0; i < h->n_inflight; i++) {
        const h_dispatch *d = &h->inflight[i];
        const uint32_t *cap = caps[d->req];
        const graph_entity *en = &h->g->entities[d->node];
        for (int k = 0; k < en->depth; k++) {
            uint32_t max = h->g->entities[en->loops[k]].u.loop.max_iters;
            if (cap[en->loops[k]] && cap[en->loops[k]] < max)
                max = cap[en->loops[k]];
            if (d->iter.v[k] >= max) {
                snprintf(h->failure, sizeof(h->failure),
                         "%s dispatched past max_iters: request %llu, level %d at %u, max %u%s",
                         en->name, (unsigned long long)d->req, k, d->iter.v[k], max,
                         d->virtual_ ? " (speculative)" : "");
                return;
            }
        }
    }
}

static bool has_stream_value(const harness *h, int node, int *value)
{
    const graph_entity *en = &h->g->entities[node];
    for (size_t k = 0; k < en->n_values; k++) {
        const graph_value *v = &h->g->values[en->values[k]];
        for (size_t e = 0; e < v->n_edges; e++)
            if (h->g->edges[v->edges[e]].stream) {
                *value = en->values[k];
                return true;
            }
    }
    return false;
}

static void run_one(uint64_t seed)
{
    rng_state = seed * 0x9E3779B97F4A7C15ULL + 1;
    char *yaml = gen_graph();
    uint32_t window = rnd(4);
    harness *h = h_create(yaml, window);
    h->drop_race = chance(50);
    uint32_t *caps[4];
    for (int k = 0; k < 4; k++)
        caps[k] = calloc(h->g->n_entities, sizeof(uint32_t));
    int n_req = 1 + (int)rnd(3);
    uint64_t next_req = 1;
    bool lost_once = false;
    for (int step = 0; step < 5000; step++) {
        if (next_req <= (uint64_t)n_req && (h->n_inflight == 0 || chance(20))) {
            const char *loop = NULL;
            uint32_t cap = 0;
            for (size_t i = 0; i < h->g->n_entities; i++)
                if (h->g->entities[i].kind == GRAPH_LOOP && !loop && chance(30)) {
                    loop = h->g->entities[i].name;
                    cap = 1 + rnd(3);
                    caps[next_req][i] = cap;
                }
            h_start(h, next_req++, chance(50), loop, cap);
            n_requests++;
            continue;
        }
        if (h->n_inflight == 0)
            break;
        n_events++;
        uint32_t pick = rnd(1000);
        if (pick < 8) {
            rt_cancel(h->rt, 1 + rnd((uint32_t)next_req));
            h_pump(h);
        } else if (pick < 12) {
            rt_deadline(h->rt, 1 + rnd((uint32_t)next_req));
            h_pump(h);
        } else if (pick < 14 && !lost_once) {
            lost_once = true;
            for (size_t i = 0; i < h->n_tensors; i++)
                if (h->tensors[i].worker == 1 && !h->tensors[i].released)
                    h->tensors[i].lost = true;
            rt_worker_lost(h->rt, 1, NULL, 0);
            h_pump(h);
            /* The dead worker's dispatches never complete. */
            for (size_t i = 0; i < h->n_inflight;)
                if (h->g->entities[h->inflight[i].node].u.node.worker == 1)
                    h->inflight[i] = h->inflight[--h->n_inflight];
                else
                    i++;
        } else {
            h_dispatch *d = &h->inflight[rnd((uint32_t)h->n_inflight)];
            const graph_entity *en = &h->g->entities[d->node];
            if (d->virtual_)
                n_spec_dispatch++;
            int sv;
            if (has_stream_value(h, d->node, &sv) && chance(60)) {
                bool final = chance(30);
                h_chunk(h, d, h->g->values[sv].name, chance(20), final);
                continue;
            }
            if (chance(1)) {
                h_fail(h, d, "random failure");
            } else {
                bool finish = en->depth > 0 && chance(15);
                h_complete(h, d, finish);
            }
        }
        check_caps(h, caps);
        if (h->failure[0])
            break;
    }
    /* Liveness: nothing runs, so every request must have been answered. */
    if (!h->failure[0] && h->n_inflight == 0)
        for (uint64_t r = 1; r < next_req; r++)
            if (!h_response_of(h, r))
                snprintf(h->failure, sizeof(h->failure), "request %llu hung",
                         (unsigned long long)r);
    if (!h->failure[0] && h->n_inflight == 0) {
        if (rt_tensors_held(h->rt) != 0 || h_tensors_unreleased(h) != 0)
            snprintf(h->failure, sizeof(h->failure), "%zu tensors held, %zu unreleased",
                     rt_tensors_held(h->rt), h_tensors_unreleased(h));
    }
    if (h->failure[0]) {
        fprintf(stderr, "seed %llu: %s\n%s\n", (unsigned long long)seed, h->failure, yaml);
        fail_msg("random runtime test failed at seed %llu: %s", (unsigned long long)seed,
                 h->failure);
    }
    n_graphs_run++;
    for (int k = 0; k < 4; k++)
        free(caps[k]);
    h_destroy(h);
    free(yaml);
}

static void test_random_graphs(void **state)
{
    (void)state;
    const char *ng = getenv("BATON_RANDOM_GRAPHS");
    const char *sd = getenv("BATON_RANDOM_SEED");
    uint64_t n = ng ? strtoull(ng, NULL, 10) : 3000;
    uint64_t base = sd ? strtoull(sd, NULL, 10) : 1;
    for (uint64_t i = 0; i < n; i++)
        run_one(base + i);
    printf("random runtime: %zu graphs, %zu requests, %zu events, %zu speculative "
           "iterations run; all invariants held\n",
           n_graphs_run, n_requests, n_events, n_spec_dispatch);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_graphs),
    };
    return cmocka_run_group_tests_name("runtime_random", tests, NULL, NULL);
}
