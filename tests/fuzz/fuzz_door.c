/* libFuzzer target: client frames at the door of a real conductor.
 *
 * The conductor is the one batond runs, made by conductor_create_with on
 * this process's ZeroMQ context with inproc:// endpoints, and driven one
 * round of its loop at a time (conductor_step).  Three client DEALERs send
 * it frames; two fake workers, DEALERs that register as the config's two
 * external workers, load their models and answer every Put, Dispatch and
 * Fetch at once (a Done with an inline output per output spec, a final
 * Chunk first for a stream output).  They also fail, as a full pool or a
 * failing model does, where the input says so: a Put whose value's first
 * byte is 0xff is refused (RESOURCE_EXHAUSTED), and a Dispatch of a
 * request whose id ends in '!' fails (INTERNAL).  Nothing waits on a
 * timer: after the frames are read the harness passes messages back and
 * forth until every side is quiet.
 *
 * The input is a sequence of frames, each a 16-bit little-endian length
 * and that many bytes; what remains after the last whole frame is one more
 * frame.  So one input can start a request and cancel it, or repeat an id
 * while the first is in flight.  A few lengths are commands, not frames:
 *
 *   0xfff0..0xfff2  the frames that follow come from client 0, 1 or 2
 *                   (client 0 until told otherwise);
 *   0xfffe          a tick: the conductor reads the frames so far, and then
 *                   every request deadline and client stall timeout has
 *                   passed (the tick runs 2.5 s ahead of the clock, the
 *                   workers having just sent heartbeats) while their Puts
 *                   and Dispatches are still unanswered, so that the
 *                   worker's answers arrive for requests that ended;
 *   0xfff8, 0xfff9  worker 0 or 1 dies: the conductor reads the frames so
 *                   far and sends what they cause, and the worker's
 *                   connection closes unanswered; a new one registers under
 *                   the same name when the harness next settles (the
 *                   conductor loses the old incarnation: "it registered
 *                   again", or a send that finds no route);
 *   0xfffa          both workers fall silent: the tick runs far ahead, past
 *                   the external workers' heartbeat timeout, and both
 *                   register again afterwards;
 *   0xfffb          the conductor and the workers settle now (the clients
 *                   still read nothing), so that replies pile up before
 *                   what follows.
 *
 * The clients read nothing until the frames of the input are done, and
 * their pipes hold 65 replies (the conductor's high-water mark of 64 plus
 * one): a stream of more replies than that waits in the client's backlog.
 *
 * Asserted after each input, beyond the sanitizers: every frame that asks
 * for an InferResponse (an InferRequest, a frame that does not parse or
 * that the wire check refuses, an empty ClientMessage) got exactly one,
 * on the connection that sent it, under the id the door answers with (the
 * request_id when it is valid, else ""); every CancelRequest got one
 * CancelResponse and every Health, Stats and Inspect request its answer;
 * every chunk belongs to a request its client sent; every string of every
 * reply is UTF-8.  Where the conductor dropped a client for not reading
 * (its stall timeout passed at a tick), the replies it discarded are not
 * owed, but none may come twice.  And nothing is left: no request in
 * flight or placing, no tensor reference in the runtime, no entry in the
 * conductor's tensor table, no held reply; the client table's sums agree
 * with its entries and it keeps no more connections than the clients; both
 * workers are registered and ready.  With BATON_FUZZ_VERBOSE set in the
 * environment each InferResponse's status is printed. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/utf8.h"
#include "daemon/conductor.h"
#include "daemon/door.h"
#include "proto/baton.pb-c.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "fuzz_door: %s failed at line %d\n", #c, __LINE__); abort(); } } while (0)

#define N_CLIENTS 3
#define N_WORKERS 2
#define MAX_MESSAGE_BYTES 16384

/* Two external workers with four models, and graphs that cover a plain
 * node, inputs placed on two workers, a loop streaming tokens (a short
 * one, and one whose stream outgrows a client's pipe), and a text stream
 * that stop strings and max_tokens apply to.  No speculation: the fake
 * worker never runs ahead.  The endpoints are replaced by inproc ones. */
static const char CONFIG[] =
    "version: 1\n"
    "daemon:\n"
    "  listen: ipc:///tmp/baton-fuzz-door/front.sock\n"
    "  workers_endpoint: ipc:///tmp/baton-fuzz-door/workers.sock\n"
    "  speculation_window: 0\n"
    "  max_inflight: 16\n"
    "  client_max_inflight: 8\n"
    "  request_timeout_ms: 1000\n"
    "  max_request_timeout_ms: 2000\n"
    "  client_stall_timeout_ms: 2000\n"
    "  client_max_reply_bytes: 65536\n"
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
    /* count again, in flow style, with a stream longer than a client's pipe. */
    "  - {name: long, inputs: [x], body: {sequential: [\n"
    "      {node: {name: start, model: echo, inputs: [x], outputs: [{name: state, to: tick}]}},\n"
    "      {loop: {name: steps, max_iters: 80, body: {node: {name: tick, model: counter,\n"
    "        inputs: [state], outputs: [{name: state, to: tick},\n"
    "                                   {name: iteration, to: client, new_token: true}]}}}}]}}\n"
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
    void *zctx;
    conductor *c;
    void *clients[N_CLIENTS];
    void *workers[N_WORKERS]; /* the fake workers' connections */
    bool down[N_WORKERS];     /* its connection closed (or it was told to shut down): it
                                 registers again on a new one at the next settle */
    int cur;                  /* the fake worker answering now */
    uint64_t next_id;         /* the fake workers' tensor ids */
} H;

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

/* Registers fake worker W on a new connection, with one (unnamed) pool;
 * the conductor then sends it its Loads. */
static void worker_connect(int w)
{
    if (H.workers[w])
        zmq_close(H.workers[w]);
    void *s = zmq_socket(H.zctx, ZMQ_DEALER);
    CHECK(s);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    CHECK(zmq_connect(s, "inproc://fuzz-door-workers") == 0);
    H.workers[w] = s;
    H.down[w] = false;

    Baton__V1__PoolHandle pool = BATON__V1__POOL_HANDLE__INIT;
    pool.pool = 0;
    pool.kind = BATON__V1__POOL_KIND__POOL_KIND_SHM;
    pool.shm_name = "";
    pool.pool_bytes = 1 << 20;
    pool.cuda_device = -1;
    Baton__V1__PoolHandle *pools[] = {&pool};
    Baton__V1__Register rg = BATON__V1__REGISTER__INIT;
    rg.protocol_version = BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    rg.worker = w ? "w1" : "w0";
    rg.device = "cpu";
    rg.pools = pools;
    rg.n_pools = 1;
    rg.pool_bytes = pool.pool_bytes;
    rg.hostname = "fuzz";
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION;
    m.registration = &rg;
    H.cur = w;
    worker_send(&m);
}

/* Worker W dies: its connection closes with whatever was sent to it. */
static void worker_die(int w)
{
    zmq_close(H.workers[w]);
    H.workers[w] = NULL;
    H.down[w] = true;
}

static void heartbeats(void)
{
    Baton__V1__Heartbeat hb = BATON__V1__HEARTBEAT__INIT;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_HEARTBEAT;
    m.heartbeat = &hb;
    for (H.cur = 0; H.cur < N_WORKERS; H.cur++)
        if (!H.down[H.cur])
            worker_send(&m);
}

/* Answers what the conductor sent worker W; returns how many messages. */
static size_t worker_pump(int w)
{
    size_t n = 0;
    H.cur = w;
    while (!H.down[w]) {
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
            /* As a worker under a service manager does: it exits and
             * comes back on a new connection. */
            H.down[w] = true;
            break;
        default: break; /* Peers, Release, Drop, SessionClose: nothing to answer */
        }
        baton__v1__conductor_message__free_unpacked(cm, NULL);
        zmq_msg_close(&msg);
    }
    return n;
}

/* One round of the conductor's loop, without waiting. */
static int step(void)
{
    int ran = conductor_step(H.c, 0);
    CHECK(ran >= 0);
    return ran;
}

/* Passes messages between the conductor and the fake workers until both
 * are quiet, registering again a worker that went down.  Inproc pipes
 * deliver a message as it is sent, so a round in which no side did
 * anything means nothing is left in flight. */
static void settle(void)
{
    for (int round = 0; round < 100000; round++) {
        size_t n = 0;
        for (int w = 0; w < N_WORKERS; w++) {
            n += worker_pump(w);
            if (H.down[w]) {
                worker_connect(w);
                n++;
            }
        }
        if (step() == 0 && n == 0)
            return;
    }
    fprintf(stderr, "fuzz_door: the conductor and the workers never went quiet\n");
    abort();
}

/* Writes the config where the conductor reads it (once, at creation). */
static void write_config(char *path, size_t len)
{
    const char *dir = getenv("TMPDIR");
    snprintf(path, len, "%s/fuzz_door-XXXXXX.yaml", dir && *dir ? dir : "/tmp");
    int fd = mkstemps(path, 5);
    CHECK(fd >= 0);
    CHECK(write(fd, CONFIG, sizeof(CONFIG) - 1) == (ssize_t)(sizeof(CONFIG) - 1));
    close(fd);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    bool verbose = getenv("BATON_FUZZ_VERBOSE") != NULL;
    /* Refusals are what the fuzzer makes most: quiet unless asked. */
    bt_log_set_level(verbose ? BT_LOG_DEBUG : (bt_log_level)(BT_LOG_ERROR - 1));
    H.zctx = zmq_ctx_new();
    CHECK(H.zctx);
    char path[4096];
    write_config(path, sizeof(path));
    conductor_options o = {path, H.zctx, "inproc://fuzz-door-front",
                           "inproc://fuzz-door-workers"};
    int rc = conductor_create_with(&o, &H.c);
    unlink(path);
    if (rc != 0) {
        fprintf(stderr, "fuzz_door: conductor_create_with: %d\n", rc);
        abort();
    }
    /* The config's log level was applied: quiet again. */
    bt_log_set_level(verbose ? BT_LOG_DEBUG : (bt_log_level)(BT_LOG_ERROR - 1));
    for (int i = 0; i < N_CLIENTS; i++) {
        void *s = zmq_socket(H.zctx, ZMQ_DEALER);
        CHECK(s);
        int zero = 0, one = 1;
        zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof(zero));
        /* With the conductor's 64, a pipe of 65 replies. */
        zmq_setsockopt(s, ZMQ_RCVHWM, &one, sizeof(one));
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
        CHECK(zmq_connect(s, "inproc://fuzz-door-front") == 0);
        H.clients[i] = s;
    }
    for (int w = 0; w < N_WORKERS; w++)
        H.down[w] = true;
    settle();
    conductor_counts n;
    conductor_counts_get(H.c, &n);
    if (!n.ready) {
        fprintf(stderr, "fuzz_door: the fake workers did not become ready\n");
        abort();
    }
    return 0;
}

/* ---- one input ---- */

/* What one client is owed back: per id, InferResponses; CancelResponses;
 * answers to Health, Stats and Inspect. */
typedef struct expect {
    char **ids;
    long *want;     /* responses owed per id */
    size_t n, cap;
    long cancels;
    long admin;
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

/* Client K sends one frame, which is owed what the door's rules say. */
static void send_frame(int k, expect *e, const uint8_t *p, size_t n)
{
    if (getenv("BATON_FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz_door: client %d sends %zu bytes\n", k, n);
    CHECK(zmq_send(H.clients[k], p, n, 0) == (int)n);
    if (n > MAX_MESSAGE_BYTES) {
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
        e->admin++;
        break;
    default:
        (*owed(e, ""))++;
        break;
    }
    baton__v1__client_message__free_unpacked(cm, NULL);
}

/* Every string field of M and of the messages in it is UTF-8, as proto3
 * requires of a string and as a client in another language checks. */
static void check_strings(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(const void *)(base + f->quantifier_offset) != f->id)
            continue;
        /* Both kinds are pointers: one in the struct, or an array of them. */
        size_t n = 1;
        void *const *items = (void *const *)(const void *)(base + f->offset);
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            n = *(const size_t *)(const void *)(base + f->quantifier_offset);
            items = *(void *const *const *)(const void *)(base + f->offset);
        }
        for (size_t k = 0; k < n; k++) {
            if (!items[k])
                continue;
            if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
                check_strings(items[k]);
            } else if (!bt_utf8_valid(items[k], strlen(items[k]))) {
                fprintf(stderr, "fuzz_door: %s.%s is not UTF-8\n", d->name, f->name);
                abort();
            }
        }
    }
}

/* Reads what waits on client K and checks it against E; returns how many
 * replies. */
static size_t read_client(int k, expect *e)
{
    size_t got = 0;
    for (;;) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, H.clients[k], ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            return got;
        }
        got++;
        Baton__V1__ServerMessage *sm =
            baton__v1__server_message__unpack(NULL, zmq_msg_size(&msg), zmq_msg_data(&msg));
        CHECK(sm);
        check_strings(&sm->base);
        switch (sm->msg_case) {
        case BATON__V1__SERVER_MESSAGE__MSG_RESPONSE: {
            long *w = owed(e, sm->response->request_id ? sm->response->request_id : "");
            if (*w <= 0) {
                fprintf(stderr, "fuzz_door: client %d got an InferResponse for '%s' that "
                        "nothing asked for (or a second one)\n", k, sm->response->request_id);
                abort();
            }
            (*w)--;
            if (getenv("BATON_FUZZ_VERBOSE"))
                fprintf(stderr, "fuzz_door: client %d '%s': %d %s (%zu outputs)\n", k,
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
        case BATON__V1__SERVER_MESSAGE__MSG_HEALTH:
        case BATON__V1__SERVER_MESSAGE__MSG_STATS:
        case BATON__V1__SERVER_MESSAGE__MSG_INSPECT:
            CHECK(e->admin > 0);
            e->admin--;
            break;
        default:
            fprintf(stderr, "fuzz_door: an answer the conductor does not send (%d)\n",
                    (int)sm->msg_case);
            abort();
        }
        baton__v1__server_message__free_unpacked(sm, NULL);
        zmq_msg_close(&msg);
    }
}

/* Reads every client until the conductor holds no reply back, then checks
 * that each client got what it was owed: all of it, or (where a client was
 * dropped) no more than it. */
static void collect(expect *e, uint64_t dropped_before)
{
    conductor_counts n;
    for (int round = 0;; round++) {
        CHECK(round < 100000);
        size_t got = 0;
        for (int k = 0; k < N_CLIENTS; k++)
            got += read_client(k, &e[k]);
        int ran = step();
        conductor_counts_get(H.c, &n);
        if (got == 0 && ran == 0 && n.backlog_bytes == 0)
            break;
    }
    bool dropped = n.clients_dropped != dropped_before;
    for (int k = 0; k < N_CLIENTS; k++) {
        for (size_t i = 0; i < e[k].n; i++)
            if (e[k].want[i] < 0 || (e[k].want[i] != 0 && !dropped)) {
                fprintf(stderr, "fuzz_door: client %d's request '%s' is owed %ld more "
                        "InferResponse(s)\n", k, e[k].ids[i], e[k].want[i]);
                abort();
            }
        CHECK(dropped || (e[k].cancels == 0 && e[k].admin == 0));
    }
}

/* The lengths that stand for commands instead of frames. */
#define CMD_CLIENT 0xfff0  /* ..0xfff2 */
#define CMD_DIE 0xfff8     /* ..0xfff9 */
#define CMD_SILENCE 0xfffa
#define CMD_SETTLE 0xfffb
#define CMD_TICK 0xfffe

/* Runs command CMD; false if it is none. */
static bool command(unsigned cmd, int *client)
{
    if (getenv("BATON_FUZZ_VERBOSE") && cmd >= CMD_CLIENT)
        fprintf(stderr, "fuzz_door: command %#x\n", cmd);
    if (cmd >= CMD_CLIENT && cmd < CMD_CLIENT + N_CLIENTS) {
        *client = (int)(cmd - CMD_CLIENT);
        return true;
    }
    if (cmd >= CMD_DIE && cmd < CMD_DIE + N_WORKERS) {
        step();
        if (!H.down[cmd - CMD_DIE])
            worker_die((int)(cmd - CMD_DIE));
        return true;
    }
    if (cmd == CMD_SETTLE) {
        settle();
        return true;
    }
    if (cmd == CMD_TICK || cmd == CMD_SILENCE) {
        heartbeats();
        step();
        conductor_tick_at(H.c, bt_now_ms() + (cmd == CMD_TICK ? 2500 : 1000000000ull));
        if (cmd == CMD_SILENCE)
            for (int w = 0; w < N_WORKERS; w++)
                if (!H.down[w])
                    worker_die(w);
        return true;
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    expect e[N_CLIENTS];
    memset(e, 0, sizeof(e));
    conductor_counts before, n;
    conductor_counts_get(H.c, &before);
    size_t at = 0, frames = 0, commands = 0;
    int client = 0;
    heartbeats();
    /* The frontend reads up to 256 frames per call: stay under that. */
    while (at < size && frames < 64 && commands < 16) {
        size_t len = size - at;
        const uint8_t *p = data + at;
        if (len >= 2 && command((unsigned)(data[at] | data[at + 1] << 8), &client)) {
            at += 2;
            commands++;
            continue;
        }
        if (len >= 2 && (size_t)(data[at] | data[at + 1] << 8) <= len - 2) {
            len = (size_t)(data[at] | data[at + 1] << 8);
            p = data + at + 2;
            at += 2 + len;
        } else {
            at = size;
        }
        send_frame(client, &e[client], p, len);
        frames++;
    }
    settle();
    if (getenv("BATON_FUZZ_VERBOSE")) {
        conductor_counts_get(H.c, &n);
        fprintf(stderr, "fuzz_door: settled: %zu requests in flight, %llu reply bytes held, "
                "%llu clients dropped\n", n.inflight, (unsigned long long)n.backlog_bytes,
                (unsigned long long)(n.clients_dropped - before.clients_dropped));
    }
    collect(e, before.clients_dropped);
    conductor_counts_get(H.c, &n);
    char why[256];
    if (conductor_check_clients(H.c, why, sizeof(why)) != 0) {
        fprintf(stderr, "fuzz_door: the client table: %s\n", why);
        abort();
    }
    CHECK(n.ready);
    CHECK(n.inflight == 0);
    CHECK(n.placing == 0);
    CHECK(n.tensors_held == 0);
    CHECK(n.tensors == 0);
    CHECK(n.backlog_bytes == 0);
    CHECK(n.clients <= N_CLIENTS);
    for (int k = 0; k < N_CLIENTS; k++) {
        for (size_t i = 0; i < e[k].n; i++)
            free(e[k].ids[i]);
        free(e[k].ids);
        free(e[k].want);
    }
    return 0;
}
