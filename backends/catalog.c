/* The declaration of every built-in backend: its name and its options,
 * with each option's type, default and allowed values.
 *
 * This table is data, not code: the worker registers an implementation under
 * each name, and the config loader checks `backend:` and `options:` against
 * the declarations here.  Keeping the declaration out of the backends lets
 * `batond --check-config` reject a typo or a value out of range without
 * starting a worker; the backends read their options through bt_opt_parse,
 * so that the defaults and limits stated here are the ones they use. */
#include "backends/catalog.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

#define N_OPTS(a) (sizeof(a) / sizeof((a)[0]))

/* Every option of type BT_OPT_INT states its range (a count has no upper
 * limit but INT64_MAX), and of BT_OPT_STRING the values it allows unless
 * any text will do. */
static const bt_opt_desc counter_options[] = {
    {.name = "finish_after", .type = BT_OPT_INT, .min = 0, .max = INT64_MAX,
     .doc = "raise the finish signal when iteration + 1 equals this; unset: never"},
    {.name = "slots", .type = BT_OPT_INT, .min = 1, .max = 1024,
     .doc = "places a request's loop holds from its iteration 0 to its finish; an "
            "iteration 0 that finds none free waits in the worker's queue (defer); unset: "
            "no limit"},
};

static const bt_opt_desc chunks_options[] = {
    {.name = "n", .type = BT_OPT_INT, .def = "3", .min = 0, .max = INT64_MAX,
     .doc = "number of chunks emitted on each stream output"},
};

static const bt_opt_desc sleep_options[] = {
    {.name = "ms", .type = BT_OPT_INT, .def = "10", .min = 0, .max = INT64_MAX,
     .doc = "milliseconds to wait before echoing the inputs"},
};

static const bt_opt_desc fail_options[] = {
    {.name = "message", .type = BT_OPT_STRING, .def = "failure injected by the fail backend",
     .doc = "text of the error every execution returns"},
    {.name = "device_fault", .type = BT_OPT_BOOL, .def = "false",
     .doc = "on a GPU worker, first launch a kernel that reads outside device memory: the CUDA "
            "context becomes unusable and the worker must exit and be restarted (tests that)"},
};

static const bt_opt_desc group_options[] = {
    {.name = "fail_rank", .type = BT_OPT_INT, .def = "-1", .min = -1, .max = 1023,
     .doc = "the tensor-parallel rank whose load fails at once, before it joins the group "
            "(tests what the other ranks do then); -1: none"},
    {.name = "hang_rank", .type = BT_OPT_INT, .def = "-1", .min = -1, .max = 1023,
     .doc = "the rank that stops in its step hang_at, alive but never reaching that step's "
            "all-reduce (tests the step deadline); -1: none"},
    {.name = "hang_at", .type = BT_OPT_INT, .def = "1", .min = 1, .max = INT64_MAX,
     .doc = "the step (1: its first) in which hang_rank stops"},
};

/* In the order the refusal lists them. */
static const char *const kv_dtypes[] = {"auto", "f16", "q8_0", "f32", NULL};
static const char *const activation_kinds[] = {"q8", "f32", NULL};

static const bt_opt_desc transformer_options[] = {
    {.name = "path", .type = BT_OPT_PATH, .required = 1,
     .doc = "GGUF file, or Hugging Face folder with config.json and *.safetensors"},
    {.name = "max_seq", .type = BT_OPT_INT, .def = "2048", .min = 2, .max = 1 << 20,
     .doc = "tokens one session's KV cache holds, prompt and output"},
    {.name = "kv_dtype", .type = BT_OPT_STRING, .def = "auto", .allowed = kv_dtypes,
     .doc = "element type of the KV cache: auto (the device's: f16 on a CPU, f32 on a GPU), "
            "f16 (CPU only), q8_0 (CPU only) or f32"},
    {.name = "activations", .type = BT_OPT_STRING, .def = "q8", .allowed = activation_kinds,
     .doc = "CPU only: q8 quantizes the activations of quantized products to 8 bits per block "
            "and multiplies as integers (llama.cpp's way); f32 keeps them f32"},
    {.name = "prefill_chunk", .type = BT_OPT_INT, .def = "256", .min = 1, .max = 1 << 16,
     .doc = "tokens one prefill run takes; a longer prompt runs in chunks"},
    {.name = "chat_template", .type = BT_OPT_BOOL, .def = "true",
     .doc = "wrap a text prompt in the chat template the GGUF carries"},
    {.name = "eos", .type = BT_OPT_INT, .def = "-1", .min = -1, .max = INT32_MAX,
     .doc = "token id that raises the finish signal; -1: the GGUF's"},
    {.name = "threads", .type = BT_OPT_INT, .def = "0", .min = 0, .max = 1024,
     .doc = "CPU threads one kernel may use; 0: the worker's `threads`"},
    {.name = "prefix_cache", .type = BT_OPT_BOOL, .def = "true",
     .doc = "keep the KV of ended requests (prompt and output) and let a later prompt that "
            "begins the same way read it instead of computing it (not under tensor "
            "parallelism)"},
    {.name = "batch_invariant", .type = BT_OPT_BOOL, .def = "false",
     .doc = "CPU only: compute every token the same way whatever is computed beside it (a "
            "prefill of any chunking, a decode step of any batch), so that greedy tokens do "
            "not depend on the load or on what the prefix cache held; slower"},
    {.name = "prefix_cache_mb", .type = BT_OPT_INT, .def = "256", .min = 0, .max = 1 << 20,
     .doc = "MiB of host memory for cached prefixes that lost their decode slot, least "
            "recently used dropped first; 0: only those still in a free slot"},
};

static const bt_opt_desc whisper_options[] = {
    {.name = "path", .type = BT_OPT_PATH, .required = 1,
     .doc = "folder of a CTranslate2 Whisper model: model.bin, config.json, tokenizer.json "
            "(faster-whisper's format)"},
    {.name = "activations", .type = BT_OPT_STRING, .def = "q8", .allowed = activation_kinds,
     .doc = "CPU only: q8 keeps the decoder's per-token matrices in 8 bits and multiplies "
            "8-bit activations as integers (the products over the audio stay f32, faster "
            "through sgemm); f32 widens every weight to f32 (the reference)"},
    {.name = "max_audio_s", .type = BT_OPT_INT, .def = "600", .min = 1, .max = 86400,
     .doc = "longest audio a request may send, in seconds; longer is refused"},
    {.name = "threads", .type = BT_OPT_INT, .def = "0", .min = 0, .max = 1024,
     .doc = "CPU threads one kernel may use; 0: the worker's `threads`"},
};

/* Backends without options point at no array; n_options says 0. */
static const bt_backend_desc echo_backend = {
    "echo", "every output X carries input X if there is one, else the first input", NULL, 0};
static const bt_backend_desc add_backend = {
    "add", "every output carries the elementwise sum of all inputs", NULL, 0};
static const bt_backend_desc counter_backend = {
    "counter", "every output carries the innermost loop's iteration as an I32 [1]",
    counter_options, N_OPTS(counter_options)};
static const bt_backend_desc chunks_backend = {
    "chunks", "emits n chunks (I32 [1] holding k) on each stream output; others as echo",
    chunks_options, N_OPTS(chunks_options)};
static const bt_backend_desc sleep_backend = {
    "sleep", "echo after ms milliseconds; a cancel or deadline ends the wait early",
    sleep_options, N_OPTS(sleep_options)};
static const bt_backend_desc fail_backend = {
    "fail", "every execution fails with message; the request ends INTERNAL",
    fail_options, N_OPTS(fail_options)};
static const bt_backend_desc group_backend = {
    "group", "echo that joins its tensor-parallel group at load (tp > 1, GPU workers) and "
    "all-reduces across it in every step; fail_rank fails one rank's load, hang_rank stops one "
    "rank in a step", group_options, N_OPTS(group_options)};
static const bt_backend_desc transformer_backend = {
    "transformer", "Llama-family decoder with prefill and decode modes, from GGUF or safetensors",
    transformer_options, N_OPTS(transformer_options)};

static const bt_backend_desc whisper_backend = {
    "whisper", "Whisper speech to text with features, encode and decode modes, from a "
    "CTranslate2 folder", whisper_options, N_OPTS(whisper_options)};

/* The order here is the order of listings (README, --help). */
static const bt_backend_desc *const all_backends[] = {
    &transformer_backend, &whisper_backend, &echo_backend, &add_backend,
    &counter_backend,     &chunks_backend,  &sleep_backend, &fail_backend,
    &group_backend,
};

const bt_backend_desc *bt_backend_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < N_OPTS(all_backends); i++)
        if (strcmp(all_backends[i]->name, name) == 0)
            return all_backends[i];
    return NULL;
}

const bt_backend_desc *const *bt_backend_all(size_t *n)
{
    *n = N_OPTS(all_backends);
    return all_backends;
}

const bt_opt_desc *bt_backend_option(const bt_backend_desc *b, const char *name)
{
    if (!b || !name)
        return NULL;
    for (size_t i = 0; i < b->n_options; i++)
        if (strcmp(b->options[i].name, name) == 0)
            return &b->options[i];
    return NULL;
}

const char *bt_opt_type_name(bt_opt_type t)
{
    switch (t) {
    case BT_OPT_INT: return "integer";
    case BT_OPT_FLOAT: return "number";
    case BT_OPT_BOOL: return "boolean";
    case BT_OPT_STRING: return "string";
    case BT_OPT_PATH: return "path";
    }
    return "unknown";
}

/* "want an integer in [2, 1048576]", "use auto, f16, q8_0 or f32": what D
 * allows, into BUF. */
static void describe_allowed(const bt_opt_desc *d, char *buf, size_t len)
{
    size_t n = 0;
    switch (d->type) {
    case BT_OPT_INT:
        if (d->min == INT64_MIN && d->max == INT64_MAX)
            snprintf(buf, len, "want an integer");
        else if (d->max == INT64_MAX)
            snprintf(buf, len, "want an integer >= %" PRId64, d->min);
        else if (d->min == INT64_MIN)
            snprintf(buf, len, "want an integer <= %" PRId64, d->max);
        else
            snprintf(buf, len, "want an integer in [%" PRId64 ", %" PRId64 "]", d->min, d->max);
        return;
    case BT_OPT_FLOAT: snprintf(buf, len, "want a number in [%g, %g]", d->fmin, d->fmax); return;
    case BT_OPT_BOOL: snprintf(buf, len, "want true or false"); return;
    case BT_OPT_STRING:
    case BT_OPT_PATH:
        if (!d->allowed) {
            snprintf(buf, len, "want a string");
            return;
        }
        while (d->allowed[n])
            n++;
        size_t at = (size_t)snprintf(buf, len, "use");
        for (size_t k = 0; k < n && at < len; k++)
            at += (size_t)snprintf(buf + at, len - at, "%s%s", k == 0 ? " " : k + 1 < n ? ", " : " or ",
                                   d->allowed[k]);
        return;
    }
}

/* Fails with STATUS and ERR: "option NAME = 'TEXT': what is allowed
 * (backend 'B')". */
static int refuse(const bt_backend_desc *b, const bt_opt_desc *d, const char *text, int status,
                  char *err, size_t errlen)
{
    char want[256];
    describe_allowed(d, want, sizeof(want));
    return bt_errorf(err, errlen, status, "option %s = '%.64s': %s (backend '%s')", d->name,
                     text ? text : "", want, b ? b->name : "?");
}

int bt_opt_check(const bt_backend_desc *b, const bt_opt_desc *d, const bt_opt_value *v,
                 const char *text, char *err, size_t errlen)
{
    if (!v->set)
        return 0;
    switch (d->type) {
    case BT_OPT_INT:
        if (v->i < d->min || v->i > d->max)
            return refuse(b, d, text, BT_ERANGE, err, errlen);
        return 0;
    case BT_OPT_FLOAT:
        if (!(v->f >= d->fmin && v->f <= d->fmax))
            return refuse(b, d, text, BT_ERANGE, err, errlen);
        return 0;
    case BT_OPT_BOOL: return 0;
    case BT_OPT_STRING:
    case BT_OPT_PATH:
        if (!d->allowed)
            return 0;
        for (size_t k = 0; d->allowed[k]; k++)
            if (v->s && strcmp(v->s, d->allowed[k]) == 0)
                return 0;
        return refuse(b, d, text, BT_EINVAL, err, errlen);
    }
    return refuse(b, d, text, BT_EINVAL, err, errlen);
}

int bt_opt_parse(const bt_backend_desc *b, const bt_opt_desc *d, const char *text,
                 bt_opt_value *v, char *err, size_t errlen)
{
    *v = (bt_opt_value){0};
    if (!text)
        text = d->def;
    if (!text)
        return 0;
    v->set = true;
    char *end = NULL;
    switch (d->type) {
    case BT_OPT_INT: {
        errno = 0;
        long long x = strtoll(text, &end, 10);
        if (!*text || *end)
            return refuse(b, d, text, BT_EINVAL, err, errlen);
        if (errno == ERANGE)
            return refuse(b, d, text, BT_ERANGE, err, errlen);
        v->i = x;
        break;
    }
    case BT_OPT_FLOAT:
        errno = 0;
        v->f = strtod(text, &end);
        if (!*text || *end)
            return refuse(b, d, text, BT_EINVAL, err, errlen);
        if (errno == ERANGE)
            return refuse(b, d, text, BT_ERANGE, err, errlen);
        break;
    case BT_OPT_BOOL:
        if (strcmp(text, "true") == 0)
            v->b = true;
        else if (strcmp(text, "false") != 0)
            return refuse(b, d, text, BT_EINVAL, err, errlen);
        break;
    case BT_OPT_STRING:
    case BT_OPT_PATH: v->s = text; break;
    }
    return bt_opt_check(b, d, v, text, err, errlen);
}
