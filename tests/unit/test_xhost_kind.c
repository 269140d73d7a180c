/* The conductor's choice of transfer kind from the hosts workers register
 * from (daemon/dispatch.c disp_transfer_kind): a real supervisor takes
 * Register messages from DEALERs standing in for four external workers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <zmq.h>

#include "common/diag.h"
#include "config/config.h"
#include "daemon/dispatch.h"
#include "daemon/supervisor.h"
#include "proto/baton.pb-c.h"
#include "tests/unit/sock_limits.h"

static const char yaml[] =
    "version: 1\n"
    "workers:\n"
    "  - {name: a, device: cpu, spawn: external}\n"
    "  - {name: b, device: cpu, spawn: external}\n"
    "  - {name: c, device: cpu, spawn: external}\n"
    "  - {name: g, device: \"cuda:0\", spawn: external}\n"
    "models:\n"
    "  - {name: m, backend: echo, worker: a}\n"
    "graphs:\n"
    "  - {name: x, inputs: [i], body: {node: {name: n, model: m, inputs: [i], "
    "outputs: [{name: i, to: client}]}}}\n";

static void hook_ready(void *arg, bool ready)
{
    (void)arg;
    (void)ready;
}

static void hook_lost(void *arg, int w, const char *why)
{
    (void)arg;
    (void)w;
    (void)why;
}

static void hook_message(void *arg, int w, const Baton__V1__WorkerMessage *m)
{
    (void)arg;
    (void)w;
    (void)m;
}

static void hook_burst(void *arg)
{
    (void)arg;
}

/* Registers worker NAME on HOST with peer endpoint EP through a DEALER. */
static void *register_worker(void *ctx, const char *name, const char *host, const char *ep)
{
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    assert_non_null(d);
    assert_int_equal(zmq_setsockopt(d, ZMQ_ROUTING_ID, name, strlen(name)), 0);
    test_sock_limit(d);
    assert_int_equal(zmq_connect(d, "inproc://test-xhost-kind"), 0);
    Baton__V1__Register r = BATON__V1__REGISTER__INIT;
    r.protocol_version = BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    r.worker = (char *)name;
    r.device = (char *)(name[0] == 'g' ? "cuda:0" : "cpu");
    r.hostname = (char *)host;
    r.peer_endpoint = (char *)ep;
    r.pid = 0;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION;
    m.registration = &r;
    uint8_t buf[512];
    size_t n = baton__v1__worker_message__pack(&m, buf);
    assert_int_equal(zmq_send(d, buf, n, 0), (int)n);
    return d;
}

static void test_kinds_from_registered_hosts(void **state)
{
    (void)state;
    bt_diag *diag = bt_diag_create("t.yaml");
    cfg_config *cfg = NULL;
    assert_int_equal(cfg_load_string(yaml, strlen(yaml), "t.yaml", diag, &cfg), 0);
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    test_sock_limit(router);
    assert_int_equal(zmq_bind(router, "inproc://test-xhost-kind"), 0);
    sup_options opt = {cfg, "/nonexistent/t.yaml", "t", "/bin/false", router};
    sup_hooks hooks = {NULL, hook_ready, hook_lost, hook_message, hook_burst, hook_burst};
    supervisor *s = NULL;
    assert_int_equal(sup_create(&opt, &hooks, &s), 0);
    void *da = register_worker(ctx, "a", "h1", "tcp://10.0.0.1:7301");
    void *db = register_worker(ctx, "b", "h2", "");
    void *dc = register_worker(ctx, "c", "h1", "");
    void *dg = register_worker(ctx, "g", "h2", "tcp://10.0.0.2:7301");
    for (int k = 0; k < 200 && !(sup_worker_get(s, 3)->hostname[0]); k++) {
        zmq_pollitem_t it = {router, 0, ZMQ_POLLIN, 0};
        zmq_poll(&it, 1, 10);
        sup_on_readable(NULL, s);
    }
    assert_string_equal(sup_worker_get(s, 0)->peer_endpoint, "tcp://10.0.0.1:7301");
    int code = 0;
    char why[384];
    /* Same worker, same host, two hosts. */
    assert_int_equal(disp_transfer_kind(s, 0, 0, &code, why, sizeof(why)),
                     BATON__V1__TRANSFER_KIND__TRANSFER_KIND_LOCAL);
    assert_int_equal(disp_transfer_kind(s, 0, 2, &code, why, sizeof(why)),
                     BATON__V1__TRANSFER_KIND__TRANSFER_KIND_IPC);
    assert_int_equal(disp_transfer_kind(s, 0, 1, &code, why, sizeof(why)),
                     BATON__V1__TRANSFER_KIND__TRANSFER_KIND_SOCKET);
    /* A producer on another host without a peer endpoint. */
    assert_int_equal(disp_transfer_kind(s, 1, 0, &code, why, sizeof(why)),
                     BATON__V1__TRANSFER_KIND__TRANSFER_KIND_UNSPECIFIED);
    assert_int_equal(code, 9 /* FAILED_PRECONDITION */);
    assert_non_null(strstr(why, "worker b (host h2)"));
    assert_non_null(strstr(why, "peer_listen"));
    /* A GPU and a CPU worker across hosts, either way (GPU to GPU would be
     * NCCL, which the emulated GPU tests cover). */
    code = 0;
    assert_int_equal(disp_transfer_kind(s, 3, 0, &code, why, sizeof(why)),
                     BATON__V1__TRANSFER_KIND__TRANSFER_KIND_UNSPECIFIED);
    assert_int_equal(code, 9);
    assert_non_null(strstr(why, "a GPU and a CPU worker on different hosts"));
    assert_int_equal(disp_transfer_kind(s, 0, 3, &code, why, sizeof(why)),
                     BATON__V1__TRANSFER_KIND__TRANSFER_KIND_UNSPECIFIED);
    /* A GPU on the same host as the CPU worker: in place, as before. */
    assert_int_equal(disp_transfer_kind(s, 1, 3, &code, why, sizeof(why)),
                     BATON__V1__TRANSFER_KIND__TRANSFER_KIND_IPC);
    zmq_close(da);
    zmq_close(db);
    zmq_close(dc);
    zmq_close(dg);
    sup_destroy(s);
    zmq_close(router);
    zmq_ctx_term(ctx);
    cfg_config_destroy(cfg);
    bt_diag_destroy(diag);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kinds_from_registered_hosts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
