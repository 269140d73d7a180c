/* Hugging Face folders into a built gguf_file (backends/transformer/hf.h).
 *
 * The order of work: config.json gives the shape; the safetensors files
 * are mapped (each mapping handed to the gguf_file at once, so every error
 * path releases it with the file) and their headers parsed into a list of
 * tensors; each tensor's name is matched to its slot in the decoder and its
 * shape checked against the config; then the GGUF tensors, the llama.*
 * metadata and the tokenizer keys are added.  Messages name the file of
 * the folder ("config.json: ...", "model.safetensors: tensor '...': ..."):
 * the backend puts the folder's path in front. */
#include "backends/transformer/hf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/mapfile.h"
#include "common/vec.h"
#include "kernels/kernels.h"

#define MAX_JSON_FILE (256u << 20) /* bytes of config.json, tokenizer.json and the like */
#define MAX_HEADER (100u << 20)    /* bytes of a safetensors header: the format's own limit */
#define SHOWN 60                   /* bytes of a name or value quoted in a message */

/* How every file is parsed (jansson): any value at the top, so that the
 * callers say what they expected instead of the parser; and a string may
 * hold an escaped NUL (\u0000), kept with its length.  A repeated key
 * keeps its first place and its last value, as json_object_get and most
 * JSON readers (safetensors' own among them) take it. */
#define JSON_FLAGS (JSON_DECODE_ANY | JSON_ALLOW_NUL)

/* llama.cpp's token types (tokenizer.ggml.token_type). */
enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5 };

/* The Llama 3 pre-tokenizer regex as tokenizer.json spells it (after JSON
 * unescaping), which tokenizer.c runs as "llama-bpe". */
static const char LLAMA3_REGEX[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* The safetensors dtypes read: each maps onto a ggml type of the same
 * bytes, so tensors are used in place. */
static const struct st_type {
    const char *name;
    uint32_t ggml;
    kdtype kd;
    size_t size;  /* bytes per element */
} st_types[] = {
    {"F32", GGUF_GGML_F32, KD_F32, 4},
    {"F16", GGUF_GGML_F16, KD_F16, 2},
    {"BF16", GGUF_GGML_BF16, KD_BF16, 2},
};
#define N_ST_TYPES (sizeof(st_types) / sizeof(st_types[0]))

typedef struct hf_config {
    uint32_t hidden, layers, heads, kv_heads, ffn, vocab, head_dim;
    int64_t ctx;          /* max_position_embeddings; 0 when absent */
    float eps, theta;
    bool tied;            /* tie_word_embeddings: the head is the embedding */
    int64_t bos, eos;     /* bos_token_id, eos_token_id; -1 when absent */
} hf_config;

/* What a tensor is in the decoder, which fixes its shape. */
enum role { R_EMBED, R_NORM, R_HEAD, R_Q, R_K, R_V, R_O, R_FFN_IN, R_FFN_OUT };

/* The tensors of one layer: Hugging Face's name after "model.layers.N."
 * and GGUF's after "blk.N.". */
static const struct layer_tensor {
    const char *hf;
    const char *gguf;
    enum role role;
} layer_tensors[] = {
    {"input_layernorm.weight", "attn_norm", R_NORM},
    {"self_attn.q_proj.weight", "attn_q", R_Q},
    {"self_attn.k_proj.weight", "attn_k", R_K},
    {"self_attn.v_proj.weight", "attn_v", R_V},
    {"self_attn.o_proj.weight", "attn_output", R_O},
    {"post_attention_layernorm.weight", "ffn_norm", R_NORM},
    {"mlp.gate_proj.weight", "ffn_gate", R_FFN_IN},
    {"mlp.up_proj.weight", "ffn_up", R_FFN_IN},
    {"mlp.down_proj.weight", "ffn_down", R_FFN_OUT},
};
#define PER_LAYER (sizeof(layer_tensors) / sizeof(layer_tensors[0]))
/* Slots of the tensors outside the layers; layer L's tensor K is slot
 * N_GLOBAL + L * PER_LAYER + K. */
enum { S_EMBED, S_NORM, S_HEAD, N_GLOBAL };

typedef struct st_tensor {
    const char *file;     /* the file's name in the folder; owned by the reader */
    const char *name;     /* a key of the header's document, which the reader keeps */
    const struct st_type *type;
    uint32_t n_dims;
    int64_t shape[GGUF_MAX_DIMS];  /* outermost first, as the header lists them */
    const uint8_t *data;  /* into the file's mapping */
    size_t nbytes;
} st_tensor;

typedef struct reader {
    const char *dir;
    gguf_file *f;         /* being built; owns the mappings and copies */
    hf_config c;
    json_t **docs;        /* the safetensors headers, whose keys name the tensors */
    size_t n_docs, cap_docs;
    char **files;         /* the safetensors files to read, by name */
    size_t n_files, cap_files;
    st_tensor *ts;
    size_t n_ts, cap_ts;
    const st_tensor **slot;  /* N_GLOBAL + layers * PER_LAYER: the tensor of each slot */
    char *err;
    size_t errlen;
} reader;

/* ---- files ------------------------------------------------------------------------ */

static int join(char *buf, size_t size, const char *dir, const char *name)
{
    int n = snprintf(buf, size, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= size ? BT_ERANGE : 0;
}

/* Reads DIR/NAME whole into *BUF (malloc'd, NUL-terminated), *LEN bytes.
 * BT_ENOENT, with a message, when there is no such file. */
static int read_whole(const char *dir, const char *name, char **buf, size_t *len, char *err,
                      size_t errlen)
{
    char path[PATH_MAX];
    *buf = NULL;
    if (join(path, sizeof(path), dir, name))
        return bt_errorf(err, errlen, BT_ERANGE, "%s: the path is too long", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return bt_errorf(err, errlen, errno == ENOENT ? BT_ENOENT : BT_EIO, "%s: %s", name,
                         errno == ENOENT ? "no such file in the folder" : strerror(errno));
    int rc;
    char *p = NULL;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        rc = bt_errorf(err, errlen, BT_EIO, "%s: not a readable regular file", name);
        goto err;
    }
    if ((uint64_t)st.st_size > MAX_JSON_FILE) {
        rc = bt_errorf(err, errlen, BT_EFORMAT, "%s: %lld bytes, more than the %u MiB read",
                       name, (long long)st.st_size, MAX_JSON_FILE >> 20);
        goto err;
    }
    size_t n = (size_t)st.st_size, got = 0;
    if (!(p = malloc(n + 1))) {
        rc = bt_errorf(err, errlen, BT_ENOMEM, "%s: out of memory", name);
        goto err;
    }
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = bt_errorf(err, errlen, BT_EIO, "%s: read: %s", name,
                           r < 0 ? strerror(errno) : "the file shrank");
            goto err;
        }
        got += (size_t)r;
    }
    p[n] = '\0';
    close(fd);
    *buf = p;
    *len = n;
    return 0;
err:
    free(p);
    close(fd);
    return rc;
}

/* Parses the one JSON value in TEXT[LEN] into *DOC (NULL on failure).  A
 * message names WHAT ("config.json", "model.safetensors: header") and the
 * line and column jansson stopped at. */
static int parse_json(const char *text, size_t len, const char *what, json_t **doc, char *err,
                      size_t errlen)
{
    /* A UTF-8 byte order mark, which some editors write, is not JSON's
     * but says nothing against the text after it. */
    if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3))
        text += 3, len -= 3;
    json_error_t je;
    *doc = json_loadb(text, len, JSON_FLAGS, &je);
    if (!*doc)
        return bt_errorf(err, errlen,
                         json_error_code(&je) == json_error_out_of_memory ? BT_ENOMEM
                                                                          : BT_EFORMAT,
                         "%s: line %d, column %d: %s", what, je.line, je.column, je.text);
    return 0;
}

/* Reads and parses DIR/NAME; BT_ENOENT as read_whole. */
static int read_json(const char *dir, const char *name, json_t **doc, char *err, size_t errlen)
{
    char *buf;
    size_t len;
    *doc = NULL;
    int rc = read_whole(dir, name, &buf, &len, err, errlen);
    if (rc)
        return rc;
    rc = parse_json(buf, len, name, doc, err, errlen);
    free(buf);
    return rc;
}

/* ---- config.json ------------------------------------------------------------------ */

/* "null", "a boolean", "a number", "a string", "an array", "an object". */
static const char *kind_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Number V as text: an integer as written, a real in the fewest digits
 * that read back to it, with a point or exponent so that it still reads
 * as a real ("8.0", "1e-05"). */
static const char *num_text(const json_t *v, char *buf, size_t size)
{
    if (json_is_integer(v)) {
        snprintf(buf, size, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return buf;
    }
    double x = json_real_value(v);
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    if (!strpbrk(buf, ".e") && strlen(buf) + 2 < size)
        strcat(buf, ".0");
    return buf;
}

/* What V is, for a message: a scalar's text, else its kind. */
static const char *describe(const json_t *v, char *buf, size_t size)
{
    if (json_is_string(v))
        snprintf(buf, size, "\"%.*s\"", SHOWN, json_string_value(v));
    else if (json_is_number(v))
        num_text(v, buf, size);
    else if (json_is_boolean(v))
        snprintf(buf, size, "%s", json_is_true(v) ? "true" : "false");
    else
        snprintf(buf, size, "%s", kind_name(v));
    return buf;
}

static bool is_str(const json_t *v, const char *s)
{
    size_t n = strlen(s);
    return json_is_string(v) && json_string_length(v) == n && !memcmp(json_string_value(v), s, n);
}

/* Whether V is the boolean B. */
static bool is_bool(const json_t *v, bool b)
{
    return b ? json_is_true(v) : json_is_false(v);
}

/* Whether V is absent or null: the field is not set. */
static bool unset(const json_t *v)
{
    return !v || json_is_null(v);
}

/* V's text when it is a string, else OTHERWISE. */
static const char *str_or(const json_t *v, const char *otherwise)
{
    const char *s = json_string_value(v);
    return s ? s : otherwise;
}

/* V as an integer: 0, or BT_ETYPE when V is not a number written as one
 * (without fraction or exponent).  jansson refuses a file holding an
 * integer beyond int64_t, naming the place. */
static int int_of(const json_t *v, int64_t *out)
{
    if (!json_is_integer(v))
        return BT_ETYPE;
    *out = json_integer_value(v);
    return 0;
}

/* Member KEY of ROOT as an integer in [LO, HI]; DEF when unset, unless
 * REQUIRED. */
static int cfg_int(const json_t *root, const char *key, bool required, int64_t def,
                   int64_t lo, int64_t hi, int64_t *out, char *err, size_t errlen)
{
    const json_t *v = json_object_get(root, key);
    char d[SHOWN + 8];
    if (unset(v)) {
        if (required)
            return bt_errorf(err, errlen, BT_EFORMAT, "config.json: %s is missing", key);
        *out = def;
        return 0;
    }
    int64_t x;
    if (int_of(v, &x) || x < lo || x > hi)
        return bt_errorf(err, errlen, BT_EFORMAT,
                         "config.json: %s is %s, expected an integer in [%" PRId64 ", %" PRId64
                         "]",
                         key, describe(v, d, sizeof(d)), lo, hi);
    *out = x;
    return 0;
}

static int cfg_u32(const json_t *root, const char *key, bool required, uint32_t def,
                   uint32_t hi, uint32_t *out, char *err, size_t errlen)
{
    int64_t x;
    int rc = cfg_int(root, key, required, def, 1, hi, &x, err, errlen);
    if (!rc)
        *out = (uint32_t)x;
    return rc;
}

/* Member KEY of ROOT as a positive float; DEF when unset. */
static int cfg_pos_float(const json_t *root, const char *key, float def, float *out, char *err,
                         size_t errlen)
{
    const json_t *v = json_object_get(root, key);
    char d[SHOWN + 8];
    double x;
    if (unset(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v) || !((x = json_number_value(v)) > 0) || x > 1e30)
        return bt_errorf(err, errlen, BT_EFORMAT, "config.json: %s is %s, expected a positive "
                         "number", key, describe(v, d, sizeof(d)));
    *out = (float)x;
    return 0;
}

/* Member KEY of ROOT as a boolean; DEF when unset. */
static int cfg_bool(const json_t *root, const char *key, bool def, bool *out, char *err,
                    size_t errlen)
{
    const json_t *v = json_object_get(root, key);
    char d[SHOWN + 8];
    if (unset(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return bt_errorf(err, errlen, BT_EFORMAT, "config.json: %s is %s, expected true or false",
                         key, describe(v, d, sizeof(d)));
    *out = json_is_true(v);
    return 0;
}

/* A token id field of config.json: an integer, or a list whose first one
 * is taken (Llama 3.1 lists several eos ids); -1 when unset. */
static int cfg_token(const json_t *root, const char *key, int64_t *out, char *err,
                     size_t errlen)
{
    const json_t *v = json_object_get(root, key);
    char d[SHOWN + 8];
    *out = -1;
    if (json_is_array(v))
        v = json_array_get(v, 0);
    if (unset(v))
        return 0;
    if (int_of(v, out) || *out < 0 || *out > INT32_MAX)
        return bt_errorf(err, errlen, BT_EFORMAT, "config.json: %s is %s, expected a token id",
                         key, describe(v, d, sizeof(d)));
    return 0;
}

/* The model is a Llama decoder: architectures, else model_type, says so. */
static int check_arch(const json_t *root, char *err, size_t errlen)
{
    static const char *const archs[] = {"LlamaForCausalLM", "MistralForCausalLM"};
    static const char *const types[] = {"llama", "mistral"};
    const json_t *a = json_object_get(root, "architectures"),
                 *t = json_object_get(root, "model_type");
    char d[SHOWN + 8];
    if (unset(a) && unset(t))
        return bt_errorf(err, errlen, BT_EFORMAT, "config.json: neither architectures nor "
                         "model_type says what the model is");
    if (!unset(a)) {
        const json_t *a0 = json_array_get(a, 0);
        if (!json_is_array(a) || !json_is_string(a0))
            return bt_errorf(err, errlen, BT_EFORMAT, "config.json: architectures is %s, "
                             "expected a list of class names", describe(a, d, sizeof(d)));
        bool ok = false;
        for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
            ok |= is_str(a0, archs[i]);
        if (!ok)
            return bt_errorf(err, errlen, BT_EUNSUPPORTED,
                             "config.json: architectures %s is not supported (the transformer "
                             "backend runs LlamaForCausalLM and MistralForCausalLM: a Llama "
                             "decoder without biases)",
                             describe(a0, d, sizeof(d)));
    }
    if (!unset(t)) {
        bool ok = false;
        for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
            ok |= is_str(t, types[i]);
        if (!ok)
            return bt_errorf(err, errlen, BT_EUNSUPPORTED,
                             "config.json: model_type %s is not supported (llama and mistral "
                             "are)", describe(t, d, sizeof(d)));
    }
    return 0;
}

/* The fields that would make the decoder other than the graph runs: each
 * refused by name rather than read and ignored. */
static int check_variant(const json_t *root, const hf_config *c, char *err, size_t errlen)
{
    char d[SHOWN + 8];
    const json_t *v = json_object_get(root, "hidden_act");
    if (!unset(v) && !is_str(v, "silu"))
        return bt_errorf(err, errlen, BT_EUNSUPPORTED, "config.json: hidden_act %s is not "
                         "supported (the FFN is SwiGLU: silu)", describe(v, d, sizeof(d)));
    v = json_object_get(root, "rope_scaling");
    if (!unset(v)) {
        const json_t *t = json_object_get(v, "rope_type");
        if (!t)
            t = json_object_get(v, "type");
        return bt_errorf(err, errlen, BT_EUNSUPPORTED, "config.json: rope_scaling %s%s: scaled "
                         "RoPE is not supported (rope_scaling must be null)",
                         t ? "of type " : "is ", describe(t ? t : v, d, sizeof(d)));
    }
    static const char *const biases[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < 2; i++) {
        bool b;
        int rc = cfg_bool(root, biases[i], false, &b, err, errlen);
        if (rc)
            return rc;
        if (b)
            return bt_errorf(err, errlen, BT_EUNSUPPORTED, "config.json: %s is true; the graph "
                             "has no biases", biases[i]);
    }
    v = json_object_get(root, "sliding_window");
    if (!unset(v))
        return bt_errorf(err, errlen, BT_EUNSUPPORTED, "config.json: sliding_window is %s; "
                         "sliding-window attention is not supported (it must be null)",
                         describe(v, d, sizeof(d)));
    v = json_object_get(root, "partial_rotary_factor");
    if (!unset(v) && (!json_is_number(v) || json_number_value(v) != 1.0))
        return bt_errorf(err, errlen, BT_EUNSUPPORTED, "config.json: partial_rotary_factor %s "
                         "is not supported (RoPE covers whole heads)", describe(v, d, sizeof(d)));
    int64_t hd;
    int rc = cfg_int(root, "head_dim", false, c->hidden / c->heads, 1, 1 << 16, &hd, err, errlen);
    if (rc)
        return rc;
    if (hd != c->hidden / c->heads)
        return bt_errorf(err, errlen, BT_EUNSUPPORTED, "config.json: head_dim %" PRId64 " is not "
                         "hidden_size / num_attention_heads = %u, which the graph assumes", hd,
                         c->hidden / c->heads);
    return 0;
}

static int read_config(reader *r)
{
    json_t *root;
    int rc = read_json(r->dir, "config.json", &root, r->err, r->errlen);
    if (rc)
        return rc;
    hf_config *c = &r->c;
    char d[SHOWN + 8];
    if (!json_is_object(root)) {
        rc = bt_errorf(r->err, r->errlen, BT_EFORMAT, "config.json: the document is %s, not an "
                       "object", describe(root, d, sizeof(d)));
        goto out;
    }
    /* The bounds are those read_shape in backend.c puts on a GGUF. */
    if ((rc = check_arch(root, r->err, r->errlen)) ||
        (rc = cfg_u32(root, "hidden_size", true, 0, 65536, &c->hidden, r->err, r->errlen)) ||
        (rc = cfg_u32(root, "num_hidden_layers", true, 0, 1024, &c->layers, r->err, r->errlen)) ||
        (rc = cfg_u32(root, "num_attention_heads", true, 0, 65536, &c->heads, r->err,
                      r->errlen)) ||
        (rc = cfg_u32(root, "num_key_value_heads", false, c->heads, 65536, &c->kv_heads, r->err,
                      r->errlen)) ||
        (rc = cfg_u32(root, "intermediate_size", true, 0, 1 << 20, &c->ffn, r->err,
                      r->errlen)) ||
        (rc = cfg_u32(root, "vocab_size", true, 0, INT32_MAX, &c->vocab, r->err, r->errlen)) ||
        (rc = cfg_int(root, "max_position_embeddings", false, 0, 1, UINT32_MAX, &c->ctx, r->err,
                      r->errlen)) ||
        (rc = cfg_pos_float(root, "rms_norm_eps", 1e-6f, &c->eps, r->err, r->errlen)) ||
        (rc = cfg_pos_float(root, "rope_theta", 10000.0f, &c->theta, r->err, r->errlen)) ||
        (rc = cfg_bool(root, "tie_word_embeddings", false, &c->tied, r->err, r->errlen)) ||
        (rc = cfg_token(root, "bos_token_id", &c->bos, r->err, r->errlen)) ||
        (rc = cfg_token(root, "eos_token_id", &c->eos, r->err, r->errlen)))
        goto out;
    if (c->hidden % c->heads || c->heads % c->kv_heads || (c->hidden / c->heads) % 2) {
        rc = bt_errorf(r->err, r->errlen, BT_EFORMAT, "config.json: hidden_size %u, "
                       "num_attention_heads %u and num_key_value_heads %u do not make whole "
                       "heads of an even size shared by whole groups",
                       c->hidden, c->heads, c->kv_heads);
        goto out;
    }
    c->head_dim = c->hidden / c->heads;
    rc = check_variant(root, c, r->err, r->errlen);
out:
    json_decref(root);
    return rc;
}

/* ---- safetensors ------------------------------------------------------------------ */

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Adds file NAME to the list unless it is there already. */
static int add_file(reader *r, const char *name, size_t len)
{
    for (size_t i = 0; i < r->n_files; i++)
        if (strlen(r->files[i]) == len && !memcmp(r->files[i], name, len))
            return 0;
    if (BT_RESERVE(r->files, r->n_files, r->cap_files, 8) ||
        !(r->files[r->n_files] = strndup(name, len)))
        return bt_errorf(r->err, r->errlen, BT_ENOMEM, "out of memory");
    r->n_files++;
    return 0;
}

static int by_string(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The files its index names, else model.safetensors, else every
 * *.safetensors (a repository may hold other formats' files beside them:
 * Mistral's consolidated.safetensors is listed by no index). */
static int list_files(reader *r)
{
    json_t *doc;
    char path[PATH_MAX];
    struct stat st;
    int rc = read_json(r->dir, "model.safetensors.index.json", &doc, r->err, r->errlen);
    if (rc == 0) {
        json_t *map = json_object_get(doc, "weight_map"), *m;
        const char *key;
        if (!json_is_object(map))
            rc = bt_errorf(r->err, r->errlen, BT_EFORMAT, "model.safetensors.index.json: no "
                           "weight_map object");
        json_object_foreach(map, key, m) {
            if (rc)
                break;
            /* A file of this folder, not a path out of it. */
            const char *s = json_string_value(m);
            size_t n = json_string_length(m);
            if (!s || memchr(s, '/', n) || s[0] == '.' || strlen(s) != n ||
                !has_suffix(s, ".safetensors"))
                rc = bt_errorf(r->err, r->errlen, BT_EFORMAT, "model.safetensors.index.json: "
                               "tensor '%.*s' is in '%.*s', not a .safetensors file of the "
                               "folder", SHOWN, key, SHOWN, s ? s : "?");
            else
                rc = add_file(r, s, n);
        }
        json_decref(doc);
        if (!rc && r->n_files == 0)
            rc = bt_errorf(r->err, r->errlen, BT_EFORMAT, "model.safetensors.index.json: "
                           "weight_map is empty");
        return rc;
    }
    if (rc != BT_ENOENT)
        return rc;
    if (!join(path, sizeof(path), r->dir, "model.safetensors") && stat(path, &st) == 0)
        return add_file(r, "model.safetensors", strlen("model.safetensors"));
    DIR *dh = opendir(r->dir);
    if (!dh)
        return bt_errorf(r->err, r->errlen, BT_EIO, "%s: %s", r->dir, strerror(errno));
    rc = 0;
    for (struct dirent *e; !rc && (e = readdir(dh));)
        if (e->d_name[0] != '.' && has_suffix(e->d_name, ".safetensors"))
            rc = add_file(r, e->d_name, strlen(e->d_name));
    closedir(dh);
    if (rc)
        return rc;
    if (r->n_files == 0)
        return bt_errorf(r->err, r->errlen, BT_ENOENT, "no *.safetensors file in the folder");
    qsort(r->files, r->n_files, sizeof(char *), by_string);
    return 0;
}

static void fmt_shape(char *buf, size_t size, const int64_t *shape, uint32_t n)
{
    size_t at = (size_t)snprintf(buf, size, "[");
    for (uint32_t i = 0; i < n && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (at < size)
        snprintf(buf + at, size - at, "]");
}

/* One entry of FILE's header: tensor NAME (a key of the header, which the
 * reader keeps) described by V, with its data in BASE[ROOM], appended to
 * R's list. */
static int parse_entry(reader *r, const char *file, const char *name, const json_t *v,
                       const uint8_t *base, size_t room)
{
    const json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
                 *off = json_object_get(v, "data_offsets");
    char d[SHOWN + 8];
    if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(sh) ||
        !json_is_array(off) || json_array_size(off) != 2)
        return bt_errorf(r->err, r->errlen, BT_EFORMAT, "%s: tensor '%.*s': the header entry "
                         "needs dtype (a string), shape (a list) and data_offsets (two "
                         "integers)", file, SHOWN, name);
    st_tensor t = {.file = file, .name = name};
    for (size_t i = 0; i < N_ST_TYPES; i++)
        if (is_str(dt, st_types[i].name))
            t.type = &st_types[i];
    if (!t.type)
        return bt_errorf(r->err, r->errlen, BT_EUNSUPPORTED, "%s: tensor '%.*s': dtype %s is "
                         "not supported (F32, F16 and BF16 are)", file, SHOWN, name,
                         describe(dt, d, sizeof(d)));
    if (json_array_size(sh) > GGUF_MAX_DIMS)
        return bt_errorf(r->err, r->errlen, BT_EFORMAT, "%s: tensor '%.*s': %zu dims, at most "
                         "%d are supported", file, SHOWN, name, json_array_size(sh),
                         GGUF_MAX_DIMS);
    uint64_t elems = 1;
    bool over = false;
    size_t i;
    const json_t *dim;
    json_array_foreach(sh, i, dim) {
        int64_t x;
        if (int_of(dim, &x) || x < 0)
            return bt_errorf(r->err, r->errlen, BT_EFORMAT, "%s: tensor '%.*s': shape holds %s, "
                             "not a size", file, SHOWN, name, describe(dim, d, sizeof(d)));
        t.shape[t.n_dims++] = x;
        over |= __builtin_mul_overflow(elems, (uint64_t)x, &elems);
    }
    uint64_t bytes;
    over |= __builtin_mul_overflow(elems, (uint64_t)t.type->size, &bytes);
    const json_t *o0 = json_array_get(off, 0), *o1 = json_array_get(off, 1);
    int64_t b, e;
    if (int_of(o0, &b) || int_of(o1, &e) || b < 0 || e < b || (uint64_t)e > room) {
        char t0[32] = "?", t1[32] = "?";
        if (json_is_number(o0))
            num_text(o0, t0, sizeof(t0));
        if (json_is_number(o1))
            num_text(o1, t1, sizeof(t1));
        return bt_errorf(r->err, r->errlen, BT_EFORMAT, "%s: tensor '%.*s': data_offsets [%s, "
                         "%s] are not within the %zu bytes of data after the header", file,
                         SHOWN, name, t0, t1, room);
    }
    char shape[96], took[32];
    fmt_shape(shape, sizeof(shape), t.shape, t.n_dims);
    if (over)
        snprintf(took, sizeof(took), "more than 2^64");
    else
        snprintf(took, sizeof(took), "%" PRIu64, bytes);
    if (over || bytes != (uint64_t)(e - b))
        return bt_errorf(r->err, r->errlen, BT_EFORMAT, "%s: tensor '%.*s': %s %s takes %s "
                         "bytes, but data_offsets [%" PRId64 ", %" PRId64 "] span %" PRId64,
                         file, SHOWN, name, t.type->name, shape, took, b, e, e - b);
    t.data = base + b;
    t.nbytes = (size_t)bytes;
    if (BT_RESERVE(r->ts, r->n_ts, r->cap_ts, 512))
        return bt_errorf(r->err, r->errlen, BT_ENOMEM, "out of memory");
    r->ts[r->n_ts++] = t;
    return 0;
}

/* Maps FILE (handing the mapping to the gguf_file) and reads its header:
 * a little-endian u64 length, then that many bytes of JSON. */
static int map_file(reader *r, const char *file)
{
    char path[PATH_MAX];
    if (join(path, sizeof(path), r->dir, file))
        return bt_errorf(r->err, r->errlen, BT_ERANGE, "%s: the path is too long", file);
    void *m;
    size_t size;
    int mrc = bt_mapfile_map(path, file, &m, &size, r->err, r->errlen);
    if (mrc)
        return mrc;
    if (size < 8) {
        bt_mapfile_unmap(m, size);
        return bt_errorf(r->err, r->errlen, BT_EFORMAT, "%s: %zu bytes, too short for the "
                         "8-byte length of a safetensors header", file, size);
    }
    if (gguf_build_own_map(r->f, m, size))
        return bt_errorf(r->err, r->errlen, BT_ENOMEM, "out of memory");
    uint64_t n;
    memcpy(&n, m, 8);
    if (n > size - 8)
        return bt_errorf(r->err, r->errlen, BT_EFORMAT, "%s: the header of %" PRIu64 " bytes "
                         "runs past the end of the file (%zu bytes)", file, n, size);
    if (n > MAX_HEADER)
        return bt_errorf(r->err, r->errlen, BT_EFORMAT, "%s: the header of %" PRIu64 " bytes "
                         "is larger than safetensors allows (100 MB)", file, n);
    if (BT_RESERVE(r->docs, r->n_docs, r->cap_docs, 8))
        return bt_errorf(r->err, r->errlen, BT_ENOMEM, "out of memory");
    char what[PATH_MAX + 16];
    snprintf(what, sizeof(what), "%s: header", file);
    json_t *root;
    int rc = parse_json((const char *)m + 8, (size_t)n, what, &root, r->err, r->errlen);
    if (rc)
        return rc;
    r->docs[r->n_docs++] = root;
    if (!json_is_object(root))
        return bt_errorf(r->err, r->errlen, BT_EFORMAT, "%s: the header is %s, not an object",
                         file, kind_name(root));
    const uint8_t *base = (const uint8_t *)m + 8 + n;
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (!strcmp(name, "__metadata__"))
            continue;
        if ((rc = parse_entry(r, file, name, v, base, size - 8 - (size_t)n)))
            return rc;
    }
    return 0;
}

/* ---- tensors ---------------------------------------------------------------------- */

/* The slot of tensor T by its name: *SLOT, or -1 for a tensor ignored. */
static int slot_of(reader *r, const st_tensor *t, long *slot)
{
    static const char layers[] = "model.layers.";
    const char *s = t->name;
    *slot = -1;
    if (!strcmp(s, "model.embed_tokens.weight"))
        *slot = S_EMBED;
    else if (!strcmp(s, "model.norm.weight"))
        *slot = S_NORM;
    else if (!strcmp(s, "lm_head.weight"))
        *slot = S_HEAD;
    if (*slot >= 0)
        return 0;
    if (!strncmp(s, layers, sizeof(layers) - 1) && s[sizeof(layers) - 1] >= '0' &&
        s[sizeof(layers) - 1] <= '9') {
        char *end;
        errno = 0;
        unsigned long l = strtoul(s + sizeof(layers) - 1, &end, 10);
        if (*end == '.' && errno == 0) {
            const char *rest = end + 1;
            if (!strcmp(rest, "self_attn.rotary_emb.inv_freq"))
                return 0;  /* RoPE's frequencies, which the graph computes itself */
            for (size_t k = 0; k < PER_LAYER; k++) {
                if (strcmp(rest, layer_tensors[k].hf))
                    continue;
                if (l >= r->c.layers)
                    return bt_errorf(r->err, r->errlen, BT_EFORMAT, "%s: tensor '%.*s' is of "
                                     "layer %lu, but config.json has %u layers", t->file, SHOWN,
                                     s, l, r->c.layers);
                *slot = (long)(N_GLOBAL + l * PER_LAYER + k);
                return 0;
            }
        }
    }
    return bt_errorf(r->err, r->errlen, BT_EUNSUPPORTED, "%s: tensor '%.*s' is not one of a "
                     "Llama decoder's (biases, extra norms and other architectures are not "
                     "supported)", t->file, SHOWN, s);
}

/* The role and Hugging Face name of SLOT. */
static enum role role_of(size_t slot, char *name, size_t size)
{
    static const char *const global[] = {"model.embed_tokens.weight", "model.norm.weight",
                                         "lm_head.weight"};
    static const enum role groles[] = {R_EMBED, R_NORM, R_HEAD};
    if (slot < N_GLOBAL) {
        snprintf(name, size, "%s", global[slot]);
        return groles[slot];
    }
    size_t l = (slot - N_GLOBAL) / PER_LAYER, k = (slot - N_GLOBAL) % PER_LAYER;
    snprintf(name, size, "model.layers.%zu.%s", l, layer_tensors[k].hf);
    return layer_tensors[k].role;
}

/* The shape config.json gives a tensor of ROLE, outermost first. */
static uint32_t shape_of(const hf_config *c, enum role role, int64_t *shape)
{
    int64_t h = c->hidden, q = (int64_t)c->heads * c->head_dim,
            kv = (int64_t)c->kv_heads * c->head_dim, f = c->ffn, v = c->vocab;
    switch (role) {
    case R_EMBED:
    case R_HEAD: shape[0] = v, shape[1] = h; return 2;
    case R_NORM: shape[0] = h; return 1;
    case R_Q: shape[0] = q, shape[1] = h; return 2;
    case R_K:
    case R_V: shape[0] = kv, shape[1] = h; return 2;
    case R_O: shape[0] = h, shape[1] = q; return 2;
    case R_FFN_IN: shape[0] = f, shape[1] = h; return 2;
    case R_FFN_OUT: shape[0] = h, shape[1] = f; return 2;
    }
    return 0;
}

/* Files every slot, refusing duplicates, then checks none is missing and
 * every shape is the config's. */
static int collect(reader *r)
{
    size_t n_slots = N_GLOBAL + (size_t)r->c.layers * PER_LAYER;
    r->slot = calloc(n_slots, sizeof(*r->slot));
    if (!r->slot)
        return bt_errorf(r->err, r->errlen, BT_ENOMEM, "out of memory");
    for (size_t i = 0; i < r->n_ts; i++) {
        long s;
        int rc = slot_of(r, &r->ts[i], &s);
        if (rc)
            return rc;
        if (s < 0)
            continue;
        if (r->slot[s])
            return bt_errorf(r->err, r->errlen, BT_EFORMAT, "tensor '%.*s' is in both %s and %s",
                             SHOWN, r->ts[i].name, r->slot[s]->file, r->ts[i].file);
        r->slot[s] = &r->ts[i];
    }
    for (size_t s = 0; s < n_slots; s++) {
        char name[96], got[96], want[96];
        enum role role = role_of(s, name, sizeof(name));
        const st_tensor *t = r->slot[s];
        if (!t && role == R_HEAD && !r->c.tied)
            return bt_errorf(r->err, r->errlen, BT_EFORMAT, "no tensor lm_head.weight, and "
                             "config.json does not set tie_word_embeddings");
        if (!t && role != R_HEAD)
            return bt_errorf(r->err, r->errlen, BT_EFORMAT, "no tensor %s in the folder's "
                             "safetensors files", name);
        int64_t shape[GGUF_MAX_DIMS];
        uint32_t nd = shape_of(&r->c, role, shape);
        if (!t || (t->n_dims == nd && !memcmp(t->shape, shape, nd * sizeof(int64_t))))
            continue;
        fmt_shape(got, sizeof(got), t->shape, t->n_dims);
        fmt_shape(want, sizeof(want), shape, nd);
        return bt_errorf(r->err, r->errlen, BT_EFORMAT, "%s: tensor '%s' is %s; config.json "
                         "makes it %s", t->file, name, got, want);
    }
    return 0;
}

/* Rows of W [N_HEAD * HD, ...] (ROW bytes each) from Hugging Face's order
 * to GGUF's, as convert_hf_to_gguf.py permutes q_proj and k_proj: each
 * head's rows, seen as [2, HD / 2], are transposed to [HD / 2, 2], so that
 * row j * HD/2 + i of the head becomes row 2i + j.  Rotating adjacent
 * pairs (2i, 2i + 1) of the result is then rotating (i, i + HD/2) of the
 * original: Hugging Face's rotate_half. */
static void permute_rows(uint8_t *dst, const uint8_t *src, uint32_t n_head, uint32_t hd,
                         size_t row)
{
    size_t half = hd / 2;
    for (size_t h = 0; h < n_head; h++)
        for (size_t i = 0; i < half; i++)
            for (size_t j = 0; j < 2; j++)
                memcpy(dst + (h * hd + 2 * i + j) * row, src + (h * hd + j * half + i) * row,
                       row);
}

/* Adds tensor T of ROLE to the file as GGUF's NAME: in place from the
 * mapping where it can be, else from memory the file owns. */
static int add_tensor(reader *r, const char *name, const st_tensor *t, enum role role)
{
    uint32_t type = t->type->ggml;
    const void *data = t->data;
    size_t nbytes = t->nbytes;
    int64_t ne[GGUF_MAX_DIMS];
    for (uint32_t d = 0; d < t->n_dims; d++)
        ne[d] = t->shape[t->n_dims - 1 - d];
    /* Norms, Q and K, and a tensor that a header placed off its element
     * size (the kernels read elements aligned) go to memory of the file's
     * own; the rest stays in the mapping. */
    void *own = NULL;
    bool copied = true;
    if (role == R_NORM && type != GGUF_GGML_F32) {
        /* The graph takes norm weights as f32; k_widen takes every type
         * of st_types. */
        nbytes = (size_t)t->shape[0] * sizeof(float);
        if ((own = malloc(nbytes)))
            k_widen(own, t->type->kd, t->data, (size_t)t->shape[0]);
        type = GGUF_GGML_F32;
    } else if (role == R_Q || role == R_K) {
        if ((own = malloc(nbytes)))
            permute_rows(own, t->data, role == R_Q ? r->c.heads : r->c.kv_heads, r->c.head_dim,
                         nbytes / (size_t)t->shape[0]);
    } else if ((uintptr_t)data % t->type->size) {
        if ((own = malloc(nbytes)))
            memcpy(own, data, nbytes);
    } else {
        copied = false;
    }
    if (copied) {
        if (!own || gguf_build_own(r->f, own))
            return bt_errorf(r->err, r->errlen, BT_ENOMEM, "out of memory for tensor %s", name);
        data = own;
    }
    int rc = gguf_build_tensor(r->f, name, type, t->n_dims, ne, data, nbytes);
    if (rc)
        return bt_errorf(r->err, r->errlen, rc, "tensor %s: %s", name, bt_strerror(rc));
    return 0;
}

static int add_tensors(reader *r)
{
    int rc;
    if ((rc = add_tensor(r, "token_embd.weight", r->slot[S_EMBED], R_EMBED)))
        return rc;
    for (size_t l = 0; l < r->c.layers; l++) {
        for (size_t k = 0; k < PER_LAYER; k++) {
            char name[64];
            snprintf(name, sizeof(name), "blk.%zu.%s.weight", l, layer_tensors[k].gguf);
            if ((rc = add_tensor(r, name, r->slot[N_GLOBAL + l * PER_LAYER + k],
                                 layer_tensors[k].role)))
                return rc;
        }
    }
    if ((rc = add_tensor(r, "output_norm.weight", r->slot[S_NORM], R_NORM)))
        return rc;
    /* Tied: the head is the embedding, and a stored copy is not used. */
    if (!r->c.tied && (rc = add_tensor(r, "output.weight", r->slot[S_HEAD], R_HEAD)))
        return rc;
    return 0;
}

/* The llama.* keys read_shape in backend.c reads, as the converter writes
 * them. */
static int add_metadata(reader *r)
{
    const hf_config *c = &r->c;
    gguf_file *f = r->f;
    const char *base = strrchr(r->dir, '/');
    base = base && base[1] ? base + 1 : r->dir;
    int rc = gguf_build_str(f, "general.architecture", "llama", 5);
    if (!rc)
        rc = gguf_build_str(f, "general.name", base, strlen(base));
    if (!rc)
        rc = gguf_build_u32(f, "llama.block_count", c->layers);
    if (!rc && c->ctx > 0)
        rc = gguf_build_u32(f, "llama.context_length", (uint32_t)c->ctx);
    if (!rc)
        rc = gguf_build_u32(f, "llama.embedding_length", c->hidden);
    if (!rc)
        rc = gguf_build_u32(f, "llama.feed_forward_length", c->ffn);
    if (!rc)
        rc = gguf_build_u32(f, "llama.attention.head_count", c->heads);
    if (!rc)
        rc = gguf_build_u32(f, "llama.attention.head_count_kv", c->kv_heads);
    if (!rc)
        rc = gguf_build_f32(f, "llama.rope.freq_base", c->theta);
    if (!rc)
        rc = gguf_build_f32(f, "llama.attention.layer_norm_rms_epsilon", c->eps);
    if (!rc)
        rc = gguf_build_u32(f, "llama.vocab_size", c->vocab);
    if (!rc)
        rc = gguf_build_u32(f, "llama.rope.dimension_count", c->head_dim);
    if (rc)
        return bt_errorf(r->err, r->errlen, rc, "metadata: %s", bt_strerror(rc));
    return 0;
}

/* ---- tokenizer.json --------------------------------------------------------------- */

typedef struct vocab {
    size_t n;             /* ids: the embedding's rows */
    const char **text;    /* per id: the token's text (into a document or PAD), or NULL */
    size_t *len;
    int32_t *type;        /* TT_* */
    char *pad;            /* the "[PADn]" texts of ids without a token */
    const char **merge;   /* per merge: "A B" */
    size_t *merge_len;
    size_t n_merges;
    char *joined;         /* merges given as pairs, joined with a space */
} vocab;

static void vocab_free(vocab *v)
{
    free(v->text);
    free(v->len);
    free(v->type);
    free(v->pad);
    free(v->merge);
    free(v->merge_len);
    free(v->joined);
}

/* llama.cpp's does_token_look_special: added tokens some models forget to
 * mark special. */
static bool looks_special(const char *s, size_t n)
{
    static const char *const fixed[] = {"<pad>", "<mask>", "<2mass>", "[@BOS@]"};
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        if (n == strlen(fixed[i]) && !memcmp(s, fixed[i], n))
            return true;
    if (n >= 4 && !memcmp(s, "<|", 2) && !memcmp(s + n - 2, "|>", 2))
        return true;
    /* DeepSeek's fullwidth bars, U+FF5C. */
    return n >= 8 && !memcmp(s, "<\xef\xbd\x9c", 4) && !memcmp(s + n - 4, "\xef\xbd\x9c>", 4);
}

/* The pre-tokenizer of tokenizer.c that PRE (tokenizer.json's
 * pre_tokenizer) is, or NULL with a short description of it in DESC. */
static const char *pre_name(const json_t *pre, bool ignore_merges, char *desc, size_t size)
{
    const json_t *items[4];
    size_t n = 0;
    if (is_str(json_object_get(pre, "type"), "Sequence")) {
        const json_t *seq = json_object_get(pre, "pretokenizers");
        n = json_array_size(seq);
        for (size_t i = 0; i < n && i < 4; i++)
            items[i] = json_array_get(seq, i);
    } else if (json_is_object(pre)) {
        items[n++] = pre;
    }
    /* The description: the types in order, for the message. */
    size_t at = (size_t)snprintf(desc, size, "tokenizer.json pre_tokenizer ");
    for (size_t i = 0; i < n && i < 4 && at < size; i++) {
        const json_t *t = json_object_get(items[i], "type");
        at += (size_t)snprintf(desc + at, size - at, "%s%.20s", i ? "+" : "", str_or(t, "?"));
    }
    if (n == 0 && at < size)
        snprintf(desc + at, size - at, "none");
    if (n < 1 || n > 2)
        return NULL;
    /* Byte-level last, without a prefix space (a field tokenizer.json
     * always writes); use_regex says whether it also splits by GPT-2's
     * regex, its default. */
    const json_t *bl = items[n - 1], *ur = json_object_get(bl, "use_regex");
    bool regex = unset(ur) || is_bool(ur, true);
    if (!is_str(json_object_get(bl, "type"), "ByteLevel") ||
        !is_bool(json_object_get(bl, "add_prefix_space"), false))
        return NULL;
    const char *name = NULL;
    if (n == 1 && regex) {
        name = "gpt2";
    } else if (n == 2 && regex && is_str(json_object_get(items[0], "type"), "Digits")) {
        if (is_bool(json_object_get(items[0], "individual_digits"), true))
            name = "smollm";
    } else if (n == 2 && !regex && is_str(json_object_get(items[0], "type"), "Split")) {
        const json_t *inv = json_object_get(items[0], "invert");
        if (is_str(json_object_get(json_object_get(items[0], "pattern"), "Regex"), LLAMA3_REGEX) &&
            is_str(json_object_get(items[0], "behavior"), "Isolated") &&
            (unset(inv) || is_bool(inv, false)))
            name = "llama-bpe";
    }
    /* tokenizer.c ignores merges (takes a pre-token that is a token whole)
     * exactly for llama-bpe. */
    if (name && ignore_merges != !strcmp(name, "llama-bpe")) {
        if (at < size)
            snprintf(desc + at, size - at, ignore_merges ? " with ignore_merges"
                                                         : " without ignore_merges");
        return NULL;
    }
    return name;
}

/* Why MODEL (tokenizer.json's model) with NORM is not a byte-level BPE
 * tokenizer.c reads, in DESC; false when it is one. */
static bool model_unsupported(const json_t *model, const json_t *norm, char *desc,
                              size_t size)
{
    const json_t *t = json_object_get(model, "type"), *nt = json_object_get(norm, "type");
    const json_t *pre = json_object_get(model, "continuing_subword_prefix"),
                 *suf = json_object_get(model, "end_of_word_suffix");
    if (!is_str(t, "BPE"))
        snprintf(desc, size, "tokenizer.json model %.20s", str_or(t, "of no type"));
    else if (is_bool(json_object_get(model, "byte_fallback"), true))
        snprintf(desc, size, "tokenizer.json BPE with byte_fallback");
    else if (json_string_length(pre) || json_string_length(suf))
        snprintf(desc, size, "tokenizer.json BPE with subword affixes");
    else if (!unset(norm))
        snprintf(desc, size, "tokenizer.json with normalizer %.20s", str_or(nt, "?"));
    else
        return false;
    return true;
}

/* The id of token text S[N]: the lowest, as the tokenizer's lookup; -1. */
static int64_t find_token(const vocab *v, const char *s, size_t n)
{
    for (size_t i = 0; i < v->n; i++)
        if (v->text[i] && v->len[i] == n && !memcmp(v->text[i], s, n))
            return (int64_t)i;
    return -1;
}

/* Fills V's tokens from MODEL's vocab and ADDED (tokenizer.json's
 * added_tokens). */
static int read_vocab(reader *r, vocab *v, const json_t *model, const json_t *added)
{
    json_t *map = json_object_get(model, "vocab"), *m;
    const char *key;
    char d[SHOWN + 8];
    if (!json_is_object(map))
        return bt_errorf(r->err, r->errlen, BT_EFORMAT, "tokenizer.json: model.vocab is not an "
                         "object of token ids");
    v->n = r->c.vocab;
    v->text = calloc(v->n, sizeof(*v->text));
    v->len = calloc(v->n, sizeof(*v->len));
    v->type = calloc(v->n, sizeof(*v->type));
    if (!v->text || !v->len || !v->type)
        return bt_errorf(r->err, r->errlen, BT_ENOMEM, "out of memory for %zu tokens", v->n);
    /* A key holds no NUL (jansson refuses one), so its length is strlen's. */
    json_object_foreach(map, key, m) {
        int64_t id;
        if (int_of(m, &id) || id < 0 || (uint64_t)id >= v->n)
            return bt_errorf(r->err, r->errlen, BT_EFORMAT, "tokenizer.json: token '%.*s' has "
                             "id %s, outside the %zu rows of the embedding", SHOWN, key,
                             describe(m, d, sizeof(d)), v->n);
        if (v->text[id])
            return bt_errorf(r->err, r->errlen, BT_EFORMAT, "tokenizer.json: tokens '%.*s' and "
                             "'%.*s' both have id %" PRId64, SHOWN, v->text[id], SHOWN, key,
                             id);
        v->text[id] = key;
        v->len[id] = strlen(key);
        v->type[id] = TT_NORMAL;
    }
    size_t i;
    const json_t *a;
    json_array_foreach(added, i, a) {
        const json_t *c = json_object_get(a, "content"), *sp = json_object_get(a, "special");
        int64_t id;
        if (!json_is_string(c) || int_of(json_object_get(a, "id"), &id) || id < 0 ||
            (uint64_t)id >= v->n)
            return bt_errorf(r->err, r->errlen, BT_EFORMAT, "tokenizer.json: an added token "
                             "without content or with an id outside the %zu rows of the "
                             "embedding", v->n);
        /* As llama.cpp converts: special (or special-looking) added tokens
         * are control tokens, the others user-defined, matched in text. */
        v->text[id] = json_string_value(c);
        v->len[id] = json_string_length(c);
        v->type[id] = is_bool(sp, true) || looks_special(v->text[id], v->len[id]) ? TT_CONTROL
                                                                                  : TT_USER;
    }
    size_t missing = 0;
    for (i = 0; i < v->n; i++)
        missing += !v->text[i];
    if (!missing)
        return 0;
    /* Ids no token has, the converter's way: "[PADn]", unused. */
    if (!(v->pad = malloc(missing * 24)))
        return bt_errorf(r->err, r->errlen, BT_ENOMEM, "out of memory");
    char *p = v->pad;
    for (i = 0; i < v->n; i++) {
        if (v->text[i])
            continue;
        int k = snprintf(p, 24, "[PAD%zu]", i);
        v->text[i] = p;
        v->len[i] = (size_t)k;
        v->type[i] = TT_UNUSED;
        p += k;
    }
    return 0;
}

/* Fills V's merges from MODEL: "A B" strings, or ["A", "B"] pairs (the
 * newer tokenizers format), which are joined. */
static int read_merges(reader *r, vocab *v, const json_t *model)
{
    const json_t *ms = json_object_get(model, "merges"), *m;
    if (!json_is_array(ms))
        return bt_errorf(r->err, r->errlen, BT_EFORMAT, "tokenizer.json: model.merges is not a "
                         "list");
    size_t joined = 0, i;
    json_array_foreach(ms, i, m) {
        const json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
        if (json_array_size(m) == 2 && json_is_string(a) && json_is_string(b))
            joined += json_string_length(a) + json_string_length(b) + 1;
        else if (!json_is_string(m))
            return bt_errorf(r->err, r->errlen, BT_EFORMAT, "tokenizer.json: merges[%zu] is "
                             "neither \"A B\" nor [\"A\", \"B\"]", i);
    }
    v->n_merges = json_array_size(ms);
    v->merge = malloc((v->n_merges ? v->n_merges : 1) * sizeof(*v->merge));
    v->merge_len = malloc((v->n_merges ? v->n_merges : 1) * sizeof(*v->merge_len));
    v->joined = malloc(joined ? joined : 1);
    if (!v->merge || !v->merge_len || !v->joined)
        return bt_errorf(r->err, r->errlen, BT_ENOMEM, "out of memory for merges");
    char *p = v->joined;
    json_array_foreach(ms, i, m) {
        if (json_is_string(m)) {
            v->merge[i] = json_string_value(m);
            v->merge_len[i] = json_string_length(m);
            continue;
        }
        const json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
        size_t la = json_string_length(a), lb = json_string_length(b);
        v->merge[i] = p;
        v->merge_len[i] = la + 1 + lb;
        memcpy(p, json_string_value(a), la);
        p[la] = ' ';
        memcpy(p + la + 1, json_string_value(b), lb);
        p += v->merge_len[i];
    }
    return 0;
}

/* A special token of tokenizer_config.json: a string or {"content": ...}. */
static const json_t *token_text(const json_t *tc, const char *key)
{
    const json_t *t = json_object_get(tc, key);
    if (json_is_object(t))
        t = json_object_get(t, "content");
    return json_is_string(t) ? t : NULL;
}

/* The chat template of tokenizer_config.json: a string, or the "default"
 * of a list of named templates. */
static const json_t *chat_template(const json_t *tc)
{
    const json_t *t = json_object_get(tc, "chat_template");
    if (json_is_array(t)) {
        size_t i;
        const json_t *e;
        json_array_foreach(t, i, e)
            if (is_str(json_object_get(e, "name"), "default"))
                return json_object_get(e, "template");
        return NULL;
    }
    return t;
}

/* bos, eos, add_bos_token and the chat template: tokenizer_config.json,
 * then chat_template.jinja, then config.json's ids.  V is NULL when there
 * are no tokens to name the special ones by: the ids alone are added. */
static int add_specials(reader *r, const vocab *v)
{
    json_t *tc = NULL;
    char *jinja = NULL;
    size_t jlen = 0;
    int rc = read_json(r->dir, "tokenizer_config.json", &tc, r->err, r->errlen);
    if (rc && rc != BT_ENOENT)
        return rc;
    const json_t *t, *tmpl = chat_template(tc);
    int64_t bos = r->c.bos, eos = r->c.eos, id;
    if (v && (t = token_text(tc, "bos_token")) &&
        (id = find_token(v, json_string_value(t), json_string_length(t))) >= 0)
        bos = id;
    if (v && (t = token_text(tc, "eos_token")) &&
        (id = find_token(v, json_string_value(t), json_string_length(t))) >= 0)
        eos = id;
    /* Newer transformers save the template in a file of its own. */
    if (v && !json_is_string(tmpl)) {
        tmpl = NULL;
        rc = read_whole(r->dir, "chat_template.jinja", &jinja, &jlen, r->err, r->errlen);
        if (rc && rc != BT_ENOENT)
            goto out;
    }
    rc = 0;
    if (bos >= 0 && bos < r->c.vocab)
        rc = gguf_build_u32(r->f, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (!rc && eos >= 0 && eos < r->c.vocab)
        rc = gguf_build_u32(r->f, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (!rc && v)
        rc = gguf_build_bool(r->f, "tokenizer.ggml.add_bos_token",
                             is_bool(json_object_get(tc, "add_bos_token"), true));
    if (!rc && v && (tmpl || jinja))
        rc = gguf_build_str(r->f, "tokenizer.chat_template",
                            tmpl ? json_string_value(tmpl) : jinja,
                            tmpl ? json_string_length(tmpl) : jlen);
    if (rc)
        rc = bt_errorf(r->err, r->errlen, rc, "tokenizer metadata: %s", bt_strerror(rc));
out:
    free(jinja);
    json_decref(tc);
    return rc;
}

/* The tokenizer.ggml.* keys from tokenizer.json, when the folder has one. */
static int add_tokenizer(reader *r)
{
    json_t *root;
    vocab v = {0};
    char desc[128];
    int rc = read_json(r->dir, "tokenizer.json", &root, r->err, r->errlen);
    if (rc == BT_ENOENT)
        return add_specials(r, NULL);  /* ids only, but config.json's eos still ends */
    if (rc)
        return rc;
    const json_t *model = json_object_get(root, "model");
    if (model_unsupported(model, json_object_get(root, "normalizer"), desc, sizeof(desc))) {
        /* Recorded where the tokenizer reads the kind, which it then
         * refuses by this name. */
        if ((rc = gguf_build_str(r->f, "tokenizer.ggml.model", desc, strlen(desc))))
            rc = bt_errorf(r->err, r->errlen, rc, "tokenizer metadata: %s", bt_strerror(rc));
        else
            rc = add_specials(r, NULL);
        goto out;
    }
    const char *pre = pre_name(json_object_get(root, "pre_tokenizer"),
                               is_bool(json_object_get(model, "ignore_merges"), true), desc,
                               sizeof(desc));
    if ((rc = read_vocab(r, &v, model, json_object_get(root, "added_tokens"))) ||
        (rc = read_merges(r, &v, model)))
        goto out;
    if ((rc = gguf_build_str(r->f, "tokenizer.ggml.model", "gpt2", 4)) ||
        (rc = gguf_build_str(r->f, "tokenizer.ggml.pre", pre ? pre : desc,
                             strlen(pre ? pre : desc))) ||
        (rc = gguf_build_str_array(r->f, "tokenizer.ggml.tokens", v.text, v.len, v.n)) ||
        (rc = gguf_build_i32_array(r->f, "tokenizer.ggml.token_type", v.type, v.n)) ||
        (rc = gguf_build_str_array(r->f, "tokenizer.ggml.merges", v.merge, v.merge_len,
                                   v.n_merges))) {
        rc = bt_errorf(r->err, r->errlen, rc, "tokenizer metadata: %s", bt_strerror(rc));
        goto out;
    }
    rc = add_specials(r, &v);
out:
    vocab_free(&v);
    json_decref(root);
    return rc;
}

/* ---- opening ---------------------------------------------------------------------- */

int hf_open(const char *dir, gguf_file **out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!out || !dir)
        return bt_errorf(err, errlen, BT_EINVAL, "hf_open: NULL %s", out ? "dir" : "out");
    *out = NULL;
    reader r = {.dir = dir, .err = err, .errlen = errlen};
    struct stat st;
    int rc;
    if (stat(dir, &st) < 0) {
        rc = bt_errorf(err, errlen, BT_EIO, "%s: %s", dir, strerror(errno));
        goto out;
    }
    if (!S_ISDIR(st.st_mode)) {
        rc = bt_errorf(err, errlen, BT_EIO, "%s: not a folder", dir);
        goto out;
    }
    if ((rc = gguf_build_create(&r.f))) {
        rc = bt_errorf(err, errlen, rc, "out of memory");
        goto out;
    }
    if ((rc = read_config(&r)) || (rc = list_files(&r)))
        goto out;
    for (size_t i = 0; i < r.n_files; i++)
        if ((rc = map_file(&r, r.files[i])))
            goto out;
    if ((rc = collect(&r)) || (rc = add_tensors(&r)) || (rc = add_metadata(&r)) ||
        (rc = add_tokenizer(&r)))
        goto out;
    *out = r.f;
    r.f = NULL;
    /* The optional files that were absent left their messages. */
    if (err && errlen)
        err[0] = '\0';
out:
    gguf_close(r.f);
    for (size_t i = 0; i < r.n_docs; i++)
        json_decref(r.docs[i]);
    free(r.docs);
    for (size_t i = 0; i < r.n_files; i++)
        free(r.files[i]);
    free(r.files);
    free(r.ts);
    free(r.slot);
    return rc;
}

int hf_tokenizer_open(const char *dir, int64_t n_vocab, gguf_file **out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!out || !dir || n_vocab < 1 || n_vocab > INT32_MAX)
        return bt_errorf(err, errlen, BT_EINVAL, "hf_tokenizer_open: bad arguments");
    *out = NULL;
    /* No config.json: no bos or eos of its own, and VOCAB ids. */
    reader r = {.dir = dir, .err = err, .errlen = errlen};
    r.c.vocab = (uint32_t)n_vocab, r.c.bos = -1, r.c.eos = -1;
    int rc = gguf_build_create(&r.f);
    if (rc)
        return bt_errorf(err, errlen, rc, "out of memory");
    char path[PATH_MAX];
    struct stat st;
    errno = 0;
    if (join(path, sizeof(path), dir, "tokenizer.json") || stat(path, &st) < 0)
        rc = bt_errorf(err, errlen, BT_ENOENT, "%s/tokenizer.json: %s", dir,
                       errno ? strerror(errno) : "path too long");
    else
        rc = add_tokenizer(&r);
    if (rc) {
        gguf_close(r.f);
        return rc;
    }
    *out = r.f;
    if (err && errlen)
        err[0] = '\0';
    return 0;
}

int tf_weights_open(const char *path, gguf_file **out, char *err, size_t errlen)
{
    if (!path || !out)
        return bt_errorf(err, errlen, BT_EINVAL, "tf_weights_open: NULL %s",
                         out ? "path" : "out");
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return hf_open(path, out, err, errlen);
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    if (strcmp(base, "config.json") != 0)
        return gguf_open(path, out, err, errlen);
    /* The folder of the config.json named. */
    char dir[PATH_MAX];
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n >= sizeof(dir))
        return bt_errorf(err, errlen, BT_ERANGE, "%s: the path is too long", path);
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (n == 0)
        snprintf(dir, sizeof(dir), "/");
    else
        snprintf(dir, sizeof(dir), "%.*s", (int)n, path);
    return hf_open(dir, out, err, errlen);
}
