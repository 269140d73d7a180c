/* Builds Whisper's graphs (backends/whisper/wmodel.h).  Flops count a
 * multiply-add as two; bytes count each operand once.
 *
 * A linear layer is a MATMUL and an ADD of its bias row (ADD broadcasts);
 * a convolution is IM2COL, then the same.  The fused projections of the
 * model file (Q, K and V in one matrix; the cross-attention's K and V) are
 * separate parameters here, which wengine.c points at row ranges of the
 * fused matrix, so no op has to split a product's columns. */
#include "backends/whisper/wmodel.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"

typedef struct builder {
    kg_graph *g;
    const wm_shape *s;
    int fail;
} builder;

kdtype wm_param_dtype(const wm_shape *s, const char *name, int64_t rows, int64_t cols)
{
    /* The encoder's matrices (the first convolution among them, whose rows
     * of 240 values are no whole blocks) and cross-attention's K and V
     * multiply the audio positions. */
    size_t n = strlen(name);
    bool matrix = n > 2 && !strcmp(name + n - 2, ".w");
    bool audio = !strncmp(name, "e.", 2) || (n > 5 && (!strcmp(name + n - 5, ".xk.w") ||
                                                      !strcmp(name + n - 5, ".xv.w")));
    if (matrix && audio) {
        bool fits = s->audio == KD_BF16 && cols > 0 && k_matmul_bf16_packed_bytes((int)rows, (int)cols) ==
                                    (size_t)(rows * cols) * sizeof(uint16_t);
        return s->audio == KD_BF16 && !fits ? KD_F32 : s->audio;
    }
    return matrix || !strcmp(name, "d.emb") ? s->weight : KD_F32;
}

/* A value of up to four dims; DYN: its outermost dim is the dynamic one. */
static int val(builder *b, const char *name, kg_kind kind, kdtype dt, bool dyn, int ndim,
               const int64_t *shape)
{
    int v = b->fail ? -1 : kg_value_add(b->g, name, kind, dt, ndim, shape);
    if (v < 0 || (dyn && kg_value_set_dynamic(b->g, v)))
        b->fail = 1;
    return v < 0 ? 0 : v;
}

static int param(builder *b, const char *name, int64_t d0, int64_t d1)
{
    int64_t sh[2] = {d0, d1};
    return val(b, name, KG_PARAM, wm_param_dtype(b->s, name, d0, d1), false, d1 ? 2 : 1, sh);
}

/* An f32 intermediate. */
static int act(builder *b, const char *name, bool dyn, int ndim, int64_t d0, int64_t d1, int64_t d2)
{
    int64_t sh[3] = {d0, d1, d2};
    return val(b, name, KG_INTER, KD_F32, dyn, ndim, sh);
}

static void op(builder *b, kop k, const int *in, int n_in, int out, double flops,
               const int64_t *attr, int n_attr)
{
    if (!b->fail && kg_op_add_streamed(b->g, k, in, n_in, out, attr, n_attr, flops) < 0)
        b->fail = 1;
}

/* A value of KIND shaped like REF but with N columns. */
static int like_kind(builder *b, const char *name, kg_kind kind, int ref, int64_t n)
{
    const kg_value *r = &b->g->values[ref];
    int64_t d[4] = {r->shape[0], r->shape[1], r->shape[2], r->shape[3]};
    d[r->ndim - 1] = n;
    return val(b, name, kind, KD_F32, r->dynamic, r->ndim, d);
}

static int like(builder *b, const char *name, int ref, int64_t n)
{
    return like_kind(b, name, KG_INTER, ref, n);
}

static int64_t rows_of(builder *b, int v)
{
    const kg_value *r = &b->g->values[v];
    int64_t n = 1;
    for (int d = 0; d + 1 < r->ndim; d++)
        n *= r->shape[d];
    return n;
}

/* X W^T + bias, for the parameters PREFIX.w [N, K] and PREFIX.b [N]; the
 * result into OUT when it is not negative (a handle), else a new value. */
static int linear_to(builder *b, const char *prefix, int x, int64_t n, int64_t k, int out)
{
    char nm[KG_NAME_LEN], nb[KG_NAME_LEN];
    snprintf(nm, sizeof(nm), "%s.w", prefix);
    snprintf(nb, sizeof(nb), "%s.b", prefix);
    int w = param(b, nm, n, k), bias = param(b, nb, n, 0);
    snprintf(nm, sizeof(nm), "%s.mm", prefix);
    int y = like(b, nm, x, n);
    int in[2] = {x, w};
    double rows = (double)rows_of(b, x);
    /* bf16 weights are packed for oneDNN (wengine.c packs them). */
    int64_t layout = b->g->values[w].dtype == KD_BF16 ? K_MM_PACKED : K_MM_PLAIN;
    op(b, KOP_MATMUL, in, 2, y, 2.0 * rows * (double)n * (double)k, &layout, 1);
    if (out < 0) {
        snprintf(nm, sizeof(nm), "%s.y", prefix);
        out = like(b, nm, x, n);
    }
    in[0] = y, in[1] = bias;
    op(b, KOP_ADD, in, 2, out, rows * (double)n, NULL, 0);
    return out;
}

static int linear(builder *b, const char *prefix, int x, int64_t n, int64_t k)
{
    return linear_to(b, prefix, x, n, k, -1);
}

/* Layer norm with parameters PREFIX.g and PREFIX.b. */
static int norm(builder *b, const char *prefix, int x)
{
    char ng[KG_NAME_LEN], nb[KG_NAME_LEN], ny[KG_NAME_LEN];
    int64_t d = b->s->d_model;
    snprintf(ng, sizeof(ng), "%s.g", prefix);
    snprintf(nb, sizeof(nb), "%s.b", prefix);
    snprintf(ny, sizeof(ny), "%s.y", prefix);
    int in[3] = {x, param(b, ng, d, 0), param(b, nb, d, 0)};
    int y = like(b, ny, x, d);
    int64_t eps = kg_attr_f(b->s->eps);
    op(b, KOP_LAYERNORM, in, 3, y, 8.0 * (double)rows_of(b, x) * (double)d, &eps, 1);
    return y;
}

static int add(builder *b, const char *name, int x, int y)
{
    int in[2] = {x, y};
    int z = like(b, name, x, b->g->values[x].shape[b->g->values[x].ndim - 1]);
    op(b, KOP_ADD, in, 2, z, (double)rows_of(b, x) * b->s->d_model, NULL, 0);
    return z;
}

static int gelu(builder *b, const char *name, int x)
{
    int64_t mode = K_GELU_ERF;
    const kg_value *v = &b->g->values[x];
    int y = like(b, name, x, v->shape[v->ndim - 1]);
    op(b, KOP_GELU, &x, 1, y, 8.0 * (double)rows_of(b, x) * (double)v->shape[v->ndim - 1], &mode,
       1);
    return y;
}

/* The feed-forward block of layer PREFIX, residual included. */
static int ffn(builder *b, const char *prefix, const char *ln, int x)
{
    char nm[KG_NAME_LEN];
    int64_t d = b->s->d_model, f = b->s->ffn;
    snprintf(nm, sizeof(nm), "%s.%s", prefix, ln);
    int h = norm(b, nm, x);
    snprintf(nm, sizeof(nm), "%s.fc1", prefix);
    h = linear(b, nm, h, f, d);
    snprintf(nm, sizeof(nm), "%s.gelu", prefix);
    h = gelu(b, nm, h);
    snprintf(nm, sizeof(nm), "%s.fc2", prefix);
    h = linear(b, nm, h, d, f);
    snprintf(nm, sizeof(nm), "%s.ffn_out", prefix);
    return add(b, nm, x, h);
}

static bool shape_ok(const wm_shape *s)
{
    return s && s->d_model > 0 && s->heads > 0 && s->d_model % s->heads == 0 &&
           s->enc_layers > 0 && s->dec_layers > 0 && s->ffn > 0 && s->n_mels > 0 &&
           s->n_frames > 2 && s->n_audio == (s->n_frames + 1) / 2 && s->n_text > 0 &&
           s->vocab > 0 && (s->weight == KD_F32 || s->weight == KD_Q8_0) &&
           (s->audio == KD_F32 || s->audio == KD_BF16) &&
           (s->cross == KD_F32 || s->cross == KD_F16);
}

static kg_graph *finish(builder *b)
{
    if (!b->fail)
        return b->g;
    kg_destroy(b->g);
    return NULL;
}

kg_graph *wm_build_encoder(const wm_shape *s, int batch)
{
    if (!shape_ok(s) || batch < 1)
        return NULL;
    builder b = {kg_create(), s, 0};
    if (!b.g)
        return NULL;
    int64_t B = batch, D = s->d_model, M = s->n_mels, F = s->n_frames, A = s->n_audio;
    int64_t hd = D / s->heads;
    char nm[KG_NAME_LEN];
    int64_t msh[3] = {B, F, M};
    int mel = val(&b, "mel", KG_INPUT, KD_F32, true, 3, msh);
    /* conv1: kernel 3, stride 1, padding 1; conv2: kernel 3, stride 2. */
    int64_t c1[3] = {3, 1, 1}, c2[3] = {3, 2, 1};
    int col1 = act(&b, "e.conv1.col", true, 3, B, F, M * 3);
    op(&b, KOP_IM2COL, &mel, 1, col1, 0, c1, 3);
    int x = gelu(&b, "e.conv1.gelu", linear(&b, "e.conv1", col1, D, M * 3));
    int col2 = act(&b, "e.conv2.col", true, 3, B, A, D * 3);
    op(&b, KOP_IM2COL, &x, 1, col2, 0, c2, 3);
    x = gelu(&b, "e.conv2.gelu", linear(&b, "e.conv2", col2, D, D * 3));
    x = add(&b, "e.x0", x, param(&b, "e.pos", A, D));
    /* With bf16 matrices, the attention's products are bf16 too. */
    int64_t heads[4] = {s->heads, hd, A, s->audio == KD_BF16 ? K_ATTN_BF16 : K_ATTN_F32};
    for (int l = 0; l < s->enc_layers && !b.fail; l++) {
        char p[16];
        snprintf(p, sizeof(p), "e.%d", l);
#define NAME(fmt) (snprintf(nm, sizeof(nm), "%s." fmt, p), nm)
        int h = norm(&b, NAME("ln1"), x);
        int q = linear(&b, NAME("q"), h, D, D);
        int k = linear(&b, NAME("k"), h, D, D);
        int v = linear(&b, NAME("v"), h, D, D);
        int in[3] = {q, k, v};
        int at = like(&b, NAME("attn"), q, D);
        op(&b, KOP_ATTN, in, 3, at, 4.0 * (double)B * A * A * D, heads, 4);
        int o = linear(&b, NAME("o"), at, D, D);
        x = add(&b, NAME("attn_out"), x, o);
        x = ffn(&b, p, "ln2", x);
#undef NAME
    }
    /* The final norm writes the graph's output. */
    int64_t eps = kg_attr_f(s->eps);
    int in[3] = {x, param(&b, "e.ln.g", D, 0), param(&b, "e.ln.b", D, 0)};
    int y = like_kind(&b, "audio", KG_OUTPUT, x, D);
    op(&b, KOP_LAYERNORM, in, 3, y, 8.0 * (double)B * A * D, &eps, 1);
    return finish(&b);
}

/* The decoder, over N token rows of BATCH sequences: PROMPT, one sequence
 * of up to SEQ tokens (ATTN_PREFILL, and the cross K/V computed from its
 * audio states); else a step, one token per sequence (ATTN_DECODE). */
static kg_graph *decoder(const wm_shape *s, int batch, int seq, int ctx, bool prompt)
{
    if (!shape_ok(s) || batch < 1 || seq < 1 || ctx < seq || ctx > s->n_text)
        return NULL;
    builder b = {kg_create(), s, 0};
    if (!b.g)
        return NULL;
    int64_t N = (int64_t)batch * seq, D = s->d_model, A = s->n_audio, H = s->heads;
    int64_t hd = D / H;
    char nm[KG_NAME_LEN];
    /* The prompt gathers two rows for the logits: the start of transcript's
     * (the probability of no speech is read there) and the last token's. */
    int64_t n1[1] = {N}, b1[1] = {prompt ? 2 : batch}, ash[3] = {1, A, D};
    int tokens = val(&b, "tokens", KG_INPUT, KD_I32, true, 1, n1);
    int pos = val(&b, "positions", KG_INPUT, KD_I32, true, 1, n1);
    int third = val(&b, prompt ? "last_row" : "seq_lens", KG_INPUT, KD_I32, !prompt, 1, b1);
    int audio = prompt ? val(&b, "audio", KG_INPUT, KD_F32, false, 3, ash) : -1;
    int emb = param(&b, "d.emb", s->vocab, D), pemb = param(&b, "d.pos", s->n_text, D);
    int te = act(&b, "d.tok", true, 2, N, D, 0), pe = act(&b, "d.posemb", true, 2, N, D, 0);
    int in[6] = {emb, tokens};
    op(&b, KOP_EMBED, in, 2, te, 0, NULL, 0);
    in[0] = pemb, in[1] = pos;
    op(&b, KOP_EMBED, in, 2, pe, 0, NULL, 0);
    int x = add(&b, "d.x0", te, pe);
    int64_t self_heads[3] = {H, H, hd}, cross_heads[3] = {H, hd, prompt ? 0 : 1};
    for (int l = 0; l < s->dec_layers && !b.fail; l++) {
        char p[16];
        snprintf(p, sizeof(p), "d.%d", l);
#define NAME(fmt) (snprintf(nm, sizeof(nm), "%s." fmt, p), nm)
#define HNAME(fmt) (snprintf(nm, sizeof(nm), fmt, l), nm)
        int64_t csh[4] = {batch, H, ctx, hd}, xsh[3] = {batch, A, D};
        int kc = val(&b, HNAME(WM_SELF_K), KG_HANDLE, KD_F32, false, 4, csh);
        int vc = val(&b, HNAME(WM_SELF_V), KG_HANDLE, KD_F32, false, 4, csh);
        int xk = val(&b, HNAME(WM_CROSS_K), KG_HANDLE, s->cross, false, 3, xsh);
        int xv = val(&b, HNAME(WM_CROSS_V), KG_HANDLE, s->cross, false, 3, xsh);
        /* Self-attention: causal, over the sequence's cache. */
        int h = norm(&b, NAME("ln1"), x);
        int q = linear(&b, NAME("q"), h, D, D);
        int k = linear(&b, NAME("k"), h, D, D);
        int v = linear(&b, NAME("v"), h, D, D);
        int at = like(&b, NAME("self"), q, D);
        int ain[6] = {q, k, v, kc, vc, prompt ? pos : third}, aout[3] = {at, kc, vc};
        double span = prompt ? (seq + 1) / 2.0 : (double)ctx;
        if (!b.fail &&
            kg_op_add(b.g, prompt ? KOP_ATTN_PREFILL : KOP_ATTN_DECODE, ain, 6, aout, 3,
                      self_heads, 3, 4.0 * (double)N * span * D, -1) < 0)
            b.fail = 1;
        x = add(&b, NAME("self_out"), x, linear(&b, NAME("o"), at, D, D));
        /* Cross-attention: the prompt computes K and V from the audio
         * states into the handles, which every step then reads. */
        h = norm(&b, NAME("ln2"), x);
        q = linear(&b, NAME("xq"), h, D, D);
        if (prompt && s->cross == KD_F32) {
            linear_to(&b, NAME("xk"), audio, D, D, xk);
            linear_to(&b, NAME("xv"), audio, D, D, xv);
        } else if (prompt) {
            /* Computed in f32, kept in f16. */
            int yk = linear(&b, NAME("xk"), audio, D, D), yv = linear(&b, NAME("xv"), audio, D, D);
            op(&b, KOP_CAST, &yk, 1, xk, (double)A * D, NULL, 0);
            op(&b, KOP_CAST, &yv, 1, xv, (double)A * D, NULL, 0);
        }
        in[0] = q, in[1] = xk, in[2] = xv;
        int ca = like(&b, NAME("cross"), q, D);
        op(&b, KOP_ATTN, in, 3, ca, 4.0 * (double)N * A * D, cross_heads, 3);
        x = add(&b, NAME("cross_out"), x, linear(&b, NAME("xo"), ca, D, D));
        x = ffn(&b, p, "ln3", x);
#undef NAME
#undef HNAME
    }
    int last = x;
    if (prompt) {
        /* Only two rows' logits are wanted (last_row: the start of
         * transcript's, then the last token's): gathered as an embedding
         * lookup with the states as the table. */
        last = act(&b, "d.last", false, 2, 2, D, 0);
        in[0] = x, in[1] = third;
        op(&b, KOP_EMBED, in, 2, last, 0, NULL, 0);
    }
    int y = norm(&b, "d.ln", last);
    int logits = like_kind(&b, "logits", KG_OUTPUT, y, s->vocab);
    in[0] = y, in[1] = emb;
    op(&b, KOP_MATMUL, in, 2, logits, 2.0 * (double)(prompt ? 2 : batch) * s->vocab * D, NULL,
       0);
    return finish(&b);
}

kg_graph *wm_build_prompt(const wm_shape *s, int seq, int ctx)
{
    return decoder(s, 1, seq, ctx, true);
}

kg_graph *wm_build_step(const wm_shape *s, int batch, int ctx)
{
    return decoder(s, batch, 1, ctx, false);
}
