/* Who may register as which worker (daemon/identity.h), and the routing
 * that follows from it (daemon/supervisor.c, daemon/workers.c).
 *
 * First the check alone, on worker records made by hand: a spawned
 * worker's key, a worker named in worker_keys, a key that speaks for
 * another worker, a live worker under another key, a Register that offers
 * its peers a key not its own.  Then a real supervisor over inproc, with
 * DEALERs standing in for workers: a worker is reached on the connection
 * it registered on, a Register naming no worker or a second worker from
 * one connection is refused (counted, told to shut down, the named worker
 * untouched), and a worker that registers again from a new connection is
 * reached there while its old connection is no longer heard. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "common/curve.h"
#include "common/diag.h"
#include "common/status.h"
#include "config/config.h"
#include "daemon/identity.h"
#include "daemon/supervisor.h"
#include "daemon/workers.h"
#include "proto/baton.pb-c.h"
#include "tests/unit/sock_limits.h"

/* ---- the check alone ------------------------------------------------------ */

static void test_check(void **state)
{
    (void)state;
    cfg_worker wc[4] = {{.name = "sp0", .spawn = CFG_SPAWN_AUTO},
                        {.name = "ext0", .spawn = CFG_SPAWN_EXTERNAL},
                        {.name = "ext1", .spawn = CFG_SPAWN_EXTERNAL},
                        {.name = "ext2", .spawn = CFG_SPAWN_EXTERNAL}};
    cfg_config cfg = {.workers = wc, .n_workers = 4};
    worker_set *ws = NULL;
    assert_int_equal(workers_create(&cfg, NULL, &ws), 0);
    sup_worker *sp0 = workers_at(ws, 0), *ext0 = workers_at(ws, 1), *ext1 = workers_at(ws, 2),
               *ext2 = workers_at(ws, 3);
    bt_curve_keypair spawn, named, x, y;
    assert_int_equal(bt_curve_keypair_generate(&spawn), 0);
    assert_int_equal(bt_curve_keypair_generate(&named), 0);
    assert_int_equal(bt_curve_keypair_generate(&x), 0);
    assert_int_equal(bt_curve_keypair_generate(&y), 0);
    memcpy(sp0->key_public, spawn.public_z85, sizeof(sp0->key_public));
    /* worker_keys: NAMED for ext0; X and Y unnamed. */
    char path[64], err[256];
    snprintf(path, sizeof(path), "/tmp/baton-test-identity-%d", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%s ext0\n%s\n%s\n", named.public_z85, x.public_z85, y.public_z85);
    fclose(f);
    bt_curve_keyset *file = bt_curve_keyset_create();
    int line = 0;
    assert_int_equal(bt_curve_keyset_load(file, path, &line, err, sizeof(err)), 0);
    unlink(path);

    /* A spawned worker: only the key batond made for this spawn. */
    assert_int_equal(ident_check(ws, sp0, spawn.public_z85, NULL, file), IDENT_OK);
    assert_int_equal(ident_check(ws, sp0, x.public_z85, NULL, file), IDENT_NOT_ITS_KEY);
    assert_int_equal(ident_check(ws, sp0, named.public_z85, "", file), IDENT_NOT_ITS_KEY);
    /* A worker the file names: only its named key. */
    assert_int_equal(ident_check(ws, ext0, named.public_z85, NULL, file), IDENT_OK);
    assert_int_equal(ident_check(ws, ext0, x.public_z85, NULL, file), IDENT_NOT_ITS_KEY);
    /* A key that speaks for another worker: named for it, or its spawn's. */
    assert_int_equal(ident_check(ws, ext1, named.public_z85, NULL, file), IDENT_KEY_OF_ANOTHER);
    assert_int_equal(ident_check(ws, ext1, spawn.public_z85, NULL, file), IDENT_KEY_OF_ANOTHER);
    /* An unnamed worker and an unnamed key. */
    assert_int_equal(ident_check(ws, ext1, x.public_z85, NULL, file), IDENT_OK);
    /* No key at all, or not a key. */
    assert_int_equal(ident_check(ws, ext1, NULL, NULL, file), IDENT_NO_KEY);
    assert_int_equal(ident_check(ws, ext1, "short", NULL, file), IDENT_NO_KEY);
    /* The key offered to peers must be the one it authenticated with. */
    assert_int_equal(ident_check(ws, ext1, x.public_z85, x.public_z85, file), IDENT_OK);
    assert_int_equal(ident_check(ws, ext1, x.public_z85, y.public_z85, file),
                     IDENT_CLAIMED_KEY);
    assert_int_equal(ident_check(ws, ext0, named.public_z85, spawn.public_z85, file),
                     IDENT_CLAIMED_KEY);

    /* ext1 live under X: another key cannot take it over, X can come back,
     * and X speaks for no other worker while ext1 is live. */
    ext1->state = SUP_READY;
    snprintf(ext1->auth_key, sizeof(ext1->auth_key), "%s", x.public_z85);
    assert_int_equal(ident_check(ws, ext1, y.public_z85, NULL, file), IDENT_NAME_IN_USE);
    assert_int_equal(ident_check(ws, ext1, x.public_z85, NULL, file), IDENT_OK);
    assert_int_equal(ident_check(ws, ext2, x.public_z85, NULL, file), IDENT_KEY_OF_ANOTHER);
    assert_int_equal(ident_check(ws, ext2, y.public_z85, NULL, file), IDENT_OK);
    /* Once it is lost, its name and its key are free again. */
    ext1->state = SUP_DOWN;
    assert_int_equal(ident_check(ws, ext1, y.public_z85, NULL, file), IDENT_OK);
    assert_int_equal(ident_check(ws, ext2, x.public_z85, NULL, file), IDENT_OK);
    /* Without a file: nothing is named, the rest holds. */
    assert_int_equal(ident_check(ws, ext0, x.public_z85, NULL, NULL), IDENT_OK);
    assert_int_equal(ident_check(ws, sp0, x.public_z85, NULL, NULL), IDENT_NOT_ITS_KEY);

    /* Every verdict has its own label and a sentence. */
    for (int v = 0; v < IDENT_N; v++) {
        assert_true(strlen(ident_strerror(v)) > 5);
        for (int u = 0; u < v; u++)
            assert_string_not_equal(ident_label(v), ident_label(u));
    }
    bt_curve_keyset_destroy(file);
    workers_destroy(ws);
}

/* ---- routing through a real supervisor -------------------------------------- */

static const char yaml[] =
    "version: 1\n"
    "workers:\n"
    "  - {name: a, device: cpu, spawn: external}\n"
    "  - {name: b, device: cpu, spawn: external}\n"
    "models:\n"
    "  - {name: m, backend: echo, worker: a}\n"
    "  - {name: n, backend: echo, worker: b}\n"
    "graphs:\n"
    "  - {name: x, inputs: [i], body: {node: {name: n, model: m, inputs: [i], "
    "outputs: [{name: i, to: client}]}}}\n";

static void hook_ready(void *arg, bool ready)
{
    (void)arg;
    (void)ready;
}

static int lost;

static void hook_lost(void *arg, int w, const char *why)
{
    (void)arg;
    (void)w;
    (void)why;
    lost++;
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

/* A DEALER on the supervisor's socket; ID NULL: none of its own. */
static void *dealer(void *ctx, const char *id)
{
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    assert_non_null(d);
    test_sock_limit(d);
    if (id)
        assert_int_equal(zmq_setsockopt(d, ZMQ_ROUTING_ID, id, strlen(id)), 0);
    assert_int_equal(zmq_connect(d, "inproc://test-identity"), 0);
    return d;
}

static void send_msg(void *d, Baton__V1__WorkerMessage *m)
{
    uint8_t buf[512];
    size_t n = baton__v1__worker_message__pack(m, buf);
    assert_int_equal(zmq_send(d, buf, n, 0), (int)n);
}

static void send_register(void *d, const char *name)
{
    Baton__V1__Register r = BATON__V1__REGISTER__INIT;
    r.protocol_version = BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    r.worker = (char *)name;
    r.device = "cpu";
    r.hostname = "h1";
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION;
    m.registration = &r;
    send_msg(d, &m);
}

static void send_heartbeat(void *d)
{
    Baton__V1__Heartbeat hb = BATON__V1__HEARTBEAT__INIT;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_HEARTBEAT;
    m.heartbeat = &hb;
    send_msg(d, &m);
}

/* Reads the supervisor's socket until COND holds (or 2 s pass). */
#define PUMP_UNTIL(router, s, cond)                                                           \
    for (int k_ = 0; k_ < 200 && !(cond); k_++) {                                             \
        zmq_pollitem_t it_ = {router, 0, ZMQ_POLLIN, 0};                                      \
        zmq_poll(&it_, 1, 10);                                                                \
        sup_on_readable(NULL, s);                                                             \
    }

/* Reads what D was sent, for up to MS; returns the reason of a Shutdown
 * among it (into WHY), or false when none came. */
static bool got_shutdown(void *d, int ms, char *why, size_t len)
{
    bool found = false;
    for (int t = 0; t < ms && !found; t += 10) {
        zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 10) <= 0)
            continue;
        zmq_msg_t f;
        zmq_msg_init(&f);
        while (zmq_msg_recv(&f, d, ZMQ_DONTWAIT) >= 0) {
            Baton__V1__ConductorMessage *cm =
                baton__v1__conductor_message__unpack(NULL, zmq_msg_size(&f), zmq_msg_data(&f));
            if (cm && cm->msg_case == BATON__V1__CONDUCTOR_MESSAGE__MSG_SHUTDOWN) {
                snprintf(why, len, "%s", cm->shutdown->reason);
                found = true;
            }
            baton__v1__conductor_message__free_unpacked(cm, NULL);
        }
        zmq_msg_close(&f);
    }
    return found;
}

static void shutdown_to(supervisor *s, int w, const char *reason)
{
    Baton__V1__Shutdown sd = BATON__V1__SHUTDOWN__INIT;
    sd.reason = (char *)reason;
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_SHUTDOWN;
    m.shutdown = &sd;
    assert_int_equal(sup_send(s, w, &m), 0);
}

static void test_routing(void **state)
{
    (void)state;
    bt_diag *diag = bt_diag_create("t.yaml");
    cfg_config *cfg = NULL;
    assert_int_equal(cfg_load_string(yaml, strlen(yaml), "t.yaml", diag, &cfg), 0);
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    test_sock_limit(router);
    int one = 1;
    assert_int_equal(zmq_setsockopt(router, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)), 0);
    assert_int_equal(zmq_bind(router, "inproc://test-identity"), 0);
    sup_options opt = {cfg, "/nonexistent/t.yaml", "t", "/bin/false", router};
    sup_hooks hooks = {NULL, hook_ready, hook_lost, hook_message, hook_burst, hook_burst};
    supervisor *s = NULL;
    assert_int_equal(sup_create(&opt, &hooks, &s), 0);
    char why[256];

    /* Nothing reaches a worker that has not registered. */
    Baton__V1__ConductorMessage none = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    none.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_SHUTDOWN;
    Baton__V1__Shutdown sd = BATON__V1__SHUTDOWN__INIT;
    none.shutdown = &sd;
    assert_int_equal(sup_send(s, 0, &none), BT_EIO);

    /* A registers as worker a, and is reached there. */
    void *da = dealer(ctx, NULL);
    send_register(da, "a");
    PUMP_UNTIL(router, s, sup_worker_get(s, 0)->registrations == 1);
    assert_int_equal(sup_worker_get(s, 0)->registrations, 1);
    shutdown_to(s, 0, "to a");
    assert_true(got_shutdown(da, 2000, why, sizeof(why)));
    assert_string_equal(why, "to a");

    /* A peer that names itself "a" (a routing id of its own) and a worker
     * this config lacks: refused, told why, worker a untouched. */
    void *df = dealer(ctx, "a");
    send_register(df, "nobody");
    PUMP_UNTIL(router, s, sup_registrations_refused(s, IDENT_UNKNOWN_WORKER) == 1);
    assert_int_equal(sup_registrations_refused(s, IDENT_UNKNOWN_WORKER), 1);
    assert_true(got_shutdown(df, 2000, why, sizeof(why)));
    assert_non_null(strstr(why, "registration refused: it names no worker"));
    /* Its other messages speak for nobody. */
    send_heartbeat(df);
    shutdown_to(s, 0, "still to a");
    assert_true(got_shutdown(da, 2000, why, sizeof(why)));
    assert_string_equal(why, "still to a");
    assert_false(got_shutdown(df, 100, why, sizeof(why)));

    /* A, registered as a, cannot register as b too. */
    send_register(da, "b");
    PUMP_UNTIL(router, s, sup_registrations_refused(s, IDENT_CONNECTION_TAKEN) == 1);
    assert_int_equal(sup_registrations_refused(s, IDENT_CONNECTION_TAKEN), 1);
    assert_true(got_shutdown(da, 2000, why, sizeof(why)));
    assert_non_null(strstr(why, "registered as another worker"));
    assert_int_equal(sup_worker_get(s, 1)->registrations, 0);
    assert_int_equal(sup_send(s, 1, &none), BT_EIO);

    /* Worker a registers again from a new connection (a restart): it is
     * reached there, and its old connection no longer speaks for it. */
    void *da2 = dealer(ctx, NULL);
    send_register(da2, "a");
    PUMP_UNTIL(router, s, sup_worker_get(s, 0)->registrations == 2);
    assert_int_equal(sup_worker_get(s, 0)->registrations, 2);
    shutdown_to(s, 0, "to the new a");
    assert_true(got_shutdown(da2, 2000, why, sizeof(why)));
    assert_string_equal(why, "to the new a");
    assert_false(got_shutdown(da, 100, why, sizeof(why)));
    uint64_t in = sup_worker_get(s, 0)->msgs_in;
    send_heartbeat(da);
    send_heartbeat(da2);
    PUMP_UNTIL(router, s, sup_worker_get(s, 0)->msgs_in > in);
    for (int k = 0; k < 5; k++) {
        zmq_pollitem_t it = {router, 0, ZMQ_POLLIN, 0};
        zmq_poll(&it, 1, 10);
        sup_on_readable(NULL, s);
    }
    assert_int_equal(sup_worker_get(s, 0)->msgs_in, in + 1);

    zmq_close(da);
    zmq_close(da2);
    zmq_close(df);
    sup_destroy(s);
    zmq_close(router);
    zmq_ctx_term(ctx);
    cfg_config_destroy(cfg);
    bt_diag_destroy(diag);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_routing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
