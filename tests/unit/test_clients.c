/* The client connection table (daemon/clients.c): lookup by identity,
 * the counts admission reads, the backlog's order and bytes, and when a
 * client may be forgotten. */
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
#include "common/evloop.h"
#include "daemon/clients.h"
#include "daemon/outbound.h"

static cl_frame *frame_of(const char *text)
{
    size_t n = strlen(text);
    cl_frame *f = malloc(sizeof(*f) + n);
    assert_non_null(f);
    memcpy(f->data, text, n);
    f->len = n;
    return f;
}

static void test_lookup_and_counts(void **state)
{
    (void)state;
    cl_table t;
    cl_init(&t);
    const uint8_t a[] = {0, 1, 2, 3, 4}, b[] = {0, 1, 2, 3, 5};
    assert_null(cl_find(&t, a, sizeof(a)));
    cl_client *ca = cl_get(&t, a, sizeof(a)), *cb = cl_get(&t, b, sizeof(b));
    assert_non_null(ca);
    assert_true(ca != cb);
    assert_ptr_equal(cl_get(&t, a, sizeof(a)), ca);
    assert_ptr_equal(cl_find(&t, b, sizeof(b)), cb);
    assert_null(cl_find(&t, a, 4)); /* a prefix is another identity */
    assert_int_equal(t.n, 2);
    cl_inflight_add(&t, ca);
    cl_inflight_add(&t, ca);
    cl_inflight_add(&t, cb);
    assert_int_equal(t.busy, 2);
    cl_inflight_sub(&t, ca);
    assert_int_equal(t.busy, 2);
    cl_inflight_sub(&t, ca);
    assert_int_equal(t.busy, 1);
    cl_inflight_sub(&t, ca); /* never below 0 */
    assert_int_equal(ca->inflight, 0);
    /* Idle: forgotten; a recent refusal keeps it a while; requests keep it. */
    ca->refused_ms = 1000;
    cl_release_if_idle(&t, ca, 1500, CL_REFUSED_KEEP_MS);
    assert_ptr_equal(cl_find(&t, a, sizeof(a)), ca);
    cl_release_if_idle(&t, ca, 1000 + CL_REFUSED_KEEP_MS + 1, CL_REFUSED_KEEP_MS);
    assert_null(cl_find(&t, a, sizeof(a)));
    cl_release_if_idle(&t, cb, 99999, CL_REFUSED_KEEP_MS);
    assert_ptr_equal(cl_find(&t, b, sizeof(b)), cb);
    assert_int_equal(t.n, 1);
    cl_free(&t);
}

static void test_backlog(void **state)
{
    (void)state;
    cl_table t;
    cl_init(&t);
    const uint8_t a[] = {7}, b[] = {8};
    cl_client *ca = cl_get(&t, a, 1), *cb = cl_get(&t, b, 1);
    cl_backlog_push(&t, ca, frame_of("one"), 10);
    cl_backlog_push(&t, ca, frame_of("three"), 20);
    cl_backlog_push(&t, cb, frame_of("xy"), 30);
    /* Both wait, each once. */
    assert_true((t.waiting == cb && cb->wait_next == ca && !ca->wait_next) ||
                (t.waiting == ca && ca->wait_next == cb && !cb->wait_next));
    assert_int_equal(ca->backlog_bytes, 8);
    assert_int_equal(ca->n_backlog, 2);
    assert_int_equal(t.backlog_bytes, 10);
    assert_int_equal(ca->stalled_since_ms, 10); /* from the first refusal */
    /* In order; progress restarts the stall; the last one ends it. */
    cl_frame *f = cl_backlog_pop(&t, ca, 40);
    assert_memory_equal(f->data, "one", 3);
    free(f);
    assert_int_equal(ca->stalled_since_ms, 40);
    f = cl_backlog_pop(&t, ca, 50);
    assert_memory_equal(f->data, "three", 5);
    free(f);
    assert_int_equal(ca->stalled_since_ms, 0);
    assert_null(cl_backlog_pop(&t, ca, 60));
    assert_int_equal(t.backlog_bytes, 2);
    assert_ptr_equal(t.waiting, cb); /* an empty backlog leaves the list */
    assert_null(cb->wait_next);
    assert_null(cb->wait_prev);
    /* A client with a backlog is not idle; removing it frees the backlog. */
    cl_release_if_idle(&t, cb, 99999, CL_REFUSED_KEEP_MS);
    assert_ptr_equal(cl_find(&t, b, 1), cb);
    size_t n;
    cl_client **v = cl_list(&t, &n);
    assert_int_equal(n, 2);
    free(v);
    cl_remove(&t, cb);
    assert_null(t.waiting);
    assert_int_equal(t.backlog_bytes, 0);
    assert_int_equal(t.n, 1);
    cl_free(&t);
}

/* cl_check agrees with a table kept by its own calls, and names each sum
 * that was bent behind their back. */
static void test_check(void **state)
{
    (void)state;
    cl_table t;
    cl_init(&t);
    char why[256];
    assert_int_equal(cl_check(&t, why, sizeof(why)), 0);
    const uint8_t a[] = {1}, b[] = {2}, c[] = {3};
    cl_client *ca = cl_get(&t, a, 1), *cb = cl_get(&t, b, 1);
    assert_non_null(cl_get(&t, c, 1));
    cl_inflight_add(&t, ca);
    cl_backlog_push(&t, cb, frame_of("four"), 5);
    cl_backlog_push(&t, cb, frame_of("xy"), 6);
    assert_int_equal(cl_check(&t, why, sizeof(why)), 0);

    t.busy++;
    assert_int_equal(cl_check(&t, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "busy"));
    t.busy--;
    cb->backlog_bytes++;
    assert_int_equal(cl_check(&t, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "counts 2 of 7"));
    cb->backlog_bytes--;
    cb->stalled_since_ms = 0;
    assert_int_equal(cl_check(&t, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "stall"));
    cb->stalled_since_ms = 5;
    t.waiting = NULL; /* cb holds replies but is on no list */
    assert_int_equal(cl_check(&t, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "waiting"));
    t.waiting = cb;
    t.backlog_bytes += 3;
    assert_int_equal(cl_check(&t, why, sizeof(why)), -1);
    t.backlog_bytes -= 3;
    cb->tail = cb->head;
    assert_int_equal(cl_check(&t, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "tail"));
    cb->tail = cb->head->next;
    assert_int_equal(cl_check(&t, why, sizeof(why)), 0);

    free(cl_backlog_pop(&t, cb, 7));
    free(cl_backlog_pop(&t, cb, 8));
    cl_inflight_sub(&t, ca);
    assert_int_equal(cl_check(&t, why, sizeof(why)), 0);
    cl_free(&t);
}

/* A client pipe as the conductor's, smaller: a ROUTER_MANDATORY router
 * (*ROUTER) bound at EP and a dealer (*DEALER) of routing id ID connected
 * to it, pipes of 24 messages each way (more than 16, as the conductor's
 * 64: out_send has ZeroMQ read commands every 16 replies it keeps).  The
 * router has read the dealer's first message, so it knows the client. */
static void pipe_open(void *ctx, const char *ep, const uint8_t *id, size_t idlen, void **router,
                      void **dealer)
{
    int one = 1, hwm = 24;
    *router = zmq_socket(ctx, ZMQ_ROUTER);
    *dealer = zmq_socket(ctx, ZMQ_DEALER);
    assert_int_equal(zmq_setsockopt(*router, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)), 0);
    assert_int_equal(zmq_setsockopt(*router, ZMQ_SNDHWM, &hwm, sizeof(hwm)), 0);
    assert_int_equal(zmq_setsockopt(*dealer, ZMQ_RCVHWM, &hwm, sizeof(hwm)), 0);
    assert_int_equal(zmq_setsockopt(*dealer, ZMQ_ROUTING_ID, id, idlen), 0);
    assert_int_equal(zmq_bind(*router, ep), 0);
    assert_int_equal(zmq_connect(*dealer, ep), 0);
    assert_int_equal(zmq_send(*dealer, "hi", 2, 0), 2);
    uint8_t buf[64];
    assert_int_equal(zmq_recv(*router, buf, sizeof(buf), 0), (int)idlen);
    assert_int_equal(zmq_recv(*router, buf, sizeof(buf), 0), 2);
}

static void room_noop(evloop *l, void *arg)
{
    (void)l;
    (void)arg;
}

/* Sends reply I (its request_id is the number) to the client ID. */
static void send_numbered(outbound *o, const uint8_t *id, size_t len, int i)
{
    char text[16];
    snprintf(text, sizeof(text), "%d", i);
    Baton__V1__InferResponse resp = BATON__V1__INFER_RESPONSE__INIT;
    resp.request_id = text;
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_RESPONSE;
    m.response = &resp;
    out_send(o, id, len, &m);
}

/* Reads every message the client can read now; each must carry the next
 * number: a response's request_id or, where CHUNKS, a chunk's seq.
 * Returns how many it read. */
static int drain(void *dealer, int *next, bool chunks)
{
    int got = 0;
    uint8_t buf[256];
    int n;
    while ((n = zmq_recv(dealer, buf, sizeof(buf), ZMQ_DONTWAIT)) >= 0) {
        Baton__V1__ServerMessage *m = baton__v1__server_message__unpack(NULL, (size_t)n, buf);
        assert_non_null(m);
        int k;
        if (chunks && m->msg_case == BATON__V1__SERVER_MESSAGE__MSG_CHUNK) {
            k = (int)m->chunk->seq;
        } else {
            assert_int_equal(m->msg_case, BATON__V1__SERVER_MESSAGE__MSG_RESPONSE);
            k = atoi(m->response->request_id);
        }
        assert_int_equal(k, *next);
        (*next)++;
        got++;
        baton__v1__server_message__free_unpacked(m, NULL);
    }
    return got;
}

/* While a backlog waits, the client socket's own signal (out_room_fd)
 * wakes a loop that watches it as soon as the reader has made room: each
 * round ends by that signal, never by its timeout (30 s here; a missing
 * signal fails the test at the first timed-out round).  Streams that
 * outran the pipe once waited a millisecond per pipe's worth of messages
 * for the timed look. */
static void test_backlog_room_signalled(void **state)
{
    (void)state;
    const uint8_t id[] = {'c', '2'};
    void *ctx = zmq_ctx_new(), *router, *dealer;
    pipe_open(ctx, "inproc://room", id, sizeof(id), &router, &dealer);

    outbound *o = out_create(router, NULL, NULL, NULL, NULL);
    assert_non_null(o);
    int fd = out_room_fd(o);
    assert_true(fd >= 0);
    evloop *l = evloop_create();
    assert_non_null(l);
    assert_true(evloop_add(l, NULL, fd, room_noop, NULL) >= 0);
    enum { N = 256 };
    for (int i = 0; i < N; i++)
        send_numbered(o, id, sizeof(id), i);
    cl_table *t = out_clients(o);
    assert_non_null(t->waiting);
    out_flush_backlogs(o, bt_now_ms()); /* what the loop does after a round */
    /* A client that reads nothing raises no signal: the loop sleeps. */
    assert_int_equal(evloop_run_once(l, 0), 0);
    int next = 0, rounds = 0;
    while (t->waiting) {
        assert_true(drain(dealer, &next, false) > 0);
        assert_int_equal(evloop_run_once(l, 30000), 1); /* the signal, not the timeout */
        out_flush_backlogs(o, bt_now_ms());
        assert_true(++rounds < N);
    }
    drain(dealer, &next, false);
    assert_int_equal(next, N);
    evloop_destroy(l);
    out_destroy(o);
    zmq_close(dealer);
    zmq_close(router);
    zmq_ctx_term(ctx);
}

/* A burst of replies past the pipe's high-water mark: what ZeroMQ refuses
 * waits in the backlog, and goes on as soon as the client has read, by
 * out_flush_backlogs or the next out_send, never waiting for out_tick.
 * A decode stream whose tokens outran the pipe once ran at one pipe's
 * worth of tokens per 10 ms tick because only the tick sent them on. */
static void test_backlog_sent_without_tick(void **state)
{
    (void)state;
    const uint8_t id[] = {'c', '1'};
    void *ctx = zmq_ctx_new(), *router, *dealer;
    pipe_open(ctx, "inproc://backlog", id, sizeof(id), &router, &dealer);

    outbound *o = out_create(router, NULL, NULL, NULL, NULL);
    assert_non_null(o);
    enum { N = 256 };
    for (int i = 0; i < N; i++)
        send_numbered(o, id, sizeof(id), i);
    cl_table *t = out_clients(o);
    assert_non_null(t->waiting); /* the pipe took only a few */
    int next = 0, got = drain(dealer, &next, false);
    assert_true(got > 0 && got < N);
    /* Reading made room: each flush sends more, in order. */
    for (int round = 0; round < 1000 && next < N; round++) {
        out_flush_backlogs(o, bt_now_ms());
        drain(dealer, &next, false);
    }
    assert_int_equal(next, N);
    assert_int_equal(out_flush_backlogs(o, bt_now_ms()), -1); /* nothing waits */
    assert_null(t->waiting);
    assert_int_equal(t->backlog_bytes, 0);

    /* The same through out_send alone, with no poll of the router between
     * (a round of the conductor's loop handling a burst of worker
     * messages): a new reply first sends on what waits, and every 16 kept
     * the router reads the client's "room made" commands, so the order
     * holds and nothing is left behind. */
    for (int i = N; i < 2 * N; i++)
        send_numbered(o, id, sizeof(id), i);
    assert_non_null(t->waiting);
    int sent = 2 * N;
    for (int round = 0; round < 1000 && t->waiting; round++) {
        drain(dealer, &next, false);
        send_numbered(o, id, sizeof(id), sent++);
    }
    assert_null(t->waiting);
    drain(dealer, &next, false);
    assert_int_equal(next, sent);
    out_destroy(o);
    zmq_close(dealer);
    zmq_close(router);
    zmq_ctx_term(ctx);
}

/* Sends chunk I (its seq is the number) to the client ID. */
static void send_chunk(outbound *o, const uint8_t *id, size_t len, int i)
{
    Baton__V1__InferChunk ch = BATON__V1__INFER_CHUNK__INIT;
    ch.request_id = "r";
    ch.seq = (uint64_t)i;
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_CHUNK;
    m.chunk = &ch;
    out_send(o, id, len, &m);
}

/* While the loop is corked, streamed chunks wait for the end of the round
 * (so that a round's chunks leave back to back); any other message sends
 * them first, so that each client's order holds; the uncork sends the
 * rest; past 64 held, the held ones go.  inproc delivers what is sent at
 * once, so "nothing to read" means "nothing sent". */
static void test_chunks_held_while_corked(void **state)
{
    (void)state;
    const uint8_t id[] = {'c', '3'};
    void *ctx = zmq_ctx_new(), *router, *dealer;
    pipe_open(ctx, "inproc://cork", id, sizeof(id), &router, &dealer);
    outbound *o = out_create(router, NULL, NULL, NULL, NULL);
    assert_non_null(o);
    int next = 0;
    out_cork(o);
    send_chunk(o, id, sizeof(id), 0);
    send_chunk(o, id, sizeof(id), 1);
    assert_int_equal(drain(dealer, &next, true), 0);
    send_numbered(o, id, sizeof(id), 2); /* a response: the chunks go first */
    assert_int_equal(drain(dealer, &next, true), 3);
    send_chunk(o, id, sizeof(id), 3);
    send_chunk(o, id, sizeof(id), 4);
    assert_int_equal(drain(dealer, &next, true), 0);
    out_uncork(o);
    assert_int_equal(drain(dealer, &next, true), 2);
    /* Uncorked, a chunk goes at once. */
    send_chunk(o, id, sizeof(id), 5);
    assert_int_equal(drain(dealer, &next, true), 1);
    /* 70 held: the 65th sends the first 64 (most into the backlog, the
     * pipe taking 24); all arrive, in order. */
    out_cork(o);
    for (int i = 6; i < 76; i++)
        send_chunk(o, id, sizeof(id), i);
    assert_true(drain(dealer, &next, true) > 0);
    out_uncork(o);
    for (int round = 0; round < 1000 && next < 76; round++) {
        out_flush_backlogs(o, bt_now_ms());
        drain(dealer, &next, true);
    }
    assert_int_equal(next, 76);
    /* A client dropped while chunks are held for it loses them: the
     * uncork must not make it a client again. */
    cl_table *t = out_clients(o);
    cl_client *c = cl_get(t, id, sizeof(id));
    assert_non_null(c);
    out_cork(o);
    send_chunk(o, id, sizeof(id), 76);
    out_drop_client(o, c);
    out_uncork(o);
    assert_null(cl_find(t, id, sizeof(id)));
    assert_int_equal(drain(dealer, &next, true), 0);
    out_destroy(o);
    zmq_close(dealer);
    zmq_close(router);
    zmq_ctx_term(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_and_counts),
        cmocka_unit_test(test_backlog),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_backlog_sent_without_tick),
        cmocka_unit_test(test_backlog_room_signalled),
        cmocka_unit_test(test_chunks_held_while_corked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
