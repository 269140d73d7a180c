/* Whisper's engine (backends/whisper/wengine.h).
 *
 * Weights: every parameter of the three graphs is converted once from the
 * file's f16 (or f32) into what the graph declares (f32, or q8_0 blocks for
 * the CPU's 8-bit products), onto the device, and borrowed by each
 * executable that names it (kx_param_borrow), so the decoder's weights are
 * resident once for the prompt and the step graphs.  The fused projections
 * of the file become separate parameters over row ranges: Q, K and V of a
 * self-attention are rows [0, D), [D, 2D) and [2D, 3D) of linear_0.
 *
 * Slots: the step executable owns the caches of every slot (its handles,
 * [slots, ...]).  Before a prompt runs, the prompt executable's handles are
 * pointed at the slot's share of them (kx_handle_borrow), so the prompt
 * writes the cross K/V and the first self K/V rows where the steps read
 * them, and nothing is copied. */
#include "backends/whisper/wengine.h"

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/whisper/ct2.h"
#include "common/status.h"
#include "kernels/cpu/threads.h"
#include "kernels/kernels.h"
#include "kernels/optable.h"

void openblas_set_num_threads(int n);

enum { X_ENC, X_PROMPT, X_STEP, X_COUNT };

typedef struct weight {
    char name[KG_NAME_LEN];
    void *data;                /* on the engine's device; owned */
    size_t bytes;
    kdtype dtype;
} weight;

struct weng {
    wm_shape shape;
    ct2_file *file;            /* owned; closed once the weights are converted */
    const kx_device *dev;      /* NULL: the CPU */
    kth_pool *pool;            /* CPU: the kernels' threads; owned */
    kt_cpu_opts cpu;           /* CPU: the op table's user (points at pool) */
    kx_exec *x[X_COUNT];       /* owned */
    weight *w;                 /* owned; n_w of them */
    size_t n_w, weight_bytes;
    int slots, max_prompt, ctx;
    int encoded;               /* windows in the encoder's output, 0 before any */
    int32_t *ibuf;             /* host scratch for the int inputs: 3 * max(max_prompt, slots) */
};

/* ---- the model file --------------------------------------------------------- */

/* The file variable, and the part of it (PART of PARTS equal row ranges),
 * that graph parameter NAME comes from.  0, or BT_ENOENT for a name this
 * engine does not know. */
static int source_of(const char *name, char *var, size_t n, int *part, int *parts)
{
    *part = 0, *parts = 1;
    bool enc = name[0] == 'e';
    const char *side = enc ? "encoder" : "decoder";
    if (!strcmp(name, "e.conv1.w") || !strcmp(name, "e.conv2.w") || !strcmp(name, "e.conv1.b") ||
        !strcmp(name, "e.conv2.b")) {
        snprintf(var, n, "encoder/conv%c/%s", name[6], name[8] == 'w' ? "weight" : "bias");
        return 0;
    }
    if (!strcmp(name, "e.pos") || !strcmp(name, "d.pos")) {
        snprintf(var, n, "%s/position_encodings/encodings", side);
        return 0;
    }
    if (!strcmp(name, "d.emb")) {
        snprintf(var, n, "decoder/embeddings/weight");
        return 0;
    }
    if (!strcmp(name + 1, ".ln.g") || !strcmp(name + 1, ".ln.b")) {
        snprintf(var, n, "%s/layer_norm/%s", side, name[5] == 'g' ? "gamma" : "beta");
        return 0;
    }
    int layer, at = 0;
    char comp[8], suffix;
    if (sscanf(name + 2, "%d.%7[a-z0-9]%n", &layer, comp, &at) != 2 || name[2 + at] != '.' ||
        !name[3 + at] || name[4 + at])
        return BT_ENOENT;
    suffix = name[3 + at];
    static const struct {
        const char *comp, *path;
        int part, parts;
    } map[] = {
        {"ln1", "self_attention/layer_norm", 0, 1}, {"q", "self_attention/linear_0", 0, 3},
        {"k", "self_attention/linear_0", 1, 3},     {"v", "self_attention/linear_0", 2, 3},
        {"o", "self_attention/linear_1", 0, 1},     {"ln2", NULL, 0, 1},
        {"xq", "attention/linear_0", 0, 1},         {"xk", "attention/linear_1", 0, 2},
        {"xv", "attention/linear_1", 1, 2},         {"xo", "attention/linear_2", 0, 1},
        {"ln3", "ffn/layer_norm", 0, 1},            {"fc1", "ffn/linear_0", 0, 1},
        {"fc2", "ffn/linear_1", 0, 1},
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        if (strcmp(comp, map[i].comp))
            continue;
        /* The second norm of a layer is the FFN's in the encoder, the
         * cross-attention's in the decoder. */
        const char *path = map[i].path ? map[i].path
                                       : enc ? "ffn/layer_norm" : "attention/layer_norm";
        bool ln = comp[0] == 'l';
        const char *leaf = ln ? (suffix == 'g' ? "gamma" : "beta") : suffix == 'w' ? "weight" : "bias";
        snprintf(var, n, "%s/layer_%d/%s/%s", side, layer, path, leaf);
        *part = map[i].part, *parts = map[i].parts;
        return 0;
    }
    return BT_ENOENT;
}

static int read_int(ct2_file *f, const char *name, int64_t lo, int64_t hi, int64_t *v, char *err,
                    size_t errlen)
{
    int rc = ct2_get_int(f, name, v, err, errlen);
    if (!rc && (*v < lo || *v > hi)) {
        snprintf(err, errlen, "%s: variable %s is %lld; this engine takes %lld..%lld",
                 ct2_path(f), name, (long long)*v, (long long)lo, (long long)hi);
        rc = BT_EFORMAT;
    }
    return rc;
}

static int dim_of(ct2_file *f, const char *name, uint32_t rank, int d, int *out, char *err,
                  size_t errlen)
{
    const ct2_var *v;
    int rc = ct2_expect(f, name, UINT32_MAX, rank, NULL, &v, err, errlen);
    if (!rc)
        *out = (int)v->dims[d];
    return rc;
}

/* The shape of the model in F, checked against what the graphs compute. */
static int read_shape(ct2_file *f, wm_shape *s, char *err, size_t errlen)
{
    if (strcmp(ct2_spec(f), "WhisperSpec") != 0) {
        snprintf(err, errlen, "%s: a %s model, not Whisper (WhisperSpec)", ct2_path(f),
                 ct2_spec(f));
        return BT_EFORMAT;
    }
    int64_t heads, act, pre;
    int rc;
    if ((rc = read_int(f, "encoder/num_heads", 1, 64, &heads, err, errlen)) ||
        (rc = read_int(f, "decoder/activation", 3, 3, &act, err, errlen)) ||
        (rc = read_int(f, "decoder/pre_norm", 1, 1, &pre, err, errlen)) ||
        (rc = dim_of(f, "encoder/conv1/weight", 3, 0, &s->d_model, err, errlen)) ||
        (rc = dim_of(f, "encoder/conv1/weight", 3, 1, &s->n_mels, err, errlen)) ||
        (rc = dim_of(f, "encoder/layer_0/ffn/linear_0/weight", 2, 0, &s->ffn, err, errlen)) ||
        (rc = dim_of(f, "encoder/position_encodings/encodings", 2, 0, &s->n_audio, err, errlen)) ||
        (rc = dim_of(f, "decoder/position_encodings/encodings", 2, 0, &s->n_text, err, errlen)) ||
        (rc = dim_of(f, "decoder/embeddings/weight", 2, 0, &s->vocab, err, errlen)))
        return rc;
    s->heads = (int)heads;
    s->n_frames = 2 * s->n_audio;
    s->eps = 1e-5f;
    char name[96];
    for (s->enc_layers = 0; s->enc_layers < 64; s->enc_layers++) {
        snprintf(name, sizeof(name), "encoder/layer_%d/ffn/linear_0/weight", s->enc_layers);
        if (!ct2_find(f, name))
            break;
    }
    for (s->dec_layers = 0; s->dec_layers < 64; s->dec_layers++) {
        snprintf(name, sizeof(name), "decoder/layer_%d/ffn/linear_0/weight", s->dec_layers);
        if (!ct2_find(f, name))
            break;
    }
    if (s->d_model % s->heads || s->d_model / s->heads > 256 || !s->enc_layers ||
        !s->dec_layers) {
        snprintf(err, errlen, "%s: %d layers, %d heads of d_model %d: not a Whisper shape",
                 ct2_path(f), s->enc_layers, s->heads, s->d_model);
        return BT_EFORMAT;
    }
    return 0;
}

/* ---- weights ------------------------------------------------------------------ */

/* Converts graph parameter V (its name, dtype and size) from the file into
 * new host memory *OUT. */
static int convert(weng *e, const kg_value *v, void **out, char *err, size_t errlen)
{
    char var[96];
    int part, parts;
    if (source_of(v->name, var, sizeof(var), &part, &parts)) {
        snprintf(err, errlen, "%s: no variable of the file holds parameter %s", ct2_path(e->file),
                 v->name);
        return BT_ENOENT;
    }
    const ct2_var *cv = ct2_find(e->file, var);
    size_t n = 1;
    for (int d = 0; d < v->ndim; d++)
        n *= (size_t)v->shape[d];
    if (!cv || (cv->dtype != CT2_F16 && cv->dtype != CT2_F32) || cv->nelems != n * (size_t)parts) {
        snprintf(err, errlen, "%s: variable %s %s (%zu elements of %s), where %zu f16 or f32 were expected",
                 ct2_path(e->file), var, cv ? "does not fit" : "is missing", cv ? cv->nelems : 0,
                 cv ? ct2_dtype_name(cv->dtype) : "-", n * (size_t)parts);
        return BT_EFORMAT;
    }
    kdtype src_t = cv->dtype == CT2_F16 ? KD_F16 : KD_F32;
    size_t src_bytes = kdtype_bytes(src_t, n);
    /* The file's data is unaligned: copy it out before reading it as
     * numbers. */
    void *raw = malloc(src_bytes);
    float *f = malloc(n * sizeof(float));
    void *dst = v->dtype == KD_F32 ? (void *)f : malloc(v->bytes);
    int rc = raw && f && dst ? 0 : BT_ENOMEM;
    if (!rc) {
        memcpy(raw, (const uint8_t *)cv->data + (size_t)part * src_bytes, src_bytes);
        rc = k_widen(f, src_t, raw, n);
    }
    if (!rc && v->dtype == KD_BF16) {
        /* Rounded to bf16 in plain rows, then packed for oneDNN in the
         * same bytes (wm_param_dtype chose bf16 only where they fit). */
        uint16_t *plain = malloc(n * sizeof(uint16_t));
        rc = plain ? k_cast(plain, KD_BF16, f, KD_F32, n) : BT_ENOMEM;
        if (!rc && (v->ndim != 2 || k_matmul_bf16_packed_bytes((int)v->shape[0], (int)v->shape[1]) !=
                                        v->bytes))
            rc = BT_EINVAL;
        if (!rc)
            rc = k_matmul_bf16_pack(dst, plain, (int)v->shape[0], (int)v->shape[1]);
        free(plain);
    }
    else if (!rc && v->dtype != KD_F32)
        rc = k_quantize(dst, v->dtype, f, n);
    free(raw);
    if (dst != f)
        free(f);
    if (rc) {
        if (dst != f)
            free(dst);
        snprintf(err, errlen, "%s: converting %s to %s: %s", ct2_path(e->file), var,
                 kdtype_name(v->dtype), bt_strerror(rc));
        return rc;
    }
    *out = dst;
    return 0;
}

/* The weight of parameter V into *OUT, converted and on the device on
 * first use.  0, or a negative bt_err with ERR. */
static int weight_get(weng *e, const kg_value *v, weight **out, char *err, size_t errlen)
{
    for (size_t i = 0; i < e->n_w; i++)
        if (!strcmp(e->w[i].name, v->name)) {
            /* Every graph declares a parameter by wm_param_dtype of one
             * shape: the same name is the same weight. */
            assert(e->w[i].dtype == v->dtype && e->w[i].bytes == v->bytes);
            *out = &e->w[i];
            return 0;
        }
    weight *grown = realloc(e->w, (e->n_w + 1) * sizeof(*e->w));
    if (!grown) {
        snprintf(err, errlen, "%s: parameter %s: out of memory", ct2_path(e->file), v->name);
        return BT_ENOMEM;
    }
    e->w = grown;
    void *host;
    int rc = convert(e, v, &host, err, errlen);
    if (rc)
        return rc;
    weight *w = &e->w[e->n_w];
    snprintf(w->name, sizeof(w->name), "%s", v->name);
    w->bytes = v->bytes, w->dtype = v->dtype, w->data = host;
    if (e->dev) {
        void *d = NULL;
        if (e->dev->alloc(e->dev->dev, v->bytes, &d) ||
            e->dev->copy(e->dev->dev, d, host, v->bytes, NULL)) {
            e->dev->free(e->dev->dev, d);
            free(host);
            snprintf(err, errlen, "%s: no device memory for %s (%zu bytes)", ct2_path(e->file),
                     v->name, v->bytes);
            return BT_ENOMEM;
        }
        free(host);
        w->data = d;
    }
    e->n_w++;
    e->weight_bytes += v->bytes;
    *out = w;
    return 0;
}

static int bind_weights(weng *e, kx_exec *x, const kg_graph *g, char *err, size_t errlen)
{
    for (size_t i = 0; i < g->n_values; i++) {
        const kg_value *v = &g->values[i];
        if (v->kind != KG_PARAM)
            continue;
        weight *w;
        int rc = weight_get(e, v, &w, err, errlen);
        if (rc)
            return rc;
        rc = kx_param_borrow(x, v->name, v->dtype, w->data, w->bytes);
        if (rc) {
            snprintf(err, errlen, "binding %s: %s", v->name, bt_strerror(rc));
            return rc;
        }
    }
    return 0;
}

/* ---- executables ---------------------------------------------------------- */

static int compile(weng *e, kg_graph *g, int which, const char *what, char *err, size_t errlen)
{
    char why[300];
    if (!g) {
        snprintf(err, errlen, "cannot build Whisper's %s graph (shape or memory)", what);
        return BT_ENOMEM;
    }
    int rc = e->dev ? kt_cuda_check(g, why, sizeof(why)) : kt_cpu_check(g, why, sizeof(why));
    if (rc) {
        snprintf(err, errlen, "Whisper's %s graph cannot run on the %s: %s", what,
                 e->dev ? "GPU" : "CPU", why);
        kg_destroy(g);
        return rc;
    }
    kx_op_table ops;
    if (e->dev) {
        kt_cuda_ops(&ops);
    } else {
        kt_cpu_ops(&ops);
        ops.user = &e->cpu;
    }
    /* A step is captured as a CUDA graph once per batch size and replayed.
     * The prompt's handles move from slot to slot, which a captured graph
     * would not follow: it is never captured. */
    kx_options o = {.device = e->dev, .graphs = e->dev && which == X_STEP, .n_compute = 1};
    rc = kx_compile(g, &ops, &o, &e->x[which]);
    if (rc)
        snprintf(err, errlen, "compiling Whisper's %s graph: %s", what, bt_strerror(rc));
    else
        rc = bind_weights(e, e->x[which], g, err, errlen);
    kg_destroy(g);
    return rc;
}

/* Points the prompt's handles at slot SLOT's share of the step's. */
static int bind_slot(weng *e, int slot)
{
    static const char *const fmts[4] = {WM_SELF_K, WM_SELF_V, WM_CROSS_K, WM_CROSS_V};
    char name[KG_NAME_LEN];
    for (int l = 0; l < e->shape.dec_layers; l++)
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof(name), fmts[i], l);
            size_t bytes = 0;
            uint8_t *all = kx_handle(e->x[X_STEP], name, &bytes);
            if (!all)
                return BT_ENOENT;
            size_t share = bytes / (size_t)e->slots;
            int rc = kx_handle_borrow(e->x[X_PROMPT], name, all + (size_t)slot * share, share);
            if (rc)
                return rc;
        }
    return 0;
}

int weng_create(const char *path, const weng_opts *o, weng **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!o || o->slots < 1 || o->slots > 256 || o->max_prompt < 1 || o->threads < 0) {
        snprintf(err, errlen, "Whisper engine: slots must be 1..256 and max_prompt at least 1");
        return BT_EINVAL;
    }
    weng *e = calloc(1, sizeof(*e));
    if (!e) {
        snprintf(err, errlen, "Whisper engine: out of memory");
        return BT_ENOMEM;
    }
    int rc = ct2_open(path, &e->file, err, errlen);
    if (rc)
        goto err;
    if ((rc = read_shape(e->file, &e->shape, err, errlen)))
        goto err;
    e->dev = o->device;
    e->shape.weight = o->act_q8 && !e->dev ? KD_Q8_0 : KD_F32;
    /* bf16 only where it is faster than sgemm: never a slow emulation. */
    e->shape.audio = o->act_q8 && !e->dev && k_matmul_bf16_native() ? KD_BF16 : KD_F32;
    /* f16 only where the decode path's query reads it (AVX2, heads of a
     * multiple of 8): elsewhere every step would widen all of K and V. */
    e->shape.cross = o->act_q8 && !e->dev && k_cpu_isa() >= K_ISA_AVX2 &&
                             (e->shape.d_model / e->shape.heads) % 8 == 0
                         ? KD_F16
                         : KD_F32;
    e->slots = o->slots;
    e->ctx = e->shape.n_text;
    e->max_prompt = o->max_prompt < e->ctx ? o->max_prompt : e->ctx;
    int threads = o->threads > 0 ? o->threads : 1;
    if (!e->dev) {
        openblas_set_num_threads(threads);
        if ((rc = kth_pool_create(threads, &e->pool))) {
            snprintf(err, errlen, "starting %d kernel threads: %s", threads, bt_strerror(rc));
            goto err;
        }
        e->cpu = (kt_cpu_opts){e->pool, o->act_q8};
    }
    int most = e->max_prompt > e->slots ? e->max_prompt : e->slots;
    if (!(e->ibuf = malloc(3 * (size_t)most * sizeof(int32_t)))) {
        rc = BT_ENOMEM;
        snprintf(err, errlen, "Whisper engine: out of memory");
        goto err;
    }
    if ((rc = compile(e, wm_build_encoder(&e->shape, e->slots), X_ENC, "encoder", err, errlen)) ||
        (rc = compile(e, wm_build_step(&e->shape, e->slots, e->ctx), X_STEP, "step", err,
                      errlen)) ||
        (rc = compile(e, wm_build_prompt(&e->shape, e->max_prompt, e->ctx), X_PROMPT, "prompt",
                      err, errlen)))
        goto err;
    /* The prompt's own caches are never used: slot 0's stand in until a
     * prompt binds its slot, and its memory goes back now. */
    if ((rc = bind_slot(e, 0))) {
        snprintf(err, errlen, "sharing the caches of the prompt and the steps: %s",
                 bt_strerror(rc));
        goto err;
    }
    /* Every weight is converted: the file is no longer needed. */
    ct2_close(e->file);
    e->file = NULL;
    *out = e;
    return 0;
err:
    weng_destroy(e);
    return rc;
}

void weng_destroy(weng *e)
{
    if (!e)
        return;
    for (int i = 0; i < X_COUNT; i++)
        kx_destroy(e->x[i]);
    for (size_t i = 0; i < e->n_w; i++) {
        if (e->dev)
            e->dev->free(e->dev->dev, e->w[i].data);
        else
            free(e->w[i].data);
    }
    free(e->w);
    free(e->ibuf);
    kth_pool_destroy(e->pool);
    ct2_close(e->file);
    free(e);
}

const wm_shape *weng_shape(const weng *e)
{
    return &e->shape;
}

int weng_slots(const weng *e)
{
    return e->slots;
}

int weng_ctx(const weng *e)
{
    return e->ctx;
}

size_t weng_weight_bytes(const weng *e)
{
    return e->weight_bytes;
}

/* ---- running ------------------------------------------------------------- */

/* Output 0 of X, ROWS rows of the vocabulary from row FROM on, to host
 * memory LOGITS. */
static int logits_out(weng *e, kx_exec *x, int from, int rows, float *logits)
{
    size_t bytes = 0;
    const char *src = kx_output(x, 0, &bytes);
    size_t row = (size_t)e->shape.vocab * sizeof(float), want = (size_t)rows * row;
    if (!src || bytes < (size_t)from * row + want)
        return BT_EINVAL;
    src += (size_t)from * row;
    if (e->dev)
        return e->dev->copy(e->dev->dev, logits, src, want, NULL);
    memcpy(logits, src, want);
    return 0;
}

int weng_encode(weng *e, const float *mel, int n)
{
    if (n < 1 || n > e->slots || !mel)
        return BT_EINVAL;
    size_t bytes = (size_t)n * e->shape.n_frames * e->shape.n_mels * sizeof(float);
    int rc;
    e->encoded = 0;
    if ((rc = kx_extent_set(e->x[X_ENC], n)) || (rc = kx_input_bind(e->x[X_ENC], 0, mel, bytes)) ||
        (rc = kx_run(e->x[X_ENC])))
        return rc;
    e->encoded = n;
    return 0;
}

const float *weng_audio(const weng *e, int window)
{
    if (window < 0 || window >= e->encoded)
        return NULL;
    size_t bytes = 0;
    const float *audio = kx_output(e->x[X_ENC], 0, &bytes);
    size_t one = (size_t)e->shape.n_audio * e->shape.d_model;
    return audio && bytes >= (size_t)(window + 1) * one * sizeof(float) ? audio + window * one
                                                                        : NULL;
}

int weng_copy(const weng *e, void *dst, const void *src, size_t bytes)
{
    if (e->dev)
        return e->dev->copy(e->dev->dev, dst, src, bytes, NULL);
    memcpy(dst, src, bytes);
    return 0;
}

int weng_prompt(weng *e, int slot, const float *audio, const int32_t *tokens, int n_tok, int sot,
                float *logits, float *sot_logits)
{
    if (slot < 0 || slot >= e->slots || !audio || n_tok < 1 || n_tok > e->max_prompt || !tokens ||
        sot < 0 || sot >= n_tok)
        return BT_EINVAL;
    size_t one = (size_t)e->shape.n_audio * e->shape.d_model * sizeof(float);
    int32_t *pos = e->ibuf, *rows = e->ibuf + n_tok;
    for (int i = 0; i < n_tok; i++)
        pos[i] = i;
    rows[0] = sot, rows[1] = n_tok - 1;
    kx_exec *x = e->x[X_PROMPT];
    int rc;
    if ((rc = bind_slot(e, slot)) || (rc = kx_extent_set(x, n_tok)) ||
        (rc = kx_input_bind(x, 0, tokens, (size_t)n_tok * 4)) ||
        (rc = kx_input_bind(x, 1, pos, (size_t)n_tok * 4)) ||
        (rc = kx_input_bind(x, 2, rows, 8)) ||
        (rc = kx_input_bind(x, 3, audio, one)) || (rc = kx_run(x)))
        return rc;
    if (sot_logits && (rc = logits_out(e, x, 0, 1, sot_logits)))
        return rc;
    return logits ? logits_out(e, x, 1, 1, logits) : 0;
}

int weng_step(weng *e, const int32_t *tokens, const int32_t *lens, int n, float *logits)
{
    if (n < 1 || n > e->slots || !tokens || !lens)
        return BT_EINVAL;
    for (int b = 0; b < n; b++)
        if (lens[b] >= e->ctx)
            return BT_ERANGE;
    kx_exec *x = e->x[X_STEP];
    int rc;
    if ((rc = kx_extent_set(x, n)) || (rc = kx_input_bind(x, 0, tokens, (size_t)n * 4)) ||
        (rc = kx_input_bind(x, 1, lens, (size_t)n * 4)) ||
        (rc = kx_input_bind(x, 2, lens, (size_t)n * 4)) || (rc = kx_run(x)))
        return rc;
    return logits ? logits_out(e, x, 0, n, logits) : 0;
}
