/* The built-in `transformer` backend: a Llama-family decoder read from a
 * GGUF file (or a Hugging Face folder, which hf.c presents as one) and run
 * as two executable graphs (kernels/exec.h):
 *
 *   prefill  batch 1, bucketed: compiled for `prefill_chunk` tokens and run
 *            at the prompt's length; a longer prompt runs in chunks, each
 *            attending to the positions the earlier ones cached;
 *   decode   one step of up to `max_batch` sequences of different lengths,
 *            so decode steps of different requests share one execution.
 *
 * Both read the weights in place from the file's read-only mapping
 * (kx_param_borrow), so the weights are resident once.
 *
 * Devices.  On `cpu` the executables run the CPU op table.  On `cuda:N`
 * (a build with CUDA, or the emulated one) they run the CUDA op table on
 * that GPU: each weight is uploaded to device memory once, widened to f32
 * where the GPU kernels need it (the token embedding, and f16 or bf16
 * matrices: the GPU's products take f32 or GGUF blocks), and both
 * executables borrow the upload; KV caches live in device memory and move
 * between executables and to host memory (eviction) by device copies; the
 * step's logits and greedy tokens are copied back to the host for the
 * sampler and the outputs.
 *
 * KV caches.  The decode executable holds `max_batch` cache slots of
 * `max_seq` positions; row b of a decode step reads and appends to slot b.
 * A session (one request) lives in a slot while it decodes.  There may be
 * more sessions than slots: when a session without a slot comes to decode
 * and none is free, the least recently used session that is not in this
 * batch is evicted, its written positions copied to host memory it owns,
 * and copied back when it decodes again.  So any number of requests can be
 * in flight, and the cost of having more than `max_batch` of them is a copy
 * of their positions, not a refusal.  A prefill runs in its session's
 * slot: the prefill executable's caches are moved onto that slot first
 * (kx_handle_borrow), so nothing is copied when decoding starts.
 *
 * Nodes.  mode `prefill` takes its first input: I32 or I64 token ids (any
 * dims, flattened) or U8 UTF-8 text, which the file's tokenizer encodes
 * (backends/transformer/tokenizer.c) inside the chat template it carries (option
 * chat_template; not when the input is raw, baton_input.raw: a completion's
 * prompt).  mode `decode` takes one token id.  Outputs are chosen
 * by name: `token` (I32 [1], the next token), `text` (U8: the bytes the
 * token adds to the answer, whole UTF-8 characters only, nothing for an
 * end-of-generation token), `logits` (F32 [vocab], before sampling), and
 * for prefill `kv` (the cache handed off to a decode on another worker,
 * which takes it as its input `kv`: disaggregated serving).  The
 * finish signal is raised when the token ends generation (EOS, <|im_end|>)
 * or the session's cache is full.
 *
 * Prefix caching (option prefix_cache; backends/transformer/prefix.h).
 * A session that ends leaves its KV in its slot as a cached entry, keyed
 * by its token ids in blocks.  A prefill whose prompt begins with a cached
 * prefix computes only the rest: when the entry sits in a free slot and
 * the prompt goes on from nearly all of it (the next turn of a
 * conversation), the session takes that slot over and reads the prefix in
 * place; otherwise (a shorter shared part, an entry in host memory) the
 * prefix is copied into the session's slot, which costs a copy, not a
 * forward pass.  A slot is taken for a new session from free slots first,
 * then from the cached entry least recently used (moved to host memory
 * within prefix_cache_mb, else dropped), then from a live session (as
 * above). */
#include <assert.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/builtin.h"
#include "backends/catalog.h"
#include "backends/device.h"
#include "kernels/exec.h"
#include "backends/transformer/gguf.h"
#include "backends/transformer/hf.h"
#include "kernels/kernels.h"
#include "kernels/optable.h"
#include "backends/transformer/model.h"
#include "backends/transformer/prefix.h"
#include "backends/transformer/transformer.h"
#include "backends/transformer/tokenizer.h"
#include "kernels/cpu/threads.h"
#include "common/prefix.h"
#include "common/status.h"
#include "common/vec.h"

/* OpenBLAS's own control of its thread pool (cblas.h declares it only in
 * some versions). */
void openblas_set_num_threads(int n);

typedef struct baton_session tf_session;

struct baton_model {
    gguf_file *file;            /* owns the mapping the parameters point into */
    ktf_shape shape;
    int max_seq;                /* positions of one session's cache */
    int chunk;                  /* tokens of one prefill run (its bucket) */
    int slots;                  /* decode rows = cache slots (max_batch) */
    int32_t eos;                /* option eos: the one token that ends generation; -1:
                                   the tokenizer's end-of-generation tokens */
    int32_t file_eos;           /* the file's tokenizer.ggml.eos_token_id, or -1 */
    tok_vocab *vocab;           /* the file's tokenizer; NULL when it has none we read */
    char vocab_err[256];        /* why vocab is NULL */
    bool chat;                  /* option chat_template: wrap text prompts in it */
    bool add_bos;               /* the file's tokenizer.ggml.add_bos_token */
    kx_exec *prefill, *decode;
    tf_session **owner;         /* per slot: the session resident there, or NULL */
    pc_cache *pc;               /* the prefix cache; NULL when off (option, tensor parallel) */
    pc_stats reported;          /* its counters as cache_report last gave them */
    uint64_t clock;             /* decode steps so far: the LRU clock */
    uint64_t batch_id;          /* marks the sessions of the current batch */
    size_t row_floats;          /* elements of one cached position of one layer: K or V */
    size_t row_bytes;           /* their bytes in the cache (f32, f16 or q8_0: shape.cache) */
    uint64_t weight_bytes;      /* bytes of the mapped tensors in use */
    char *report;               /* model_describe's text; owned */
    const kx_device *dev;       /* NULL: the CPU; else the GPU the executables run on */
    kth_pool *pool;             /* CPU: the kernels' threads (option threads), owned */
    kt_cpu_opts cpu;            /* CPU: the op table's user: pool, activations */
    kt_cuda_opts cuda;          /* GPU: the op table's user: communicator, invariance */
    bool invariant;             /* batch_invariant, on either device */
    int ordinal;                /* that GPU's number; -1 on the CPU */
    int tp_rank;                /* this rank's shard of the FFN (shape.tp ranks) */
    void *comm;                 /* shape.tp > 1: the group's NCCL communicator (owned) */
    struct upload {             /* GPU: each weight's one copy in device memory */
        char name[KG_NAME_LEN];
        void *ptr;              /* device memory, owned (dev->free) */
    } *uploads;
    size_t n_uploads;
    float *host_logits;         /* GPU: [slots, vocab] the last step's logits, on the host */
    int32_t *host_argmax;       /* GPU: [slots] its greedy tokens */
    void *dsample;              /* GPU: the sampler's device memory: params [slots, 3] f32,
                                   rng [slots, 2] i64, tokens [slots] i32 (dev->free) */
    void *hsample;              /* GPU: the same on the host (malloc'd) */
    struct wd_ctx {             /* ktf_shape.weight_dtype's context */
        const gguf_file *f;
        bool gpu;               /* widen the embedding table to f32 */
    } wd;
};

struct baton_session {
    int len;                    /* positions written: the next token's position */
    int slot;                   /* decode slot holding its cache, -1: none */
    uint64_t used;              /* model clock at its last use */
    uint64_t batch_id;          /* == model's batch_id while in the current batch */
    void *saved;                /* evicted: [layer][K, V][saved_len][row] in the cache's
                                   type (malloc'd) */
    int saved_len;
    char carry[8];              /* UTF-8 bytes of a character not yet complete */
    int n_carry;
    int32_t *ids;               /* prefix cache: the tokens at positions [0, len); owned */
    int ids_cap;
    bool ids_ok;                /* ids holds them (not after a handed-in cache) */
    uint64_t *keys;             /* its prompt's routing key (reported stored); owned */
    size_t n_keys;
};

static int bind_prefill_cache(baton_model *m, int slot);

/* The name this backend is registered and declared (backends/catalog.c)
 * under. */
#define TF_NAME "transformer"

/* ---- options --------------------------------------------------------------------- */

/* Option NAME of P into *V: as given, else its default, parsed and checked
 * against its declaration in backends/catalog.c (the one statement of its
 * default and of the values it may take, which --check-config applies
 * too).  0, or a bt_err with the refusal in ERR. */
static int opt_get(const baton_load_params *p, const char *name, bt_opt_value *v, char *err,
                   size_t errlen)
{
    const bt_backend_desc *b = bt_backend_find(TF_NAME);
    const bt_opt_desc *d = bt_backend_option(b, name);
    assert(d); /* the options read here are declared */
    return bt_opt_parse(b, d, baton_load_option(p, name), v, err, errlen);
}

/* ---- reading the GGUF ------------------------------------------------------------ */

static kdtype kd_of_gguf(uint32_t t)
{
    switch (t) {
    case GGUF_GGML_F32: return KD_F32;
    case GGUF_GGML_F16: return KD_F16;
    case GGUF_GGML_BF16: return KD_BF16;
    case GGUF_GGML_Q8_0: return KD_Q8_0;
    case GGUF_GGML_Q4_0: return KD_Q4_0;
    case GGUF_GGML_Q4_1: return KD_Q4_1;
    }
    return (kdtype)0;
}

/* The GGUF tensor behind graph parameter NAME: the graph names matrices
 * and norms without the file's ".weight" suffix. */
static const gguf_tensor *tensor_of(const gguf_file *f, const char *name)
{
    size_t n = strlen(name);
    if (n > 7 && strcmp(name + n - 7, ".weight") == 0)
        return gguf_tensor_find(f, name);
    char full[KG_NAME_LEN + 8];
    snprintf(full, sizeof(full), "%s.weight", name);
    return gguf_tensor_find(f, full);
}

/* ktf_shape.weight_dtype: the file's type of each matrix.  On a GPU the
 * embedding table is widened to f32 (the GPU's EMBED reads f32 rows), and
 * so is an f16 or bf16 matrix (a Hugging Face folder's): the GPU's
 * products take f32 or GGUF blocks. */
static kdtype file_dtype(void *user, const char *name)
{
    const struct wd_ctx *w = user;
    if (w->gpu && !strcmp(name, "token_embd.weight"))
        return KD_F32;
    const gguf_tensor *t = tensor_of(w->f, name);
    kdtype dt = t ? kd_of_gguf(t->type) : KD_F32;
    return w->gpu && (dt == KD_F16 || dt == KD_BF16) ? KD_F32 : dt;
}

/* An unsigned metadata value of the architecture: "llama.KEY". */
static int arch_u32(const gguf_file *f, const char *key, bool required, uint32_t def,
                    uint32_t *out, char *err, size_t errlen)
{
    char full[96];
    snprintf(full, sizeof(full), "llama.%s", key);
    int rc = gguf_get_u32(f, full, out);
    if (rc == 0)
        return 0;
    if (!required) {
        *out = def;
        return 0;
    }
    snprintf(err, errlen, "metadata %s: %s", full, bt_strerror(rc));
    return -1;
}

/* Reads the shape of the decoder from F's metadata and checks it; WD is
 * the weight-type callback's context (it must outlive the graph builds). */
static int read_shape(const gguf_file *f, struct wd_ctx *wd, ktf_shape *s, char *err,
                      size_t errlen)
{
    const char *arch;
    size_t alen;
    if (gguf_get_str(f, "general.architecture", &arch, &alen) != 0) {
        snprintf(err, errlen, "metadata general.architecture is missing");
        return -1;
    }
    if (alen != 5 || memcmp(arch, "llama", 5) != 0) {
        snprintf(err, errlen, "architecture '%.*s' is not supported (the transformer backend "
                 "runs llama)", (int)(alen > 64 ? 64 : alen), arch);
        return -1;
    }
    uint32_t hidden, layers, heads, kv_heads, ffn, rope_dims;
    if (arch_u32(f, "embedding_length", true, 0, &hidden, err, errlen) ||
        arch_u32(f, "block_count", true, 0, &layers, err, errlen) ||
        arch_u32(f, "attention.head_count", true, 0, &heads, err, errlen) ||
        arch_u32(f, "attention.head_count_kv", false, heads, &kv_heads, err, errlen) ||
        arch_u32(f, "feed_forward_length", true, 0, &ffn, err, errlen))
        return -1;
    if (!hidden || !layers || !heads || !kv_heads || !ffn || hidden % heads ||
        heads % kv_heads || hidden > 65536 || layers > 1024 || ffn > 1 << 20) {
        snprintf(err, errlen, "metadata gives an impossible shape: hidden %u, %u layers, %u "
                 "heads, %u KV heads, FFN %u", hidden, layers, heads, kv_heads, ffn);
        return -1;
    }
    if (arch_u32(f, "rope.dimension_count", false, hidden / heads, &rope_dims, err, errlen))
        return -1;
    if (rope_dims != hidden / heads) {
        snprintf(err, errlen, "partial RoPE (%u of %u dims per head) is not supported",
                 rope_dims, hidden / heads);
        return -1;
    }
    float eps = 1e-5f, theta = 10000.0f;
    gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps);
    gguf_get_f32(f, "llama.rope.freq_base", &theta);
    const gguf_tensor *emb = gguf_tensor_find(f, "token_embd.weight");
    if (!emb || emb->n_dims != 2 || emb->ne[0] != hidden || emb->ne[1] < 1 ||
        emb->ne[1] > INT32_MAX) {
        snprintf(err, errlen, "tensor token_embd.weight is missing or not [vocab, %u]", hidden);
        return -1;
    }
    *s = (ktf_shape){
        .hidden = (int)hidden, .layers = (int)layers, .heads = (int)heads,
        .kv_heads = (int)kv_heads, .head_dim = (int)(hidden / heads), .ffn = (int)ffn,
        .vocab = (int)emb->ne[1], .act = KD_F32, .weight = KD_F32, .cache = KD_F32,
        .rms_eps = eps, .rope_theta = theta,
        /* llama.cpp's converter permutes Q and K for this rotation. */
        .rope_mode = K_ROPE_NORMAL,
        .weight_dtype = file_dtype, .weight_user = wd,
        .output_head = gguf_tensor_find(f, "output.weight") != NULL,
    };
    return 0;
}

/* The device copy of weight NAME (BYTES of DT from tensor T), uploaded on
 * first use and shared by every executable of M; NULL on failure. */
static void *upload(baton_model *m, const char *name, kdtype dt, const gguf_tensor *t,
                    const void *data, size_t bytes)
{
    for (size_t i = 0; i < m->n_uploads; i++)
        if (!strcmp(m->uploads[i].name, name))
            return m->uploads[i].ptr;
    struct upload *u = realloc(m->uploads, (m->n_uploads + 1) * sizeof(*u));
    if (!u)
        return NULL;
    m->uploads = u;
    void *d = NULL, *wide = NULL;
    const void *src = data;
    if (dt == KD_F32 && kd_of_gguf(t->type) != KD_F32) { /* widened for the GPU */
        wide = malloc(bytes);
        if (!wide || k_widen(wide, kd_of_gguf(t->type), data, bytes / sizeof(float))) {
            free(wide);
            return NULL;
        }
        src = wide;
    }
    if (m->dev->alloc(m->dev->dev, bytes, &d) || m->dev->copy(m->dev->dev, d, src, bytes, NULL)) {
        m->dev->free(m->dev->dev, d);
        free(wide);
        return NULL;
    }
    free(wide);
    snprintf(u[m->n_uploads].name, sizeof(u[m->n_uploads].name), "%s", name);
    u[m->n_uploads++].ptr = d;
    return d;
}

/* The dim of parameter NAME that tensor parallelism splits (0: rows, 1:
 * columns), or -1: NAME is whole on every rank. */
static int shard_dim(const baton_model *m, const char *name)
{
    if (m->shape.tp <= 1)
        return -1;
    if (strstr(name, ".ffn_gate") || strstr(name, ".ffn_up"))
        return 0;
    return strstr(name, ".ffn_down") ? 1 : -1;
}

/* This rank's shard of T along DIM (VAL's shape; BYTES of it in the
 * file's type), in a malloc'd buffer; NULL when memory is short.  Rows are
 * contiguous; a column shard takes the same span of every row, whole
 * quantization blocks (the load checked the FFN splits into them). */
static void *shard_of(const baton_model *m, const gguf_tensor *t, const kg_value *val, int dim,
                      size_t bytes)
{
    uint8_t *out = malloc(bytes);
    if (!out)
        return NULL;
    const uint8_t *src = t->data;
    if (dim == 0) {
        memcpy(out, src + (size_t)m->tp_rank * bytes, bytes);
        return out;
    }
    size_t rows = (size_t)val->shape[0], part = bytes / rows, whole = part * (size_t)m->shape.tp;
    for (size_t r = 0; r < rows; r++)
        memcpy(out + r * part, src + r * whole + (size_t)m->tp_rank * part, part);
    return out;
}

/* Points every parameter of X at the file's bytes (on a GPU: at their one
 * upload), checking type and shape against what the graph G expects. */
static int bind_weights(baton_model *m, kx_exec *x, const kg_graph *g, uint64_t *bytes,
                        char *err, size_t errlen)
{
    const gguf_file *f = m->file;
    *bytes = 0;
    for (size_t v = 0; v < g->n_values; v++) {
        const kg_value *val = &g->values[v];
        if (val->kind != KG_PARAM)
            continue;
        const gguf_tensor *t = tensor_of(f, val->name);
        if (!t) {
            snprintf(err, errlen, "the file has no tensor %s%s", val->name,
                     strstr(val->name, ".weight") ? "" : ".weight");
            return -1;
        }
        kdtype dt = kd_of_gguf(t->type);
        if (!dt) {
            snprintf(err, errlen, "tensor %s is %s; the kernels read F32, F16, BF16, Q8_0, "
                     "Q4_0 and Q4_1", t->name, gguf_type_name(t->type));
            return -1;
        }
        /* A sharded FFN matrix holds 1/tp of the file's rows (gate, up) or
         * of its columns (down). */
        int shard = shard_dim(m, val->name);
        size_t full = val->bytes * (shard >= 0 ? (size_t)m->shape.tp : 1);
        /* GGUF lists dims innermost first; the graph outermost first. */
        bool same = (int)t->n_dims == val->ndim;
        for (int d = 0; same && d < val->ndim; d++)
            same = t->ne[val->ndim - 1 - d] == val->shape[d] * (d == shard ? m->shape.tp : 1);
        /* A GPU reads the embedding, and f16 or bf16 matrices, widened to
         * f32: the graph says so. */
        bool widened = m->dev && val->dtype == KD_F32 && dt != KD_F32 && val->ndim == 2 &&
                       full == (size_t)t->ne[0] * (size_t)t->ne[1] * sizeof(float);
        if (!same || (!widened && (dt != val->dtype || t->nbytes != full))) {
            snprintf(err, errlen, "tensor %s is %s with %u dims [%" PRId64 ", %" PRId64 "]; the "
                     "model's shape wants %s [%" PRId64 ", %" PRId64 "]", t->name,
                     gguf_type_name(t->type), t->n_dims, t->ne[0], t->ne[1],
                     kdtype_name(val->dtype), val->ndim > 1 ? val->shape[1] : val->shape[0],
                     val->ndim > 1 ? val->shape[0] : 1);
            return -1;
        }
        int rc;
        if (m->dev) {
            /* A shard is cut in the file's type, then widened. */
            void *part = shard >= 0 ? shard_of(m, t, val, shard, t->nbytes / (size_t)m->shape.tp)
                                    : NULL;
            void *d = shard < 0 || part ? upload(m, val->name, val->dtype, t,
                                                 part ? part : t->data, val->bytes)
                                        : NULL;
            free(part);
            if (!d) {
                snprintf(err, errlen, "parameter %s: cannot put it in device memory",
                         val->name);
                return -1;
            }
            rc = kx_param_borrow(x, val->name, val->dtype, d, val->bytes);
        } else {
            rc = kx_param_borrow(x, val->name, dt, t->data, t->nbytes);
        }
        if (rc) {
            snprintf(err, errlen, "parameter %s: %s", val->name, bt_strerror(rc));
            return -1;
        }
        *bytes += m->dev ? val->bytes : t->nbytes;
    }
    return 0;
}

/* Compiles G for M's device with the worker's profile and streams and
 * binds the weights.  G is destroyed. */
static int compile(baton_model *m, kg_graph *g, const char *what, const baton_load_params *p,
                   kx_exec **out, uint64_t *bytes, char *err, size_t errlen)
{
    *out = NULL;
    char why[384];
    if (!g) {
        snprintf(err, errlen, "cannot build the %s graph (shape or memory)", what);
        return -1;
    }
    if (m->dev ? kt_cuda_check(g, why, sizeof(why)) : kt_cpu_check(g, why, sizeof(why))) {
        snprintf(err, errlen, "the %s graph cannot run on the %s: %.300s", what,
                 m->dev ? "GPU" : "CPU", why);
        kg_destroy(g);
        return -1;
    }
    /* The worker's profile is the scheduler's type (kernels/sched.h), used
     * as it is while the load lasts. */
    const ks_profile *use = ks_profile_builtin(m->dev ? "h100" : "cpu");
    if (p->profile && p->profile->memory_bandwidth_gbps > 0 && p->profile->tflops > 0)
        use = p->profile;
    kx_op_table ops;
    if (m->dev) {
        kt_cuda_ops(&ops);
        /* The communicator: the ALLREDUCE of a sharded model. */
        m->cuda = (kt_cuda_opts){m->comm, m->invariant};
        ops.user = &m->cuda;
    } else {
        kt_cpu_ops(&ops);
        ops.user = &m->cpu;
    }
    /* On a GPU a decode step is captured once per batch size as a CUDA
     * graph and replayed: a step of a small model is hundreds of short
     * kernels, whose launch cost a replay removes. */
    kx_options o = {.profile = use,
                    .device = m->dev,
                    .graphs = m->dev && strcmp(what, "decode") == 0 && m->shape.tp <= 1,
                    .n_compute = p->compute_streams ? (int)p->compute_streams : 1,
                    .n_comm = p->comm_streams ? 1 : 0};
    if (o.n_compute > KS_MAX_STREAMS - 1)
        o.n_compute = KS_MAX_STREAMS - 1;
    int rc = kx_compile(g, &ops, &o, out);
    if (rc == 0 && bind_weights(m, *out, g, bytes, err, errlen) != 0)
        rc = -1;
    else if (rc)
        snprintf(err, errlen, "compiling the %s graph: %s", what, bt_strerror(rc));
    kg_destroy(g);
    if (rc) {
        kx_destroy(*out);
        *out = NULL;
    }
    return rc ? -1 : 0;
}

/* ---- load / unload ----------------------------------------------------------------- */

static void model_unload(baton_model *m)
{
    if (!m)
        return;
    kx_destroy(m->prefill);
    kx_destroy(m->decode);
    kth_pool_destroy(m->pool);
#ifdef BATON_CUDA
    k_cuda_comm_destroy(m->comm);
#endif
    for (size_t i = 0; i < m->n_uploads; i++)
        m->dev->free(m->dev->dev, m->uploads[i].ptr);
    free(m->uploads);
    free(m->host_logits);
    free(m->host_argmax);
    if (m->dsample)
        m->dev->free(m->dev->dev, m->dsample);
    free(m->hsample);
    free(m->owner);
    pc_destroy(m->pc);
    free(m->report);
    tok_vocab_destroy(m->vocab);
    gguf_close(m->file);
    free(m);
}

/* The report for inspect and the log: what was compiled, each schedule's
 * prediction and decision (its first line) and the arena against its
 * bound (its last line).  The per-stream op lists are left out: hundreds
 * of ops say less than the counts. */
static char *make_report(const baton_model *m, const baton_load_params *p)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    const ktf_shape *s = &m->shape;
    fprintf(f, "llama: %d layers, hidden %d, %d/%d heads, FFN %d, vocab %d; KV cache %s, "
            "%d slots x %d positions; device %s, profile %s; activations %s, %d threads\n",
            s->layers, s->hidden, s->heads, s->kv_heads, s->ffn, s->vocab,
            kdtype_name(s->cache), m->slots, m->max_seq,
            p->device ? p->device : "cpu",
            p->profile && p->profile->name ? p->profile->name : "cpu",
            m->dev || !m->cpu.act_q8 ? "f32" : "8-bit", kth_pool_size(m->pool));
    if (m->invariant)
        fprintf(f, "batch invariant: every token computed the same way whatever runs beside "
                "it\n");
    if (m->pc)
        fprintf(f, "prefix cache: on, blocks of %d tokens, %llu MiB of host memory beyond the "
                "slots\n", BT_PREFIX_TOKENS, (unsigned long long)(pc_budget(m->pc) >> 20));
    else
        fprintf(f, "prefix cache: off\n");
    if (m->vocab)
        fprintf(f, "tokenizer: %d tokens; chat template %s\n", tok_vocab_size(m->vocab),
                m->chat ? "on for text prompts" : "off");
    else
        fprintf(f, "tokenizer: none (%s): token ids only\n", m->vocab_err);
    const kx_exec *xs[2] = {m->prefill, m->decode};
    for (int i = 0; i < 2; i++) {
        fprintf(f, i ? "decode (batch %d):\n" : "prefill (bucket of %d tokens):\n",
                i ? m->slots : m->chunk);
        const char *r = kx_report(xs[i]);
        const char *nl = strchr(r, '\n');
        fprintf(f, "  %.*s\n", nl ? (int)(nl - r) : (int)strlen(r), r);
        const ks_schedule *sc = kx_schedule(xs[i]);
        for (int k = 0; sc->multi && k < sc->n_streams; k++)
            fprintf(f, "  stream %d (%s): %zu ops\n", k, k < sc->n_compute ? "compute" : "comm",
                    sc->stream_n[k]);
        if (i && m->dev && m->shape.tp <= 1)
            fprintf(f, "  replayed as a CUDA graph, captured once per batch size\n");
        else if (i && m->dev)
            fprintf(f, "  launched op by op (not a CUDA graph: tensor parallel)\n");
        const char *arena = strstr(r, "arena:");
        if (arena)
            fprintf(f, "  %s", arena);
    }
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* Bytes of the sampler's scratch (dsample, hsample): params [slots, 4] f32
 * (three used; four keep what follows 8-aligned), rng [slots, 2] i64,
 * tokens [slots] i32. */
static size_t sample_bytes(const baton_model *m)
{
    return (size_t)m->slots * (4 * sizeof(float) + 2 * sizeof(int64_t) + sizeof(int32_t));
}

/* A load runs four steps, each a function below with one contract, in
 * this order: options (read and checked, nothing allocated), device
 * (which one, and whether what was asked runs on it), weights (the file,
 * the decoder's shape and this rank's share of it, the cache's geometry,
 * the tokenizer) and compile (the group, the threads, both executables
 * and the buffers around them).  Each fills in its part of the model and
 * on failure returns the status with the reason in ERR; model_load then
 * frees whatever the steps before it made. */

/* The options of a load, as read in the first step. */
typedef struct tf_options {
    const char *path;           /* the GGUF file or HF folder (borrowed from the params) */
    int max_seq;                /* positions of one session's cache */
    int chunk;                  /* prefill_chunk: tokens of one prefill run, as given */
    int32_t eos;                /* the token that ends generation; -1: the tokenizer's */
    int threads;                /* CPU threads of a kernel; 0: the worker's */
    const char *kv;             /* kv_dtype: auto, f16, q8_0 or f32 (borrowed) */
    bool act_q8;                /* activations: q8 (8-bit activations, integer products) */
    bool chat;                  /* chat_template: wrap text prompts in it */
    bool prefix_cache;          /* keep ended requests' KV for later prompts */
    bool invariant;             /* batch_invariant: the same bits whatever runs beside */
    uint64_t prefix_bytes;      /* prefix_cache_mb in bytes */
} tf_options;

/* Step 1: the options of P into *O, each read and checked against its
 * declaration in backends/catalog.c.  Nothing is allocated; O borrows
 * P's strings.  BATON_STATUS_OK, or INVALID_ARGUMENT with ERR. */
static baton_status load_options(const baton_load_params *p, tf_options *o, char *err,
                                 size_t errlen)
{
    o->path = baton_load_option(p, "path");
    if (!o->path || !*o->path) {
        snprintf(err, errlen, "option path is required (a GGUF file or a Hugging Face folder)");
        return BATON_STATUS_INVALID_ARGUMENT;
    }
    bt_opt_value max_seq, chunk, eos, threads, kv, act, chat, pcache, pmb, inv;
    if (opt_get(p, "max_seq", &max_seq, err, errlen) ||
        opt_get(p, "prefill_chunk", &chunk, err, errlen) ||
        opt_get(p, "eos", &eos, err, errlen) ||
        opt_get(p, "threads", &threads, err, errlen) ||
        opt_get(p, "kv_dtype", &kv, err, errlen) ||
        opt_get(p, "chat_template", &chat, err, errlen) ||
        opt_get(p, "activations", &act, err, errlen) ||
        opt_get(p, "prefix_cache", &pcache, err, errlen) ||
        opt_get(p, "prefix_cache_mb", &pmb, err, errlen) ||
        opt_get(p, "batch_invariant", &inv, err, errlen))
        return BATON_STATUS_INVALID_ARGUMENT;
    /* The catalog's ranges keep each number inside an int. */
    o->max_seq = (int)max_seq.i;
    o->chunk = (int)chunk.i;
    o->eos = (int32_t)eos.i;
    o->threads = (int)threads.i;
    o->kv = kv.s;
    o->act_q8 = strcmp(act.s, "q8") == 0;
    o->chat = chat.b;
    o->prefix_cache = pcache.b;
    o->prefix_bytes = (uint64_t)pmb.i << 20;
    o->invariant = inv.b;
    return BATON_STATUS_OK;
}

/* The type of the KV cache that option kv_dtype KV asks for on the CPU
 * or a GPU.  auto: f16 on the CPU (half the memory, and half the bytes a
 * decode step at a long context reads); f32 on a GPU, whose kernels take
 * no other.  q8_0 (CPU only) halves them again, for a small change in the
 * logits: an opt-in, as llama.cpp's -ctk/-ctv q8_0. */
static kdtype cache_dtype(const char *kv, bool gpu)
{
    return gpu || strcmp(kv, "f32") == 0 ? KD_F32 : strcmp(kv, "q8_0") == 0 ? KD_Q8_0 : KD_F16;
}

/* Step 2: the device P names, into M->dev (NULL: the CPU) and M->ordinal,
 * and whether the tensor parallelism and the cache type of O run there.
 * Nothing is allocated.  BATON_STATUS_OK, or INVALID_ARGUMENT (a device
 * name or option it cannot take) or FAILED_PRECONDITION (no such device
 * here, or a group it cannot join) with ERR. */
static baton_status load_device(baton_model *m, const baton_load_params *p, const tf_options *o,
                                char *err, size_t errlen)
{
    const kx_device *dev;
    int ord;
    baton_status st = bk_device_open(p->device, "the transformer", &dev, &ord, err, errlen);
    if (st != BATON_STATUS_OK)
        return st;
    if (p->tp_size > 1 && (!dev || !p->comm_id || p->tp_rank >= p->tp_size)) {
        snprintf(err, errlen, "tensor parallelism (tp %u) %s", p->tp_size,
                 !dev ? "runs on GPUs only (its all-reduce is NCCL's)"
                 : !p->comm_id ? "needs the group's communicator id, and none was given"
                               : "rank out of range");
        return BATON_STATUS_FAILED_PRECONDITION;
    }
    if (dev && (strcmp(o->kv, "f16") == 0 || strcmp(o->kv, "q8_0") == 0)) {
        snprintf(err, errlen, "option kv_dtype = '%s': the GPU kernels keep the KV cache in "
                 "f32 (use f32 or auto)", o->kv);
        return BATON_STATUS_INVALID_ARGUMENT;
    }
    m->dev = dev;
    m->ordinal = ord;
    return BATON_STATUS_OK;
}

/* Step 3: opens the file at O's path into M->file and reads from it the
 * decoder's shape (this rank's share of it under tensor parallelism), the
 * geometry of the KV cache and the tokenizer, and refuses the options the
 * model cannot take.  BATON_STATUS_OK, or FAILED_PRECONDITION (the file)
 * or INVALID_ARGUMENT (an option) with ERR; what was made stays in M. */
static baton_status load_weights(baton_model *m, const baton_load_params *p,
                                 const tf_options *o, char *err, size_t errlen)
{
    const char *path = o->path;
    char why[400];
    if (tf_weights_open(path, &m->file, why, sizeof(why)) != 0) {
        /* Its message names the path when the file cannot be opened. */
        if (strstr(why, path))
            snprintf(err, errlen, "%s", why);
        else
            snprintf(err, errlen, "%s: %s", path, why);
        return BATON_STATUS_FAILED_PRECONDITION;
    }
    m->wd = (struct wd_ctx){m->file, m->dev != NULL};
    if (read_shape(m->file, &m->wd, &m->shape, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "%s: %s", path, why);
        return BATON_STATUS_FAILED_PRECONDITION;
    }
    if (p->tp_size > 1) {
        m->tp_rank = (int)p->tp_rank;
        m->shape.tp = (int)p->tp_size;
        if (m->shape.ffn % (int)p->tp_size ||
            (m->shape.ffn / (int)p->tp_size) % 32) {
            snprintf(err, errlen, "%s: its FFN of %d does not split into %u shards of whole "
                     "32-element blocks", path, m->shape.ffn, p->tp_size);
            return BATON_STATUS_FAILED_PRECONDITION;
        }
    }
    m->max_seq = o->max_seq;
    m->chunk = o->chunk < o->max_seq ? o->chunk : o->max_seq;
    m->slots = (int)(p->max_batch ? p->max_batch : 1);
    m->row_floats = (size_t)m->shape.kv_heads * (size_t)m->shape.head_dim;
    m->shape.cache = cache_dtype(o->kv, m->dev != NULL);
    m->row_bytes = kdtype_bytes(m->shape.cache, m->row_floats);
    if (m->shape.cache == KD_Q8_0 && m->shape.head_dim % 32) {
        snprintf(err, errlen, "option kv_dtype = 'q8_0': it needs a head size that is a multiple "
                 "of 32, and %s's is %d", path, m->shape.head_dim);
        return BATON_STATUS_INVALID_ARGUMENT;
    }
    m->eos = o->eos;
    uint32_t fe;
    m->file_eos = gguf_get_u32(m->file, "tokenizer.ggml.eos_token_id", &fe) == 0 ? (int32_t)fe : -1;
    /* A file without a tokenizer we read still serves token ids; text then
     * fails with this reason. */
    if (tok_vocab_create(m->file, &m->vocab, m->vocab_err, sizeof(m->vocab_err)) != 0)
        m->vocab = NULL;
    if (m->vocab && tok_vocab_size(m->vocab) != m->shape.vocab) {
        snprintf(m->vocab_err, sizeof(m->vocab_err), "the tokenizer has %d tokens, the model "
                 "%d", tok_vocab_size(m->vocab), m->shape.vocab);
        tok_vocab_destroy(m->vocab);
        m->vocab = NULL;
    }
    m->chat = o->chat;
    gguf_get_bool(m->file, "tokenizer.ggml.add_bos_token", &m->add_bos);
    if (m->eos >= m->shape.vocab) {
        snprintf(err, errlen, "eos token %d is outside the vocabulary of %d", (int)m->eos,
                 m->shape.vocab);
        return BATON_STATUS_INVALID_ARGUMENT;
    }
    return BATON_STATUS_OK;
}

/* Step 4: makes M runnable on its device: joins the tensor-parallel group
 * (a sharded model), starts the CPU's kernel threads, compiles the
 * prefill and decode executables over the weights, moves the prefill's
 * cache onto the decode's, and allocates the slot table, the report and
 * a GPU's sampling buffers.  BATON_STATUS_OK, or FAILED_PRECONDITION (the
 * group, a graph this device cannot run) or RESOURCE_EXHAUSTED (threads,
 * memory) with ERR; what was made stays in M. */
static baton_status load_compile(baton_model *m, const baton_load_params *p,
                                 const tf_options *o, char *err, size_t errlen)
{
    const kx_device *dev = m->dev;
#ifdef BATON_CUDA
    if (p->tp_size > 1) {
        /* Joins the group: returns once every rank has joined, or fails
         * when the worker stops or the group does not form in time: the
         * group's failure, not this rank's (UNAVAILABLE: it may form
         * when tried again). */
        int rc = bk_comm_group_join(&m->comm, m->ordinal, p, err, errlen);
        if (rc)
            return rc == BT_EINVAL ? BATON_STATUS_FAILED_PRECONDITION : BATON_STATUS_UNAVAILABLE;
    }
#endif
    int n_threads = o->threads > 0 ? o->threads : p->threads > 0 ? (int)p->threads : 1;
    if (n_threads > 1)
        openblas_set_num_threads(n_threads);
    if (!dev) {
        int rc = kth_pool_create(n_threads, &m->pool);
        if (rc) {
            snprintf(err, errlen, "starting %d kernel threads: %s", n_threads, bt_strerror(rc));
            return BATON_STATUS_RESOURCE_EXHAUSTED;
        }
        m->cpu = (kt_cpu_opts){m->pool, o->act_q8, o->invariant};
    }
    m->invariant = o->invariant;
    char why[400];
    uint64_t wb = 0;
    if (compile(m, ktf_build_prefill(&m->shape, 1, m->chunk, m->max_seq), "prefill", p,
                &m->prefill, &wb, why, sizeof(why)) ||
        compile(m, ktf_build_decode(&m->shape, m->slots, m->max_seq), "decode", p, &m->decode,
                &m->weight_bytes, why, sizeof(why))) {
        snprintf(err, errlen, "%s: %s", o->path, why);
        return BATON_STATUS_FAILED_PRECONDITION;
    }
    /* The prefill's own caches are never used (each prefill runs in its
     * session's decode slot): give their memory back now. */
    if (bind_prefill_cache(m, 0) != 0) {
        snprintf(err, errlen, "%s: cannot share the KV cache between prefill and decode",
                 o->path);
        return BATON_STATUS_FAILED_PRECONDITION;
    }
    m->owner = calloc((size_t)m->slots, sizeof(*m->owner));
    /* The ranks of a group must pick the same prefixes in lockstep; they
     * recompute instead (documented). */
    if (o->prefix_cache && m->shape.tp <= 1 &&
        !(m->pc = pc_create(o->prefix_bytes, m->row_bytes * 2 * (size_t)m->shape.layers))) {
        snprintf(err, errlen, "out of memory");
        return BATON_STATUS_RESOURCE_EXHAUSTED;
    }
    m->report = make_report(m, p);
    if (dev) {
        m->host_logits = malloc((size_t)m->slots * (size_t)m->shape.vocab * sizeof(float));
        m->host_argmax = malloc((size_t)m->slots * sizeof(int32_t));
        m->hsample = malloc(sample_bytes(m));
        if (dev->alloc(dev->dev, sample_bytes(m), &m->dsample) != 0)
            m->dsample = NULL;
    }
    if (!m->owner || !m->report ||
        (dev && (!m->host_logits || !m->host_argmax || !m->hsample || !m->dsample))) {
        snprintf(err, errlen, "out of memory");
        return BATON_STATUS_RESOURCE_EXHAUSTED;
    }
    return BATON_STATUS_OK;
}

static baton_status model_load(const baton_load_params *p, baton_model **out, char *err,
                               size_t errlen)
{
    *out = NULL;
    tf_options o;
    baton_status st = load_options(p, &o, err, errlen);
    if (st != BATON_STATUS_OK)
        return st;
    baton_model *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return BATON_STATUS_RESOURCE_EXHAUSTED;
    }
    if ((st = load_device(m, p, &o, err, errlen)) != BATON_STATUS_OK ||
        (st = load_weights(m, p, &o, err, errlen)) != BATON_STATUS_OK ||
        (st = load_compile(m, p, &o, err, errlen)) != BATON_STATUS_OK)
        goto err;
    *out = m;
    return BATON_STATUS_OK;
err:
    model_unload(m);
    return st;
}

static uint64_t model_bytes(const baton_model *m)
{
    return m->weight_bytes;
}

static int model_describe(const baton_model *m, char *buf, size_t len)
{
    return snprintf(buf, len, "%s", m->report);
}

/* ---- sessions and cache slots ------------------------------------------------------ */

static baton_status session_open(baton_model *m, uint64_t key, baton_session **out, char *err,
                                 size_t errlen)
{
    (void)m, (void)key;
    tf_session *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory opening a session");
        return BATON_STATUS_RESOURCE_EXHAUSTED;
    }
    s->slot = -1;
    *out = s;
    return BATON_STATUS_OK;
}

/* Bytes of the KV of LEN positions, every layer, K and V. */
static size_t kv_bytes(const baton_model *m, int len)
{
    return (size_t)len * m->row_bytes * 2 * (size_t)m->shape.layers;
}

/* The session's KV becomes a cached prefix (prefix.h) when it can: left in
 * its slot, or, evicted before, its host copy; else its routing key is
 * reported gone. */
static void session_close(baton_model *m, baton_session *s)
{
    if (!s)
        return;
    bool kept = false;
    if (m->pc && s->ids_ok && s->len >= BT_PREFIX_TOKENS) {
        if (s->slot >= 0) {
            kept = pc_add(m->pc, s->ids, s->len, s->keys, s->n_keys, s->slot) != NULL;
        } else if (s->saved && s->saved_len == s->len) {
            kept = pc_add_host(m->pc, s->ids, s->len, s->keys, s->n_keys, s->saved,
                               kv_bytes(m, s->len)) != NULL;
            if (kept)
                s->saved = NULL;
        }
    }
    if (m->pc && !kept && s->n_keys)
        pc_keys_event(m->pc, s->keys, s->n_keys, false);
    if (s->slot >= 0)
        m->owner[s->slot] = NULL;
    free(s->saved);
    free(s->ids);
    free(s->keys);
    free(s);
}

/* Appends token T, whose KV was just written at position s->len, to S's
 * ids; out of memory only makes S uncacheable. */
static void ids_push(const baton_model *m, tf_session *s, int32_t t)
{
    if (!s->ids_ok)
        return;
    if (s->len >= s->ids_cap) {
        int cap = s->ids_cap ? s->ids_cap * 2 : 256;
        if (cap > m->max_seq)
            cap = m->max_seq;
        int32_t *v = s->len < cap ? realloc(s->ids, (size_t)cap * sizeof(*v)) : NULL;
        if (!v) {
            s->ids_ok = false;
            return;
        }
        s->ids = v;
        s->ids_cap = cap;
    }
    s->ids[s->len] = t;
}

/* Layer L's K (KV 0) or V (KV 1) cache of executable X, [slots, kv_heads,
 * max_seq, head_dim] in the cache's type. */
static uint8_t *cache(kx_exec *x, int l, int kv)
{
    char name[32];
    snprintf(name, sizeof(name), kv ? "v_cache.%d" : "k_cache.%d", l);
    return kx_handle(x, name, NULL);
}

/* Moves the prefill executable's caches onto decode slot SLOT (see
 * prefill_one).  0 or a kx status. */
static int bind_prefill_cache(baton_model *m, int slot)
{
    size_t bytes = (size_t)m->max_seq * m->row_bytes;
    for (int l = 0; l < m->shape.layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            char name[32];
            snprintf(name, sizeof(name), kv ? "v_cache.%d" : "k_cache.%d", l);
            int rc = kx_handle_borrow(m->prefill, name,
                                      cache(m->decode, l, kv) + (size_t)slot * bytes, bytes);
            if (rc)
                return rc;
        }
    return 0;
}

/* BYTES from SRC to DST, either in device memory on a GPU (the device's
 * copy tells the direction from the pointers), or on the host. */
static int mcopy(const baton_model *m, void *dst, const void *src, size_t bytes)
{
    if (!m->dev) {
        memcpy(dst, src, bytes);
        return 0;
    }
    return m->dev->copy(m->dev->dev, dst, src, bytes, NULL);
}

/* Where a sequence's KV is: decode slot SLOT, or (SLOT < 0) HOST, as an
 * evicted session or cached prefix keeps it for POSITIONS positions:
 * [layer][K, V][kv_head][positions][head_dim] in the cache's type, the
 * slot's own layout ([kv_head][max_seq][head_dim], see k_attn_prefill),
 * so each head's rows move in one copy. */
typedef struct kv_place {
    int slot;
    uint8_t *host;
    int positions;
} kv_place;

static kv_place in_slot(int slot)
{
    return (kv_place){slot, NULL, 0};
}

static kv_place in_host(void *host, int positions)
{
    return (kv_place){-1, host, positions};
}

/* Head G's rows of layer L's K (KV 0) or V (KV 1) at P. */
static uint8_t *head_rows(baton_model *m, kv_place p, int l, int kv, int g)
{
    size_t rb = kdtype_bytes(m->shape.cache, (size_t)m->shape.head_dim); /* a head's row */
    if (p.slot >= 0)
        return cache(m->decode, l, kv) + (size_t)p.slot * (size_t)m->max_seq * m->row_bytes +
               (size_t)g * (size_t)m->max_seq * rb;
    size_t lk = (size_t)l * 2 + (size_t)kv;
    return p.host + (lk * (size_t)m->shape.kv_heads + (size_t)g) * (size_t)p.positions * rb;
}

/* Copies positions [0, LEN) of every layer from SRC to DST (device copies
 * on a GPU).  0 or a status. */
static int copy_rows(baton_model *m, kv_place dst, kv_place src, int len)
{
    size_t bytes = (size_t)len * kdtype_bytes(m->shape.cache, (size_t)m->shape.head_dim);
    int rc = 0;
    for (int l = 0; l < m->shape.layers && !rc; l++)
        for (int kv = 0; kv < 2 && !rc; kv++)
            for (int g = 0; g < m->shape.kv_heads && !rc; g++)
                rc = mcopy(m, head_rows(m, dst, l, kv, g), head_rows(m, src, l, kv, g), bytes);
    return rc;
}

/* Copies positions [0, LEN) of every layer between slot SLOT and the `kv`
 * tensor of a hand-off, KV: f32 [layer][K, V][len][kv_head * head_dim] (a
 * documented format, whatever the cache), in the worker's memory (device
 * memory on a GPU); TO_KV picks the way.  Each (layer, K or V) goes
 * through two host buffers, where its heads' rows are widened, rounded or
 * quantized (f16 and q8_0 caches are the CPU's only) and moved into
 * place. */
static int copy_handoff(baton_model *m, int slot, void *kv_data, int len, bool to_kv)
{
    int nkv = m->shape.kv_heads;
    kdtype cdt = m->shape.cache;
    size_t hd = (size_t)m->shape.head_dim, rb = kdtype_bytes(cdt, hd); /* bytes of a head's row */
    size_t block = (size_t)len * rb, flat = (size_t)len * m->row_floats * sizeof(float);
    uint8_t *tmp = malloc(block ? block : 1);
    float *stage = malloc(flat ? flat : 1);
    int rc = tmp && stage ? 0 : BT_ENOMEM;
    for (int l = 0; l < m->shape.layers && !rc; l++)
        for (int kv = 0; kv < 2 && !rc; kv++) {
            uint8_t *h = (uint8_t *)kv_data + ((size_t)l * 2 + (size_t)kv) * flat;
            if (!to_kv)
                rc = mcopy(m, stage, h, flat);
            for (int g = 0; g < nkv && !rc; g++) {
                uint8_t *cg = head_rows(m, in_slot(slot), l, kv, g);
                if (to_kv)
                    rc = mcopy(m, tmp, cg, block);
                for (int t = 0; t < len && !rc; t++) {
                    float *st = stage + (size_t)t * m->row_floats + (size_t)g * hd;
                    uint8_t *tt = tmp + (size_t)t * rb;
                    rc = to_kv          ? k_widen(st, cdt, tt, hd)
                         : cdt == KD_Q8_0 ? k_quantize(tt, cdt, st, hd)
                                          : k_cast(tt, cdt, st, KD_F32, hd);
                }
                if (!to_kv && !rc)
                    rc = mcopy(m, cg, tmp, block);
            }
            if (to_kv && !rc)
                rc = mcopy(m, h, stage, flat);
        }
    free(tmp);
    free(stage);
    return rc;
}

/* Frees the slot of resident cached prefix E: its KV moves to host memory
 * when the budget takes it, else it is dropped. */
static void evict_entry(baton_model *m, pc_entry *e)
{
    size_t bytes = kv_bytes(m, e->len);
    void *host = bytes <= pc_budget(m->pc) ? malloc(bytes) : NULL;
    if (host && copy_rows(m, in_host(host, e->len), in_slot(e->slot), e->len) == 0 &&
        pc_move_to_host(m->pc, e, host, bytes))
        return;
    free(host);
    pc_remove(m->pc, e, true);
}

/* Copies positions [0, LEN) of cached prefix E into decode slot DST. */
static int copy_prefix(baton_model *m, int dst, const pc_entry *e, int len)
{
    return copy_rows(m, in_slot(dst),
                     e->slot >= 0 ? in_slot(e->slot) : in_host(e->host, e->len), len);
}

/* Moves resident cached prefix E out of its slot, which a session is to
 * take: into the highest slot nobody uses, else into the slot of the
 * cached prefix least recently used (which is evicted), else E itself is
 * evicted. */
static void clear_slot(baton_model *m, pc_entry *e)
{
    int dst = -1;
    for (int k = m->slots - 1; k >= 0 && dst < 0; k--)
        if (!m->owner[k] && !pc_in_slot(m->pc, k))
            dst = k;
    if (dst < 0) {
        e->pinned = true;
        pc_entry *old = pc_oldest_resident(m->pc);
        e->pinned = false;
        if (old && old->used < e->used) {
            dst = old->slot;
            evict_entry(m, old);
        }
    }
    if (dst >= 0 && copy_prefix(m, dst, e, e->len) == 0)
        e->slot = dst;
    else
        evict_entry(m, e);
}

/* Gives S a decode slot: the lowest one no session holds (a cached prefix
 * there moves out of the way, clear_slot); else that of the least recently
 * used session not in the current batch, whose KV moves to host memory.
 * (A decode step computes only the rows of its items, whichever slots they
 * hold.)  Returns 0, or -1 when every slot is held
 * by the current batch (cannot happen: a batch has at most `slots` items)
 * or memory is short. */
static int acquire_slot(baton_model *m, tf_session *s)
{
    if (s->slot >= 0)
        return 0;
    int pick = -1;
    for (int k = 0; k < m->slots && pick < 0; k++) {
        pc_entry *e = !m->owner[k] && m->pc ? pc_in_slot(m->pc, k) : NULL;
        if (!m->owner[k] && !(e && e->pinned)) /* a pinned one is being read */
            pick = k;
    }
    pc_entry *there = pick >= 0 && m->pc ? pc_in_slot(m->pc, pick) : NULL;
    if (there)
        clear_slot(m, there);
    bool free_slot = pick >= 0;
    /* None free: the oldest session outside this batch; ties keep the
     * lower slot.  (A slot without a session holds a prefix being read.) */
    for (int k = 0; !free_slot && k < m->slots; k++) {
        tf_session *c = m->owner[k];
        if (c && c->batch_id != m->batch_id && (pick < 0 || c->used < m->owner[pick]->used))
            pick = k;
    }
    if (pick < 0)
        return -1;
    tf_session *o = m->owner[pick];
    if (o) {
        void *save = o->len ? malloc((size_t)o->len * m->row_bytes * 2 *
                                     (size_t)m->shape.layers) : NULL;
        if (o->len && !save)
            return -1;
        /* A copy that failed (a device error) must not become a cached
         * prefix later. */
        if (save && copy_rows(m, in_host(save, o->len), in_slot(pick), o->len) != 0)
            o->ids_ok = false;
        free(o->saved);
        o->saved = save;
        o->saved_len = o->len;
        o->slot = -1;
    }
    m->owner[pick] = s;
    s->slot = pick;
    if (s->saved) {
        if (copy_rows(m, in_slot(pick), in_host(s->saved, s->saved_len), s->saved_len) != 0)
            s->ids_ok = false;
        free(s->saved);
        s->saved = NULL;
    }
    return 0;
}

/* ---- execution --------------------------------------------------------------------- */

/* Whether token T ends generation: option eos when set, else any of the
 * tokenizer's end-of-generation tokens (EOS, <|im_end|>, ...), else the
 * file's EOS. */
static bool is_end(const baton_model *m, int32_t t)
{
    if (m->eos >= 0)
        return t == m->eos;
    if (m->vocab)
        return tok_is_eog(m->vocab, t);
    return t == m->file_eos;
}

/* The UTF-8 text token T adds to S's output, into BUF (CAP bytes): its
 * bytes after those held back from earlier tokens, up to the last complete
 * character (the rest is held back in turn).  An end-of-generation token
 * adds nothing but what was held back.  Returns the length, or -1 when the
 * tokenizer refuses T. */
static int text_of(const baton_model *m, tf_session *s, int32_t t, char *buf, size_t cap)
{
    memcpy(buf, s->carry, (size_t)s->n_carry);
    int n = 0;
    if (!is_end(m, t)) {
        n = tok_piece(m->vocab, t, buf + s->n_carry, cap - (size_t)s->n_carry);
        if (n < 0 || (size_t)n > cap - (size_t)s->n_carry)
            return -1;
    }
    size_t all = (size_t)s->n_carry + (size_t)n;
    size_t done = is_end(m, t) ? all : tok_utf8_complete(buf, all);
    /* A byte sequence that can never complete is sent as it is rather
     * than held forever. */
    if (all - done >= sizeof(s->carry))
        done = all;
    s->n_carry = (int)(all - done);
    memcpy(s->carry, buf + done, (size_t)s->n_carry);
    return (int)done;
}

static bool wants_output(const baton_item *it, const char *name)
{
    for (uint32_t o = 0; o < it->n_outputs; o++)
        if (strcmp(it->outputs[o].name, name) == 0)
            return true;
    return false;
}

/* Whether the GPU's sampler takes IT's parameters: it keeps at most
 * K_SAMPLE_MAX_K candidates, so a top_k of 0 ("all") or more is sampled on
 * the host. */
static bool device_samples(const baton_item *it)
{
    const baton_sampling *sp = &it->sampling;
    return sp->temperature > 0 && sp->top_k >= 1 && sp->top_k <= K_SAMPLE_MAX_K;
}

/* GPU: the tokens of rows [0, ROWS) of a step into TOK.  Greedy rows take
 * the device's argmax, sampled rows the device's sampler
 * (k_cuda_sample_rows, the same rule and RNG as k_sample), and only rows
 * the device sampler cannot take are sampled on the host.  LOGITS and
 * ARGMAX are the executable's outputs in device memory; ITEM[r] is row
 * r's item (NULL: unused) and POS[r] its RNG counter.  The logits come to
 * the host (m->host_logits, *HOST set) only when a row needs them there:
 * host sampling, or a `logits` output.  0, BT_EDEVICE, or BT_ENOMEM when
 * host sampling had no memory. */
static int gpu_tokens(baton_model *m, const float *logits, const int32_t *argmax, int rows,
                      baton_item *const *item, const int *pos, int32_t *tok, bool *host)
{
    size_t V = (size_t)m->shape.vocab, S = (size_t)m->slots;
    (void)S; /* used only in builds with CUDA */
    bool any = false;
    *host = false;
    for (int r = 0; r < rows; r++) {
        if (!item[r])
            continue;
        *host |= wants_output(item[r], "logits") ||
                 (item[r]->sampling.temperature > 0 && !device_samples(item[r]));
        any |= device_samples(item[r]);
    }
    if ((*host && mcopy(m, m->host_logits, logits, (size_t)rows * V * sizeof(float))) ||
        mcopy(m, tok, argmax, (size_t)rows * sizeof(int32_t)))
        return BT_EDEVICE;
#ifdef BATON_CUDA
    if (any) {
        float *params = m->hsample;
        int64_t *rng = (int64_t *)(params + 4 * S);
        int32_t *out = (int32_t *)(rng + 2 * S);
        for (int r = 0; r < rows; r++) {
            const baton_sampling *sp = item[r] ? &item[r]->sampling : NULL;
            bool dev = item[r] && device_samples(item[r]);
            params[3 * r] = dev ? sp->temperature : 0.0f;
            params[3 * r + 1] = dev ? (float)sp->top_k : 1.0f;
            params[3 * r + 2] = dev && sp->top_p > 0 ? sp->top_p : 1.0f;
            rng[2 * r] = dev ? (int64_t)sp->seed : 0;
            rng[2 * r + 1] = dev ? pos[r] : 0;
        }
        float *dparams = m->dsample;
        int64_t *drng = (int64_t *)(dparams + 4 * S);
        int32_t *dout = (int32_t *)(drng + 2 * S);
        if (mcopy(m, dparams, params, (size_t)rows * 3 * sizeof(float)) ||
            mcopy(m, drng, rng, (size_t)rows * 2 * sizeof(int64_t)) ||
            k_cuda_sample_rows(dout, logits, dparams, drng, rows, (int)V, NULL, NULL) ||
            mcopy(m, out, dout, (size_t)rows * sizeof(int32_t)))
            return BT_EDEVICE;
        for (int r = 0; r < rows; r++)
            if (item[r] && device_samples(item[r]))
                tok[r] = out[r];
    }
#else
    (void)any;
#endif
    for (int r = 0; r < rows; r++) {
        if (!item[r] || item[r]->sampling.temperature <= 0 || device_samples(item[r]))
            continue;
        const baton_sampling *sp = &item[r]->sampling;
        int rc = k_sample(&tok[r], m->host_logits + (size_t)r * V, 1, (int)V, sp->temperature,
                          (int)sp->top_k, sp->top_p > 0 ? sp->top_p : 1.0f, sp->seed,
                          (uint64_t)pos[r]);
        if (rc)
            return rc;
    }
    return 0;
}

/* The next token from LOGITS [vocab] under the item's sampling parameters
 * into *T; the RNG counter is the token's position, so a request samples
 * alike however its steps were batched.  0, or BT_ENOMEM. */
static int pick_token(const baton_model *m, const baton_item *it, const float *logits,
                      int32_t argmax, int position, int32_t *t)
{
    const baton_sampling *sp = &it->sampling;
    if (sp->temperature <= 0) {
        *t = argmax;
        return 0;
    }
    return k_sample(t, logits, 1, m->shape.vocab, sp->temperature, (int)sp->top_k,
                    sp->top_p > 0 ? sp->top_p : 1.0f, sp->seed, (uint64_t)position);
}

/* Counts tokens for the request's usage (baton_ctx.count_tokens; a ctx of
 * an older worker or a test may have none). */
static void count_tokens(baton_ctx *ctx, baton_item *it, size_t prompt, uint32_t generated)
{
    if (ctx->count_tokens)
        ctx->count_tokens(ctx, it, prompt > UINT32_MAX ? UINT32_MAX : (uint32_t)prompt,
                          generated);
}

/* Sets ITEM's outputs for the new token T (LOGITS its row; KV the cache a
 * prefill hands off, or NULL).  Returns 0, or -1 after failing the item. */
static int emit(baton_model *m, baton_ctx *ctx, baton_item *it, int32_t t, const float *logits,
                baton_tensor *kv)
{
    for (uint32_t o = 0; o < it->n_outputs; o++) {
        const char *name = it->outputs[o].name;
        baton_tensor *out = NULL;
        int rc = 0;
        if (strcmp(name, "kv") == 0) {
            if (!kv) {
                char msg[192];
                snprintf(msg, sizeof(msg), "node '%s': output 'kv' is made by prefill only",
                         it->node_name);
                ctx->fail(ctx, it, BATON_STATUS_INVALID_ARGUMENT, msg);
                return -1;
            }
            out = kv;
        } else if (strcmp(name, "token") == 0) {
            int64_t one = 1;
            if ((out = ctx->alloc(ctx, it, BATON_DTYPE_I32, 1, &one)))
                rc = ctx->write(ctx, it, out, 0, &t, sizeof(t));
        } else if (strcmp(name, "logits") == 0) {
            int64_t v = m->shape.vocab;
            /* No logits when nothing ran (an end token fed back): zeros,
             * not whatever the pool held. */
            float *zeros = logits ? NULL : calloc((size_t)v, sizeof(float));
            if ((out = ctx->alloc(ctx, it, BATON_DTYPE_F32, 1, &v)))
                rc = logits || zeros ? ctx->write(ctx, it, out, 0, logits ? logits : zeros,
                                                  (uint64_t)v * sizeof(float))
                                     : -1;
            free(zeros);
        } else if (strcmp(name, "text") == 0) {
            char piece[256], msg[384];
            int len = m->vocab ? text_of(m, it->session, t, piece, sizeof(piece)) : -1;
            if (len < 0) {
                snprintf(msg, sizeof(msg), "node '%s': no text for token %d (%s)", it->node_name,
                         (int)t, m->vocab ? "the tokenizer refused it" : m->vocab_err);
                ctx->fail(ctx, it, BATON_STATUS_FAILED_PRECONDITION, msg);
                return -1;
            }
            int64_t n = len;
            if ((out = ctx->alloc(ctx, it, BATON_DTYPE_U8, 1, &n)))
                rc = ctx->write(ctx, it, out, 0, piece, (uint64_t)len);
        } else {
            char msg[192];
            snprintf(msg, sizeof(msg), "node '%s': unknown output '%s' (the transformer "
                     "produces token, text, logits and kv)", it->node_name, name);
            ctx->fail(ctx, it, BATON_STATUS_INVALID_ARGUMENT, msg);
            return -1;
        }
        if (out && rc != 0) {
            ctx->fail(ctx, it, BATON_STATUS_INTERNAL, "cannot write an output to the pool");
            return -1;
        }
        if (!out || ctx->set_output(ctx, it, o, out) != 0) {
            ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "the worker's pool is full");
            return -1;
        }
    }
    return 0;
}

/* The token ids of a text prompt (LEN bytes of UTF-8): wrapped in the chat
 * template when the model has one, option chat_template is on and the
 * input is not raw (a completion's prompt), a BOS first when the file asks
 * for one.  Malloc'd; NULL with *N = 0 after failing the item. */
static int32_t *encode_text(baton_model *m, baton_ctx *ctx, baton_item *it, const char *text,
                            size_t len, size_t *n)
{
    char msg[256];
    /* In the chat template only the template's markers are control tokens:
     * a user who types <|im_end|> gets that text, not the token.  Raw text
     * is encoded the same way, special-token parsing off. */
    bool chat = m->chat && !it->inputs[0].raw;
    int need = chat ? tok_chat_encode(m->vocab, NULL, text, len, NULL, 0) : BT_ENOTEMPLATE;
    if (need == BT_ENOTEMPLATE) {
        chat = false;
        need = tok_encode(m->vocab, text, len, false, NULL, 0);
    } else if (need < 0) {
        snprintf(msg, sizeof(msg), "node '%s': the chat template: %s", it->node_name,
                 bt_strerror(need));
        ctx->fail(ctx, it, BATON_STATUS_INTERNAL, msg);
        return NULL;
    }
    int32_t bos = m->add_bos ? tok_bos(m->vocab) : -1;
    int32_t *ids = need >= 0 ? malloc(((size_t)need + 1) * sizeof(*ids)) : NULL;
    if (!ids) {
        snprintf(msg, sizeof(msg), "node '%s': cannot encode the prompt: %s", it->node_name,
                 need < 0 ? bt_strerror(need) : "out of memory");
        ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, msg);
        return NULL;
    }
    size_t at = 0;
    if (bos >= 0)
        ids[at++] = bos;
    if (chat)
        tok_chat_encode(m->vocab, NULL, text, len, ids + at, (size_t)need);
    else
        tok_encode(m->vocab, text, len, false, ids + at, (size_t)need);
    *n = at + (size_t)need;
    if (bos >= 0 && *n > 1 && ids[1] == bos)
        memmove(ids, ids + 1, --*n * sizeof(*ids));  /* the template began with it */
    return ids;
}

/* The token ids of a conversation (a request's messages: BYTES[0, LEN) as
 * baton_chat_next reads them), and when LAST is not NULL one more user
 * turn of LAST_LEN bytes after it, rendered with the model's chat template
 * whatever option chat_template says, a BOS first when the file asks for
 * one.  Malloc'd; NULL after failing the item. */
static int32_t *encode_conv(baton_model *m, baton_ctx *ctx, baton_item *it,
                            const uint8_t *bytes, size_t len, const char *last,
                            size_t last_len, size_t *n)
{
    char msg[256];
    size_t cap = 0, count = 0;
    uint64_t at = 0;
    baton_chat_turn turn;
    tok_turn *turns = NULL;
    int32_t *ids = NULL;
    int rc;
    /* A turn read but not stored (out of memory) leaves rc at 1. */
    while ((rc = baton_chat_next(bytes, len, &at, &turn)) == 1) {
        if (BT_RESERVE(turns, count, cap, 8))
            break;
        turns[count++] = (tok_turn){turn.role, turn.role_len, turn.content, turn.content_len};
    }
    if (rc == 0 && last) {
        if (BT_RESERVE(turns, count, cap, 8))
            rc = 1;
        else
            turns[count++] = (tok_turn){"user", 4, last, last_len};
    }
    if (rc == 1) {
        ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    int need = rc < 0 ? BT_EINVAL : tok_conv_encode(m->vocab, turns, count, NULL, 0);
    if (need < 0) {
        snprintf(msg, sizeof(msg), "node '%s', input '%s': %s", it->node_name,
                 it->inputs[0].name,
                 need == BT_ENOTEMPLATE ? "the model has no ChatML chat template, so it cannot "
                                          "take messages: send the prompt as text"
                                        : "the messages are malformed (no turn, or a role "
                                          "other than system, user and assistant)");
        ctx->fail(ctx, it, BATON_STATUS_INVALID_ARGUMENT, msg);
        goto out;
    }
    int32_t bos = m->add_bos ? tok_bos(m->vocab) : -1;
    if (!(ids = malloc(((size_t)need + 1) * sizeof(*ids)))) {
        ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    size_t first = bos >= 0 ? 1 : 0;
    ids[0] = bos;
    tok_conv_encode(m->vocab, turns, count, ids + first, (size_t)need);
    *n = first + (size_t)need;
    if (bos >= 0 && *n > 1 && ids[1] == bos)
        memmove(ids, ids + 1, --*n * sizeof(*ids));  /* the template began with it */
out:
    free(turns);
    return ids;
}

/* Reads the token ids of ITEM's first input into a malloc'd array (text
 * or a conversation too when TEXT_OK); fails the item and returns NULL on a
 * bad input. */
static int32_t *read_ids(baton_model *m, baton_ctx *ctx, baton_item *it, bool text_ok,
                         size_t *n)
{
    char msg[384];
    if (it->n_inputs < 1) {
        snprintf(msg, sizeof(msg), "node '%s' has no input (want token ids)", it->node_name);
        goto bad;
    }
    const baton_tensor *t = &it->inputs[0].tensor;
    size_t count = t->dtype == BATON_DTYPE_I32 ? t->nbytes / 4
                   : t->dtype == BATON_DTYPE_I64 ? t->nbytes / 8 : 0;
    if (it->inputs[0].chat && !(t->dtype == BATON_DTYPE_U8 && text_ok && m->vocab)) {
        snprintf(msg, sizeof(msg), "node '%s', input '%s': messages, which %s", it->node_name,
                 it->inputs[0].name, !text_ok ? "a decode step does not take (want a token id)"
                                              : "a model without a tokenizer cannot take");
        goto bad;
    }
    if (t->dtype == BATON_DTYPE_U8 && text_ok && m->vocab && (t->nbytes > 0 || it->inputs[0].chat)) {
        /* The prompt comes to the host whatever memory it is in: the
         * tokenizer runs here. */
        char *text = malloc(t->nbytes);
        if (!text || ctx->read(ctx, it, t, 0, text, t->nbytes) != 0) {
            if (!text)
                ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            free(text);
            return NULL;
        }
        int32_t *ids = it->inputs[0].chat
                           ? encode_conv(m, ctx, it, (const uint8_t *)text, t->nbytes, NULL, 0,
                                         n)
                           : encode_text(m, ctx, it, text, t->nbytes, n);
        free(text);
        if (ids && *n == 0) {
            free(ids);
            snprintf(msg, sizeof(msg), "node '%s', input '%s': the text gives no tokens",
                     it->node_name, it->inputs[0].name);
            goto bad;
        }
        return ids;
    }
    if (t->dtype != BATON_DTYPE_I32 && t->dtype != BATON_DTYPE_I64) {
        snprintf(msg, sizeof(msg), "node '%s', input '%s': %s; want %s", it->node_name,
                 it->inputs[0].name,
                 t->dtype == BATON_DTYPE_U8 ? (t->nbytes ? "UTF-8 text" : "empty text")
                                            : "a tensor of another dtype",
                 !text_ok ? "a token id (I32 or I64)"
                 : m->vocab ? "UTF-8 text (U8) or token ids (I32 or I64)"
                            : "token ids (I32 or I64): the model has no tokenizer");
        goto bad;
    }
    if (count == 0) {
        snprintf(msg, sizeof(msg), "node '%s', input '%s': no tokens", it->node_name,
                 it->inputs[0].name);
        goto bad;
    }
    int32_t *ids = malloc(count * sizeof(*ids));
    void *raw = malloc(t->nbytes);
    if (!ids || !raw) {
        free(ids);
        free(raw);
        ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    if (ctx->read(ctx, it, t, 0, raw, t->nbytes) != 0) {
        free(ids);
        free(raw);
        return NULL;
    }
    for (size_t i = 0; i < count; i++) {
        int64_t v = t->dtype == BATON_DTYPE_I32 ? ((const int32_t *)raw)[i]
                                                : ((const int64_t *)raw)[i];
        if (v < 0 || v >= m->shape.vocab) {
            snprintf(msg, sizeof(msg), "node '%s', input '%s': token id %" PRId64 " at index "
                     "%zu is outside the vocabulary [0, %d)", it->node_name, it->inputs[0].name,
                     v, i, m->shape.vocab);
            free(ids);
            free(raw);
            goto bad;
        }
        ids[i] = (int32_t)v;
    }
    free(raw);
    *n = count;
    return ids;
bad:
    ctx->fail(ctx, it, BATON_STATUS_INVALID_ARGUMENT, msg);
    return NULL;
}

/* The token ids of a prefill with two inputs: a conversation (the
 * request's messages, or empty when it has none) and the text of one more
 * user turn after it, rendered together with the chat template.  This is
 * a voice chat's prompt: the system prompt and earlier turns the client
 * sent, then what was heard, which only the graph knows.  Malloc'd; NULL
 * after failing the item. */
static int32_t *read_turn_ids(baton_model *m, baton_ctx *ctx, baton_item *it, size_t *n)
{
    const baton_input *conv = &it->inputs[0], *turn = &it->inputs[1];
    uint64_t a = conv->tensor.nbytes, b = turn->tensor.nbytes;
    char msg[384];
    if (!m->vocab) {
        snprintf(msg, sizeof(msg), "node '%s': a conversation and a turn (two inputs), which "
                 "a model without a tokenizer cannot take", it->node_name);
        goto bad;
    }
    if (conv->tensor.dtype != BATON_DTYPE_U8 || (!conv->chat && a > 0)) {
        snprintf(msg, sizeof(msg), "node '%s', input '%s': want the request's messages (or "
                 "nothing), the turns before the text of input '%s'", it->node_name, conv->name,
                 turn->name);
        goto bad;
    }
    if (turn->tensor.dtype != BATON_DTYPE_U8 || turn->chat || b > UINT32_MAX) {
        snprintf(msg, sizeof(msg), "node '%s', input '%s': want UTF-8 text (U8) of at most 4 "
                 "GiB, the last user turn after the messages of input '%s'", it->node_name,
                 turn->name, conv->name);
        goto bad;
    }
    /* Both come to the host: the tokenizer runs here. */
    uint8_t *bytes = malloc(a + b + 1);
    if (!bytes) {
        ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    int32_t *ids = NULL;
    if ((a == 0 || ctx->read(ctx, it, &conv->tensor, 0, bytes, a) == 0) &&
        (b == 0 || ctx->read(ctx, it, &turn->tensor, 0, bytes + a, b) == 0))
        ids = encode_conv(m, ctx, it, bytes, a, (const char *)bytes + a, b, n);
    free(bytes);
    return ids;
bad:
    ctx->fail(ctx, it, BATON_STATUS_INVALID_ARGUMENT, msg);
    return NULL;
}

/* Fails IT with the error of X's last run, which returned RC. */
static void fail_run(const kx_exec *x, int rc, baton_ctx *ctx, baton_item *it)
{
    int st = 0, op = kx_op_error(x, &st);
    char msg[256];
    /* What went wrong: the status of the op when the run failed in one
     * (BT_EOP), else RC itself (the device, or sampling on the host). */
    int cause = rc == BT_EOP ? st : rc;
    /* Memory running out is the world's doing, not a fault of the model:
     * the request may be tried again, and the worker serves on. */
    if (cause == BT_ENOMEM) {
        snprintf(msg, sizeof(msg), "node '%s': out of memory%s", it->node_name,
                 op >= 0 ? " in the graph" : " sampling a token");
        ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, msg);
        return;
    }
    snprintf(msg, sizeof(msg), "node '%s': the graph failed at op %d: %s (status %d)",
             it->node_name, op, bt_strerror(rc), st);
    ctx->fail(ctx, it, BATON_STATUS_INTERNAL, msg);
}

/* Takes in the cache a prefill on another worker handed off (input `kv`,
 * F32 [layers, 2, positions, row]) for IT's session, which has none yet:
 * into a decode slot, by a device copy on a GPU (the tensor may be a
 * peer's memory opened by CUDA IPC, read in place).  Returns 0, or -1
 * after failing the item. */
static int import_kv(baton_model *m, baton_ctx *ctx, baton_item *it)
{
    tf_session *s = it->session;
    const baton_tensor *kv = NULL;
    for (uint32_t k = 0; k < it->n_inputs; k++)
        if (strcmp(it->inputs[k].name, "kv") == 0)
            kv = &it->inputs[k].tensor;
    char msg[256];
    if (!kv) {
        snprintf(msg, sizeof(msg), "node '%s': decode before any prefill of the request (and "
                 "no input 'kv' handing over a prefill's cache)", it->node_name);
        ctx->fail(ctx, it, BATON_STATUS_FAILED_PRECONDITION, msg);
        return -1;
    }
    if (kv->dtype != BATON_DTYPE_F32 || kv->ndim != 4 || kv->dims[0] != m->shape.layers ||
        kv->dims[1] != 2 || kv->dims[2] < 1 || kv->dims[2] >= m->max_seq ||
        kv->dims[3] != (int64_t)m->row_floats) {
        snprintf(msg, sizeof(msg), "node '%s', input 'kv': want F32 [%d, 2, positions < %d, "
                 "%zu], the cache of a prefill of this model", it->node_name, m->shape.layers,
                 m->max_seq, m->row_floats);
        ctx->fail(ctx, it, BATON_STATUS_INVALID_ARGUMENT, msg);
        return -1;
    }
    if (acquire_slot(m, s) != 0) {
        ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory moving a KV cache");
        return -1;
    }
    if (copy_handoff(m, s->slot, kv->data, (int)kv->dims[2], false)) {
        ctx->fail(ctx, it, BATON_STATUS_INTERNAL, "cannot copy the handed-off KV cache");
        return -1;
    }
    s->len = (int)kv->dims[2];
    s->ids_ok = false; /* whose tokens these are, the cache does not say */
    return 0;
}

/* The routing key of IT's prompt (its first input's bytes in blocks,
 * common/prefix.h) into S, reported stored: the conductor may now send
 * prompts that begin the same way here.  Nothing on a short input, or when
 * memory is short (a missed route, nothing worse). */
static void session_keys(baton_model *m, baton_ctx *ctx, baton_item *it, tf_session *s)
{
    const baton_tensor *t = &it->inputs[0].tensor;
    size_t nb = t->nbytes / BT_PREFIX_BYTES;
    if (!nb)
        return;
    uint8_t *buf = malloc(nb * BT_PREFIX_BYTES);
    uint64_t *k = malloc(nb * sizeof(*k));
    if (buf && k && ctx->read(ctx, it, t, 0, buf, nb * BT_PREFIX_BYTES) == 0) {
        bt_prefix_hashes(buf, nb * BT_PREFIX_BYTES, BT_PREFIX_BYTES, k, nb);
        s->keys = k;
        s->n_keys = nb;
        pc_keys_event(m->pc, k, nb, true);
        k = NULL;
    }
    free(buf);
    free(k);
}

/* Places S, about to prefill the N tokens IDS, in a decode slot holding
 * the longest cached prefix of them there is, and returns how many
 * positions that prefix fills (0: none, or no prefix cache): a free slot
 * that holds nearly all of it is taken over (nothing copied); else the
 * session gets a slot and the prefix is copied in.  -1 when no slot could
 * be had. */
static int place_prompt(baton_model *m, tf_session *s, const int32_t *ids, int n)
{
    int len = 0;
    pc_entry *e = m->pc ? pc_match(m->pc, ids, n, &len) : NULL;
    if (e && e->slot >= 0 && s->slot < 0 && len >= e->len - BT_PREFIX_TOKENS) {
        m->owner[e->slot] = s;
        s->slot = e->slot;
        pc_remove(m->pc, e, false);
        return len;
    }
    if (e)
        e->pinned = true; /* not the slot acquire_slot frees, nor the host copy it drops */
    int rc = acquire_slot(m, s);
    if (e)
        e->pinned = false;
    if (rc != 0 && e && e->slot >= 0 && s->slot < 0) {
        /* No other slot (one slot, or all held): the entry's own slot
         * already holds the shared positions; the rest of it is lost. */
        m->owner[e->slot] = s;
        s->slot = e->slot;
        pc_remove(m->pc, e, true);
        return len;
    }
    if (rc != 0)
        return -1;
    /* A failed copy costs the reuse, not the request: the prompt runs
     * whole. */
    return e && copy_prefix(m, s->slot, e, len) == 0 ? len : 0;
}

static void prefill_one(baton_model *m, baton_ctx *ctx, baton_item *it)
{
    tf_session *s = it->session;
    size_t n;
    int32_t *ids = it->n_inputs == 2 ? read_turn_ids(m, ctx, it, &n)
                                     : read_ids(m, ctx, it, true, &n);
    if (!ids)
        return;
    char msg[256];
    if (n >= (size_t)m->max_seq) {
        snprintf(msg, sizeof(msg), "node '%s': a prompt of %zu tokens does not fit max_seq %d "
                 "(prompt and output share it)", it->node_name, n, m->max_seq);
        ctx->fail(ctx, it, BATON_STATUS_INVALID_ARGUMENT, msg);
        goto out;
    }
    /* A new prompt starts the session over, in the decode slot it will
     * decode in: the prefill executable's caches are moved onto that slot,
     * so the prompt's K and V are written where decoding reads them. */
    s->len = 0;
    s->n_carry = 0;
    free(s->saved);
    s->saved = NULL;
    s->ids_ok = false;
    if (m->pc && s->n_keys)
        pc_keys_event(m->pc, s->keys, s->n_keys, false);
    free(s->keys);
    s->keys = NULL;
    s->n_keys = 0;
    m->batch_id++;
    s->batch_id = m->batch_id;
    s->used = ++m->clock;
    int start = place_prompt(m, s, ids, (int)n);
    if (start < 0) {
        ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory moving a KV cache");
        goto out;
    }
    if (bind_prefill_cache(m, s->slot) != 0) {
        ctx->fail(ctx, it, BATON_STATUS_INTERNAL, "cannot place the prefill's KV cache");
        goto out;
    }
    int32_t *pos = malloc((size_t)m->chunk * sizeof(*pos));
    if (!pos) {
        ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t at = (size_t)start; at < n; at += (size_t)m->chunk) {
        int e = (int)(n - at < (size_t)m->chunk ? n - at : (size_t)m->chunk);
        int32_t last = e - 1;
        for (int i = 0; i < e; i++)
            pos[i] = (int32_t)at + i;
        /* A rank of a tensor-parallel group runs every chunk, cancelled or
         * not: stopping early on one rank only would leave the others
         * waiting in a collective. */
        baton_status c = m->shape.tp > 1 ? BATON_STATUS_OK : ctx->cancelled(ctx, it);
        if (c != BATON_STATUS_OK) {
            ctx->fail(ctx, it, c, "cancelled during prefill");
            free(pos);
            goto out;
        }
        kx_extent_set(m->prefill, e);
        kx_input_bind(m->prefill, 0, ids + at, (size_t)e * 4);
        kx_input_bind(m->prefill, 1, pos, (size_t)e * 4);
        kx_input_bind(m->prefill, 2, &last, 4);
        int rc = kx_run(m->prefill);
        if (rc) {
            fail_run(m->prefill, rc, ctx, it);
            free(pos);
            goto out;
        }
    }
    free(pos);
    baton_tensor *kv = NULL;
    if (wants_output(it, "kv")) {
        /* Disaggregated serving: the cache leaves as a tensor, and a decode
         * elsewhere takes it in; this session keeps nothing. */
        int64_t dims[4] = {m->shape.layers, 2, (int64_t)n, (int64_t)m->row_floats};
        if (!(kv = ctx->alloc(ctx, it, BATON_DTYPE_F32, 4, dims)))
            goto out;
        int rc = copy_handoff(m, s->slot, kv->data, (int)n, true);
        m->owner[s->slot] = NULL;
        s->slot = -1;
        s->len = 0;
        if (rc) {
            ctx->fail(ctx, it, BATON_STATUS_INTERNAL, "cannot copy the KV cache out");
            goto out;
        }
    } else {
        s->len = (int)n;
        if (m->pc) {
            /* The ids, for the prefix this session leaves when it ends. */
            free(s->ids);
            s->ids_cap = (int)n;
            s->ids_ok = (s->ids = malloc(n * sizeof(*ids))) != NULL;
            if (s->ids_ok)
                memcpy(s->ids, ids, n * sizeof(*ids));
            else
                s->ids_cap = 0;
            session_keys(m, ctx, it, s);
        }
    }
    if (start > 0 && ctx->count_cached)
        ctx->count_cached(ctx, it, (uint32_t)start);
    const float *logits = kx_output(m->prefill, 0, NULL);
    int32_t t;
    if (m->dev) {
        bool host;
        int p = (int)n;
        int rc = gpu_tokens(m, logits, kx_output(m->prefill, 1, NULL), 1, &it, &p, &t, &host);
        if (rc) {
            fail_run(m->prefill, rc, ctx, it);
            goto out;
        }
        logits = host ? m->host_logits : NULL;
    } else {
        int rc = pick_token(m, it, logits, *(const int32_t *)kx_output(m->prefill, 1, NULL),
                            (int)n, &t);
        if (rc) {
            fail_run(m->prefill, rc, ctx, it);
            goto out;
        }
    }
    if (emit(m, ctx, it, t, logits, kv) == 0)
        count_tokens(ctx, it, n, 1);
out:
    free(ids);
}

static void decode_batch(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    int B = m->slots;
    /* Row r of the step is the r-th item that takes part, in the cache
     * slot slots[r]: only those rows are computed, whichever slots their
     * sessions hold. */
    int32_t *in = calloc((size_t)B * 4, sizeof(*in));
    int *row = calloc(n + 1, sizeof(*row));
    bool *taken = calloc((size_t)B, sizeof(*taken));
    if (!in || !row || !taken) {
        for (size_t i = 0; i < n; i++)
            ctx->fail(ctx, items[i], BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    int32_t *tokens = in, *positions = in + B, *lens = in + 2 * B, *slots = in + 3 * B;
    int rows = 0;
    for (size_t i = 0; i < n; i++)
        row[i] = -1;  /* not in the step */
    m->batch_id++;
    for (size_t i = 0; i < n; i++)
        ((tf_session *)items[i]->session)->batch_id = m->batch_id;
    for (size_t i = 0; i < n; i++) {
        baton_item *it = items[i];
        tf_session *s = it->session;
        size_t cnt;
        int32_t *ids = read_ids(m, ctx, it, false, &cnt);
        if (!ids)
            continue;
        int32_t tok = ids[0];
        free(ids);
        char msg[192];
        if (cnt != 1) {
            snprintf(msg, sizeof(msg), "node '%s': decode takes one token, not %zu",
                     it->node_name, cnt);
            ctx->fail(ctx, it, BATON_STATUS_INVALID_ARGUMENT, msg);
            continue;
        }
        if (is_end(m, tok)) {
            /* The token before ended generation (a prefill's EOS reaches
             * the loop's first iteration): nothing more to say. */
            emit(m, ctx, it, tok, NULL, NULL);
            ctx->finish(ctx, it);
            continue;
        }
        if (s->len == 0 && import_kv(m, ctx, it) != 0)
            continue;
        if (s->len >= m->max_seq) {
            snprintf(msg, sizeof(msg), "node '%s': the KV cache is full (max_seq %d)",
                     it->node_name, m->max_seq);
            ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, msg);
            continue;
        }
        if (s->slot >= 0 && taken[s->slot]) {
            snprintf(msg, sizeof(msg), "node '%s': two decode steps of one request in one batch",
                     it->node_name);
            ctx->fail(ctx, it, BATON_STATUS_INTERNAL, msg);
            continue;
        }
        if (acquire_slot(m, s) != 0) {
            ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory moving a KV cache");
            continue;
        }
        s->used = ++m->clock;
        taken[s->slot] = true;
        tokens[rows] = tok;
        positions[rows] = s->len;
        lens[rows] = s->len;
        slots[rows] = s->slot;
        row[i] = rows++;
    }
    if (!rows)
        goto out;
    kx_extent_set(m->decode, rows);
    kx_input_bind(m->decode, 0, tokens, (size_t)B * 4);
    kx_input_bind(m->decode, 1, positions, (size_t)B * 4);
    kx_input_bind(m->decode, 2, lens, (size_t)B * 4);
    kx_input_bind(m->decode, 3, slots, (size_t)B * 4);
    int rc = kx_run(m->decode);
    const float *logits = kx_output(m->decode, 0, NULL);
    const int32_t *argmax = kx_output(m->decode, 1, NULL);
    if (m->dev && !rc) {
        /* The rows that ran: tokens chosen on the device. */
        baton_item **row_item = calloc((size_t)B, sizeof(*row_item));
        int *row_pos = calloc((size_t)B, sizeof(*row_pos));
        bool host = false;
        for (size_t i = 0; row_item && row_pos && i < n; i++)
            if (row[i] >= 0) {
                tf_session *s = items[i]->session;
                row_item[row[i]] = items[i];
                row_pos[row[i]] = s->len + 1;
            }
        if (!row_item || !row_pos)
            rc = BT_ENOMEM;
        else
            rc = gpu_tokens(m, logits, argmax, rows, row_item, row_pos, m->host_argmax, &host);
        free(row_item);
        free(row_pos);
        logits = host ? m->host_logits : NULL;
        argmax = m->host_argmax;
    }
    for (size_t i = 0; i < n; i++) {
        if (row[i] < 0)
            continue;
        baton_item *it = items[i];
        tf_session *s = it->session;
        int r = row[i];
        if (rc) {
            fail_run(m->decode, rc, ctx, it);
            continue;
        }
        ids_push(m, s, tokens[r]);
        s->len++;
        const float *lrow = logits ? logits + (size_t)r * (size_t)m->shape.vocab : NULL;
        int32_t t = argmax[r];
        int prc = m->dev ? 0 : pick_token(m, it, lrow, argmax[r], s->len, &t);
        if (prc) {
            fail_run(m->decode, prc, ctx, it);
            continue;
        }
        if (emit(m, ctx, it, t, lrow, NULL) != 0)
            continue;
        count_tokens(ctx, it, 0, 1);
        if (is_end(m, t) || s->len >= m->max_seq)
            ctx->finish(ctx, it);
    }
out:
    free(in);
    free(row);
    free(taken);
}

static void execute(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    const char *mode = n ? items[0]->mode : "";
    bool prefill = strcmp(mode, "prefill") == 0;
    if (!prefill && strcmp(mode, "decode") != 0) {
        for (size_t i = 0; i < n; i++) {
            char msg[192];
            snprintf(msg, sizeof(msg), "node '%s': mode '%s' (the transformer has prefill and "
                     "decode)", items[i]->node_name, mode);
            ctx->fail(ctx, items[i], BATON_STATUS_INVALID_ARGUMENT, msg);
        }
        return;
    }
    if (prefill) {
        for (size_t i = 0; i < n; i++)
            prefill_one(m, ctx, items[i]);
    } else {
        decode_batch(m, ctx, items, n);
    }
}

/* A step outlived its limit: the group's communicator is aborted, which
 * ends every rank's collective; the worker exits next. */
static void model_abort(baton_model *m)
{
    bk_comm_group_abort(m->comm);
}

static int model_broken(baton_model *m)
{
    return bk_comm_group_failed(m->comm);
}

static int cache_report(baton_model *m, baton_cache_report *out)
{
    if (!m->pc)
        return 0;
    pc_stats st;
    pc_stats_get(m->pc, &st);
    bool events = pc_events(m->pc, &out->stored, &out->n_stored, &out->removed,
                            &out->n_removed);
    bool changed = events || memcmp(&st, &m->reported, sizeof(st)) != 0;
    m->reported = st;
    out->hits = st.hits;
    out->misses = st.misses;
    out->hit_tokens = st.hit_tokens;
    out->evictions = st.evictions;
    out->cached_bytes = st.bytes;
    out->entries = st.entries;
    return changed;
}

static const baton_backend transformer_backend = {
    .abi_version = BATON_BACKEND_ABI_VERSION,
    .name = TF_NAME,
    .model_load = model_load,
    .model_unload = model_unload,
    .model_bytes = model_bytes,
    .session_open = session_open,
    .session_close = session_close,
    .execute = execute,
    .model_describe = model_describe,
    .cache_report = cache_report,
    .model_abort = model_abort,
    .model_broken = model_broken,
};

const baton_backend *bk_transformer_backend(void)
{
    return &transformer_backend;
}
