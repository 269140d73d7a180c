/* Dispatch round trip: a one-node request through batond and one CPU
 * worker, against a floor built from the same libraries in this program.
 *
 * The floor is the least any conductor/worker split over ZeroMQ can cost:
 *
 *   client DEALER ──▶ "conductor" ROUTER ──▶ "worker" DEALER
 *                     (parses the ClientMessage,    (parses the
 *                      packs a Dispatch)             Dispatch, packs a Done)
 *   client ◀────────── conductor ◀────────────────── worker
 *                     (parses the Done, packs the InferResponse)
 *
 * with the conductor and the worker in processes of their own, as batond
 * and baton-worker are, the same ipc:// transport, the same protobuf-c
 * messages, and the same client (the C client library) on top; what it
 * lacks is everything baton adds: the graph runtime, placing the input in a
 * pool, the worker's executor and its threads, releases and sessions.
 *
 * Measured (each three times, runs of baton and the floor interleaved, the
 * median of the three reported): (a) sequential latency over N requests sent
 * one at a time; (b) throughput with K requests kept in flight on one
 * DEALER.  A third row, baton's `tick` graph (a node with no client input,
 * so nothing to place), splits baton's cost into its parts, and the
 * per-request timings the daemon returns (total_us, queue_us, exec_us) say
 * where the rest goes.  See README.md. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "baton/client.h"
#include "proto/baton.pb-c.h"
#include "tests/bench/bench_util.h"

#define SEQ_N 2000        /* sequential requests per run */
#define SEQ_WARMUP 200    /* unmeasured requests before each run */
#define PIPE_K 32         /* requests in flight in the pipelined runs */
#define PIPE_SECONDS 3.0  /* measured window of a pipelined run */
#define PIPE_WARMUP 0.5   /* seconds of load before the window opens */
#define RUNS 3            /* repetitions; the median is reported */
#define FLOOR_SLOTS 1024  /* in-flight requests the floor conductor can hold */

/* Process roles whose CPU time is accounted. */
enum { ROLE_CLIENT, ROLE_CONDUCTOR, ROLE_WORKER, ROLES };
static const char *const ROLE_NAMES[ROLES] = {"client", "conductor", "worker"};

/* ======================================================================== */
/* The floor: a forwarding conductor and a replying worker                  */
/* ======================================================================== */

typedef struct floor_args {
    char front[300]; /* client endpoint (the conductor's ROUTER binds it) */
    char back[300];  /* worker endpoint (the conductor's ROUTER binds it) */
} floor_args;

static void *floor_socket(void *ctx, int type)
{
    void *s = zmq_socket(ctx, type);
    int zero = 0;
    if (s) {
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof(zero));
        zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof(zero));
    }
    return s;
}

/* Packs M with PACK/SIZE into a buffer and sends it after the optional
 * routing frame ID. */
static int send_packed(void *sock, const void *id, size_t idlen, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t stackbuf[1024];
    uint8_t *buf = n <= sizeof(stackbuf) ? stackbuf : malloc(n);
    if (!buf)
        return -1;
    protobuf_c_message_pack(m, buf);
    int rc = 0;
    if (id && zmq_send(sock, id, idlen, ZMQ_SNDMORE) < 0)
        rc = -1;
    if (rc == 0 && zmq_send(sock, buf, n, 0) < 0)
        rc = -1;
    if (buf != stackbuf)
        free(buf);
    return rc;
}

/* Receives a ROUTER message: identity into ID, payload into PART.  Returns
 * 0, or -1 when nothing is waiting. */
static int recv_routed(void *sock, zmq_msg_t *id, zmq_msg_t *part)
{
    zmq_msg_init(id);
    if (zmq_msg_recv(id, sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(id);
        return -1;
    }
    /* The payload is the last frame. */
    zmq_msg_init(part);
    for (int more = zmq_msg_more(id); more; more = zmq_msg_more(part)) {
        zmq_msg_close(part);
        zmq_msg_init(part);
        if (zmq_msg_recv(part, sock, 0) < 0)
            break;
    }
    return 0;
}

/* The worker: parse each Dispatch, answer a Done whose output is the input
 * (with its bytes inline, as a client-bound output of baton's is). */
static int floor_worker_main(void *arg)
{
    const floor_args *a = arg;
    void *ctx = zmq_ctx_new();
    void *s = floor_socket(ctx, ZMQ_DEALER);
    if (!s || zmq_setsockopt(s, ZMQ_ROUTING_ID, "w0", 2) != 0 || zmq_connect(s, a->back) != 0)
        return 1;
    Baton__V1__Register reg = BATON__V1__REGISTER__INIT;
    reg.worker = "w0";
    reg.device = "cpu";
    reg.pid = (uint32_t)getpid();
    Baton__V1__WorkerMessage hello = BATON__V1__WORKER_MESSAGE__INIT;
    hello.msg_case = BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION;
    hello.registration = &reg;
    if (send_packed(s, NULL, 0, &hello.base) != 0)
        return 1;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s, 0) < 0) {
            zmq_msg_close(&m);
            if (zmq_errno() == EINTR)
                continue;
            return 1;
        }
        uint64_t t0 = bench_now_ns();
        Baton__V1__ConductorMessage *cm =
            baton__v1__conductor_message__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
        zmq_msg_close(&m);
        if (!cm)
            continue;
        if (cm->msg_case == BATON__V1__CONDUCTOR_MESSAGE__MSG_DISPATCH) {
            const Baton__V1__Dispatch *d = cm->dispatch;
            Baton__V1__NamedRef out = BATON__V1__NAMED_REF__INIT;
            Baton__V1__NamedRef *outs[1] = {&out};
            Baton__V1__Status st = BATON__V1__STATUS__INIT;
            Baton__V1__Done done = BATON__V1__DONE__INIT;
            done.request_key = d->request_key;
            done.node = d->node;
            done.graph = d->graph;
            done.dispatch_id = d->dispatch_id;
            done.status = &st;
            done.batch_size = 1;
            if (d->n_inputs && d->inputs[0]->n_parts && d->inputs[0]->parts[0]->n_chunks &&
                d->n_outputs) {
                out.name = d->outputs[0]->name;
                out.ref = d->inputs[0]->parts[0]->chunks[0]; /* echo: the input, inline */
                done.n_outputs = 1;
                done.outputs = outs;
            } else {
                st.code = BATON__V1__CODE__INVALID_ARGUMENT;
                st.message = "floor worker: a dispatch without input or output";
            }
            done.exec_us = (bench_now_ns() - t0) / 1000u;
            Baton__V1__WorkerMessage wm = BATON__V1__WORKER_MESSAGE__INIT;
            wm.msg_case = BATON__V1__WORKER_MESSAGE__MSG_DONE;
            wm.done = &done;
            send_packed(s, NULL, 0, &wm.base);
        }
        baton__v1__conductor_message__free_unpacked(cm, NULL);
    }
}

typedef struct floor_pending {
    bool used;
    uint8_t id[256];   /* client routing identity */
    size_t idlen;
    char *request_id;  /* owned */
    uint64_t start_ns; /* acceptance, for total_us */
} floor_pending;

static void floor_answer(void *front, const uint8_t *id, size_t idlen, const char *rid,
                         Baton__V1__Code code, const char *message)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = code;
    st.message = (char *)message;
    Baton__V1__InferResponse r = BATON__V1__INFER_RESPONSE__INIT;
    r.request_id = (char *)rid;
    r.status = &st;
    Baton__V1__ServerMessage sm = BATON__V1__SERVER_MESSAGE__INIT;
    sm.msg_case = BATON__V1__SERVER_MESSAGE__MSG_RESPONSE;
    sm.response = &r;
    send_packed(front, id, idlen, &sm.base);
}

/* One client frame: a health probe is answered here, an infer becomes a
 * Dispatch carrying the input inline (there is no pool to place it in). */
static void floor_on_client(void *front, void *back, floor_pending *slots, uint64_t *next_key,
                            bool worker_up, const uint8_t *id, size_t idlen, const void *data,
                            size_t len)
{
    Baton__V1__ClientMessage *cm = baton__v1__client_message__unpack(NULL, len, data);
    if (!cm) {
        floor_answer(front, id, idlen, "", BATON__V1__CODE__INVALID_ARGUMENT, "does not parse");
        return;
    }
    if (cm->msg_case == BATON__V1__CLIENT_MESSAGE__MSG_HEALTH) {
        Baton__V1__HealthResponse h = BATON__V1__HEALTH_RESPONSE__INIT;
        h.live = true;
        h.ready = worker_up;
        Baton__V1__ServerMessage sm = BATON__V1__SERVER_MESSAGE__INIT;
        sm.msg_case = BATON__V1__SERVER_MESSAGE__MSG_HEALTH;
        sm.health = &h;
        send_packed(front, id, idlen, &sm.base);
    } else if (cm->msg_case == BATON__V1__CLIENT_MESSAGE__MSG_INFER) {
        const Baton__V1__InferRequest *q = cm->infer;
        uint64_t key = ++*next_key;
        floor_pending *p = &slots[key % FLOOR_SLOTS];
        if (!worker_up || p->used || q->n_inputs != 1 || idlen > sizeof(p->id)) {
            floor_answer(front, id, idlen, q->request_id, BATON__V1__CODE__UNAVAILABLE,
                         "floor: no worker, too many in flight, or not one input");
        } else {
            p->used = true;
            memcpy(p->id, id, idlen);
            p->idlen = idlen;
            p->request_id = strdup(q->request_id);
            p->start_ns = bench_now_ns();
            const Baton__V1__Tensor *in = q->inputs[0];
            Baton__V1__TensorRef ref = BATON__V1__TENSOR_REF__INIT;
            Baton__V1__TensorRef *chunks[1] = {&ref};
            ref.nbytes = in->data.len;
            ref.dtype = in->dtype;
            ref.n_dims = in->n_dims;
            ref.dims = in->dims;
            ref.id = key;
            ref.data = in->data;
            Baton__V1__TensorPart part = BATON__V1__TENSOR_PART__INIT;
            Baton__V1__TensorPart *parts[1] = {&part};
            part.n_chunks = 1;
            part.chunks = chunks;
            part.transfer = BATON__V1__TRANSFER_KIND__TRANSFER_KIND_LOCAL;
            Baton__V1__InputValue iv = BATON__V1__INPUT_VALUE__INIT;
            Baton__V1__InputValue *ivs[1] = {&iv};
            iv.name = in->name;
            iv.n_parts = 1;
            iv.parts = parts;
            iv.final = true;
            Baton__V1__OutputSpec os = BATON__V1__OUTPUT_SPEC__INIT;
            Baton__V1__OutputSpec *oss[1] = {&os};
            os.name = in->name;
            os.client = true;
            Baton__V1__Dispatch d = BATON__V1__DISPATCH__INIT;
            d.request_key = key;
            d.request_id = q->request_id;
            d.node_name = "e";
            d.model = "echo0";
            d.mode = "";
            d.n_inputs = 1;
            d.inputs = ivs;
            d.n_outputs = 1;
            d.outputs = oss;
            d.dispatch_id = key;
            d.remaining_ms = 20000;
            Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
            m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_DISPATCH;
            m.dispatch = &d;
            send_packed(back, "w0", 2, &m.base);
        }
    }
    baton__v1__client_message__free_unpacked(cm, NULL);
}

/* One worker frame: the hello marks the worker up; a Done becomes the
 * request's InferResponse with the output bytes and the node's timing. */
static void floor_on_worker(void *front, floor_pending *slots, bool *worker_up, const void *data,
                            size_t len)
{
    Baton__V1__WorkerMessage *wm = baton__v1__worker_message__unpack(NULL, len, data);
    if (!wm)
        return;
    if (wm->msg_case == BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION) {
        *worker_up = true;
    } else if (wm->msg_case == BATON__V1__WORKER_MESSAGE__MSG_DONE) {
        const Baton__V1__Done *d = wm->done;
        floor_pending *p = &slots[d->request_key % FLOOR_SLOTS];
        if (p->used) {
            Baton__V1__Tensor outs[1];
            Baton__V1__Tensor *outp[1] = {&outs[0]};
            Baton__V1__InferResponse r = BATON__V1__INFER_RESPONSE__INIT;
            Baton__V1__Status st = BATON__V1__STATUS__INIT;
            if (d->status)
                st = *d->status;
            for (size_t i = 0; i < d->n_outputs && i < 1; i++) {
                const Baton__V1__TensorRef *ref = d->outputs[i]->ref;
                baton__v1__tensor__init(&outs[i]);
                outs[i].name = d->outputs[i]->name;
                outs[i].dtype = ref->dtype;
                outs[i].n_dims = ref->n_dims;
                outs[i].dims = ref->dims;
                outs[i].data = ref->data;
                outs[i].modality = "tensor";
                r.n_outputs = 1;
                r.outputs = outp;
            }
            Baton__V1__NodeTiming tm = BATON__V1__NODE_TIMING__INIT;
            Baton__V1__NodeTiming *tms[1] = {&tm};
            tm.node = "e";
            tm.worker = "w0";
            tm.queue_us = d->queue_us;
            tm.exec_us = d->exec_us;
            r.request_id = p->request_id;
            r.status = &st;
            r.n_timings = 1;
            r.timings = tms;
            r.total_us = (bench_now_ns() - p->start_ns) / 1000u;
            Baton__V1__ServerMessage sm = BATON__V1__SERVER_MESSAGE__INIT;
            sm.msg_case = BATON__V1__SERVER_MESSAGE__MSG_RESPONSE;
            sm.response = &r;
            send_packed(front, p->id, p->idlen, &sm.base);
            free(p->request_id);
            p->request_id = NULL;
            p->used = false;
        }
    }
    baton__v1__worker_message__free_unpacked(wm, NULL);
}

/* The conductor: one thread, one zmq_poll over the two ROUTERs, as batond's
 * loop is; each readable socket is drained before polling again. */
static int floor_conductor_main(void *arg)
{
    const floor_args *a = arg;
    void *ctx = zmq_ctx_new();
    void *front = floor_socket(ctx, ZMQ_ROUTER);
    void *back = floor_socket(ctx, ZMQ_ROUTER);
    if (!front || !back || zmq_bind(front, a->front) != 0 || zmq_bind(back, a->back) != 0)
        return 1;
    floor_pending *slots = calloc(FLOOR_SLOTS, sizeof(*slots));
    if (!slots)
        return 1;
    uint64_t next_key = 0;
    bool worker_up = false;
    for (;;) {
        zmq_pollitem_t items[2] = {{front, 0, ZMQ_POLLIN, 0}, {back, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, 2, -1) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            return 1;
        }
        zmq_msg_t id, part;
        if (items[0].revents & ZMQ_POLLIN)
            while (recv_routed(front, &id, &part) == 0) {
                floor_on_client(front, back, slots, &next_key, worker_up, zmq_msg_data(&id),
                                zmq_msg_size(&id), zmq_msg_data(&part), zmq_msg_size(&part));
                zmq_msg_close(&part);
                zmq_msg_close(&id);
            }
        if (items[1].revents & ZMQ_POLLIN)
            while (recv_routed(back, &id, &part) == 0) {
                floor_on_worker(front, slots, &worker_up, zmq_msg_data(&part),
                                zmq_msg_size(&part));
                zmq_msg_close(&part);
                zmq_msg_close(&id);
            }
    }
}

/* ======================================================================== */
/* The client side: the same code drives baton and the floor                */
/* ======================================================================== */

typedef struct target {
    const char *label;     /* row name in the table */
    const char *key;       /* JSON key */
    const char *graph;     /* graph the request names */
    bool input;            /* sends the 16-byte I32 input x (and expects it back) */
    char endpoint[320];
    baton_client *client;
    /* Per run: */
    double p50[RUNS], p99[RUNS], mean[RUNS], rps[RUNS];
    double client_us[RUNS]; /* median of (client latency - server total_us) */
    double server_us[RUNS]; /* median of (total_us - worker queue - worker exec) */
    double queue_us[RUNS];  /* median worker queue_us */
    double exec_us[RUNS];   /* median worker exec_us */
    /* Where the CPU goes: processes by role, and per run the CPU time and
     * context switches per request of each role (sequential, pipelined). */
    pid_t pids[ROLES][8];
    size_t n_pids[ROLES];
    double seq_cpu[ROLES][RUNS], pipe_cpu[ROLES][RUNS]; /* us per request */
    double seq_cs[ROLES][RUNS], pipe_cs[ROLES][RUNS];   /* switches per request */
} target;

/* Sums the CPU counters of T's processes, per role. */
static void cpu_sample(const target *t, bench_cpu out[ROLES])
{
    for (int k = 0; k < ROLES; k++) {
        out[k] = (bench_cpu){0, 0};
        for (size_t i = 0; i < t->n_pids[k]; i++) {
            bench_cpu c;
            bench_cpu_read(t->pids[k][i], &c);
            out[k].cpu_ns += c.cpu_ns;
            out[k].ctxsw += c.ctxsw;
        }
    }
}

/* Per-request CPU us and switches of each role between samples A and B. */
static void cpu_delta(const bench_cpu a[ROLES], const bench_cpu b[ROLES], long n,
                      double cpu[ROLES][RUNS], double cs[ROLES][RUNS], int r)
{
    for (int k = 0; k < ROLES; k++) {
        cpu[k][r] = n > 0 ? (double)(b[k].cpu_ns - a[k].cpu_ns) / 1e3 / (double)n : 0;
        cs[k][r] = n > 0 ? (double)(b[k].ctxsw - a[k].ctxsw) / (double)n : 0;
    }
}

static const int32_t INPUT[4] = {7, -1, 1 << 20, 42};

static int make_request(const target *t, const char *rid, baton_client_request **out)
{
    baton_client_request *r = NULL;
    int rc = baton_client_request_create(t->graph, rid, &r);
    if (rc == 0 && t->input) {
        int64_t dims[1] = {4};
        rc = baton_client_request_add_input(r, "x", BATON_CLIENT_DTYPE_I32, dims, 1, INPUT,
                                            sizeof(INPUT));
    }
    if (rc != 0) {
        baton_client_request_destroy(r);
        return rc;
    }
    *out = r;
    return 0;
}

/* Checks a response: OK and, with an input, that very input back. */
static int check_response(const target *t, const baton_client_event *ev)
{
    if (ev->code != BATON_CLIENT_CODE_OK) {
        fprintf(stderr, "%s: request %s ended %s: %s\n", t->label, ev->request_id,
                baton_client_code_name((int)ev->code), ev->message);
        return -1;
    }
    if (ev->n_outputs != 1) {
        fprintf(stderr, "%s: %zu outputs, expected 1\n", t->label, ev->n_outputs);
        return -1;
    }
    const baton_client_tensor *o = &ev->outputs[0];
    if (t->input ? (o->nbytes != sizeof(INPUT) || memcmp(o->data, INPUT, sizeof(INPUT)) != 0)
                 : (o->nbytes != 4 || o->dtype != BATON_CLIENT_DTYPE_I32)) {
        fprintf(stderr, "%s: wrong output (%zu bytes)\n", t->label, o->nbytes);
        return -1;
    }
    return 0;
}

/* Waits for the response of one request (no chunks are expected). */
static int recv_response(target *t, baton_client_event **out)
{
    for (;;) {
        baton_client_event *ev = NULL;
        int rc = baton_client_recv(t->client, 20000, &ev);
        if (rc == BATON_CLIENT_EINTR)
            continue;
        if (rc != 0) {
            fprintf(stderr, "%s: recv: %s\n", t->label, baton_client_strerror(rc));
            return -1;
        }
        if (ev->kind == BATON_CLIENT_EVENT_RESPONSE) {
            *out = ev;
            return 0;
        }
        baton_client_event_free(ev);
    }
}

/* (a) N requests one at a time; fills run R's latency statistics. */
static int run_sequential(target *t, int n, int warmup, int r)
{
    baton_client_request *req = NULL;
    if (make_request(t, "seq", &req) != 0)
        return -1;
    double *lat = malloc(sizeof(double) * (size_t)n * 5);
    if (!lat) {
        baton_client_request_destroy(req);
        return -1;
    }
    double *cli = lat + n, *srv = lat + 2 * n, *que = lat + 3 * n, *exe = lat + 4 * n;
    int rc = 0;
    bench_cpu c0[ROLES], c1[ROLES];
    for (int i = -warmup; i < n && rc == 0; i++) {
        baton_client_event *ev = NULL;
        if (i == 0)
            cpu_sample(t, c0);
        double t0 = bench_now_us();
        if (baton_client_send(t->client, req) != 0 || recv_response(t, &ev) != 0) {
            rc = -1;
            break;
        }
        double dt = bench_now_us() - t0;
        rc = check_response(t, ev);
        if (i >= 0) {
            double q = 0, e = 0;
            for (size_t k = 0; k < ev->n_timings; k++) {
                q += (double)ev->timings[k].queue_us;
                e += (double)ev->timings[k].exec_us;
            }
            lat[i] = dt;
            cli[i] = dt - (double)ev->total_us;
            srv[i] = (double)ev->total_us - q - e;
            que[i] = q;
            exe[i] = e;
        }
        baton_client_event_free(ev);
    }
    if (rc == 0) {
        cpu_sample(t, c1);
        cpu_delta(c0, c1, n, t->seq_cpu, t->seq_cs, r);
        t->mean[r] = bench_mean(lat, (size_t)n);
        bench_sort(lat, (size_t)n);
        t->p50[r] = bench_quantile(lat, (size_t)n, 0.5);
        t->p99[r] = bench_quantile(lat, (size_t)n, 0.99);
        t->client_us[r] = bench_median(cli, (size_t)n);
        t->server_us[r] = bench_median(srv, (size_t)n);
        t->queue_us[r] = bench_median(que, (size_t)n);
        t->exec_us[r] = bench_median(exe, (size_t)n);
    }
    free(lat);
    baton_client_request_destroy(req);
    return rc;
}

/* (b) K requests kept in flight on one DEALER: each response is answered
 * by sending its request again.  Completions are counted over SECONDS after
 * WARMUP seconds of the same load; then the pipe is drained. */
static int run_pipelined(target *t, int k, double seconds, double warmup, int r)
{
    baton_client_request *reqs[PIPE_K] = {0};
    int rc = 0;
    for (int i = 0; i < k && rc == 0; i++) {
        char rid[16];
        snprintf(rid, sizeof(rid), "p%d", i);
        rc = make_request(t, rid, &reqs[i]);
    }
    for (int i = 0; i < k && rc == 0; i++)
        rc = baton_client_send(t->client, reqs[i]);
    int in_flight = rc == 0 ? k : 0;
    double start = bench_now_us();
    double open = start + warmup * 1e6, close = open + seconds * 1e6;
    double first = 0, last = 0;
    long counted = 0;
    bench_cpu c0[ROLES], c1[ROLES];
    bool last_sampled = false;
    while (in_flight > 0) {
        baton_client_event *ev = NULL;
        if (recv_response(t, &ev) != 0) {
            rc = -1;
            break;
        }
        in_flight--;
        double now = bench_now_us();
        if (check_response(t, ev) != 0)
            rc = -1;
        int slot = ev->request_id[0] == 'p' ? atoi(ev->request_id + 1) : -1;
        baton_client_event_free(ev);
        if (now >= open && now < close) {
            if (!counted) {
                first = now;
                cpu_sample(t, c0);
            }
            counted++;
            last = now;
        } else if (now >= close && counted && !last_sampled) {
            cpu_sample(t, c1);
            last_sampled = true;
        }
        if (rc == 0 && now < close && slot >= 0 && slot < k) {
            if (baton_client_send(t->client, reqs[slot]) != 0)
                rc = -1;
            else
                in_flight++;
        }
    }
    for (int i = 0; i < k; i++)
        baton_client_request_destroy(reqs[i]);
    /* Completions per second between the first and last counted one. */
    t->rps[r] = counted > 1 && last > first ? (double)(counted - 1) / ((last - first) / 1e6) : 0;
    /* CPU from the first counted completion to the first after the window:
     * COUNTED completions apart. */
    if (last_sampled)
        cpu_delta(c0, c1, counted, t->pipe_cpu, t->pipe_cs, r);
    return rc;
}

static double med(const double *v)
{
    return bench_median(v, RUNS);
}

static const char *verdict(bool met)
{
    return met ? "met" : "MISSED";
}

static void json_runs(FILE *f, const char *name, const double *v, int runs)
{
    fprintf(f, "\"%s\": [", name);
    for (int i = 0; i < runs; i++)
        fprintf(f, "%s%.1f", i ? ", " : "", v[i]);
    fprintf(f, "]");
}

int main(int argc, char **argv)
{
    bench_opts o;
    bench_opts_parse(&o, "roundtrip", argc, argv);
    int seq_n = o.quick ? 300 : SEQ_N;
    double pipe_s = o.quick ? 0.5 : PIPE_SECONDS;
    int runs = RUNS;

    /* The floor's processes are forked before any ZeroMQ context exists
     * here (forking a process that holds one is undefined). */
    char fdir[256];
    if (bench_mkdtemp(fdir, sizeof(fdir)) != 0)
        return 1;
    floor_args fa;
    snprintf(fa.front, sizeof(fa.front), "ipc://%s/floor.sock", fdir);
    snprintf(fa.back, sizeof(fa.back), "ipc://%s/floor-workers.sock", fdir);
    pid_t fcond = bench_spawn(floor_conductor_main, &fa);
    pid_t fwork = bench_spawn(floor_worker_main, &fa);
    bench_daemon d;
    int rc = 1;
    if (fcond < 0 || fwork < 0 || bench_daemon_start(&d, &o, "roundtrip.yaml", NULL) != 0) {
        bench_reap(fcond);
        bench_reap(fwork);
        bench_rmtree(fdir);
        return 1;
    }

    target tg[3] = {
        {.label = "baton (echo, 16 B input)", .key = "baton", .graph = "echo", .input = true},
        {.label = "floor (ZeroMQ + protobuf-c)", .key = "floor", .graph = "echo", .input = true},
        {.label = "baton (tick, no input)", .key = "baton_no_input", .graph = "tick",
         .input = false},
    };
    snprintf(tg[0].endpoint, sizeof(tg[0].endpoint), "%s", d.endpoint);
    snprintf(tg[1].endpoint, sizeof(tg[1].endpoint), "%s", fa.front);
    snprintf(tg[2].endpoint, sizeof(tg[2].endpoint), "%s", d.endpoint);
    if (bench_wait_ready(fa.front, 10000) != 0) {
        fprintf(stderr, "roundtrip: the floor did not come up\n");
        goto out;
    }
    for (int i = 0; i < 3; i++) {
        if (baton_client_create(tg[i].endpoint, &tg[i].client) != 0)
            goto out;
        tg[i].pids[ROLE_CLIENT][0] = getpid();
        tg[i].n_pids[ROLE_CLIENT] = 1;
        tg[i].pids[ROLE_CONDUCTOR][0] = i == 1 ? fcond : d.pid;
        tg[i].n_pids[ROLE_CONDUCTOR] = 1;
        if (i == 1) {
            tg[i].pids[ROLE_WORKER][0] = fwork;
            tg[i].n_pids[ROLE_WORKER] = 1;
        } else {
            tg[i].n_pids[ROLE_WORKER] = bench_children(d.pid, tg[i].pids[ROLE_WORKER], 8);
        }
    }

    fprintf(stderr, "roundtrip: sequential, %d x %d requests per target...\n", runs, seq_n);
    for (int r = 0; r < runs; r++)
        for (int i = 0; i < 3; i++)
            if (run_sequential(&tg[i], seq_n, SEQ_WARMUP, r) != 0)
                goto out;
    fprintf(stderr, "roundtrip: pipelined, K=%d, %d x %.1f s per target...\n", PIPE_K, runs,
            pipe_s);
    for (int r = 0; r < runs; r++)
        for (int i = 0; i < 3; i++)
            if (run_pipelined(&tg[i], PIPE_K, pipe_s, PIPE_WARMUP, r) != 0)
                goto out;

    char machine[512];
    bench_machine_line(machine, sizeof(machine));
    double p50_ratio = med(tg[0].p50) / med(tg[1].p50);
    double rps_ratio = med(tg[0].rps) / med(tg[1].rps);
    printf("\n== Dispatch round trip (%s)\n", machine);
    printf("one node (echo) on one CPU worker, 16-byte I32 input; sequential: %d requests x %d "
           "runs;\npipelined: K=%d in flight on one DEALER, %.1f s x %d runs; medians of the runs\n\n",
           seq_n, runs, PIPE_K, pipe_s, runs);
    printf("%-30s %9s %9s %9s %11s\n", "", "p50 us", "p99 us", "mean us", "req/s (K=32)");
    for (int i = 0; i < 3; i++)
        printf("%-30s %9.1f %9.1f %9.1f %11.0f\n", tg[i].label, med(tg[i].p50), med(tg[i].p99),
               med(tg[i].mean), med(tg[i].rps));
    printf("\nbaton / floor: p50 %.2fx (target <= 1.3x: %s), throughput %.2fx (target >= 0.6x: "
           "%s)\n",
           p50_ratio, verdict(p50_ratio <= 1.3), rps_ratio, verdict(rps_ratio >= 0.6));
    printf("\nwhere a sequential request's time goes (medians, us):\n");
    printf("%-30s %12s %14s %9s %9s\n", "", "client side", "conductor +", "worker", "worker");
    printf("%-30s %12s %14s %9s %9s\n", "", "+ front hop", "worker hops", "queue", "exec");
    for (int i = 0; i < 3; i++)
        printf("%-30s %12.1f %14.1f %9.1f %9.1f\n", tg[i].label, med(tg[i].client_us),
               med(tg[i].server_us), med(tg[i].queue_us), med(tg[i].exec_us));
    printf("(client side = latency seen by the client - the server's total_us; conductor + "
           "worker hops =\n total_us - the worker's queue_us - exec_us: the conductor's work and "
           "every conductor<->worker message)\n");
    printf("placing the input (Put/Placed round trip): baton echo p50 - baton tick p50 = %.1f us\n",
           med(tg[0].p50) - med(tg[2].p50));
    printf("\nCPU time per request, us (all threads of each process, from /proc schedstat; "
           "medians):\n");
    printf("%-30s %29s   %29s\n", "", "-------- sequential --------",
           "------ pipelined K=32 ------");
    printf("%-30s %7s %7s %7s %6s   %7s %7s %7s %6s\n", "", "client", "conduct", "worker",
           "ctxsw", "client", "conduct", "worker", "ctxsw");
    for (int i = 0; i < 3; i++) {
        printf("%-30s", tg[i].label);
        for (int ph = 0; ph < 2; ph++) {
            double cs = 0;
            for (int k = 0; k < ROLES; k++) {
                printf(" %7.1f", med(ph ? tg[i].pipe_cpu[k] : tg[i].seq_cpu[k]));
                cs += med(ph ? tg[i].pipe_cs[k] : tg[i].seq_cs[k]);
            }
            printf(" %6.1f%s", cs, ph ? "" : "  ");
        }
        printf("\n");
    }
    printf("(ctxsw: context switches per request, all three processes; 2 CPUs: the pipelined "
           "ceiling is\n about 2 s of CPU per second / the CPU per request)\n");

    FILE *f = bench_json_open(&o);
    if (f) {
        fprintf(f, "{\n  \"benchmark\": \"roundtrip\",\n  ");
        bench_json_machine(f);
        fprintf(f, ",\n  \"params\": {\"sequential_n\": %d, \"warmup\": %d, \"pipeline_k\": %d, "
                "\"pipeline_seconds\": %.1f, \"runs\": %d, \"input_bytes\": %zu},\n",
                seq_n, SEQ_WARMUP, PIPE_K, pipe_s, runs, sizeof(INPUT));
        fprintf(f, "  \"targets\": {\n");
        for (int i = 0; i < 3; i++) {
            target *t = &tg[i];
            fprintf(f, "    \"%s\": {\"graph\": \"%s\", \"p50_us\": %.1f, \"p99_us\": %.1f, "
                    "\"mean_us\": %.1f, \"rps\": %.0f,\n      \"breakdown_us\": {\"client_side\": "
                    "%.1f, \"conductor_and_worker_hops\": %.1f, \"worker_queue\": %.1f, "
                    "\"worker_exec\": %.1f},\n      \"runs\": {",
                    t->key, t->graph, med(t->p50), med(t->p99), med(t->mean), med(t->rps),
                    med(t->client_us), med(t->server_us), med(t->queue_us), med(t->exec_us));
            json_runs(f, "p50_us", t->p50, runs);
            fprintf(f, ", ");
            json_runs(f, "p99_us", t->p99, runs);
            fprintf(f, ", ");
            json_runs(f, "rps", t->rps, runs);
            fprintf(f, "},\n      \"cpu_us_per_request\": {");
            for (int ph = 0; ph < 2; ph++) {
                fprintf(f, "%s\"%s\": {", ph ? ", " : "", ph ? "pipelined" : "sequential");
                for (int k = 0; k < ROLES; k++)
                    fprintf(f, "\"%s\": %.1f, ", ROLE_NAMES[k],
                            med(ph ? t->pipe_cpu[k] : t->seq_cpu[k]));
                double cs = 0;
                for (int k = 0; k < ROLES; k++)
                    cs += med(ph ? t->pipe_cs[k] : t->seq_cs[k]);
                fprintf(f, "\"context_switches\": %.2f}", cs);
            }
            fprintf(f, "}}%s\n", i < 2 ? "," : "");
        }
        fprintf(f, "  },\n  \"ratios\": {\"p50_baton_over_floor\": %.3f, "
                "\"rps_baton_over_floor\": %.3f},\n",
                p50_ratio, rps_ratio);
        fprintf(f, "  \"goals\": {\"p50_ratio_max\": 1.3, \"p50_met\": %s, \"rps_ratio_min\": 0.6, "
                "\"rps_met\": %s}\n}\n",
                p50_ratio <= 1.3 ? "true" : "false", rps_ratio >= 0.6 ? "true" : "false");
        fclose(f);
        printf("wrote %s\n", o.json);
    }
    rc = 0;
out:
    for (int i = 0; i < 3; i++)
        baton_client_destroy(tg[i].client);
    bench_daemon_stop(&d);
    bench_reap(fcond);
    bench_reap(fwork);
    bench_rmtree(fdir);
    return rc;
}
