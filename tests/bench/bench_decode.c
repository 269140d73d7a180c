/* Decode loop speculation: loop iterations per second of a no-op decode
 * step, with a speculation window of 8 against none.
 *
 * The graph (configs/decode-spec*.yaml): start (echo) → loop of max_iters
 * 512 around one `async` counter node that feeds its `state` back to itself
 * and streams `tok` (its iteration) to the client.  Without a window every
 * iteration is a conductor→worker→conductor round trip: the conductor sees
 * iteration i complete, then dispatches i+1.  With one, the worker chains
 * i+1 itself as soon as i is done and the conductor only follows (a
 * speculation window), so an iteration costs the worker's own turn-around.
 *
 * Two daemons, identical but for speculation_window (8 and 0), run side by
 * side; their runs are interleaved so both see the same machine.  Three
 * more, with windows of 16, 32 and 64, are diagnostic rows: they show what
 * bounds the rate at 8 (a window that is used up before the conductor's
 * extension comes back is a wait; README.md).  Every run
 * checks what it measures: the streamed tokens must be exactly 0..N-1, in
 * order, with seq 0..N-1, then one OK response. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "baton/client.h"
#include "tests/bench/floor.h"
#include "tests/bench/util.h"

#define ITERS 512        /* the loop's max_iters in the configs */
#define RUNS 11          /* single-request runs per daemon; the median is reported */
#define CONC 4           /* requests in flight in the concurrent runs */
#define CONC_RUNS 5      /* concurrent runs per daemon */

typedef struct mode {
    const char *label;     /* row name */
    const char *key;       /* JSON key */
    const char *config;    /* config template */
    const char *subst[3];  /* a replacement in it (the window), NULL-terminated */
    int window;            /* its speculation_window */
    bool diagnostic;       /* a row that explains, not one the target is judged on */
    bench_daemon d;
    baton_client *client;
    pid_t worker;          /* the daemon's worker (CPU accounting) */
    double single[RUNS];   /* iterations per second, one request */
    double first_ms[RUNS]; /* send to first token, ms */
    double conc[CONC_RUNS]; /* iterations per second, CONC requests together */
    double cpu_cond[RUNS], cpu_work[RUNS]; /* CPU us per iteration, one request */
    double msgs[RUNS], zmqs[RUNS]; /* conductor<->worker messages per iteration, one request:
                                    * protocol messages and the ZeroMQ messages carrying them */
} mode;

/* The sum of every sample of the metric family NAME (both directions, every
 * worker) in the daemon's Stats text; -1 when it cannot be read. */
static double stat_sum(baton_client *c, const char *name)
{
    baton_client_event *ev = NULL;
    if (baton_client_stats(c, 10000, &ev) != 0 || !ev->text) {
        baton_client_event_free(ev);
        return -1;
    }
    double sum = 0;
    bool found = false;
    size_t n = strlen(name);
    for (const char *l = ev->text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, name, n) != 0 || l[n] != '{')
            continue;
        const char *v = strchr(l, '}');
        if (v) {
            sum += strtod(v + 1, NULL);
            found = true;
        }
    }
    baton_client_event_free(ev);
    /* A daemon without the counters (an older build): no figure. */
    return found ? sum : -1;
}

/* Both message counts of the conductor C talks to, into MSGS and ZMQS
 * (-1 each when it has no such counter). */
static void count_messages(baton_client *c, double *msgs, double *zmqs)
{
    *msgs = stat_sum(c, "baton_worker_messages_total");
    *zmqs = stat_sum(c, "baton_worker_zmq_messages_total");
}

/* One request's stream state while it runs. */
typedef struct stream {
    char id[16];
    uint64_t next;  /* the seq (and token) expected next */
    bool done;
} stream;

static int find_stream(stream *s, int n, const char *id)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s[i].id, id))
            return i;
    return -1;
}

/* Runs N requests together on M's handle until each has its response;
 * checks every token.  Returns the wall time in us, or -1 on a wrong answer;
 * *FIRST_US gets the time to the first token of any request. */
static double run_requests(mode *m, int n, double *first_us)
{
    stream st[CONC];
    baton_client_request *reqs[CONC] = {0};
    double t0 = 0, elapsed = -1;
    static const int32_t x[1] = {0};
    int64_t dims[1] = {1};
    for (int i = 0; i < n; i++) {
        snprintf(st[i].id, sizeof(st[i].id), "d%d", i);
        st[i].next = 0;
        st[i].done = false;
        if (baton_client_request_create("decode", st[i].id, &reqs[i]) != 0 ||
            baton_client_request_add_input(reqs[i], "x", BATON_CLIENT_DTYPE_I32, dims, 1, x,
                                           sizeof(x)) != 0)
            goto out;
        baton_client_request_set_stream(reqs[i], true);
    }
    *first_us = 0;
    t0 = bench_now_us();
    for (int i = 0; i < n; i++)
        if (baton_client_send(m->client, reqs[i]) != 0)
            goto out;
    for (int left = n; left > 0;) {
        baton_client_event *ev = NULL;
        int rc = baton_client_recv(m->client, 30000, &ev);
        if (rc == BATON_CLIENT_EINTR)
            continue;
        if (rc != 0) {
            fprintf(stderr, "decode (%s): recv: %s\n", m->label, baton_client_strerror(rc));
            goto out;
        }
        int k = ev->request_id ? find_stream(st, n, ev->request_id) : -1;
        bool bad = k < 0;
        if (!bad && ev->kind == BATON_CLIENT_EVENT_CHUNK) {
            const baton_client_tensor *v = &ev->value;
            int32_t tok = -1;
            if (v->dtype == BATON_CLIENT_DTYPE_I32 && v->nbytes == 4)
                memcpy(&tok, v->data, 4);
            if (!*first_us)
                *first_us = bench_now_us() - t0;
            if (st[k].done || ev->seq != st[k].next || tok != (int32_t)st[k].next) {
                fprintf(stderr, "decode (%s): request %s: chunk seq %" PRIu64 " token %d, "
                        "expected %" PRIu64 "\n", m->label, st[k].id, ev->seq, tok, st[k].next);
                bad = true;
            }
            st[k].next++;
        } else if (!bad && ev->kind == BATON_CLIENT_EVENT_RESPONSE) {
            if (ev->code != BATON_CLIENT_CODE_OK || st[k].next != ITERS || st[k].done) {
                fprintf(stderr, "decode (%s): request %s ended %s (%s) after %" PRIu64
                        " tokens, expected OK after %d\n", m->label, st[k].id,
                        baton_client_code_name((int)ev->code), ev->message, st[k].next, ITERS);
                bad = true;
            }
            st[k].done = true;
            left--;
        }
        baton_client_event_free(ev);
        if (bad)
            goto out;
    }
    elapsed = bench_now_us() - t0;
out:
    for (int i = 0; i < n; i++)
        baton_client_request_destroy(reqs[i]);
    return elapsed;
}

static double med(const double *v, int n)
{
    return bench_median(v, (size_t)n);
}

/* V with three decimals into BUF, or null when it was not measured. */
static const char *json_num(char *buf, double v)
{
    if (isnan(v))
        return "null";
    snprintf(buf, 32, "%.3f", v);
    return buf;
}

static void json_runs(FILE *f, const char *name, const double *v, int n)
{
    fprintf(f, "\"%s\": [", name);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%.1f", i ? ", " : "", v[i]);
    fprintf(f, "]");
}

#define N_MODES 5
#define CHAT_TOKENS 64   /* max_iters of the chat's decode loop in the real-loop runs */
#define CHAT_RUNS 5
#define CHAT_MODEL "models/smollm2-135m-instruct-q4_1.gguf"

/* The real decode loop: per streamed token of the default chat. */
typedef struct chat_result {
    bool ran;
    char why[256];                /* why not, when !ran */
    int runs;
    double tokens[CHAT_RUNS];     /* streamed per request (prefill's + decode's) */
    double tok_s[CHAT_RUNS];      /* streamed tokens per second */
    double cpu_us[CHAT_RUNS];     /* conductor CPU per streamed token */
    double msgs[CHAT_RUNS], zmqs[CHAT_RUNS]; /* conductor<->worker messages per token */
    double floor_us[CHAT_RUNS];   /* the floor conductor's CPU per token at the same pace */
    double sw[CHAT_RUNS], floor_sw[CHAT_RUNS]; /* context switches per token, both */
} chat_result;

/* Reads the events of the one streamed request in flight on C until its
 * response; returns the number of chunks when the response is OK after
 * exactly WANT of them, else -1 (saying why, as WHAT). */
static int recv_stream(baton_client *c, int want, const char *what)
{
    for (int chunks = 0;;) {
        baton_client_event *ev = NULL;
        int rc = baton_client_recv(c, 120000, &ev);
        if (rc == BATON_CLIENT_EINTR)
            continue;
        if (rc != 0) {
            fprintf(stderr, "decode (%s): recv: %s\n", what, baton_client_strerror(rc));
            return -1;
        }
        if (ev->kind == BATON_CLIENT_EVENT_CHUNK) {
            chunks++;
        } else if (ev->kind == BATON_CLIENT_EVENT_RESPONSE) {
            bool ok = ev->code == BATON_CLIENT_CODE_OK && chunks == want;
            if (!ok)
                fprintf(stderr, "decode (%s): ended %s (%s) after %d tokens, expected OK "
                        "after %d\n", what, baton_client_code_name((int)ev->code), ev->message,
                        chunks, want);
            baton_client_event_free(ev);
            return ok ? chunks : -1;
        }
        baton_client_event_free(ev);
    }
}

/* One chat request of CHAT_TOKENS decode iterations, streamed; the number
 * of streamed tokens, or -1 on a wrong answer. */
static int chat_once(baton_client *c, const char *id, double *us)
{
    baton_client_request *r = NULL;
    int got = -1;
    if (baton_client_request_create("chat", id, &r) != 0 ||
        baton_client_request_add_text(r, "prompt", "Write a long story about a lighthouse.") !=
            0 ||
        baton_client_request_set_max_iters(r, "decode_loop", CHAT_TOKENS) != 0)
        goto out;
    baton_client_request_set_stream(r, true);
    double t0 = bench_now_us();
    if (baton_client_send(c, r) != 0)
        goto out;
    got = recv_stream(c, CHAT_TOKENS + 1, "chat");
    *us = bench_now_us() - t0;
out:
    baton_client_request_destroy(r);
    return got;
}

/* The floor of a streamed token (floor.h, graph "stream"): COUNT tokens,
 * one every INTERVAL_US, relayed by a bare ZeroMQ conductor.  Returns the
 * number of chunks, or -1 on a wrong answer. */
static int floor_stream_once(baton_client *c, uint32_t count, uint32_t interval_us)
{
    baton_client_request *r = NULL;
    int got = -1;
    const uint32_t x[2] = {count, interval_us};
    int64_t dims[1] = {2};
    if (baton_client_request_create("stream", "floor", &r) != 0 ||
        baton_client_request_add_input(r, "x", BATON_CLIENT_DTYPE_I32, dims, 1, x, sizeof(x)) !=
            0)
        goto out;
    baton_client_request_set_stream(r, true);
    if (baton_client_send(c, r) == 0)
        got = recv_stream(c, (int)count, "floor");
out:
    baton_client_request_destroy(r);
    return got;
}

/* Runs the default chat's decode loop: conductor CPU and messages per
 * streamed token; after each chat request, the floor streams as many
 * tokens at the same pace.  Skips (res->ran false, saying why) without the
 * model. */
static int run_chat(const bench_opts *o, const char *floor_ep, pid_t fcond, chat_result *res)
{
    memset(res, 0, sizeof(*res));
    if (access(CHAT_MODEL, R_OK) != 0) {
        snprintf(res->why, sizeof(res->why), "%s is missing (scripts/fetch-model.sh)",
                 CHAT_MODEL);
        return 0;
    }
    bench_daemon d;
    baton_client *c = NULL, *fc = NULL;
    int rc = -1;
    if (bench_daemon_start(&d, o, "decode-chat.yaml", NULL) != 0)
        return -1;
    if (baton_client_create(d.endpoint, &c) != 0 || bench_wait_ready(floor_ep, 10000) != 0 ||
        baton_client_create(floor_ep, &fc) != 0)
        goto out;
    double us;
    if (chat_once(c, "warm", &us) < 0) /* unmeasured: first-use costs */
        goto out;
    res->runs = o->quick ? 2 : CHAT_RUNS;
    fprintf(stderr, "decode: %d chat requests of %d decode iterations...\n", res->runs,
            CHAT_TOKENS);
    for (int r = 0; r < res->runs; r++) {
        char id[16];
        snprintf(id, sizeof(id), "chat%d", r);
        double m0, z0, m1, z1;
        bench_cpu c0, c1;
        count_messages(c, &m0, &z0);
        bench_cpu_read(d.pid, &c0);
        int n = chat_once(c, id, &us);
        bench_cpu_read(d.pid, &c1);
        count_messages(c, &m1, &z1);
        if (n <= 0)
            goto out;
        res->tokens[r] = n;
        res->tok_s[r] = n / (us / 1e6);
        res->cpu_us[r] = (double)(c1.cpu_ns - c0.cpu_ns) / 1e3 / n;
        res->sw[r] = (double)(c1.ctxsw - c0.ctxsw) / n;
        res->msgs[r] = m0 < 0 ? NAN : (m1 - m0) / n;
        res->zmqs[r] = z0 < 0 ? NAN : (z1 - z0) / n;
        bench_cpu_read(fcond, &c0);
        int fn = floor_stream_once(fc, (uint32_t)n, (uint32_t)(us / n));
        bench_cpu_read(fcond, &c1);
        if (fn != n) {
            fprintf(stderr, "decode (chat): the floor streamed %d tokens of %d\n", fn, n);
            goto out;
        }
        res->floor_us[r] = (double)(c1.cpu_ns - c0.cpu_ns) / 1e3 / n;
        res->floor_sw[r] = (double)(c1.ctxsw - c0.ctxsw) / n;
    }
    res->ran = true;
    rc = 0;
out:
    baton_client_destroy(fc);
    baton_client_destroy(c);
    bench_daemon_stop(&d);
    return rc;
}

int main(int argc, char **argv)
{
    bench_opts o;
    bench_opts_parse(&o, "decode", argc, argv);
    int runs = o.quick ? 2 : RUNS, conc_runs = o.quick ? 1 : CONC_RUNS;
    /* The floor of a streamed token (the chat's rows), forked before any
     * ZeroMQ context exists here. */
    bench_floor fl;
    if (bench_floor_start(&fl) != 0)
        return 1;
    mode md[N_MODES] = {
        {.label = "speculation_window: 8", .key = "window_8", .config = "decode-spec8.yaml",
         .window = 8},
        {.label = "speculation_window: 0", .key = "window_0", .config = "decode-spec0.yaml",
         .window = 0},
        {.label = "  (diagnostic) window 16", .key = "window_16", .config = "decode-spec8.yaml",
         .subst = {"speculation_window: 8", "speculation_window: 16"}, .window = 16,
         .diagnostic = true},
        {.label = "  (diagnostic) window 32", .key = "window_32", .config = "decode-spec8.yaml",
         .subst = {"speculation_window: 8", "speculation_window: 32"}, .window = 32,
         .diagnostic = true},
        {.label = "  (diagnostic) window 64", .key = "window_64", .config = "decode-spec8.yaml",
         .subst = {"speculation_window: 8", "speculation_window: 64"}, .window = 64,
         .diagnostic = true},
    };
    int rc = 1;
    for (int i = 0; i < N_MODES; i++) {
        if (bench_daemon_start(&md[i].d, &o, md[i].config, md[i].subst) != 0 ||
            baton_client_create(md[i].d.endpoint, &md[i].client) != 0)
            goto out;
        pid_t kids[4];
        md[i].worker = bench_children(md[i].d.pid, kids, 4) ? kids[0] : 0;
    }
    /* One unmeasured request each: first-use costs (page faults, lazily
     * built tables) stay out of the numbers. */
    for (int i = 0; i < N_MODES; i++) {
        double first;
        if (run_requests(&md[i], 1, &first) < 0)
            goto out;
    }
    fprintf(stderr, "decode: %d single-request runs and %d runs of %d requests per window...\n",
            runs, conc_runs, CONC);
    for (int r = 0; r < runs; r++)
        for (int i = 0; i < N_MODES; i++) {
            bench_cpu c0, c1, w0, w1;
            double m0, z0, m1, z1;
            count_messages(md[i].client, &m0, &z0);
            bench_cpu_read(md[i].d.pid, &c0);
            bench_cpu_read(md[i].worker, &w0);
            double first, us = run_requests(&md[i], 1, &first);
            if (us < 0)
                goto out;
            bench_cpu_read(md[i].d.pid, &c1);
            bench_cpu_read(md[i].worker, &w1);
            count_messages(md[i].client, &m1, &z1);
            md[i].msgs[r] = m0 < 0 ? NAN : (m1 - m0) / ITERS;
            md[i].zmqs[r] = z0 < 0 ? NAN : (z1 - z0) / ITERS;
            md[i].single[r] = ITERS / (us / 1e6);
            md[i].first_ms[r] = first / 1e3;
            md[i].cpu_cond[r] = (double)(c1.cpu_ns - c0.cpu_ns) / 1e3 / ITERS;
            md[i].cpu_work[r] = (double)(w1.cpu_ns - w0.cpu_ns) / 1e3 / ITERS;
        }
    for (int r = 0; r < conc_runs; r++)
        for (int i = 0; i < N_MODES; i++) {
            double first, us = run_requests(&md[i], CONC, &first);
            if (us < 0)
                goto out;
            md[i].conc[r] = CONC * ITERS / (us / 1e6);
        }

    char machine[512];
    bench_machine_line(machine, sizeof(machine));
    double ratio = med(md[0].single, runs) / med(md[1].single, runs);
    double cratio = med(md[0].conc, conc_runs) / med(md[1].conc, conc_runs);
    printf("\n== Decode loop speculation (%s)\n", machine);
    printf("start (echo) -> loop of %d iterations of one async no-op counter node streaming its "
           "token;\none CPU worker; every token checked (0..%d in order); medians of %d runs "
           "(single) and %d (x%d)\n\n",
           ITERS, ITERS - 1, runs, conc_runs, CONC);
    printf("%-26s %11s %8s %8s %14s %9s %9s %7s %7s\n", "", "iters/s", "us/iter", "vs 0",
           "iters/s x4 req", "conductor", "worker", "msgs", "zmq");
    printf("%-26s %11s %8s %8s %14s %9s %9s %7s %7s\n", "", "(1 request)", "", "",
           "(aggregate)", "CPU us/it", "CPU us/it", "/it", "/it");
    for (int i = 0; i < N_MODES; i++)
        printf("%-26s %11.0f %8.1f %7.1fx %14.0f %9.1f %9.1f %7.2f %7.2f\n", md[i].label,
               med(md[i].single, runs), 1e6 / med(md[i].single, runs),
               med(md[i].single, runs) / med(md[1].single, runs), med(md[i].conc, conc_runs),
               med(md[i].cpu_cond, runs), med(md[i].cpu_work, runs), med(md[i].msgs, runs),
               med(md[i].zmqs, runs));
    /* The windows in order (8, 16, 32, 64): iterations/s must not fall as
     * the window grows.  Medians of noisy runs: a fall within 5% is noise. */
    static const int by_window[] = {0, 2, 3, 4};
    bool mono1 = true, mono4 = true;
    for (int k = 1; k < 4; k++) {
        mono1 &= med(md[by_window[k]].single, runs) >= 0.95 * med(md[by_window[k - 1]].single, runs);
        mono4 &= med(md[by_window[k]].conc, conc_runs) >=
                 0.95 * med(md[by_window[k - 1]].conc, conc_runs);
    }
    double scale4 = med(md[0].conc, conc_runs) / med(md[0].single, runs);
    printf("\nwindow 8 / window 0: %.1fx with one request (target >= 8x: %s), %.1fx with %d "
           "requests\n"
           "iterations/s from window 8 to 64 never fall (5%% noise allowed): one request %s, "
           "%d requests %s\n"
           "%d requests / one at window 8: %.1fx (target >= 3x: %s)\n"
           "(CPU us/it: CPU time of the process, all threads, per iteration of the "
           "single-request runs; msgs/it, zmq/it: conductor<->worker protocol messages, both "
           "ways, and the ZeroMQ messages that carried them, per iteration)\n",
           ratio, ratio >= 8 ? "met" : "MISSED", cratio, CONC, mono1 ? "met" : "MISSED", CONC,
           mono4 ? "met" : "MISSED", CONC, scale4, scale4 >= 3 ? "met" : "MISSED");
    chat_result ch;
    if (run_chat(&o, fl.a.front, fl.conductor, &ch) != 0)
        goto out;
    if (!ch.ran) {
        printf("\nSKIP: real decode loop: %s\n", ch.why);
    } else {
        double cpu = med(ch.cpu_us, ch.runs), msgs = med(ch.msgs, ch.runs);
        printf("\n== A real decode loop: the default chat (SmolLM2-135M Q4_1, one CPU worker, "
               "2 threads),\n%d decode iterations per request, text streamed; medians of %d "
               "requests\n\n", CHAT_TOKENS, ch.runs);
        printf("streamed tokens per request   %6.0f\n", med(ch.tokens, ch.runs));
        printf("tokens/s                      %6.1f\n", med(ch.tok_s, ch.runs));
        double fcpu = med(ch.floor_us, ch.runs);
        printf("conductor CPU per token, us   %6.2f  (target <= 10: %s)\n", cpu,
               cpu <= 10 ? "met" : "MISSED");
        printf("  the floor's at the same pace %6.2f  (bare ZeroMQ relay of one message per "
               "token; baton %.2fx)\n", fcpu, cpu / fcpu);
        printf("context switches per token    %6.2f  (the floor's %.2f; all threads)\n",
               med(ch.sw, ch.runs), med(ch.floor_sw, ch.runs));
        printf("messages per token            %6.2f  (conductor<->worker, both ways; target "
               "<= 2: %s)\n", msgs, isnan(msgs) ? "n/a: the daemon does not count them"
                                   : msgs <= 2 ? "met" : "MISSED");
        printf("ZeroMQ messages per token     %6.2f\n", med(ch.zmqs, ch.runs));
    }

    FILE *f = bench_json_open(&o);
    if (f) {
        fprintf(f, "{\n  \"benchmark\": \"decode\",\n  ");
        bench_json_machine(f);
        char b1[32], b2[32];
        fprintf(f, ",\n  \"params\": {\"iterations\": %d, \"runs\": %d, \"concurrent\": %d, "
                "\"concurrent_runs\": %d},\n  \"modes\": {\n", ITERS, runs, CONC, conc_runs);
        for (int i = 0; i < N_MODES; i++) {
            mode *m = &md[i];
            fprintf(f, "    \"%s\": {\"speculation_window\": %d, \"diagnostic\": %s, "
                    "\"iters_per_s\": %.0f, \"us_per_iter\": %.2f, \"first_token_ms\": %.3f, "
                    "\"iters_per_s_x%d\": %.0f, \"conductor_cpu_us_per_iter\": %.2f, "
                    "\"worker_cpu_us_per_iter\": %.2f, \"messages_per_iter\": %s, "
                    "\"zmq_messages_per_iter\": %s,\n      \"runs\": {",
                    m->key, m->window, m->diagnostic ? "true" : "false", med(m->single, runs),
                    1e6 / med(m->single, runs), med(m->first_ms, runs), CONC,
                    med(m->conc, conc_runs), med(m->cpu_cond, runs), med(m->cpu_work, runs),
                    json_num(b1, med(m->msgs, runs)), json_num(b2, med(m->zmqs, runs)));
            json_runs(f, "iters_per_s", m->single, runs);
            fprintf(f, ", ");
            json_runs(f, "iters_per_s_concurrent", m->conc, conc_runs);
            fprintf(f, "}}%s\n", i + 1 < N_MODES ? "," : "");
        }
        fprintf(f, "  },\n  \"ratio\": {\"single\": %.2f, \"concurrent\": %.2f, "
                "\"x%d_over_single_window_8\": %.2f},\n"
                "  \"goal\": {\"ratio_min\": 8, \"met\": %s, \"monotone_single\": %s, "
                "\"monotone_x%d\": %s, \"x%d_min\": 3, \"x%d_met\": %s},\n",
                ratio, cratio, CONC, scale4, ratio >= 8 ? "true" : "false",
                mono1 ? "true" : "false", CONC, mono4 ? "true" : "false", CONC, CONC,
                scale4 >= 3 ? "true" : "false");
        if (ch.ran)
            fprintf(f, "  \"chat\": {\"decode_iterations\": %d, \"runs\": %d, "
                    "\"tokens_per_request\": %.0f, \"tokens_per_s\": %.1f, "
                    "\"conductor_cpu_us_per_token\": %.2f, \"floor_cpu_us_per_token\": %.2f, "
                    "\"messages_per_token\": %s, \"zmq_messages_per_token\": %s},\n",
                    CHAT_TOKENS, ch.runs, med(ch.tokens, ch.runs), med(ch.tok_s, ch.runs),
                    med(ch.cpu_us, ch.runs), med(ch.floor_us, ch.runs), json_num(b1, med(ch.msgs, ch.runs)),
                    json_num(b2, med(ch.zmqs, ch.runs)));
        else
            fprintf(f, "  \"chat\": {\"skipped\": \"%s\"},\n", ch.why);
        fprintf(f, "  \"tokens_checked\": true\n}\n");
        fclose(f);
        printf("wrote %s\n", o.json);
    }
    rc = 0;
out:
    for (int i = 0; i < N_MODES; i++) {
        baton_client_destroy(md[i].client);
        bench_daemon_stop(&md[i].d);
    }
    bench_floor_stop(&fl);
    return rc;
}
