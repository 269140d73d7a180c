/* What CURVE costs on the one-node round trip: the same echo request
 * through batond over tcp:// on the loopback, once in plain text and once
 * with CURVE (a client key pair authorized by the daemon), in one run.
 *
 * Two daemons run side by side on configs/curve.yaml, which differ only in
 * the `curve:` keys; their workers stay on ipc://, so the difference is the
 * client socket's encryption and its handshake, which happens once per
 * connection and not per request.  Measured, with the runs of the two
 * interleaved and the median of RUNS reported: (a) sequential latency over
 * SEQ_N requests sent one at a time; (b) throughput with PIPE_K requests in
 * flight on one connection.  The figures that matter are the ratios, CURVE
 * over plain, taken in the same run: this machine is noisy and shared. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "baton/client.h"
#include "common/curve.h"
#include "tests/bench/util.h"

#define SEQ_N 2000
#define SEQ_WARMUP 200
#define PIPE_K 32
#define PIPE_SECONDS 3.0
#define RUNS 5

enum { T_PLAIN, T_CURVE, N_TARGETS };
static const char *const LABELS[N_TARGETS] = {"tcp, plain", "tcp, CURVE"};
static const char *const KEYS[N_TARGETS] = {"plain", "curve"};

typedef struct target {
    bench_daemon d;
    char endpoint[64];
    baton_client *client;
    double p50[RUNS], p99[RUNS], rps[RUNS];
} target;

static const int32_t INPUT[4] = {7, -1, 1 << 20, 42};

static int check(const baton_client_event *ev)
{
    if (ev->code != BATON_CLIENT_CODE_OK) {
        fprintf(stderr, "bench_curve: request %s ended %s: %s\n", ev->request_id,
                baton_client_code_name((int)ev->code), ev->message);
        return -1;
    }
    if (ev->n_outputs != 1 || ev->outputs[0].nbytes != sizeof(INPUT) ||
        memcmp(ev->outputs[0].data, INPUT, sizeof(INPUT)) != 0) {
        fprintf(stderr, "bench_curve: wrong output\n");
        return -1;
    }
    return 0;
}

static int recv_response(baton_client *c, baton_client_event **out)
{
    for (;;) {
        baton_client_event *ev = NULL;
        int rc = baton_client_recv(c, 20000, &ev);
        if (rc == BATON_CLIENT_EINTR)
            continue;
        if (rc != 0) {
            fprintf(stderr, "bench_curve: recv: %s\n", baton_client_strerror(rc));
            return -1;
        }
        if (ev->kind == BATON_CLIENT_EVENT_RESPONSE) {
            *out = ev;
            return 0;
        }
        baton_client_event_free(ev);
    }
}

static int make_request(const char *rid, baton_client_request **out)
{
    int64_t dims[1] = {4};
    baton_client_request *r = NULL;
    int rc = baton_client_request_create("echo", rid, &r);
    if (rc == 0)
        rc = baton_client_request_add_input(r, "x", BATON_CLIENT_DTYPE_I32, dims, 1, INPUT,
                                            sizeof(INPUT));
    if (rc != 0) {
        baton_client_request_destroy(r);
        return rc;
    }
    *out = r;
    return 0;
}

static int run_sequential(target *t, int n, int r)
{
    baton_client_request *req = NULL;
    double *lat = malloc(sizeof(double) * (size_t)n);
    int rc = lat && make_request("seq", &req) == 0 ? 0 : -1;
    for (int i = -SEQ_WARMUP; i < n && rc == 0; i++) {
        baton_client_event *ev = NULL;
        double t0 = bench_now_us();
        if (baton_client_send(t->client, req) != 0 || recv_response(t->client, &ev) != 0) {
            rc = -1;
            break;
        }
        if (i >= 0)
            lat[i] = bench_now_us() - t0;
        rc = check(ev);
        baton_client_event_free(ev);
    }
    if (rc == 0) {
        bench_sort(lat, (size_t)n);
        t->p50[r] = bench_quantile(lat, (size_t)n, 0.5);
        t->p99[r] = bench_quantile(lat, (size_t)n, 0.99);
    }
    free(lat);
    baton_client_request_destroy(req);
    return rc;
}

/* PIPE_K requests, each with its own id (ids must differ while in
 * flight), kept in flight for SECONDS: each response sends its request
 * again. */
static int run_pipelined(target *t, double seconds, int r)
{
    baton_client_request *reqs[PIPE_K] = {0};
    int rc = 0;
    for (int i = 0; i < PIPE_K && rc == 0; i++) {
        char rid[16];
        snprintf(rid, sizeof(rid), "p%d", i);
        rc = make_request(rid, &reqs[i]);
        if (rc == 0 && baton_client_send(t->client, reqs[i]) != 0)
            rc = -1;
    }
    long done = 0;
    double t0 = bench_now_us(), end = t0 + seconds * 1e6;
    while (rc == 0 && bench_now_us() < end) {
        baton_client_event *ev = NULL;
        if (recv_response(t->client, &ev) != 0) {
            rc = -1;
            break;
        }
        int slot = ev->request_id[0] == 'p' ? atoi(ev->request_id + 1) : -1;
        rc = slot >= 0 && slot < PIPE_K ? check(ev) : -1;
        baton_client_event_free(ev);
        done++;
        if (rc == 0 && baton_client_send(t->client, reqs[slot]) != 0)
            rc = -1;
    }
    double dt = bench_now_us() - t0;
    for (int i = 0; rc == 0 && i < PIPE_K; i++) { /* the last ones, unmeasured */
        baton_client_event *ev = NULL;
        if (recv_response(t->client, &ev) != 0)
            rc = -1;
        baton_client_event_free(ev);
    }
    t->rps[r] = dt > 0 ? (double)done / (dt / 1e6) : 0;
    for (int i = 0; i < PIPE_K; i++)
        baton_client_request_destroy(reqs[i]);
    return rc;
}

/* A port nobody listens on now (the kernel's pick for an ephemeral bind). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* Writes a key pair NAME into DIR as `batonctl keygen` does. */
static int keypair(const char *dir, const char *name, bt_curve_keypair *k)
{
    char err[256] = "";
    int rc = bt_curve_keypair_generate(k);
    if (rc == 0)
        rc = bt_curve_keypair_write(dir, name, k, err, sizeof(err));
    if (rc != 0)
        fprintf(stderr, "bench_curve: key pair %s: %s %s\n", name, bt_curve_strerror(rc), err);
    return rc;
}

static double median(const double *v)
{
    double s[RUNS];
    memcpy(s, v, sizeof(s));
    return bench_median(s, RUNS);
}

int main(int argc, char **argv)
{
    bench_opts o;
    bench_opts_parse(&o, "bench_curve", argc, argv);
    if (!bt_curve_available()) {
        printf("SKIP bench_curve: libzmq has no CURVE\n");
        return 0;
    }
    int seq_n = o.quick ? 200 : SEQ_N;
    double pipe_s = o.quick ? 0.5 : PIPE_SECONDS;
    /* Not under /tmp/baton-bench: the daemon's start rewrites that prefix. */
    char keys[] = "/tmp/baton-keys-XXXXXX";
    if (!mkdtemp(keys)) {
        perror("bench_curve: mkdtemp");
        return 1;
    }
    bt_curve_keypair server, client;
    char clients[300], curve[1200];
    FILE *f = NULL;
    target t[N_TARGETS];
    memset(t, 0, sizeof(t));
    int rc = 1;
    if (keypair(keys, "batond", &server) != 0 || keypair(keys, "client", &client) != 0)
        goto out;
    snprintf(clients, sizeof(clients), "%s/clients.txt", keys);
    f = fopen(clients, "w");
    if (!f || fprintf(f, "%s\n", client.public_z85) < 0 || fclose(f) != 0) {
        fprintf(stderr, "bench_curve: cannot write %s\n", clients);
        goto out;
    }
    snprintf(curve, sizeof(curve),
             "  curve:\n    secret_key: %s/batond.key\n    client_keys: %s\n", keys, clients);
    for (int k = 0; k < N_TARGETS; k++) {
        char port[16];
        snprintf(port, sizeof(port), "%d", free_port());
        snprintf(t[k].endpoint, sizeof(t[k].endpoint), "tcp://127.0.0.1:%s", port);
        const char *subst[] = {"@PORT@", port, "@CURVE@", k == T_CURVE ? curve : "", NULL};
        baton_client_options co = {0};
        if (k == T_CURVE) {
            co.server_public_key = server.public_z85;
            co.public_key = client.public_z85;
            co.secret_key = client.secret_z85;
        }
        if (bench_daemon_start_with(&t[k].d, &o, "curve.yaml", subst, t[k].endpoint, &co) != 0 ||
            baton_client_create_with(t[k].endpoint, &co, &t[k].client) != 0) {
            fprintf(stderr, "bench_curve: cannot start the %s daemon\n", KEYS[k]);
            goto out;
        }
    }
    /* The runs of the two alternate, so that a slow spell of the machine
     * falls on both. */
    for (int r = 0; r < RUNS; r++)
        for (int k = 0; k < N_TARGETS; k++)
            if (run_sequential(&t[k], seq_n, r) != 0 || run_pipelined(&t[k], pipe_s, r) != 0)
                goto out;
    char machine[256];
    bench_machine_line(machine, sizeof(machine));
    printf("CURVE on the one-node round trip (echo of 16 bytes, tcp:// loopback), median of %d "
           "interleaved runs\n%s\n\n", RUNS, machine);
    printf("| client socket | p50 (us) | p99 (us) | requests/s, %d in flight |\n", PIPE_K);
    printf("| --- | ---: | ---: | ---: |\n");
    for (int k = 0; k < N_TARGETS; k++)
        printf("| %s | %.1f | %.1f | %.0f |\n", LABELS[k], median(t[k].p50), median(t[k].p99),
               median(t[k].rps));
    double lat_ratio = median(t[T_CURVE].p50) / median(t[T_PLAIN].p50);
    double rps_ratio = median(t[T_CURVE].rps) / median(t[T_PLAIN].rps);
    printf("\nCURVE / plain: p50 latency %.2fx, throughput %.2fx\n", lat_ratio, rps_ratio);
    f = fopen(o.json, "w");
    if (!f) {
        fprintf(stderr, "bench_curve: cannot write %s\n", o.json);
        goto out;
    }
    fprintf(f, "{\n  \"benchmark\": \"curve\",\n  ");
    bench_json_machine(f);
    fprintf(f, ",\n  \"runs\": %d,\n  \"sequential_requests\": %d,\n  \"in_flight\": %d,\n", RUNS,
            seq_n, PIPE_K);
    for (int k = 0; k < N_TARGETS; k++)
        fprintf(f, "  \"%s\": {\"p50_us\": %.1f, \"p99_us\": %.1f, \"requests_per_s\": %.0f},\n",
                KEYS[k], median(t[k].p50), median(t[k].p99), median(t[k].rps));
    fprintf(f, "  \"curve_over_plain_p50\": %.3f,\n  \"curve_over_plain_throughput\": %.3f\n}\n",
            lat_ratio, rps_ratio);
    if (fclose(f) != 0)
        goto out;
    printf("wrote %s\n", o.json);
    rc = 0;
out:
    for (int k = 0; k < N_TARGETS; k++) {
        baton_client_destroy(t[k].client);
        if (t[k].d.pid)
            bench_daemon_stop(&t[k].d);
    }
    bt_curve_keypair_wipe(&server);
    bt_curve_keypair_wipe(&client);
    bench_rmtree(keys);
    return rc;
}
