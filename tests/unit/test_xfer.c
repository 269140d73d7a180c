/* Cross-host pulls (worker/xfer.c): the chunk plan, the producer's range
 * checks, and two modules in one process talking over loopback TCP (the
 * window shared in turns, refused requests, a lost producer, every pin
 * handed back). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/curve.h"
#include "common/status.h"
#include "proto/baton.pb-c.h"
#include "common/evloop.h"
#include "worker/xfer.h"
#include "tests/unit/skip.h"
#include "tests/unit/sock_limits.h"

#define MIB (1u << 20)

/* --- the plan ------------------------------------------------------------ */

static void test_plan_chunks(void **state)
{
    (void)state;
    wk_xfer_plan p;
    uint64_t off, len;
    /* 10 bytes in chunks of 4: 4, 4, 2. */
    wk_xfer_plan_init(&p, 10, 4);
    assert_true(wk_xfer_plan_next(&p, &off, &len));
    assert_int_equal(off, 0);
    assert_int_equal(len, 4);
    assert_true(wk_xfer_plan_next(&p, &off, &len));
    assert_int_equal(off, 4);
    assert_true(wk_xfer_plan_next(&p, &off, &len));
    assert_int_equal(off, 8);
    assert_int_equal(len, 2);
    assert_false(wk_xfer_plan_next(&p, &off, &len));
    assert_int_equal(p.inflight, 3);
    /* Answers in any order; the last one completes. */
    assert_int_equal(wk_xfer_plan_recv(&p, 8, 2), 0);
    assert_int_equal(wk_xfer_plan_recv(&p, 0, 4), 0);
    assert_int_equal(wk_xfer_plan_recv(&p, 4, 4), 1);
    assert_int_equal(p.inflight, 0);
    /* An exact multiple, and one smaller than a chunk. */
    wk_xfer_plan_init(&p, 8, 4);
    int n = 0;
    while (wk_xfer_plan_next(&p, &off, &len))
        n++, assert_int_equal(len, 4);
    assert_int_equal(n, 2);
    wk_xfer_plan_init(&p, 3, 4);
    assert_true(wk_xfer_plan_next(&p, &off, &len));
    assert_int_equal(len, 3);
    assert_int_equal(wk_xfer_plan_recv(&p, 0, 3), 1);
}

static void test_plan_refuses_what_was_not_asked(void **state)
{
    (void)state;
    wk_xfer_plan p;
    uint64_t off, len;
    wk_xfer_plan_init(&p, 10, 4);
    /* Nothing requested yet. */
    assert_int_equal(wk_xfer_plan_recv(&p, 0, 4), BT_EINVAL);
    assert_true(wk_xfer_plan_next(&p, &off, &len));
    assert_int_equal(wk_xfer_plan_recv(&p, 4, 4), BT_EINVAL);  /* not requested yet */
    assert_int_equal(wk_xfer_plan_recv(&p, 1, 4), BT_EINVAL);  /* not a chunk start */
    assert_int_equal(wk_xfer_plan_recv(&p, 0, 3), BT_EINVAL);  /* wrong length */
    assert_int_equal(wk_xfer_plan_recv(&p, 0, 4), 0);
    /* The same chunk twice. */
    assert_int_equal(wk_xfer_plan_recv(&p, 0, 4), BT_EINVAL);
    assert_int_equal(p.received, 4);
}

/* --- the range check --------------------------------------------------- */

static void test_range_checks(void **state)
{
    (void)state;
    char err[384];
    wk_xfer_src held = {7, 0, 4096, 1000};
    wk_xfer_src req = held;
    assert_int_equal(wk_xfer_check_range(&held, &req, 0, 1000, err, sizeof(err)), 0);
    assert_int_equal(wk_xfer_check_range(&held, &req, 999, 1, err, sizeof(err)), 0);
    assert_int_equal(wk_xfer_check_range(&held, &req, 1000, 1, err, sizeof(err)), BT_EINVAL);
    assert_non_null(strstr(err, "outside tensor 7"));
    assert_int_equal(wk_xfer_check_range(&held, &req, 500, 501, err, sizeof(err)), BT_EINVAL);
    assert_int_equal(wk_xfer_check_range(&held, &req, UINT64_MAX, 2, err, sizeof(err)),
                     BT_EINVAL);
    assert_int_equal(wk_xfer_check_range(&held, &req, 1, UINT64_MAX, err, sizeof(err)),
                     BT_EINVAL);
    assert_int_equal(wk_xfer_check_range(&held, &req, 0, 0, err, sizeof(err)), BT_EINVAL);
    /* A reference to the same id that disagrees with the slot is stale. */
    req.offset = 0;
    assert_int_equal(wk_xfer_check_range(&held, &req, 0, 10, err, sizeof(err)), BT_EINVAL);
    assert_non_null(strstr(err, "stale"));
    req = held;
    req.nbytes = 2000;
    assert_int_equal(wk_xfer_check_range(&held, &req, 1500, 10, err, sizeof(err)), BT_EINVAL);
    req = held;
    req.pool = 1;
    assert_int_equal(wk_xfer_check_range(&held, &req, 0, 10, err, sizeof(err)), BT_EINVAL);
    /* Chunks above the cap are refused even inside a large tensor. */
    wk_xfer_src big = {8, 0, 0, 1ull << 32};
    assert_int_equal(wk_xfer_check_range(&big, &big, 0, WK_XFER_MAX_CHUNK, err, sizeof(err)), 0);
    assert_int_equal(wk_xfer_check_range(&big, &big, 0, WK_XFER_MAX_CHUNK + 1, err,
                                         sizeof(err)), BT_EINVAL);
}

/* --- two modules over loopback --------------------------------------------- */

#define N_TENSORS 3

typedef struct fake_producer {
    uint8_t *pool;
    uint64_t size;
    wk_xfer_src t[N_TENSORS];     /* tensors "held"; tensor_id 0: released */
    int pins;                     /* outstanding */
    int pinned_total;
} fake_producer;

typedef struct fake_pull {
    int done;                     /* order it ended in (1, 2, ...); 0: not yet */
    baton_status code;
    char message[512];
} fake_pull;

static int done_order;

static baton_status fp_pin(void *arg, uint64_t tensor_id, wk_xfer_src *held,
                           const uint8_t **data, void **pin, char *err, size_t errlen)
{
    fake_producer *p = arg;
    for (int i = 0; i < N_TENSORS; i++)
        if (p->t[i].tensor_id && p->t[i].tensor_id == tensor_id) {
            *held = p->t[i];
            *data = p->pool + p->t[i].offset;
            *pin = &p->t[i];
            p->pins++;
            p->pinned_total++;
            return BATON_STATUS_OK;
        }
    snprintf(err, errlen, "tensor %llu is not held", (unsigned long long)tensor_id);
    return BATON_STATUS_NOT_FOUND;
}

static void fp_unpin(void *arg, void *pin)
{
    fake_producer *p = arg;
    assert_non_null(pin);
    assert_true(p->pins > 0);
    p->pins--;
}

static void fc_done(void *arg, void *cookie, baton_status code, const char *message)
{
    (void)arg;
    fake_pull *f = cookie;
    assert_int_equal(f->done, 0);
    f->done = ++done_order;
    f->code = code;
    snprintf(f->message, sizeof(f->message), "%s", message);
}

typedef struct rig {
    void *zctx;
    evloop *loop;                 /* both modules' sockets */
    fake_producer prod;
    wk_xfer *producer, *consumer;
} rig;

static void rig_pump(rig *r, int ms)
{
    assert_true(evloop_run_once(r->loop, ms) >= 0);
    wk_xfer_drain_unpins(r->producer);
    wk_xfer_tick(r->consumer, bt_now_ns());
}

/* Pumps until every pull of F (N of them) ended, or 20 s passed. */
static void rig_wait(rig *r, fake_pull *f, size_t n)
{
    uint64_t end = bt_now_ns() + 20000000000ull;
    for (;;) {
        size_t left = 0;
        for (size_t i = 0; i < n; i++)
            left += f[i].done == 0;
        if (!left)
            return;
        assert_true(bt_now_ns() < end);
        rig_pump(r, 10);
    }
}

static int rig_setup(void **state)
{
    static const wk_xfer_ops prod_ops = {fp_pin, fp_unpin, fc_done};
    static const wk_xfer_ops cons_ops = {fp_pin, fp_unpin, fc_done};
    rig *r = calloc(1, sizeof(*r));
    char err[256];
    assert_non_null(r);
    r->zctx = zmq_ctx_new();
    assert_non_null(r->loop = evloop_create());
    r->prod.size = 40u * MIB;
    r->prod.pool = malloc(r->prod.size);
    assert_non_null(r->prod.pool);
    for (uint64_t i = 0; i < r->prod.size; i++)
        r->prod.pool[i] = (uint8_t)(i * 2654435761u >> 13);
    r->prod.t[0] = (wk_xfer_src){101, 0, 0, 32u * MIB + 12345};   /* large */
    r->prod.t[1] = (wk_xfer_src){102, 0, 33u * MIB, 1000};        /* small */
    r->prod.t[2] = (wk_xfer_src){103, 0, 34u * MIB, 3 * MIB};     /* medium */
    assert_int_equal(wk_xfer_create(r->zctx, r->loop, "tcp://127.0.0.1:*", NULL, -1, &prod_ops,
                                    &r->prod, &r->producer, err, sizeof(err)), 0);
    assert_int_equal(wk_xfer_create(r->zctx, r->loop, NULL, NULL, -1, &cons_ops, NULL,
                                    &r->consumer, err, sizeof(err)), 0);
    assert_string_not_equal(wk_xfer_endpoint(r->producer), "");
    assert_string_equal(wk_xfer_endpoint(r->consumer), "");
    assert_int_equal(wk_xfer_peer_update(r->consumer, 0, "prod", wk_xfer_endpoint(r->producer),
                                         1, true), 0);
    *state = r;
    return 0;
}

static int rig_teardown(void **state)
{
    rig *r = *state;
    wk_xfer_close(r->consumer);
    wk_xfer_close(r->producer);
    zmq_ctx_term(r->zctx);
    wk_xfer_destroy(r->consumer);
    wk_xfer_destroy(r->producer);
    evloop_destroy(r->loop);
    assert_int_equal(r->prod.pins, 0);
    free(r->prod.pool);
    free(r);
    return 0;
}

static void test_pulls_interleave_and_arrive_intact(void **state)
{
    rig *r = *state;
    char err[256];
    fake_pull f[3] = {0};
    uint8_t *dst[3];
    done_order = 0;
    for (int i = 0; i < 3; i++)
        assert_non_null(dst[i] = malloc(r->prod.t[i].nbytes));
    /* The large one first: the small and medium ones, started after it,
     * still end before it, since they take turns in the window. */
    for (int i = 0; i < 3; i++)
        assert_int_not_equal(wk_xfer_pull(r->consumer, 0, &r->prod.t[i], dst[i], &f[i], err,
                                          sizeof(err)), 0);
    rig_wait(r, f, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(f[i].code, BATON_STATUS_OK);
        assert_memory_equal(dst[i], r->prod.pool + r->prod.t[i].offset, r->prod.t[i].nbytes);
        free(dst[i]);
    }
    assert_true(f[1].done < f[0].done);
    assert_true(f[2].done < f[0].done);
    /* Every reply's pin came back. */
    for (int k = 0; k < 100 && r->prod.pins; k++)
        rig_pump(r, 10);
    assert_int_equal(r->prod.pins, 0);
    wk_xfer_stats st;
    wk_xfer_get_stats(r->consumer, &st);
    assert_int_equal(st.pulls_done, 3);
    assert_int_equal(st.pulls_active, 0);
    assert_int_equal(st.bytes_pulled,
                     r->prod.t[0].nbytes + r->prod.t[1].nbytes + r->prod.t[2].nbytes);
    /* One pin per chunk. */
    int chunks = 0;
    for (int i = 0; i < 3; i++)
        chunks += (int)((r->prod.t[i].nbytes + WK_XFER_CHUNK_BYTES - 1) / WK_XFER_CHUNK_BYTES);
    assert_int_equal(r->prod.pinned_total, chunks);
}

static void test_refused_pulls(void **state)
{
    rig *r = *state;
    char err[256];
    fake_pull f[2] = {0};
    uint8_t buf[1000];
    done_order = 0;
    /* A released tensor, and a reference that disagrees with the slot. */
    wk_xfer_src gone = {999, 0, 0, 1000};
    wk_xfer_src stale = r->prod.t[1];
    stale.offset += 256;
    assert_int_not_equal(wk_xfer_pull(r->consumer, 0, &gone, buf, &f[0], err, sizeof(err)), 0);
    assert_int_not_equal(wk_xfer_pull(r->consumer, 0, &stale, buf, &f[1], err, sizeof(err)), 0);
    rig_wait(r, f, 2);
    assert_int_equal(f[0].code, BATON_STATUS_UNAVAILABLE);
    assert_non_null(strstr(f[0].message, "worker prod refused"));
    assert_non_null(strstr(f[0].message, "not held"));
    assert_int_equal(f[1].code, BATON_STATUS_INTERNAL);
    assert_non_null(strstr(f[1].message, "stale"));
    wk_xfer_stats st;
    wk_xfer_get_stats(r->producer, &st);
    assert_int_equal(st.requests_refused, 2);
    /* Unknown peers, and a pull of nothing, are refused at once. */
    assert_int_equal(wk_xfer_pull(r->consumer, 5, &r->prod.t[1], buf, &f[0], err, sizeof(err)),
                     0);
    assert_non_null(strstr(err, "not among the known peers"));
    assert_int_equal(wk_xfer_peer_update(r->consumer, 6, "mute", "", 1, true), 0);
    assert_int_equal(wk_xfer_pull(r->consumer, 6, &r->prod.t[1], buf, &f[0], err, sizeof(err)),
                     0);
    assert_non_null(strstr(err, "peer_listen"));
}

/* A forged request straight to the ROUTER: answered with an error, the
 * producer reads nothing outside the tensor. */
static void test_forged_request_answered(void **state)
{
    rig *r = *state;
    void *s = zmq_socket(r->zctx, ZMQ_DEALER);
    test_sock_limit(s);
    assert_int_equal(zmq_connect(s, wk_xfer_endpoint(r->producer)), 0);
    const uint64_t lengths[][2] = {{900, 200}, {0, 0}, {UINT64_MAX - 10, 20}};
    for (size_t k = 0; k < 3; k++) {
        Baton__V1__PullRequest rq = BATON__V1__PULL_REQUEST__INIT;
        rq.xfer_id = 77 + k;
        rq.tensor_id = 102;
        rq.tensor_offset = 33u * MIB;
        rq.tensor_nbytes = 1000;
        rq.offset = lengths[k][0];
        rq.length = lengths[k][1];
        Baton__V1__PeerMessage m = BATON__V1__PEER_MESSAGE__INIT;
        m.protocol_version = BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
        m.msg_case = BATON__V1__PEER_MESSAGE__MSG_PULL;
        m.pull = &rq;
        uint8_t buf[128];
        size_t n = baton__v1__peer_message__pack(&m, buf);
        assert_int_equal(zmq_send(s, buf, n, 0), (int)n);
        zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
        uint64_t end = bt_now_ns() + 5000000000ull;
        while (zmq_poll(&it, 1, 0) == 0) {
            assert_true(bt_now_ns() < end);
            rig_pump(r, 5);
        }
        uint8_t rb[2048];
        int got = zmq_recv(s, rb, sizeof(rb), 0);
        assert_true(got > 0);
        int more = 0;
        size_t ml = sizeof(more);
        zmq_getsockopt(s, ZMQ_RCVMORE, &more, &ml);
        assert_int_equal(more, 0); /* no data frame */
        Baton__V1__PeerMessage *a = baton__v1__peer_message__unpack(NULL, (size_t)got, rb);
        assert_non_null(a);
        assert_int_equal(a->msg_case, BATON__V1__PEER_MESSAGE__MSG_REPLY);
        assert_int_equal(a->reply->xfer_id, 77 + k);
        assert_int_equal(a->reply->status->code, BATON__V1__CODE__INVALID_ARGUMENT);
        baton__v1__peer_message__free_unpacked(a, NULL);
    }
    /* A frame that is no PeerMessage is dropped; the producer carries on. */
    assert_int_equal(zmq_send(s, "\xff\xff\xff", 3, 0), 3);
    for (int k = 0; k < 20; k++)
        rig_pump(r, 5);
    zmq_close(s);
    assert_int_equal(r->prod.pins, 0);
}

static void test_lost_producer_fails_its_pulls(void **state)
{
    rig *r = *state;
    char err[256];
    fake_pull f[2] = {0};
    uint8_t *dst = malloc(r->prod.t[0].nbytes);
    uint8_t small[1000];
    done_order = 0;
    assert_non_null(dst);
    assert_int_not_equal(wk_xfer_pull(r->consumer, 0, &r->prod.t[0], dst, &f[0], err,
                                      sizeof(err)), 0);
    assert_int_not_equal(wk_xfer_pull(r->consumer, 0, &r->prod.t[1], small, &f[1], err,
                                      sizeof(err)), 0);
    /* The conductor says it restarted before any answer is read. */
    assert_int_equal(wk_xfer_peer_update(r->consumer, 0, "prod", wk_xfer_endpoint(r->producer),
                                         2, true), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(f[i].code, BATON_STATUS_UNAVAILABLE);
        assert_non_null(strstr(f[i].message, "worker prod (index 0)"));
        assert_non_null(strstr(f[i].message, "new incarnation"));
    }
    /* Late answers to the old socket are gone with it; a new pull works. */
    f[0] = (fake_pull){0};
    assert_int_not_equal(wk_xfer_pull(r->consumer, 0, &r->prod.t[1], small, &f[0], err,
                                      sizeof(err)), 0);
    rig_wait(r, f, 1);
    assert_int_equal(f[0].code, BATON_STATUS_OK);
    assert_memory_equal(small, r->prod.pool + r->prod.t[1].offset, 1000);
    /* A plain consumer (no key pair) cannot pull from a peer that
     * announced a CURVE key: it says so at once, rather than let the
     * handshake fail in silence.  (A changed key dropping a connection is
     * tested under CURVE, in test_curve_pulls.) */
    assert_int_equal(wk_xfer_peer_key(r->consumer, 0, "key-one"), 0);
    assert_int_equal(wk_xfer_peer_key(r->consumer, 9, "nobody"), 0);
    f[0] = (fake_pull){0};
    assert_int_equal(wk_xfer_pull(r->consumer, 0, &r->prod.t[1], small, &f[0], err,
                                  sizeof(err)), 0);
    assert_non_null(strstr(err, "this worker has no key pair"));
    assert_int_equal(wk_xfer_peer_key(r->consumer, 0, NULL), 0);
    f[0] = (fake_pull){0};
    assert_int_not_equal(wk_xfer_pull(r->consumer, 0, &r->prod.t[1], small, &f[0], err,
                                      sizeof(err)), 0);
    rig_wait(r, f, 1);
    assert_int_equal(f[0].code, BATON_STATUS_OK);
    /* Down: refused at once. */
    assert_int_equal(wk_xfer_peer_update(r->consumer, 0, "prod", wk_xfer_endpoint(r->producer),
                                         2, false), 0);
    assert_int_equal(wk_xfer_pull(r->consumer, 0, &r->prod.t[1], small, &f[1], err,
                                  sizeof(err)), 0);
    assert_non_null(strstr(err, "is down"));
    for (int k = 0; k < 100 && r->prod.pins; k++)
        rig_pump(r, 10);
    free(dst);
}

/* A producer that takes requests and never answers is lost after
 * WK_XFER_TIMEOUT_MS: its pulls fail UNAVAILABLE naming it. */
static void test_silent_producer_times_out(void **state)
{
    rig *r = *state;
    char err[256], ep[256];
    size_t len = sizeof(ep);
    fake_pull f[1] = {0};
    uint8_t buf[1000];
    done_order = 0;
    void *mute = zmq_socket(r->zctx, ZMQ_ROUTER);
    test_sock_limit(mute);
    assert_int_equal(zmq_bind(mute, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_getsockopt(mute, ZMQ_LAST_ENDPOINT, ep, &len), 0);
    assert_int_equal(wk_xfer_peer_update(r->consumer, 3, "mute", ep, 1, true), 0);
    assert_int_not_equal(wk_xfer_pull(r->consumer, 3, &r->prod.t[1], buf, &f[0], err,
                                      sizeof(err)), 0);
    for (int k = 0; k < 10; k++)
        rig_pump(r, 5);
    uint64_t now = bt_now_ns();
    long next = wk_xfer_tick(r->consumer, now);
    assert_true(next > 0 && next <= (long)WK_XFER_TIMEOUT_MS + 1);
    assert_int_equal(f[0].done, 0);
    wk_xfer_tick(r->consumer, now + (uint64_t)(WK_XFER_TIMEOUT_MS + 1) * 1000000u);
    assert_int_equal(f[0].code, BATON_STATUS_UNAVAILABLE);
    assert_non_null(strstr(f[0].message, "worker mute (index 3)"));
    assert_non_null(strstr(f[0].message, "no answer"));
    zmq_close(mute);
}

/* Under CURVE: a consumer whose key the producer was told of pulls
 * intact bytes; one with another key is refused at the handshake and its
 * pull never gets a byte; a producer that registered no key cannot be
 * pulled from at all, and says so. */
static void test_curve_pulls(void **state)
{
    (void)state;
    if (!bt_curve_available())
        skip_because("libzmq has no CURVE");
    static const wk_xfer_ops ops = {fp_pin, fp_unpin, fc_done};
    bt_curve_keypair pk, ck, sk;
    assert_int_equal(bt_curve_keypair_generate(&pk), 0);
    assert_int_equal(bt_curve_keypair_generate(&ck), 0);
    assert_int_equal(bt_curve_keypair_generate(&sk), 0);
    rig r = {0};
    char err[256];
    r.zctx = zmq_ctx_new();
    assert_non_null(r.loop = evloop_create());
    r.prod.size = 2u * MIB;
    assert_non_null(r.prod.pool = malloc(r.prod.size));
    for (uint64_t i = 0; i < r.prod.size; i++)
        r.prod.pool[i] = (uint8_t)(i * 2654435761u >> 11);
    r.prod.t[0] = (wk_xfer_src){201, 0, 4096, MIB + 17};
    assert_int_equal(wk_xfer_create(r.zctx, r.loop, "tcp://127.0.0.1:*", &pk, -1, &ops,
                                    &r.prod, &r.producer, err, sizeof(err)), 0);
    assert_int_equal(wk_xfer_create(r.zctx, r.loop, NULL, &ck, -1, &ops, NULL, &r.consumer,
                                    err, sizeof(err)), 0);
    /* What the conductor's Peers would say: each side learns the other's
     * key (worker 0 the producer, 1 the consumer). */
    const char *ep = wk_xfer_endpoint(r.producer);
    assert_int_equal(wk_xfer_peer_update(r.producer, 1, "cons", "", 1, true), 0);
    assert_int_equal(wk_xfer_peer_key(r.producer, 1, ck.public_z85), 0);
    assert_int_equal(wk_xfer_peer_update(r.consumer, 0, "prod", ep, 1, true), 0);
    assert_int_equal(wk_xfer_peer_key(r.consumer, 0, pk.public_z85), 0);
    fake_pull f[3] = {0};
    uint8_t *dst = malloc(r.prod.t[0].nbytes), *dst2 = calloc(1, r.prod.t[0].nbytes);
    assert_non_null(dst);
    assert_non_null(dst2);
    assert_int_not_equal(wk_xfer_pull(r.consumer, 0, &r.prod.t[0], dst, &f[0], err,
                                      sizeof(err)), 0);
    rig_wait(&r, f, 1);
    assert_int_equal(f[0].code, BATON_STATUS_OK);
    assert_memory_equal(dst, r.prod.pool + r.prod.t[0].offset, r.prod.t[0].nbytes);
    /* A new key for the producer drops the connection and the pull in
     * flight on it; the same key again changes nothing. */
    f[0] = (fake_pull){0};
    assert_int_not_equal(wk_xfer_pull(r.consumer, 0, &r.prod.t[0], dst, &f[0], err,
                                      sizeof(err)), 0);
    assert_int_equal(wk_xfer_peer_key(r.consumer, 0, sk.public_z85), 0);
    assert_int_equal(f[0].code, BATON_STATUS_UNAVAILABLE);
    assert_non_null(strstr(f[0].message, "key changed"));
    assert_int_equal(wk_xfer_peer_key(r.consumer, 0, pk.public_z85), 0);
    assert_int_equal(wk_xfer_peer_key(r.consumer, 0, pk.public_z85), 0);
    f[0] = (fake_pull){0};
    assert_int_not_equal(wk_xfer_pull(r.consumer, 0, &r.prod.t[0], dst, &f[0], err,
                                      sizeof(err)), 0);
    rig_wait(&r, f, 1);
    assert_int_equal(f[0].code, BATON_STATUS_OK);
    /* A stranger: it knows the producer's key, the producer not its own. */
    wk_xfer *stranger = NULL;
    assert_int_equal(wk_xfer_create(r.zctx, r.loop, NULL, &sk, -1, &ops, NULL, &stranger,
                                    err, sizeof(err)), 0);
    assert_int_equal(wk_xfer_peer_update(stranger, 0, "prod", ep, 1, true), 0);
    assert_int_equal(wk_xfer_peer_key(stranger, 0, pk.public_z85), 0);
    assert_int_not_equal(wk_xfer_pull(stranger, 0, &r.prod.t[0], dst2, &f[1], err,
                                      sizeof(err)), 0);
    for (int k = 0; k < 100; k++)
        assert_true(evloop_run_once(r.loop, 10) >= 0);
    assert_int_equal(f[1].done, 0);
    for (uint64_t i = 0; i < r.prod.t[0].nbytes; i++)
        assert_int_equal(dst2[i], 0);
    /* A producer that announced no key. */
    assert_int_equal(wk_xfer_peer_update(r.consumer, 2, "keyless", ep, 1, true), 0);
    assert_int_equal(wk_xfer_pull(r.consumer, 2, &r.prod.t[0], dst2, &f[2], err, sizeof(err)),
                     0);
    assert_non_null(strstr(err, "registered no CURVE key"));
    wk_xfer_close(stranger);
    wk_xfer_close(r.consumer);
    wk_xfer_close(r.producer);
    zmq_ctx_term(r.zctx);
    wk_xfer_destroy(stranger);
    wk_xfer_destroy(r.consumer);
    wk_xfer_destroy(r.producer);
    evloop_destroy(r.loop);
    assert_int_equal(r.prod.pins, 0);
    free(dst);
    free(dst2);
    free(r.prod.pool);
    bt_curve_keypair_wipe(&pk);
    bt_curve_keypair_wipe(&ck);
    bt_curve_keypair_wipe(&sk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_chunks),
        cmocka_unit_test(test_plan_refuses_what_was_not_asked),
        cmocka_unit_test(test_range_checks),
        cmocka_unit_test(test_curve_pulls),
        cmocka_unit_test_setup_teardown(test_pulls_interleave_and_arrive_intact, rig_setup,
                                        rig_teardown),
        cmocka_unit_test_setup_teardown(test_refused_pulls, rig_setup, rig_teardown),
        cmocka_unit_test_setup_teardown(test_forged_request_answered, rig_setup, rig_teardown),
        cmocka_unit_test_setup_teardown(test_lost_producer_fails_its_pulls, rig_setup,
                                        rig_teardown),
        cmocka_unit_test_setup_teardown(test_silent_producer_times_out, rig_setup, rig_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
