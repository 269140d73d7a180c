/* Allocation failures along a request's path: each test drives one piece
 * of it with the Nth allocation failing, for every N until a run needs no
 * more allocations than it made, and checks that the piece fails cleanly
 * (an error, no crash; the ASan build also checks that nothing leaks).
 * The allocator is tests/unit/failalloc.h. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/diag.h"
#include "common/status.h"
#include "config/config.h"
#include "config/graph.h"
#include "daemon/door.h"
#include "kernels/exec.h"
#include "kernels/graph.h"
#include "kernels/kernels.h"
#include "kernels/optable.h"
#include "proto/baton.pb-c.h"
#include "tests/unit/failalloc.h"
#include "tests/unit/rt_harness.h"
#include "tests/unit/wk_dispatch_msg.h"
#include "worker/device.h"
#include "worker/executor.h"
#include "worker/item.h"
#include "worker/runahead.h"
#include "worker/store.h"

/* Each test runs its piece with the Nth allocation failing for N = 1, 2,
 * ... and stops after the first run in which no allocation failed, that
 * is the run that made fewer than N allocations. */

/* --- worker: run-ahead chains -------------------------------------------- */

/* The modules the chain code touches: a store, an executor without lanes
 * holding one model, and the chains. */
typedef struct chain_fixture {
    pthread_mutex_t lock;
    atomic_bool stopping;
    wk_device *dev;
    wk_store *store;
    wk_executor *ex;
    wk_runahead *ra;
    wk_request *req;
    wk_dispatch *disp;
    wk_chain *chain;
} chain_fixture;

static void noop_unload(baton_model *m)
{
    (void)m;
}

static const baton_backend noop_backend = {.model_unload = noop_unload};

static void chain_setup(chain_fixture *f)
{
    memset(f, 0, sizeof(*f));
    pthread_mutex_init(&f->lock, NULL);
    atomic_init(&f->stopping, false);
    char err[256], name[64];
    snprintf(name, sizeof(name), "alloc-fail-%d", (int)getpid());
    assert_int_equal(wk_device_open(&f->dev, "cpu", "test", name, 1 << 20, err, sizeof(err)), 0);
    assert_int_equal(wk_store_create(f->dev, 0, 0, &f->store), 0);
    wk_executor_options eo = {.lock = &f->lock, .stopping = &f->stopping, .store = f->store,
                              .dev = f->dev, .worker = "w0", .device = "cpu", .lanes = 1};
    wk_executor_hooks eh = {0};
    assert_int_equal(wk_executor_create(&eo, &eh, &f->ex), 0);
    wk_model *m = calloc(1, sizeof(*m));
    assert_non_null(m);
    m->name = strdup("m");
    m->backend_spec = strdup("noop");
    m->backend = &noop_backend;
    m->max_batch = 1;
    wk_executor_model_add(f->ex, m);
    assert_int_equal(wk_runahead_create(f->ex, f->store, &f->stopping, &f->ra), 0);
    f->req = wk_store_request(f->store, 7, true);
    assert_non_null(f->req);
    f->disp = tu_dispatch_new(f->store, 7, "r7", 3, 3, 11);
    f->chain = wk_runahead_open(f->ra, f->req, f->disp);
    assert_non_null(f->chain);
    /* The dispatch is the chain's now. */
    wk_item_dispatch_unref(f->disp);
    /* Iteration 3 completed; the window reaches 3, so nothing runs ahead
     * until an Extend widens it. */
    f->chain->have_last = true;
    f->chain->last = 3;
}

/* Takes down whatever the run left: queued items, chains, the request. */
static void chain_teardown(chain_fixture *f)
{
    wk_request *req = wk_store_request(f->store, 7, false);
    if (req) {
        for (wk_item *it = req->items, *nx; it; it = nx) {
            nx = it->req_next;
            wk_executor_dequeue(f->ex, it);
            wk_runahead_forget(f->ra, it, false);
            wk_item_destroy(it);
        }
        wk_runahead_close(f->ra, req);
        wk_store_request_gc(f->store, req);
    }
    assert_null(wk_store_request(f->store, 7, false));
    wk_runahead_destroy(f->ra);
    wk_executor_destroy(f->ex);
    wk_store_destroy(f->store);
    wk_device_close(f->dev);
    pthread_mutex_destroy(&f->lock);
}

/* An Extend whose run-ahead item cannot be allocated stops the chain (the
 * conductor dispatches the iteration itself) and must not touch the chain
 * it just freed; one that can be allocated queues iteration 4. */
static void test_chain_extend(void **state)
{
    (void)state;
    Baton__V1__Extend e = BATON__V1__EXTEND__INIT;
    e.request_key = 7;
    e.node = 0;
    e.graph = 0;
    e.upto = 5;
    e.dispatch_id = 11;
    long n = 0;
    for (bool failed = true; failed;) {
        chain_fixture f;
        chain_setup(&f);
        fa_fail_nth(++n);
        wk_runahead_extend(f.ra, &e);
        failed = fa_failed();
        fa_off();
        if (failed) {
            /* Nothing queued, and the chain is gone. */
            assert_int_equal(wk_executor_n_queued(f.ex), 0);
            assert_null(f.req->chains);
        } else {
            assert_int_equal(wk_executor_n_queued(f.ex), 1);
            assert_non_null(f.req->items);
            assert_int_equal(f.req->items->iter[0], 4);
        }
        chain_teardown(&f);
    }
    /* The item, its queue and the queue's mode at least. */
    assert_true(n > 3);
}

/* --- kernels: the CPU kernels that allocate scratch ----------------------- */

/* Each kernel that needs memory for its scratch returns -ENOMEM without it
 * (it used to abort the worker) and 0 with it. */
static void test_kernels_out_of_memory(void **state)
{
    (void)state;
    enum { V = 200, HD = 2048, NH = 1, NKV = 1, AHD = 8, CAP = 1100 };
    float *logits = calloc(V, sizeof(float));
    float *x = calloc(HD, sizeof(float));
    float *q = calloc(AHD, sizeof(float)), *k = calloc(AHD, sizeof(float));
    float *v = calloc(AHD, sizeof(float)), *o = calloc(AHD, sizeof(float));
    float *kc = calloc((size_t)CAP * AHD, sizeof(float));
    float *vc = calloc((size_t)CAP * AHD, sizeof(float));
    assert_true(logits && x && q && k && v && o && kc && vc);
    for (int i = 0; i < V; i++)
        logits[i] = (float)(i % 17);
    int32_t pos = 5, lens = CAP - 2, tok = -1;
    for (int kernel = 0; kernel < 4; kernel++) {
        long n = 0;
        for (bool failed = true; failed;) {
            fa_fail_nth(++n);
            int rc = 0;
            switch (kernel) {
            case 0: /* a top_k over 64 sorts all candidates */
                rc = k_sample(&tok, logits, 1, V, 1.0f, 100, 0.9f, 1, 2);
                break;
            case 1: /* a head of over 1024 dims */
                rc = k_rope(x, &pos, 1, 1, HD, 10000.0f, K_ROPE_NORMAL);
                break;
            case 2: /* a context of over 1024 positions */
                rc = k_attn_prefill(o, q, k, v, kc, vc, CAP, CAP - 2, 1, NH, NKV, AHD);
                break;
            case 3:
                rc = k_attn_decode(o, q, k, v, &kc, &vc, CAP, &lens, 1, NH, NKV, AHD);
                break;
            }
            failed = fa_failed();
            fa_off();
            assert_int_equal(rc, failed ? -ENOMEM : 0);
        }
    }
    assert_true(tok >= 0 && tok < V);
    free(logits), free(x), free(q), free(k), free(v), free(o), free(kc), free(vc);
}

/* The sampling op of an executable graph: with any of its allocations
 * failing, the run fails with BT_EOP and the op's status -ENOMEM. */
static void test_optable_sample_out_of_memory(void **state)
{
    (void)state;
    enum { R = 2, V = 200 };
    kg_graph *g = kg_create();
    assert_non_null(g);
    int64_t l_s[2] = {R, V}, p_s[2] = {R, 3}, r_s[2] = {R, 2}, o_s[1] = {R};
    int lg = kg_value_add(g, "logits", KG_INPUT, KD_F32, 2, l_s);
    int pr = kg_value_add(g, "params", KG_INPUT, KD_F32, 2, p_s);
    int rn = kg_value_add(g, "rng", KG_INPUT, KD_I64, 2, r_s);
    int out = kg_value_add(g, "token", KG_OUTPUT, KD_I32, 1, o_s);
    int in[3] = {lg, pr, rn};
    assert_true(kg_op_add(g, KOP_SAMPLE, in, 3, &out, 1, NULL, 0, -1, -1) >= 0);
    char err[256];
    assert_int_equal(kt_cpu_check(g, err, sizeof(err)), 0);
    kx_op_table t;
    kt_cpu_ops(&t);
    kx_options opts = {.n_compute = 1};
    kx_exec *x = NULL;
    assert_int_equal(kx_compile(g, &t, &opts, &x), 0);
    kg_destroy(g);
    float logits[R * V], params[3 * R] = {1.0f, 100, 0.9f, 0.7f, 0, 1.0f};
    int64_t rng[2 * R] = {1, 2, 3, 4};
    for (int i = 0; i < R * V; i++)
        logits[i] = (float)(i % 13);
    assert_int_equal(kx_input_bind(x, 0, logits, sizeof(logits)), 0);
    assert_int_equal(kx_input_bind(x, 1, params, sizeof(params)), 0);
    assert_int_equal(kx_input_bind(x, 2, rng, sizeof(rng)), 0);
    long n = 0;
    for (bool failed = true; failed;) {
        fa_fail_nth(++n);
        int rc = kx_run(x);
        failed = fa_failed();
        fa_off();
        if (!failed) {
            assert_int_equal(rc, 0);
            break;
        }
        assert_int_equal(rc, BT_EOP);
        int st = 0;
        assert_int_equal(kx_op_error(x, &st), 0);
        assert_int_equal(st, -ENOMEM);
    }
    /* The executable still runs after the failures. */
    assert_int_equal(kx_run(x), 0);
    kx_destroy(x);
}

/* --- conductor: the door and the runtime's graph walk -------------------- */

static const char *graph_yaml =
    "version: 1\n"
    "workers: [{name: w0, device: cpu}, {name: w1, device: cpu}]\n"
    "models: [{name: m, backend: echo, worker: w0}, {name: m1, backend: echo, worker: w1}]\n"
    "graphs:\n"
    "  - name: g\n"
    "    inputs: [a, b]\n"
    "    body:\n"
    "      sequential:\n"
    "        - node: {name: n0, model: m, inputs: [a, b], outputs: [{name: y, to: n1}]}\n"
    "        - loop:\n"
    "            name: loop1\n"
    "            max_iters: 3\n"
    "            body:\n"
    "              node: {name: n1, model: m1, inputs: [y], outputs: [{name: y, to: n1}]}\n"
    "            outputs: [{name: y, to: client}]\n";

/* The checks at the door of a request with two inputs and a loop cap: a
 * failed allocation is refused with an error and a reason, never OK. */
static void test_door(void **state)
{
    (void)state;
    cfg_config *cfg = NULL;
    graph_set *gs = NULL;
    bt_diag *d = bt_diag_create("alloc.yaml");
    assert_non_null(d);
    int rc = cfg_load_string(graph_yaml, strlen(graph_yaml), "alloc.yaml", d, &cfg);
    if (rc == 0)
        rc = graph_set_build(cfg, d, &gs);
    bt_diag_print(d, stderr);
    bt_diag_destroy(d);
    assert_int_equal(rc, 0);
    int32_t a[2] = {1, 2}, b[3] = {3, 4, 5};
    int64_t da[1] = {2}, db[1] = {3};
    Baton__V1__Tensor ta = BATON__V1__TENSOR__INIT, tb = BATON__V1__TENSOR__INIT;
    ta.name = "a", ta.dtype = BATON__V1__DTYPE__I32, ta.n_dims = 1, ta.dims = da;
    ta.data.len = sizeof(a), ta.data.data = (uint8_t *)a;
    tb.name = "b", tb.dtype = BATON__V1__DTYPE__I32, tb.n_dims = 1, tb.dims = db;
    tb.data.len = sizeof(b), tb.data.data = (uint8_t *)b;
    Baton__V1__Tensor *inputs[2] = {&tb, &ta};
    Baton__V1__InferRequest__MaxItersEntry mi = BATON__V1__INFER_REQUEST__MAX_ITERS_ENTRY__INIT;
    Baton__V1__InferRequest__MaxItersEntry *mip[1] = {&mi};
    mi.key = "loop1", mi.value = 2;
    Baton__V1__InferRequest q = BATON__V1__INFER_REQUEST__INIT;
    q.request_id = "r1", q.graph = "g", q.n_inputs = 2, q.inputs = inputs;
    q.n_max_iters = 1, q.max_iters = mip;
    long n = 0;
    for (bool failed = true; failed;) {
        door_pass p;
        memset(&p, 0, sizeof(p));
        char why[512] = "";
        fa_fail_nth(++n);
        bt_code code = door_check_infer(gs, &q, &p, why, sizeof(why));
        failed = fa_failed();
        fa_off();
        if (failed) {
            if (code == BT_CODE_OK || !why[0])
                fail_msg("allocation %ld failed, yet the door answered %d (%s)", n, code, why);
        } else {
            assert_int_equal(code, BT_CODE_OK);
        }
        door_pass_free(&p);
    }
    assert_true(n > 1);
    graph_set_destroy(gs);
    cfg_config_destroy(cfg);
}

/* A request through the runtime: its start, two nodes on two workers and
 * a loop of three iterations, every dispatch completed as a worker would.
 * With any allocation of the runtime failing, the request still ends with
 * exactly one response (an error when it could not go on) and every
 * tensor is released once: the harness checks both after each event. */
static void test_runtime_walk(void **state)
{
    (void)state;
    long n = 0;
    for (bool failed = true; failed;) {
        harness *h = h_create(graph_yaml, 2);
        fa_fail_nth(++n);
        int rc = h_start(h, 1, false, NULL, 0);
        for (int step = 0; rc == 0 && h->n_inflight > 0 && step < 64; step++)
            h_complete(h, &h->inflight[0], false);
        failed = fa_failed();
        fa_off();
        /* Whatever is left in flight is abandoned: the request ends. */
        if (rc == 0 && h->n_inflight > 0)
            rt_end_all(h->rt, BT_CODE_UNAVAILABLE, "test ends");
        h_pump(h);
        if (h->failure[0])
            fail_msg("allocation %ld failed: %s", n, h->failure);
        const h_response *r = h_response_of(h, 1);
        if (rc == 0) {
            if (!r)
                fail_msg("allocation %ld failed: request 1 has no response", n);
            assert_int_equal(r->count, 1);
            if (!failed)
                assert_int_equal(r->code, BT_CODE_OK);
        } else {
            /* Refused: the caller still owns the inputs (it releases them
             * and answers the client), so the runtime released none and
             * answered nothing.  Once it released them too. */
            assert_true(failed);
            if (r)
                fail_msg("allocation %ld failed: a refused start was also answered", n);
            assert_int_equal(h_tensors_unreleased(h), h->g->n_inputs);
        }
        assert_int_equal(rt_tensors_held(h->rt), 0);
        h_destroy(h);
    }
    assert_true(n > 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_extend),
        cmocka_unit_test(test_kernels_out_of_memory),
        cmocka_unit_test(test_optable_sample_out_of_memory),
        cmocka_unit_test(test_door),
        cmocka_unit_test(test_runtime_walk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
