/* Dispatch round trip: a one-node request through batond and one CPU
 * worker, against a floor built from the same libraries (floor.h): a
 * conductor that parses the ClientMessage and forwards a Dispatch, a worker
 * that parses it and answers a Done, each in its own process as batond and
 * baton-worker are, the same ipc:// transport and protobuf-c messages, and
 * the same client (the C client library) on top.
 *
 * Measured, each three times with the runs of every row interleaved and the
 * median of the three reported: (a) sequential latency over N requests sent
 * one at a time; (b) throughput with K requests kept in flight on one
 * DEALER.  Two diagnostic rows split baton's cost: baton's `tick` graph (a
 * node with no client input, so nothing to place in a pool), and the floor
 * exchanging baton's own messages for such a request (Put, Placed,
 * Dispatch, Done, SessionClose, Release).  The daemon's per-request timings
 * (total_us, queue_us, exec_us) and each process's CPU time per request
 * (/proc schedstat) say where the rest goes.  See README.md. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "baton/client.h"
#include "tests/bench/floor.h"
#include "tests/bench/util.h"

#define SEQ_N 2000        /* sequential requests per run */
#define SEQ_WARMUP 200    /* unmeasured requests before each run */
#define PIPE_K 32         /* requests in flight in the pipelined runs */
#define PIPE_SECONDS 3.0  /* measured window of a pipelined run */
#define PIPE_WARMUP 0.5   /* seconds of load before the window opens */
#define RUNS 3            /* repetitions; the median is reported */
#define N_TARGETS 4       /* rows: baton, floor, and two diagnostic rows */

/* Process roles whose CPU time is accounted. */
enum { ROLE_CLIENT, ROLE_CONDUCTOR, ROLE_WORKER, ROLES };
static const char *const ROLE_NAMES[ROLES] = {"client", "conductor", "worker"};

/* ======================================================================== */
/* The client side: the same code drives baton and the floor                */
/* ======================================================================== */

typedef struct target {
    const char *label;     /* row name in the table */
    const char *key;       /* JSON key */
    const char *graph;     /* graph the request names */
    bool input;            /* sends the 16-byte I32 input x (and expects it back) */
    bool floor;            /* served by the floor, not batond */
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

/* Baton's CPU per request over the floor's for ROLE, sequential or
 * pipelined (medians of the runs; rows 0 and 1). */
static double cpu_ratio(target *tg, int role, bool pipelined)
{
    double b = med(pipelined ? tg[0].pipe_cpu[role] : tg[0].seq_cpu[role]);
    double f = med(pipelined ? tg[1].pipe_cpu[role] : tg[1].seq_cpu[role]);
    return f > 0 ? b / f : 0;
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
    bench_floor fl;
    if (bench_floor_start(&fl) != 0)
        return 1;
    bench_floor_args fa = fl.a;
    pid_t fcond = fl.conductor, fwork = fl.worker;
    bench_daemon d;
    int rc = 1;
    if (bench_daemon_start(&d, &o, "roundtrip.yaml", NULL) != 0) {
        bench_floor_stop(&fl);
        return 1;
    }

    /* Rows 0 and 1 are judged; 2 and 3 explain the difference. */
    target tg[N_TARGETS] = {
        {.label = "baton (echo, 16 B input)", .key = "baton", .graph = "echo", .input = true},
        {.label = "floor", .key = "floor", .graph = "echo", .input = true, .floor = true},
        {.label = "  baton, no input (tick)", .key = "baton_no_input", .graph = "tick",
         .input = false},
        {.label = "  floor, baton's messages", .key = "floor_baton_messages", .graph = "pattern",
         .input = true, .floor = true},
    };
    if (bench_wait_ready(fa.front, 10000) != 0) {
        fprintf(stderr, "roundtrip: the floor did not come up\n");
        goto out;
    }
    for (int i = 0; i < N_TARGETS; i++) {
        snprintf(tg[i].endpoint, sizeof(tg[i].endpoint), "%s", tg[i].floor ? fa.front : d.endpoint);
        if (baton_client_create(tg[i].endpoint, &tg[i].client) != 0)
            goto out;
        tg[i].pids[ROLE_CLIENT][0] = getpid();
        tg[i].n_pids[ROLE_CLIENT] = 1;
        tg[i].pids[ROLE_CONDUCTOR][0] = tg[i].floor ? fcond : d.pid;
        tg[i].n_pids[ROLE_CONDUCTOR] = 1;
        if (tg[i].floor) {
            tg[i].pids[ROLE_WORKER][0] = fwork;
            tg[i].n_pids[ROLE_WORKER] = 1;
        } else {
            tg[i].n_pids[ROLE_WORKER] = bench_children(d.pid, tg[i].pids[ROLE_WORKER], 8);
        }
    }

    fprintf(stderr, "roundtrip: sequential, %d x %d requests per target...\n", runs, seq_n);
    for (int r = 0; r < runs; r++)
        for (int i = 0; i < N_TARGETS; i++)
            if (run_sequential(&tg[i], seq_n, SEQ_WARMUP, r) != 0)
                goto out;
    fprintf(stderr, "roundtrip: pipelined, K=%d, %d x %.1f s per target...\n", PIPE_K, runs,
            pipe_s);
    for (int r = 0; r < runs; r++)
        for (int i = 0; i < N_TARGETS; i++)
            if (run_pipelined(&tg[i], PIPE_K, pipe_s, PIPE_WARMUP, r) != 0)
                goto out;

    char machine[512];
    bench_machine_line(machine, sizeof(machine));
    double p50_ratio = med(tg[0].p50) / med(tg[1].p50);
    double rps_ratio = med(tg[0].rps) / med(tg[1].rps);
    printf("\n== Dispatch round trip (%s)\n", machine);
    printf("one node (echo) on one CPU worker, 16-byte I32 input; sequential: %d requests x %d "
           "runs;\npipelined: K=%d in flight on one DEALER, %.1f s x %d runs; medians of the "
           "runs\n\n",
           seq_n, runs, PIPE_K, pipe_s, runs);
    printf("%-30s %9s %9s %9s %11s\n", "", "p50 us", "p99 us", "mean us", "req/s (K=32)");
    for (int i = 0; i < N_TARGETS; i++)
        printf("%-30s %9.1f %9.1f %9.1f %11.0f\n", tg[i].label, med(tg[i].p50), med(tg[i].p99),
               med(tg[i].mean), med(tg[i].rps));
    printf("\nbaton / floor: p50 %.2fx (target <= 1.2x: %s), throughput %.2fx (target >= 0.8x: "
           "%s)\n",
           p50_ratio, verdict(p50_ratio <= 1.2), rps_ratio, verdict(rps_ratio >= 0.8));
    printf("\nwhere a sequential request's time goes (medians, us):\n");
    printf("%-30s %12s %14s %9s %9s\n", "", "client side", "conductor +", "worker", "worker");
    printf("%-30s %12s %14s %9s %9s\n", "", "+ front hop", "worker hops", "queue", "exec");
    for (int i = 0; i < N_TARGETS; i++)
        printf("%-30s %12.1f %14.1f %9.1f %9.1f\n", tg[i].label, med(tg[i].client_us),
               med(tg[i].server_us), med(tg[i].queue_us), med(tg[i].exec_us));
    printf("(client side = latency seen by the client - the server's total_us; conductor + "
           "worker hops =\n total_us - the worker's queue_us - exec_us: the conductor's work and "
           "every conductor<->worker message)\n");
    printf("\np50 decomposition, us: floor %.1f; + baton's messages sent one ZeroMQ message each "
           "(Put, Placed,\nDispatch, Done, then SessionClose and Release) %+.1f; + baton's own code, "
           "threads and batching %+.1f = baton %.1f\n",
           med(tg[1].p50), med(tg[3].p50) - med(tg[1].p50), med(tg[0].p50) - med(tg[3].p50),
           med(tg[0].p50));
    printf("placing the input in baton (echo p50 - tick p50): %.1f us\n",
           med(tg[0].p50) - med(tg[2].p50));
    printf("\nCPU time per request, us (all threads of each process, from /proc schedstat; "
           "medians):\n");
    printf("%-30s %29s   %29s\n", "", "-------- sequential --------",
           "------ pipelined K=32 ------");
    printf("%-30s %7s %7s %7s %6s   %7s %7s %7s %6s\n", "", "client", "conduct", "worker",
           "ctxsw", "client", "conduct", "worker", "ctxsw");
    for (int i = 0; i < N_TARGETS; i++) {
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
    double cs_ratio = cpu_ratio(tg, ROLE_CONDUCTOR, false), cp_ratio = cpu_ratio(tg, ROLE_CONDUCTOR, true);
    double ws_ratio = cpu_ratio(tg, ROLE_WORKER, false), wp_ratio = cpu_ratio(tg, ROLE_WORKER, true);
    printf("baton / floor CPU per request: conductor %.2fx sequential, %.2fx pipelined (target <= "
           "1.3x: %s, %s);\n  worker %.2fx sequential, %.2fx pipelined (target <= 2x: %s, %s)\n",
           cs_ratio, cp_ratio, verdict(cs_ratio <= 1.3), verdict(cp_ratio <= 1.3), ws_ratio,
           wp_ratio, verdict(ws_ratio <= 2), verdict(wp_ratio <= 2));

    FILE *f = bench_json_open(&o);
    if (f) {
        fprintf(f, "{\n  \"benchmark\": \"roundtrip\",\n  ");
        bench_json_machine(f);
        fprintf(f, ",\n  \"params\": {\"sequential_n\": %d, \"warmup\": %d, \"pipeline_k\": %d, "
                "\"pipeline_seconds\": %.1f, \"runs\": %d, \"input_bytes\": %zu},\n",
                seq_n, SEQ_WARMUP, PIPE_K, pipe_s, runs, sizeof(INPUT));
        fprintf(f, "  \"targets\": {\n");
        for (int i = 0; i < N_TARGETS; i++) {
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
            fprintf(f, "}}%s\n", i + 1 < N_TARGETS ? "," : "");
        }
        fprintf(f, "  },\n  \"ratios\": {\"p50_baton_over_floor\": %.3f, "
                "\"rps_baton_over_floor\": %.3f},\n",
                p50_ratio, rps_ratio);
        fprintf(f, "  \"cpu_ratios\": {\"conductor_sequential\": %.3f, \"conductor_pipelined\": "
                "%.3f, \"worker_sequential\": %.3f, \"worker_pipelined\": %.3f},\n",
                cs_ratio, cp_ratio, ws_ratio, wp_ratio);
        fprintf(f, "  \"goals\": {\"p50_ratio_max\": 1.2, \"p50_met\": %s, \"rps_ratio_min\": 0.8, "
                "\"rps_met\": %s, \"conductor_cpu_ratio_max\": 1.3, \"worker_cpu_ratio_max\": 2}\n}\n",
                p50_ratio <= 1.2 ? "true" : "false", rps_ratio >= 0.8 ? "true" : "false");
        fclose(f);
        printf("wrote %s\n", o.json);
    }
    rc = 0;
out:
    for (int i = 0; i < N_TARGETS; i++)
        baton_client_destroy(tg[i].client);
    bench_daemon_stop(&d);
    bench_floor_stop(&fl);
    return rc;
}
