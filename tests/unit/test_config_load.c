/* The YAML loader: examples load, defaults are filled in, and each kind of
 * mistake is reported once, at its line, with a useful message. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/status.h"
#include "config/config.h"
#include "kernels/sched.h"

/* Two CPU workers and two models; graphs follow from line 9. */
#define PRELUDE                                      \
    "version: 1\n"                                   \
    "workers:\n"                                     \
    "  - {name: cpu0, device: cpu}\n"                \
    "  - {name: cpu1, device: cpu}\n"                \
    "models:\n"                                      \
    "  - {name: m, backend: echo, worker: cpu0}\n"   \
    "  - {name: c, backend: counter, worker: cpu1}\n" \
    "graphs:\n"

/* Loads YAML; returns the status, the config in *OUT (NULL on errors) and
 * the diagnostics in *DIAG. */
static int load(const char *yaml, bt_diag **diag, cfg_config **out)
{
    *diag = bt_diag_create("test.yaml");
    assert_non_null(*diag);
    return cfg_load_string(yaml, strlen(yaml), "test.yaml", *diag, out);
}

static cfg_config *load_ok(const char *yaml)
{
    bt_diag *d;
    cfg_config *c = NULL;
    int rc = load(yaml, &d, &c);
    if (rc != 0 || d->n_errors)
        bt_diag_print(d, stderr);
    assert_int_equal(rc, 0);
    assert_int_equal(d->n_errors, 0);
    assert_non_null(c);
    bt_diag_destroy(d);
    return c;
}

/* Asserts that YAML fails to load with an error containing NEEDLE at LINE,
 * and returns the number of errors. */
static size_t expect_error(const char *yaml, int line, const char *needle)
{
    bt_diag *d;
    cfg_config *c = (cfg_config *)1;
    int rc = load(yaml, &d, &c);
    const bt_diag_item *it = bt_diag_find(d, needle);
    if (!it || it->line != line) {
        fprintf(stderr, "wanted line %d: %s\n", line, needle);
        bt_diag_print(d, stderr);
    }
    assert_int_equal(rc, BT_ECONFIG);
    assert_null(c);
    assert_non_null(it);
    assert_int_equal(it->level, BT_DIAG_ERROR);
    assert_int_equal(it->line, line);
    assert_true(it->col >= 1);
    size_t n = d->n_errors;
    bt_diag_destroy(d);
    return n;
}

/* ---- files and defaults ---- */

static void test_examples_load(void **state)
{
    (void)state;
    static const char *const files[] = {
        "config/examples/chat-cpu.yaml", "config/examples/image.yaml",
        "config/examples/omni.yaml",     "config/examples/tp.yaml",
        "config/examples/test-loop.yaml",
    };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        bt_diag *d = bt_diag_create(files[i]);
        cfg_config *c = NULL;
        int rc = cfg_load_file(files[i], d, &c);
        if (rc != 0)
            bt_diag_print(d, stderr);
        assert_int_equal(rc, 0);
        assert_int_equal(d->n_errors, 0);
        assert_non_null(c);
        assert_true(c->n_graphs >= 1);
        cfg_config_destroy(c);
        bt_diag_destroy(d);
    }
}

static void test_chat_example_shape(void **state)
{
    (void)state;
    bt_diag *d = bt_diag_create("chat-cpu.yaml");
    cfg_config *c = NULL;
    assert_int_equal(cfg_load_file("config/examples/chat-cpu.yaml", d, &c), 0);
    assert_string_equal(c->file, "config/examples/chat-cpu.yaml");
    assert_string_equal(c->daemon.listen, "ipc:///tmp/baton/baton.sock");
    assert_string_equal(c->daemon.http_listen, "127.0.0.1:8000");
    assert_int_equal(c->n_openai, 1);
    assert_string_equal(c->openai[0].model, "smollm2");
    assert_string_equal(c->openai[0].graph, "chat");
    assert_string_equal(c->openai[0].input, "prompt");
    assert_string_equal(c->openai[0].output, "text");
    assert_string_equal(c->openai[0].loop, "decode_loop");

    const cfg_model *m = cfg_model_find(c, "llm");
    assert_non_null(m);
    assert_non_null(m->desc);
    assert_string_equal(m->desc->name, "transformer");
    assert_int_equal(m->n_workers, 1);
    assert_string_equal(m->workers[0].s, "cpu0");
    const cfg_option *o = cfg_model_option(m, "path");
    assert_non_null(o);
    assert_int_equal(o->type, BT_OPT_PATH);
    assert_string_equal(o->v.s, "models/smollm2-135m-instruct-q4_1.gguf");
    /* The file's own options, then declared defaults filled in. */
    assert_int_equal(cfg_model_option(m, "max_seq")->v.i, 2048);
    assert_string_equal(cfg_model_option(m, "kv_dtype")->v.s, "q8_0");
    assert_int_equal(cfg_model_option(m, "prefill_chunk")->v.i, 256);
    assert_true(cfg_model_option(m, "chat_template")->v.b);
    assert_int_equal(cfg_model_option(m, "eos")->v.i, -1);
    assert_int_equal(cfg_model_option(m, "threads")->v.i, 0);
    assert_string_equal(cfg_model_option(m, "activations")->v.s, "q8");
    assert_true(cfg_model_option(m, "prefix_cache")->v.b);
    assert_int_equal(cfg_model_option(m, "prefix_cache_mb")->v.i, 256);
    assert_false(cfg_model_option(m, "batch_invariant")->v.b);
    assert_int_equal(m->n_options, 11);

    const cfg_graph *g = &c->graphs[0];
    assert_string_equal(g->name, "chat");
    assert_int_equal(g->n_inputs, 1);
    assert_int_equal(g->body->kind, CFG_SEC_SEQUENTIAL);
    assert_int_equal(g->body->u.list.n, 2);
    const cfg_section *pre = g->body->u.list.items[0];
    assert_int_equal(pre->kind, CFG_SEC_NODE);
    assert_string_equal(pre->u.node.mode, "prefill");
    assert_int_equal(pre->u.node.n_outputs, 2);
    assert_string_equal(pre->u.node.outputs[0].to, "decode");
    assert_true(pre->u.node.outputs[1].new_token);
    assert_string_equal(pre->u.node.outputs[1].modality, "text");
    const cfg_section *loop = g->body->u.list.items[1];
    assert_int_equal(loop->kind, CFG_SEC_LOOP);
    assert_string_equal(loop->u.loop.name, "decode_loop");
    assert_int_equal(loop->u.loop.max_iters, 256);
    assert_int_equal(loop->u.loop.n_outputs, 0);
    assert_int_equal(loop->u.loop.body->kind, CFG_SEC_NODE);
    assert_true(loop->u.loop.body->u.node.async);
    cfg_config_destroy(c);
    bt_diag_destroy(d);
}

static void test_tp_example(void **state)
{
    (void)state;
    bt_diag *d = bt_diag_create("tp.yaml");
    cfg_config *c = NULL;
    assert_int_equal(cfg_load_file("config/examples/tp.yaml", d, &c), 0);
    const cfg_model *m = cfg_model_find(c, "llm");
    assert_int_equal(m->tp, 2);
    assert_int_equal(m->n_workers, 2);
    assert_int_equal(m->tp_step_timeout_ms, CFG_TP_STEP_TIMEOUT_MS);
    const cfg_worker *w = cfg_worker_find(c, "gpu1");
    assert_non_null(w);
    assert_int_equal(w->cuda_index, 1);
    assert_int_equal(w->streams_compute, 2);
    const cfg_profile *p = cfg_worker_profile(c, w);
    assert_non_null(p);
    assert_true(p->memory_bandwidth_gbps > 3000);
    /* tcp is not used, so no warning; the file loads clean. */
    assert_int_equal(d->n_errors, 0);
    cfg_config_destroy(c);
    bt_diag_destroy(d);
}

static void test_defaults(void **state)
{
    (void)state;
    cfg_config *c = load_ok(PRELUDE
                            "  - name: g\n"
                            "    body:\n"
                            "      node:\n"
                            "        name: a\n"
                            "        model: m\n"
                            "        outputs: [{name: y, to: client}, {name: z}]\n");
    assert_int_equal(c->version, 1);
    assert_string_equal(c->daemon.listen, "ipc:///run/baton/baton.sock");
    assert_string_equal(c->daemon.workers_endpoint, "ipc:///run/baton/workers.sock");
    assert_null(c->daemon.http_listen);
    assert_int_equal(c->daemon.max_inflight, 256);
    assert_int_equal(c->daemon.request_timeout_ms, 60000);
    assert_int_equal(c->daemon.drain_timeout_ms, 10000);
    assert_int_equal(c->daemon.max_message_bytes, 67108864);
    assert_int_equal(c->daemon.speculation_window, 8);
    assert_int_equal(c->daemon.max_request_timeout_ms, 600000);
    assert_int_equal(c->daemon.client_max_inflight, 64);
    assert_int_equal(c->daemon.client_max_reply_bytes, 67108864);
    assert_int_equal(c->daemon.client_stall_timeout_ms, 30000);
    assert_string_equal(c->daemon.log_level, "info");

    const cfg_worker *w = cfg_worker_find(c, "cpu0");
    assert_non_null(w);
    assert_int_equal(w->cuda_index, -1);
    assert_null(w->profile);
    assert_int_equal(w->pool_mb, 512);
    assert_int_equal(w->streams_compute, 1);
    assert_int_equal(w->streams_comm, 1);
    assert_int_equal(w->threads, 1);
    assert_int_equal(w->inline_us, CFG_INLINE_US_DEFAULT);
    assert_int_equal(w->spawn, CFG_SPAWN_AUTO);
    assert_string_equal(cfg_worker_profile(c, w)->name, "cpu");

    const cfg_model *m = cfg_model_find(c, "m");
    assert_int_equal(m->tp, 1);
    assert_int_equal(m->max_batch, 1);
    assert_int_equal(m->n_options, 0);
    /* counter's finish_after has no default: it stays unset. */
    assert_null(cfg_model_option(cfg_model_find(c, "c"), "finish_after"));

    const cfg_node *n = &c->graphs[0].body->u.node;
    assert_string_equal(n->mode, "");
    assert_false(n->async);
    assert_false(n->consumes_stream);
    assert_int_equal(n->n_inputs, 0);
    const cfg_edge *e = &n->outputs[0];
    assert_false(e->persist);
    assert_false(e->stream);
    assert_false(e->new_token);
    assert_string_equal(e->modality, "tensor");
    assert_int_equal(e->shard_dim, 0);
    assert_null(n->outputs[1].to); /* declares the value only */
    cfg_config_destroy(c);
}

static void test_test_backend_defaults(void **state)
{
    (void)state;
    cfg_config *c = load_ok("version: 1\n"
                            "workers: [{name: w, device: cpu}]\n"
                            "models:\n"
                            "  - {name: k, backend: chunks, worker: w}\n"
                            "  - {name: s, backend: sleep, worker: w, options: {ms: 250}}\n"
                            "  - {name: f, backend: fail, worker: w}\n"
                            "  - {name: n, backend: counter, worker: w, options: {finish_after: 4}}\n");
    assert_int_equal(cfg_model_option(cfg_model_find(c, "k"), "n")->v.i, 3);
    assert_int_equal(cfg_model_option(cfg_model_find(c, "s"), "ms")->v.i, 250);
    const cfg_option *msg = cfg_model_option(cfg_model_find(c, "f"), "message");
    assert_int_equal(msg->type, BT_OPT_STRING);
    assert_string_equal(msg->v.s, "failure injected by the fail backend");
    const cfg_option *fa = cfg_model_option(cfg_model_find(c, "n"), "finish_after");
    assert_int_equal(fa->v.i, 4);
    assert_int_equal(fa->pos.line, 7);
    cfg_config_destroy(c);
}

static void test_positions(void **state)
{
    (void)state;
    cfg_config *c = load_ok(PRELUDE                                  /* lines 1-8 */
                            "  - name: g\n"                          /* 9 */
                            "    inputs: [x]\n"                      /* 10 */
                            "    body:\n"                            /* 11 */
                            "      sequential:\n"                    /* 12 */
                            "        - node:\n"                      /* 13 */
                            "            name: a\n"                  /* 14 */
                            "            model: m\n"                 /* 15 */
                            "            inputs: [x]\n"              /* 16 */
                            "            outputs:\n"                 /* 17 */
                            "              - {name: y, to: b}\n"     /* 18 */
                            "        - node: {name: b, model: c, inputs: [y]}\n"); /* 19 */
    const cfg_graph *g = &c->graphs[0];
    assert_int_equal(g->pos.line, 9);
    assert_int_equal(g->inputs[0].pos.line, 10);
    assert_int_equal(g->inputs[0].pos.col, 14);
    assert_int_equal(g->body->pos.line, 12);
    assert_int_equal(g->body->pos.col, 7);
    const cfg_section *a = g->body->u.list.items[0];
    assert_int_equal(a->pos.line, 13);
    assert_int_equal(a->pos.col, 11);
    assert_int_equal(a->u.node.model_pos.line, 15);
    assert_int_equal(a->u.node.model_pos.col, 20);
    assert_int_equal(a->u.node.outputs[0].pos.line, 18);
    assert_int_equal(a->u.node.outputs[0].pos.col, 17);
    assert_int_equal(a->u.node.outputs[0].to_pos.line, 18);
    assert_int_equal(a->u.node.outputs[0].to_pos.col, 31);
    assert_int_equal(g->body->u.list.items[1]->pos.line, 19);
    assert_int_equal(cfg_worker_find(c, "cpu1")->pos.line, 4);
    assert_int_equal(cfg_model_find(c, "c")->workers[0].pos.line, 7);
    cfg_config_destroy(c);
}

static void test_plugin_options_untyped(void **state)
{
    (void)state;
    cfg_config *c = load_ok("version: 1\n"
                            "workers: [{name: w, device: cpu}]\n"
                            "models:\n"
                            "  - name: v\n"
                            "    backend: plugin:/usr/lib/baton/libvocoder.so\n"
                            "    worker: w\n"
                            "    options: {rate: 24000, voice: alto, fast: true}\n");
    const cfg_model *m = cfg_model_find(c, "v");
    assert_null(m->desc);
    assert_int_equal(m->n_options, 3);
    const cfg_option *o = cfg_model_option(m, "rate");
    assert_int_equal(o->type, BT_OPT_STRING);
    assert_string_equal(o->v.s, "24000");
    assert_string_equal(cfg_model_option(m, "fast")->v.s, "true");
    assert_string_equal(m->options[1].name, "voice"); /* file order */
    cfg_config_destroy(c);
}

static void test_check_paths_warns(void **state)
{
    (void)state;
    cfg_config *c = load_ok("version: 1\n"
                            "daemon:\n"
                            "  listen: ipc:///etc/passwd/baton-dir/baton.sock\n"
                            "  workers_endpoint: ipc:///tmp/baton-unit-new/a/workers.sock\n"
                            "workers: [{name: w, device: cpu}]\n"
                            "models:\n"
                            "  - name: llm\n"
                            "    backend: transformer\n"
                            "    worker: w\n"
                            "    options: {path: no/such/model.gguf}\n");
    bt_diag *d = bt_diag_create("test.yaml");
    assert_int_equal(cfg_check_paths(c, d), 2);
    assert_int_equal(d->n_errors, 0);
    assert_int_equal(d->n, 2);
    const bt_diag_item *it = bt_diag_find(d, "no/such/model.gguf");
    assert_non_null(it);
    assert_int_equal(it->level, BT_DIAG_WARNING);
    assert_int_equal(it->line, 10);
    /* A folder under a file cannot be made; one batond can make (it
     * makes its endpoints' folders) is not worth a warning. */
    it = bt_diag_find(d, "/etc/passwd/baton-dir");
    assert_non_null(it);
    assert_int_equal(it->level, BT_DIAG_WARNING);
    assert_null(bt_diag_find(d, "baton-unit-new"));
    bt_diag_destroy(d);
    cfg_config_destroy(c);
}

/* ---- transport security ---- */

/* A non-loopback tcp endpoint without curve keys is an error; insecure
 * turns it into a warning; loopback is a warning on its own. */
static void test_tcp_beyond_loopback_needs_curve(void **state)
{
    (void)state;
    expect_error("version: 1\ndaemon: {listen: 'tcp://0.0.0.0:5555'}\n", 2,
                 "listen 'tcp://0.0.0.0:5555' is a TCP endpoint beyond loopback");
    expect_error("version: 1\ndaemon:\n  workers_endpoint: 'tcp://10.1.2.3:5556'\n", 3,
                 "daemon.curve is not set");
    expect_error("version: 1\ndaemon: {listen: 'tcp://*:5555'}\n", 2, "insecure: true");
    expect_error("version: 1\ndaemon: {listen: 'tcp://eth0:5555'}\n", 2, "beyond loopback");

    bt_diag *d;
    cfg_config *c = NULL;
    assert_int_equal(
        load("version: 1\ndaemon:\n  insecure: true\n  listen: 'tcp://0.0.0.0:5555'\n", &d, &c),
        0);
    assert_non_null(c);
    assert_true(c->daemon.insecure);
    const bt_diag_item *it = bt_diag_find(d, "insecure: listen 'tcp://0.0.0.0:5555'");
    assert_non_null(it);
    assert_int_equal(it->level, BT_DIAG_WARNING);
    assert_int_equal(it->line, 4);
    cfg_config_destroy(c);
    bt_diag_destroy(d);

    static const char *const loopback[] = {"tcp://127.0.0.1:5555", "tcp://127.9.8.7:5555",
                                           "tcp://localhost:5555", "tcp://[::1]:5555"};
    for (size_t i = 0; i < 4; i++) {
        char yaml[160];
        snprintf(yaml, sizeof(yaml), "version: 1\ndaemon: {listen: '%s'}\n", loopback[i]);
        c = NULL;
        assert_int_equal(load(yaml, &d, &c), 0);
        it = bt_diag_find(d, "loopback TCP endpoint without CURVE");
        assert_non_null(it);
        assert_int_equal(it->level, BT_DIAG_WARNING);
        cfg_config_destroy(c);
        bt_diag_destroy(d);
    }
    assert_true(cfg_endpoint_is_loopback("tcp://127.0.0.1:1"));
    assert_false(cfg_endpoint_is_loopback("tcp://128.0.0.1:1"));
    assert_false(cfg_endpoint_is_loopback("tcp://[::2]:1"));
    assert_false(cfg_endpoint_is_loopback("ipc:///tmp/x"));
}

/* A peer_listen whose port another endpoint of the same host binds is an
 * error at the peer_listen: batond's own endpoints for a worker it spawns
 * (no host:), and another worker's peer_listen on the same host:. */
static void test_peer_listen_port_clash(void **state)
{
    (void)state;
    expect_error("version: 1\n"
                 "daemon: {listen: 'tcp://127.0.0.1:7000'}\n"
                 "workers:\n"
                 "  - {name: a, device: cpu, peer_listen: 'tcp://127.0.0.1:7000'}\n",
                 4, "worker 'a': peer_listen 'tcp://127.0.0.1:7000' uses the port of "
                    "daemon.listen 'tcp://127.0.0.1:7000'");
    expect_error("version: 1\n"
                 "daemon: {http_listen: '0.0.0.0:7100'}\n"
                 "workers:\n"
                 "  - {name: a, device: cpu, peer_listen: 'tcp://127.0.0.1:7100'}\n",
                 4, "uses the port of daemon.http_listen '0.0.0.0:7100'");
    expect_error("version: 1\n"
                 "workers:\n"
                 "  - {name: a, device: cpu, host: h1, peer_listen: 'tcp://127.0.0.1:7301'}\n"
                 "  - {name: b, device: cpu, host: h2, peer_listen: 'tcp://127.0.0.1:7301'}\n"
                 "  - {name: c, device: cpu, host: h1, peer_listen: 'tcp://127.0.0.1:7301'}\n",
                 5, "worker 'c': peer_listen 'tcp://127.0.0.1:7301' uses the port of worker "
                    "'a' (peer_listen 'tcp://127.0.0.1:7301') on the same host h1");
    /* No clash: other hosts, other ports, ephemeral ports, an external
     * worker whose host is not known, batond's ipc:// endpoints. */
    cfg_config *c = load_ok("version: 1\n"
                            "daemon: {listen: 'tcp://127.0.0.1:7000'}\n"
                            "workers:\n"
                            "  - {name: a, device: cpu, host: h1, peer_listen: 'tcp://127.0.0.1:7000'}\n"
                            "  - {name: b, device: cpu, host: h2, peer_listen: 'tcp://127.0.0.1:7000'}\n"
                            "  - {name: c, device: cpu, peer_listen: 'tcp://127.0.0.1:7001'}\n"
                            "  - {name: d, device: cpu, peer_listen: 'tcp://127.0.0.1:*'}\n"
                            "  - {name: e, device: cpu, peer_listen: 'tcp://127.0.0.1:*'}\n"
                            "  - {name: f, device: cpu, spawn: external, peer_listen: 'tcp://127.0.0.1:7000'}\n");
    assert_int_equal(c->n_workers, 6);
    cfg_config_destroy(c);
}

/* With curve set, tcp is fine at load; the key files are checked by
 * cfg_check_keys. */
static void test_curve_keys_parsed(void **state)
{
    (void)state;
    cfg_config *c = load_ok("version: 1\ndaemon:\n  listen: 'tcp://0.0.0.0:5555'\n"
                            "  curve: {secret_key: /k/s.key, client_keys: /k/c, worker_keys: /k/w,"
                            " public_key: /k/s.pub}\n  ipc_mode: 0640\n  ipc_group: baton\n"
                            "workers:\n  - {name: x, device: cpu, spawn: external, key: /k/x.key}\n");
    assert_true(c->daemon.curve);
    assert_string_equal(c->daemon.curve_secret_key.s, "/k/s.key");
    assert_int_equal(c->daemon.curve_secret_key.pos.line, 4);
    assert_string_equal(c->daemon.curve_public_key.s, "/k/s.pub");
    assert_string_equal(c->daemon.curve_client_keys.s, "/k/c");
    assert_string_equal(c->daemon.curve_worker_keys.s, "/k/w");
    assert_int_equal(c->daemon.ipc_mode, 0640);
    assert_string_equal(c->daemon.ipc_group, "baton");
    assert_string_equal(c->workers[0].key.s, "/k/x.key");
    cfg_config_destroy(c);

    c = load_ok("version: 1\n");
    assert_false(c->daemon.curve);
    assert_false(c->daemon.insecure);
    assert_int_equal(c->daemon.ipc_mode, 0660);
    assert_null(c->daemon.ipc_group);
    cfg_config_destroy(c);

    expect_error("version: 1\ndaemon:\n  curve: {client_keys: /k/c}\n", 3, "curve has no 'secret_key'");
    expect_error("version: 1\ndaemon:\n  ipc_mode: 0999\n", 3, "ipc_mode must be octal");
    expect_error("version: 1\ndaemon:\n  ipc_mode: 0060\n", 3, "ipc_mode must be octal");
    expect_error("version: 1\ndaemon:\n  insecure: maybe\n", 3, "insecure");
    /* An external worker on a CURVE tcp worker socket needs its key. */
    expect_error("version: 1\ndaemon:\n  workers_endpoint: 'tcp://10.0.0.1:5556'\n"
                 "  curve: {secret_key: /k/s.key}\n"
                 "workers:\n  - {name: x, device: cpu, spawn: external}\n",
                 6, "give it 'key:'");
}

/* A scratch folder for key files, removed by the test. */
static char key_dir[64];

static void write_file(const char *name, const char *text, mode_t mode, char *path,
                       size_t cap)
{
    snprintf(path, cap, "%s/%s", key_dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

/* Loads YAML (with %s replaced by the key folder) and runs cfg_check_keys
 * for WORKER; returns the diagnostics. */
static bt_diag *check_keys(const char *yaml_fmt, const char *worker, int *n_errors)
{
    char yaml[2048];
    snprintf(yaml, sizeof(yaml), yaml_fmt, key_dir, key_dir, key_dir, key_dir);
    bt_diag *d;
    cfg_config *c = NULL;
    int rc = load(yaml, &d, &c);
    if (rc)
        bt_diag_print(d, stderr);
    assert_int_equal(rc, 0);
    *n_errors = cfg_check_keys(c, worker, d);
    cfg_config_destroy(c);
    return d;
}

static void test_check_keys(void **state)
{
    (void)state;
    char pub[41], sec[41], other_pub[41], other_sec[41], path[128];
    snprintf(key_dir, sizeof(key_dir), "/tmp/baton-test-keys-%d", (int)getpid());
    assert_int_equal(mkdir(key_dir, 0700), 0);
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    assert_int_equal(zmq_curve_keypair(other_pub, other_sec), 0);
    char line[64];
    snprintf(line, sizeof(line), "%s\n", sec);
    write_file("s.key", line, 0600, path, sizeof(path));
    snprintf(line, sizeof(line), "%s\n", pub);
    write_file("s.pub", line, 0644, path, sizeof(path));
    snprintf(line, sizeof(line), "%s\n", sec);
    write_file("open.key", line, 0640, path, sizeof(path));
    write_file("short.key", "abc\n", 0600, path, sizeof(path));
    snprintf(line, sizeof(line), "%s\n", other_sec);
    write_file("m.key", line, 0600, path, sizeof(path));
    snprintf(line, sizeof(line), "%s\n", pub); /* the twin of another key */
    write_file("m.pub", line, 0644, path, sizeof(path));
    char list[256];
    snprintf(list, sizeof(list), "# clients\n%s\n\n  %s  \n", pub, other_pub);
    write_file("clients", list, 0644, path, sizeof(path));
    snprintf(list, sizeof(list), "# workers\n%s\nnot-a-key\n", pub);
    write_file("bad-list", list, 0644, path, sizeof(path));
    snprintf(list, sizeof(list), "%s gpu1\n%s gpu9\n", pub, other_pub);
    write_file("named", list, 0644, path, sizeof(path));

    int n;
    bt_diag *d = check_keys("version: 1\ndaemon:\n  curve:\n    secret_key: %s/s.key\n"
                            "    client_keys: %s/clients\n    worker_keys: %s/clients\n"
                            "    public_key: %s/s.pub\n",
                            NULL, &n);
    if (n)
        bt_diag_print(d, stderr);
    assert_int_equal(n, 0);
    bt_diag_destroy(d);

    /* A secret key readable by the group: refused at its line. */
    d = check_keys("version: 1\ndaemon:\n  curve:\n    secret_key: %s/open.key\n", NULL, &n);
    assert_int_equal(n, 1);
    const bt_diag_item *it = bt_diag_find(d, "readable by group or others (mode 0640)");
    assert_non_null(it);
    assert_int_equal(it->line, 4);
    assert_int_equal(it->col, 17);
    bt_diag_destroy(d);

    /* Not a key; a missing file; a .pub twin of another key. */
    d = check_keys("version: 1\ndaemon:\n  curve:\n    secret_key: %s/short.key\n", NULL, &n);
    assert_int_equal(n, 1);
    assert_non_null(bt_diag_find(d, "does not hold a secret key"));
    assert_null(bt_diag_find(d, "abc"));
    bt_diag_destroy(d);
    d = check_keys("version: 1\ndaemon:\n  curve:\n    secret_key: %s/none.key\n", NULL, &n);
    assert_int_equal(n, 1);
    assert_non_null(bt_diag_find(d, "No such file"));
    bt_diag_destroy(d);
    d = check_keys("version: 1\ndaemon:\n  curve:\n    secret_key: %s/m.key\n", NULL, &n);
    assert_int_equal(n, 1);
    assert_non_null(bt_diag_find(d, "is not the public key of"));
    bt_diag_destroy(d);

    /* A bad line of an authorized-keys file: its file line and column. */
    d = check_keys("version: 1\ndaemon:\n  curve:\n    secret_key: %s/s.key\n"
                   "    worker_keys: %s/bad-list\n", NULL, &n);
    assert_int_equal(n, 1);
    it = bt_diag_find(d, "bad-list:3:1: not a public key");
    assert_non_null(it);
    assert_int_equal(it->line, 5);
    bt_diag_destroy(d);

    /* Names in worker_keys: an external worker's is fine; one the config
     * lacks, or a spawned worker's, is a warning at the key's line. */
    d = check_keys("version: 1\ndaemon:\n  curve:\n    secret_key: %s/s.key\n"
                   "    worker_keys: %s/named\n"
                   "workers:\n  - {name: gpu1, device: cpu, spawn: external, key: %s/s.key}\n"
                   "  - {name: cpu0, device: cpu}\n", NULL, &n);
    assert_int_equal(n, 0);
    it = bt_diag_find(d, "names 'gpu9', which is no `spawn: external` worker");
    assert_non_null(it);
    assert_int_equal(it->line, 5);
    assert_int_equal(it->level, BT_DIAG_WARNING);
    assert_null(bt_diag_find(d, "names 'gpu1'"));
    bt_diag_destroy(d);

    /* A public_key that is not the secret key's. */
    d = check_keys("version: 1\ndaemon:\n  curve:\n    secret_key: %s/s.key\n"
                   "    public_key: %s/m.pub\n", NULL, &n);
    assert_int_equal(n, 0); /* m.pub holds pub: the same key */
    bt_diag_destroy(d);

    /* A worker's view: its own key, and batond's public key from the
     * secret key's .pub twin even when the secret is not readable. */
    d = check_keys("version: 1\ndaemon:\n  workers_endpoint: 'tcp://10.0.0.1:5556'\n"
                   "  curve: {secret_key: %s/s.key}\n"
                   "workers:\n  - {name: x, device: cpu, spawn: external, key: %s/open.key}\n",
                   "x", &n);
    assert_int_equal(n, 1);
    it = bt_diag_find(d, "worker 'x' key");
    assert_non_null(it);
    assert_int_equal(it->line, 6);
    bt_diag_destroy(d);

    static const char *const files[] = {"s.key", "s.pub", "open.key", "short.key", "m.key",
                                        "m.pub", "clients", "bad-list", "named"};
    for (size_t i = 0; i < 9; i++) {
        snprintf(path, sizeof(path), "%s/%s", key_dir, files[i]);
        unlink(path);
    }
    rmdir(key_dir);
}

static void test_missing_file(void **state)
{
    (void)state;
    bt_diag *d = bt_diag_create("x");
    cfg_config *c = (cfg_config *)1;
    assert_int_equal(cfg_load_file("config/examples/no-such-file.yaml", d, &c), BT_EIO);
    assert_null(c);
    assert_non_null(bt_diag_find(d, "cannot read"));
    bt_diag_destroy(d);
}

/* ---- one mistake each ---- */

static void test_unknown_top_level_key(void **state)
{
    (void)state;
    expect_error("version: 1\n"
                 "grahps: []\n",
                 2, "unknown key 'grahps' in the top-level mapping; did you mean 'graphs'?");
}

static void test_unknown_worker_key(void **state)
{
    (void)state;
    expect_error("version: 1\n"
                 "workers:\n"
                 "  - {name: cpu0, device: cpu, pool_md: 64}\n",
                 3, "unknown key 'pool_md' in worker 'cpu0'; did you mean 'pool_mb'?");
}

static void test_unknown_key_without_suggestion(void **state)
{
    (void)state;
    bt_diag *d;
    cfg_config *c = NULL;
    assert_int_equal(load("version: 1\ndaemon: {zzzzzz: 1}\n", &d, &c), BT_ECONFIG);
    const bt_diag_item *it = bt_diag_find(d, "unknown key 'zzzzzz' in daemon");
    assert_non_null(it);
    assert_null(strstr(it->message, "did you mean"));
    bt_diag_destroy(d);
}

static void test_string_for_int(void **state)
{
    (void)state;
    expect_error("version: 1\n"
                 "workers: [{name: cpu0, device: cpu}]\n"
                 "models:\n"
                 "  - name: m\n"
                 "    backend: echo\n"
                 "    worker: cpu0\n"
                 "    max_batch: abc\n",
                 7, "expected an integer for 'max_batch', got 'abc'");
}

/* tp_step_timeout_ms: read, and at least 1 (0 would be no limit). */
static void test_tp_step_timeout(void **state)
{
    (void)state;
    static const char head[] = "version: 1\n"
                               "workers:\n"
                               "  - {name: g0, device: 'cuda:0'}\n"
                               "  - {name: g1, device: 'cuda:1'}\n"
                               "models:\n"
                               "  - {name: m, backend: echo, workers: [g0, g1], tp: 2,\n";
    char yaml[512];
    snprintf(yaml, sizeof(yaml), "%s     tp_step_timeout_ms: 2500}\n", head);
    cfg_config *c = load_ok(yaml);
    assert_int_equal(c->models[0].tp_step_timeout_ms, 2500);
    cfg_config_destroy(c);
    snprintf(yaml, sizeof(yaml), "%s     tp_step_timeout_ms: 0}\n", head);
    expect_error(yaml, 7, "tp_step_timeout_ms");
}

static void test_int_trailing_junk_and_range(void **state)
{
    (void)state;
    expect_error("version: 1\ndaemon: {max_inflight: 12x}\n", 2,
                 "expected an integer for 'max_inflight', got '12x'");
    expect_error("version: 1\ndaemon: {request_timeout_ms: 99999999999999999999}\n", 2,
                 "request_timeout_ms must be at most");
    expect_error("version: 1\ndaemon: {max_inflight: 0}\n", 2, "max_inflight must be at least 1");
    /* The per-client bounds and the timeout cap. */
    expect_error("version: 1\ndaemon: {client_max_inflight: 0}\n", 2,
                 "client_max_inflight must be at least 1");
    expect_error("version: 1\ndaemon: {client_max_reply_bytes: 1000}\n", 2,
                 "client_max_reply_bytes must be at least 65536");
    expect_error("version: 1\ndaemon: {client_stall_timeout_ms: 0}\n", 2,
                 "client_stall_timeout_ms must be at least 1");
    expect_error("version: 1\ndaemon: {max_request_timeout_ms: 0}\n", 2,
                 "max_request_timeout_ms must be at least 1");
    cfg_config *c = load_ok("version: 1\ndaemon: {client_max_inflight: 4, client_max_reply_bytes: "
                            "1048576, client_stall_timeout_ms: 500, max_request_timeout_ms: 9}\n");
    assert_int_equal(c->daemon.client_max_inflight, 4);
    assert_int_equal(c->daemon.client_max_reply_bytes, 1048576);
    assert_int_equal(c->daemon.client_stall_timeout_ms, 500);
    assert_int_equal(c->daemon.max_request_timeout_ms, 9);
    cfg_config_destroy(c);
}

static void test_wrong_bool(void **state)
{
    (void)state;
    expect_error(PRELUDE
                 "  - name: g\n"          /* 9 */
                 "    body:\n"            /* 10 */
                 "      node:\n"          /* 11 */
                 "        name: a\n"      /* 12 */
                 "        model: m\n"     /* 13 */
                 "        async: maybe\n", /* 14 */
                 14, "expected true or false for 'async', got 'maybe'");
}

static void test_wrong_container_type(void **state)
{
    (void)state;
    expect_error(PRELUDE
                 "  - name: g\n"
                 "    body:\n"
                 "      node: {name: a, model: m, inputs: x}\n",
                 11, "expected a list for 'inputs', got 'x'");
    expect_error("version: 1\ndaemon: [a]\n", 2, "expected a mapping for 'daemon', got a list");
}

static void test_max_iters_zero(void **state)
{
    (void)state;
    expect_error(PRELUDE
                 "  - name: g\n"                          /* 9 */
                 "    body:\n"                            /* 10 */
                 "      loop:\n"                          /* 11 */
                 "        name: l\n"                      /* 12 */
                 "        max_iters: 0\n"                 /* 13 */
                 "        body: {node: {name: a, model: m}}\n",
                 13, "max_iters must be at least 1");
}

static void test_missing_worker(void **state)
{
    (void)state;
    expect_error("version: 1\n"
                 "workers: [{name: cpu0, device: cpu}]\n"
                 "models:\n"
                 "  - {name: m, backend: echo, worker: gpu9}\n",
                 4, "model 'm' is placed on worker 'gpu9', which is not defined");
    expect_error("version: 1\n"
                 "workers: [{name: cpu0, device: cpu}]\n"
                 "models:\n"
                 "  - {name: m, backend: echo, worker: cpu9}\n",
                 4, "which is not defined; did you mean 'cpu0'?");
}

static void test_missing_model_in_node(void **state)
{
    (void)state;
    bt_diag *d;
    cfg_config *c = NULL;
    assert_int_equal(load(PRELUDE
                          "  - name: g\n"        /* 9 */
                          "    body:\n"          /* 10 */
                          "      node:\n"        /* 11 */
                          "        name: a\n"    /* 12 */
                          "        model: nope\n", /* 13 */
                          &d, &c),
                     BT_ECONFIG);
    const bt_diag_item *it = bt_diag_find(d, "node 'a' runs model 'nope', which is not defined");
    assert_non_null(it);
    assert_int_equal(it->line, 13);
    assert_int_equal(it->col, 16);
    assert_int_equal(d->n_errors, 1);
    bt_diag_destroy(d);
}

static void test_duplicate_worker(void **state)
{
    (void)state;
    expect_error("version: 1\n"
                 "workers:\n"
                 "  - {name: cpu0, device: cpu}\n"
                 "  - {name: cpu0, device: cpu}\n",
                 4, "duplicate worker name 'cpu0' (first defined at line 3)");
}

static void test_duplicate_node_across_loop(void **state)
{
    (void)state;
    expect_error(PRELUDE
                 "  - name: g\n"                                   /* 9 */
                 "    body:\n"                                     /* 10 */
                 "      sequential:\n"                             /* 11 */
                 "        - node: {name: step, model: m}\n"        /* 12 */
                 "        - loop:\n"                               /* 13 */
                 "            name: l\n"                           /* 14 */
                 "            max_iters: 2\n"                      /* 15 */
                 "            body:\n"                             /* 16 */
                 "              node: {name: step, model: c}\n",   /* 17 */
                 17, "duplicate node name 'step' (first defined at line 12)");
    /* Loops share the name space with nodes. */
    expect_error(PRELUDE
                 "  - name: g\n"
                 "    body:\n"
                 "      sequential:\n"
                 "        - node: {name: l, model: m}\n"
                 "        - loop: {name: l, max_iters: 2, body: {node: {name: b, model: m}}}\n",
                 13, "duplicate loop name 'l' (first defined at line 12)");
}

static void test_client_is_reserved(void **state)
{
    (void)state;
    expect_error(PRELUDE
                 "  - name: g\n"
                 "    body:\n"
                 "      node: {name: client, model: m}\n",
                 11, "'client' is reserved");
}

static void test_unknown_backend(void **state)
{
    (void)state;
    size_t n = expect_error("version: 1\n"
                            "workers: [{name: w, device: cpu}]\n"
                            "models:\n"
                            "  - {name: m, backend: ecko, worker: w, options: {x: 1}}\n",
                            4, "unknown backend 'ecko'; did you mean 'echo'?");
    assert_int_equal(n, 1); /* its options are not checked against nothing */
}

static void test_unknown_option(void **state)
{
    (void)state;
    expect_error("version: 1\n"
                 "workers: [{name: w, device: cpu}]\n"
                 "models:\n"
                 "  - name: llm\n"
                 "    backend: transformer\n"
                 "    worker: w\n"
                 "    options: {path: a.gguf, max_sqe: 10}\n",
                 7, "unknown option 'max_sqe' for backend 'transformer'; did you mean 'max_seq'?");
    expect_error("version: 1\n"
                 "workers: [{name: w, device: cpu}]\n"
                 "models:\n"
                 "  - {name: e, backend: echo, worker: w, options: {n: 1}}\n",
                 4, "unknown option 'n' for backend 'echo', which takes no options");
}

static void test_wrong_option_type(void **state)
{
    (void)state;
    expect_error("version: 1\n"
                 "workers: [{name: w, device: cpu}]\n"
                 "models:\n"
                 "  - name: llm\n"
                 "    backend: transformer\n"
                 "    worker: w\n"
                 "    options: {path: a.gguf, max_seq: big}\n",
                 7, "expected an integer for 'max_seq', got 'big'");
    expect_error("version: 1\n"
                 "workers: [{name: w, device: cpu}]\n"
                 "models:\n"
                 "  - name: llm\n"
                 "    backend: transformer\n"
                 "    worker: w\n"
                 "    options: {path: a.gguf, chat_template: sometimes}\n",
                 7, "expected true or false for 'chat_template', got 'sometimes'");
}

/* A value of the right type that the catalog does not allow: an
 * enumerated string outside its list, a number outside its range.  Each
 * is reported at the value, saying what is allowed, and every one of them
 * is reported. */
static void test_option_not_allowed(void **state)
{
    (void)state;
    static const char *const yaml = "version: 1\n"
                                    "workers: [{name: w, device: cpu}]\n"
                                    "models:\n"
                                    "  - name: llm\n"
                                    "    backend: transformer\n"
                                    "    worker: w\n"
                                    "    options:\n"
                                    "      path: a.gguf\n"
                                    "      kv_dtype: q4\n"
                                    "      activations: f16\n"
                                    "      max_seq: 1\n"
                                    "      threads: 2000\n"
                                    "  - {name: c, backend: chunks, worker: w, options: {n: -3}}\n";
    size_t n = expect_error(yaml, 9, "option kv_dtype = 'q4': use auto, f16, q8_0 or f32 "
                                     "(backend 'transformer')");
    assert_int_equal(n, 5);
    expect_error(yaml, 10, "option activations = 'f16': use q8 or f32 (backend 'transformer')");
    expect_error(yaml, 11, "option max_seq = '1': want an integer in [2, 1048576]");
    expect_error(yaml, 12, "option threads = '2000': want an integer in [0, 1024]");
    expect_error(yaml, 13, "option n = '-3': want an integer >= 0 (backend 'chunks')");
}

static void test_missing_required_option(void **state)
{
    (void)state;
    size_t n = expect_error("version: 1\n"
                            "workers: [{name: w, device: cpu}]\n"
                            "models:\n"
                            "  - name: llm\n"
                            "    backend: transformer\n"
                            "    worker: w\n"
                            "    options: {max_seq: 512}\n",
                            4, "model 'llm' is missing option 'path'");
    assert_int_equal(n, 1);
}

static void test_section_with_two_keys(void **state)
{
    (void)state;
    expect_error(PRELUDE
                 "  - name: g\n"                                                          /* 9 */
                 "    body:\n"                                                            /* 10 */
                 "      node: {name: a, model: m}\n"                                      /* 11 */
                 "      loop: {name: l, max_iters: 2, body: {node: {name: b, model: m}}}\n", /* 12 */
                 12, "a section holds exactly one of node, sequential, parallel or loop");
}

static void test_section_without_kind(void **state)
{
    (void)state;
    expect_error(PRELUDE
                 "  - name: g\n"
                 "    body:\n"
                 "      nod: {name: a, model: m}\n",
                 11, "unknown key 'nod' in a section (node, sequential, parallel or loop); did you "
                     "mean 'node'?");
    expect_error(PRELUDE
                 "  - name: g\n"
                 "    body: {}\n",
                 10, "a section needs one of node, sequential, parallel or loop");
}

static void test_empty_sequential(void **state)
{
    (void)state;
    expect_error(PRELUDE
                 "  - name: g\n"
                 "    body:\n"
                 "      sequential: []\n",
                 11, "'sequential' needs at least one section");
}

static void test_broken_yaml(void **state)
{
    (void)state;
    size_t n = expect_error("version: 1\n"
                            "daemon:\n"
                            "  listen: ipc:///tmp/x.sock\n"
                            " bad: 2\n",
                            4, "YAML syntax error: did not find expected key");
    assert_int_equal(n, 1);
    expect_error("version: 1\n"
                 "workers:\n"
                 "  - {name: cpu0, device: cpu\n"
                 "models: []\n",
                 4, "YAML syntax error");
}

static void test_hostile_yaml(void **state)
{
    (void)state;
    /* An alias inside the node it names would be an endless tree. */
    expect_error("version: 1\nx: &a [*a]\n", 2, "undefined alias");
    /* Nesting and alias expansion are bounded, not followed to the end. */
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 32);
    assert_non_null(deep);
    int k = sprintf(deep, "version: 1\nx: ");
    memset(deep + k, '[', depth);
    memset(deep + k + depth, ']', depth);
    deep[k + 2 * depth] = '\0';
    expect_error(deep, 2, "YAML nesting is deeper than");
    free(deep);
    expect_error("version: 1\n"
                 "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
                 "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                 "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
                 "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                 "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
                 "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n",
                 7, "YAML document has more than");
    expect_error("version: 1\n---\nversion: 1\n", 2, "one YAML document");
    expect_error("", 1, "the file is empty");
    expect_error("- a\n", 1, "expected a mapping at the top level");
}

static void test_several_errors_all_reported(void **state)
{
    (void)state;
    bt_diag *d;
    cfg_config *c = NULL;
    const char *yaml =
        "version: 1\n"                                                              /* 1 */
        "daemon: {max_inflight: lots, log_level: loud}\n"                           /* 2 */
        "workers:\n"                                                                /* 3 */
        "  - {name: cpu0, device: gpu, threads: 0}\n"                               /* 4 */
        "models:\n"                                                                 /* 5 */
        "  - {name: m, backend: echo, worker: cpu7}\n"                              /* 6 */
        "graphs:\n"                                                                 /* 7 */
        "  - name: g\n"                                                             /* 8 */
        "    body:\n"                                                               /* 9 */
        "      loop: {name: l, max_iters: 0, body: {node: {name: a, model: zz}}}\n"; /* 10 */
    assert_int_equal(load(yaml, &d, &c), BT_ECONFIG);
    assert_null(c);
    if (d->n_errors != 7)
        bt_diag_print(d, stderr);
    assert_int_equal(d->n_errors, 7);
    static const int lines[] = {2, 2, 4, 4, 6, 10, 10};
    for (size_t i = 0; i < 7; i++)
        assert_int_equal(d->items[i].line, lines[i]);
    assert_non_null(bt_diag_find(d, "expected an integer for 'max_inflight', got 'lots'"));
    assert_non_null(bt_diag_find(d, "log_level must be one of error, warning, info, debug"));
    assert_non_null(bt_diag_find(d, "device must be 'cpu' or 'cuda:N'"));
    assert_non_null(bt_diag_find(d, "threads must be at least 1"));
    assert_non_null(bt_diag_find(d, "worker 'cpu7', which is not defined"));
    assert_non_null(bt_diag_find(d, "max_iters must be at least 1"));
    assert_non_null(bt_diag_find(d, "runs model 'zz'"));
    bt_diag_destroy(d);
}

/* A worker's inline_us: 0 turns it off, and more than a second is refused
 * where it is written. */
static void test_worker_inline_us(void **state)
{
    (void)state;
    const char *ok = "version: 1\n"
                     "workers:\n"
                     "  - {name: cpu0, device: cpu, inline_us: 0}\n"
                     "  - {name: cpu1, device: cpu, inline_us: 1000000}\n"
                     "models: [{name: m, backend: echo, worker: cpu0}]\n"
                     "graphs: [{name: g, body: {node: {name: a, model: m}}}]\n";
    cfg_config *c = load_ok(ok);
    assert_int_equal(cfg_worker_find(c, "cpu0")->inline_us, 0);
    assert_int_equal(cfg_worker_find(c, "cpu1")->inline_us, 1000000);
    cfg_config_destroy(c);
    bt_diag *d;
    c = NULL;
    const char *bad = "version: 1\n"
                      "workers:\n"
                      "  - {name: cpu0, device: cpu, inline_us: 1000001}\n"
                      "models: [{name: m, backend: echo, worker: cpu0}]\n"
                      "graphs: [{name: g, body: {node: {name: a, model: m}}}]\n";
    assert_int_equal(load(bad, &d, &c), BT_ECONFIG);
    assert_int_equal(d->n_errors, 1);
    assert_int_equal(d->items[0].line, 3);
    assert_non_null(bt_diag_find(d, "inline_us must be at most 1000000"));
    bt_diag_destroy(d);
}

static void test_tp_mismatch(void **state)
{
    (void)state;
    const char *yaml =
        "version: 1\n"
        "workers: [{name: g0, device: 'cuda:0'}, {name: g1, device: 'cuda:1'}]\n"
        "models:\n"
        "  - {name: a, backend: echo, workers: [g0, g1], tp: 3}\n";
    expect_error(yaml, 4, "model 'a' has tp: 3 but is placed on 2 workers");
}

/* Several workers without tp (or with tp 1) hold one copy each: replicas,
 * CPU and GPU mixed, with a routing policy (default cache_aware). */
static void test_replicas(void **state)
{
    (void)state;
    cfg_config *c = load_ok("version: 1\n"
                            "workers: [{name: c0, device: cpu}, {name: g0, device: 'cuda:0'}]\n"
                            "models:\n"
                            "  - {name: a, backend: echo, workers: [c0, g0]}\n"
                            "  - {name: b, backend: echo, workers: [c0, g0], tp: 1,\n"
                            "     routing: round_robin}\n"
                            "  - {name: s, backend: echo, worker: c0}\n");
    assert_true(cfg_model_replicated(&c->models[0]));
    assert_int_equal(c->models[0].routing, CFG_ROUTE_CACHE_AWARE);
    assert_true(cfg_model_replicated(&c->models[1]));
    assert_int_equal(c->models[1].routing, CFG_ROUTE_ROUND_ROBIN);
    assert_false(cfg_model_replicated(&c->models[2]));
    assert_string_equal(cfg_routing_name(CFG_ROUTE_LEAST_LOADED), "least_loaded");
    assert_null(cfg_routing_name((cfg_routing)3));
    cfg_config_destroy(c);
    expect_error("version: 1\n"
                 "workers: [{name: c0, device: cpu}, {name: c1, device: cpu}]\n"
                 "models:\n"
                 "  - {name: a, backend: echo, workers: [c0, c1],\n"
                 "     routing: least_load}\n",
                 5, "unknown routing 'least_load' for model 'a'; did you mean 'least_loaded'?");
    /* tp above 1 still means shards: a CPU worker is refused as before. */
    expect_error("version: 1\n"
                 "workers: [{name: c0, device: cpu}, {name: c1, device: cpu}]\n"
                 "models:\n"
                 "  - {name: a, backend: echo, workers: [c0, c1], tp: 2}\n",
                 4, "worker 'c0' is on the CPU; tensor parallelism runs over NCCL");
    /* Routing on a model with one worker does nothing: a warning. */
    bt_diag *d;
    c = NULL;
    assert_int_equal(load("version: 1\n"
                          "workers: [{name: c0, device: cpu}]\n"
                          "models:\n"
                          "  - {name: a, backend: echo, worker: c0, routing: round_robin}\n",
                          &d, &c), 0);
    const bt_diag_item *it = bt_diag_find(d, "sets 'routing' but has no replicas");
    assert_non_null(it);
    assert_int_equal(it->level, BT_DIAG_WARNING);
    assert_int_equal(it->line, 4);
    cfg_config_destroy(c);
    bt_diag_destroy(d);
}

static void test_worker_and_workers(void **state)
{
    (void)state;
    expect_error("version: 1\n"
                 "workers: [{name: g0, device: cpu}]\n"
                 "models:\n"
                 "  - {name: a, backend: echo, worker: g0, workers: [g0]}\n",
                 4, "sets both 'worker' and 'workers'");
    expect_error("version: 1\n"
                 "workers: [{name: g0, device: cpu}]\n"
                 "models:\n"
                 "  - {name: a, backend: echo}\n",
                 4, "model 'a' has no 'worker'");
}

static void test_version(void **state)
{
    (void)state;
    expect_error("version: 2\n", 1, "unsupported version 2");
    expect_error("workers: []\n", 1, "the file has no 'version'");
}

static void test_duplicates_elsewhere(void **state)
{
    (void)state;
    expect_error("version: 1\n"
                 "version: 1\n",
                 2, "duplicate key 'version' in the top-level mapping (first at line 1)");
    expect_error(PRELUDE
                 "  - name: g\n"
                 "    inputs: [x, y, x]\n",
                 10, "input 'x' is listed twice in graph 'g'");
    expect_error(PRELUDE
                 "  - {name: g, body: {node: {name: a, model: m}}}\n"
                 "  - {name: g, body: {node: {name: a, model: m}}}\n",
                 10, "duplicate graph name 'g' (first defined at line 9)");
}

static void test_edge_checks(void **state)
{
    (void)state;
    expect_error(PRELUDE
                 "  - name: g\n"
                 "    body:\n"
                 "      node: {name: a, model: m, outputs: [{name: y, modality: txt}]}\n",
                 11, "modality must be one of text, image, audio, tensor, got 'txt'; did you "
                     "mean 'text'?");
    expect_error(PRELUDE
                 "  - name: g\n"
                 "    body:\n"
                 "      node: {name: a, model: m, outputs: [{to: client}]}\n",
                 11, "an edge needs a 'name'");
}

static void test_profiles(void **state)
{
    (void)state;
    cfg_config *c = load_ok("version: 1\n"
                            "devices:\n"
                            "  h100: {tflops: 500}\n"
                            "  mygpu: {memory_bandwidth_gbps: 1000, memory_efficiency: 0.5,\n"
                            "          tflops: 100, comm_bandwidth_gbps: 50,\n"
                            "          comm_efficiency: 0.5, sync_overhead_us: 3}\n"
                            "workers:\n"
                            "  - {name: g, device: 'cuda:3', profile: mygpu}\n"
                            "  - {name: h, device: 'cuda:4', profile: h200}\n");
    const cfg_profile *p = cfg_profile_find(c, "h100");
    assert_true(p->tflops == 500);
    assert_true(p->memory_bandwidth_gbps == 3350); /* kept from the built-in */
    assert_string_equal(cfg_worker_profile(c, cfg_worker_find(c, "g"))->name, "mygpu");
    assert_string_equal(cfg_worker_profile(c, cfg_worker_find(c, "h"))->name, "h200");
    cfg_config_destroy(c);
    expect_error("version: 1\n"
                 "workers: [{name: g, device: 'cuda:0', profile: h10}]\n",
                 2, "uses profile 'h10', which is neither under devices: nor built in");
    expect_error("version: 1\n"
                 "devices: {x: {memory_efficiency: 1.5}}\n",
                 2, "memory_efficiency must be between 0.01 and 1");
}

/* The built-in profiles a config names are the scheduler's, figure for
 * figure: there is one table of them. */
static void test_builtin_profiles_are_the_schedulers(void **state)
{
    (void)state;
    cfg_config *c = load_ok("version: 1\n"
                            "workers:\n"
                            "  - {name: c, device: cpu}\n"
                            "  - {name: g, device: 'cuda:0'}\n");
    size_t n;
    const ks_profile *k = ks_profile_builtins(&n);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++) {
        const cfg_profile *p = cfg_profile_find(c, k[i].name);
        assert_non_null(p);
        assert_true(p->memory_bandwidth_gbps == k[i].memory_bandwidth_gbps);
        assert_true(p->memory_efficiency == k[i].memory_efficiency);
        assert_true(p->tflops == k[i].tflops);
        assert_true(p->comm_bandwidth_gbps == k[i].comm_bandwidth_gbps);
        assert_true(p->comm_efficiency == k[i].comm_efficiency);
        assert_true(p->sync_overhead_us == k[i].sync_overhead_us);
    }
    assert_string_equal(cfg_worker_profile(c, cfg_worker_find(c, "c"))->name, "cpu");
    assert_string_equal(cfg_worker_profile(c, cfg_worker_find(c, "g"))->name, "h100");
    assert_null(cfg_profile_find(c, "tpu"));
    cfg_config_destroy(c);
    expect_error("version: 1\n"
                 "workers: [{name: g, device: 'cuda:0', profile: tpu}]\n",
                 2, "nor built in (h100, h200, cpu)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_examples_load),
        cmocka_unit_test(test_chat_example_shape),
        cmocka_unit_test(test_tp_example),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_worker_inline_us),
        cmocka_unit_test(test_test_backend_defaults),
        cmocka_unit_test(test_positions),
        cmocka_unit_test(test_plugin_options_untyped),
        cmocka_unit_test(test_check_paths_warns),
        cmocka_unit_test(test_tcp_beyond_loopback_needs_curve),
        cmocka_unit_test(test_peer_listen_port_clash),
        cmocka_unit_test(test_curve_keys_parsed),
        cmocka_unit_test(test_check_keys),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_unknown_top_level_key),
        cmocka_unit_test(test_unknown_worker_key),
        cmocka_unit_test(test_unknown_key_without_suggestion),
        cmocka_unit_test(test_tp_step_timeout),
        cmocka_unit_test(test_string_for_int),
        cmocka_unit_test(test_int_trailing_junk_and_range),
        cmocka_unit_test(test_wrong_bool),
        cmocka_unit_test(test_wrong_container_type),
        cmocka_unit_test(test_max_iters_zero),
        cmocka_unit_test(test_missing_worker),
        cmocka_unit_test(test_missing_model_in_node),
        cmocka_unit_test(test_duplicate_worker),
        cmocka_unit_test(test_duplicate_node_across_loop),
        cmocka_unit_test(test_client_is_reserved),
        cmocka_unit_test(test_unknown_backend),
        cmocka_unit_test(test_unknown_option),
        cmocka_unit_test(test_wrong_option_type),
        cmocka_unit_test(test_option_not_allowed),
        cmocka_unit_test(test_missing_required_option),
        cmocka_unit_test(test_section_with_two_keys),
        cmocka_unit_test(test_section_without_kind),
        cmocka_unit_test(test_empty_sequential),
        cmocka_unit_test(test_broken_yaml),
        cmocka_unit_test(test_hostile_yaml),
        cmocka_unit_test(test_several_errors_all_reported),
        cmocka_unit_test(test_tp_mismatch),
        cmocka_unit_test(test_replicas),
        cmocka_unit_test(test_worker_and_workers),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_duplicates_elsewhere),
        cmocka_unit_test(test_edge_checks),
        cmocka_unit_test(test_profiles),
        cmocka_unit_test(test_builtin_profiles_are_the_schedulers),
    };
    return cmocka_run_group_tests_name("config_load", tests, NULL, NULL);
}
