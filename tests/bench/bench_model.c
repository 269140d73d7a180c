/* baton's CPU transformer serving against llama.cpp: the same model file
 * (models/smollm2-135m-instruct-q4_1.gguf, SmolLM2-135M Q4_1), the same
 * machine and the same thread count on both sides.
 *
 * baton is measured through the whole serving path: a batond started on
 * configs/model-cpu.yaml (the model of config/examples/chat-cpu.yaml on three
 * CPU workers: t1 with `threads: 1`, t2 with `threads: 2`, and mem with
 * `threads: 2` and a single cache slot), requests sent by the C client
 * library with their prompt as I32 token ids, and the generated token ids
 * streamed back, one chunk per token.  Each request sets the length of the
 * decode loop (max_iters of `decode_loop`), and the model's eos is a special
 * token that never follows the bench's prompts, so every request decodes
 * exactly the tokens it asks for.  Every stream is checked: seq in order, a
 * token id inside the vocabulary, one chunk from the prefill plus one per
 * decode step, then an OK response; a wrong answer ends the benchmark with a
 * non-zero status.  llama.cpp is measured by its own benchmark programs,
 * which scripts/build-llamacpp.sh builds into a cache outside the
 * repository; when that script fails (exit 2: PyPI unreachable) the baton
 * rows run alone and the table says why the llama.cpp columns are empty.
 *
 * Rows, at 2 threads unless the row says otherwise:
 *  1. Decode tok/s of one request after an 8-token prompt, at 1 thread (t1)
 *     and 2 threads (t2): of a 64-token generation, the chunks after the
 *     first over the time from the first chunk to the last, i.e. the decode
 *     steps over the time they took.  llama.cpp: llama-bench -p 0 -n 64
 *     -t 1,2 (tg64).
 *  2. Prefill tok/s of 64, 512 and 2048-token prompts (mem): prompt tokens
 *     over the time to first token as the client sees it, send to the
 *     prefill's token, which is the prefill plus one request's trip through
 *     the daemon (well under a millisecond; the prefill node's own exec_us is
 *     in the JSON).  The 2048-token sample is row 4's long request.
 *     llama.cpp: llama-bench -p 64,512,2048 -n 0.
 *  3. Aggregate decode tok/s of 4 and 16 concurrent requests (t2, max_batch
 *     16, so all of them share each decode step), 8-token prompts and 64
 *     tokens each: the decode tokens streamed while every request is
 *     decoding, from the last request's first token to the first request's
 *     last token, over that time.  llama.cpp: llama-batched-bench -npp 8
 *     -ntg 64 -npl 4,16, its S_TG (the batched decode phase alone).
 *  4. Decode tok/s after a 2048-token prompt and after an 8-token one, 64
 *     tokens each (mem), and the ratio of the two: what a long context costs
 *     a decode step.  llama.cpp: llama-bench -p 0 -n 64 -d 0,2048.  baton's
 *     cache is q8_0, as in chat-cpu.yaml; llama.cpp's is its default, f16.
 *     The same two on mem16, whose cache is f16 (baton only), right after
 *     them.
 *  5. Resident memory: the peak resident set (VmHWM) of the worker mem after
 *     row 4, a model holding one sequence of max_seq 4096 positions, against
 *     the peak resident set (wait4's ru_maxrss) of llama-batched-bench -c
 *     4096 -npp 2048 -ntg 64 -npl 1: one sequence in a 4096-position context
 *     doing the same work, each process with the model mapped from the same
 *     file.  That is the fairest pair at hand: the same context size and the
 *     same requests, each side with its own KV layout (llama.cpp: f16,
 *     allocated and cleared in full at start; baton: q8_0, pages touched as
 *     positions are written).  batond's own memory is printed beside it.
 *  6. Decode tok/s of one request alone in cache slot 3 (t2, baton only):
 *     four requests go together, the first three taking slots 0-2 and
 *     stopping after 8 tokens, the fourth decoding 8 + 64 tokens; its
 *     steps after the others' last token, over the time they took.  Beside
 *     row 1's 2-thread figure it shows what a request's slot costs: a
 *     decode step computes only the rows of the sequences in it, so the
 *     ratio (printed under the table) should be near 1.
 *  7. The cost of batch_invariant (baton only): rows 1 (2 threads) and 3 (16
 *     requests) again on inv, the worker t2 with `batch_invariant: true`
 *     (every product row and attention query computed alone, so a token's
 *     bits do not depend on what runs beside it), right after row 3 in the
 *     same turn; the ratios to rows 1 and 3 are printed under the table.
 *
 * Every row runs 3 rounds; in each, baton and llama.cpp take turns, the
 * order flipping every round, so that both see the same machine; the table
 * gives the min and median of the rounds and the ratio of the medians,
 * baton / llama.cpp.  baton gets one unmeasured request on each worker
 * first; llama-bench and llama-batched-bench make their own warm-up run each
 * time they start.  Prompts are random ordinary token ids from a fixed seed
 * (the special tokens 0..16 excluded); llama.cpp's programs make their own
 * random prompts of the same lengths.  Since this machine is shared, the CPU
 * other processes use during each turn is measured (/proc/stat less the
 * benchmark's own processes) and shown per row; a turn waits (a while) for
 * them to go quiet before it starts, and a turn they disturbed is measured
 * again (within a time budget).  --quick: one round, prompts of 64/256/512
 * tokens, a 512-token long context, 32 decoded tokens. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "baton/client.h"
#include "tests/bench/util.h"

#define MODEL_PATH "models/smollm2-135m-instruct-q4_1.gguf"
#define VOCAB 49152         /* the model's vocabulary */
#define FIRST_ORDINARY 17   /* ids 0..16 are its special tokens (<|endoftext|>..<empty_output>) */
#define LLAMACPP_SCRIPT "scripts/build-llamacpp.sh"
#define MAX_ROUNDS 3
#define SHORT_PROMPT 8      /* the prompt of the decode rows */
#define CTX_SIZE 4096       /* max_seq in model-cpu.yaml; llama.cpp's context for row 5 */
#define N_PP 3              /* prefill lengths */
#define N_CONC 2            /* concurrency levels */
#define MAX_CONC 16
#define MAX_PROMPT 2048
#define RECV_TIMEOUT_MS 600000 /* a 2048-token prefill may take a minute or more */
#define LOOP "decode_loop"  /* the loop a request shortens */
#define QUIET_CPU 0.15      /* other processes' CPU (in CPUs) below which a turn may start */
#define QUIET_WAIT_S 60     /* the longest wait for that before one turn... */
#define QUIET_TOTAL_S 120   /* ...and in all */
#define REDO_CPU 0.3        /* a turn during which others used more is measured again... */
#define REDO_TOTAL_S 120    /* ...while the turns thrown away took less than this in all */

/* ---- rows ---------------------------------------------------------------- */

enum {
    R_DEC_T1,
    R_DEC_T2,
    R_PP0,                    /* R_PP0 + i: prefill of pp[i] */
    R_AGG0 = R_PP0 + N_PP,    /* R_AGG0 + i: conc[i] requests */
    R_DEC_SHORT = R_AGG0 + N_CONC,
    R_DEC_LONG,
    R_DEC_SHORT16,            /* row 4 with an f16 KV cache (baton only) */
    R_DEC_LONG16,
    R_MEM,
    R_DEC_SLOT3,              /* row 6 (baton only) */
    R_DEC_INV,                /* row 7: row 1 (2 threads) with batch_invariant */
    R_AGG_INV,                /* row 7: row 3's 16 requests with batch_invariant */
    N_ROWS
};
#define SLOT_SHORT_ITERS 8  /* row 6: the decode steps of the requests in slots 0-2 */

typedef struct row {
    char label[64];
    char key[32];
    const char *unit;
    double baton[MAX_ROUNDS];
    int nb;
    double llama[MAX_ROUNDS];
    int nl;
    double others;          /* the most CPU other processes used in a turn that
                               gave this row a sample, in CPUs */
    double others_round[MAX_ROUNDS]; /* that, per round */
} row;

/* The lengths a run uses (shorter with --quick). */
typedef struct params {
    int rounds;
    int n_gen;              /* decoded tokens per request */
    int pp[N_PP];           /* prefill rows' prompt lengths */
    int depth;              /* the long context of rows 4 and 5: the longest prompt */
    int conc[N_CONC];       /* concurrent requests of row 3 */
} params;

/* ---- the llama.cpp side -------------------------------------------------- */

typedef struct llama {
    bool ok;                /* the binaries are there */
    char bin[512];          /* their folder */
    char why[768];          /* why not, when !ok */
    char err_log[300];      /* where their stderr goes */
    double wall_s;          /* time spent in llama.cpp's runs */
} llama;

/* A finished child process. */
typedef struct child_run {
    char *out;              /* its stdout, NUL-terminated (malloc'd) */
    int status;             /* its exit status; -1: killed by a signal */
    long maxrss_kb;         /* peak resident set (wait4) */
    double wall_s;
} child_run;

/* Runs ARGV[0] with ARGV, its stdout captured into CR->out and its stderr
 * into ERR_PATH (NULL: this process's stderr), and waits for it.  The child
 * gets SIGTERM if this process dies first.  Returns 0 when it ran (whatever
 * its status), -1 when it could not be started. */
static int run_child(char *const argv[], const char *err_path, child_run *cr)
{
    memset(cr, 0, sizeof(*cr));
    cr->status = -1;
    int pfd[2];
    if (pipe(pfd) != 0) {
        fprintf(stderr, "bench_model: pipe: %s\n", strerror(errno));
        return -1;
    }
    double t0 = bench_now_us();
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "bench_model: fork: %s\n", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        /* A llama.cpp run that outlived the benchmark would keep both CPUs. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(1);
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        if (err_path) {
            int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) {
                dup2(fd, 2);
                close(fd);
            }
        }
        execv(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (buf && n + 1024 + 1 > cap) {
            /* Out of memory: the rest is drained and dropped. */
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                free(buf);
            else
                cap *= 2;
            buf = nb;
        }
        char sink[1024];
        ssize_t r = read(pfd[0], buf ? buf + n : sink, 1024);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += buf ? (size_t)r : 0;
    }
    close(pfd[0]);
    if (buf)
        buf[n] = '\0';
    cr->out = buf;
    int st = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof(ru));
    pid_t w;
    do
        w = wait4(pid, &st, 0, &ru);
    while (w < 0 && errno == EINTR);
    cr->status = w == pid && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    cr->maxrss_kb = ru.ru_maxrss;
    cr->wall_s = (bench_now_us() - t0) / 1e6;
    return 0;
}

/* Runs scripts/build-llamacpp.sh (its progress goes to stderr) and checks
 * the binaries it names. */
static void llama_find(llama *L)
{
    char *argv[] = {(char *)LLAMACPP_SCRIPT, NULL};
    child_run cr;
    fprintf(stderr, "bench_model: %s (builds llama.cpp once, about 10 minutes; then "
            "reuses it)...\n", LLAMACPP_SCRIPT);
    if (run_child(argv, NULL, &cr) != 0) {
        snprintf(L->why, sizeof(L->why), "%s could not be started", LLAMACPP_SCRIPT);
        return;
    }
    if (cr.status != 0) {
        snprintf(L->why, sizeof(L->why), "%s exited %d%s", LLAMACPP_SCRIPT, cr.status,
                 cr.status == 2 ? " (PyPI unreachable: llama.cpp's source cannot be fetched)"
                                : " (its build failed; see its messages above)");
        free(cr.out);
        return;
    }
    const char *out = cr.out ? cr.out : "";
    /* The bin folder is its last line of output. */
    size_t len = strlen(out);
    while (len && (out[len - 1] == '\n' || out[len - 1] == '\r'))
        len--;
    size_t start = len;
    while (start && out[start - 1] != '\n')
        start--;
    snprintf(L->bin, sizeof(L->bin), "%.*s", (int)(len - start), out + start);
    free(cr.out);
    static const char *const need[] = {"llama-bench", "llama-batched-bench"};
    for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
        char p[700];
        snprintf(p, sizeof(p), "%s/%s", L->bin, need[i]);
        if (access(p, X_OK) != 0) {
            snprintf(L->why, sizeof(L->why), "%s names %s, which has no %s", LLAMACPP_SCRIPT,
                     L->bin, need[i]);
            return;
        }
    }
    L->ok = true;
}

/* The number after "KEY": in one JSON line (llama.cpp's jsonl), or NAN. */
static double json_num(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p)
        return NAN;
    char *end;
    double v = strtod(p + strlen(pat), &end);
    return end == p + strlen(pat) ? NAN : v;
}

/* Prints the end of the file PATH to stderr (a failed run's messages). */
static void print_tail(const char *path)
{
    FILE *f = *path ? fopen(path, "r") : NULL;
    if (!f)
        return;
    char buf[2048];
    if (fseek(f, 0, SEEK_END) == 0) {
        long end = ftell(f);
        fseek(f, end > (long)sizeof(buf) - 1 ? end - (long)sizeof(buf) + 1 : 0, SEEK_SET);
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    fprintf(stderr, "--- %s (tail) ---\n%s\n", path, buf);
}

/* Runs llama.cpp's program PROG with ARGS (NULL-terminated, after -m MODEL)
 * and returns its jsonl output lines in CR (NULL on a failed run, with the
 * reason on stderr). */
static int llama_run(llama *L, const char *prog, const char *const *args, child_run *cr)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/%s", L->bin, prog);
    char *argv[40];
    int n = 0;
    argv[n++] = path;
    argv[n++] = (char *)"-m";
    argv[n++] = (char *)MODEL_PATH;
    for (int i = 0; args[i] && n < 39; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    if (run_child(argv, L->err_log, cr) != 0)
        return -1;
    L->wall_s += cr->wall_s;
    if (cr->status != 0 || !cr->out) {
        fprintf(stderr, "bench_model: %s exited %d; this sample of llama.cpp is left out\n",
                prog, cr->status);
        print_tail(L->err_log);
        free(cr->out);
        cr->out = NULL;
        return -1;
    }
    return 0;
}

/* ---- the baton side ------------------------------------------------------ */

/* One request's stream while it runs. */
typedef struct gen_req {
    char id[32];
    const int32_t *prompt;
    int n_prompt;
    int iters;               /* decode steps; 0: baton_gen's ITERS */
    int expect;              /* chunks: the prefill's token + one per decode step */
    int got;
    double *arrive;          /* arrival time of each chunk, us [expect] */
    double t_send;
    uint64_t prefill_exec_us; /* the prefill node's exec_us (the response's timings) */
    bool done;
} gen_req;

typedef struct baton_side {
    bench_daemon d;
    baton_client *client;
    pid_t t1, t2, mem, mem16, inv; /* the workers */
    int seq;                 /* request ids */
} baton_side;

static int find_req(gen_req *r, int n, const char *id)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(r[i].id, id))
            return i;
    return -1;
}

/* Sends N requests to GRAPH together, each with its prompt and a decode
 * loop of ITERS iterations, and receives every stream to its end, checking
 * it.  Returns 0, or -1 when the system answered wrongly. */
static int baton_gen(baton_side *b, const char *graph, gen_req *r, int n, int iters)
{
    baton_client_request *reqs[MAX_CONC] = {0};
    int rc = -1;
    for (int i = 0; i < n; i++) {
        snprintf(r[i].id, sizeof(r[i].id), "m%d", b->seq++);
        int it = r[i].iters ? r[i].iters : iters;
        r[i].expect = 1 + it;
        r[i].got = 0;
        r[i].done = false;
        r[i].prefill_exec_us = 0;
        r[i].arrive = calloc((size_t)r[i].expect, sizeof(double));
        int64_t dims[1] = {r[i].n_prompt};
        if (!r[i].arrive || baton_client_request_create(graph, r[i].id, &reqs[i]) != 0 ||
            baton_client_request_add_input(reqs[i], "prompt", BATON_CLIENT_DTYPE_I32, dims, 1,
                                           r[i].prompt, (size_t)r[i].n_prompt * 4) != 0 ||
            baton_client_request_set_max_iters(reqs[i], LOOP, (uint32_t)it) != 0) {
            fprintf(stderr, "bench_model: cannot build a request\n");
            goto out;
        }
        baton_client_request_set_stream(reqs[i], true);
    }
    for (int i = 0; i < n; i++) {
        r[i].t_send = bench_now_us();
        int e = baton_client_send(b->client, reqs[i]);
        if (e != 0) {
            fprintf(stderr, "bench_model (%s): send: %s\n", graph, baton_client_strerror(e));
            goto out;
        }
    }
    for (int left = n; left > 0;) {
        baton_client_event *ev = NULL;
        int e = baton_client_recv(b->client, RECV_TIMEOUT_MS, &ev);
        if (e == BATON_CLIENT_EINTR)
            continue;
        if (e != 0) {
            fprintf(stderr, "bench_model (%s): recv: %s\n", graph, baton_client_strerror(e));
            goto out;
        }
        double now = bench_now_us();
        int k = ev->request_id ? find_req(r, n, ev->request_id) : -1;
        bool bad = k < 0;
        if (bad) {
            fprintf(stderr, "bench_model (%s): an event for an unknown request '%s'\n", graph,
                    ev->request_id ? ev->request_id : "");
        } else if (ev->kind == BATON_CLIENT_EVENT_CHUNK) {
            const baton_client_tensor *v = &ev->value;
            int32_t tok = -1;
            if (v->dtype == BATON_CLIENT_DTYPE_I32 && v->nbytes == 4)
                memcpy(&tok, v->data, 4);
            if (r[k].done || ev->seq != (uint64_t)r[k].got || r[k].got >= r[k].expect ||
                tok < 0 || tok >= VOCAB) {
                fprintf(stderr, "bench_model (%s): request %s: chunk seq %" PRIu64 " token %d, "
                        "expected seq %d of %d holding a token id\n", graph, r[k].id, ev->seq,
                        tok, r[k].got, r[k].expect);
                bad = true;
            } else {
                r[k].arrive[r[k].got++] = now;
            }
        } else if (ev->kind == BATON_CLIENT_EVENT_RESPONSE) {
            if (ev->code != BATON_CLIENT_CODE_OK || r[k].got != r[k].expect || r[k].done) {
                fprintf(stderr, "bench_model (%s): request %s ended %s (%s) after %d tokens, "
                        "expected OK after %d (a prompt of %d)\n", graph, r[k].id,
                        baton_client_code_name((int)ev->code), ev->message, r[k].got,
                        r[k].expect, r[k].n_prompt);
                bad = true;
            }
            for (size_t t = 0; t < ev->n_timings; t++)
                if (!strcmp(ev->timings[t].node, "prefill"))
                    r[k].prefill_exec_us = ev->timings[t].exec_us;
            r[k].done = true;
            left--;
        }
        baton_client_event_free(ev);
        if (bad)
            goto out;
    }
    rc = 0;
out:
    for (int i = 0; i < n; i++)
        baton_client_request_destroy(reqs[i]);
    return rc;
}

static void gen_free(gen_req *r, int n)
{
    for (int i = 0; i < n; i++) {
        free(r[i].arrive);
        r[i].arrive = NULL;
    }
}

/* Decode steps over the time they took: chunks after the first, from the
 * first chunk (the prefill's token) to the last. */
static double decode_rate(const gen_req *r)
{
    return (r->got - 1) / ((r->arrive[r->got - 1] - r->arrive[0]) / 1e6);
}

/* Prompt tokens over the time to the first token. */
static double prefill_rate(const gen_req *r)
{
    return r->n_prompt / ((r->arrive[0] - r->t_send) / 1e6);
}

/* Decode tokens per second while all N requests decode: from the last
 * request's first chunk to the first request's last chunk.  Prefills run
 * one after another, so the first requests start decoding before the last
 * one has its prompt in, and finish before it; counting only the window in
 * which all of them share each step leaves out both the ramp and the tail,
 * as llama-batched-bench's S_TG does. */
static double aggregate_rate(const gen_req *r, int n)
{
    double from = 0, to = 1e300;
    for (int i = 0; i < n; i++) {
        if (r[i].arrive[0] > from)
            from = r[i].arrive[0];
        if (r[i].arrive[r[i].got - 1] < to)
            to = r[i].arrive[r[i].got - 1];
    }
    if (to <= from) {
        /* No such window (the prefills outlasted a request's decoding):
         * fall back to everything after the last first token. */
        to = 0;
        for (int i = 0; i < n; i++)
            if (r[i].arrive[r[i].got - 1] > to)
                to = r[i].arrive[r[i].got - 1];
    }
    int count = 0;
    for (int i = 0; i < n; i++)
        for (int c = 1; c < r[i].got; c++)
            if (r[i].arrive[c] > from && r[i].arrive[c] <= to)
                count++;
    return to > from ? count / ((to - from) / 1e6) : 0;
}

/* A value in kB from /proc/PID/status ("VmHWM:", "VmRSS:", ...), or 0. */
static long status_kb(pid_t pid, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long v = 0;
    if (!f)
        return 0;
    size_t kl = strlen(key);
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, key, kl)) {
            v = strtol(line + kl, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* CPU time of batond and its workers so far, ns: what baton's processes
 * spend while llama.cpp runs should be nothing. */
static uint64_t baton_cpu_ns(const baton_side *b)
{
    pid_t p[6] = {b->d.pid, b->t1, b->t2, b->mem, b->mem16, b->inv};
    uint64_t s = 0;
    for (int i = 0; i < 6; i++) {
        bench_cpu c;
        bench_cpu_read(p[i], &c);
        s += c.cpu_ns;
    }
    return s;
}

/* ---- prompts ------------------------------------------------------------- */

/* Random ordinary token ids, from a fixed seed (xorshift64*): the same
 * prompts every run, none of them a special token. */
static void make_prompt(int32_t *out, int n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < n; i++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        uint64_t v = (x * 0x2545F4914F6CDD1Dull) >> 33;
        out[i] = FIRST_ORDINARY + (int32_t)(v % (VOCAB - FIRST_ORDINARY));
    }
}

/* ---- one round of each row ----------------------------------------------- */

typedef struct bench {
    params p;
    row rows[N_ROWS];
    baton_side b;
    llama L;
    int32_t *long_prompt;              /* MAX_PROMPT ids */
    int32_t *short_prompts;            /* MAX_CONC x SHORT_PROMPT ids */
    double pp_exec_ms[N_PP][MAX_ROUNDS]; /* baton's prefill node exec_us, ms */
    long conductor_hwm_kb, mem_rss_kb, mem_anon_kb, mem_file_kb;
    long llama_depth_rss_kb[MAX_ROUNDS]; /* llama-bench's peak RSS in row 4 (context depth+n) */
    uint64_t baton_idle_ns;            /* baton's CPU while llama.cpp ran */
    uint32_t turn_rows;                /* rows given a sample in the current turn (bits) */
    double others_sum, turns_s;        /* other processes' CPU-seconds and the time of all turns */
    int quiet_waited_s;                /* seconds spent waiting for a quiet machine */
    double redone_s;                   /* time of the turns measured again */
    int redone;                        /* how many */
} bench;

static void add_baton(bench *B, int r, double v)
{
    row *w = &B->rows[r];
    if (w->nb < MAX_ROUNDS)
        w->baton[w->nb++] = v;
    B->turn_rows |= 1u << r;
}

static void add_llama(bench *B, int r, double v)
{
    row *w = &B->rows[r];
    if (w->nl < MAX_ROUNDS && !isnan(v) && v > 0)
        w->llama[w->nl++] = v;
    B->turn_rows |= 1u << r;
}

/* One request of PROMPT (N ids) on GRAPH decoding ITERS tokens. */
static int one_request(bench *B, const char *graph, const int32_t *prompt, int n, int iters,
                       gen_req *out)
{
    memset(out, 0, sizeof(*out));
    out->prompt = prompt;
    out->n_prompt = n;
    return baton_gen(&B->b, graph, out, 1, iters);
}

static int baton_row1(bench *B)
{
    static const char *const graphs[2] = {"gen_t1", "gen_t2"};
    for (int t = 0; t < 2; t++) {
        gen_req g;
        int rc = one_request(B, graphs[t], B->short_prompts, SHORT_PROMPT, B->p.n_gen, &g);
        if (rc == 0)
            add_baton(B, R_DEC_T1 + t, decode_rate(&g));
        gen_free(&g, 1);
        if (rc)
            return -1;
    }
    return 0;
}

/* Row 6: the fourth request's decode steps after the first three's last
 * token, alone in cache slot 3 (slots are taken lowest first, in the order
 * the prefills run, which is the order sent). */
static int baton_row6(bench *B)
{
    gen_req g[4];
    memset(g, 0, sizeof(g));
    for (int i = 0; i < 4; i++) {
        g[i].prompt = B->short_prompts + (size_t)i * SHORT_PROMPT;
        g[i].n_prompt = SHORT_PROMPT;
        g[i].iters = SLOT_SHORT_ITERS + (i == 3 ? B->p.n_gen : 0);
    }
    int rc = baton_gen(&B->b, "gen_t2", g, 4, 0);
    if (rc == 0) {
        double from = 0;
        for (int i = 0; i < 3; i++)
            if (g[i].arrive[g[i].got - 1] > from)
                from = g[i].arrive[g[i].got - 1];
        const gen_req *l = &g[3];
        int first = 1;
        while (first < l->got && l->arrive[first] <= from)
            first++;
        /* At least half its steps alone, or the row says nothing. */
        if (l->got - 1 - first >= B->p.n_gen / 2)
            add_baton(B, R_DEC_SLOT3, (l->got - 1 - first) /
                                          ((l->arrive[l->got - 1] - l->arrive[first]) / 1e6));
        else
            fprintf(stderr, "bench_model: row 6: only %d steps alone; no sample\n",
                    l->got - 1 - first);
    }
    gen_free(g, 4);
    return rc;
}

static void add_prefill(bench *B, int i, const gen_req *g)
{
    B->pp_exec_ms[i][B->rows[R_PP0 + i].nb] = g->prefill_exec_us / 1e3;
    add_baton(B, R_PP0 + i, prefill_rate(g));
}

/* Row 2 but its longest prompt, which is row 4's long request. */
static int baton_row2(bench *B)
{
    for (int i = 0; i < N_PP - 1; i++) {
        gen_req g;
        /* One decode step: the loop cannot be shorter, and it is not timed. */
        int rc = one_request(B, "gen_mem", B->long_prompt, B->p.pp[i], 1, &g);
        if (rc == 0)
            add_prefill(B, i, &g);
        gen_free(&g, 1);
        if (rc)
            return -1;
    }
    return 0;
}

/* N concurrent requests on GRAPH, their aggregate decode rate into ROW. */
static int aggregate(bench *B, const char *graph, int n, int row_index)
{
    gen_req g[MAX_CONC];
    memset(g, 0, sizeof(g));
    for (int i = 0; i < n; i++) {
        g[i].prompt = B->short_prompts + (size_t)i * SHORT_PROMPT;
        g[i].n_prompt = SHORT_PROMPT;
    }
    int rc = baton_gen(&B->b, graph, g, n, B->p.n_gen);
    if (rc == 0)
        add_baton(B, row_index, aggregate_rate(g, n));
    gen_free(g, n);
    return rc ? -1 : 0;
}

static int baton_row3(bench *B)
{
    for (int c = 0; c < N_CONC; c++)
        if (aggregate(B, "gen_t2", B->p.conc[c], R_AGG0 + c) != 0)
            return -1;
    return 0;
}

/* Row 7: rows 1 (2 threads) and 3 (the most requests) on the worker that
 * computes every token alone. */
static int baton_row7(bench *B)
{
    gen_req g;
    int rc = one_request(B, "gen_inv", B->short_prompts, SHORT_PROMPT, B->p.n_gen, &g);
    if (rc == 0)
        add_baton(B, R_DEC_INV, decode_rate(&g));
    gen_free(&g, 1);
    if (rc)
        return -1;
    return aggregate(B, "gen_inv", B->p.conc[N_CONC - 1], R_AGG_INV);
}

/* Rows 4 and 5 on the one-slot worker: a short and a long context, then
 * that worker's peak resident set.  The long request's prompt is row 2's
 * longest, and its time to first token is that row's sample: a prefill of
 * 2048 tokens is most of a round's time, so it runs once per round. */
static int baton_row45(bench *B)
{
    gen_req g;
    int rc = one_request(B, "gen_mem", B->short_prompts, SHORT_PROMPT, B->p.n_gen, &g);
    if (rc == 0)
        add_baton(B, R_DEC_SHORT, decode_rate(&g));
    gen_free(&g, 1);
    if (rc)
        return -1;
    rc = one_request(B, "gen_mem", B->long_prompt, B->p.depth, B->p.n_gen, &g);
    if (rc == 0) {
        add_prefill(B, N_PP - 1, &g);
        add_baton(B, R_DEC_LONG, decode_rate(&g));
    }
    gen_free(&g, 1);
    if (rc)
        return -1;
    add_baton(B, R_MEM, status_kb(B->b.mem, "VmHWM:") / 1024.0);
    B->mem_rss_kb = status_kb(B->b.mem, "VmRSS:");
    B->mem_anon_kb = status_kb(B->b.mem, "RssAnon:");
    B->mem_file_kb = status_kb(B->b.mem, "RssFile:");
    /* The same two requests on mem16, whose cache is f16. */
    rc = one_request(B, "gen_mem16", B->short_prompts, SHORT_PROMPT, B->p.n_gen, &g);
    if (rc == 0)
        add_baton(B, R_DEC_SHORT16, decode_rate(&g));
    gen_free(&g, 1);
    if (rc)
        return -1;
    rc = one_request(B, "gen_mem16", B->long_prompt, B->p.depth, B->p.n_gen, &g);
    if (rc == 0)
        add_baton(B, R_DEC_LONG16, decode_rate(&g));
    gen_free(&g, 1);
    if (rc)
        return -1;
    B->conductor_hwm_kb = status_kb(B->b.d.pid, "VmHWM:");
    return 0;
}

/* llama-bench's avg_ts for each line of OUT matching (n_prompt, n_gen,
 * n_depth, n_threads); -1 fields match anything. */
static double bench_ts(const char *out, int np, int ng, int nd, int nt)
{
    for (const char *line = out; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char buf[4096];
        snprintf(buf, sizeof(buf), "%.*s", (int)(len < sizeof(buf) ? len : sizeof(buf) - 1),
                 line);
        if ((np < 0 || json_num(buf, "n_prompt") == np) &&
            (ng < 0 || json_num(buf, "n_gen") == ng) &&
            (nd < 0 || json_num(buf, "n_depth") == nd) &&
            (nt < 0 || json_num(buf, "n_threads") == nt) && json_num(buf, "avg_ts") > 0)
            return json_num(buf, "avg_ts");
        line = nl ? nl + 1 : NULL;
    }
    return NAN;
}

static void llama_row1(bench *B)
{
    char ng[16];
    snprintf(ng, sizeof(ng), "%d", B->p.n_gen);
    const char *args[] = {"-p", "0", "-n", ng, "-t", "1,2", "-r", "1", "-o", "jsonl", NULL};
    child_run cr;
    if (llama_run(&B->L, "llama-bench", args, &cr) != 0)
        return;
    add_llama(B, R_DEC_T1, bench_ts(cr.out, 0, B->p.n_gen, 0, 1));
    add_llama(B, R_DEC_T2, bench_ts(cr.out, 0, B->p.n_gen, 0, 2));
    free(cr.out);
}

static void llama_row2(bench *B)
{
    char pp[64];
    snprintf(pp, sizeof(pp), "%d,%d,%d", B->p.pp[0], B->p.pp[1], B->p.pp[2]);
    const char *args[] = {"-p", pp, "-n", "0", "-t", "2", "-r", "1", "-o", "jsonl", NULL};
    child_run cr;
    if (llama_run(&B->L, "llama-bench", args, &cr) != 0)
        return;
    for (int i = 0; i < N_PP; i++)
        add_llama(B, R_PP0 + i, bench_ts(cr.out, B->p.pp[i], 0, 0, 2));
    free(cr.out);
}

static void llama_row3(bench *B)
{
    char npp[16], ntg[16], npl[32], ctx[16];
    snprintf(npp, sizeof(npp), "%d", SHORT_PROMPT);
    snprintf(ntg, sizeof(ntg), "%d", B->p.n_gen);
    snprintf(npl, sizeof(npl), "%d,%d", B->p.conc[0], B->p.conc[1]);
    /* Room for every sequence's prompt and tokens: 16 sequences get 256
     * positions each. */
    snprintf(ctx, sizeof(ctx), "%d", CTX_SIZE);
    const char *args[] = {"-c", ctx, "-npp", npp, "-ntg", ntg, "-npl", npl, "-t", "2",
                          "--output-format", "jsonl", NULL};
    child_run cr;
    if (llama_run(&B->L, "llama-batched-bench", args, &cr) != 0)
        return;
    for (int c = 0; c < N_CONC; c++) {
        double v = NAN;
        for (const char *line = cr.out; line && *line;) {
            const char *nl = strchr(line, '\n');
            size_t len = nl ? (size_t)(nl - line) : strlen(line);
            char buf[4096];
            snprintf(buf, sizeof(buf), "%.*s",
                     (int)(len < sizeof(buf) ? len : sizeof(buf) - 1), line);
            if (json_num(buf, "pl") == B->p.conc[c])
                v = json_num(buf, "speed_tg");
            line = nl ? nl + 1 : NULL;
        }
        add_llama(B, R_AGG0 + c, v);
    }
    free(cr.out);
}

static void llama_row45(bench *B, int round)
{
    char ng[16], d[32];
    snprintf(ng, sizeof(ng), "%d", B->p.n_gen);
    snprintf(d, sizeof(d), "0,%d", B->p.depth);
    const char *args[] = {"-p", "0", "-n", ng, "-d", d, "-t", "2", "-r", "1", "-o", "jsonl",
                          NULL};
    child_run cr;
    if (llama_run(&B->L, "llama-bench", args, &cr) == 0) {
        add_llama(B, R_DEC_SHORT, bench_ts(cr.out, 0, B->p.n_gen, 0, 2));
        add_llama(B, R_DEC_LONG, bench_ts(cr.out, 0, B->p.n_gen, B->p.depth, 2));
        B->llama_depth_rss_kb[round] = cr.maxrss_kb;
        free(cr.out);
    }
    /* Row 5: one sequence in a context of baton's max_seq, the same
     * prompt and generation as baton's long request. */
    char ctx[16], npp[16];
    snprintf(ctx, sizeof(ctx), "%d", CTX_SIZE);
    snprintf(npp, sizeof(npp), "%d", B->p.depth);
    const char *margs[] = {"-c", ctx, "-npp", npp, "-ntg", ng, "-npl", "1", "-t", "2",
                           "--output-format", "jsonl", NULL};
    if (llama_run(&B->L, "llama-batched-bench", margs, &cr) == 0) {
        add_llama(B, R_MEM, cr.maxrss_kb / 1024.0);
        free(cr.out);
    }
}

/* CPU-seconds the machine has spent busy so far (stolen time included: it
 * is time the measured processes could not run), from /proc/stat. */
static double machine_busy_s(void)
{
    unsigned long long user = 0, nice = 0, sys = 0, idle = 0, iow = 0, irq = 0, soft = 0,
                       steal = 0;
    FILE *f = fopen("/proc/stat", "r");
    if (f) {
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &sys, &idle,
                   &iow, &irq, &soft, &steal) < 4)
            user = nice = sys = irq = soft = steal = 0;
        fclose(f);
    }
    return (double)(user + nice + sys + irq + soft + steal) / (double)sysconf(_SC_CLK_TCK);
}

/* CPU-seconds of everything this benchmark runs: itself, llama.cpp's runs
 * (reaped children) and baton's processes (not reaped until the end). */
static double own_cpu_s(const bench *B)
{
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    double s = 0;
    const struct timeval *tv[4] = {&self.ru_utime, &self.ru_stime, &kids.ru_utime,
                                   &kids.ru_stime};
    for (int i = 0; i < 4; i++)
        s += (double)tv[i]->tv_sec + (double)tv[i]->tv_usec / 1e6;
    return s + (double)baton_cpu_ns(&B->b) / 1e9;
}

/* Other processes' CPU over the last second, in CPUs. */
static double others_now(const bench *B)
{
    double b0 = machine_busy_s(), o0 = own_cpu_s(B);
    sleep(1);
    return (machine_busy_s() - b0) - (own_cpu_s(B) - o0);
}

/* Waits until other processes leave the machine alone (QUIET_CPU), within
 * QUIET_WAIT_S for one turn and QUIET_TOTAL_S in all.  On 2 CPUs a
 * neighbour's build or test slows both sides by far more than they differ
 * (llama.cpp's spinning threads most), and such neighbours come and go. */
static void wait_quiet(bench *B)
{
    int waited = 0;
    while (others_now(B) >= QUIET_CPU && waited < QUIET_WAIT_S &&
           B->quiet_waited_s + waited < QUIET_TOTAL_S) {
        if (waited == 0)
            fprintf(stderr, "bench_model: other processes are busy; waiting for them (up to "
                    "%d s)...\n", QUIET_WAIT_S);
        waited++;
    }
    B->quiet_waited_s += waited;
}

/* One turn of GROUP's rows in ROUND: baton's and llama.cpp's, in an order
 * that flips every round.  Other processes on the machine (this one is
 * shared) are watched meanwhile: the CPU the machine spent busy beyond what
 * the benchmark's own processes used.  A turn they disturbed (REDO_CPU) is
 * thrown away and measured again, within REDO_TOTAL_S. */
static int round_turn(bench *B, int round, int group)
{
    int nb[N_ROWS], nl[N_ROWS];
    for (int r = 0; r < N_ROWS; r++) {
        nb[r] = B->rows[r].nb;
        nl[r] = B->rows[r].nl;
    }
    for (;;) {
        wait_quiet(B);
        double t0 = bench_now_us(), busy0 = machine_busy_s(), own0 = own_cpu_s(B);
        B->turn_rows = 0;
        /* Baton first in even rounds, llama.cpp first in odd ones. */
        for (int side = 0; side < 2; side++) {
            bool baton_turn = (side == 0) == (round % 2 == 0);
            if (baton_turn) {
                int rc = group == 0   ? (baton_row1(B) || baton_row6(B) ? -1 : 0)
                         : group == 1 ? baton_row2(B)
                         : group == 2 ? (baton_row3(B) || baton_row7(B) ? -1 : 0)
                                      : baton_row45(B);
                if (rc)
                    return -1;
            } else if (B->L.ok) {
                uint64_t c0 = baton_cpu_ns(&B->b);
                if (group == 0)
                    llama_row1(B);
                else if (group == 1)
                    llama_row2(B);
                else if (group == 2)
                    llama_row3(B);
                else
                    llama_row45(B, round);
                B->baton_idle_ns += baton_cpu_ns(&B->b) - c0;
            }
        }
        double wall = (bench_now_us() - t0) / 1e6;
        double others = (machine_busy_s() - busy0) - (own_cpu_s(B) - own0);
        if (others < 0)
            others = 0;
        if (others / wall > REDO_CPU && B->redone_s + wall <= REDO_TOTAL_S) {
            fprintf(stderr, "bench_model: other processes used %.0f%% of a CPU during that "
                    "turn; measuring it again\n", 100 * others / wall);
            B->redone_s += wall;
            B->redone++;
            for (int r = 0; r < N_ROWS; r++) {
                B->rows[r].nb = nb[r];
                B->rows[r].nl = nl[r];
            }
            continue;
        }
        B->others_sum += others;
        B->turns_s += wall;
        for (int r = 0; r < N_ROWS; r++)
            if (B->turn_rows & (1u << r)) {
                B->rows[r].others_round[round] = others / wall;
                if (others / wall > B->rows[r].others)
                    B->rows[r].others = others / wall;
            }
        return 0;
    }
}

/* Unmeasured first requests on every worker: page faults of the caches and
 * scratch, lazily built tables. */
static int baton_warmup(bench *B)
{
    gen_req g[MAX_CONC];
    int rc = one_request(B, "gen_t1", B->short_prompts, SHORT_PROMPT, 4, &g[0]);
    gen_free(g, 1);
    if (rc == 0) {
        rc = one_request(B, "gen_t2", B->short_prompts, SHORT_PROMPT, 4, &g[0]);
        gen_free(g, 1);
    }
    if (rc == 0) {
        int n = B->p.conc[N_CONC - 1];
        memset(g, 0, sizeof(g));
        for (int i = 0; i < n; i++) {
            g[i].prompt = B->short_prompts + (size_t)i * SHORT_PROMPT;
            g[i].n_prompt = SHORT_PROMPT;
        }
        rc = baton_gen(&B->b, "gen_t2", g, n, 4);
        gen_free(g, n);
    }
    if (rc == 0) {
        rc = one_request(B, "gen_inv", B->short_prompts, SHORT_PROMPT, 4, &g[0]);
        gen_free(g, 1);
    }
    if (rc == 0) {
        /* Not the longest prompt: that would cost as much as a round, and
         * what a first run costs more is the first touch of pages, small
         * beside a prefill of that length. */
        rc = one_request(B, "gen_mem", B->long_prompt, B->p.pp[N_PP - 2], 4, &g[0]);
        gen_free(g, 1);
    }
    if (rc == 0) {
        rc = one_request(B, "gen_mem16", B->long_prompt, B->p.pp[N_PP - 2], 4, &g[0]);
        gen_free(g, 1);
    }
    return rc;
}

/* ---- report -------------------------------------------------------------- */

static double med(const double *v, int n)
{
    return bench_median(v, (size_t)n);
}

static double vmin(const double *v, int n)
{
    double m = n ? v[0] : 0;
    for (int i = 1; i < n; i++)
        if (v[i] < m)
            m = v[i];
    return m;
}

static void json_list(FILE *f, const double *v, int n)
{
    fprintf(f, "[");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%.2f", i ? ", " : "", v[i]);
    fprintf(f, "]");
}

/* Ratio of medians, baton / llama.cpp; 0 when either side has nothing. */
static double row_ratio(const row *w)
{
    return w->nb && w->nl ? med(w->baton, w->nb) / med(w->llama, w->nl) : 0;
}

static double rows_ratio(const bench *B, int a, int b, bool llama_side)
{
    const row *x = &B->rows[a], *y = &B->rows[b];
    if (llama_side)
        return x->nl && y->nl ? med(x->llama, x->nl) / med(y->llama, y->nl) : 0;
    return x->nb && y->nb ? med(x->baton, x->nb) / med(y->baton, y->nb) : 0;
}

static void print_table(const bench *B)
{
    char machine[512];
    bench_machine_line(machine, sizeof(machine));
    printf("\n== baton vs llama.cpp, CPU, %s (%s)\n", MODEL_PATH, machine);
    printf("same model file, same thread count on both sides; %d round%s, baton and llama.cpp "
           "taking turns;\nmin / median of the rounds; ratio = baton median / llama.cpp "
           "median (above 1: baton faster, or for\nrow 5 baton larger)\n",
           B->p.rounds, B->p.rounds == 1 ? "" : "s");
    if (!B->L.ok)
        printf("llama.cpp columns SKIPPED: %s\n", B->L.why);
    printf("\n%-46s %21s %21s %8s %7s\n", "", "baton", "llama.cpp", "", "others");
    printf("%-46s %21s %21s %8s %7s\n", "row", "min / median", "min / median", "ratio",
           "max");
    for (int i = 0; i < N_ROWS; i++) {
        const row *w = &B->rows[i];
        char bs[32] = "-", ls[32] = "-", rs[16] = "-";
        if (w->nb)
            snprintf(bs, sizeof(bs), "%9.1f / %9.1f", vmin(w->baton, w->nb),
                     med(w->baton, w->nb));
        if (w->nl)
            snprintf(ls, sizeof(ls), "%9.1f / %9.1f", vmin(w->llama, w->nl),
                     med(w->llama, w->nl));
        else if (!B->L.ok)
            snprintf(ls, sizeof(ls), "skipped");
        if (w->nb && w->nl)
            snprintf(rs, sizeof(rs), "%.2fx", row_ratio(w));
        printf("%-46s %21s %21s %8s %6.0f%%\n", w->label, bs, ls, rs, 100 * w->others);
    }
    int p1 = R_PP0 + 1, p2 = R_PP0 + 2;
    printf("\nprefill %d / prefill %d tok/s: baton %.2fx", B->p.pp[2], B->p.pp[1],
           rows_ratio(B, p2, p1, false));
    if (B->L.ok)
        printf(", llama.cpp %.2fx\n", rows_ratio(B, p2, p1, true));
    else
        printf(", llama.cpp skipped\n");
    printf("decode after %d / after %d tokens of context: baton %.2fx", B->p.depth, SHORT_PROMPT,
           rows_ratio(B, R_DEC_LONG, R_DEC_SHORT, false));
    if (B->L.ok)
        printf(", llama.cpp %.2fx (after %d / after 0)\n",
               rows_ratio(B, R_DEC_LONG, R_DEC_SHORT, true), B->p.depth);
    else
        printf(", llama.cpp skipped\n");
    printf("decode after %d / after %d tokens of context, f16 KV cache: baton %.2fx\n",
           B->p.depth, SHORT_PROMPT, rows_ratio(B, R_DEC_LONG16, R_DEC_SHORT16, false));
    printf("decode alone in cache slot 3 / in slot 0 (row 6 / row 1, 2 threads): baton %.2fx\n",
           rows_ratio(B, R_DEC_SLOT3, R_DEC_T2, false));
    printf("batch_invariant / default (row 7 / rows 1 and 3): decode of 1 request %.2fx, "
           "aggregate of %d %.2fx\n", rows_ratio(B, R_DEC_INV, R_DEC_T2, false),
           B->p.conc[N_CONC - 1], rows_ratio(B, R_AGG_INV, R_AGG0 + N_CONC - 1, false));
    printf("decode scaling, 2 threads / 1 thread: baton %.2fx", rows_ratio(B, R_DEC_T2, R_DEC_T1,
                                                                          false));
    if (B->L.ok)
        printf(", llama.cpp %.2fx\n", rows_ratio(B, R_DEC_T2, R_DEC_T1, true));
    else
        printf("\n");
    const row *m = &B->rows[R_MEM];
    printf("memory: baton's worker (one sequence, max_seq %d, q8_0 KV cache) now %.1f MiB "
           "resident (%.1f anonymous,\n  %.1f file-backed: the model file and libraries); its "
           "conductor batond %.1f MiB at peak, not counted in the row",
           CTX_SIZE, B->mem_rss_kb / 1024.0, B->mem_anon_kb / 1024.0, B->mem_file_kb / 1024.0,
           B->conductor_hwm_kb / 1024.0);
    if (B->L.ok && m->nl)
        printf(";\n  llama.cpp: llama-batched-bench -c %d -npp %d -ntg %d -npl 1 (f16 KV "
               "cache); llama-bench at context %d: %.1f MiB\n",
               CTX_SIZE, B->p.depth, B->p.n_gen, B->p.depth + B->p.n_gen,
               B->llama_depth_rss_kb[0] / 1024.0);
    else
        printf("\n");
    if (B->L.ok && B->L.wall_s > 0)
        printf("baton's idle processes used %.1f%% of one CPU while llama.cpp ran (%.0f s)\n",
               100.0 * (double)B->baton_idle_ns / 1e9 / B->L.wall_s, B->L.wall_s);
    printf("other processes on the machine used %.0f%% of one CPU on average while measuring "
           "(others max: the most\n in one turn that gave the row a sample; on 2 CPUs, tens of "
           "percent disturb the numbers); %d s spent\n waiting for them to go quiet before "
           "turns; %d turn%s they disturbed measured again (%.0f s thrown away)\n",
           B->turns_s > 0 ? 100 * B->others_sum / B->turns_s : 0, B->quiet_waited_s, B->redone,
           B->redone == 1 ? "" : "s", B->redone_s);
    printf("(decode: chunks after the first / time from the first chunk to the last; prefill: "
           "prompt tokens /\n time to first token seen by the client, the %d-token one being "
           "row 4's long request; aggregate:\n tokens while every request decodes / that time; "
           "llama.cpp: llama-bench avg_ts, llama-batched-bench S_TG,\n peak RSS from wait4)\n",
           B->p.pp[N_PP - 1]);
}

static void write_json(const bench *B, const bench_opts *o)
{
    FILE *f = bench_json_open(o);
    if (!f)
        return;
    fprintf(f, "{\n  \"benchmark\": \"bench_model\",\n  ");
    bench_json_machine(f);
    fprintf(f, ",\n  \"params\": {\"model\": \"%s\", \"rounds\": %d, \"decode_tokens\": %d, "
            "\"short_prompt\": %d, \"prefill_lengths\": [%d, %d, %d], \"context_depth\": %d, "
            "\"concurrency\": [%d, %d], \"max_seq\": %d, \"threads\": 2, "
            "\"config\": \"tests/bench/configs/model-cpu.yaml\"},\n",
            MODEL_PATH, B->p.rounds, B->p.n_gen, SHORT_PROMPT, B->p.pp[0], B->p.pp[1], B->p.pp[2],
            B->p.depth, B->p.conc[0], B->p.conc[1], CTX_SIZE);
    fprintf(f, "  \"llama_cpp\": {\"available\": %s, \"bin\": \"%s\", \"skipped_because\": ",
            B->L.ok ? "true" : "false", B->L.ok ? B->L.bin : "");
    if (B->L.ok) {
        fprintf(f, "null");
    } else {
        fprintf(f, "\"");
        for (const char *c = B->L.why; *c; c++)
            fputc(*c == '"' || *c == '\\' ? '\'' : *c, f);
        fprintf(f, "\"");
    }
    fprintf(f, "},\n  \"rows\": {\n");
    for (int i = 0; i < N_ROWS; i++) {
        const row *w = &B->rows[i];
        fprintf(f, "    \"%s\": {\"label\": \"%s\", \"unit\": \"%s\", \"baton\": {\"min\": %.2f, "
                "\"median\": %.2f, \"runs\": ",
                w->key, w->label, w->unit, vmin(w->baton, w->nb), med(w->baton, w->nb));
        json_list(f, w->baton, w->nb);
        fprintf(f, "}, \"llama_cpp\": ");
        if (w->nl) {
            fprintf(f, "{\"min\": %.2f, \"median\": %.2f, \"runs\": ", vmin(w->llama, w->nl),
                    med(w->llama, w->nl));
            json_list(f, w->llama, w->nl);
            fprintf(f, "}, \"ratio\": %.3f", row_ratio(w));
        } else {
            fprintf(f, "null, \"ratio\": null");
        }
        fprintf(f, ", \"others_max_cpu\": %.2f, \"others_cpu_per_round\": ", w->others);
        json_list(f, w->others_round, B->p.rounds);
        fprintf(f, "}%s\n", i + 1 < N_ROWS ? "," : "");
    }
    fprintf(f, "  },\n  \"prefill_exec_ms\": {");
    for (int i = 0; i < N_PP; i++) {
        fprintf(f, "%s\"%d\": ", i ? ", " : "", B->p.pp[i]);
        json_list(f, B->pp_exec_ms[i], B->rows[R_PP0 + i].nb);
    }
    fprintf(f, "},\n  \"ratios\": {\"baton_prefill_%d_over_%d\": %.3f, "
            "\"llama_cpp_prefill_%d_over_%d\": %.3f, \"baton_decode_long_over_short\": %.3f, "
            "\"llama_cpp_decode_long_over_short\": %.3f, "
            "\"baton_decode_long_over_short_f16_cache\": %.3f, "
            "\"baton_decode_slot3_over_slot0\": %.3f, \"baton_invariant_decode_over_default\": "
            "%.3f, \"baton_invariant_aggregate_over_default\": %.3f},\n",
            B->p.pp[2], B->p.pp[1], rows_ratio(B, R_PP0 + 2, R_PP0 + 1, false), B->p.pp[2],
            B->p.pp[1], rows_ratio(B, R_PP0 + 2, R_PP0 + 1, true),
            rows_ratio(B, R_DEC_LONG, R_DEC_SHORT, false),
            rows_ratio(B, R_DEC_LONG, R_DEC_SHORT, true),
            rows_ratio(B, R_DEC_LONG16, R_DEC_SHORT16, false),
            rows_ratio(B, R_DEC_SLOT3, R_DEC_T2, false),
            rows_ratio(B, R_DEC_INV, R_DEC_T2, false),
            rows_ratio(B, R_AGG_INV, R_AGG0 + N_CONC - 1, false));
    fprintf(f, "  \"memory_kib\": {\"baton_worker_rss\": %ld, \"baton_worker_anon\": %ld, "
            "\"baton_worker_file\": %ld, \"baton_conductor_hwm\": %ld, "
            "\"llama_bench_at_depth_maxrss\": %ld},\n",
            B->mem_rss_kb, B->mem_anon_kb, B->mem_file_kb, B->conductor_hwm_kb,
            B->llama_depth_rss_kb[0]);
    fprintf(f, "  \"baton_idle_cpu_s_during_llama_cpp\": %.3f, \"llama_cpp_wall_s\": %.1f, "
            "\"others_cpu_mean\": %.3f, \"quiet_wait_s\": %d,\n  \"turns_redone\": %d, "
            "\"turns_redone_s\": %.1f, \"tokens_checked\": true\n}\n",
            (double)B->baton_idle_ns / 1e9, B->L.wall_s,
            B->turns_s > 0 ? B->others_sum / B->turns_s : 0, B->quiet_waited_s, B->redone,
            B->redone_s);
    fclose(f);
    printf("wrote %s\n", o->json);
}

/* ---- main ---------------------------------------------------------------- */

static void set_row(row *w, const char *key, const char *unit, const char *fmt, int a)
{
    snprintf(w->key, sizeof(w->key), "%s", key);
    w->unit = unit;
    snprintf(w->label, sizeof(w->label), fmt, a);
}

int main(int argc, char **argv)
{
    bench_opts o;
    bench_opts_parse(&o, "bench_model", argc, argv);
    static bench B;
    B.p = o.quick ? (params){1, 32, {64, 256, 512}, 0, {4, 16}}
                  : (params){MAX_ROUNDS, 64, {64, 512, 2048}, 0, {4, 16}};
    B.p.depth = B.p.pp[N_PP - 1];
    set_row(&B.rows[R_DEC_T1], "decode_1thread", "tok/s",
            "1. decode tok/s, 1 request, 1 thread (tg%d)", B.p.n_gen);
    set_row(&B.rows[R_DEC_T2], "decode_2threads", "tok/s",
            "1. decode tok/s, 1 request, 2 threads (tg%d)", B.p.n_gen);
    for (int i = 0; i < N_PP; i++) {
        char key[32];
        snprintf(key, sizeof(key), "prefill_%d", B.p.pp[i]);
        set_row(&B.rows[R_PP0 + i], key, "tok/s", "2. prefill tok/s, %d-token prompt", B.p.pp[i]);
    }
    for (int i = 0; i < N_CONC; i++) {
        char key[32];
        snprintf(key, sizeof(key), "aggregate_decode_%d", B.p.conc[i]);
        set_row(&B.rows[R_AGG0 + i], key, "tok/s", "3. aggregate decode tok/s, %d requests",
                B.p.conc[i]);
    }
    set_row(&B.rows[R_DEC_SHORT], "decode_short_context", "tok/s",
            "4. decode tok/s, short context (%d)", SHORT_PROMPT);
    set_row(&B.rows[R_DEC_LONG], "decode_long_context", "tok/s",
            "4. decode tok/s after a %d-token context", B.p.depth);
    set_row(&B.rows[R_DEC_SHORT16], "decode_short_context_f16_cache", "tok/s",
            "4. ...short context (%d), f16 KV cache", SHORT_PROMPT);
    set_row(&B.rows[R_DEC_LONG16], "decode_long_context_f16_cache", "tok/s",
            "4. ...after %d tokens, f16 KV cache", B.p.depth);
    set_row(&B.rows[R_MEM], "peak_rss_mib", "MiB", "5. peak resident MiB, context %d", CTX_SIZE);
    set_row(&B.rows[R_DEC_SLOT3], "decode_alone_in_slot3", "tok/s",
            "6. decode tok/s, 1 request alone in slot %d", 3);
    set_row(&B.rows[R_DEC_INV], "decode_2threads_invariant", "tok/s",
            "7. decode tok/s, 1 req, %d threads, invariant", 2);
    set_row(&B.rows[R_AGG_INV], "aggregate_decode_16_invariant", "tok/s",
            "7. aggregate decode tok/s, %d req, invariant", B.p.conc[N_CONC - 1]);

    if (access(MODEL_PATH, R_OK) != 0) {
        /* Like the tests that need the model: a missing file is a skip, not
         * a wrong answer. */
        printf("bench_model: SKIPPED: %s is missing (scripts/fetch-model.sh fetches it; run "
               "from the repository root)\n", MODEL_PATH);
        return 0;
    }
    int rc = 1;
    B.long_prompt = malloc(MAX_PROMPT * sizeof(int32_t));
    B.short_prompts = malloc(MAX_CONC * SHORT_PROMPT * sizeof(int32_t));
    if (!B.long_prompt || !B.short_prompts)
        return 1;
    make_prompt(B.long_prompt, MAX_PROMPT, 1);
    make_prompt(B.short_prompts, MAX_CONC * SHORT_PROMPT, 2);

    /* llama.cpp first: its build (when not cached yet) should not run
     * beside baton's measurements, and stderr of its runs goes to a private
     * folder that the daemon's own folder cannot be. */
    char llama_dir[256] = "";
    llama_find(&B.L);
    if (B.L.ok && bench_mkdtemp(llama_dir, sizeof(llama_dir)) == 0)
        snprintf(B.L.err_log, sizeof(B.L.err_log), "%s/llama.err", llama_dir);
    if (!B.L.ok)
        fprintf(stderr, "bench_model: llama.cpp columns SKIPPED: %s; measuring baton alone\n",
                B.L.why);

    if (bench_daemon_start(&B.b.d, &o, "model-cpu.yaml", NULL) != 0 ||
        baton_client_create(B.b.d.endpoint, &B.b.client) != 0)
        goto out;
    B.b.t1 = bench_child_named(B.b.d.pid, "t1");
    B.b.t2 = bench_child_named(B.b.d.pid, "t2");
    B.b.mem = bench_child_named(B.b.d.pid, "mem");
    B.b.mem16 = bench_child_named(B.b.d.pid, "mem16");
    B.b.inv = bench_child_named(B.b.d.pid, "inv");
    if (!B.b.t1 || !B.b.t2 || !B.b.mem || !B.b.mem16 || !B.b.inv) {
        fprintf(stderr, "bench_model: cannot find batond's workers t1, t2, mem, mem16, inv\n");
        goto out;
    }
    fprintf(stderr, "bench_model: warming baton up...\n");
    if (baton_warmup(&B) != 0)
        goto out;
    double t_start = bench_now_us();
    for (int r = 0; r < B.p.rounds; r++) {
        fprintf(stderr, "bench_model: round %d of %d (%.0f s so far)...\n", r + 1, B.p.rounds,
                (bench_now_us() - t_start) / 1e6);
        for (int g = 0; g < 4; g++)
            if (round_turn(&B, r, g) != 0)
                goto out;
    }
    print_table(&B);
    write_json(&B, &o);
    rc = 0;
out:
    baton_client_destroy(B.b.client);
    bench_daemon_stop(&B.b.d);
    if (llama_dir[0])
        bench_rmtree(llama_dir);
    free(B.long_prompt);
    free(B.short_prompts);
    return rc;
}
