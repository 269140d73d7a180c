/* A real baton-worker process, with this test playing the conductor on a
 * ROUTER socket it binds: registration, loads, Put/Placed, pass-through
 * echo, joins, stream chunks, a run-ahead chain with Extend and finish,
 * failures, cancel by SessionClose, Fetch, Release (pool back to empty per
 * the heartbeat), Shutdown and SIGTERM (exit 0, shm segment unlinked). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <dirent.h>

#include <cmocka.h>

#include "proto/baton.pb-c.h"
#include "tests/unit/sock_limits.h"

typedef Baton__V1__WorkerMessage wmsg;

/* Everything a test allocates, freed at its end (ASan checks leaks). */
typedef struct arena {
    void **p;
    size_t n, cap;
    wmsg **msgs;
    size_t n_msgs, cap_msgs;
} arena;

/* One worker process. */
typedef struct wproc {
    char name[16];
    uint8_t route[256];  /* the router's routing id of its connection, learnt from its
                            Register (a worker gives none of its own) */
    size_t route_len;
    pid_t pid;
    char shm_name[128];
    const uint8_t *pool; /* its pool, mapped read-only like a peer does */
    size_t pool_size;
    char hostname[256];
} wproc;

typedef struct conductor {
    void *zctx, *router;
    char endpoint[320], sock_path[256], cfg_path[256];
    char run_id[64];
    wproc w[2];
    int n_w;
    int to;   /* the worker c_send addresses */
    int from; /* the worker the last message came from */
    /* The frames after the first of a worker's last ZeroMQ message (a
     * worker sends what one round of its loop had as one message), each a
     * WorkerMessage, handed out in order before the socket is read again. */
    zmq_msg_t rest[1024];
    int n_rest, next_rest, rest_from;
    arena a;
} conductor;

static void *A(conductor *c, size_t n)
{
    arena *a = &c->a;
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->p = realloc(a->p, a->cap * sizeof(*a->p));
    }
    return a->p[a->n++] = calloc(1, n);
}

static void keep(conductor *c, wmsg *m)
{
    arena *a = &c->a;
    if (a->n_msgs == a->cap_msgs) {
        a->cap_msgs = a->cap_msgs ? 2 * a->cap_msgs : 64;
        a->msgs = realloc(a->msgs, a->cap_msgs * sizeof(*a->msgs));
    }
    a->msgs[a->n_msgs++] = m;
}

static const char *worker_path(char *buf, size_t len)
{
    const char *b = getenv("BUILD");
    snprintf(buf, len, "%s/baton-worker", b && *b ? b : "build");
    return buf;
}

/* The conductor of the running test, so that the teardown cleans up after
 * a failed assertion (which leaves the test function by longjmp). */
static conductor *live;

/* Starts N_WORKERS workers, cpu0 and cpu1, of one config. */
static void c_start(conductor *c, const char *run_tag, int n_workers)
{
    memset(c, 0, sizeof(*c));
    live = c;
    snprintf(c->run_id, sizeof(c->run_id), "t%d%s", (int)getpid(), run_tag);
    snprintf(c->sock_path, sizeof(c->sock_path), "/tmp/baton-wtest-%s.sock", c->run_id);
    snprintf(c->endpoint, sizeof(c->endpoint), "ipc://%s", c->sock_path);
    snprintf(c->cfg_path, sizeof(c->cfg_path), "/tmp/baton-wtest-%s.yaml", c->run_id);
    c->n_w = n_workers;
    for (int i = 0; i < n_workers; i++) {
        snprintf(c->w[i].name, sizeof(c->w[i].name), "cpu%d", i);
        snprintf(c->w[i].shm_name, sizeof(c->w[i].shm_name), "/baton-%s-cpu%d", c->run_id, i);
    }
    FILE *f = fopen(c->cfg_path, "w");
    assert_non_null(f);
    /* One lane, so a sleeping item that was not woken would block the
     * items after it. */
    fprintf(f, "version: 1\n"
               "daemon: {workers_endpoint: ipc:///nonexistent/never-used.sock, log_level: %s}\n"
               "workers:\n"
               "  - {name: cpu0, device: cpu, pool_mb: 16, streams: {compute: 1}}\n"
               "  - {name: cpu1, device: cpu, pool_mb: 8, streams: {compute: 2}}\n",
            getenv("BATON_TEST_DEBUG") ? "debug" : "warning");
    fclose(f);
    c->zctx = zmq_ctx_new();
    c->router = zmq_socket(c->zctx, ZMQ_ROUTER);
    test_sock_limit(c->router);
    assert_int_equal(zmq_bind(c->router, c->endpoint), 0);
    char exe[512];
    worker_path(exe, sizeof(exe));
    for (int i = 0; i < n_workers; i++) {
        c->w[i].pid = fork();
        assert_true(c->w[i].pid >= 0);
        if (c->w[i].pid == 0) {
            close_range(3, ~0u, 0);
            execl(exe, exe, "--config", c->cfg_path, "--name", c->w[i].name, "--run-id",
                  c->run_id, "--incarnation", "3", "--endpoint", c->endpoint, (char *)NULL);
            fprintf(stderr, "exec %s: %s\n", exe, strerror(errno));
            _exit(127);
        }
    }
}

/* Waits for worker I to exit; returns its exit status or -1. */
static int c_wait_exit(conductor *c, int i, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 10) {
        int st;
        pid_t r = waitpid(c->w[i].pid, &st, WNOHANG);
        if (r == c->w[i].pid) {
            c->w[i].pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        usleep(10000);
    }
    return -1;
}

static void c_stop(conductor *c)
{
    live = NULL;
    while (c->next_rest < c->n_rest)
        zmq_msg_close(&c->rest[c->next_rest++]);
    for (int i = 0; i < c->n_w; i++) {
        if (c->w[i].pid > 0) {
            kill(c->w[i].pid, SIGKILL);
            waitpid(c->w[i].pid, NULL, 0);
        }
        if (c->w[i].pool)
            munmap((void *)c->w[i].pool, c->w[i].pool_size);
        shm_unlink(c->w[i].shm_name);
    }
    zmq_close(c->router);
    zmq_ctx_term(c->zctx);
    unlink(c->cfg_path);
    unlink(c->sock_path);
    for (size_t i = 0; i < c->a.n; i++)
        free(c->a.p[i]);
    for (size_t i = 0; i < c->a.n_msgs; i++)
        baton__v1__worker_message__free_unpacked(c->a.msgs[i], NULL);
    free(c->a.p);
    free(c->a.msgs);
}

/* The next message, heartbeats included; NULL after TIMEOUT_MS. */
static wmsg *c_recv_any(conductor *c, int timeout_ms)
{
    if (c->next_rest < c->n_rest) {
        zmq_msg_t *body = &c->rest[c->next_rest++];
        c->from = c->rest_from;
        wmsg *m = baton__v1__worker_message__unpack(NULL, zmq_msg_size(body), zmq_msg_data(body));
        zmq_msg_close(body);
        assert_non_null(m);
        keep(c, m);
        return m;
    }
    zmq_pollitem_t it = {c->router, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0)
        return NULL;
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    assert_true(zmq_msg_recv(&id, c->router, 0) >= 0);
    assert_true(zmq_msg_more(&id));
    assert_true(zmq_msg_recv(&body, c->router, 0) >= 0);
    c->n_rest = c->next_rest = 0;
    for (bool more = zmq_msg_more(&body); more;) {
        assert_true(c->n_rest < 1024);
        zmq_msg_t *x = &c->rest[c->n_rest++];
        zmq_msg_init(x);
        assert_true(zmq_msg_recv(x, c->router, 0) >= 0);
        more = zmq_msg_more(x);
    }
    wmsg *m = baton__v1__worker_message__unpack(NULL, zmq_msg_size(&body), zmq_msg_data(&body));
    assert_non_null(m);
    /* A Register names its worker: its connection is that worker's from
     * then on, as in batond. */
    if (m->msg_case == BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION)
        for (int i = 0; i < c->n_w; i++)
            if (strcmp(m->registration->worker, c->w[i].name) == 0) {
                assert_true(zmq_msg_size(&id) <= sizeof(c->w[i].route));
                memcpy(c->w[i].route, zmq_msg_data(&id), zmq_msg_size(&id));
                c->w[i].route_len = zmq_msg_size(&id);
            }
    c->from = -1;
    for (int i = 0; i < c->n_w; i++)
        if (zmq_msg_size(&id) == c->w[i].route_len &&
            memcmp(zmq_msg_data(&id), c->w[i].route, zmq_msg_size(&id)) == 0)
            c->from = i;
    assert_true(c->from >= 0);
    c->rest_from = c->from;
    zmq_msg_close(&id);
    zmq_msg_close(&body);
    keep(c, m);
    return m;
}

/* The next message that is not a heartbeat; it must be of kind WANT. */
static wmsg *c_expect(conductor *c, Baton__V1__WorkerMessage__MsgCase want, int timeout_ms)
{
    for (;;) {
        wmsg *m = c_recv_any(c, timeout_ms);
        if (!m)
            fail_msg("no message of kind %d within %d ms", want, timeout_ms);
        if (m->msg_case == BATON__V1__WORKER_MESSAGE__MSG_HEARTBEAT)
            continue;
        if (m->msg_case != want)
            fail_msg("expected message kind %d, got %d", want, m->msg_case);
        return m;
    }
}

/* Asserts that nothing but heartbeats arrives for MS milliseconds. */
static void c_expect_quiet(conductor *c, int ms)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        int spent = (int)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000);
        if (spent >= ms)
            return;
        wmsg *m = c_recv_any(c, ms - spent);
        if (m && m->msg_case != BATON__V1__WORKER_MESSAGE__MSG_HEARTBEAT)
            fail_msg("unexpected message of kind %d", m->msg_case);
    }
}

static void c_send(conductor *c, Baton__V1__ConductorMessage *m)
{
    size_t n = baton__v1__conductor_message__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    baton__v1__conductor_message__pack(m, buf);
    const wproc *to = &c->w[c->to];
    assert_true(to->route_len > 0);
    assert_int_equal(zmq_send(c->router, to->route, to->route_len, ZMQ_SNDMORE),
                     (int)to->route_len);
    assert_int_equal(zmq_send(c->router, buf, n, 0), (int)n);
    free(buf);
}

/* Sends bytes as they are: a frame the worker's parser refuses. */
static void c_send_raw(conductor *c, const uint8_t *buf, size_t n)
{
    const wproc *to = &c->w[c->to];
    assert_true(to->route_len > 0);
    assert_int_equal(zmq_send(c->router, to->route, to->route_len, ZMQ_SNDMORE),
                     (int)to->route_len);
    assert_int_equal(zmq_send(c->router, buf, n, 0), (int)n);
}

/* --- message builders ---------------------------------------------------- */

static void send_load(conductor *c, const char *model, const char *backend, const char *key,
                      const char *value, uint32_t max_batch)
{
    Baton__V1__Load l = BATON__V1__LOAD__INIT;
    Baton__V1__Load__OptionsEntry e = BATON__V1__LOAD__OPTIONS_ENTRY__INIT;
    Baton__V1__Load__OptionsEntry *ep[1] = {&e};
    l.model = (char *)model;
    l.backend = (char *)backend;
    if (key) {
        e.key = (char *)key;
        e.value = (char *)value;
        l.n_options = 1;
        l.options = ep;
    }
    l.tp_size = 1;
    l.max_batch = max_batch;
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_LOAD;
    m.load = &l;
    c_send(c, &m);
}

static Baton__V1__Loaded *load_ok(conductor *c, const char *model, const char *backend,
                                  const char *key, const char *value)
{
    send_load(c, model, backend, key, value, 4);
    Baton__V1__Loaded *l = c_expect(c, BATON__V1__WORKER_MESSAGE__MSG_LOADED, 5000)->loaded;
    assert_string_equal(l->model, model);
    if (l->status->code != 0)
        fail_msg("load of %s failed: %s", model, l->status->message);
    return l;
}

static const Baton__V1__TensorRef *put_i32(conductor *c, uint64_t key, uint64_t put_id,
                                           const int32_t *v, int64_t n)
{
    Baton__V1__Tensor t = BATON__V1__TENSOR__INIT;
    t.dtype = BATON__V1__DTYPE__I32;
    t.n_dims = 1;
    t.dims = &n;
    t.data.data = (uint8_t *)v;
    t.data.len = (size_t)n * 4;
    Baton__V1__Put p = BATON__V1__PUT__INIT;
    p.request_key = key;
    p.put_id = put_id;
    p.value = &t;
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_PUT;
    m.put = &p;
    c_send(c, &m);
    Baton__V1__Placed *pl = c_expect(c, BATON__V1__WORKER_MESSAGE__MSG_PLACED, 5000)->placed;
    assert_int_equal(pl->put_id, put_id);
    assert_int_equal(pl->request_key, key);
    assert_int_equal(pl->status->code, 0);
    assert_non_null(pl->ref);
    assert_int_equal(pl->ref->nbytes, (uint64_t)n * 4);
    return pl->ref;
}

/* An input of one or more parts of one chunk each. */
static Baton__V1__InputValue *input(conductor *c, const char *name, uint32_t shard_dim,
                                    size_t n_parts, const Baton__V1__TensorRef *const *refs)
{
    Baton__V1__InputValue *iv = A(c, sizeof(*iv));
    baton__v1__input_value__init(iv);
    iv->name = (char *)name;
    iv->shard_dim = shard_dim;
    iv->final = 1;
    iv->n_parts = n_parts;
    iv->parts = A(c, n_parts * sizeof(*iv->parts));
    for (size_t p = 0; p < n_parts; p++) {
        Baton__V1__TensorPart *tp = A(c, sizeof(*tp));
        baton__v1__tensor_part__init(tp);
        tp->n_chunks = 1;
        tp->chunks = A(c, sizeof(*tp->chunks));
        tp->chunks[0] = (Baton__V1__TensorRef *)refs[p];
        iv->parts[p] = tp;
    }
    return iv;
}

static Baton__V1__OutputSpec *output(conductor *c, const char *name, int client, int stream)
{
    Baton__V1__OutputSpec *o = A(c, sizeof(*o));
    baton__v1__output_spec__init(o);
    o->name = (char *)name;
    o->client = client;
    o->stream = stream;
    return o;
}

typedef struct disp {
    uint64_t key, id;
    uint32_t node, upto, remaining_ms;
    const char *name, *model;
    uint32_t iter[2];
    size_t depth;
    Baton__V1__InputValue *in[4];
    size_t n_in;
    Baton__V1__OutputSpec *out[4];
    size_t n_out;
    const char *lb_output, *lb_input;
} disp;

static void send_dispatch(conductor *c, const disp *x)
{
    Baton__V1__Dispatch d = BATON__V1__DISPATCH__INIT;
    Baton__V1__LoopBack lb = BATON__V1__LOOP_BACK__INIT;
    Baton__V1__LoopBack *lbp[1] = {&lb};
    d.request_key = x->key;
    d.request_id = (char *)"req";
    d.node = x->node;
    d.node_name = (char *)x->name;
    d.model = (char *)x->model;
    d.mode = (char *)"";
    d.n_iteration = x->depth;
    d.iteration = (uint32_t *)x->iter;
    d.n_inputs = x->n_in;
    d.inputs = (Baton__V1__InputValue **)x->in;
    d.n_outputs = x->n_out;
    d.outputs = (Baton__V1__OutputSpec **)x->out;
    d.speculate_upto = x->upto;
    d.dispatch_id = x->id;
    d.remaining_ms = x->remaining_ms;
    if (x->lb_output) {
        lb.output = (char *)x->lb_output;
        lb.input = (char *)x->lb_input;
        d.n_loop_back = 1;
        d.loop_back = lbp;
    }
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_DISPATCH;
    m.dispatch = &d;
    c_send(c, &m);
}

static Baton__V1__Done *expect_done(conductor *c, uint64_t key, uint32_t node, int code)
{
    Baton__V1__Done *d = c_expect(c, BATON__V1__WORKER_MESSAGE__MSG_DONE, 5000)->done;
    assert_int_equal(d->request_key, key);
    assert_int_equal(d->node, node);
    if ((int)d->status->code != code)
        fail_msg("node %u: status %d (%s), expected %d", node, d->status->code,
                 d->status->message, code);
    return d;
}

static void send_simple(conductor *c, Baton__V1__ConductorMessage__MsgCase kind, void *body)
{
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    m.msg_case = kind;
    m.load = body; /* a union: any member pointer */
    c_send(c, &m);
}

static const int32_t *pool_i32(conductor *c, const Baton__V1__TensorRef *r)
{
    const wproc *w = &c->w[r->owner];
    assert_true(r->offset + r->nbytes <= w->pool_size);
    return (const int32_t *)(w->pool + r->offset);
}

/* --- the tests ----------------------------------------------------------- */

/* Every fd the worker opened itself is close-on-exec (the child closes
 * every inherited fd above 2 before exec, so all it has are its own). */
static void check_cloexec(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fdinfo", (int)pid);
    DIR *d = opendir(path);
    assert_non_null(d);
    struct dirent *e;
    int checked = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        int fd = atoi(e->d_name);
        if (fd <= 2)
            continue;
        char info[96], line[128];
        snprintf(info, sizeof(info), "/proc/%d/fdinfo/%d", (int)pid, fd);
        FILE *f = fopen(info, "r");
        if (!f)
            continue; /* closed meanwhile */
        unsigned long flags = 0;
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "flags: %lo", &flags) == 1)
                break;
        fclose(f);
        if (!(flags & O_CLOEXEC))
            fail_msg("worker fd %d is not close-on-exec (flags %lo)", fd, flags);
        checked++;
    }
    closedir(d);
    assert_true(checked >= 3); /* eventfd, signalfd, ZeroMQ's own */
}

/* Registration of every worker, then Peers to each naming all of them. */
static void handshake(conductor *c)
{
    for (int n = 0; n < c->n_w; n++) {
        Baton__V1__Register *r =
            c_expect(c, BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION, 10000)->registration;
        wproc *w = &c->w[c->from];
        assert_null(w->pool);
        assert_int_equal(r->protocol_version, 1);
        assert_string_equal(r->worker, w->name);
        assert_string_equal(r->device, "cpu");
        assert_int_equal(r->pid, (uint32_t)w->pid);
        assert_int_equal(r->n_pools, 1);
        assert_int_equal(r->pools[0]->kind, BATON__V1__POOL_KIND__POOL_KIND_SHM);
        assert_string_equal(r->pools[0]->shm_name, w->shm_name);
        assert_int_equal(r->pools[0]->pool_bytes, (c->from ? 8u : 16u) << 20);
        snprintf(w->hostname, sizeof(w->hostname), "%s", r->hostname);
        /* Map the pool the way a peer does: by name, read-only. */
        int fd = shm_open(w->shm_name, O_RDONLY, 0);
        assert_true(fd >= 0);
        struct stat st;
        assert_int_equal(fstat(fd, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
        w->pool_size = (size_t)st.st_size;
        w->pool = mmap(NULL, w->pool_size, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        assert_true(w->pool != MAP_FAILED);
    }
    Baton__V1__PoolHandle ph[2], *php[2][1];
    Baton__V1__PeerInfo pi[2], *pip[2];
    for (int i = 0; i < c->n_w; i++) {
        baton__v1__pool_handle__init(&ph[i]);
        ph[i].kind = BATON__V1__POOL_KIND__POOL_KIND_SHM;
        ph[i].shm_name = c->w[i].shm_name;
        ph[i].pool_bytes = c->w[i].pool_size;
        ph[i].cuda_device = -1;
        php[i][0] = &ph[i];
        baton__v1__peer_info__init(&pi[i]);
        pi[i].index = (uint32_t)i;
        pi[i].name = c->w[i].name;
        pi[i].hostname = c->w[i].hostname;
        pi[i].n_pools = 1;
        pi[i].pools = php[i];
        pi[i].incarnation = 3;
        pi[i].up = 1;
        pip[i] = &pi[i];
    }
    for (int i = 0; i < c->n_w; i++) {
        Baton__V1__Peers p = BATON__V1__PEERS__INIT;
        p.self_index = (uint32_t)i;
        p.n_peers = (size_t)c->n_w;
        p.peers = pip;
        p.speculation_window = 8;
        c->to = i;
        send_simple(c, BATON__V1__CONDUCTOR_MESSAGE__MSG_PEERS, &p);
        check_cloexec(c->w[i].pid);
    }
    c->to = 0;
}

static void test_conductor_session(void **state)
{
    (void)state;
    static conductor c; /* static: the teardown uses it after a failure */
    c_start(&c, "a", 1);
    handshake(&c);

    load_ok(&c, "e", "echo", NULL, NULL);
    load_ok(&c, "ch", "chunks", "n", "3");
    load_ok(&c, "cnt", "counter", "finish_after", "5");
    load_ok(&c, "f", "fail", "message", "kaput");
    load_ok(&c, "zz", "sleep", "ms", "20000");
    char plugin[512], spec[600];
    const char *b = getenv("BUILD");
    snprintf(plugin, sizeof(plugin), "%s/tests/plugin_example.so", b && *b ? b : "build");
    snprintf(spec, sizeof(spec), "plugin:%s", plugin);
    Baton__V1__Loaded *pl = load_ok(&c, "sc", spec, "factor", "3");
    assert_int_equal(pl->weight_bytes, 1234);
    assert_string_equal(pl->report, "");  /* the plugin has no model_describe */
    send_load(&c, "llm", "transformer", NULL, NULL, 1);
    Baton__V1__Loaded *tl = c_expect(&c, BATON__V1__WORKER_MESSAGE__MSG_LOADED, 5000)->loaded;
    /* A transformer without its file: refused, saying what is missing. */
    assert_int_equal(tl->status->code, BATON__V1__CODE__INVALID_ARGUMENT);
    assert_string_equal(tl->status->message,
                        "option path is required (a GGUF file or a Hugging Face folder)");
    send_load(&c, "bad", "plugin:/nonexistent/x.so", NULL, NULL, 1);
    tl = c_expect(&c, BATON__V1__WORKER_MESSAGE__MSG_LOADED, 5000)->loaded;
    assert_int_equal(tl->status->code, BATON__V1__CODE__FAILED_PRECONDITION);
    assert_non_null(strstr(tl->status->message, "/nonexistent/x.so"));

    /* Put: the bytes land in the pool under id (incarnation << 40) | 1. */
    const int32_t xs[4] = {1, 2, 3, 4};
    const Baton__V1__TensorRef *x = put_i32(&c, 1, 7, xs, 4);
    assert_int_equal(x->id, (UINT64_C(3) << 40) | 1);
    assert_int_equal(x->owner, 0);
    assert_int_equal(x->offset % 256, 0);
    assert_memory_equal(pool_i32(&c, x), xs, sizeof(xs));

    /* Echo passes the input through by reference: the very same tensor. */
    disp d = {.key = 1, .id = 100, .node = 0, .name = "echo", .model = "e", .n_in = 1,
              .n_out = 1};
    d.in[0] = input(&c, "x", 0, 1, &x);
    d.out[0] = output(&c, "x", 1, 0);
    send_dispatch(&c, &d);
    Baton__V1__Done *done = expect_done(&c, 1, 0, 0);
    assert_int_equal(done->dispatch_id, 100);
    assert_false(done->speculative);
    assert_int_equal(done->n_outputs, 1);
    assert_string_equal(done->outputs[0]->name, "x");
    const Baton__V1__TensorRef *y = done->outputs[0]->ref;
    assert_int_equal(y->id, x->id);
    assert_int_equal(y->offset, x->offset);
    assert_int_equal(y->owner, 0);
    assert_int_equal(y->data.len, 16); /* client-bound and small: inline too */
    assert_memory_equal(y->data.data, xs, 16);

    /* Chunks: three Chunk messages, then the Done (echo part by reference). */
    disp dc = {.key = 1, .id = 101, .node = 1, .name = "spread", .model = "ch", .n_in = 1,
               .n_out = 2};
    dc.in[0] = input(&c, "x", 0, 1, &x);
    dc.out[0] = output(&c, "part", 0, 1);
    dc.out[1] = output(&c, "x", 0, 0);
    send_dispatch(&c, &dc);
    uint64_t chunk_ids[3];
    for (uint32_t k = 0; k < 3; k++) {
        Baton__V1__Chunk *ck = c_expect(&c, BATON__V1__WORKER_MESSAGE__MSG_CHUNK, 5000)->chunk;
        assert_int_equal(ck->index, k);
        assert_int_equal(ck->final, k == 2);
        assert_string_equal(ck->name, "part");
        assert_int_equal(ck->dispatch_id, 101);
        assert_non_null(ck->ref);
        assert_int_equal(ck->ref->dtype, BATON__V1__DTYPE__I32);
        assert_int_equal(ck->ref->n_dims, 1);
        assert_int_equal(ck->ref->data.len, 0); /* not client-bound: no inline copy */
        assert_int_equal(*pool_i32(&c, ck->ref), (int32_t)k);
        chunk_ids[k] = ck->ref->id;
    }
    done = expect_done(&c, 1, 1, 0);
    assert_int_equal(done->n_outputs, 1);
    assert_int_equal(done->outputs[0]->ref->id, x->id);

    /* Run-ahead: iteration 0 dispatched with a window up to 3; the worker
     * runs 1..3 itself, feeding state back, and stops at the window. */
    disp dl = {.key = 1, .id = 102, .node = 2, .name = "tick", .model = "cnt", .n_in = 1,
               .n_out = 2, .upto = 3, .depth = 1, .lb_output = "state", .lb_input = "state"};
    dl.in[0] = input(&c, "state", 0, 1, &x);
    dl.out[0] = output(&c, "state", 0, 0);
    dl.out[1] = output(&c, "iteration", 1, 0);
    send_dispatch(&c, &dl);
    uint64_t state_ids[5];
    for (uint32_t i = 0; i <= 3; i++) {
        done = expect_done(&c, 1, 2, 0);
        assert_int_equal(done->n_iteration, 1);
        assert_int_equal(done->iteration[0], i);
        assert_int_equal(done->speculative, i > 0);
        assert_int_equal(done->dispatch_id, 102);
        assert_false(done->finish);
        assert_int_equal(done->n_outputs, 2);
        assert_int_equal(*pool_i32(&c, done->outputs[0]->ref), (int32_t)i);
        assert_int_equal(done->outputs[1]->ref->data.len, 4);
        state_ids[i] = done->outputs[0]->ref->id;
    }
    c_expect_quiet(&c, 200);
    /* Extend: iterations 4 (finish_after 5 finishes there) and no more. */
    Baton__V1__Extend ex = BATON__V1__EXTEND__INIT;
    ex.request_key = 1;
    ex.node = 2;
    ex.upto = 7;
    ex.dispatch_id = 102;
    send_simple(&c, BATON__V1__CONDUCTOR_MESSAGE__MSG_EXTEND, &ex);
    done = expect_done(&c, 1, 2, 0);
    assert_int_equal(done->iteration[0], 4);
    assert_true(done->speculative);
    assert_true(done->finish);
    state_ids[4] = done->outputs[0]->ref->id;
    c_expect_quiet(&c, 200);

    /* Fan-in join: two parts along dim 0 make a new tensor in the pool. */
    const int32_t zs[2] = {9, 8};
    const Baton__V1__TensorRef *z = put_i32(&c, 1, 8, zs, 2);
    const Baton__V1__TensorRef *parts[2] = {x, z};
    disp dj = {.key = 1, .id = 103, .node = 3, .name = "join", .model = "e", .n_in = 1,
               .n_out = 1};
    dj.in[0] = input(&c, "x", 0, 2, parts);
    dj.out[0] = output(&c, "x", 1, 0);
    send_dispatch(&c, &dj);
    done = expect_done(&c, 1, 3, 0);
    const Baton__V1__TensorRef *j = done->outputs[0]->ref;
    assert_true(j->id != x->id && j->id != z->id);
    assert_int_equal(j->n_dims, 1);
    assert_int_equal(j->dims[0], 6);
    const int32_t want[6] = {1, 2, 3, 4, 9, 8};
    assert_memory_equal(j->data.data, want, sizeof(want));
    /* Mismatched parts: INVALID_ARGUMENT naming node and input. */
    const Baton__V1__TensorRef *bad[2] = {x, z};
    disp db = dj;
    db.id = 104;
    db.in[0] = input(&c, "x", 1, 2, bad);
    send_dispatch(&c, &db);
    done = expect_done(&c, 1, 3, BATON__V1__CODE__INVALID_ARGUMENT);
    assert_non_null(strstr(done->status->message, "node 'join' input 'x'"));

    /* Fetch the joined tensor; an unknown id is NOT_FOUND. */
    Baton__V1__Fetch fe = BATON__V1__FETCH__INIT;
    fe.tensor_id = j->id;
    send_simple(&c, BATON__V1__CONDUCTOR_MESSAGE__MSG_FETCH, &fe);
    Baton__V1__Fetched *fd = c_expect(&c, BATON__V1__WORKER_MESSAGE__MSG_FETCHED, 5000)->fetched;
    assert_int_equal(fd->status->code, 0);
    assert_int_equal(fd->data.len, sizeof(want));
    assert_memory_equal(fd->data.data, want, sizeof(want));
    fe.tensor_id = 12345;
    send_simple(&c, BATON__V1__CONDUCTOR_MESSAGE__MSG_FETCH, &fe);
    fd = c_expect(&c, BATON__V1__WORKER_MESSAGE__MSG_FETCHED, 5000)->fetched;
    assert_int_equal(fd->status->code, BATON__V1__CODE__NOT_FOUND);

    /* fail: INTERNAL with the option's message.  Unknown model: refused. */
    disp df = {.key = 1, .id = 105, .node = 4, .name = "boom", .model = "f", .n_in = 1,
               .n_out = 1};
    df.in[0] = input(&c, "x", 0, 1, &x);
    df.out[0] = output(&c, "y", 0, 0);
    send_dispatch(&c, &df);
    done = expect_done(&c, 1, 4, BATON__V1__CODE__INTERNAL);
    assert_string_equal(done->status->message, "kaput");
    assert_int_equal(done->n_outputs, 0);
    df.model = "nope";
    send_dispatch(&c, &df);
    done = expect_done(&c, 1, 4, BATON__V1__CODE__FAILED_PRECONDITION);

    /* The plugin: x * 3 into a new tensor. */
    disp dp = {.key = 1, .id = 106, .node = 5, .name = "scale", .model = "sc", .n_in = 1,
               .n_out = 1};
    dp.in[0] = input(&c, "x", 0, 1, &x);
    dp.out[0] = output(&c, "y", 1, 0);
    send_dispatch(&c, &dp);
    done = expect_done(&c, 1, 5, 0);
    const int32_t tripled[4] = {3, 6, 9, 12};
    assert_memory_equal(done->outputs[0]->ref->data.data, tripled, sizeof(tripled));
    uint64_t scaled_id = done->outputs[0]->ref->id;

    /* Release everything request 1 made; SessionClose closes its plugin
     * session.  A heartbeat then shows an empty pool. */
    uint64_t ids[16] = {x->id, z->id, j->id, scaled_id, chunk_ids[0], chunk_ids[1],
                        chunk_ids[2], state_ids[0], state_ids[1], state_ids[2], state_ids[3],
                        state_ids[4], 999};
    Baton__V1__Release rel = BATON__V1__RELEASE__INIT;
    rel.n_tensor_ids = 13;
    rel.tensor_ids = ids;
    send_simple(&c, BATON__V1__CONDUCTOR_MESSAGE__MSG_RELEASE, &rel);
    Baton__V1__SessionClose sc = BATON__V1__SESSION_CLOSE__INIT;
    sc.request_key = 1;
    send_simple(&c, BATON__V1__CONDUCTOR_MESSAGE__MSG_SESSION_CLOSE, &sc);
    /* A Fetch of a tensor already released is NOT_FOUND, naming it: never
     * OK with no bytes. */
    fe.tensor_id = j->id;
    send_simple(&c, BATON__V1__CONDUCTOR_MESSAGE__MSG_FETCH, &fe);
    fd = c_expect(&c, BATON__V1__WORKER_MESSAGE__MSG_FETCHED, 5000)->fetched;
    assert_int_equal(fd->status->code, BATON__V1__CODE__NOT_FOUND);
    assert_int_equal(fd->data.len, 0);
    char gone[64];
    snprintf(gone, sizeof(gone), "tensor %llu is not held", (unsigned long long)j->id);
    assert_non_null(strstr(fd->status->message, gone));

    /* A request cancelled while it sleeps: nothing is sent for it, and the
     * single lane is free again at once (the next echo answers quickly). */
    const Baton__V1__TensorRef *w2 = put_i32(&c, 2, 9, xs, 4);
    disp ds = {.key = 2, .id = 107, .node = 0, .name = "nap", .model = "zz", .n_in = 1,
               .n_out = 1};
    ds.in[0] = input(&c, "x", 0, 1, &w2);
    ds.out[0] = output(&c, "x", 0, 0);
    send_dispatch(&c, &ds);
    c_expect_quiet(&c, 100);
    sc.request_key = 2;
    send_simple(&c, BATON__V1__CONDUCTOR_MESSAGE__MSG_SESSION_CLOSE, &sc);
    const Baton__V1__TensorRef *w3 = put_i32(&c, 3, 10, xs, 4);
    disp de = {.key = 3, .id = 108, .node = 0, .name = "echo", .model = "e", .n_in = 1,
               .n_out = 1};
    de.in[0] = input(&c, "x", 0, 1, &w3);
    de.out[0] = output(&c, "x", 0, 0);
    send_dispatch(&c, &de);
    done = expect_done(&c, 3, 0, 0);
    assert_int_equal(done->outputs[0]->ref->id, w3->id);
    sc.request_key = 3; /* SessionClose frees the request's tensors too */
    send_simple(&c, BATON__V1__CONDUCTOR_MESSAGE__MSG_SESSION_CLOSE, &sc);

    Baton__V1__Heartbeat *hb = NULL;
    for (int tries = 0; tries < 4; tries++) {
        wmsg *m = c_recv_any(&c, 1500);
        assert_non_null(m);
        assert_int_equal(m->msg_case, BATON__V1__WORKER_MESSAGE__MSG_HEARTBEAT);
        hb = m->heartbeat;
        if (hb->live_tensors == 0)
            break;
    }
    assert_int_equal(hb->live_tensors, 0);
    assert_int_equal(hb->pool_used_bytes, 0);
    assert_int_equal(hb->pool_free_bytes, 16u << 20);
    assert_int_equal(hb->largest_free_bytes, 16u << 20);
    assert_int_equal(hb->open_sessions, 0);
    assert_int_equal(hb->queued, 0);

    Baton__V1__Shutdown sd = BATON__V1__SHUTDOWN__INIT;
    sd.reason = (char *)"test over";
    send_simple(&c, BATON__V1__CONDUCTOR_MESSAGE__MSG_SHUTDOWN, &sd);
    assert_int_equal(c_wait_exit(&c, 0, 3000), 0);
    int fd2 = shm_open(c.w[0].shm_name, O_RDONLY, 0);
    assert_int_equal(fd2, -1); /* unlinked at exit */
    c_stop(&c);
}

/* Drop: a window whose iterations are discarded sends nothing more. */
static void test_drop_and_sigterm(void **state)
{
    (void)state;
    static conductor c; /* static: the teardown uses it after a failure */
    c_start(&c, "b", 1);
    handshake(&c);
    load_ok(&c, "zz", "sleep", "ms", "100");
    const int32_t xs[1] = {5};
    const Baton__V1__TensorRef *x = put_i32(&c, 1, 1, xs, 1);
    disp d = {.key = 1, .id = 1, .node = 0, .name = "nap", .model = "zz", .n_in = 1,
              .n_out = 1, .upto = 9, .depth = 1, .lb_output = "x", .lb_input = "x"};
    d.in[0] = input(&c, "x", 0, 1, &x);
    d.out[0] = output(&c, "x", 0, 0);
    send_dispatch(&c, &d);
    Baton__V1__Done *done = expect_done(&c, 1, 0, 0);
    assert_int_equal(done->iteration[0], 0);
    assert_int_equal(done->outputs[0]->ref->id, x->id); /* pass-through feeds itself */
    done = expect_done(&c, 1, 0, 0);
    assert_int_equal(done->iteration[0], 1);
    assert_true(done->speculative);
    /* Iteration 2 is running now: drop from 2. */
    Baton__V1__Drop dr = BATON__V1__DROP__INIT;
    uint32_t from[1] = {2};
    dr.request_key = 1;
    dr.node = 0;
    dr.n_from_iteration = 1;
    dr.from_iteration = from;
    send_simple(&c, BATON__V1__CONDUCTOR_MESSAGE__MSG_DROP, &dr);
    c_expect_quiet(&c, 400);

    /* A deadline ends a sleep early with DEADLINE_EXCEEDED. */
    load_ok(&c, "long", "sleep", "ms", "20000");
    disp dd = {.key = 2, .id = 2, .node = 1, .name = "late", .model = "long", .n_in = 1,
               .n_out = 1, .remaining_ms = 50};
    dd.in[0] = input(&c, "x", 0, 1, &x);
    dd.out[0] = output(&c, "x", 0, 0);
    send_dispatch(&c, &dd);
    done = expect_done(&c, 2, 1, BATON__V1__CODE__DEADLINE_EXCEEDED);
    assert_true(done->exec_us < 5000000);

    /* A Put larger than the pool (16 MiB): RESOURCE_EXHAUSTED, no ref. */
    int64_t big_n = 5 << 20;
    int32_t *big = calloc((size_t)big_n, 4);
    Baton__V1__Tensor bt = BATON__V1__TENSOR__INIT;
    bt.dtype = BATON__V1__DTYPE__I32;
    bt.n_dims = 1;
    bt.dims = &big_n;
    bt.data.data = (uint8_t *)big;
    bt.data.len = (size_t)big_n * 4;
    Baton__V1__Put bp = BATON__V1__PUT__INIT;
    bp.request_key = 3;
    bp.put_id = 77;
    bp.value = &bt;
    send_simple(&c, BATON__V1__CONDUCTOR_MESSAGE__MSG_PUT, &bp);
    free(big);
    Baton__V1__Placed *pl = c_expect(&c, BATON__V1__WORKER_MESSAGE__MSG_PLACED, 5000)->placed;
    assert_int_equal(pl->put_id, 77);
    assert_int_equal(pl->status->code, BATON__V1__CODE__RESOURCE_EXHAUSTED);
    assert_null(pl->ref);
    /* Bytes that do not match the shape: INVALID_ARGUMENT. */
    bt.data.len = 3;
    bt.data.data = (uint8_t *)"abc";
    send_simple(&c, BATON__V1__CONDUCTOR_MESSAGE__MSG_PUT, &bp);
    pl = c_expect(&c, BATON__V1__WORKER_MESSAGE__MSG_PLACED, 5000)->placed;
    assert_int_equal(pl->status->code, BATON__V1__CODE__INVALID_ARGUMENT);

    /* A Put that does not parse (a field numbered 0 in its tensor) fails
     * its request at once: a Placed that says so, with the Put's ids. */
    uint8_t put_bad[] = {0x4a, 12, 0x08, 3, 0x10, 78, 0x1a, 6, 0x10, 4, 0x2a, 0, 0x00, 0x00};
    c_send_raw(&c, put_bad, sizeof(put_bad));
    pl = c_expect(&c, BATON__V1__WORKER_MESSAGE__MSG_PLACED, 5000)->placed;
    assert_int_equal(pl->request_key, 3);
    assert_int_equal(pl->put_id, 78);
    assert_int_equal(pl->status->code, BATON__V1__CODE__INTERNAL);
    assert_non_null(strstr(pl->status->message, "could not parse the Put"));
    /* So does a Dispatch: a failed Done for its node, iteration and id. */
    uint8_t disp_bad[] = {0x12, 15, 0x08, 4, 0x18, 0, 0x20, 2, 0x42, 1, 7, 0x68, 91, 0x00, 0x00,
                          0x28, 1};
    disp_bad[1] = (uint8_t)(sizeof(disp_bad) - 2);
    c_send_raw(&c, disp_bad, sizeof(disp_bad));
    done = expect_done(&c, 4, 2, BATON__V1__CODE__INTERNAL);
    assert_int_equal(done->dispatch_id, 91);
    assert_int_equal(done->n_iteration, 1);
    assert_int_equal(done->iteration[0], 7);
    assert_non_null(strstr(done->status->message, "could not parse the Dispatch"));

    kill(c.w[0].pid, SIGTERM);
    assert_int_equal(c_wait_exit(&c, 0, 3000), 0);
    assert_int_equal(shm_open(c.w[0].shm_name, O_RDONLY, 0), -1);
    c_stop(&c);
}

/* Two workers: cpu1 reads cpu0's tensors in place through its cached,
 * read-only mapping of cpu0's pool; pass-through keeps cpu0 as the owner;
 * joins and sums land in cpu1's own pool; a peer marked down is refused
 * and a new incarnation is mapped afresh. */
static void send_peers_to_1(conductor *c, bool cpu0_up, uint64_t cpu0_incarnation)
{
    Baton__V1__PoolHandle ph[2], *php[2][1];
    Baton__V1__PeerInfo pi[2], *pip[2];
    for (int i = 0; i < 2; i++) {
        baton__v1__pool_handle__init(&ph[i]);
        ph[i].kind = BATON__V1__POOL_KIND__POOL_KIND_SHM;
        ph[i].shm_name = c->w[i].shm_name;
        ph[i].pool_bytes = c->w[i].pool_size;
        php[i][0] = &ph[i];
        baton__v1__peer_info__init(&pi[i]);
        pi[i].index = (uint32_t)i;
        pi[i].name = c->w[i].name;
        pi[i].hostname = c->w[i].hostname;
        pi[i].n_pools = 1;
        pi[i].pools = php[i];
        pi[i].incarnation = i ? 3 : cpu0_incarnation;
        pi[i].up = i ? 1 : cpu0_up;
        pip[i] = &pi[i];
    }
    Baton__V1__Peers p = BATON__V1__PEERS__INIT;
    p.self_index = 1;
    p.n_peers = 2;
    p.peers = pip;
    c->to = 1;
    send_simple(c, BATON__V1__CONDUCTOR_MESSAGE__MSG_PEERS, &p);
}

static void test_peers(void **state)
{
    (void)state;
    static conductor c; /* static: the teardown uses it after a failure */
    c_start(&c, "p", 2);
    handshake(&c);
    c.to = 1;
    load_ok(&c, "e", "echo", NULL, NULL);
    load_ok(&c, "sum", "add", NULL, NULL);
    c.to = 0;
    const int32_t as[4] = {1, 2, 3, 4}, bs[4] = {10, 20, 30, 40};
    const Baton__V1__TensorRef *a = put_i32(&c, 1, 1, as, 4);
    assert_int_equal(c.from, 0);
    assert_int_equal(a->owner, 0);
    c.to = 1;
    const Baton__V1__TensorRef *b = put_i32(&c, 1, 2, bs, 4);
    assert_int_equal(b->owner, 1);

    disp d = {.key = 1, .id = 1, .node = 0, .name = "echo", .model = "e", .n_in = 1, .n_out = 1};
    d.in[0] = input(&c, "x", 0, 1, &a);
    d.out[0] = output(&c, "x", 1, 0);
    send_dispatch(&c, &d);
    Baton__V1__Done *done = expect_done(&c, 1, 0, 0);
    assert_int_equal(c.from, 1);
    const Baton__V1__TensorRef *y = done->outputs[0]->ref;
    assert_int_equal(y->owner, 0); /* still cpu0's tensor: no copy was made */
    assert_int_equal(y->id, a->id);
    assert_int_equal(y->offset, a->offset);
    assert_memory_equal(y->data.data, as, sizeof(as)); /* inlined from the mapped peer pool */

    disp ds = {.key = 1, .id = 2, .node = 1, .name = "sum", .model = "sum", .n_in = 2,
               .n_out = 1};
    ds.in[0] = input(&c, "a", 0, 1, &a);
    ds.in[1] = input(&c, "b", 0, 1, &b);
    ds.out[0] = output(&c, "s", 0, 0);
    send_dispatch(&c, &ds);
    done = expect_done(&c, 1, 1, 0);
    const Baton__V1__TensorRef *sum = done->outputs[0]->ref;
    assert_int_equal(sum->owner, 1);
    const int32_t sums[4] = {11, 22, 33, 44};
    assert_memory_equal(pool_i32(&c, sum), sums, sizeof(sums));

    const Baton__V1__TensorRef *parts[2] = {a, b};
    disp dj = {.key = 1, .id = 3, .node = 2, .name = "cat", .model = "e", .n_in = 1, .n_out = 1};
    dj.in[0] = input(&c, "x", 0, 2, parts);
    dj.out[0] = output(&c, "x", 0, 0);
    send_dispatch(&c, &dj);
    done = expect_done(&c, 1, 2, 0);
    const Baton__V1__TensorRef *j = done->outputs[0]->ref;
    assert_int_equal(j->owner, 1);
    assert_int_equal(j->dims[0], 8);
    const int32_t cat[8] = {1, 2, 3, 4, 10, 20, 30, 40};
    assert_memory_equal(pool_i32(&c, j), cat, sizeof(cat));

    /* cpu0 marked down: its tensors cannot be read any more. */
    send_peers_to_1(&c, false, 3);
    d.id = 4;
    send_dispatch(&c, &d);
    done = expect_done(&c, 1, 0, BATON__V1__CODE__FAILED_PRECONDITION);
    assert_non_null(strstr(done->status->message, "down"));
    /* Back as incarnation 4 (same segment here): mapped again, works. */
    send_peers_to_1(&c, true, 4);
    d.id = 5;
    send_dispatch(&c, &d);
    done = expect_done(&c, 1, 0, 0);
    assert_int_equal(done->outputs[0]->ref->id, a->id);

    Baton__V1__Shutdown sd = BATON__V1__SHUTDOWN__INIT;
    for (int i = 0; i < 2; i++) {
        c.to = i;
        send_simple(&c, BATON__V1__CONDUCTOR_MESSAGE__MSG_SHUTDOWN, &sd);
    }
    for (int i = 0; i < 2; i++) {
        assert_int_equal(c_wait_exit(&c, i, 3000), 0);
        assert_int_equal(shm_open(c.w[i].shm_name, O_RDONLY, 0), -1);
    }
    c_stop(&c);
}

/* Kills the workers and removes their segments and files when a test
 * failed half-way. */
static int teardown(void **state)
{
    (void)state;
    if (live)
        c_stop(live);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_conductor_session, teardown),
        cmocka_unit_test_teardown(test_drop_and_sigterm, teardown),
        cmocka_unit_test_teardown(test_peers, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
