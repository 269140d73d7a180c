/* libFuzzer target: client frames at the conductor's door.
 *
 * The conductor's own modules (frontend, door, outbound, dispatcher,
 * runtime, tensor table, supervisor, metrics) run in-process over inproc
 * ZeroMQ sockets: a client DEALER sends the frames to the client ROUTER the
 * frontend reads, and two fake workers, DEALERs named like the config's
 * two external workers, register, load their models and answer every Put,
 * Dispatch and Fetch at once (a Done with an inline output per output
 * spec, a final Chunk first for a stream output).  They also fail, as a
 * full pool or a failing model does, where the input says so: a Put whose
 * value's first byte is 0xff is refused (RESOURCE_EXHAUSTED), and a
 * Dispatch of a request whose id ends in '!' fails (INTERNAL).  Nothing
 * runs on a timer: after the frames are read the harness passes messages
 * back and forth until every side is quiet.
 *
 * The input is a sequence of frames, each a 16-bit little-endian length
 * and that many bytes; what remains after the last whole frame is one
 * more frame.  So one input can start a request and cancel it, or repeat
 * an id while the first is in flight.  A length of 0xfffe is no frame but
 * a tick: the frames so far are read, and then every deadline has passed
 * (front_tick far in the future) while their Puts and Dispatches are still
 * unanswered, so that the worker's answers arrive for requests that ended.
 *
 * Asserted after each input, beyond the sanitizers: every frame that asks
 * for an InferResponse (an InferRequest, a frame that does not parse or
 * that the wire check refuses, an empty ClientMessage) got exactly one,
 * under the id the door answers with (the request_id when it is valid,
 * else ""); every CancelRequest got one
 * CancelResponse; every chunk belongs to a request sent; and nothing is
 * left in flight or placing, nor in the runtime's references or the
 * conductor's tensor table.  With BATON_FUZZ_VERBOSE set in the
 * environment each InferResponse's status is printed. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "config/config.h"
#include "config/graph.h"
#include "daemon/dispatch.h"
#include "daemon/door.h"
#include "daemon/frontend.h"
#include "daemon/metrics.h"
#include "daemon/outbound.h"
#include "daemon/supervisor.h"
#include "daemon/tensors.h"
#include "proto/baton.pb-c.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "fuzz_door: %s failed at line %d\n", #c, __LINE__); abort(); } } while (0)

/* One external worker with three models, and graphs that cover a plain
 * node, a loop streaming tokens, and a text stream that stop strings and
 * max_tokens apply to.  No speculation: the fake worker never runs ahead. */
static const char CONFIG[] =
    "version: 1\n"
    "daemon:\n"
    "  listen: ipc:///nonexistent/fuzz-door.sock\n"
    "  workers_endpoint: ipc:///nonexistent/fuzz-door-workers.sock\n"
    "  speculation_window: 0\n"
    "  max_inflight: 4\n"
    "  max_message_bytes: 16384\n"
    "  log_level: error\n"
    "workers:\n"
    "  - {name: w0, device: cpu, spawn: external}\n"
    "  - {name: w1, device: cpu, spawn: external}\n"
    "models:\n"
    "  - {name: echo, backend: echo, worker: w0}\n"
    "  - {name: counter, backend: counter, worker: w0}\n"
    "  - {name: chunks, backend: chunks, worker: w0, options: {n: 2}}\n"
    "  - {name: echo1, backend: echo, worker: w1}\n"
    "graphs:\n"
    "  - name: echo\n"
    "    inputs: [x]\n"
    "    body: {node: {name: a, model: echo, inputs: [x], outputs: [{name: x, to: client}]}}\n"
    "  - name: pair\n"
    "    inputs: [x, y]\n"
    "    body:\n"
    "      sequential:\n"
    "        - node: {name: a, model: echo, inputs: [x], outputs: [{name: x, to: b}]}\n"
    "        - node: {name: b, model: echo, inputs: [x, y], outputs: [{name: x, to: client}]}\n"
    /* x is read on w0 alone (an early Put); y on both workers (a Put
     * answered by Placed before the request runs). */
    "  - name: split\n"
    "    inputs: [x, y]\n"
    "    body:\n"
    "      parallel:\n"
    "        - node: {name: a, model: echo, inputs: [x, y], outputs: [{name: x, to: client}]}\n"
    "        - node: {name: b, model: echo1, inputs: [y], outputs: [{name: y, to: client}]}\n"
    "  - name: count\n"
    "    inputs: [x]\n"
    "    body:\n"
    "      sequential:\n"
    "        - node: {name: start, model: echo, inputs: [x], outputs: [{name: state, to: tick}]}\n"
    "        - loop:\n"
    "            name: steps\n"
    "            max_iters: 4\n"
    "            body:\n"
    "              node:\n"
    "                name: tick\n"
    "                model: counter\n"
    "                inputs: [state]\n"
    "                outputs:\n"
    "                  - {name: state, to: tick}\n"
    "                  - {name: iteration, to: client, new_token: true}\n"
    "  - name: text\n"
    "    inputs: [prompt]\n"
    "    body:\n"
    "      loop:\n"
    "        name: decode\n"
    "        max_iters: 5\n"
    "        body:\n"
    "          node:\n"
    "            name: gen\n"
    "            model: chunks\n"
    "            inputs: [prompt]\n"
    "            outputs:\n"
    "              - {name: token, to: client, new_token: true, modality: text}\n";

static struct {
    void *zctx, *front, *back, *client;
    void *workers[2];  /* the fake workers w0 and w1 */
    int cur;           /* the one answering now */
    cfg_config *cfg;
    graph_set *gs;
    metrics *m;
    supervisor *sup;
    replicas *rs;
    tensor_table *tt;
    dispatcher *disp;
    outbound *out;
    frontend *f;
    bool ready;
    uint64_t next_id;  /* the fake worker's tensor ids */
} H;

/* ---- the conductor's hooks, wired as conductor.c wires them ---- */

static bool worker_ready(void *arg, int w)
{
    return sup_worker_get(arg, w)->state == SUP_READY;
}

static void on_ready_changed(void *arg, bool ready)
{
    (void)arg;
    H.ready = ready;
    if (H.f)
        front_set_admission(H.f, ready ? FRONT_OPEN : FRONT_NOT_READY);
}

static void on_worker_lost(void *arg, int w, const char *why)
{
    (void)arg;
    fprintf(stderr, "fuzz_door: the fake worker was lost: %s\n", why);
    (void)w;
    abort();
}

static void on_worker_message(void *arg, int w, const Baton__V1__WorkerMessage *m)
{
    (void)arg;
    switch (m->msg_case) {
    case BATON__V1__WORKER_MESSAGE__MSG_DONE: disp_done(H.disp, w, m->done); break;
    case BATON__V1__WORKER_MESSAGE__MSG_CHUNK: disp_chunk(H.disp, w, m->chunk); break;
    case BATON__V1__WORKER_MESSAGE__MSG_PLACED: front_placed(H.f, w, m->placed); break;
    case BATON__V1__WORKER_MESSAGE__MSG_FETCHED: front_fetched(H.f, w, m->fetched); break;
    default: break;
    }
}

static void on_burst_begin(void *arg)
{
    (void)arg;
    disp_burst_begin(H.disp);
}

static void on_burst_end(void *arg)
{
    (void)arg;
    disp_burst_end(H.disp);
}

static void on_chunk(void *arg, uint64_t req, const rt_action *a)
{
    (void)arg;
    front_on_chunk(H.f, req, a);
}

static void on_response(void *arg, uint64_t req, const rt_action *a, const disp_timing *t,
                        size_t n)
{
    (void)arg;
    front_on_response(H.f, req, a, t, n);
}

static size_t admin_calls;

static void on_admin(void *arg, const uint8_t *identity, size_t identity_len,
                     const Baton__V1__ClientMessage *m)
{
    (void)arg;
    (void)identity;
    (void)identity_len;
    (void)m;
    admin_calls++;
}

/* ---- the fake worker ---- */

static void worker_send(const Baton__V1__WorkerMessage *m)
{
    size_t n = baton__v1__worker_message__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    CHECK(buf);
    baton__v1__worker_message__pack(m, buf);
    CHECK(zmq_send(H.workers[H.cur], buf, n, 0) == (int)n);
    free(buf);
}

/* A fresh 4-byte U8 tensor of the worker, its bytes inline. */
static void fake_ref(Baton__V1__TensorRef *r, int64_t *dim, uint8_t *bytes)
{
    baton__v1__tensor_ref__init(r);
    r->owner = (uint32_t)H.cur;
    r->pool = 0;
    r->offset = 0;
    r->nbytes = 4;
    r->dtype = BATON__V1__DTYPE__U8;
    *dim = 4;
    r->dims = dim;
    r->n_dims = 1;
    r->id = ++H.next_id;
    memcpy(bytes, "ab\n ", 4);
    r->data.data = bytes;
    r->data.len = 4;
}

static void answer_dispatch(const Baton__V1__Dispatch *d)
{
    size_t n = d->n_outputs;
    Baton__V1__NamedRef *named = calloc(n + 1, sizeof(*named));
    Baton__V1__NamedRef **ptrs = calloc(n + 1, sizeof(*ptrs));
    Baton__V1__TensorRef *refs = calloc(n + 1, sizeof(*refs));
    int64_t *dims = calloc(n + 1, sizeof(*dims));
    uint8_t (*bytes)[4] = calloc(n + 1, sizeof(*bytes));
    CHECK(named && ptrs && refs && dims && bytes);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const Baton__V1__OutputSpec *o = d->outputs[i];
        if (o->stream) {
            Baton__V1__TensorRef r;
            int64_t dim;
            uint8_t b[4];
            fake_ref(&r, &dim, b);
            Baton__V1__Chunk c = BATON__V1__CHUNK__INIT;
            c.request_key = d->request_key;
            c.node = d->node;
            c.graph = d->graph;
            c.iteration = d->iteration;
            c.n_iteration = d->n_iteration;
            c.name = o->name;
            c.ref = &r;
            c.final = true;
            c.index = 0;
            c.dispatch_id = d->dispatch_id;
            Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
            m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_CHUNK;
            m.chunk = &c;
            worker_send(&m);
            continue;
        }
        baton__v1__named_ref__init(&named[k]);
        named[k].name = o->name;
        fake_ref(&refs[k], &dims[k], bytes[k]);
        named[k].ref = &refs[k];
        ptrs[k] = &named[k];
        k++;
    }
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = BATON__V1__CODE__OK;
    size_t idlen = d->request_id ? strlen(d->request_id) : 0;
    if (idlen && d->request_id[idlen - 1] == '!') {
        st.code = BATON__V1__CODE__INTERNAL;
        st.message = "fuzz_door: the model failed";
        k = 0;
    }
    Baton__V1__Done done = BATON__V1__DONE__INIT;
    done.request_key = d->request_key;
    done.node = d->node;
    done.graph = d->graph;
    done.iteration = d->iteration;
    done.n_iteration = d->n_iteration;
    done.outputs = ptrs;
    done.n_outputs = k;
    done.status = &st;
    done.dispatch_id = d->dispatch_id;
    done.batch_size = 1;
    done.generated_tokens = 1;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_DONE;
    m.done = &done;
    worker_send(&m);
    free(named);
    free(ptrs);
    free(refs);
    free(dims);
    free(bytes);
}

static void answer_put(const Baton__V1__Put *p)
{
    Baton__V1__TensorRef r = BATON__V1__TENSOR_REF__INIT;
    r.owner = (uint32_t)H.cur;
    r.pool = 0;
    r.offset = 0;
    r.nbytes = p->value ? p->value->data.len : 0;
    r.dtype = p->value ? p->value->dtype : BATON__V1__DTYPE__U8;
    if (p->value) {
        r.dims = p->value->dims;
        r.n_dims = p->value->n_dims;
    }
    r.id = p->tensor_id ? p->tensor_id : ++H.next_id;
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = BATON__V1__CODE__OK;
    Baton__V1__Placed pl = BATON__V1__PLACED__INIT;
    pl.request_key = p->request_key;
    pl.put_id = p->put_id;
    pl.ref = &r;
    pl.status = &st;
    if (p->value && p->value->data.len && p->value->data.data[0] == 0xff) {
        st.code = BATON__V1__CODE__RESOURCE_EXHAUSTED;
        st.message = "fuzz_door: the pool is full";
        pl.ref = NULL;
    }
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_PLACED;
    m.placed = &pl;
    worker_send(&m);
}

static void answer_fetch(const Baton__V1__Fetch *fe)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = BATON__V1__CODE__OK;
    Baton__V1__Fetched fd = BATON__V1__FETCHED__INIT;
    fd.tensor_id = fe->tensor_id;
    fd.data.data = (uint8_t *)"ab\n ";
    fd.data.len = 4;
    fd.status = &st;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_FETCHED;
    m.fetched = &fd;
    worker_send(&m);
}

static void answer_load(const Baton__V1__Load *l)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = BATON__V1__CODE__OK;
    Baton__V1__Loaded ld = BATON__V1__LOADED__INIT;
    ld.model = l->model;
    ld.status = &st;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_LOADED;
    m.loaded = &ld;
    worker_send(&m);
}

/* Answers what the conductor sent worker W; returns how many messages. */
static size_t worker_pump(int w)
{
    size_t n = 0;
    H.cur = w;
    for (;;) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, H.workers[w], ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            return n;
        }
        n++;
        Baton__V1__ConductorMessage *cm =
            baton__v1__conductor_message__unpack(NULL, zmq_msg_size(&msg), zmq_msg_data(&msg));
        CHECK(cm);
        switch (cm->msg_case) {
        case BATON__V1__CONDUCTOR_MESSAGE__MSG_LOAD: answer_load(cm->load); break;
        case BATON__V1__CONDUCTOR_MESSAGE__MSG_DISPATCH: answer_dispatch(cm->dispatch); break;
        case BATON__V1__CONDUCTOR_MESSAGE__MSG_PUT: answer_put(cm->put); break;
        case BATON__V1__CONDUCTOR_MESSAGE__MSG_FETCH: answer_fetch(cm->fetch); break;
        case BATON__V1__CONDUCTOR_MESSAGE__MSG_SHUTDOWN:
            fprintf(stderr, "fuzz_door: the conductor shut the fake worker down\n");
            abort();
        default: break; /* Peers, Release, Drop, SessionClose: nothing to answer */
        }
        baton__v1__conductor_message__free_unpacked(cm, NULL);
        zmq_msg_close(&msg);
    }
}

/* Passes messages between the conductor and the fake worker until both
 * are quiet.  Inproc pipes deliver a message as it is sent, so a round in
 * which neither side read anything means nothing is left in flight. */
static void settle(void)
{
    for (int round = 0; round < 100000; round++) {
        size_t n = worker_pump(0) + worker_pump(1);
        zmq_pollitem_t it = {H.back, 0, ZMQ_POLLIN, 0};
        int ready = zmq_poll(&it, 1, 0);
        if (ready > 0)
            sup_on_readable(NULL, H.sup);
        if (n == 0 && ready <= 0)
            return;
    }
    fprintf(stderr, "fuzz_door: the conductor and the worker never went quiet\n");
    abort();
}

static void *router(const char *endpoint, bool mandatory)
{
    void *s = zmq_socket(H.zctx, ZMQ_ROUTER);
    CHECK(s);
    int zero = 0, one = 1;
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    if (mandatory) {
        zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
    }
    CHECK(zmq_bind(s, endpoint) == 0);
    return s;
}

static void *dealer(const char *endpoint, const char *id)
{
    void *s = zmq_socket(H.zctx, ZMQ_DEALER);
    CHECK(s);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    if (id)
        zmq_setsockopt(s, ZMQ_ROUTING_ID, id, strlen(id));
    CHECK(zmq_connect(s, endpoint) == 0);
    return s;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    bt_diag *diag = bt_diag_create("fuzz_door.yaml");
    CHECK(diag);
    if (cfg_load_string(CONFIG, sizeof(CONFIG) - 1, "fuzz_door.yaml", diag, &H.cfg) != 0 ||
        graph_set_build(H.cfg, diag, &H.gs) != 0) {
        bt_diag_print(diag, stderr);
        abort();
    }
    bt_diag_destroy(diag);
    /* Refusals are what the fuzzer makes most: quiet unless asked. */
    bt_log_set_level(getenv("BATON_FUZZ_VERBOSE") ? BT_LOG_DEBUG : (bt_log_level)(BT_LOG_ERROR - 1));
    H.zctx = zmq_ctx_new();
    CHECK(H.zctx);
    H.back = router("inproc://fuzz-door-workers", true);
    H.front = router("inproc://fuzz-door-front", false);
    H.workers[0] = dealer("inproc://fuzz-door-workers", "w0");
    H.workers[1] = dealer("inproc://fuzz-door-workers", "w1");
    H.client = dealer("inproc://fuzz-door-front", NULL);

    sup_options so = {H.cfg, "/nonexistent/fuzz_door.yaml", "fuzz", "/nonexistent/baton-worker",
                      H.back};
    sup_hooks sh = {NULL, on_ready_changed, on_worker_lost, on_worker_message, on_burst_begin,
                    on_burst_end};
    disp_hooks dh = {NULL, on_chunk, on_response};
    front_hooks fh = {NULL, on_admin};
    CHECK((H.m = metrics_create(H.gs)));
    CHECK(sup_create(&so, &sh, &H.sup) == 0);
    CHECK(replicas_create(H.cfg, worker_ready, H.sup, &H.rs) == 0);
    CHECK((H.tt = tt_create(H.sup)));
    CHECK(disp_create(H.gs, H.cfg->daemon.speculation_window, H.sup, H.rs, H.tt, H.m, &dh,
                      &H.disp) == 0);
    CHECK((H.out = out_create(H.front, H.gs, H.sup, H.tt, H.m)));
    front_options fo = {H.gs, H.front, H.out, H.sup, H.tt, H.disp, H.rs, {0, 0, 0}};
    CHECK(front_create(&fo, &fh, &H.f) == 0);
    const cfg_daemon *d = &H.cfg->daemon;
    front_limits lim = {d->max_inflight, d->request_timeout_ms, d->max_message_bytes,
                        d->max_request_timeout_ms, d->client_max_inflight,
                        d->client_max_reply_bytes, d->client_stall_timeout_ms};
    front_set_limits(H.f, &lim);
    front_set_admission(H.f, FRONT_NOT_READY);

    /* The worker registers with one (unnamed) pool, then loads. */
    Baton__V1__PoolHandle pool = BATON__V1__POOL_HANDLE__INIT;
    pool.pool = 0;
    pool.kind = BATON__V1__POOL_KIND__POOL_KIND_SHM;
    pool.shm_name = "";
    pool.pool_bytes = 1 << 20;
    pool.cuda_device = -1;
    Baton__V1__PoolHandle *pools[] = {&pool};
    Baton__V1__Register rg = BATON__V1__REGISTER__INIT;
    rg.protocol_version = BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    rg.worker = "w0";
    rg.device = "cpu";
    rg.pools = pools;
    rg.n_pools = 1;
    rg.pool_bytes = pool.pool_bytes;
    rg.hostname = "fuzz";
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION;
    m.registration = &rg;
    for (H.cur = 0; H.cur < 2; H.cur++) {
        rg.worker = H.cur ? "w1" : "w0";
        worker_send(&m);
    }
    settle();
    if (!H.ready) {
        fprintf(stderr, "fuzz_door: the fake worker did not become ready\n");
        abort();
    }
    return 0;
}

/* ---- one input ---- */

/* What one input expects back: per id, InferResponses; CancelResponses. */
typedef struct expect {
    char **ids;
    long *want;     /* responses owed per id */
    size_t n, cap;
    long cancels;
} expect;

static long *owed(expect *e, const char *id)
{
    for (size_t i = 0; i < e->n; i++)
        if (strcmp(e->ids[i], id) == 0)
            return &e->want[i];
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 8;
        e->ids = realloc(e->ids, e->cap * sizeof(*e->ids));
        e->want = realloc(e->want, e->cap * sizeof(*e->want));
        CHECK(e->ids && e->want);
    }
    e->ids[e->n] = strdup(id);
    CHECK(e->ids[e->n]);
    e->want[e->n] = 0;
    return &e->want[e->n++];
}

/* Sends one frame and notes what it is owed, by the door's rules. */
static void send_frame(expect *e, const uint8_t *p, size_t n)
{
    CHECK(zmq_send(H.client, p, n, 0) == (int)n);
    if (n > H.cfg->daemon.max_message_bytes) {
        (*owed(e, ""))++;
        return;
    }
    Baton__V1__ClientMessage *cm = baton__v1__client_message__unpack(NULL, n, p);
    if (!cm) {
        (*owed(e, ""))++;
        return;
    }
    /* A frame the wire check refuses is answered at once: a cancel by a
     * CancelResponse, anything else by an InferResponse, under the
     * request_id unless that is among the bad strings or too long. */
    bool id_bad = false;
    char why[384];
    if (door_check_wire(p, n, &id_bad, why, sizeof(why)) != BT_CODE_OK) {
        if (cm->msg_case == BATON__V1__CLIENT_MESSAGE__MSG_CANCEL) {
            e->cancels++;
        } else {
            const char *rid = cm->msg_case == BATON__V1__CLIENT_MESSAGE__MSG_INFER &&
                                      cm->infer->request_id
                                  ? cm->infer->request_id : "";
            (*owed(e, id_bad || strlen(rid) > DOOR_REQUEST_ID_MAX ? "" : rid))++;
        }
        baton__v1__client_message__free_unpacked(cm, NULL);
        return;
    }
    switch (cm->msg_case) {
    case BATON__V1__CLIENT_MESSAGE__MSG_INFER: {
        const char *rid = cm->infer->request_id ? cm->infer->request_id : "";
        (*owed(e, strlen(rid) <= DOOR_REQUEST_ID_MAX ? rid : ""))++;
        break;
    }
    case BATON__V1__CLIENT_MESSAGE__MSG_CANCEL:
        e->cancels++;
        break;
    case BATON__V1__CLIENT_MESSAGE__MSG_HEALTH:
    case BATON__V1__CLIENT_MESSAGE__MSG_STATS:
    case BATON__V1__CLIENT_MESSAGE__MSG_INSPECT:
        break;
    default:
        (*owed(e, ""))++;
        break;
    }
    baton__v1__client_message__free_unpacked(cm, NULL);
}

/* Reads every answer on the client socket and checks it against E. */
static void collect(expect *e)
{
    for (;;) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, H.client, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            break;
        }
        Baton__V1__ServerMessage *sm =
            baton__v1__server_message__unpack(NULL, zmq_msg_size(&msg), zmq_msg_data(&msg));
        CHECK(sm);
        switch (sm->msg_case) {
        case BATON__V1__SERVER_MESSAGE__MSG_RESPONSE: {
            long *w = owed(e, sm->response->request_id ? sm->response->request_id : "");
            if (*w <= 0) {
                fprintf(stderr, "fuzz_door: an InferResponse for '%s' that nothing asked for "
                        "(or a second one)\n", sm->response->request_id);
                abort();
            }
            (*w)--;
            if (getenv("BATON_FUZZ_VERBOSE"))
                fprintf(stderr, "fuzz_door: '%s': %d %s (%zu outputs)\n",
                        sm->response->request_id,
                        sm->response->status ? (int)sm->response->status->code : -1,
                        sm->response->status ? sm->response->status->message : "",
                        sm->response->n_outputs);
            break;
        }
        case BATON__V1__SERVER_MESSAGE__MSG_CHUNK: {
            const char *id = sm->chunk->request_id ? sm->chunk->request_id : "";
            bool known = false;
            for (size_t i = 0; i < e->n; i++)
                known |= strcmp(e->ids[i], id) == 0;
            CHECK(known && *id);
            break;
        }
        case BATON__V1__SERVER_MESSAGE__MSG_CANCEL:
            CHECK(e->cancels > 0);
            e->cancels--;
            break;
        default:
            fprintf(stderr, "fuzz_door: an answer the frontend does not send (%d)\n",
                    (int)sm->msg_case);
            abort();
        }
        baton__v1__server_message__free_unpacked(sm, NULL);
        zmq_msg_close(&msg);
    }
    for (size_t i = 0; i < e->n; i++)
        if (e->want[i] != 0) {
            fprintf(stderr, "fuzz_door: request '%s' is owed %ld more InferResponse(s)\n",
                    e->ids[i], e->want[i]);
            abort();
        }
    CHECK(e->cancels == 0);
}

/* The length that stands for a tick instead of a frame. */
#define TICK 0xfffe

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    expect e = {0};
    size_t at = 0, frames = 0;
    /* The frontend reads up to 256 frames per call: stay under that. */
    while (at < size && frames < 64) {
        size_t len = size - at;
        const uint8_t *p = data + at;
        if (len >= 2 && (data[at] | data[at + 1] << 8) == TICK) {
            front_on_readable(NULL, H.f);
            front_tick(H.f, bt_now_ms() + 1000000000ull);
            at += 2;
            continue;
        }
        if (len >= 2 && (size_t)(data[at] | data[at + 1] << 8) <= len - 2) {
            len = (size_t)(data[at] | data[at + 1] << 8);
            p = data + at + 2;
            at += 2 + len;
        } else {
            at = size;
        }
        send_frame(&e, p, len);
        frames++;
    }
    front_on_readable(NULL, H.f);
    settle();
    collect(&e);
    CHECK(front_inflight(H.f) == 0);
    CHECK(front_placing(H.f) == 0);
    CHECK(disp_tensors_held(H.disp) == 0);
    CHECK(tt_count(H.tt) == 0);
    for (size_t i = 0; i < e.n; i++)
        free(e.ids[i]);
    free(e.ids);
    free(e.want);
    return 0;
}
