/* batonctl: the command-line client of batond, a thin
 * program over the C client library (include/baton/client.h). It parses
 * tensors from the command line or files, streams chunks as they arrive,
 * and prints answers for people or, with --json, one JSON object per line
 * for scripts.
 *
 * Exit status: 0 OK; 1 the daemon answered with a status other than OK (or
 * health says not ready); 2 usage error; 3 cannot connect, timeout, or a
 * broken answer. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/client.h"
#include "baton/version.h"
#include "client/ctl_format.h"
#include "common/curve.h"
#include "common/ipcfile.h"

enum { EXIT_STATUS = 1, EXIT_USAGE = 2, EXIT_CONN = 3 };

static const char usage_text[] =
    "usage: batonctl [GLOBAL OPTIONS] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  infer GRAPH [--input NAME=SPEC]... [REQUEST OPTIONS]   run a graph once\n"
    "  generate GRAPH TEXT [--input-name NAME] [--system TEXT] [--raw] [REQUEST OPTIONS]\n"
    "                      send TEXT as the graph's first input (or NAME), print the\n"
    "                      streamed text as it arrives, then a summary on stderr;\n"
    "                      with --system, TEXT and the system prompt go as messages;\n"
    "                      with --raw, TEXT reaches the model without its chat template\n"
    "  transcribe FILE [--language CODE] [--task transcribe|translate] [--graph NAME]\n"
    "                      [--prompt TEXT] [--segments] [--no-timestamps]\n"
    "                      [--system TEXT] [REQUEST OPTIONS]\n"
    "                      send an audio file (WAV, FLAC, OGG, MP3) as input 'audio'\n"
    "                      and the options as input 'options' to graph NAME (default:\n"
    "                      transcribe), print the streamed text as it arrives, then a\n"
    "                      summary on stderr; without --language the model detects\n"
    "                      it; --prompt gives previous text (names, spellings) to the\n"
    "                      first window; --segments prints each segment on a line of\n"
    "                      its own with its times instead; --no-timestamps decodes\n"
    "                      without them (a segment a window, the text a token at a time);\n"
    "                      --system sends a system prompt as messages to input 'context'\n"
    "                      (voice_chat: the LLM reads it before the transcript)\n"
    "  health              liveness and readiness (exit 1 when not ready)\n"
    "  stats               metrics (Prometheus text)\n"
    "  inspect [GRAPH]     graph, partition and schedule\n"
    "  cancel ID           ask the daemon to end request ID (of any connection,\n"
    "                      when only one has a request of that id in flight);\n"
    "                      exit 1 when no such request is in flight.\n"
    "                      Ctrl-C during infer/generate/transcribe cancels that request\n"
    "  keygen [--out DIR] NAME   write a CURVE key pair: DIR/NAME.key (the secret key,\n"
    "                      mode 0600) and DIR/NAME.pub (the public key, 0644); never\n"
    "                      overwrites; prints the public key, never the secret one\n"
    "\n"
    "global options:\n"
    "  --endpoint EP       daemon endpoint (default: $BATON_ENDPOINT, else\n"
    "                      " BATON_CLIENT_DEFAULT_ENDPOINT ")\n"
    "  --server-key KEY    the daemon's CURVE public key for tcp:// endpoints: the 40\n"
    "                      Z85 characters or its .pub file (default: $BATON_SERVER_KEY)\n"
    "  --client-key FILE   this client's CURVE secret key file (NAME.key, from keygen;\n"
    "                      its public key must be in the daemon's client_keys); the\n"
    "                      public half is derived (default: $BATON_CLIENT_KEY; without\n"
    "                      it a fresh pair is made, which a daemon with curve refuses)\n"
    "  --json              one JSON object per chunk/response/answer on stdout\n"
    "  --timeout-ms N      infer/generate: the request's deadline (the client waits\n"
    "                      2 s longer); other commands: how long to wait (default 5000)\n"
    "  -h, --help          this text\n"
    "  --version           print batonctl's version\n"
    "  --                  the arguments after it are not options (a prompt that\n"
    "                      begins with -)\n"
    "\n"
    "request options (infer, generate):\n"
    "  --input NAME=SPEC   SPEC is DTYPE:DIMS:VALUES, DTYPE:VALUES (1-D), DTYPE:DIMS:@FILE,\n"
    "                      DTYPE:@FILE (raw little-endian bytes), text:STRING or\n"
    "                      text:@FILE (a U8 tensor of UTF-8 bytes). DTYPE: f32 f16 bf16\n"
    "                      i32 i64 u8 bool; DIMS: comma-separated, empty for a scalar.\n"
    "                      e.g. x=i32:2,3:1,2,3,4,5,6  x=f32::1.5  prompt=text:hello\n"
    "  --stream            ask for streamed chunks (generate always streams)\n"
    "  --max-iters LOOP=N  cap loop LOOP at N iterations (repeatable)\n"
    "  --stop STR          end the text stream before STR (repeatable, at most 16)\n"
    "  --max-tokens N      end the text stream after N tokens\n"
    "  --text-output NAME  the text stream --stop and --max-tokens apply to (default:\n"
    "                      the graph's only one)\n"
    "  --temperature T  --top-k K  --top-p P  --seed S    sampling\n"
    "  --request-id ID     use ID instead of a generated one\n"
    "  --timings           print per-node timings on stderr\n"
    "\n"
    "--json objects: {\"type\":\"chunk\",\"request_id\",\"seq\",\"value\":TENSOR},\n"
    "{\"type\":\"response\",\"request_id\",\"status\",\"code\",\"message\",\"outputs\":[TENSOR],\n"
    "\"timings\":[...],\"total_us\",\"seed\",\"usage\",\"loop_ends\",\"finish_reason\"},\n"
    "{\"type\":\"cancel\",\"request_id\",\"status\",\"code\",\"message\"},\n"
    "{\"type\":\"health\"|\"stats\"|\"inspect\",...}; TENSOR is\n"
    "{\"name\",\"dtype\",\"dims\",\"modality\",\"values\":[...]}, or for text modality\n"
    "{...,\"text\":\"...\"} (plus \"values\" when the bytes are not valid UTF-8).\n"
    "\n"
    "exit status: 0 OK, 1 the answer's status is not OK, 2 usage error,\n"
    "3 cannot connect or no answer in time.\n";

typedef struct ctl_opts {
    const char *endpoint;
    const char *server_key;
    const char *client_key;  /* --client-key: a .key file */
    const char *out_dir;     /* keygen --out */
    bool json;
    int timeout_ms;  /* -1: not given */
    bool stream;
    bool timings;
    bool raw;          /* generate --raw: no chat template */
    bool request_opts; /* an option only infer/generate take was seen */
    const char *input_name;
    const char *language; /* transcribe --language */
    const char *prompt;   /* transcribe --prompt */
    const char *task;     /* transcribe --task */
    bool segments;        /* transcribe --segments */
    bool no_timestamps;   /* transcribe --no-timestamps */
    const char *graph;    /* transcribe --graph */
    const char *system;  /* generate --system: the system turn */
    const char *request_id;
    baton_client_sampling sampling;
    bool have_sampling;
    const char **inputs; /* --input specs, borrowed from argv */
    size_t n_inputs;
    const char **caps; /* --max-iters specs */
    size_t n_caps;
    const char **stops; /* --stop strings */
    size_t n_stops;
    uint32_t max_tokens; /* --max-tokens; 0: none */
    const char *text_output;
    const char **pos; /* positional arguments */
    size_t n_pos;
} ctl_opts;

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted++;
}

/* Prints "batonctl: MESSAGE" and a pointer to --help; returns the usage
 * exit status. */
__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("batonctl: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n(batonctl --help for usage)\n", stderr);
    va_end(ap);
    return EXIT_USAGE;
}

/* ---- argument parsing ------------------------------------------------------ */

static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!*s || *s == '-')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || !*s || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

/* Every option of every command; the command decides afterwards whether it
 * takes the request options, so options may come before or after it. */
static int parse_args(int argc, char **argv, ctl_opts *o)
{
    bool options = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (!options || a[0] != '-' || !strcmp(a, "-")) {
            o->pos[o->n_pos++] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            options = false;            /* the rest is positional: a prompt may begin with - */
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            exit(0);
        }
        if (!strcmp(a, "--version")) {
            printf("batonctl %s\n", BATON_VERSION);
            exit(0);
        }
        char name[32];
        const char *eq = strchr(a, '=');
        size_t n = eq ? (size_t)(eq - a) : strlen(a);
        if (n >= sizeof name)
            return usage_error("unknown option %s", a);
        memcpy(name, a, n);
        name[n] = 0;
        static const char *const flags[] = {"--json", "--stream",   "--timings",
                                            "--raw",  "--segments", "--no-timestamps"};
        bool is_flag = false;
        for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++)
            is_flag |= !strcmp(name, flags[k]);
        if (is_flag) {
            if (eq)
                return usage_error("%s takes no value", name);
        } else if (eq) {
            val = eq + 1;
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            return usage_error("%s needs a value", name);
        }
        uint64_t u;
        if (!strcmp(name, "--json")) {
            o->json = true;
        } else if (!strcmp(name, "--endpoint")) {
            o->endpoint = val;
        } else if (!strcmp(name, "--server-key")) {
            o->server_key = val;
        } else if (!strcmp(name, "--client-key")) {
            o->client_key = val;
        } else if (!strcmp(name, "--out")) {
            o->out_dir = val;
        } else if (!strcmp(name, "--timeout-ms")) {
            if (!parse_u64(val, UINT32_MAX / 2, &u))
                return usage_error("--timeout-ms: '%s' is not a number of milliseconds", val);
            o->timeout_ms = (int)u;
        } else {
            o->request_opts = true;
            if (!strcmp(name, "--stream")) {
                o->stream = true;
            } else if (!strcmp(name, "--timings")) {
                o->timings = true;
            } else if (!strcmp(name, "--raw")) {
                o->raw = true;
            } else if (!strcmp(name, "--segments")) {
                o->segments = true;
            } else if (!strcmp(name, "--no-timestamps")) {
                o->no_timestamps = true;
            } else if (!strcmp(name, "--stop")) {
                if (!*val)
                    return usage_error("%s", "--stop: a stop string cannot be empty");
                o->stops[o->n_stops++] = val;
            } else if (!strcmp(name, "--max-tokens")) {
                if (!parse_u64(val, UINT32_MAX, &u) || u == 0)
                    return usage_error("--max-tokens: '%s' is not a count >= 1", val);
                o->max_tokens = (uint32_t)u;
            } else if (!strcmp(name, "--text-output")) {
                o->text_output = val;
            } else if (!strcmp(name, "--input")) {
                o->inputs[o->n_inputs++] = val;
            } else if (!strcmp(name, "--max-iters")) {
                o->caps[o->n_caps++] = val;
            } else if (!strcmp(name, "--input-name")) {
                o->input_name = val;
            } else if (!strcmp(name, "--system")) {
                o->system = val;
            } else if (!strcmp(name, "--language")) {
                o->language = val;
            } else if (!strcmp(name, "--prompt")) {
                o->prompt = val;
            } else if (!strcmp(name, "--task")) {
                o->task = val;
            } else if (!strcmp(name, "--graph")) {
                o->graph = val;
            } else if (!strcmp(name, "--request-id")) {
                o->request_id = val;
            } else if (!strcmp(name, "--temperature")) {
                if (!parse_float(val, &o->sampling.temperature) || o->sampling.temperature < 0)
                    return usage_error("--temperature: '%s' is not a number >= 0", val);
                o->have_sampling = true;
            } else if (!strcmp(name, "--top-p")) {
                if (!parse_float(val, &o->sampling.top_p) || o->sampling.top_p < 0 ||
                    o->sampling.top_p > 1)
                    return usage_error("--top-p: '%s' is not a number in [0, 1]", val);
                o->have_sampling = true;
            } else if (!strcmp(name, "--top-k")) {
                if (!parse_u64(val, UINT32_MAX, &u))
                    return usage_error("--top-k: '%s' is not a count", val);
                o->sampling.top_k = (uint32_t)u;
                o->have_sampling = true;
            } else if (!strcmp(name, "--seed")) {
                if (!parse_u64(val, UINT64_MAX, &u))
                    return usage_error("--seed: '%s' is not an unsigned integer", val);
                o->sampling.seed = u;
                o->have_sampling = true;
            } else {
                return usage_error("unknown option %s", name);
            }
        }
    }
    return 0;
}

/* ---- tensors from the command line ----------------------------------------- */

/* Reads all of PATH into a new buffer. */
static int read_file(const char *path, uint8_t **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "batonctl: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        uint8_t *grown = realloc(buf, cap *= 2);
        if (!grown)
            free(buf);
        buf = grown;
    }
    int bad = !buf || ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "batonctl: %s: cannot read\n", path);
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

/* Parses one element V of DT into DST (little-endian, as the host is). */
static bool parse_value(const char *v, baton_client_dtype dt, uint8_t *dst)
{
    char *end;
    errno = 0;
    if (dt == BATON_CLIENT_DTYPE_F32 || dt == BATON_CLIENT_DTYPE_F16 ||
        dt == BATON_CLIENT_DTYPE_BF16) {
        float f = strtof(v, &end);
        if (errno == EINVAL || end == v || *end)
            return false;
        uint16_t h = dt == BATON_CLIENT_DTYPE_F16 ? ctl_f32_to_f16(f) : ctl_f32_to_bf16(f);
        memcpy(dst, dt == BATON_CLIENT_DTYPE_F32 ? (void *)&f : (void *)&h,
               baton_client_dtype_size(dt));
        return true;
    }
    if (dt == BATON_CLIENT_DTYPE_BOOL && (!strcmp(v, "true") || !strcmp(v, "false"))) {
        *dst = v[0] == 't';
        return true;
    }
    long long x = strtoll(v, &end, 0);
    if (errno || end == v || *end)
        return false;
    switch (dt) {
    case BATON_CLIENT_DTYPE_I32: {
        if (x < INT32_MIN || x > INT32_MAX)
            return false;
        int32_t i = (int32_t)x;
        memcpy(dst, &i, 4);
        return true;
    }
    case BATON_CLIENT_DTYPE_I64: memcpy(dst, &x, 8); return true;
    case BATON_CLIENT_DTYPE_U8: *dst = (uint8_t)x; return x >= 0 && x <= 255;
    case BATON_CLIENT_DTYPE_BOOL: *dst = (uint8_t)x; return x == 0 || x == 1;
    default: return false;
    }
}

/* Adds the input described by SPEC (NAME=DTYPE:...) to R; 0 or an exit code. */
static int add_input(baton_client_request *r, const char *spec)
{
    int status = EXIT_USAGE;
    char *s = strdup(spec), *vals, *dims_s = NULL, *colon;
    uint8_t *data = NULL;
    size_t nbytes = 0, ndims = 0;
    int64_t dims[16];
    if (!s)
        return EXIT_CONN;
    char *eq = strchr(s, '='), *name = s;
    if (!eq || eq == s || !(colon = strchr(eq + 1, ':'))) {
        usage_error("--input '%s': expected NAME=DTYPE:[DIMS:]VALUES or NAME=text:STRING", spec);
        goto out;
    }
    *eq = *colon = 0;
    const char *dtname = eq + 1;
    vals = colon + 1;
    bool text = !strcmp(dtname, "text");
    baton_client_dtype dt = BATON_CLIENT_DTYPE_U8;
    if (!text && baton_client_dtype_from_name(dtname, &dt) != 0) {
        usage_error("--input: unknown dtype '%s' (f32 f16 bf16 i32 i64 u8 bool text)", dtname);
        goto out;
    }
    if (!text && (colon = strchr(vals, ':'))) {
        dims_s = vals;
        *colon = 0;
        vals = colon + 1;
    }
    size_t esz = baton_client_dtype_size(dt);
    if (vals[0] == '@') {
        if (read_file(vals + 1, &data, &nbytes) != 0)
            goto out;
    } else if (text) {
        nbytes = strlen(vals);
        data = (uint8_t *)strdup(vals);
    } else {
        size_t n = *vals ? 1 : 0;
        for (const char *p = vals; *p; p++)
            n += *p == ',';
        data = malloc(n * esz + 1);
        char *save = NULL;
        for (char *tok = strtok_r(vals, ",", &save); data && tok;
             tok = strtok_r(NULL, ",", &save)) {
            if (!parse_value(tok, dt, data + nbytes)) {
                usage_error("--input: '%s' is not a valid value of that dtype", tok);
                goto out;
            }
            nbytes += esz;
        }
    }
    if (!data) {
        status = EXIT_CONN;
        goto out;
    }
    if (dims_s) {
        char *save = NULL;
        for (char *tok = strtok_r(dims_s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            uint64_t d;
            if (ndims == 16 || !parse_u64(tok, INT64_MAX, &d)) {
                usage_error("--input: bad dims near '%s' (at most 16 dims, each >= 0)", tok);
                goto out;
            }
            dims[ndims++] = (int64_t)d;
        }
    } else {
        if (nbytes % esz) {
            usage_error("--input %s: the file size is not a multiple of the dtype size", name);
            goto out;
        }
        dims[ndims++] = (int64_t)(nbytes / esz);
    }
    int rc = baton_client_request_add_input(r, name, dt, dims, ndims, data, nbytes);
    if (rc == BATON_CLIENT_EINVAL)
        usage_error("--input %s: the values do not match the dims (or the name repeats)", name);
    else if (rc != 0)
        fprintf(stderr, "batonctl: --input %s: %s\n", name, baton_client_strerror(rc));
    status = rc == 0 ? 0 : rc == BATON_CLIENT_EINVAL ? EXIT_USAGE : EXIT_CONN;
out:
    free(data);
    free(s);
    return status;
}

/* ---- commands ---------------------------------------------------------------- */

/* A connection that did not come up: on an ipc:// socket file that nobody
 * listens on (left by a batond that did not stop cleanly), that is why. */
static int conn_error(const ctl_opts *o, int rc)
{
    const char *file = bt_ipcfile_path(o->endpoint);
    if (rc == BATON_CLIENT_ECONNECT && file && bt_ipcfile_probe(file) == BT_IPCFILE_STALE)
        fprintf(stderr, "batonctl: cannot connect to %s: nobody listens on its socket file (is "
                "batond running?)\n", o->endpoint);
    else
        fprintf(stderr, "batonctl: %s: %s%s\n", o->endpoint, baton_client_strerror(rc),
                rc == BATON_CLIENT_ECONNECT ? " (is batond running?)" : "");
    return EXIT_CONN;
}

static int connect_daemon(const ctl_opts *o, baton_client **out)
{
    /* An ipc socket file that does not exist will not appear within a
     * command's wait in any useful case (batond removes it when it stops):
     * say so at once instead of waiting for the connect timeout.  A file
     * nobody listens on yet is waited for like any connection: a batond
     * that is starting has bound it a moment before it listens. */
    const char *file = bt_ipcfile_path(o->endpoint);
    if (file && bt_ipcfile_probe(file) == BT_IPCFILE_ABSENT) {
        fprintf(stderr, "batonctl: cannot connect to %s: there is no socket file (is batond "
                "running?)\n", o->endpoint);
        return EXIT_CONN;
    }
    char server[BT_CURVE_Z85_SIZE], err[600];
    bt_curve_keypair own;
    memset(&own, 0, sizeof(own));
    baton_client_options co = {.connect_timeout_ms = o->timeout_ms >= 0 ? o->timeout_ms : 5000};
    if (o->server_key) {
        /* A key itself, or the path of its .pub file. */
        size_t n = strlen(o->server_key);
        if (bt_curve_z85_valid(o->server_key, NULL)) {
            memcpy(server, o->server_key, sizeof(server));
        } else if (n > 4 && !strcmp(o->server_key + n - 4, ".key")) {
            return usage_error("--server-key: give the daemon's public key or .pub file, not "
                               "a .key (secret) file");
        } else if (bt_curve_public_load(o->server_key, server, err, sizeof(err)) != 0) {
            return usage_error("--server-key: neither a 40-character Z85 key nor a public key "
                               "file: %s", err);
        }
        co.server_public_key = server;
    }
    if (o->client_key) {
        if (!o->server_key)
            return usage_error("%s", "--client-key needs --server-key (the daemon's public key)");
        if (bt_curve_secret_load(o->client_key, &own, err, sizeof(err)) != 0)
            return usage_error("--client-key: %s", err);
        co.public_key = own.public_z85;
        co.secret_key = own.secret_z85;
    }
    int rc = baton_client_create_with(o->endpoint, &co, out);
    bt_curve_keypair_wipe(&own);
    if (rc == BATON_CLIENT_EINVAL)
        return usage_error("%s", "--server-key/--client-key: not usable CURVE keys (or this "
                           "libzmq has no CURVE)");
    return rc ? conn_error(o, rc) : 0;
}

/* keygen [--out DIR] NAME: a fresh pair into NAME.key and NAME.pub. */
static int cmd_keygen(const ctl_opts *o)
{
    if (o->n_pos != 2)
        return usage_error("%s", "keygen takes one NAME (the files are NAME.key and NAME.pub)");
    bt_curve_keypair k;
    char err[600];
    int rc = bt_curve_keypair_generate(&k);
    if (rc != 0) {
        fprintf(stderr, "batonctl: keygen: %s\n", bt_curve_strerror(rc));
        return EXIT_CONN;
    }
    rc = bt_curve_keypair_write(o->out_dir, o->pos[1], &k, err, sizeof(err));
    if (rc == 0)
        printf("%s\n", k.public_z85);
    else
        fprintf(stderr, "batonctl: keygen: %s\n", err);
    bt_curve_keypair_wipe(&k);
    return rc == 0 ? 0 : rc == BT_CURVE_EINVAL ? EXIT_USAGE : EXIT_STATUS;
}

/* The first input of GRAPH, read from the "graph NAME: ...; inputs: A B"
 * line of the inspect text (the format batond --check-config prints);
 * "prompt" when the daemon does not say. Fails only when the daemon cannot
 * be reached, which the request would hit too. */
static int first_input(baton_client *c, const ctl_opts *o, const char *graph, char *buf,
                       size_t cap)
{
    baton_client_event *ev;
    snprintf(buf, cap, "prompt");
    int rc = baton_client_inspect(c, graph, o->timeout_ms >= 0 ? o->timeout_ms : 5000, &ev);
    if (rc == BATON_CLIENT_ECONNECT)
        return rc;
    if (rc != 0)
        return 0;
    char head[300];
    snprintf(head, sizeof head, "graph %s:", graph);
    for (const char *l = ev->text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *eol = strchr(l, '\n'), *in = strstr(l, "inputs:");
        if (strncmp(l, head, strlen(head)) || !in || (eol && in > eol))
            continue;
        in += strlen("inputs:");
        in += strspn(in, " [");
        size_t n = strcspn(in, " ,]\n");
        if (n && n < cap)
            snprintf(buf, cap, "%.*s", (int)n, in);
        break;
    }
    baton_client_event_free(ev);
    return 0;
}

/* --max-iters LOOP=N: caps loop LOOP of R at N iterations.  0, or the
 * usage exit status (reported). */
static int add_max_iters(baton_client_request *r, const char *spec)
{
    const char *eq = strchr(spec, '=');
    uint64_t n;
    char loop[256];
    if (!eq || eq == spec || (size_t)(eq - spec) >= sizeof loop ||
        !parse_u64(eq + 1, UINT32_MAX, &n) || n == 0)
        return usage_error("--max-iters '%s': expected LOOP=N with N >= 1", spec);
    snprintf(loop, sizeof loop, "%.*s", (int)(eq - spec), spec);
    baton_client_request_set_max_iters(r, loop, (uint32_t)n);
    return 0;
}

/* transcribe: FILE as the U8 input 'audio' (read by add_input) and the
 * options JSON as the text input 'options'.  0, or the usage exit status
 * (reported). */
static int add_audio(baton_client_request *r, const ctl_opts *o)
{
    static const char *const tasks[] = {"transcribe", "translate"};
    if (o->task && strcmp(o->task, tasks[0]) && strcmp(o->task, tasks[1]))
        return usage_error("--task: '%s' is transcribe or translate", o->task);
    /* A language code is letters (en, yue, haw): nothing to escape in JSON. */
    for (const char *c = o->language; c && *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z')) || c - o->language >= 16)
            return usage_error("--language: '%s' is not a language code such as en", o->language);
    json_t *opts = json_object(), *prompt = o->prompt ? json_string(o->prompt) : NULL;
    if (o->prompt && !prompt) {
        json_decref(opts);
        return usage_error("%s", "--prompt: the text is not valid UTF-8");
    }
    if (opts && o->language && *o->language)
        json_object_set_new(opts, "language", json_string(o->language));
    if (opts && o->task)
        json_object_set_new(opts, "task", json_string(o->task));
    if (opts && o->no_timestamps)
        json_object_set_new(opts, "timestamps", json_false());
    if (opts && prompt)
        json_object_set_new(opts, "prompt", prompt);
    else
        json_decref(prompt);
    char *json = opts ? json_dumps(opts, 0) : NULL;
    json_decref(opts);
    char spec[4200];
    /* The Whisper backend takes options of at most 4096 bytes. */
    if (!json || strlen(json) > 4096) {
        free(json);
        return usage_error("%s", "--prompt: too long (the options JSON takes at most 4096 bytes)");
    }
    if (strlen(o->pos[1]) > 4000) {
        free(json);
        return usage_error("%s", "transcribe: the file name is too long");
    }
    snprintf(spec, sizeof spec, "audio=u8:@%s", o->pos[1]);
    int status = add_input(r, spec);
    if (!status) {
        snprintf(spec, sizeof spec, "options=text:%s", json);
        status = add_input(r, spec);
    }
    free(json);
    return status;
}

/* infer GRAPH, generate GRAPH TEXT: the request that the command line
 * asks for (its graph, id, --input, --max-iters, sampling and text limits)
 * into *OUT, all but generate's TEXT, which needs the daemon.  0, or the
 * usage exit status (reported; *OUT may still need destroying). */
static int request_from_args(const ctl_opts *o, bool generate, baton_client_request **out)
{
    int status;
    *out = NULL;
    bool transcribe = !strcmp(o->pos[0], "transcribe");
    if (o->n_pos != (generate && !transcribe ? 3u : 2u))
        return usage_error("%s", transcribe ? "transcribe takes one FILE"
                                 : generate ? "generate takes GRAPH and TEXT"
                                            : "infer takes one GRAPH (inputs go in --input)");
    const char *graph = transcribe ? (o->graph ? o->graph : "transcribe") : o->pos[1];
    if (baton_client_request_create(graph, o->request_id, out) != 0)
        return usage_error("bad graph name or --request-id '%s' (1 to 256 bytes)",
                           o->request_id ? o->request_id : graph);
    baton_client_request *r = *out;
    for (size_t i = 0; i < o->n_inputs; i++)
        if ((status = add_input(r, o->inputs[i])) != 0)
            return status;
    for (size_t i = 0; i < o->n_caps; i++)
        if ((status = add_max_iters(r, o->caps[i])) != 0)
            return status;
    if (transcribe && (status = add_audio(r, o)) != 0)
        return status;
    /* A voice chat's system prompt: the turns before the question, which
     * voice.yaml's graph takes in its optional input 'context'. */
    if (transcribe && o->system &&
        (baton_client_request_add_message(r, "system", o->system) != 0 ||
         baton_client_request_set_messages_input(r, "context") != 0))
        return usage_error("%s", "out of memory");
    if (o->have_sampling)
        baton_client_request_set_sampling(r, &o->sampling);
    for (size_t i = 0; i < o->n_stops; i++)
        baton_client_request_add_stop(r, o->stops[i]);
    baton_client_request_set_max_tokens(r, o->max_tokens);
    if (o->text_output)
        baton_client_request_set_text_output(r, o->text_output);
    return 0;
}

/* generate: TEXT into R as the input --input-name names, else the graph's
 * first one (asked of the daemon C), with the --system turn as messages,
 * marked raw with --raw.  0, or an exit status (reported). */
static int add_prompt(baton_client *c, const ctl_opts *o, baton_client_request *r)
{
    char name[256];
    int rc;
    if (o->input_name) {
        snprintf(name, sizeof name, "%s", o->input_name);
    } else if ((rc = first_input(c, o, o->pos[1], name, sizeof name)) != 0) {
        return conn_error(o, rc);
    }
    if (o->system) {
        /* A system turn and the user's: a conversation the model's
         * template renders, not text. */
        if (baton_client_request_add_message(r, "system", o->system) != 0 ||
            baton_client_request_add_message(r, "user", o->pos[2]) != 0 ||
            baton_client_request_set_messages_input(r, name) != 0)
            return usage_error("%s", "out of memory");
    } else if (baton_client_request_add_text(r, name, o->pos[2]) != 0) {
        return usage_error("input '%s' is empty or given twice", name);
    }
    if (o->raw && baton_client_request_add_raw_input(r, name) != 0)
        return usage_error("%s", "out of memory");
    return 0;
}

/* Sends R on C: streamed for generate or --stream, with --timeout-ms as
 * its deadline, and Ctrl-C set to cancel it from then on.  0, or the
 * connection exit status (reported). */
static int send_request(baton_client *c, const ctl_opts *o, bool generate,
                        baton_client_request *r)
{
    baton_client_request_set_stream(r, generate || o->stream);
    if (o->timeout_ms >= 0)
        baton_client_request_set_timeout(r, (uint32_t)o->timeout_ms);
    struct sigaction sa = {.sa_handler = on_sigint}; /* no SA_RESTART: the wait must end */
    sigaction(SIGINT, &sa, NULL);
    int rc = baton_client_send(c, r);
    return rc ? conn_error(o, rc) : 0;
}

/* What the receive loop has printed so far (without --json). */
typedef struct run_output {
    bool midline;                 /* stdout's last text did not end its line */
    size_t chunks;                /* chunks printed */
    char stream[64];              /* the name of the text stream printed last */
} run_output;

/* A chunk as it arrives: streamed text as it is, any other value on a line
 * of its own after its sequence number.  A graph may stream several texts
 * (a voice chat's transcript and answer): a text stream named other than
 * `text` starts on a line of its own after its name. */
/* transcribe --segments: each JSON line of a `segments` chunk as
 * "[start --> end] text". */
static void print_segments(const baton_client_tensor *v, run_output *out)
{
    const char *p = (const char *)v->data, *end = p + v->nbytes;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        json_t *o = json_loadb(p, n, 0, NULL);
        const char *text = json_string_value(json_object_get(o, "text"));
        if (text) {
            char a[32], b[32];
            ctl_clock(json_number_value(json_object_get(o, "start")), a, sizeof(a));
            ctl_clock(json_number_value(json_object_get(o, "end")), b, sizeof(b));
            printf("%s[%s --> %s] %s\n", out->midline ? "\n" : "", a, b,
                   text + (*text == ' '));
            out->midline = false;
        }
        json_decref(o);
        p += n + 1;
    }
}

static void print_chunk(const ctl_opts *o, const baton_client_event *ev, run_output *out)
{
    if (o->json) {
        ctl_print_json(stdout, ev);
        return;
    }
    out->chunks++;
    if (!strcmp(o->pos[0], "transcribe") && ev->value.name) {
        /* A transcription's segments are its text again, with times:
         * printed instead of the text with --segments, else not at all. */
        bool seg = !strcmp(ev->value.name, "segments");
        if (seg && o->segments)
            print_segments(&ev->value, out);
        if (seg || (o->segments && !strcmp(ev->value.name, "text"))) {
            fflush(stdout);
            return;
        }
    }
    if (ctl_is_text(&ev->value)) {
        const char *name = ev->value.name ? ev->value.name : "";
        if (strncmp(out->stream, name, sizeof(out->stream) - 1) != 0) {
            snprintf(out->stream, sizeof(out->stream), "%s", name);
            if (out->midline)
                fputc('\n', stdout);
            out->midline = false;
            if (strcmp(name, "text") != 0) {
                printf("%s: ", name);
                out->midline = true;
            }
        }
        fwrite(ev->value.data, 1, ev->value.nbytes, stdout);
        if (ev->value.nbytes)
            out->midline = ev->value.data[ev->value.nbytes - 1] != '\n';
    } else {
        if (out->midline)
            fputc('\n', stdout);
        out->midline = false;
        printf("[%" PRIu64 "] ", ev->seq);
        ctl_print_tensor(stdout, &ev->value);
    }
    fflush(stdout);
}

/* The response's outputs on stdout, from a fresh line; generate prints a
 * text output as its text.  A transcription's stdout is its text alone:
 * other outputs (the audio's duration) go to stderr beside the summary. */
static void print_outputs(const baton_client_event *ev, bool generate, bool transcribe,
                          run_output *out)
{
    if (out->midline)
        fputc('\n', stdout);
    out->midline = false;
    for (size_t i = 0; i < ev->n_outputs; i++) {
        if (generate && ctl_is_text(&ev->outputs[i])) {
            fwrite(ev->outputs[i].data, 1, ev->outputs[i].nbytes, stdout);
            fputc('\n', stdout);
        } else {
            ctl_print_tensor(transcribe ? stderr : stdout, &ev->outputs[i]);
        }
    }
    fflush(stdout);
}

/* The one line on stderr that sums up an OK response: time, chunks, node
 * runs, seed, tokens, how loops and the text ended. */
static void print_summary(const baton_client_event *ev, size_t chunks)
{
    fprintf(stderr, "OK: %.1f ms, %zu chunk%s, %zu node run%s, seed %" PRIu64,
            (double)ev->total_us / 1000, chunks, chunks == 1 ? "" : "s", ev->n_timings,
            ev->n_timings == 1 ? "" : "s", ev->seed);
    if (ev->prompt_tokens || ev->completion_tokens)
        fprintf(stderr, ", tokens %u prompt + %u generated", ev->prompt_tokens,
                ev->completion_tokens);
    if (ev->cached_tokens)
        fprintf(stderr, " (%u prompt tokens cached)", ev->cached_tokens);
    for (size_t i = 0; i < ev->n_loop_ends; i++)
        fprintf(stderr, ", %s ended by %s", ev->loop_ends[i].loop,
                ev->loop_ends[i].how == BATON_CLIENT_LOOP_MAX_ITERS ? "max_iters"
                                                                    : "its finish signal");
    if (ev->finish_reason == BATON_CLIENT_FINISH_STOP)
        fprintf(stderr, ", text ended by a stop string");
    else if (ev->finish_reason == BATON_CLIENT_FINISH_LENGTH)
        fprintf(stderr, ", text ended by max-tokens");
    fputc('\n', stderr);
}

/* The response that ends the request: its outputs, --timings, and the
 * summary or the error.  Returns the command's exit status. */
static int print_response(const ctl_opts *o, bool generate, const baton_client_event *ev,
                          run_output *out)
{
    if (o->json)
        ctl_print_json(stdout, ev);
    else
        print_outputs(ev, generate, !strcmp(o->pos[0], "transcribe"), out);
    if (o->timings)
        ctl_print_timings(ev);
    if (ev->code != BATON_CLIENT_CODE_OK) {
        fprintf(stderr, "batonctl: %s: %s\n", baton_client_code_name(ev->code), ev->message);
        return EXIT_STATUS;
    }
    if (!o->json)
        print_summary(ev, out->chunks);
    return 0;
}

/* Prints the events of request RID as they come until its response, and
 * returns the command's exit status.  A first Ctrl-C cancels the request
 * (its CANCELLED response still comes), a second stops waiting (130). */
static int receive_answer(baton_client *c, const ctl_opts *o, bool generate, const char *rid)
{
    /* Without --timeout-ms the daemon's deadline ends the request; with
     * it, the client waits 2 s longer than the request may take. */
    int wait_ms = o->timeout_ms >= 0 ? o->timeout_ms + 2000 : -1;
    run_output out = {0};
    bool cancelled = false;
    for (;;) {
        baton_client_event *ev;
        int rc = baton_client_recv(c, wait_ms, &ev);
        if (interrupted > 1) { /* a second Ctrl-C: stop waiting for the answer */
            if (rc == 0)
                baton_client_event_free(ev);
            return 130;
        }
        if (interrupted && !cancelled) { /* the terminal CANCELLED response still comes */
            fprintf(stderr, "%sbatonctl: cancelling %s\n", out.midline ? "\n" : "", rid);
            out.midline = false;
            baton_client_cancel(c, rid);
            cancelled = true;
            wait_ms = 5000;
        }
        if (rc == BATON_CLIENT_EINTR)
            continue;
        if (rc != 0)
            return conn_error(o, rc);
        if (strcmp(ev->request_id, rid) || (ev->kind != BATON_CLIENT_EVENT_CHUNK &&
                                            ev->kind != BATON_CLIENT_EVENT_RESPONSE)) {
            /* Not ours (a stray answer), or the answer to our own cancel:
             * the response that ends the request is what counts. */
            baton_client_event_free(ev);
            continue;
        }
        if (ev->kind == BATON_CLIENT_EVENT_CHUNK) {
            print_chunk(o, ev, &out);
            baton_client_event_free(ev);
            continue;
        }
        int status = print_response(o, generate, ev, &out);
        baton_client_event_free(ev);
        return status;
    }
}

/* infer and generate: build, send, then print events until the response.
 * The command line is checked before connecting, so that a usage error is
 * reported as one (exit 2) whether the daemon runs or not. */
static int cmd_run(const ctl_opts *o, bool generate)
{
    baton_client *c = NULL;
    baton_client_request *r = NULL;
    int status = request_from_args(o, generate, &r);
    if (status == 0)
        status = connect_daemon(o, &c);
    if (status == 0 && generate && strcmp(o->pos[0], "transcribe") != 0)
        status = add_prompt(c, o, r);
    if (status == 0)
        status = send_request(c, o, generate, r);
    if (status == 0)
        status = receive_answer(c, o, generate, baton_client_request_id(r));
    baton_client_request_destroy(r);
    baton_client_destroy(c);
    return status;
}

/* health, stats, inspect. */
static int cmd_probe(const ctl_opts *o, baton_client_event_kind kind)
{
    baton_client *c;
    baton_client_event *ev;
    int wait_ms = o->timeout_ms >= 0 ? o->timeout_ms : 5000, rc;
    if (o->n_pos > (kind == BATON_CLIENT_EVENT_INSPECT ? 2u : 1u))
        return usage_error("%s: too many arguments", o->pos[0]);
    if ((rc = connect_daemon(o, &c)) != 0)
        return rc;
    const char *graph = o->n_pos > 1 ? o->pos[1] : NULL;
    rc = kind == BATON_CLIENT_EVENT_HEALTH ? baton_client_health(c, wait_ms, &ev)
       : kind == BATON_CLIENT_EVENT_STATS  ? baton_client_stats(c, wait_ms, &ev)
                                           : baton_client_inspect(c, graph, wait_ms, &ev);
    if (rc != 0) {
        rc = conn_error(o, rc);
        baton_client_destroy(c);
        return rc;
    }
    int status = 0;
    if (o->json) {
        ctl_print_json(stdout, ev);
    } else if (kind == BATON_CLIENT_EVENT_HEALTH) {
        printf("live: %s\nready: %s\nworkers ready:", ev->live ? "yes" : "no",
               ev->ready ? "yes" : "no");
        for (size_t i = 0; i < ev->n_workers_ready; i++)
            printf(" %s", ev->workers_ready[i]);
        printf("%s\n", ev->n_workers_ready ? "" : " none");
        if (*ev->message)
            printf("message: %s\n", ev->message);
    } else {
        size_t n = strlen(ev->text);
        fputs(ev->text, stdout);
        if (n && ev->text[n - 1] != '\n')
            fputc('\n', stdout);
    }
    if (kind == BATON_CLIENT_EVENT_HEALTH && !(ev->live && ev->ready))
        status = EXIT_STATUS;
    baton_client_event_free(ev);
    baton_client_destroy(c);
    return status;
}

static int cmd_cancel(const ctl_opts *o)
{
    baton_client *c;
    int rc;
    if (o->n_pos != 2)
        return usage_error("%s", "cancel takes one request ID");
    if ((rc = connect_daemon(o, &c)) != 0)
        return rc;
    baton_client_event *ev;
    rc = baton_client_cancel_wait(c, o->pos[1], o->timeout_ms >= 0 ? o->timeout_ms : 5000, &ev);
    if (rc != 0) {
        rc = conn_error(o, rc);
        baton_client_destroy(c);
        return rc;
    }
    int status = 0;
    if (o->json) {
        ctl_print_json(stdout, ev);
    } else if (ev->code == BATON_CLIENT_CODE_OK) {
        fprintf(stderr, "batonctl: request %s is being cancelled\n", ev->request_id);
    }
    if (ev->code != BATON_CLIENT_CODE_OK) {
        if (!o->json)
            fprintf(stderr, "batonctl: %s: %s\n", baton_client_code_name(ev->code), ev->message);
        status = EXIT_STATUS;
    }
    baton_client_event_free(ev);
    baton_client_destroy(c);
    return status;
}

int main(int argc, char **argv)
{
    /* Each argument is at most one input, cap, stop or positional: argc bounds
     * the arrays, so parsing needs no growth. */
    const char **slots = calloc(4 * (size_t)argc, sizeof *slots);
    if (!slots)
        return EXIT_CONN;
    ctl_opts o = {.timeout_ms = -1, .inputs = slots, .caps = slots + argc, .pos = slots + 2 * argc,
                  .stops = slots + 3 * argc};
    int status = parse_args(argc, argv, &o);
    if (status)
        goto out;
    if (!o.endpoint)
        o.endpoint = getenv("BATON_ENDPOINT");
    if (!o.endpoint || !*o.endpoint)
        o.endpoint = BATON_CLIENT_DEFAULT_ENDPOINT;
    if (!o.server_key && getenv("BATON_SERVER_KEY") && *getenv("BATON_SERVER_KEY"))
        o.server_key = getenv("BATON_SERVER_KEY");
    if (!o.client_key && getenv("BATON_CLIENT_KEY") && *getenv("BATON_CLIENT_KEY"))
        o.client_key = getenv("BATON_CLIENT_KEY");
    const char *cmd = o.n_pos ? o.pos[0] : NULL;
    bool run = cmd && (!strcmp(cmd, "infer") || !strcmp(cmd, "generate") ||
                       !strcmp(cmd, "transcribe"));
    if (!cmd) {
        fputs(usage_text, stderr);
        status = EXIT_USAGE;
    } else if (!strcmp(cmd, "help")) {
        fputs(usage_text, stdout);
    } else if (o.out_dir && strcmp(cmd, "keygen")) {
        status = usage_error("%s", "--out is for keygen");
    } else if (!strcmp(cmd, "keygen")) {
        status = o.request_opts ? usage_error("%s", "keygen takes no request options")
                                : cmd_keygen(&o);
    } else if (o.request_opts && !run) {
        status = usage_error("%s takes no request options (--input, --stream, ...)", cmd);
    } else if ((o.language || o.task || o.graph || o.prompt || o.segments || o.no_timestamps) &&
               strcmp(cmd, "transcribe")) {
        status = usage_error("%s", "--language, --task, --graph, --prompt, --segments and "
                                   "--no-timestamps are for transcribe");
    } else if (o.segments && o.no_timestamps) {
        status = usage_error("%s", "--segments needs timestamps: it does not go with "
                                   "--no-timestamps");
    } else if ((o.input_name || o.raw) && strcmp(cmd, "generate")) {
        status = usage_error("%s", "--input-name and --raw are for generate");
    } else if (o.system && strcmp(cmd, "generate") && strcmp(cmd, "transcribe")) {
        status = usage_error("%s", "--system is for generate and transcribe");
    } else if (o.raw && o.system) {
        status = usage_error("%s", "--raw sends TEXT as it is: it does not go with --system");
    } else if (run) {
        status = cmd_run(&o, cmd[0] == 'g' || cmd[0] == 't');
    } else if (!strcmp(cmd, "health")) {
        status = cmd_probe(&o, BATON_CLIENT_EVENT_HEALTH);
    } else if (!strcmp(cmd, "stats")) {
        status = cmd_probe(&o, BATON_CLIENT_EVENT_STATS);
    } else if (!strcmp(cmd, "inspect")) {
        status = cmd_probe(&o, BATON_CLIENT_EVENT_INSPECT);
    } else if (!strcmp(cmd, "cancel")) {
        status = cmd_cancel(&o);
    } else {
        status = usage_error("unknown command '%s'", cmd);
    }
out:
    free(slots);
    return status;
}
