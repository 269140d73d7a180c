/* The conductor's corked worker socket (daemon/workers.c): what a round
 * sends to one worker leaves at the uncork as one ZeroMQ message, a frame
 * per protocol message, in order; deferred messages wait for company or
 * for two ticks; a lost worker's deferred messages go unsent, and its
 * emptied outbox sends nothing (not even an identity frame alone); a
 * worker the ROUTER has no route to is reported by the uncork.  Real
 * sockets over inproc; counts frames and messages, no timing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <zmq.h>

#include "daemon/workers.h"

typedef struct fixture {
    void *ctx, *router, *dealer[2]; /* w0 and w1 connect; w2 never does */
    cfg_worker wcfg[3];
    cfg_config cfg;
    worker_set *ws;
} fixture;

static int setup(void **state)
{
    static fixture fx;
    memset(&fx, 0, sizeof(fx));
    static char *names[3] = {"w0", "w1", "w2"};
    for (int i = 0; i < 3; i++) {
        fx.wcfg[i].name = names[i];
        fx.wcfg[i].spawn = CFG_SPAWN_EXTERNAL;
    }
    fx.cfg.workers = fx.wcfg;
    fx.cfg.n_workers = 3;
    fx.ctx = zmq_ctx_new();
    fx.router = zmq_socket(fx.ctx, ZMQ_ROUTER);
    int one = 1;
    assert_int_equal(zmq_setsockopt(fx.router, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)), 0);
    assert_int_equal(zmq_bind(fx.router, "inproc://cork"), 0);
    for (int i = 0; i < 2; i++) {
        fx.dealer[i] = zmq_socket(fx.ctx, ZMQ_DEALER);
        assert_int_equal(zmq_setsockopt(fx.dealer[i], ZMQ_ROUTING_ID, names[i], 2), 0);
        assert_int_equal(zmq_connect(fx.dealer[i], "inproc://cork"), 0);
        /* The router learns a worker from its first message. */
        assert_int_equal(zmq_send(fx.dealer[i], "hi", 2, 0), 2);
        char buf[16];
        assert_int_equal(zmq_recv(fx.router, buf, sizeof(buf), 0), 2);
        assert_int_equal(zmq_recv(fx.router, buf, sizeof(buf), 0), 2);
    }
    assert_int_equal(workers_create(&fx.cfg, fx.router, &fx.ws), 0);
    /* As a Register from each would (w2 never registers: no route). */
    for (int i = 0; i < 2; i++)
        workers_set_route(fx.ws, i, names[i], 2);
    *state = &fx;
    return 0;
}

static int teardown(void **state)
{
    fixture *fx = *state;
    workers_destroy(fx->ws);
    for (int i = 0; i < 2; i++)
        zmq_close(fx->dealer[i]);
    zmq_close(fx->router);
    zmq_ctx_term(fx->ctx);
    return 0;
}

/* A Release of the one tensor ID, to worker W. */
static void release(worker_set *ws, int w, uint64_t id, bool deferred)
{
    Baton__V1__Release rel = BATON__V1__RELEASE__INIT;
    rel.n_tensor_ids = 1;
    rel.tensor_ids = &id;
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_RELEASE;
    m.release = &rel;
    assert_int_equal(deferred ? workers_send_deferred(ws, w, &m) : workers_send(ws, w, &m), 0);
}

/* Reads the next ZeroMQ message on DEALER, if any, into the tensor ids of
 * its frames (in order); returns the number of frames, 0 when none. */
static int read_message(void *dealer, uint64_t *ids, int max)
{
    int n = 0;
    for (bool more = true; more;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, dealer, n ? 0 : ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            assert_int_equal(n, 0);
            return 0;
        }
        more = zmq_msg_more(&m);
        Baton__V1__ConductorMessage *cm =
            baton__v1__conductor_message__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
        assert_non_null(cm);
        assert_int_equal(cm->msg_case, BATON__V1__CONDUCTOR_MESSAGE__MSG_RELEASE);
        assert_true(n < max);
        ids[n++] = cm->release->tensor_ids[0];
        baton__v1__conductor_message__free_unpacked(cm, NULL);
        zmq_msg_close(&m);
    }
    return n;
}

static size_t uncork(worker_set *ws)
{
    const int *failed;
    return workers_uncork(ws, &failed);
}

static void test_one_message_per_round(void **state)
{
    fixture *fx = *state;
    uint64_t ids[8];
    workers_cork(fx->ws);
    release(fx->ws, 0, 1, false);
    release(fx->ws, 0, 2, false);
    release(fx->ws, 1, 3, false);
    assert_int_equal(read_message(fx->dealer[0], ids, 8), 0); /* nothing before the uncork */
    assert_int_equal(uncork(fx->ws), 0);
    assert_int_equal(read_message(fx->dealer[0], ids, 8), 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_int_equal(read_message(fx->dealer[0], ids, 8), 0);
    assert_int_equal(read_message(fx->dealer[1], ids, 8), 1);
    assert_int_equal(ids[0], 3);
    const sup_worker *w0 = workers_at(fx->ws, 0);
    assert_int_equal(w0->msgs_out, 2);
    assert_int_equal(w0->zmq_out, 1);
    /* Not corked: each goes at once. */
    release(fx->ws, 0, 4, false);
    assert_int_equal(read_message(fx->dealer[0], ids, 8), 1);
}

static void test_deferred_rides_along_or_ages(void **state)
{
    fixture *fx = *state;
    uint64_t ids[8];
    /* Deferred alone: kept through rounds, then in front of the next
     * urgent message to the same worker. */
    workers_cork(fx->ws);
    release(fx->ws, 1, 10, true);
    assert_int_equal(uncork(fx->ws), 0);
    assert_true(workers_deferred(fx->ws));
    assert_int_equal(read_message(fx->dealer[1], ids, 8), 0);
    workers_cork(fx->ws);
    release(fx->ws, 1, 11, false);
    uncork(fx->ws);
    assert_int_equal(read_message(fx->dealer[1], ids, 8), 2);
    assert_int_equal(ids[0], 10);
    assert_int_equal(ids[1], 11);
    assert_false(workers_deferred(fx->ws));
    /* Deferred with no company: goes after it waited through two ticks. */
    workers_cork(fx->ws);
    release(fx->ws, 0, 20, true);
    uncork(fx->ws);
    workers_flush_deferred(fx->ws); /* tick 1: aged */
    workers_cork(fx->ws);
    uncork(fx->ws);
    assert_int_equal(read_message(fx->dealer[0], ids, 8), 0);
    workers_flush_deferred(fx->ws); /* tick 2: due */
    workers_cork(fx->ws);
    uncork(fx->ws);
    assert_int_equal(read_message(fx->dealer[0], ids, 8), 1);
    assert_int_equal(ids[0], 20);
    assert_false(workers_deferred(fx->ws));
}

static void test_lost_worker_drops_deferred(void **state)
{
    fixture *fx = *state;
    uint64_t ids[8];
    /* w1 holds only deferred messages when it is lost: they go unsent and
     * its outbox leaves the pending list, so that no identity frame goes
     * alone and swallows the next message to another worker. */
    workers_cork(fx->ws);
    release(fx->ws, 1, 30, true);
    release(fx->ws, 1, 31, true);
    uncork(fx->ws);
    workers_drop_deferred(fx->ws, 1);
    assert_false(workers_deferred(fx->ws));
    for (int round = 0; round < 3; round++) {
        workers_flush_deferred(fx->ws);
        workers_cork(fx->ws);
        release(fx->ws, 0, 40 + (uint64_t)round, false);
        uncork(fx->ws);
        assert_int_equal(read_message(fx->dealer[0], ids, 8), 1);
        assert_int_equal(ids[0], 40 + (uint64_t)round);
    }
    assert_int_equal(read_message(fx->dealer[1], ids, 8), 0);
    /* Urgent messages survive the drop, in order. */
    workers_cork(fx->ws);
    release(fx->ws, 1, 50, false);
    release(fx->ws, 1, 51, true);
    release(fx->ws, 1, 52, false);
    workers_drop_deferred(fx->ws, 1);
    uncork(fx->ws);
    assert_int_equal(read_message(fx->dealer[1], ids, 8), 2);
    assert_int_equal(ids[0], 50);
    assert_int_equal(ids[1], 52);
    /* A worker emptied and filled again many times is pending once. */
    for (int round = 0; round < 16; round++) {
        workers_cork(fx->ws);
        release(fx->ws, 1, 60, true);
        workers_drop_deferred(fx->ws, 1);
        release(fx->ws, 0, 61, true);
        workers_drop_deferred(fx->ws, 0);
        uncork(fx->ws);
    }
    assert_false(workers_deferred(fx->ws));
}

static void test_unreachable_reported(void **state)
{
    fixture *fx = *state;
    uint64_t ids[8];
    workers_cork(fx->ws);
    release(fx->ws, 2, 70, false); /* w2 never connected */
    release(fx->ws, 0, 71, false);
    const int *failed = NULL;
    assert_int_equal(workers_uncork(fx->ws, &failed), 1);
    assert_int_equal(failed[0], 2);
    assert_int_equal(read_message(fx->dealer[0], ids, 8), 1);
    assert_int_equal(ids[0], 71);
    assert_int_equal(workers_at(fx->ws, 2)->msgs_out, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_one_message_per_round, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deferred_rides_along_or_ages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lost_worker_drops_deferred, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unreachable_reported, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
