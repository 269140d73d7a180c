/* Cross-host hand-off throughput: how fast a CPU worker pulls a tensor
 * from a CPU worker on another host (worker/xfer.c: chunked requests with a
 * window in flight, zero-copy replies from the producer's pool, one copy
 * into the consumer's pool), against a bare ZeroMQ send of the same bytes
 * between the same two processes over the same kind of endpoint.
 *
 * Two processes: a producer holding a 256 MiB "pool" and serving pulls on
 * a ROUTER (exactly the module the worker uses), and beside it a floor
 * ROUTER that answers a one-frame request with the whole tensor, zero
 * copy, either as one message (floor 1) or as back-to-back 4 MiB messages
 * with no request per piece (floor 4); the consumer (this process) pulls
 * through wk_xfer into a pool-sized buffer, and for the floors receives the
 * messages without copying them anywhere.  A single large message makes
 * ZeroMQ allocate (and the kernel fault in) a fresh receive buffer of the
 * tensor's size, which the chunked paths do not pay, so floor 4 is the
 * stricter comparison at 64 MiB and above.  For 1, 4, 16, 64 and 256 MiB
 * the three alternate, several times each; the table gives medians in MB/s
 * and the ratios.  A
 * second table sweeps chunk size and window at 64 MiB (what chose the
 * defaults in xfer.h).
 *
 * Endpoints (so that the two halves can run in two network namespaces
 * over a veth pair):
 *   BATON_XHOST_ROLE           both (default: forks the producer), producer
 *                              (serve until killed), or consumer
 *   BATON_XHOST_LISTEN         the producer's pull ROUTER (default
 *                              tcp://127.0.0.1:*)
 *   BATON_XHOST_FLOOR_LISTEN   the producer's floor ROUTER (same default)
 *   BATON_XHOST_CONNECT        where the consumer pulls from (default: what
 *                              the forked producer bound)
 *   BATON_XHOST_FLOOR_CONNECT  where the consumer reads the floor from
 *   BATON_XHOST_CURVE=1        CURVE on every socket, the pulls' and the
 *                              floor's alike (as a deployment with
 *                              daemon.curve runs them); both halves must
 *                              be given it
 * A producer started alone prints its two endpoints and serves until
 * SIGTERM; give it fixed ports so the consumer can be told them.
 *
 * Like every benchmark here it asserts no time; it exits non-zero only
 * when bytes arrive wrong. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "common/curve.h"
#include "tests/bench/util.h"
#include "common/evloop.h"
#include "worker/xfer.h"

#define MIB (1u << 20)
#define POOL_BYTES (256u * MIB)
#define N_SIZES 5

static const uint32_t SIZES_MIB[N_SIZES] = {1, 4, 16, 64, 256};

/* --- producer ------------------------------------------------------------ */

typedef struct producer {
    uint8_t *pool;
    int pins;
} producer;

static baton_status prod_pin(void *arg, uint64_t tensor_id, wk_xfer_src *held,
                             const uint8_t **data, void **pin, char *err, size_t errlen)
{
    producer *p = arg;
    /* Tensor id N is the first N MiB of the pool. */
    if (tensor_id == 0 || tensor_id > POOL_BYTES / MIB) {
        snprintf(err, errlen, "no tensor %" PRIu64, tensor_id);
        return BATON_STATUS_NOT_FOUND;
    }
    *held = (wk_xfer_src){tensor_id, 0, 0, tensor_id * MIB};
    *data = p->pool;
    *pin = p;
    p->pins++;
    return BATON_STATUS_OK;
}

static void prod_unpin(void *arg, void *pin)
{
    (void)pin;
    ((producer *)arg)->pins--;
}

static void no_done(void *arg, void *cookie, baton_status code, const char *message)
{
    (void)arg;
    (void)cookie;
    (void)code;
    (void)message;
}

static uint8_t pattern(uint64_t i)
{
    return (uint8_t)((i * 2654435761u) >> 11);
}

/* BATON_XHOST_CURVE=1: the key pairs of both halves, made from fixed
 * secrets so that two processes started apart agree on them without a
 * file.  For this benchmark only: a deployment's keys come from keygen.
 * The floor's ROUTER shares the pull ROUTER's context and so its ZAP
 * handler, which answers the workers' peer domain. */
#define PEER_ZAP_DOMAIN "baton-peer"

static bool curve_on(void)
{
    const char *v = getenv("BATON_XHOST_CURVE");
    return v && strcmp(v, "1") == 0;
}

static int curve_pair(uint8_t seed, bt_curve_keypair *k)
{
    uint8_t secret[32];
    for (int i = 0; i < 32; i++)
        secret[i] = (uint8_t)(seed + 7 * i);
    if (!zmq_z85_encode(k->secret_z85, secret, 32))
        return -1;
    return bt_curve_public_derive(k->secret_z85, k->public_z85);
}

static volatile sig_atomic_t stop_flag;

static void on_term(int sig)
{
    (void)sig;
    stop_flag = 1;
}

/* Serves pulls and floor requests until SIGTERM.  Writes its two endpoints
 * to OUT_FD (one line each) when >= 0. */
/* The floor socket is readable: the producer loop answers it. */
static void on_floor(evloop *l, void *arg)
{
    (void)l;
    *(bool *)arg = true;
}

static int producer_main(int out_fd)
{
    const char *listen = getenv("BATON_XHOST_LISTEN");
    const char *floor_listen = getenv("BATON_XHOST_FLOOR_LISTEN");
    static const wk_xfer_ops ops = {prod_pin, prod_unpin, no_done};
    producer p = {0};
    char err[256];
    signal(SIGTERM, on_term);
    if (!(p.pool = malloc(POOL_BYTES)))
        return 1;
    for (uint64_t i = 0; i < POOL_BYTES; i++)
        p.pool[i] = pattern(i);
    void *ctx = zmq_ctx_new();
    evloop *loop = evloop_create();
    wk_xfer *x = NULL;
    bool curve = curve_on();
    bt_curve_keypair pk, ck;
    if (curve && (curve_pair(1, &pk) != 0 || curve_pair(101, &ck) != 0)) {
        fprintf(stderr, "producer: no CURVE in this libzmq\n");
        return 1;
    }
    if (!loop ||
        wk_xfer_create(ctx, loop, listen ? listen : "tcp://127.0.0.1:*", curve ? &pk : NULL, -1,
                       &ops, &p, &x, err, sizeof(err)) != 0 ||
        (curve && (wk_xfer_peer_update(x, 1, "consumer", "", 1, true) != 0 ||
                   wk_xfer_peer_key(x, 1, ck.public_z85) != 0))) {
        fprintf(stderr, "producer: %s\n", err);
        return 1;
    }
    void *fr = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    char fep[256];
    size_t fl = sizeof(fep);
    if (!fr || (curve && bt_curve_apply_server(fr, &pk, PEER_ZAP_DOMAIN) != 0) ||
        zmq_setsockopt(fr, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(fr, ZMQ_SNDHWM, &zero, sizeof(zero)) != 0 ||
        zmq_bind(fr, floor_listen ? floor_listen : "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(fr, ZMQ_LAST_ENDPOINT, fep, &fl) != 0) {
        fprintf(stderr, "producer: floor socket: %s\n", zmq_strerror(zmq_errno()));
        return 1;
    }
    char line[600];
    int n = snprintf(line, sizeof(line), "%s\n%s\n", wk_xfer_endpoint(x), fep);
    if (out_fd >= 0) {
        if (write(out_fd, line, (size_t)n) != n)
            return 1;
        close(out_fd);
    } else {
        printf("producer: pulls on %sproducer: floor on %s", line, fep);
        printf("\n");
        fflush(stdout);
    }
    bool floor_ready = false;
    if (evloop_add(loop, fr, -1, on_floor, &floor_ready) < 0) {
        fprintf(stderr, "producer: out of memory\n");
        return 1;
    }
    while (!stop_flag) {
        floor_ready = false;
        if (evloop_run_once(loop, 100) < 0)
            continue;
        wk_xfer_drain_unpins(x);
        if (floor_ready) {
            zmq_msg_t id, rq, body;
            zmq_msg_init(&id);
            zmq_msg_init(&rq);
            if (zmq_msg_recv(&id, fr, 0) >= 0 && zmq_msg_recv(&rq, fr, 0) >= 0 &&
                zmq_msg_size(&rq) == 2 * sizeof(uint64_t)) {
                uint64_t len, piece;
                memcpy(&len, zmq_msg_data(&rq), sizeof(len));
                memcpy(&piece, (uint8_t *)zmq_msg_data(&rq) + sizeof(len), sizeof(piece));
                if (len > POOL_BYTES)
                    len = POOL_BYTES;
                if (piece == 0 || piece > len)
                    piece = len;
                /* The floor: the bytes straight from the pool, as one
                 * message or as back-to-back messages of PIECE bytes, with
                 * no request per piece. */
                for (uint64_t off = 0; off < len; off += piece) {
                    uint64_t sz = len - off < piece ? len - off : piece;
                    zmq_msg_t idc;
                    zmq_msg_init(&idc);
                    zmq_msg_copy(&idc, &id);
                    zmq_msg_init_data(&body, p.pool + off, sz, NULL, NULL);
                    zmq_msg_send(&idc, fr, ZMQ_SNDMORE);
                    zmq_msg_send(&body, fr, 0);
                }
                zmq_msg_close(&id);
            } else {
                zmq_msg_close(&id);
            }
            zmq_msg_close(&rq);
        }
    }
    wk_xfer_close(x);
    zmq_close(fr);
    zmq_ctx_term(ctx);
    wk_xfer_destroy(x);
    evloop_destroy(loop);
    free(p.pool);
    return 0;
}

static int producer_child(void *arg)
{
    return producer_main(*(int *)arg);
}

/* --- consumer ------------------------------------------------------------ */

typedef struct consumer {
    void *ctx;
    evloop *loop;                 /* the pulls' sockets */
    wk_xfer *x;
    void *floor;                  /* DEALER to the floor ROUTER */
    uint8_t *dst;                 /* POOL_BYTES, pages touched */
    int done;
    baton_status code;
    char message[512];
} consumer;

static void cons_done(void *arg, void *cookie, baton_status code, const char *message)
{
    (void)arg;
    consumer *c = cookie;
    c->done = 1;
    c->code = code;
    snprintf(c->message, sizeof(c->message), "%s", message);
}

static baton_status cons_pin(void *arg, uint64_t id, wk_xfer_src *held, const uint8_t **data,
                             void **pin, char *err, size_t errlen)
{
    (void)arg;
    (void)id;
    (void)held;
    (void)data;
    (void)pin;
    snprintf(err, errlen, "the consumer serves nothing");
    return BATON_STATUS_NOT_FOUND;
}

static void cons_unpin(void *arg, void *pin)
{
    (void)arg;
    (void)pin;
}

/* One pull of MIBS MiB; returns seconds, or -1 on a wrong answer. */
static double pull_once(consumer *c, uint32_t mibs)
{
    char err[256];
    wk_xfer_src src = {mibs, 0, 0, (uint64_t)mibs * MIB};
    c->done = 0;
    double t0 = bench_now_us();
    if (!wk_xfer_pull(c->x, 0, &src, c->dst, c, err, sizeof(err))) {
        fprintf(stderr, "pull: %s\n", err);
        return -1;
    }
    while (!c->done) {
        evloop_run_once(c->loop, 100);
        wk_xfer_tick(c->x, bench_now_ns());
    }
    double s = (bench_now_us() - t0) / 1e6;
    if (c->code != BATON_STATUS_OK) {
        fprintf(stderr, "pull of %u MiB failed: %s\n", mibs, c->message);
        return -1;
    }
    /* Spot checks: a wrong byte anywhere in a chunk would be a wrong
     * offset, which these catch. */
    for (uint64_t i = 0; i < src.nbytes; i += 4093)
        if (c->dst[i] != pattern(i)) {
            fprintf(stderr, "byte %" PRIu64 " of a %u MiB pull is wrong\n", i, mibs);
            return -1;
        }
    return s;
}

/* One floor read of MIBS MiB, sent as one message (PIECE 0) or as
 * messages of PIECE bytes, copied into the destination buffer when COPY
 * (what landing them in a pool costs); seconds, or -1. */
static double floor_once(consumer *c, uint32_t mibs, uint64_t piece, bool copy)
{
    uint64_t len = (uint64_t)mibs * MIB, rq[2] = {len, piece};
    double t0 = bench_now_us();
    if (zmq_send(c->floor, rq, sizeof(rq), 0) != sizeof(rq))
        return -1;
    uint64_t got = 0;
    int ok = 1;
    while (got < len) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, c->floor, 0) < 0 || zmq_msg_size(&m) == 0) {
            zmq_msg_close(&m);
            return -1;
        }
        const uint8_t *b = zmq_msg_data(&m);
        ok &= b[0] == pattern(got);
        if (copy && got + zmq_msg_size(&m) <= POOL_BYTES)
            memcpy(c->dst + got, b, zmq_msg_size(&m));
        got += zmq_msg_size(&m);
        zmq_msg_close(&m);
    }
    double s = (bench_now_us() - t0) / 1e6;
    return ok && got == len ? s : -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    bench_opts o;
    bench_opts_parse(&o, "bench_xhost", argc, argv);
    const char *role = getenv("BATON_XHOST_ROLE");
    if (role && strcmp(role, "producer") == 0)
        return producer_main(-1);
    if (role && strcmp(role, "consumer") != 0 && strcmp(role, "both") != 0) {
        fprintf(stderr, "BATON_XHOST_ROLE must be both, producer or consumer\n");
        return 2;
    }
    bool fork_producer = !role || strcmp(role, "both") == 0;
    char ep[300] = "", fep[300] = "";
    pid_t child = 0;
    if (fork_producer) {
        int pfd[2];
        if (pipe(pfd) != 0)
            return 1;
        int wr = pfd[1];
        if ((child = bench_spawn(producer_child, &wr)) < 0)
            return 1;
        close(pfd[1]);
        char buf[700];
        size_t got = 0;
        ssize_t n;
        while (got < sizeof(buf) - 1 && (n = read(pfd[0], buf + got, sizeof(buf) - 1 - got)) > 0)
            got += (size_t)n;
        buf[got] = 0;
        close(pfd[0]);
        if (sscanf(buf, "%299s %299s", ep, fep) != 2) {
            fprintf(stderr, "the producer did not start\n");
            bench_reap(child);
            return 1;
        }
    }
    const char *cep = getenv("BATON_XHOST_CONNECT"), *cfep = getenv("BATON_XHOST_FLOOR_CONNECT");
    if (cep)
        snprintf(ep, sizeof(ep), "%s", cep);
    if (cfep)
        snprintf(fep, sizeof(fep), "%s", cfep);
    if (!*ep || !*fep) {
        fprintf(stderr, "consumer: set BATON_XHOST_CONNECT and BATON_XHOST_FLOOR_CONNECT\n");
        return 2;
    }

    static const wk_xfer_ops ops = {cons_pin, cons_unpin, cons_done};
    consumer c = {0};
    char err[256];
    int status = 1;
    c.ctx = zmq_ctx_new();
    if (!(c.dst = malloc(POOL_BYTES)))
        goto out;
    memset(c.dst, 0, POOL_BYTES);
    bool curve = curve_on();
    bt_curve_keypair pk, ck;
    if (curve && (curve_pair(1, &pk) != 0 || curve_pair(101, &ck) != 0)) {
        fprintf(stderr, "consumer: no CURVE in this libzmq\n");
        goto out;
    }
    if (!(c.loop = evloop_create()) ||
        wk_xfer_create(c.ctx, c.loop, NULL, curve ? &ck : NULL, -1, &ops, NULL, &c.x, err,
                       sizeof(err)) != 0 ||
        wk_xfer_peer_update(c.x, 0, "producer", ep, 1, true) != 0 ||
        (curve && wk_xfer_peer_key(c.x, 0, pk.public_z85) != 0)) {
        fprintf(stderr, "consumer: %s\n", err);
        goto out;
    }
    int zero = 0;
    c.floor = zmq_socket(c.ctx, ZMQ_DEALER);
    if (!c.floor || (curve && bt_curve_apply_client(c.floor, &ck, pk.public_z85) != 0) ||
        zmq_setsockopt(c.floor, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(c.floor, ZMQ_RCVHWM, &zero, sizeof(zero)) != 0 ||
        zmq_connect(c.floor, fep) != 0) {
        fprintf(stderr, "consumer: floor: %s\n", zmq_strerror(zmq_errno()));
        goto out;
    }
    char machine[256];
    bench_machine_line(machine, sizeof(machine));
    printf("== Cross-host hand-off throughput (%s)\n", machine);
    printf("pulls from %s, floor from %s; chunk %u MiB, window %u%s\n", ep, fep,
           WK_XFER_CHUNK_BYTES / MIB, WK_XFER_WINDOW, curve ? "; CURVE on every socket" : "");
    printf("floor 1: the tensor as one message; floor 4: as back-to-back 4 MiB messages;\n"
           "4+copy: floor 4 copied into a destination buffer as the pull must (diagnostic)\n");
    printf("%-8s %4s %10s %10s %10s %10s %8s %8s\n", "size", "runs", "baton", "floor 1",
           "floor 4", "4+copy", "ratio 1", "ratio 4");
    printf("%-8s %4s %10s %10s %10s %10s\n", "", "", "MB/s", "MB/s", "MB/s", "MB/s");
    double res[N_SIZES][6];
    /* Warm both paths: connections, page faults on the destination. */
    if (pull_once(&c, 16) < 0 || floor_once(&c, 16, 0, false) < 0 ||
        floor_once(&c, 16, 4 * MIB, false) < 0)
        goto out;
    for (int s = 0; s < N_SIZES; s++) {
        int runs = SIZES_MIB[s] >= 256 ? 5 : SIZES_MIB[s] >= 64 ? 9 : 21;
        if (o.quick)
            runs = runs / 4 + 1;
        double b[32], f[32], f4[32], f4c[32];
        for (int r = 0; r < runs; r++) {
            double bytes = SIZES_MIB[s] * (double)MIB;
            double tb = pull_once(&c, SIZES_MIB[s]);
            double tf = floor_once(&c, SIZES_MIB[s], 0, false);
            double tf4 = floor_once(&c, SIZES_MIB[s], 4 * MIB, false);
            double tf4c = floor_once(&c, SIZES_MIB[s], 4 * MIB, true);
            if (tb < 0 || tf < 0 || tf4 < 0 || tf4c < 0)
                goto out;
            b[r] = bytes / tb / 1e6;
            f[r] = bytes / tf / 1e6;
            f4[r] = bytes / tf4 / 1e6;
            f4c[r] = bytes / tf4c / 1e6;
        }
        res[s][0] = median(b, runs);
        res[s][1] = median(f, runs);
        res[s][2] = median(f4, runs);
        res[s][5] = median(f4c, runs);
        res[s][3] = res[s][0] / res[s][1];
        res[s][4] = res[s][0] / res[s][2];
        char name[16];
        snprintf(name, sizeof(name), "%u MiB", SIZES_MIB[s]);
        printf("%-8s %4d %10.0f %10.0f %10.0f %10.0f %7.2fx %7.2fx\n", name, runs, res[s][0],
               res[s][1], res[s][2], res[s][5], res[s][3], res[s][4]);
        fflush(stdout);
    }
    static const uint32_t chunks[] = {1, 2, 4, 8};
    static const uint32_t windows[] = {1, 2, 4, 8};
    double sweep[4][4];
    printf("\n64 MiB pulls by chunk size and window (median MB/s of %d):\n", o.quick ? 2 : 5);
    printf("%-10s", "chunk");
    for (int wi = 0; wi < 4; wi++)
        printf(" %9s%u", "window ", windows[wi]);
    printf("\n");
    for (int ci = 0; ci < 4; ci++) {
        printf("%-3u MiB    ", chunks[ci]);
        for (int wi = 0; wi < 4; wi++) {
            wk_xfer_set_tuning(c.x, chunks[ci] * MIB, windows[wi]);
            int runs = o.quick ? 2 : 5;
            double v[8];
            for (int r = 0; r < runs; r++) {
                double t = pull_once(&c, 64);
                if (t < 0)
                    goto out;
                v[r] = 64.0 * MIB / t / 1e6;
            }
            sweep[ci][wi] = median(v, runs);
            printf(" %10.0f", sweep[ci][wi]);
            fflush(stdout);
        }
        printf("\n");
    }
    wk_xfer_set_tuning(c.x, WK_XFER_CHUNK_BYTES, WK_XFER_WINDOW);
    FILE *jf = bench_json_open(&o);
    if (jf) {
        fprintf(jf, "{\n  \"benchmark\": \"xhost\",\n  ");
        bench_json_machine(jf);
        fprintf(jf, ",\n  \"endpoint\": \"%s\",\n  \"floor_endpoint\": \"%s\",\n  \"curve\": %s,\n", ep,
                fep, curve ? "true" : "false");
        fprintf(jf, "  \"chunk_bytes\": %u,\n  \"window\": %u,\n  \"sizes\": [\n",
                WK_XFER_CHUNK_BYTES, WK_XFER_WINDOW);
        for (int s = 0; s < N_SIZES; s++)
            fprintf(jf, "    {\"mib\": %u, \"baton_mbps\": %.1f, \"floor_one_message_mbps\": "
                    "%.1f, \"floor_4mib_messages_mbps\": %.1f, \"ratio_one_message\": %.3f, "
                    "\"ratio_4mib_messages\": %.3f, \"floor_4mib_messages_copied_mbps\": %.1f}%s\n",
                    SIZES_MIB[s], res[s][0], res[s][1], res[s][2], res[s][3], res[s][4],
                    res[s][5], s + 1 < N_SIZES ? "," : "");
        fprintf(jf, "  ],\n  \"sweep_64mib\": [\n");
        for (int ci = 0; ci < 4; ci++)
            for (int wi = 0; wi < 4; wi++)
                fprintf(jf, "    {\"chunk_mib\": %u, \"window\": %u, \"mbps\": %.1f}%s\n",
                        chunks[ci], windows[wi], sweep[ci][wi],
                        ci == 3 && wi == 3 ? "" : ",");
        fprintf(jf, "  ]\n}\n");
        fclose(jf);
        printf("\nwrote %s\n", o.json);
    }
    status = 0;
out:
    if (c.floor)
        zmq_close(c.floor);
    wk_xfer_close(c.x);
    zmq_ctx_term(c.ctx);
    wk_xfer_destroy(c.x);
    evloop_destroy(c.loop);
    free(c.dst);
    if (child > 0)
        bench_reap(child);
    return status;
}
