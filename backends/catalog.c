/* The declaration of every built-in backend: its name and its options.
 *
 * This table is data, not code: the worker registers an implementation under
 * each name, and the config loader checks `backend:` and `options:` against
 * the declarations here.  Keeping the declaration in common/ lets
 * `batond --check-config` reject a typo without starting a worker. */
#include "backends/catalog.h"

#include <string.h>

#define N_OPTS(a) (sizeof(a) / sizeof((a)[0]))

static const bt_opt_desc counter_options[] = {
    {"finish_after", BT_OPT_INT, NULL, 0,
     "raise the finish signal when iteration + 1 equals this; unset: never"},
};

static const bt_opt_desc chunks_options[] = {
    {"n", BT_OPT_INT, "3", 0, "number of chunks emitted on each stream output"},
};

static const bt_opt_desc sleep_options[] = {
    {"ms", BT_OPT_INT, "10", 0, "milliseconds to wait before echoing the inputs"},
};

static const bt_opt_desc fail_options[] = {
    {"message", BT_OPT_STRING, "failure injected by the fail backend", 0,
     "text of the error every execution returns"},
    {"device_fault", BT_OPT_BOOL, "false", 0,
     "on a GPU worker, first launch a kernel that reads outside device memory: the CUDA "
     "context becomes unusable and the worker must exit and be restarted (tests that)"},
};

static const bt_opt_desc transformer_options[] = {
    {"path", BT_OPT_PATH, NULL, 1,
     "GGUF file, or Hugging Face folder with config.json and *.safetensors"},
    {"max_seq", BT_OPT_INT, "2048", 0, "tokens one session's KV cache holds, prompt and output"},
    {"kv_dtype", BT_OPT_STRING, "auto", 0,
     "element type of the KV cache: auto (the device's: f16 on a CPU, f32 on a GPU), f16 "
     "(CPU only) or f32"},
    {"activations", BT_OPT_STRING, "q8", 0,
     "CPU only: q8 quantizes the activations of quantized products to 8 bits per block and "
     "multiplies as integers (llama.cpp's way); f32 keeps them f32"},
    {"prefill_chunk", BT_OPT_INT, "256", 0,
     "tokens one prefill run takes; a longer prompt runs in chunks"},
    {"chat_template", BT_OPT_BOOL, "true", 0,
     "wrap a text prompt in the chat template the GGUF carries"},
    {"eos", BT_OPT_INT, "-1", 0, "token id that raises the finish signal; -1: the GGUF's"},
    {"threads", BT_OPT_INT, "0", 0, "CPU threads one kernel may use; 0: the worker's `threads`"},
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
static const bt_backend_desc transformer_backend = {
    "transformer", "Llama-family decoder with prefill and decode modes, from GGUF or safetensors",
    transformer_options, N_OPTS(transformer_options)};

/* The order here is the order of listings (README, --help). */
static const bt_backend_desc *const all_backends[] = {
    &transformer_backend, &echo_backend, &add_backend,  &counter_backend,
    &chunks_backend,      &sleep_backend, &fail_backend,
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
