/* The runtime state machine, one test per rule of the graph semantics, each
 * with hand-written expectations.  The harness (rt_harness.c) plays the
 * workers and checks the release/response/chunk invariants after every
 * event; every test ends by asserting that nothing is left held. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/rt_harness.h"

#define HEAD                                                                                   \
    "version: 1\n"                                                                             \
    "workers:\n"                                                                               \
    "  - {name: w0, device: cpu}\n"                                                            \
    "  - {name: w1, device: cpu}\n"                                                            \
    "models:\n"                                                                                \
    "  - {name: m, backend: echo, worker: w0}\n"                                               \
    "  - {name: m1, backend: echo, worker: w1}\n"                                              \
    "graphs:\n"                                                                                \
    "  - name: g\n"                                                                            \
    "    inputs: [x]\n"                                                                        \
    "    body:\n"

static const rt_iter I0 = {0, {0}};

#define IT1(a) h_iter(1, (unsigned)(a))
#define IT2(a, b) h_iter(2, (unsigned)(a), (unsigned)(b))

/* Common end of every test: no broken invariant, nothing held. */
static void finish_ok(harness *h)
{
    assert_string_equal(h->failure, "");
    assert_int_equal(rt_inflight(h->rt), 0);
    assert_int_equal(rt_tensors_held(h->rt), 0);
    assert_int_equal(h_tensors_unreleased(h), 0);
    h_destroy(h);
}

static bool released(const harness *h, const char *label)
{
    for (size_t i = 0; i < h->n_tensors; i++)
        if (strcmp(h->tensors[i].label, label) == 0)
            return h->tensors[i].released;
    fail_msg("no tensor labelled %s", label);
    return false;
}

static const char *chain_yaml = HEAD
    "      sequential:\n"
    "        - node: {name: a, model: m, inputs: [x], outputs: [{name: y, to: b}]}\n"
    "        - node: {name: b, model: m1, inputs: [y], outputs: [{name: z, to: c}]}\n"
    "        - node: {name: c, model: m, inputs: [z], outputs: [{name: out, to: client}]}\n";

static void test_chain(void **state)
{
    (void)state;
    harness *h = h_create(chain_yaml, 8);
    assert_int_equal(h_start(h, 1, false, NULL, 0), 0);
    assert_int_equal(h_count_inflight(h, 1), 1);
    h_dispatch *a = h_find(h, 1, "a", &I0);
    assert_non_null(a);
    assert_string_equal(a->inputs[0], "in.x");
    h_complete(h, a, false);
    h_dispatch *b = h_find(h, 1, "b", &I0);
    assert_non_null(b);
    assert_string_equal(b->inputs[0], "a.y");
    assert_false(released(h, "a.y"));
    h_complete(h, b, false);
    assert_true(released(h, "a.y")); /* its only consumer completed */
    h_dispatch *c = h_find(h, 1, "c", &I0);
    assert_string_equal(c->inputs[0], "b.z");
    assert_null(h_response_of(h, 1));
    h_complete(h, c, false);
    const h_response *r = h_response_of(h, 1);
    assert_non_null(r);
    assert_int_equal(r->code, BT_CODE_OK);
    assert_string_equal(r->outputs, "out=c.out");
    finish_ok(h);
}

static const char *fanin_yaml = HEAD
    "      sequential:\n"
    "        - node: {name: src, model: m, inputs: [x], outputs: [{name: v, to: a}, {name: v, to: b}]}\n"
    "        - parallel:\n"
    "            - node: {name: a, model: m, inputs: [v], outputs: [{name: p, to: join}]}\n"
    "            - node: {name: b, model: m1, inputs: [v], outputs: [{name: p, to: join}]}\n"
    "        - node: {name: join, model: m, inputs: [p], outputs: [{name: out, to: client}]}\n";

static void test_parallel_fanout_fanin(void **state)
{
    (void)state;
    harness *h = h_create(fanin_yaml, 8);
    h_start(h, 1, false, NULL, 0);
    h_complete(h, h_find(h, 1, "src", &I0), false);
    h_dispatch *a = h_find(h, 1, "a", &I0), *b = h_find(h, 1, "b", &I0);
    assert_non_null(a);
    assert_non_null(b);
    assert_string_equal(a->inputs[0], "src.v");
    assert_string_equal(b->inputs[0], "src.v");
    /* b first: the join waits for a, and its parts keep config order. */
    h_complete(h, b, false);
    assert_false(released(h, "src.v"));
    assert_null(h_find_node(h, 1, "join"));
    h_complete(h, h_find(h, 1, "a", &I0), false);
    assert_true(released(h, "src.v"));
    h_dispatch *j = h_find(h, 1, "join", &I0);
    assert_non_null(j);
    assert_string_equal(j->inputs[0], "a.p|b.p");
    h_complete(h, j, false);
    assert_int_equal(h_response_of(h, 1)->code, BT_CODE_OK);
    finish_ok(h);
}

static const char *loop_yaml = HEAD
    "      sequential:\n"
    "        - node: {name: pre, model: m, inputs: [x], outputs: [{name: t, to: step}]}\n"
    "        - loop:\n"
    "            name: L\n"
    "            max_iters: 3\n"
    "            body:\n"
    "              node: {name: step, model: m, inputs: [t], outputs: [{name: t, to: step},\n"
    "                     {name: tok, to: client, new_token: true}]}\n"
    "            outputs: [{name: t, to: post}]\n"
    "        - node: {name: post, model: m, inputs: [t], outputs: [{name: out, to: client}]}\n";

static void test_loop_max_iters(void **state)
{
    (void)state;
    harness *h = h_create(loop_yaml, 0);
    h_start(h, 1, false, NULL, 0);
    h_complete(h, h_find(h, 1, "pre", &I0), false);
    rt_iter i0 = IT1(0), i1 = IT1(1), i2 = IT1(2);
    h_dispatch *s = h_find(h, 1, "step", &i0);
    assert_non_null(s);
    assert_string_equal(s->inputs[0], "pre.t");
    h_complete(h, s, false);
    s = h_find(h, 1, "step", &i1);
    assert_non_null(s);
    assert_string_equal(s->inputs[0], "step@0.t");
    h_complete(h, s, false);
    s = h_find(h, 1, "step", &i2);
    assert_string_equal(s->inputs[0], "step@1.t");
    assert_null(h_find_node(h, 1, "post"));
    h_complete(h, s, false);
    /* The loop ends at max_iters and its output carries the last value. */
    h_dispatch *p = h_find(h, 1, "post", &I0);
    assert_non_null(p);
    assert_string_equal(p->inputs[0], "step@2.t");
    assert_int_equal(h_count_inflight(h, 1), 1);
    h_complete(h, p, false);
    const h_response *r = h_response_of(h, 1);
    assert_int_equal(r->code, BT_CODE_OK);
    /* Without stream, new_token values are joined into one output. */
    assert_string_equal(r->outputs, "tok=step@0.tok,step@1.tok,step@2.tok;out=post.out");
    assert_int_equal(h->n_dispatch_total, 5);
    finish_ok(h);
}

static void test_loop_finish_at_k(void **state)
{
    (void)state;
    harness *h = h_create(loop_yaml, 0);
    h_start(h, 1, true, NULL, 0);
    h_complete(h, h_find(h, 1, "pre", &I0), false);
    rt_iter i0 = IT1(0), i1 = IT1(1);
    h_complete(h, h_find(h, 1, "step", &i0), false);
    h_complete(h, h_find(h, 1, "step", &i1), true); /* finish in iteration 1 */
    h_dispatch *p = h_find(h, 1, "post", &I0);
    assert_non_null(p);
    assert_string_equal(p->inputs[0], "step@1.t");
    assert_true(released(h, "step@1.t") == false);
    h_complete(h, p, false);
    const h_response *r = h_response_of(h, 1);
    assert_int_equal(r->code, BT_CODE_OK);
    assert_string_equal(h->chunks, "0:step@0.tok 1:step@1.tok");
    assert_string_equal(r->outputs, "out=post.out");
    finish_ok(h);
}

static void test_request_max_iters(void **state)
{
    (void)state;
    harness *h = h_create(loop_yaml, 0);
    h_start(h, 1, true, "L", 2);
    h_complete(h, h_find(h, 1, "pre", &I0), false);
    rt_iter i0 = IT1(0), i1 = IT1(1);
    h_complete(h, h_find(h, 1, "step", &i0), false);
    h_complete(h, h_find(h, 1, "step", &i1), false);
    h_dispatch *p = h_find(h, 1, "post", &I0);
    assert_non_null(p);
    assert_string_equal(p->inputs[0], "step@1.t");
    h_complete(h, p, false);
    assert_string_equal(h->chunks, "0:step@0.tok 1:step@1.tok");
    finish_ok(h);
}

/* Two values of one name reach the client under two names (`as`), from a
 * node in a loop and from a loop's accumulate, streamed or joined. */
static const char *as_yaml = HEAD
    "      sequential:\n"
    "        - loop:\n"
    "            name: L\n"
    "            max_iters: 2\n"
    "            body:\n"
    "              node: {name: step, model: m, inputs: [x], outputs: [\n"
    "                     {name: tok, to: client, new_token: true, as: heard}]}\n"
    "            accumulate: [{name: tok, to: post}, {name: tok, to: client, as: all}]\n"
    "        - node: {name: post, model: m1, inputs: [tok], outputs: [\n"
    "                 {name: tok, to: client, new_token: true}]}\n";

static void test_client_names(void **state)
{
    (void)state;
    for (int stream = 0; stream < 2; stream++) {
        harness *h = h_create(as_yaml, 0);
        h_start(h, 1, stream, NULL, 0);
        rt_iter i0 = IT1(0), i1 = IT1(1);
        h_complete(h, h_find(h, 1, "step", &i0), false);
        h_complete(h, h_find(h, 1, "step", &i1), false);
        h_dispatch *p = h_find(h, 1, "post", &I0);
        assert_non_null(p);
        assert_string_equal(p->inputs[0], "step@0.tok,step@1.tok");
        h_complete(h, p, false);
        const h_response *r = h_response_of(h, 1);
        assert_int_equal(r->code, BT_CODE_OK);
        if (stream) {
            assert_string_equal(h->chunks, "0:step@0.tok 1:step@1.tok 2:post.tok");
            assert_string_equal(h->chunk_names, "heard heard tok");
            assert_string_equal(r->outputs, "all=step@0.tok,step@1.tok");
        } else {
            assert_string_equal(h->chunk_names, "");
            assert_string_equal(r->outputs,
                                "heard=step@0.tok,step@1.tok;all=step@0.tok,step@1.tok;"
                                "tok=post.tok");
        }
        finish_ok(h);
    }
}

static const char *early_yaml = HEAD
    "      sequential:\n"
    "        - node: {name: pre, model: m, inputs: [x], outputs: [{name: s, to: f}]}\n"
    "        - loop:\n"
    "            name: L\n"
    "            max_iters: 3\n"
    "            body:\n"
    "              sequential:\n"
    "                - node: {name: f, model: m, inputs: [s], outputs: [{name: s, to: f}, {name: u, to: g}]}\n"
    "                - node: {name: g, model: m1, inputs: [u, x], outputs: [{name: tok, to: client, new_token: true}]}\n";

static void test_loopback_lands_in_next_slot(void **state)
{
    (void)state;
    harness *h = h_create(early_yaml, 0);
    h_start(h, 1, false, NULL, 0);
    h_complete(h, h_find(h, 1, "pre", &I0), false);
    rt_iter i0 = IT1(0), i1 = IT1(1);
    h_complete(h, h_find(h, 1, "f", &i0), false);
    /* f's loop-back value for iteration 1 has arrived, but iteration 0 is
     * not over while g runs: f must wait. */
    h_dispatch *g = h_find(h, 1, "g", &i0);
    assert_non_null(g);
    assert_string_equal(g->inputs[0], "f@0.u");
    assert_string_equal(g->inputs[1], "in.x"); /* graph input, bound in every iteration */
    assert_null(h_find(h, 1, "f", &i1));
    assert_false(released(h, "f@0.s"));
    h_complete(h, g, false);
    h_dispatch *f1 = h_find(h, 1, "f", &i1);
    assert_non_null(f1);
    assert_string_equal(f1->inputs[0], "f@0.s");
    h_complete(h, f1, false);
    g = h_find(h, 1, "g", &i1);
    assert_string_equal(g->inputs[1], "in.x");
    assert_false(released(h, "in.x")); /* held until the request ends */
    h_complete(h, g, false);
    rt_iter i2 = IT1(2);
    h_complete(h, h_find(h, 1, "f", &i2), false);
    h_complete(h, h_find(h, 1, "g", &i2), false);
    assert_string_equal(h_response_of(h, 1)->outputs, "tok=g@0.tok,g@1.tok,g@2.tok");
    finish_ok(h);
}

static const char *persist_yaml = HEAD
    "      sequential:\n"
    "        - node: {name: enc, model: m, inputs: [x], outputs: [{name: cond, to: den, persist: true}]}\n"
    "        - node: {name: noise, model: m1, inputs: [x], outputs: [{name: lat, to: den}]}\n"
    "        - loop:\n"
    "            name: L\n"
    "            max_iters: 3\n"
    "            body:\n"
    "              node: {name: den, model: m, inputs: [cond, lat], outputs: [{name: lat, to: den}]}\n"
    "            outputs: [{name: lat, to: dec}]\n"
    "        - node: {name: dec, model: m, inputs: [lat], outputs: [{name: img, to: client, modality: image}]}\n";

static void test_persist(void **state)
{
    (void)state;
    harness *h = h_create(persist_yaml, 8);
    h_start(h, 1, false, NULL, 0);
    assert_int_equal(h_count_inflight(h, 1), 2); /* enc and noise: data-driven */
    h_complete(h, h_find(h, 1, "noise", &I0), false);
    assert_null(h_find_node(h, 1, "den")); /* cond missing */
    h_complete(h, h_find(h, 1, "enc", &I0), false);
    for (unsigned i = 0; i < 3; i++) {
        rt_iter it = IT1(i);
        h_dispatch *d = h_find(h, 1, "den", &it);
        assert_non_null(d);
        assert_string_equal(d->inputs[0], "enc.cond");
        if (i == 0)
            assert_string_equal(d->inputs[1], "noise.lat");
        assert_false(released(h, "enc.cond"));
        h_complete(h, d, false);
        if (i == 0)
            assert_true(released(h, "noise.lat"));
    }
    /* The persisted value goes when its loop ends. */
    assert_true(released(h, "enc.cond"));
    h_dispatch *d = h_find(h, 1, "dec", &I0);
    assert_string_equal(d->inputs[0], "den@2.lat");
    h_complete(h, d, false);
    assert_string_equal(h_response_of(h, 1)->outputs, "img=dec.img");
    finish_ok(h);
}

static const char *accum_yaml = HEAD
    "      sequential:\n"
    "        - node: {name: pre, model: m, inputs: [x], outputs: [{name: t, to: step}]}\n"
    "        - loop:\n"
    "            name: L\n"
    "            max_iters: 4\n"
    "            body:\n"
    "              node: {name: step, model: m, inputs: [t], outputs: [{name: t, to: step}]}\n"
    "            accumulate: [{name: t, to: col}, {name: t, to: client}]\n"
    "        - node: {name: col, model: m, inputs: [t], outputs: [{name: out, to: client}]}\n";

static void test_accumulate_order(void **state)
{
    (void)state;
    harness *h = h_create(accum_yaml, 0);
    h_start(h, 1, false, NULL, 0);
    h_complete(h, h_find(h, 1, "pre", &I0), false);
    for (unsigned i = 0; i < 4; i++) {
        rt_iter it = IT1(i);
        h_dispatch *d = h_find(h, 1, "step", &it);
        assert_non_null(d);
        h_complete(h, d, false);
    }
    h_dispatch *c = h_find(h, 1, "col", &I0);
    assert_non_null(c);
    assert_string_equal(c->inputs[0], "step@0.t,step@1.t,step@2.t,step@3.t");
    h_complete(h, c, false);
    assert_string_equal(h_response_of(h, 1)->outputs,
                        "t=step@0.t,step@1.t,step@2.t,step@3.t;out=col.out");
    finish_ok(h);
}

static const char *nested_yaml = HEAD
    "      sequential:\n"
    "        - node: {name: pre, model: m, inputs: [x], outputs: [{name: s, to: a}]}\n"
    "        - loop:\n"
    "            name: outer\n"
    "            max_iters: 3\n"
    "            body:\n"
    "              sequential:\n"
    "                - node: {name: a, model: m, inputs: [s], outputs: [{name: s, to: a}, {name: h, to: b}]}\n"
    "                - loop:\n"
    "                    name: inner\n"
    "                    max_iters: 4\n"
    "                    body:\n"
    "                      node: {name: b, model: m1, inputs: [h], outputs: [{name: h, to: b}]}\n"
    "                    outputs: [{name: h, to: c}]\n"
    "                - node: {name: c, model: m, inputs: [h], outputs: [{name: r, to: client}]}\n";

static void test_nested_loops(void **state)
{
    (void)state;
    harness *h = h_create(nested_yaml, 0);
    h_start(h, 1, false, NULL, 0);
    h_complete(h, h_find(h, 1, "pre", &I0), false);
    char want[96];
    for (unsigned o = 0; o < 3; o++) {
        rt_iter io = IT1(o);
        h_dispatch *a = h_find(h, 1, "a", &io);
        assert_non_null(a);
        if (o == 0)
            assert_string_equal(a->inputs[0], "pre.s");
        else {
            snprintf(want, sizeof(want), "a@%u.s", o - 1);
            assert_string_equal(a->inputs[0], want);
        }
        h_complete(h, a, false);
        for (unsigned i = 0; i < 4; i++) {
            rt_iter it = IT2(o, i);
            h_dispatch *b = h_find(h, 1, "b", &it);
            assert_non_null(b);
            /* One dispatch at a time: the inner loop is sequential. */
            assert_int_equal(h_count_inflight(h, 1), 1);
            if (i == 0)
                snprintf(want, sizeof(want), "a@%u.h", o);
            else
                snprintf(want, sizeof(want), "b@%u,%u.h", o, i - 1);
            assert_string_equal(b->inputs[0], want);
            h_complete(h, b, false);
        }
        h_dispatch *c = h_find(h, 1, "c", &io);
        assert_non_null(c);
        snprintf(want, sizeof(want), "b@%u,3.h", o);
        assert_string_equal(c->inputs[0], want);
        h_complete(h, c, false);
    }
    assert_int_equal(h->n_dispatch_total, 1 + 3 + 12 + 3);
    assert_string_equal(h_response_of(h, 1)->outputs, "r=c@0.r,c@1.r,c@2.r");
    finish_ok(h);
}

static const char *stream_yaml = HEAD
    "      sequential:\n"
    "        - node: {name: p, model: m, inputs: [x], outputs: [{name: au, to: v, stream: true}]}\n"
    "        - node: {name: v, model: m1, consumes_stream: true, inputs: [au, x],\n"
    "                 outputs: [{name: wav, to: client, new_token: true, modality: audio}]}\n";

static void test_stream_consumer(void **state)
{
    (void)state;
    harness *h = h_create(stream_yaml, 8);
    h_start(h, 1, true, NULL, 0);
    h_dispatch *p = h_find(h, 1, "p", &I0);
    h_chunk(h, p, "au", false, false);
    h_dispatch *v = h_find(h, 1, "v", &I0);
    assert_non_null(v);
    assert_string_equal(v->inputs[0], "p.au[0]");
    assert_string_equal(v->inputs[1], "in.x");
    assert_false(v->stream_final);
    /* Chunks that arrive while the consumer runs are buffered. */
    p = h_find(h, 1, "p", &I0);
    h_chunk(h, p, "au", false, false);
    p = h_find(h, 1, "p", &I0);
    h_chunk(h, p, "au", false, false);
    assert_int_equal(h_count_inflight(h, 1), 2);
    h_complete(h, h_find(h, 1, "v", &I0), false);
    assert_true(released(h, "p.au[0]"));
    v = h_find(h, 1, "v", &I0);
    assert_non_null(v);
    assert_string_equal(v->inputs[0], "p.au[1],p.au[2]");
    assert_string_equal(v->inputs[1], "in.x"); /* other inputs stay bound */
    assert_false(v->stream_final);
    /* The producer ends with an empty final chunk. */
    p = h_find(h, 1, "p", &I0);
    h_chunk(h, p, "au", true, true);
    h_complete(h, h_find(h, 1, "p", &I0), false);
    h_complete(h, h_find(h, 1, "v", &I0), false);
    v = h_find(h, 1, "v", &I0);
    assert_non_null(v);
    assert_string_equal(v->inputs[0], "");
    assert_true(v->stream_final);
    assert_null(h_response_of(h, 1));
    h_complete(h, v, false);
    assert_int_equal(h_response_of(h, 1)->code, BT_CODE_OK);
    assert_string_equal(h->chunks, "0:v.wav 1:v#1.wav 2:v#2.wav");
    finish_ok(h);
}

static void test_stream_joined_for_plain_consumer(void **state)
{
    (void)state;
    const char *yaml = HEAD
        "      sequential:\n"
        "        - node: {name: p, model: m, inputs: [x], outputs: [{name: au, to: v, stream: true}]}\n"
        "        - node: {name: v, model: m1, inputs: [au], outputs: [{name: wav, to: client}]}\n";
    harness *h = h_create(yaml, 8);
    h_start(h, 1, false, NULL, 0);
    h_dispatch *p = h_find(h, 1, "p", &I0);
    h_chunk(h, p, "au", false, false);
    p = h_find(h, 1, "p", &I0);
    h_chunk(h, p, "au", false, false);
    assert_null(h_find_node(h, 1, "v")); /* waits for the final chunk */
    h_complete_skip(h, h_find(h, 1, "p", &I0), false, "au"); /* completion closes the stream */
    h_dispatch *v = h_find(h, 1, "v", &I0);
    assert_non_null(v);
    assert_string_equal(v->inputs[0], "p.au[0],p.au[1]");
    assert_true(v->stream_final);
    h_complete(h, v, false);
    finish_ok(h);
}

static const char *spec_yaml = HEAD
    "      sequential:\n"
    "        - node: {name: pre, model: m, inputs: [x], outputs: [{name: tok, to: dec},\n"
    "                 {name: text, to: client, new_token: true, modality: text}]}\n"
    "        - loop:\n"
    "            name: L\n"
    "            max_iters: 10\n"
    "            body:\n"
    "              sequential:\n"
    "                - node: {name: dec, model: m, async: true, inputs: [tok], outputs: [{name: tok, to: dec},\n"
    "                         {name: t2, to: det}]}\n"
    "                - node: {name: det, model: m1, inputs: [t2], outputs: [{name: text, to: client, new_token: true}]}\n";

static void test_speculation_rolled_back_by_finish(void **state)
{
    (void)state;
    harness *h = h_create(spec_yaml, 4);
    assert_true(h->g->entities[h_node(h, "dec")].u.node.speculative);
    h_start(h, 1, true, NULL, 0);
    h_complete(h, h_find(h, 1, "pre", &I0), false);
    rt_iter it[6];
    for (unsigned i = 0; i < 6; i++)
        it[i] = IT1(i);
    h_dispatch *d = h_find(h, 1, "dec", &it[0]);
    assert_non_null(d);
    assert_int_equal(d->spec_upto, 4);
    h_complete(h, d, false);
    /* The worker runs ahead on its own: iterations 1 and 2, then finishes
     * in 3, all while det@0 holds the loop in iteration 0. */
    d = h_find(h, 1, "dec", &it[1]);
    assert_non_null(d);
    assert_true(d->virtual_);
    h_complete(h, d, false);
    h_complete(h, h_find(h, 1, "dec", &it[2]), false);
    h_complete(h, h_find(h, 1, "dec", &it[3]), true);
    assert_null(h_find(h, 1, "det", &it[1]));
    assert_string_equal(h->chunks, "0:pre.text");
    size_t dispatches = h->n_dispatch_total;
    for (unsigned i = 0; i < 4; i++) {
        h_dispatch *t = h_find(h, 1, "det", &it[i]);
        assert_non_null(t);
        assert_string_equal(t->inputs[0], i == 0 ? "dec@0.t2" : i == 1 ? "dec@1.t2"
                                                      : i == 2 ? "dec@2.t2" : "dec@3.t2");
        h_complete(h, t, false);
    }
    /* Only det was dispatched: dec's iterations 1..3 ran in the window. */
    assert_int_equal(h->n_dispatch_total, dispatches + 3);
    assert_true(h->n_drops >= 1);
    assert_string_equal(h->last_drop, "dec@4");
    assert_true(h->n_extends >= 1);
    /* A completion for the dropped iteration 4 still arrives: released, no
     * token reaches the client. */
    rt_value_out late[2] = {
        {h_value(h, "dec", "tok"), h_tensor_new(h, 0, "dec@4.tok")},
        {h_value(h, "dec", "t2"), h_tensor_new(h, 0, "dec@4.t2")},
    };
    rt_node_done(h->rt, 1, h_node(h, "dec"), &it[4], late, 2, false, NULL);
    h_pump(h);
    assert_true(released(h, "dec@4.tok"));
    assert_string_equal(h->chunks,
                        "0:pre.text 1:det@0.text 2:det@1.text 3:det@2.text 4:det@3.text");
    assert_int_equal(h_response_of(h, 1)->code, BT_CODE_OK);
    finish_ok(h);
}

static void test_speculation_to_max_iters(void **state)
{
    (void)state;
    harness *h = h_create(spec_yaml, 3);
    h_start(h, 1, true, "L", 5);
    h_complete(h, h_find(h, 1, "pre", &I0), false);
    for (unsigned i = 0; i < 5; i++) {
        rt_iter it = IT1(i);
        h_dispatch *d = h_find(h, 1, "dec", &it);
        assert_non_null(d);
        assert_int_equal(d->virtual_, i > 0);
        h_complete(h, d, false);
        h_complete(h, h_find(h, 1, "det", &it), false);
    }
    rt_iter i5 = IT1(5);
    assert_null(h_find(h, 1, "dec", &i5)); /* the window never passes the last iteration */
    assert_int_equal(h->n_drops, 0);
    assert_int_equal(h_response_of(h, 1)->code, BT_CODE_OK);
    finish_ok(h);
}

static void test_cancel_mid_loop(void **state)
{
    (void)state;
    harness *h = h_create(spec_yaml, 4);
    h_start(h, 1, true, NULL, 0);
    h_complete(h, h_find(h, 1, "pre", &I0), false);
    rt_iter i0 = IT1(0), i1 = IT1(1);
    h_complete(h, h_find(h, 1, "dec", &i0), false);
    h_complete(h, h_find(h, 1, "dec", &i1), false); /* buffered, ahead of the loop */
    assert_int_equal(rt_cancel(h->rt, 1), 0);
    h_pump(h);
    const h_response *r = h_response_of(h, 1);
    assert_non_null(r);
    assert_int_equal(r->code, BT_CODE_CANCELLED);
    assert_true(h->n_drops >= 1);
    assert_int_equal(rt_tensors_held(h->rt), 0);
    /* Late completions of the cancelled request are released. */
    h_dispatch *det = h_find(h, 1, "det", &i0);
    assert_non_null(det);
    h_complete(h, det, false);
    assert_true(released(h, "det@0.text"));
    assert_int_equal(rt_cancel(h->rt, 1), BT_ENOENT); /* unknown: ignored */
    h->n_inflight = 0;
    finish_ok(h);
}

/* A stop (the client's text is complete) ends the request OK with the
 * values it has, drops its work like a cancel and holds no tensor. */
static void test_stop_mid_loop(void **state)
{
    (void)state;
    harness *h = h_create(spec_yaml, 4);
    h_start(h, 1, false, NULL, 0);
    h_complete(h, h_find(h, 1, "pre", &I0), false);
    rt_iter i0 = IT1(0), i1 = IT1(1);
    h_complete(h, h_find(h, 1, "dec", &i0), false);
    h_complete(h, h_find(h, 1, "det", &i0), false);
    h_complete(h, h_find(h, 1, "dec", &i1), false); /* run ahead */
    assert_int_equal(rt_stop(h->rt, 1), 0);
    h_pump(h);
    const h_response *r = h_response_of(h, 1);
    assert_non_null(r);
    assert_int_equal(r->code, BT_CODE_OK);
    assert_string_equal(r->outputs, "text=pre.text,det@0.text");
    assert_int_equal(rt_tensors_held(h->rt), 0);
    assert_int_equal(rt_stop(h->rt, 1), BT_ENOENT); /* ended: once only */
    h->n_inflight = 0;
    finish_ok(h);
}

static void test_deadline(void **state)
{
    (void)state;
    harness *h = h_create(chain_yaml, 8);
    h_start(h, 1, false, NULL, 0);
    h_complete(h, h_find(h, 1, "a", &I0), false);
    assert_int_equal(rt_deadline(h->rt, 1), 0);
    h_pump(h);
    assert_int_equal(h_response_of(h, 1)->code, BT_CODE_DEADLINE_EXCEEDED);
    h_complete(h, h_find(h, 1, "b", &I0), false);
    assert_null(h_find_node(h, 1, "c"));
    finish_ok(h);
}

static void test_worker_lost(void **state)
{
    (void)state;
    harness *h = h_create(chain_yaml, 8);
    h_start(h, 1, false, NULL, 0);
    h_start(h, 2, false, NULL, 0);
    h_complete(h, h_find(h, 1, "a", &I0), false);
    h_complete(h, h_find(h, 1, "b", &I0), false); /* b.z lives on w1 */
    for (size_t i = 0; i < h->n_tensors; i++)
        if (h->tensors[i].worker == 1)
            h->tensors[i].lost = true;
    assert_int_equal(rt_worker_lost(h->rt, 1, NULL, 0), 0);
    h_pump(h);
    assert_int_equal(h_response_of(h, 1)->code, BT_CODE_UNAVAILABLE);
    assert_int_equal(h_response_of(h, 2)->code, BT_CODE_UNAVAILABLE);
    assert_non_null(strstr(h_response_of(h, 1)->message, "w1"));
    assert_true(released(h, "in.x"));
    h->n_inflight = 0;
    finish_ok(h);
}

static void test_node_failure(void **state)
{
    (void)state;
    harness *h = h_create(chain_yaml, 8);
    h_start(h, 1, false, NULL, 0);
    h_complete(h, h_find(h, 1, "a", &I0), false);
    h_fail(h, h_find(h, 1, "b", &I0), "boom");
    const h_response *r = h_response_of(h, 1);
    assert_int_equal(r->code, BT_CODE_INTERNAL);
    assert_string_equal(r->message, "node 'b' failed: boom");
    assert_string_equal(r->outputs, "");
    finish_ok(h);
}

static void test_missing_output(void **state)
{
    (void)state;
    harness *h = h_create(chain_yaml, 8);
    h_start(h, 1, false, NULL, 0);
    h_complete_skip(h, h_find(h, 1, "a", &I0), false, "y");
    const h_response *r = h_response_of(h, 1);
    assert_int_equal(r->code, BT_CODE_INTERNAL);
    assert_non_null(strstr(r->message, "without its output 'y'"));
    finish_ok(h);
}

static void test_duplicate_and_stray(void **state)
{
    (void)state;
    harness *h = h_create(chain_yaml, 8);
    assert_int_equal(h_start(h, 1, false, NULL, 0), 0);
    assert_int_equal(h_start(h, 1, false, NULL, 0), BT_EEXIST);
    /* The rejected start's input tensor is the caller's to free. */
    h->tensors[h->n_tensors - 1].released = true;
    rt_value_out o = {h_value(h, "a", "y"), h_tensor_new(h, 0, "stray")};
    rt_iter i0 = I0;
    assert_int_equal(rt_node_done(h->rt, 99, h_node(h, "a"), &i0, &o, 1, false, NULL), BT_ENOENT);
    h_pump(h);
    assert_true(released(h, "stray"));
    /* A completion of a node that is not running is stray too. */
    rt_value_out o2 = {h_value(h, "c", "out"), h_tensor_new(h, 0, "early")};
    assert_int_equal(rt_node_done(h->rt, 1, h_node(h, "c"), &i0, &o2, 1, false, NULL), 0);
    h_pump(h);
    assert_true(released(h, "early"));
    assert_null(h_response_of(h, 1));
    rt_cancel(h->rt, 1);
    h_pump(h);
    h->n_inflight = 0;
    finish_ok(h);
}

/* A stream consumer that raises finish on a non-final dispatch (an EOS
 * heard mid-stream) still ends its loop after the iteration. */
static void test_stream_consumer_finish(void **state)
{
    (void)state;
    harness *h = h_create(HEAD
        "      sequential:\n"
        "        - node: {name: s, model: m, inputs: [x], outputs: [{name: q, to: p}]}\n"
        "        - loop:\n"
        "            name: L\n"
        "            max_iters: 5\n"
        "            body:\n"
        "              sequential:\n"
        "                - node: {name: p, model: m1, inputs: [q], outputs: [{name: au, to: c, stream: true}, {name: q, to: p}]}\n"
        "                - node: {name: c, model: m, consumes_stream: true, inputs: [au], outputs: [{name: t, to: client, new_token: true}]}\n",
        0);
    h_start(h, 1, true, NULL, 0);
    h_complete(h, h_find(h, 1, "s", &I0), false);
    rt_iter i0 = IT1(0), i1 = IT1(1);
    h_chunk(h, h_find(h, 1, "p", &i0), "au", false, false);
    h_dispatch *c = h_find(h, 1, "c", &i0);
    assert_non_null(c);
    assert_false(c->stream_final);
    h_complete(h, c, true);
    h_chunk(h, h_find(h, 1, "p", &i0), "au", false, true);
    h_complete_skip(h, h_find(h, 1, "p", &i0), false, "au");
    c = h_find(h, 1, "c", &i0);
    assert_non_null(c);
    assert_true(c->stream_final);
    h_complete(h, c, false);
    assert_null(h_find(h, 1, "p", &i1));
    assert_non_null(h_response_of(h, 1));
    finish_ok(h);
}

/* A worker that runs ahead is sent an Extend once half of its window is
 * used, not one per accepted iteration, and never starves: every iteration
 * up to the loop's last is reachable, and the last Extend reaches it. */
static void test_extend_per_half_window(void **state)
{
    (void)state;
    harness *h = h_create(HEAD
        "      sequential:\n"
        "        - node: {name: s, model: m, inputs: [x], outputs: [{name: t, to: d}]}\n"
        "        - loop:\n"
        "            name: L\n"
        "            max_iters: 40\n"
        "            body:\n"
        "              node: {name: d, model: m, async: true, inputs: [t], outputs: [{name: t, to: d}, {name: k, to: client, new_token: true}]}\n",
        8);
    h_start(h, 1, true, NULL, 0);
    h_complete(h, h_find(h, 1, "s", &I0), false);
    size_t ext = h->n_extends;
    for (unsigned i = 0; i < 40; i++) {
        rt_iter it = IT1(i);
        h_dispatch *d = h_find(h, 1, "d", &it);
        assert_non_null(d); /* within the window: the worker is never stalled */
        h_complete(h, d, false);
        /* The Dispatch opened 0..8; each fourth accepted iteration opens
         * four more (an Extend after 4, 8, ...), and the one that brings
         * the last iteration into reach (31) opens what is left. */
        if (i < 31)
            assert_int_equal(h->n_extends - ext, i / 4);
    }
    assert_int_equal(h->n_extends - ext, 8);
    assert_int_equal(h_response_of(h, 1)->code, BT_CODE_OK);
    finish_ok(h);
}

/* A finish from another body node closes the window of a speculating node
 * without extending it first. */
static void test_no_extend_after_finish(void **state)
{
    (void)state;
    harness *h = h_create(HEAD
        "      sequential:\n"
        "        - node: {name: s, model: m, inputs: [x], outputs: [{name: t, to: d}]}\n"
        "        - loop:\n"
        "            name: L\n"
        "            max_iters: 20\n"
        "            body:\n"
        "              parallel:\n"
        "                - node: {name: d, model: m, async: true, inputs: [t], outputs: [{name: t, to: d}, {name: k, to: client, new_token: true}]}\n"
        "                - node: {name: f, model: m1, inputs: [x], outputs: [{name: u, to: client, new_token: true}]}\n",
        2);
    h_start(h, 1, true, NULL, 0);
    h_complete(h, h_find(h, 1, "s", &I0), false);
    rt_iter i0 = IT1(0), i1 = IT1(1);
    h_complete(h, h_find(h, 1, "f", &i0), false);
    h_complete(h, h_find(h, 1, "d", &i0), false);
    h_complete(h, h_find(h, 1, "f", &i1), true); /* finish in iteration 1 */
    size_t ext = h->n_extends;
    h_complete(h, h_find(h, 1, "d", &i1), false);
    assert_int_equal(h->n_extends, ext);
    assert_string_equal(h->last_drop, "d@2");
    assert_int_equal(h_response_of(h, 1)->code, BT_CODE_OK);
    h->n_inflight = 0; /* the worker's dropped iteration 2 */
    finish_ok(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_parallel_fanout_fanin),
        cmocka_unit_test(test_loop_max_iters),
        cmocka_unit_test(test_loop_finish_at_k),
        cmocka_unit_test(test_client_names),
        cmocka_unit_test(test_request_max_iters),
        cmocka_unit_test(test_loopback_lands_in_next_slot),
        cmocka_unit_test(test_persist),
        cmocka_unit_test(test_accumulate_order),
        cmocka_unit_test(test_nested_loops),
        cmocka_unit_test(test_stream_consumer),
        cmocka_unit_test(test_stream_joined_for_plain_consumer),
        cmocka_unit_test(test_speculation_rolled_back_by_finish),
        cmocka_unit_test(test_speculation_to_max_iters),
        cmocka_unit_test(test_cancel_mid_loop),
        cmocka_unit_test(test_stop_mid_loop),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_worker_lost),
        cmocka_unit_test(test_node_failure),
        cmocka_unit_test(test_missing_output),
        cmocka_unit_test(test_duplicate_and_stray),
        cmocka_unit_test(test_stream_consumer_finish),
        cmocka_unit_test(test_no_extend_after_finish),
        cmocka_unit_test(test_extend_per_half_window),
    };
    return cmocka_run_group_tests_name("runtime", tests, NULL, NULL);
}
