/* The C client library (client/client.c) against a fake daemon: a thread
 * with a ROUTER socket on an ipc:// endpoint in /tmp that runs one scripted
 * exchange per test. The server thread never asserts (CMocka's longjmp must
 * stay on the main thread): it keeps every ClientMessage it decoded, and the
 * test checks them after joining it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/skip.h"
#include "tests/unit/sock_limits.h"
#include <pthread.h>
#include <zmq.h>

#include "baton/client.h"
#include "proto/baton.pb-c.h"

#define MAX_GOT 8

typedef struct server server;
typedef void (*server_script)(server *s);

struct server {
    void *ctx, *router;
    char endpoint[128];
    pthread_t thread;
    server_script script;
    zmq_msg_t peer;                            /* routing id of the last sender */
    Baton__V1__ClientMessage *got[MAX_GOT];    /* decoded frames, in arrival order */
    size_t n_got;
    char curve_public[41];                     /* set when started with CURVE */
};

static void *server_main(void *arg)
{
    server *s = arg;
    s->script(s);
    return NULL;
}

/* Binds before returning so that the client never races the bind. */
static server *server_start(server_script script, bool curve)
{
    static unsigned seq;
    server *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->script = script;
    s->ctx = zmq_ctx_new();
    s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
    test_sock_limit(s->router);
    zmq_msg_init(&s->peer);
    if (curve) {
        char secret[41];
        int one = 1;
        assert_int_equal(zmq_curve_keypair(s->curve_public, secret), 0);
        zmq_setsockopt(s->router, ZMQ_CURVE_SERVER, &one, sizeof one);
        zmq_setsockopt(s->router, ZMQ_CURVE_SECRETKEY, secret, 41);
    }
    snprintf(s->endpoint, sizeof s->endpoint, "ipc:///tmp/baton-test-client-%d-%u.sock",
             (int)getpid(), seq++);
    assert_int_equal(zmq_bind(s->router, s->endpoint), 0);
    assert_int_equal(pthread_create(&s->thread, NULL, server_main, s), 0);
    return s;
}

static void server_join(server *s)
{
    pthread_join(s->thread, NULL);
}

static void server_free(server *s)
{
    for (size_t i = 0; i < s->n_got; i++)
        baton__v1__client_message__free_unpacked(s->got[i], NULL);
    zmq_msg_close(&s->peer);
    zmq_close(s->router);
    zmq_ctx_term(s->ctx);
    /* The ipc socket file outlives the ROUTER: remove it. */
    if (strncmp(s->endpoint, "ipc://", 6) == 0)
        unlink(s->endpoint + 6);
    free(s);
}

/* Receives one [routing id, payload] message and keeps it decoded; NULL
 * after 5 s of silence (the client under test must be broken). */
static Baton__V1__ClientMessage *srv_recv(server *s)
{
    zmq_pollitem_t it = {s->router, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 5000) != 1)
        return NULL;
    zmq_msg_t body;
    zmq_msg_close(&s->peer);
    zmq_msg_init(&s->peer);
    zmq_msg_init(&body);
    zmq_msg_recv(&s->peer, s->router, 0);
    zmq_msg_recv(&body, s->router, 0);
    Baton__V1__ClientMessage *m =
        baton__v1__client_message__unpack(NULL, zmq_msg_size(&body), zmq_msg_data(&body));
    zmq_msg_close(&body);
    if (m && s->n_got < MAX_GOT)
        s->got[s->n_got++] = m;
    return m;
}

static void srv_send_parts(server *s, const void *data, size_t len, bool more)
{
    zmq_msg_t id;
    zmq_msg_init(&id);
    zmq_msg_copy(&id, &s->peer);
    zmq_msg_send(&id, s->router, ZMQ_SNDMORE);
    zmq_send(s->router, data, len, more ? ZMQ_SNDMORE : 0);
}

static void srv_send_raw(server *s, const void *data, size_t len)
{
    srv_send_parts(s, data, len, false);
}

static void srv_send(server *s, const Baton__V1__ServerMessage *m)
{
    size_t n = baton__v1__server_message__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    baton__v1__server_message__pack(m, buf);
    srv_send_raw(s, buf, n);
    free(buf);
}

/* Sends a chunk of an I32 [1] tensor holding VALUE. */
static void srv_chunk(server *s, const char *rid, uint64_t seq, int32_t value,
                      const char *modality)
{
    int64_t dims[1] = {1};
    Baton__V1__Tensor t = BATON__V1__TENSOR__INIT;
    Baton__V1__InferChunk ch = BATON__V1__INFER_CHUNK__INIT;
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    t.name = "tok";
    t.dtype = BATON__V1__DTYPE__I32;
    t.n_dims = 1;
    t.dims = dims;
    t.data.data = (uint8_t *)&value;
    t.data.len = sizeof value;
    t.modality = (char *)modality;
    ch.request_id = (char *)rid;
    ch.seq = seq;
    ch.value = &t;
    m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_CHUNK;
    m.chunk = &ch;
    srv_send(s, &m);
}

/* Sends a terminal response with CODE, one U8 text output "hi" and two
 * node timings. */
static void srv_response(server *s, const char *rid, int code, const char *message)
{
    int64_t dims[1] = {2};
    Baton__V1__Tensor t = BATON__V1__TENSOR__INIT, *outs[1] = {&t};
    Baton__V1__NodeTiming t0 = BATON__V1__NODE_TIMING__INIT, t1 = BATON__V1__NODE_TIMING__INIT;
    Baton__V1__NodeTiming *tims[2] = {&t0, &t1};
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    Baton__V1__InferResponse r = BATON__V1__INFER_RESPONSE__INIT;
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    t.name = "text";
    t.dtype = BATON__V1__DTYPE__U8;
    t.n_dims = 1;
    t.dims = dims;
    t.data.data = (uint8_t *)"hi";
    t.data.len = 2;
    t.modality = "text";
    t0.node = "prefill";
    t0.worker = "cpu0";
    t0.exec_us = 100;
    t1.node = "decode";
    t1.iteration = 1;
    t1.worker = "cpu0";
    t1.queue_us = 5;
    t1.exec_us = 50;
    st.code = (Baton__V1__Code)code;
    st.message = (char *)message;
    r.request_id = (char *)rid;
    r.status = &st;
    r.n_outputs = 1;
    r.outputs = outs;
    r.n_timings = 2;
    r.timings = tims;
    r.total_us = 1234;
    m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_RESPONSE;
    m.response = &r;
    srv_send(s, &m);
}

static void srv_health(server *s, const char *message)
{
    char *workers[2] = {"cpu0", "cpu1"};
    Baton__V1__HealthResponse h = BATON__V1__HEALTH_RESPONSE__INIT;
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    h.live = 1;
    h.ready = 1;
    h.n_workers_ready = 2;
    h.workers_ready = workers;
    h.message = (char *)message;
    m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_HEALTH;
    m.health = &h;
    srv_send(s, &m);
}

static void srv_text(server *s, bool stats, const char *text)
{
    Baton__V1__StatsResponse st = BATON__V1__STATS_RESPONSE__INIT;
    Baton__V1__InspectResponse in = BATON__V1__INSPECT_RESPONSE__INIT;
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    if (stats) {
        st.text = (char *)text;
        m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_STATS;
        m.stats = &st;
    } else {
        in.text = (char *)text;
        m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_INSPECT;
        m.inspect = &in;
    }
    srv_send(s, &m);
}

static baton_client *client_for(const server *s)
{
    baton_client *c;
    assert_int_equal(baton_client_create(s->endpoint, &c), 0);
    return c;
}

/* Receives the next event and checks its kind and request id. */
static baton_client_event *expect_event(baton_client *c, baton_client_event_kind kind,
                                        const char *rid)
{
    baton_client_event *ev = NULL;
    int rc = baton_client_recv(c, 5000, &ev);
    if (rc != 0)
        fail_msg("recv: %s", baton_client_strerror(rc));
    assert_int_equal(ev->kind, kind);
    if (rid)
        assert_string_equal(ev->request_id, rid);
    return ev;
}

/* ---- one request: fields on the wire, then chunk, chunk, response -------- */

static void script_infer(server *s)
{
    Baton__V1__ClientMessage *m = srv_recv(s);
    if (!m || m->msg_case != BATON__V1__CLIENT_MESSAGE__MSG_INFER)
        return;
    srv_chunk(s, m->infer->request_id, 0, 7, "tensor");
    srv_chunk(s, m->infer->request_id, 1, 8, "tensor");
    srv_response(s, m->infer->request_id, 0, "");
}

static void test_infer_roundtrip(void **state)
{
    (void)state;
    server *s = server_start(script_infer, false);
    baton_client *c = client_for(s);
    baton_client_request *r;
    assert_int_equal(baton_client_request_create("chat", "req-1", &r), 0);
    int32_t x[6] = {1, 2, 3, 4, 5, 6};
    int64_t dims[2] = {2, 3};
    assert_int_equal(baton_client_request_add_input(r, "x", BATON_CLIENT_DTYPE_I32, dims, 2, x,
                                                    sizeof x), 0);
    assert_int_equal(baton_client_request_add_text(r, "prompt", "hello"), 0);
    baton_client_request_set_stream(r, true);
    baton_client_request_set_timeout(r, 2500);
    baton_client_sampling sp = {0.7f, 40, 0.9f, 42};
    assert_int_equal(baton_client_request_set_sampling(r, &sp), 0);
    assert_int_equal(baton_client_request_set_max_iters(r, "decode_loop", 9), 0);
    assert_int_equal(baton_client_request_set_max_iters(r, "outer", 2), 0);
    assert_int_equal(baton_client_request_set_max_iters(r, "decode_loop", 5), 0); /* replaces */
    assert_int_equal(baton_client_request_add_message(r, "system", "be brief"), 0);
    assert_int_equal(baton_client_request_add_message(r, "user", "hi"), 0);
    assert_int_equal(baton_client_request_set_messages_input(r, "old"), 0);
    assert_int_equal(baton_client_request_set_messages_input(r, "chat_in"), 0); /* replaces */
    assert_int_equal(baton_client_send(c, r), 0);
    baton_client_request_destroy(r); /* the request is not needed after sending */

    baton_client_event *ev = expect_event(c, BATON_CLIENT_EVENT_CHUNK, "req-1");
    assert_int_equal(ev->seq, 0);
    assert_string_equal(ev->value.name, "tok");
    assert_int_equal(ev->value.dtype, BATON_CLIENT_DTYPE_I32);
    assert_int_equal(ev->value.ndims, 1);
    assert_int_equal(ev->value.dims[0], 1);
    assert_int_equal(ev->value.nbytes, 4);
    assert_int_equal(*(const int32_t *)ev->value.data, 7);
    assert_string_equal(ev->value.modality, "tensor");
    baton_client_event_free(ev);
    ev = expect_event(c, BATON_CLIENT_EVENT_CHUNK, "req-1");
    assert_int_equal(ev->seq, 1);
    assert_int_equal(*(const int32_t *)ev->value.data, 8);
    baton_client_event_free(ev);
    ev = expect_event(c, BATON_CLIENT_EVENT_RESPONSE, "req-1");
    assert_int_equal(ev->code, BATON_CLIENT_CODE_OK);
    assert_string_equal(ev->message, "");
    assert_int_equal(ev->n_outputs, 1);
    assert_string_equal(ev->outputs[0].name, "text");
    assert_string_equal(ev->outputs[0].modality, "text");
    assert_int_equal(ev->outputs[0].dtype, BATON_CLIENT_DTYPE_U8);
    assert_memory_equal(ev->outputs[0].data, "hi", 2);
    assert_int_equal(baton_client_tensor_numel(&ev->outputs[0]), 2);
    assert_int_equal(ev->n_timings, 2);
    assert_string_equal(ev->timings[0].node, "prefill");
    assert_string_equal(ev->timings[1].node, "decode");
    assert_int_equal(ev->timings[1].iteration, 1);
    assert_string_equal(ev->timings[1].worker, "cpu0");
    assert_int_equal(ev->timings[1].queue_us, 5);
    assert_int_equal(ev->timings[1].exec_us, 50);
    assert_int_equal(ev->total_us, 1234);
    baton_client_event_free(ev);

    server_join(s);
    assert_int_equal(s->n_got, 1);
    const Baton__V1__InferRequest *q = s->got[0]->infer;
    assert_string_equal(q->request_id, "req-1");
    assert_string_equal(q->graph, "chat");
    assert_int_equal(q->n_messages, 2);
    assert_string_equal(q->messages[0]->role, "system");
    assert_string_equal(q->messages[0]->content, "be brief");
    assert_string_equal(q->messages[1]->role, "user");
    assert_string_equal(q->messages[1]->content, "hi");
    assert_string_equal(q->messages_input, "chat_in");
    assert_int_equal(q->n_inputs, 2);
    assert_string_equal(q->inputs[0]->name, "x");
    assert_int_equal(q->inputs[0]->dtype, BATON__V1__DTYPE__I32);
    assert_int_equal(q->inputs[0]->n_dims, 2);
    assert_int_equal(q->inputs[0]->dims[0], 2);
    assert_int_equal(q->inputs[0]->dims[1], 3);
    assert_int_equal(q->inputs[0]->data.len, sizeof x);
    assert_memory_equal(q->inputs[0]->data.data, x, sizeof x);
    assert_string_equal(q->inputs[1]->name, "prompt");
    assert_int_equal(q->inputs[1]->dtype, BATON__V1__DTYPE__U8);
    assert_int_equal(q->inputs[1]->n_dims, 1);
    assert_int_equal(q->inputs[1]->dims[0], 5);
    assert_memory_equal(q->inputs[1]->data.data, "hello", 5);
    assert_true(q->stream);
    assert_int_equal(q->timeout_ms, 2500);
    assert_non_null(q->sampling);
    assert_true(q->sampling->temperature > 0.69f && q->sampling->temperature < 0.71f);
    assert_int_equal(q->sampling->top_k, 40);
    assert_true(q->sampling->top_p > 0.89f && q->sampling->top_p < 0.91f);
    assert_int_equal(q->sampling->seed, 42);
    assert_int_equal(q->n_max_iters, 2);
    for (size_t i = 0; i < q->n_max_iters; i++) {
        if (!strcmp(q->max_iters[i]->key, "decode_loop"))
            assert_int_equal(q->max_iters[i]->value, 5);
        else if (!strcmp(q->max_iters[i]->key, "outer"))
            assert_int_equal(q->max_iters[i]->value, 2);
        else
            fail_msg("unexpected max_iters key %s", q->max_iters[i]->key);
    }
    baton_client_destroy(c);
    server_free(s);
}

/* ---- two requests in flight on one handle ---------------------------------- */

static void script_two(server *s)
{
    Baton__V1__ClientMessage *a = srv_recv(s), *b = srv_recv(s);
    if (!a || !b)
        return;
    const char *ra = a->infer->request_id, *rb = b->infer->request_id;
    srv_chunk(s, rb, 0, 20, "tensor");
    srv_chunk(s, ra, 0, 10, "tensor");
    srv_response(s, rb, 0, "");
    srv_chunk(s, ra, 1, 11, "tensor");
    srv_response(s, ra, BATON__V1__CODE__DEADLINE_EXCEEDED, "deadline passed");
}

static void test_two_in_flight(void **state)
{
    (void)state;
    server *s = server_start(script_two, false);
    baton_client *c = client_for(s);
    baton_client_request *ra, *rb;
    assert_int_equal(baton_client_request_create("g", NULL, &ra), 0);
    assert_int_equal(baton_client_request_create("g", NULL, &rb), 0);
    /* Generated ids are non-empty and distinct. */
    assert_true(strlen(baton_client_request_id(ra)) > 0);
    assert_string_not_equal(baton_client_request_id(ra), baton_client_request_id(rb));
    assert_int_equal(baton_client_send(c, ra), 0);
    assert_int_equal(baton_client_send(c, rb), 0);
    const char *ia = baton_client_request_id(ra), *ib = baton_client_request_id(rb);

    baton_client_event *ev = expect_event(c, BATON_CLIENT_EVENT_CHUNK, ib);
    assert_int_equal(*(const int32_t *)ev->value.data, 20);
    baton_client_event_free(ev);
    ev = expect_event(c, BATON_CLIENT_EVENT_CHUNK, ia);
    assert_int_equal(ev->seq, 0);
    baton_client_event_free(ev);
    ev = expect_event(c, BATON_CLIENT_EVENT_RESPONSE, ib);
    assert_int_equal(ev->code, BATON_CLIENT_CODE_OK);
    baton_client_event_free(ev);
    ev = expect_event(c, BATON_CLIENT_EVENT_CHUNK, ia);
    assert_int_equal(ev->seq, 1);
    baton_client_event_free(ev);
    ev = expect_event(c, BATON_CLIENT_EVENT_RESPONSE, ia);
    assert_int_equal(ev->code, BATON_CLIENT_CODE_DEADLINE_EXCEEDED);
    assert_string_equal(ev->message, "deadline passed");
    assert_string_equal(baton_client_code_name(ev->code), "DEADLINE_EXCEEDED");
    baton_client_event_free(ev);

    server_join(s);
    assert_int_equal(s->n_got, 2);
    assert_int_equal(s->got[0]->infer->n_inputs, 0);
    assert_false(s->got[0]->infer->stream);
    assert_null(s->got[0]->infer->sampling); /* unset sampling stays unset on the wire */
    baton_client_request_destroy(ra);
    baton_client_request_destroy(rb);
    baton_client_destroy(c);
    server_free(s);
}

/* ---- cancel ------------------------------------------------------------------ */

static void script_cancel(server *s)
{
    Baton__V1__ClientMessage *m = srv_recv(s), *cm = srv_recv(s);
    if (!m || !cm || cm->msg_case != BATON__V1__CLIENT_MESSAGE__MSG_CANCEL)
        return;
    srv_response(s, cm->cancel->request_id, BATON__V1__CODE__CANCELLED, "cancelled by the client");
}

static void test_cancel(void **state)
{
    (void)state;
    server *s = server_start(script_cancel, false);
    baton_client *c = client_for(s);
    baton_client_request *r;
    assert_int_equal(baton_client_request_create("g", "long-one", &r), 0);
    assert_int_equal(baton_client_send(c, r), 0);
    assert_int_equal(baton_client_cancel(c, "long-one"), 0);
    assert_int_equal(baton_client_cancel(c, ""), BATON_CLIENT_EINVAL);
    baton_client_event *ev = expect_event(c, BATON_CLIENT_EVENT_RESPONSE, "long-one");
    assert_int_equal(ev->code, BATON_CLIENT_CODE_CANCELLED);
    baton_client_event_free(ev);
    server_join(s);
    assert_int_equal(s->n_got, 2);
    assert_int_equal(s->got[1]->msg_case, BATON__V1__CLIENT_MESSAGE__MSG_CANCEL);
    assert_string_equal(s->got[1]->cancel->request_id, "long-one");
    baton_client_request_destroy(r);
    baton_client_destroy(c);
    server_free(s);
}

/* ---- health, stats, inspect ---------------------------------------------- */

static void script_probes(server *s)
{
    if (!srv_recv(s))
        return;
    srv_health(s, "all loaded");
    if (!srv_recv(s))
        return;
    srv_text(s, true, "baton_requests_total 3\n");
    if (!srv_recv(s))
        return;
    srv_text(s, false, "graph chat: 2 nodes, 1 loops, 4 edges; inputs: prompt\n");
}

static void test_probes(void **state)
{
    (void)state;
    server *s = server_start(script_probes, false);
    baton_client *c = client_for(s);
    baton_client_event *ev;
    assert_int_equal(baton_client_health(c, 5000, &ev), 0);
    assert_int_equal(ev->kind, BATON_CLIENT_EVENT_HEALTH);
    assert_true(ev->live);
    assert_true(ev->ready);
    assert_int_equal(ev->n_workers_ready, 2);
    assert_string_equal(ev->workers_ready[1], "cpu1");
    assert_string_equal(ev->message, "all loaded");
    baton_client_event_free(ev);
    assert_int_equal(baton_client_stats(c, 5000, &ev), 0);
    assert_int_equal(ev->kind, BATON_CLIENT_EVENT_STATS);
    assert_string_equal(ev->text, "baton_requests_total 3\n");
    baton_client_event_free(ev);
    assert_int_equal(baton_client_inspect(c, "chat", 5000, &ev), 0);
    assert_int_equal(ev->kind, BATON_CLIENT_EVENT_INSPECT);
    assert_non_null(strstr(ev->text, "inputs: prompt"));
    baton_client_event_free(ev);
    server_join(s);
    assert_int_equal(s->n_got, 3);
    assert_int_equal(s->got[0]->msg_case, BATON__V1__CLIENT_MESSAGE__MSG_HEALTH);
    assert_int_equal(s->got[1]->msg_case, BATON__V1__CLIENT_MESSAGE__MSG_STATS);
    assert_int_equal(s->got[2]->msg_case, BATON__V1__CLIENT_MESSAGE__MSG_INSPECT);
    assert_string_equal(s->got[2]->inspect->graph, "chat");
    baton_client_destroy(c);
    server_free(s);
}

/* A probe while a request streams: the chunk and response that arrive
 * around the health answer are kept, in order, for recv. */
static void script_probe_queue(server *s)
{
    Baton__V1__ClientMessage *m = srv_recv(s);
    if (!m || !srv_recv(s))
        return;
    srv_chunk(s, m->infer->request_id, 0, 1, "tensor");
    srv_response(s, m->infer->request_id, 0, "");
    srv_health(s, "ok");
}

static void test_probe_keeps_events(void **state)
{
    (void)state;
    server *s = server_start(script_probe_queue, false);
    baton_client *c = client_for(s);
    baton_client_request *r;
    assert_int_equal(baton_client_request_create("g", "q1", &r), 0);
    assert_int_equal(baton_client_send(c, r), 0);
    baton_client_event *ev;
    assert_int_equal(baton_client_health(c, 5000, &ev), 0);
    assert_int_equal(ev->kind, BATON_CLIENT_EVENT_HEALTH);
    baton_client_event_free(ev);
    ev = expect_event(c, BATON_CLIENT_EVENT_CHUNK, "q1");
    baton_client_event_free(ev);
    ev = expect_event(c, BATON_CLIENT_EVENT_RESPONSE, "q1");
    baton_client_event_free(ev);
    server_join(s);
    baton_client_request_destroy(r);
    baton_client_destroy(c);
    server_free(s);
}

/* A health answer that comes after its call timed out is not taken for the
 * answer of the next call. */
static void script_late_health(server *s)
{
    if (!srv_recv(s) || !srv_recv(s))
        return;
    srv_health(s, "first");
    srv_health(s, "second");
}

static void test_late_probe_answer(void **state)
{
    (void)state;
    server *s = server_start(script_late_health, false);
    baton_client *c = client_for(s);
    baton_client_event *ev = NULL;
    assert_int_equal(baton_client_health(c, 100, &ev), BATON_CLIENT_ETIMEDOUT);
    assert_null(ev);
    assert_int_equal(baton_client_health(c, 5000, &ev), 0);
    assert_string_equal(ev->message, "second");
    baton_client_event_free(ev);
    server_join(s);
    baton_client_destroy(c);
    server_free(s);
}

/* ---- timeouts and bad frames ------------------------------------------------- */

static void script_silent(server *s)
{
    srv_recv(s);
}

static void test_recv_timeout(void **state)
{
    (void)state;
    server *s = server_start(script_silent, false);
    baton_client *c = client_for(s);
    baton_client_request *r;
    assert_int_equal(baton_client_request_create("g", "quiet", &r), 0);
    assert_int_equal(baton_client_send(c, r), 0);
    baton_client_event *ev = NULL;
    assert_int_equal(baton_client_recv(c, 100, &ev), BATON_CLIENT_ETIMEDOUT);
    assert_int_equal(baton_client_recv(c, 0, &ev), BATON_CLIENT_ETIMEDOUT);
    assert_null(ev);
    server_join(s);
    baton_client_request_destroy(r);
    baton_client_destroy(c);
    server_free(s);
}

static void test_no_daemon(void **state)
{
    (void)state;
    baton_client_options o = {.connect_timeout_ms = 100};
    baton_client *c;
    assert_int_equal(baton_client_create_with("ipc:///tmp/baton-test-nobody-here.sock", &o, &c),
                     0);
    baton_client_event *ev = NULL;
    assert_int_equal(baton_client_health(c, 100, &ev), BATON_CLIENT_ECONNECT);
    baton_client_destroy(c);
    assert_int_equal(baton_client_create("bogus://x", &c), BATON_CLIENT_ECONNECT);
    o.server_public_key = "short";
    assert_int_equal(baton_client_create_with("tcp://127.0.0.1:1", &o, &c), BATON_CLIENT_EINVAL);
}

static void script_malformed(server *s)
{
    Baton__V1__ClientMessage *m = srv_recv(s);
    if (!m)
        return;
    const char *rid = m->infer->request_id;
    srv_send_raw(s, "\xff\xff\xff\xff", 4);        /* not protobuf */
    srv_send_parts(s, "\x00", 1, true);            /* two parts */
    srv_send_parts(s, "\x00", 1, false);
    srv_send_raw(s, "", 0);                        /* a ServerMessage with nothing set */
    {                                              /* a chunk whose data disagrees with dims */
        int64_t dims[2] = {2, 2};
        Baton__V1__Tensor t = BATON__V1__TENSOR__INIT;
        Baton__V1__InferChunk ch = BATON__V1__INFER_CHUNK__INIT;
        Baton__V1__ServerMessage sm = BATON__V1__SERVER_MESSAGE__INIT;
        t.dtype = BATON__V1__DTYPE__F32;
        t.n_dims = 2;
        t.dims = dims;
        t.data.data = (uint8_t *)"abcd";
        t.data.len = 4;
        ch.request_id = (char *)rid;
        ch.value = &t;
        sm.msg_case = BATON__V1__SERVER_MESSAGE__MSG_CHUNK;
        sm.chunk = &ch;
        srv_send(s, &sm);
        ch.value = NULL;                           /* a chunk without a value */
        srv_send(s, &sm);
        ch.value = &t;                             /* a dtype outside the enum */
        t.dtype = (Baton__V1__DType)99;
        t.n_dims = 1;
        srv_send(s, &sm);
    }
    srv_response(s, rid, 0, "");
}

static void test_malformed_frames(void **state)
{
    (void)state;
    server *s = server_start(script_malformed, false);
    baton_client *c = client_for(s);
    baton_client_request *r;
    assert_int_equal(baton_client_request_create("g", "bad", &r), 0);
    assert_int_equal(baton_client_send(c, r), 0);
    baton_client_event *ev = NULL;
    for (int i = 0; i < 6; i++)
        assert_int_equal(baton_client_recv(c, 5000, &ev), BATON_CLIENT_EPROTO);
    assert_null(ev);
    /* The handle is still usable: the next good frame decodes. */
    ev = expect_event(c, BATON_CLIENT_EVENT_RESPONSE, "bad");
    baton_client_event_free(ev);
    server_join(s);
    baton_client_request_destroy(r);
    baton_client_destroy(c);
    server_free(s);
}

/* ---- CURVE ------------------------------------------------------------------- */

static void script_health_once(server *s)
{
    if (srv_recv(s))
        srv_health(s, "curve ok");
}

static void test_curve(void **state)
{
    (void)state;
    if (!zmq_has("curve"))
        skip_because("libzmq has no CURVE support");
    server *s = server_start(script_health_once, true);
    baton_client_options o = {.server_public_key = s->curve_public};
    baton_client *c;
    assert_int_equal(baton_client_create_with(s->endpoint, &o, &c), 0);
    baton_client_event *ev;
    assert_int_equal(baton_client_health(c, 5000, &ev), 0);
    assert_string_equal(ev->message, "curve ok");
    baton_client_event_free(ev);
    server_join(s);
    baton_client_destroy(c);
    server_free(s);
}

/* ---- request building and names ------------------------------------------ */

static void test_request_validation(void **state)
{
    (void)state;
    baton_client_request *r;
    char longid[BATON_CLIENT_MAX_REQUEST_ID + 2];
    memset(longid, 'a', sizeof longid - 1);
    longid[sizeof longid - 1] = 0;
    assert_int_equal(baton_client_request_create("", NULL, &r), BATON_CLIENT_EINVAL);
    assert_int_equal(baton_client_request_create("g", "", &r), BATON_CLIENT_EINVAL);
    assert_int_equal(baton_client_request_create("g", longid, &r), BATON_CLIENT_EINVAL);
    longid[BATON_CLIENT_MAX_REQUEST_ID] = 0; /* exactly the limit is fine */
    assert_int_equal(baton_client_request_create("g", longid, &r), 0);
    baton_client_request_destroy(r);

    assert_int_equal(baton_client_request_create("g", NULL, &r), 0);
    int64_t d2[2] = {2, 2}, neg[1] = {-1}, huge[2] = {INT64_MAX, 4};
    float f[4] = {0};
    assert_int_equal(baton_client_request_add_input(r, "x", BATON_CLIENT_DTYPE_F32, d2, 2, f, 12),
                     BATON_CLIENT_EINVAL); /* 12 != 2*2*4 */
    assert_int_equal(baton_client_request_add_input(r, "x", BATON_CLIENT_DTYPE_UNSPECIFIED, d2, 2,
                                                    f, 16), BATON_CLIENT_EINVAL);
    assert_int_equal(baton_client_request_add_input(r, "x", BATON_CLIENT_DTYPE_U8, neg, 1, f, 0),
                     BATON_CLIENT_EINVAL);
    assert_int_equal(baton_client_request_add_input(r, "x", BATON_CLIENT_DTYPE_I64, huge, 2, f, 0),
                     BATON_CLIENT_EINVAL);
    assert_int_equal(baton_client_request_add_input(r, "x", BATON_CLIENT_DTYPE_F32, d2, 2, f, 16),
                     0);
    assert_int_equal(baton_client_request_add_input(r, "x", BATON_CLIENT_DTYPE_F32, d2, 2, f, 16),
                     BATON_CLIENT_EINVAL); /* duplicate name */
    float scalar = 1.5f;
    assert_int_equal(baton_client_request_add_input(r, "s", BATON_CLIENT_DTYPE_F32, NULL, 0,
                                                    &scalar, 4), 0);
    int64_t zero[1] = {0};
    assert_int_equal(baton_client_request_add_input(r, "empty", BATON_CLIENT_DTYPE_I32, zero, 1,
                                                    NULL, 0), 0);
    assert_int_equal(baton_client_request_add_text(r, "t", ""), 0);
    assert_int_equal(baton_client_request_set_max_iters(r, "loop", 0), BATON_CLIENT_EINVAL);
    assert_int_equal(baton_client_request_set_max_iters(r, "", 3), BATON_CLIENT_EINVAL);
    assert_int_equal(baton_client_request_add_message(r, "tool", "42"), BATON_CLIENT_EINVAL);
    assert_int_equal(baton_client_request_add_message(r, "user", NULL), BATON_CLIENT_EINVAL);
    assert_int_equal(baton_client_request_add_message(r, "assistant", ""), 0);
    assert_int_equal(baton_client_request_set_messages_input(r, "p"), 0);
    assert_int_equal(baton_client_request_set_messages_input(r, NULL), 0); /* back to "" */
    baton_client_sampling bad = {-1.0f, 0, 0.5f, 0};
    assert_int_equal(baton_client_request_set_sampling(r, &bad), BATON_CLIENT_EINVAL);
    bad.temperature = 1.0f;
    bad.top_p = 1.5f;
    assert_int_equal(baton_client_request_set_sampling(r, &bad), BATON_CLIENT_EINVAL);
    baton_client_request_destroy(r);
    baton_client_request_destroy(NULL);
    baton_client_event_free(NULL);
    baton_client_destroy(NULL);
}

static void test_names(void **state)
{
    (void)state;
    baton_client_dtype d;
    assert_int_equal(baton_client_dtype_from_name("F32", &d), 0);
    assert_int_equal(d, BATON_CLIENT_DTYPE_F32);
    assert_int_equal(baton_client_dtype_from_name("bfloat16", &d), 0);
    assert_int_equal(d, BATON_CLIENT_DTYPE_BF16);
    assert_int_equal(baton_client_dtype_from_name("f8", &d), BATON_CLIENT_EINVAL);
    assert_string_equal(baton_client_dtype_name(BATON_CLIENT_DTYPE_I64), "i64");
    assert_string_equal(baton_client_dtype_name(0), "?");
    assert_int_equal(baton_client_dtype_size(BATON_CLIENT_DTYPE_BF16), 2);
    assert_int_equal(baton_client_dtype_size(42), 0);
    assert_string_equal(baton_client_code_name(14), "UNAVAILABLE");
    assert_string_equal(baton_client_code_name(7), "UNKNOWN");
    assert_string_equal(baton_client_strerror(BATON_CLIENT_ETIMEDOUT),
                        "timed out waiting for the daemon");
    assert_string_equal(baton_client_strerror(-99), "unknown error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_infer_roundtrip),
        cmocka_unit_test(test_two_in_flight),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_probes),
        cmocka_unit_test(test_probe_keeps_events),
        cmocka_unit_test(test_late_probe_answer),
        cmocka_unit_test(test_recv_timeout),
        cmocka_unit_test(test_no_daemon),
        cmocka_unit_test(test_malformed_frames),
        cmocka_unit_test(test_curve),
        cmocka_unit_test(test_request_validation),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests_name("client", tests, NULL, NULL);
}
