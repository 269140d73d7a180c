/* Graph building (config/graph_build.c): the semantic checks of the
 * deployment format (config/README.md), each asserting the line of the error and its message, and the
 * derived I/O and partition of the examples. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "config/config.h"
#include "config/graph.h"

/* Lines 1-10; graph bodies start on line 11. */
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
    "    inputs: [x]\n"

typedef struct built {
    bt_diag *diag;
    cfg_config *cfg;
    graph_set *gs;
    int rc;
} built;

static built build(const char *yaml)
{
    built b = {0};
    b.diag = bt_diag_create("t.yaml");
    b.rc = cfg_load_string(yaml, strlen(yaml), "t.yaml", b.diag, &b.cfg);
    assert_int_equal(b.rc, 0); /* these tests are about graph semantics, not schema */
    b.rc = graph_set_build(b.cfg, b.diag, &b.gs);
    return b;
}

static void built_free(built *b)
{
    graph_set_destroy(b->gs);
    cfg_config_destroy(b->cfg);
    bt_diag_destroy(b->diag);
}

/* Asserts that building YAML fails with an error at LINE whose message
 * contains NEEDLE. */
static void expect_error(const char *yaml, int line, const char *needle)
{
    built b = build(yaml);
    if (b.rc != BT_ECONFIG || !bt_diag_find(b.diag, needle)) {
        bt_diag_print(b.diag, stderr);
        fail_msg("expected an error containing \"%s\"", needle);
    }
    const bt_diag_item *it = bt_diag_find(b.diag, needle);
    assert_int_equal(it->level, BT_DIAG_ERROR);
    if (it->line != line) {
        bt_diag_print(b.diag, stderr);
        fail_msg("error \"%s\" at line %d, expected %d", it->message, it->line, line);
    }
    built_free(&b);
}

static void test_no_producer(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      node: {name: a, model: m, inputs: [x, y], outputs: []}\n",
                 12, "input 'y' of node 'a' has no producer: no edge targets it and graph 'g' "
                     "has no input named 'y'");
}

static void test_loopback_only_input(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      loop:\n"
                      "        name: L\n"
                      "        max_iters: 3\n"
                      "        body:\n"
                      "          node: {name: a, model: m, inputs: [t], outputs: [{name: t, to: a}]}\n",
                 16, "input 't' of node 'a' has no producer in iteration 0 of loop 'L'");
}

static void test_external_without_persist(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      sequential:\n"
                      "        - node: {name: e, model: m, inputs: [x], outputs: [{name: c, to: a}]}\n"
                      "        - loop:\n"
                      "            name: L\n"
                      "            max_iters: 3\n"
                      "            body:\n"
                      "              node: {name: a, model: m, inputs: [c], outputs: []}\n",
                 18, "input 'c' of node 'a' has no producer in iterations >= 1 of loop 'L': an "
                     "edge from outside a loop delivers to iteration 0 only");
}

static void test_persist_and_loopback(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      sequential:\n"
                      "        - node: {name: e, model: m, inputs: [x], outputs: [{name: c, to: a, persist: true}]}\n"
                      "        - loop:\n"
                      "            name: L\n"
                      "            max_iters: 3\n"
                      "            body:\n"
                      "              node: {name: a, model: m, inputs: [c], outputs: [{name: c, to: a}]}\n",
                 18, "both a persisted external producer and a loop-back producer");
}

static void test_missing_node_with_suggestion(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      sequential:\n"
                      "        - node: {name: prefill, model: m, inputs: [x], outputs: [{name: t, to: decod}]}\n"
                      "        - node: {name: decode, model: m, inputs: [t], outputs: []}\n",
                 13, "goes to 'decod', which is not a node of graph 'g'; did you mean 'decode'?");
}

static void test_edge_to_unknown_input(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      sequential:\n"
                      "        - node: {name: a, model: m, inputs: [x], outputs: [{name: q, to: b}]}\n"
                      "        - node: {name: b, model: m, inputs: [x], outputs: []}\n",
                 13, "node 'b', which takes no input named 'q' (its inputs: x)");
}

static void test_cycle_outside_loop(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      sequential:\n"
                      "        - node: {name: a, model: m, inputs: [x, y], outputs: [{name: t, to: b}]}\n"
                      "        - node: {name: b, model: m, inputs: [t], outputs: [{name: y, to: a}]}\n",
                 14, "goes backwards outside a loop (a cycle)");
}

static void test_edge_between_parallel_branches(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      parallel:\n"
                      "        - node: {name: a, model: m, inputs: [x], outputs: [{name: t, to: b}]}\n"
                      "        - node: {name: b, model: m1, inputs: [t], outputs: []}\n",
                 13, "joins two branches of a parallel section");
}

static void test_edge_leaving_loop(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      sequential:\n"
                      "        - loop:\n"
                      "            name: L\n"
                      "            max_iters: 2\n"
                      "            body:\n"
                      "              node: {name: a, model: m, inputs: [x], outputs: [{name: t, to: b}]}\n"
                      "        - node: {name: b, model: m, inputs: [t], outputs: []}\n",
                 17, "leaves loop 'L'; a value leaves a loop only through the loop's outputs");
}

static void test_persist_entering_no_loop(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      sequential:\n"
                      "        - node: {name: a, model: m, inputs: [x], outputs: [{name: t, to: b, persist: true}]}\n"
                      "        - node: {name: b, model: m, inputs: [t], outputs: []}\n",
                 13, "has persist: true but enters no loop");
}

static void test_two_stream_inputs(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      sequential:\n"
                      "        - node: {name: a, model: m, inputs: [x], outputs: [{name: p, to: c, stream: true}]}\n"
                      "        - node: {name: b, model: m, inputs: [x], outputs: [{name: q, to: c, stream: true}]}\n"
                      "        - node: {name: c, model: m, consumes_stream: true, inputs: [p, q], outputs: []}\n",
                 15, "node 'c' has 2 stream inputs; a node takes at most one");
}

static void test_consumes_stream_without_stream(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      node: {name: a, model: m, consumes_stream: true, inputs: [x], outputs: []}\n",
                 12, "has consumes_stream: true but none of its inputs arrives on a stream edge");
}

static void test_loop_output_names_nothing(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      sequential:\n"
                      "        - node: {name: p, model: m, inputs: [x], outputs: [{name: t, to: a}]}\n"
                      "        - loop:\n"
                      "            name: L\n"
                      "            max_iters: 2\n"
                      "            body:\n"
                      "              node: {name: a, model: m, inputs: [t], outputs: [{name: t, to: a}]}\n"
                      "            outputs: [{name: z, to: client}]\n",
                 19, "loop 'L' outputs 'z', but no node directly in its body produces a value");
}

static void test_edge_to_loop(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      sequential:\n"
                      "        - node: {name: p, model: m, inputs: [x], outputs: [{name: t, to: L}]}\n"
                      "        - loop:\n"
                      "            name: L\n"
                      "            max_iters: 2\n"
                      "            body:\n"
                      "              node: {name: a, model: m, inputs: [t], outputs: [{name: t, to: a}]}\n",
                 13, "goes to loop 'L'; edges go to nodes");
}

static void test_stream_loopback(void **state)
{
    (void)state;
    expect_error(HEAD "    body:\n"
                      "      sequential:\n"
                      "        - node: {name: p, model: m, inputs: [x], outputs: [{name: t, to: a}]}\n"
                      "        - loop:\n"
                      "            name: L\n"
                      "            max_iters: 2\n"
                      "            body:\n"
                      "              node: {name: a, model: m, inputs: [t], outputs: [{name: t, to: a, stream: true}]}\n",
                 18, "is a stream that loops back");
}

static void test_too_many_inputs(void **state)
{
    (void)state;
    char yaml[4096];
    size_t off = (size_t)snprintf(yaml, sizeof(yaml),
                                  "version: 1\nworkers: [{name: w0, device: cpu}]\n"
                                  "models: [{name: m, backend: echo, worker: w0}]\n"
                                  "graphs:\n  - name: g\n    inputs: [");
    for (int i = 0; i < 65; i++)
        off += (size_t)snprintf(yaml + off, sizeof(yaml) - off, "%si%d", i ? ", " : "", i);
    snprintf(yaml + off, sizeof(yaml) - off,
             "]\n    body: {node: {name: a, model: m, inputs: [i0], outputs: []}}\n");
    built b = build(yaml);
    assert_int_equal(b.rc, BT_ECONFIG);
    assert_non_null(bt_diag_find(b.diag, "has 65 inputs; at most 64"));
    built_free(&b);
}

static void test_all_errors_reported(void **state)
{
    (void)state;
    built b = build(HEAD "    body:\n"
                         "      sequential:\n"
                         "        - node: {name: a, model: m, inputs: [x, y], outputs: [{name: t, to: bb}]}\n"
                         "        - node: {name: b, model: m, inputs: [t, z], outputs: [{name: y, to: a}]}\n");
    assert_int_equal(b.rc, BT_ECONFIG);
    /* bb missing, the backward edge, b.t and b.z without producers, a.y
     * without one (its only edge was rejected). */
    assert_true(b.diag->n_errors >= 4);
    assert_non_null(bt_diag_find(b.diag, "'bb'"));
    assert_non_null(bt_diag_find(b.diag, "(a cycle)"));
    assert_non_null(bt_diag_find(b.diag, "input 'z' of node 'b'"));
    built_free(&b);
}

static void test_async_warning(void **state)
{
    (void)state;
    built b = build(HEAD "    body:\n"
                         "      sequential:\n"
                         "        - node: {name: p, model: m, inputs: [x], outputs: [{name: t, to: a}]}\n"
                         "        - loop:\n"
                         "            name: L\n"
                         "            max_iters: 2\n"
                         "            body:\n"
                         "              sequential:\n"
                         "                - node: {name: a, model: m, async: true, inputs: [t], outputs: [{name: u, to: c}]}\n"
                         "                - node: {name: c, model: m, inputs: [u], outputs: [{name: t, to: a}]}\n");
    assert_int_equal(b.rc, 0);
    const bt_diag_item *w = bt_diag_find(b.diag, "node 'a' is async but cannot be run ahead");
    assert_non_null(w);
    assert_int_equal(w->level, BT_DIAG_WARNING);
    assert_int_equal(w->line, 19);
    assert_false(b.gs->graphs[0].entities[graph_entity_find(&b.gs->graphs[0], "a")]
                     .u.node.speculative);
    built_free(&b);
}

static built build_file(const char *path)
{
    built b = {0};
    b.diag = bt_diag_create(path);
    b.rc = cfg_load_file(path, b.diag, &b.cfg);
    if (b.rc == 0)
        b.rc = graph_set_build(b.cfg, b.diag, &b.gs);
    if (b.rc)
        bt_diag_print(b.diag, stderr);
    assert_int_equal(b.rc, 0);
    return b;
}

static const graph_node *node_of(const graph *g, const char *name)
{
    int e = graph_entity_find(g, name);
    assert_true(e >= 0);
    assert_int_equal(g->entities[e].kind, GRAPH_NODE);
    return &g->entities[e].u.node;
}

static void test_chat_derived_io(void **state)
{
    (void)state;
    built b = build_file("config/examples/chat-cpu.yaml");
    const graph *g = graph_set_find(b.gs, "chat");
    assert_non_null(g);
    const graph_node *dec = node_of(g, "decode");
    assert_true(dec->speculative);
    assert_int_equal(dec->n_inputs, 1);
    const graph_input *tok = &dec->inputs[0];
    assert_int_equal(tok->n_edges, 2);
    /* prefill's token in iteration 0, decode's own after. */
    assert_int_equal(g->edges[tok->edges[0]].kind, GRAPH_EDGE_EXTERNAL);
    assert_int_equal(g->edges[tok->edges[1]].kind, GRAPH_EDGE_LOOPBACK);
    assert_int_equal(tok->fanin_first, 1);
    assert_int_equal(tok->fanin_later, 1);
    uint32_t v0[1] = {0}, v3[1] = {3};
    assert_true(graph_edge_applies(&g->edges[tok->edges[0]], v0, 1));
    assert_false(graph_edge_applies(&g->edges[tok->edges[0]], v3, 1));
    assert_false(graph_edge_applies(&g->edges[tok->edges[1]], v0, 1));
    assert_true(graph_edge_applies(&g->edges[tok->edges[1]], v3, 1));
    int loop = graph_entity_find(g, "decode_loop");
    const graph_section *ls = &g->sections[g->entities[loop].section];
    assert_int_equal(ls->n_ext_inputs, 1);
    assert_int_equal(g->entities[loop].u.loop.n_loopback_edges, 1);
    assert_int_equal(node_of(g, "prefill")->inputs[0].graph_input, 0);
    assert_int_equal(b.gs->n_transfers, 0);
    built_free(&b);
}

static void test_image_partition(void **state)
{
    (void)state;
    built b = build_file("config/examples/image.yaml");
    const graph *g = &b.gs->graphs[0];
    /* The encoder's output is persisted into the denoise loop. */
    bool persisted = false;
    for (size_t e = 0; e < g->n_edges; e++)
        persisted |= g->edges[e].persist && g->edges[e].kind == GRAPH_EDGE_EXTERNAL;
    assert_true(persisted);
    /* Every cross-worker edge is a transfer between CPU workers. */
    size_t cross = 0;
    for (size_t e = 0; e < g->n_edges; e++) {
        const graph_edge *ge = &g->edges[e];
        if (ge->consumer < 0 || g->entities[ge->producer].kind != GRAPH_NODE)
            continue;
        cross += g->entities[ge->producer].u.node.worker != g->entities[ge->consumer].u.node.worker;
    }
    assert_true(b.gs->n_transfers >= cross);
    for (size_t t = 0; t < b.gs->n_transfers; t++) {
        assert_int_equal(b.gs->transfers[t].kind, GRAPH_XFER_SHM);
        assert_int_not_equal(b.gs->transfers[t].from_worker, b.gs->transfers[t].to_worker);
    }
    built_free(&b);
}

static void test_tp_partition(void **state)
{
    (void)state;
    built b = build_file("config/examples/tp.yaml");
    /* A tensor-parallel node is placed on both of its GPUs. */
    assert_true(b.cfg->n_workers >= 2);
    assert_true(b.gs->n_worker_nodes[0] > 0);
    assert_int_equal(b.gs->n_worker_nodes[0], b.gs->n_worker_nodes[1]);
    built_free(&b);
}

/* Transfer kinds from the hosts the config gives: same host in place,
 * two hosts a socket (CPU) or nccl (a GPU), an external worker without
 * `host:` decided at registration; a cross-host producer without
 * peer_listen is warned about. */
static void test_cross_host_kinds(void **state)
{
    (void)state;
    static const char yaml[] =
        "version: 1\n"
        "workers:\n"
        "  - {name: a, device: cpu, host: h1}\n"
        "  - {name: b, device: cpu, host: h2, peer_listen: \"tcp://127.0.0.1:*\"}\n"
        "  - {name: c, device: cpu, host: h2}\n"
        "  - {name: d, device: cpu, spawn: external}\n"
        "models:\n"
        "  - {name: ma, backend: echo, worker: a}\n"
        "  - {name: mb, backend: echo, worker: b}\n"
        "  - {name: mc, backend: echo, worker: c}\n"
        "  - {name: md, backend: echo, worker: d}\n"
        "graphs:\n"
        "  - name: g\n"
        "    inputs: [x]\n"
        "    body:\n"
        "      sequential:\n"
        "        - node: {name: n1, model: ma, inputs: [x], outputs: [{name: x, to: n2}]}\n"
        "        - node: {name: n2, model: mb, inputs: [x], outputs: [{name: x, to: n3}]}\n"
        "        - node: {name: n3, model: mc, inputs: [x], outputs: [{name: x, to: n4}]}\n"
        "        - node: {name: n4, model: md, inputs: [x], outputs: [{name: x, to: client}]}\n";
    built b = build(yaml);
    assert_int_equal(b.rc, 0);
    assert_int_equal(b.gs->n_transfers, 3);
    for (size_t t = 0; t < 3; t++) {
        const graph_transfer *x = &b.gs->transfers[t];
        if (x->from_worker == 0)
            assert_int_equal(x->kind, GRAPH_XFER_SOCKET);
        else if (x->from_worker == 1)
            assert_int_equal(x->kind, GRAPH_XFER_SHM);
        else
            assert_int_equal(x->kind, GRAPH_XFER_REMOTE);
    }
    assert_non_null(bt_diag_find(b.diag, "worker 'a' (host h1) feeds worker 'b' (host h2) but "
                                          "has no 'peer_listen'"));
    assert_int_equal(graph_transfer_kind_of(false, true, true), GRAPH_XFER_NCCL);
    assert_int_equal(graph_transfer_kind_of(false, true, false), GRAPH_XFER_NONE);
    assert_int_equal(graph_transfer_kind_of(false, false, true), GRAPH_XFER_NONE);
    assert_int_equal(graph_transfer_kind_of(false, false, false), GRAPH_XFER_SOCKET);
    assert_int_equal(graph_transfer_kind_of(true, true, true), GRAPH_XFER_CUDA_IPC);
    assert_int_equal(graph_transfer_kind_of(true, false, true), GRAPH_XFER_HOST_STAGED);
    built_free(&b);
}

/* Which pools each worker may be asked to read (graph_set_reaches): a
 * chain a -> b -> c in one graph makes c read a's pool too (b may pass a's
 * tensor on by reference), while a chain that needs two graphs (c -> d in
 * g, d -> e in h) does not make e read c's; replicas feed their consumer
 * each; nothing reaches a worker no edge goes to. */
static void test_reaches(void **state)
{
    (void)state;
    static const char yaml[] =
        "version: 1\n"
        "workers:\n"
        "  - {name: a, device: cpu}\n"
        "  - {name: b, device: cpu}\n"
        "  - {name: c, device: cpu}\n"
        "  - {name: d, device: cpu}\n"
        "  - {name: e, device: cpu}\n"
        "  - {name: r1, device: cpu}\n"
        "  - {name: r2, device: cpu}\n"
        "models:\n"
        "  - {name: ma, backend: echo, worker: a}\n"
        "  - {name: mb, backend: echo, worker: b}\n"
        "  - {name: mc, backend: echo, worker: c}\n"
        "  - {name: md, backend: echo, worker: d}\n"
        "  - {name: me, backend: echo, worker: e}\n"
        "  - {name: mr, backend: echo, workers: [r1, r2]}\n"
        "graphs:\n"
        "  - name: g\n"
        "    inputs: [x]\n"
        "    body:\n"
        "      sequential:\n"
        "        - node: {name: n1, model: ma, inputs: [x], outputs: [{name: x, to: n2}]}\n"
        "        - node: {name: n2, model: mb, inputs: [x], outputs: [{name: x, to: n3}]}\n"
        "        - node: {name: n3, model: mc, inputs: [x], outputs: [{name: x, to: n4}]}\n"
        "        - node: {name: n4, model: md, inputs: [x], outputs: [{name: x, to: client}]}\n"
        "  - name: h\n"
        "    inputs: [x]\n"
        "    body:\n"
        "      sequential:\n"
        "        - node: {name: n1, model: md, inputs: [x], outputs: [{name: x, to: n2}]}\n"
        "        - node: {name: n2, model: me, inputs: [x], outputs: [{name: x, to: client}]}\n"
        "  - name: k\n"
        "    inputs: [x]\n"
        "    body:\n"
        "      sequential:\n"
        "        - node: {name: n1, model: mr, inputs: [x], outputs: [{name: x, to: n2}]}\n"
        "        - node: {name: n2, model: me, inputs: [x], outputs: [{name: x, to: client}]}\n";
    enum { A, B, C, D, E, R1, R2, N };
    /* want[to] lists the workers whose pools TO may read. */
    static const int want[N][N] = {
        [B] = {[A] = 1},
        [C] = {[A] = 1, [B] = 1},
        [D] = {[A] = 1, [B] = 1, [C] = 1},
        [E] = {[D] = 1, [R1] = 1, [R2] = 1},
    };
    built b = build(yaml);
    assert_int_equal(b.rc, 0);
    for (int to = 0; to < N; to++)
        for (int from = 0; from < N; from++)
            if (graph_set_reaches(b.gs, from, to) != (want[to][from] != 0))
                fail_msg("reaches(%d -> %d) is %d, want %d", from, to,
                         graph_set_reaches(b.gs, from, to), want[to][from]);
    built_free(&b);
}

/* A replicated model: its nodes list on every replica, no transfer between
 * two nodes of it (a request stays on its replica), one from each replica
 * to a node elsewhere, and a graph input read by it and by that node goes
 * from each replica; the summary names the replicas and the routing. */
static void test_replicas(void **state)
{
    (void)state;
    static const char yaml[] =
        "version: 1\n"
        "workers:\n"
        "  - {name: a, device: cpu}\n"
        "  - {name: b, device: cpu}\n"
        "  - {name: c, device: cpu}\n"
        "models:\n"
        "  - {name: r, backend: echo, workers: [a, b], routing: least_loaded}\n"
        "  - {name: s, backend: echo, worker: c}\n"
        "graphs:\n"
        "  - name: g\n"
        "    inputs: [x]\n"
        "    body:\n"
        "      sequential:\n"
        "        - node: {name: n1, model: r, inputs: [x], outputs: [{name: y, to: n2}]}\n"
        "        - node: {name: n2, model: r, inputs: [y], outputs: [{name: y, to: n3}]}\n"
        "        - node: {name: n3, model: s, inputs: [y, x], outputs: [{name: y, to: client}]}\n";
    built b = build(yaml);
    assert_int_equal(b.rc, 0);
    const graph *g = &b.gs->graphs[0];
    for (int e = 0; e < 2; e++)
        assert_true(g->entities[graph_entity_find(g, e ? "n2" : "n1")].u.node.replicated);
    assert_false(g->entities[graph_entity_find(g, "n3")].u.node.replicated);
    assert_int_equal(b.gs->n_worker_nodes[0], 2);
    assert_int_equal(b.gs->n_worker_nodes[1], 2);
    assert_int_equal(b.gs->n_worker_nodes[2], 1);
    /* n2 -> n3 from a and from b; input x from a and from b to c. */
    assert_int_equal(b.gs->n_transfers, 4);
    for (size_t t = 0; t < b.gs->n_transfers; t++) {
        assert_int_equal(b.gs->transfers[t].to_worker, 2);
        assert_int_equal(b.gs->transfers[t].from_worker, (int)(t % 2));
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    graph_set_print(b.gs, f);
    fclose(f);
    assert_non_null(strstr(text, "r: backend echo, max_batch 1, on a b (2 replicas, routing "
                                 "least_loaded)\n"));
    assert_non_null(strstr(text, "node n1: model r, mode '', on a or b (one replica per "
                                 "request)\n"));
    assert_non_null(strstr(text, "node n3: model s, mode '', on c\n"));
    free(text);
    built_free(&b);
}

static void test_omni_stream(void **state)
{
    (void)state;
    built b = build_file("config/examples/omni.yaml");
    const graph *g = &b.gs->graphs[0];
    bool found = false;
    for (size_t i = 0; i < g->n_entities; i++) {
        const graph_entity *en = &g->entities[i];
        if (en->kind == GRAPH_NODE && en->u.node.consumes_stream) {
            const graph_input *in = &en->u.node.inputs[en->u.node.stream_input];
            const graph_edge *e = &g->edges[in->edges[0]];
            assert_int_equal(g->entities[e->producer].kind, GRAPH_LOOP);
            assert_int_equal(g->values[e->value].role, GRAPH_VALUE_LOOP_ACCUM);
            found = true;
        }
    }
    assert_true(found);
    built_free(&b);
}

/* voice.yaml's voice_chat: the decoder's text reaches the client as
 * `transcript` and the LLM's as `answer` (`as`), and the transcript enters
 * prefill through the accumulate of both loops, after the optional input
 * `context` (the turns before); the summary says so. */
static void test_voice_chat_names(void **state)
{
    (void)state;
    built b = build_file("config/examples/voice.yaml");
    const graph *g = NULL;
    for (size_t i = 0; i < b.gs->n_graphs; i++)
        if (strcmp(b.gs->graphs[i].name, "voice_chat") == 0)
            g = &b.gs->graphs[i];
    assert_non_null(g);
    int transcript = 0, answer = 0, into_prefill = 0;
    for (size_t i = 0; i < g->n_edges; i++) {
        const graph_edge *e = &g->edges[i];
        const char *producer = g->entities[e->producer].name;
        if (e->consumer < 0) {
            assert_string_equal(g->values[e->value].name, "text");
            transcript += strcmp(e->client_name, "transcript") == 0 && !strcmp(producer, "decode");
            answer += strcmp(e->client_name, "answer") == 0 &&
                      (!strcmp(producer, "prefill") || !strcmp(producer, "answer"));
        } else if (!strcmp(g->entities[e->consumer].name, "prefill")) {
            assert_string_equal(producer, "windows");
            assert_int_equal(g->values[e->value].role, GRAPH_VALUE_LOOP_ACCUM);
            into_prefill++;
        }
    }
    assert_int_equal(transcript, 1);
    assert_int_equal(answer, 2);
    assert_int_equal(into_prefill, 1);
    int ctx = graph_input_index(g, "context");
    assert_int_equal(ctx, 2);
    assert_int_equal(g->optional, UINT64_C(1) << ctx);
    int prefill = graph_entity_find(g, "prefill");
    const graph_node *n = &g->entities[prefill].u.node;
    assert_int_equal(n->n_inputs, 2);
    assert_string_equal(n->inputs[0].name, "context");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    graph_set_print(b.gs, f);
    fclose(f);
    assert_non_null(strstr(text, "decode.text -> client as transcript [client, new_token, text]"));
    assert_non_null(strstr(text, "answer.text -> client as answer"));
    assert_non_null(strstr(text, "inputs: audio options context (optional)\n"));
    free(text);
    built_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_producer),
        cmocka_unit_test(test_replicas),
        cmocka_unit_test(test_reaches),
        cmocka_unit_test(test_loopback_only_input),
        cmocka_unit_test(test_external_without_persist),
        cmocka_unit_test(test_persist_and_loopback),
        cmocka_unit_test(test_missing_node_with_suggestion),
        cmocka_unit_test(test_edge_to_unknown_input),
        cmocka_unit_test(test_cycle_outside_loop),
        cmocka_unit_test(test_edge_between_parallel_branches),
        cmocka_unit_test(test_edge_leaving_loop),
        cmocka_unit_test(test_persist_entering_no_loop),
        cmocka_unit_test(test_two_stream_inputs),
        cmocka_unit_test(test_consumes_stream_without_stream),
        cmocka_unit_test(test_loop_output_names_nothing),
        cmocka_unit_test(test_edge_to_loop),
        cmocka_unit_test(test_stream_loopback),
        cmocka_unit_test(test_all_errors_reported),
        cmocka_unit_test(test_too_many_inputs),
        cmocka_unit_test(test_async_warning),
        cmocka_unit_test(test_chat_derived_io),
        cmocka_unit_test(test_image_partition),
        cmocka_unit_test(test_tp_partition),
        cmocka_unit_test(test_cross_host_kinds),
        cmocka_unit_test(test_omni_stream),
        cmocka_unit_test(test_voice_chat_names),
    };
    return cmocka_run_group_tests_name("graph", tests, NULL, NULL);
}
