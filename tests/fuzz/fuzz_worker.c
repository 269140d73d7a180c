/* libFuzzer target: conductor frames at the worker.
 *
 * Each input gets a fresh worker (wk_worker_create: its pool segment, one
 * compute lane, its DEALER connected to a ROUTER this harness holds), with
 * the test backends loaded through Load frames (echo, counter, chunks, add,
 * fail).  The input is a sequence of frames, each a 16-bit little-endian
 * length and that many bytes (what remains after the last whole frame is
 * one more); a Load of another backend and a TpStep are skipped (see
 * note_keys), each other frame handed to the worker's frame handler
 * (wk_worker_handle_frame) as its I/O thread would, and the events its lane
 * posts are answered (wk_worker_run_events) between frames.
 *
 * Then every request key any frame named is closed with a SessionClose,
 * and the harness waits until the lane has finished and the worker holds
 * no tensor and no queued item: SessionClose promises to free everything
 * of a request, so a tensor still held after every request was closed is
 * a leak (the wait then never ends, and libFuzzer reports a timeout).
 * Every frame the worker sent must parse as a WorkerMessage.  With
 * BATON_FUZZ_VERBOSE set in the environment each one is printed (its kind,
 * and the status of a Done or Placed). */
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/log.h"
#include "proto/baton.pb-c.h"
#include "worker/pool.h"
#include "worker/worker.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "fuzz_worker: %s failed at line %d\n", #c, __LINE__); abort(); } } while (0)

static void *zctx, *router;
static char endpoint[128], run_id[64], sock_dir[64];

/* The socket's folder goes when the fuzzer exits. */
static void remove_sock_dir(void)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/workers.sock", sock_dir);
    unlink(path);
    rmdir(sock_dir);
}

static const struct { const char *model, *backend, *opt, *val; } MODELS[] = {
    {"echo", "echo", NULL, NULL},
    {"counter", "counter", "finish_after", "3"},
    {"chunks", "chunks", "n", "2"},
    {"add", "add", NULL, NULL},
    {"fail", "fail", NULL, NULL},
};
#define N_MODELS (sizeof(MODELS) / sizeof(MODELS[0]))

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* Refusals are what the fuzzer makes most: quiet unless asked. */
    bt_log_set_level(getenv("BATON_FUZZ_VERBOSE") ? BT_LOG_DEBUG : (bt_log_level)(BT_LOG_ERROR - 1));
    snprintf(run_id, sizeof(run_id), "fuzz%d", (int)getpid());
    snprintf(sock_dir, sizeof(sock_dir), "/tmp/baton-fuzz-worker-XXXXXX");
    CHECK(mkdtemp(sock_dir));
    atexit(remove_sock_dir);
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/workers.sock", sock_dir);
    CHECK((zctx = zmq_ctx_new()));
    CHECK((router = zmq_socket(zctx, ZMQ_ROUTER)));
    int zero = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(router, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(router, ZMQ_RCVHWM, &zero, sizeof(zero));
    CHECK(zmq_bind(router, endpoint) == 0);
    return 0;
}

/* Reads what the worker sent; every frame must parse. */
static void drain_router(void)
{
    for (;;) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        if (zmq_msg_recv(&id, router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&id);
            return;
        }
        zmq_msg_init(&body);
        CHECK(zmq_msg_more(&id) && zmq_msg_recv(&body, router, 0) >= 0);
        Baton__V1__WorkerMessage *m =
            baton__v1__worker_message__unpack(NULL, zmq_msg_size(&body), zmq_msg_data(&body));
        CHECK(m);
        if (getenv("BATON_FUZZ_VERBOSE")) {
            const Baton__V1__Status *st = m->msg_case == BATON__V1__WORKER_MESSAGE__MSG_DONE
                                              ? m->done->status
                                          : m->msg_case == BATON__V1__WORKER_MESSAGE__MSG_PLACED
                                              ? m->placed->status
                                              : NULL;
            fprintf(stderr, "fuzz_worker: message %d: %d %s\n", (int)m->msg_case,
                    st ? (int)st->code : 0, st && st->message ? st->message : "");
        }
        baton__v1__worker_message__free_unpacked(m, NULL);
        zmq_msg_close(&body);
        zmq_msg_close(&id);
    }
}

static void handle(wk_worker *w, const Baton__V1__ConductorMessage *m)
{
    size_t n = baton__v1__conductor_message__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    CHECK(buf);
    baton__v1__conductor_message__pack(m, buf);
    wk_worker_handle_frame(w, buf, n);
    free(buf);
}

/* Waits for the lane's or a loader's next event and answers it. */
static void wait_events(wk_worker *w)
{
    struct pollfd p = {wk_worker_events_fd(w), POLLIN, 0};
    poll(&p, 1, 1000);
    wk_worker_run_events(w);
    drain_router();
}

static void load_models(wk_worker *w)
{
    for (size_t i = 0; i < N_MODELS; i++) {
        Baton__V1__Load__OptionsEntry opt = BATON__V1__LOAD__OPTIONS_ENTRY__INIT;
        Baton__V1__Load__OptionsEntry *opts[] = {&opt};
        Baton__V1__Load l = BATON__V1__LOAD__INIT;
        l.model = (char *)MODELS[i].model;
        l.backend = (char *)MODELS[i].backend;
        l.tp_size = 1;
        l.max_batch = 4;
        if (MODELS[i].opt) {
            opt.key = (char *)MODELS[i].opt;
            opt.value = (char *)MODELS[i].val;
            l.options = opts;
            l.n_options = 1;
        }
        Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_LOAD;
        m.load = &l;
        handle(w, &m);
    }
    for (;;) {
        size_t have = 0;
        for (size_t i = 0; i < N_MODELS; i++)
            have += wk_worker_has_model(w, MODELS[i].model);
        wk_worker_stats st;
        wk_worker_get_stats(w, &st);
        if (have == N_MODELS && !st.loading)
            return;
        wait_events(w);
    }
}

/* The request keys a frame names, so that they can be closed at the end. */
typedef struct keys {
    uint64_t *k;
    size_t n, cap;
} keys;

static void add_key(keys *ks, uint64_t k)
{
    for (size_t i = 0; i < ks->n; i++)
        if (ks->k[i] == k)
            return;
    if (ks->n == ks->cap) {
        ks->cap = ks->cap ? 2 * ks->cap : 8;
        ks->k = realloc(ks->k, ks->cap * sizeof(*ks->k));
        CHECK(ks->k);
    }
    ks->k[ks->n++] = k;
}

/* Notes the request keys frame P[N] names.  False for what the harness
 * does not hand to the worker: a Load of anything but a test backend (the
 * transformer would read model files and a plugin dlopen any path) and a
 * TpStep (no model here is a tensor-parallel follower, which needs NCCL,
 * and a step for any other model exits the process on purpose). */
static bool note_keys(keys *ks, const uint8_t *p, size_t n)
{
    Baton__V1__ConductorMessage *m = baton__v1__conductor_message__unpack(NULL, n, p);
    if (!m)
        return true;
    bool ok = true;
    switch (m->msg_case) {
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_LOAD:
        ok = false;
        for (size_t i = 0; i < N_MODELS; i++)
            ok |= m->load->backend && strcmp(m->load->backend, MODELS[i].backend) == 0;
        break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_DISPATCH: add_key(ks, m->dispatch->request_key); break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_PUT: add_key(ks, m->put->request_key); break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_EXTEND: add_key(ks, m->extend->request_key); break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_DROP: add_key(ks, m->drop->request_key); break;
    case BATON__V1__CONDUCTOR_MESSAGE__MSG_TP_STEP:
        /* A step for a model this worker does not follow ends the process
         * (wk_tp_broken): by design, so that its group restarts. */
        ok = false;
        break;
    default: break;
    }
    baton__v1__conductor_message__free_unpacked(m, NULL);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wk_options opt = {0};
    opt.name = "w0";
    opt.run_id = run_id;
    opt.incarnation = 1;
    opt.endpoint = endpoint;
    opt.device = "cpu";
    opt.pool_bytes = 1 << 20;
    opt.streams = 1;
    opt.threads = 1;
    opt.comm_streams = 1;
    wk_worker *w = NULL;
    char err[512];
    if (wk_worker_create(&opt, &w, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_worker: wk_worker_create: %s\n", err);
        abort();
    }
    load_models(w);

    keys ks = {0};
    size_t at = 0, frames = 0;
    wk_worker_stats st;
    wk_worker_get_stats(w, &st);
    while (at < size && frames < 64 && !st.quit) {
        size_t len = size - at;
        const uint8_t *p = data + at;
        if (len >= 2 && (size_t)(data[at] | data[at + 1] << 8) <= len - 2) {
            len = (size_t)(data[at] | data[at + 1] << 8);
            p = data + at + 2;
            at += 2 + len;
        } else {
            at = size;
        }
        if (note_keys(&ks, p, len))
            wk_worker_handle_frame(w, p, len);
        wk_worker_run_events(w);
        drain_router();
        frames++;
        wk_worker_get_stats(w, &st);
    }
    /* Let the lane run what was dispatched, so that Dones and chunks are
     * sent rather than cancelled: wait while some request has an item, for
     * a bounded number of events (a run-ahead window may be huge). */
    for (int round = 0; round < 64; round++) {
        wk_worker_get_stats(w, &st);
        if (st.items == 0)
            break;
        wait_events(w);
    }
    for (size_t i = 0; i < ks.n; i++) {
        Baton__V1__SessionClose sc = BATON__V1__SESSION_CLOSE__INIT;
        sc.request_key = ks.k[i];
        Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_SESSION_CLOSE;
        m.session_close = &sc;
        handle(w, &m);
    }
    for (;;) {
        wk_worker_get_stats(w, &st);
        if (st.queued == 0 && st.live_tensors == 0)
            break;
        wait_events(w);
    }
    wk_worker_get_stats(w, &st);
    CHECK(st.pool.used == 0);
    wk_worker_destroy(w);
    drain_router();
    free(ks.k);
    return 0;
}
