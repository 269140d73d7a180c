/* Builds Llama-family decoder graphs (backends/transformer/model.h).  Shapes
 * are exact; flops count a multiply-add as two; bytes count every input and
 * output once, which is what a roofline wants from a kernel that streams its
 * operands. */
#include "backends/transformer/model.h"

#include <stdbool.h>
#include <stdio.h>

#include "kernels/kernels.h"

ktf_shape ktf_shape_smollm2_135m(void)
{
    return (ktf_shape){576, 30, 9, 3, 64, 1536, 49152, KD_F32, KD_F16, KD_F16, 1e-5f, 100000.0f,
                       K_ROPE_NORMAL};
}

typedef struct builder {
    kg_graph *g;
    const ktf_shape *s;
    int fail;
    bool dynamic;      /* token-row values are bucketed (batch 1 prefill) */
} builder;

static int val(builder *b, const char *name, kg_kind kind, kdtype dt, int ndim, int64_t d0,
               int64_t d1, int64_t d2, int64_t d3)
{
    int64_t shape[4] = {d0, d1, d2, d3};
    int v = kg_value_add(b->g, name, kind, dt, ndim, shape);
    if (v < 0)
        b->fail = 1;
    return v < 0 ? 0 : v;
}

/* A weight matrix [D0, D1]: `weight`, unless the shape's hook says
 * otherwise for NAME. */
static int wval(builder *b, const char *name, int64_t d0, int64_t d1)
{
    kdtype dt = b->s->weight_dtype ? b->s->weight_dtype(b->s->weight_user, name) : b->s->weight;
    return val(b, name, KG_PARAM, dt, 2, d0, d1, 0, 0);
}

/* An activation of ROWS token rows (dynamic in a bucketed graph). */
static int act(builder *b, const char *name, int64_t rows, int64_t cols)
{
    int v = val(b, name, KG_INTER, b->s->act, 2, rows, cols, 0, 0);
    if (b->dynamic && !b->fail && kg_value_set_dynamic(b->g, v))
        b->fail = 1;
    return v;
}

static void op_attr(builder *b, kop k, const int *in, int n_in, int out, double flops,
                    const int64_t *attr, int n_attr)
{
    if (!b->fail && kg_op_add_streamed(b->g, k, in, n_in, out, attr, n_attr, flops) < 0)
        b->fail = 1;
}

static void op(builder *b, kop k, const int *in, int n_in, int out, double flops)
{
    op_attr(b, k, in, n_in, out, flops, NULL, 0);
}

/* Y[rows, n] = X[rows, k] W^T with W [n, k]. */
static int matmul(builder *b, const char *name, int x, int w, int64_t rows, int64_t n,
                  int64_t k)
{
    int y = act(b, name, rows, n);
    int in[2] = {x, w};
    op(b, KOP_MATMUL, in, 2, y, 2.0 * (double)rows * (double)n * (double)k);
    return y;
}

/* The decoder body shared by prefill (ATTN_PREFILL over SEQ tokens per
 * sequence) and decode (ATTN_DECODE, one token against CTX positions). */
static kg_graph *build(const ktf_shape *s, int batch, int seq, int ctx, bool prefill)
{
    int tp = s && s->tp > 1 ? s->tp : 1;
    if (!s || batch < 1 || seq < 1 || ctx < seq || s->heads % s->kv_heads || s->ffn % tp)
        return NULL;
    /* The dynamic dim is the token rows: the tokens of a batch-1 prefill,
     * or the sequences of a decode step (a step of fewer sequences than
     * compiled runs only those rows, each on the cache slot its input
     * names). */
    builder b = {kg_create(), s, 0, !prefill || batch == 1};
    if (!b.g)
        return NULL;
    int64_t N = (int64_t)batch * seq, H = s->hidden, Q = (int64_t)s->heads * s->head_dim,
            KV = (int64_t)s->kv_heads * s->head_dim, F = s->ffn / tp, V = s->vocab;
    char nm[KG_NAME_LEN];
    int tokens = val(&b, "tokens", KG_INPUT, KD_I32, 1, N, 0, 0, 0);
    int pos = val(&b, "positions", KG_INPUT, KD_I32, 1, N, 0, 0, 0);
    if (b.dynamic && !b.fail && (kg_value_set_dynamic(b.g, tokens) || kg_value_set_dynamic(b.g, pos)))
        b.fail = 1;
    int64_t eps[1] = {kg_attr_f(s->rms_eps)};
    int64_t rope_q[4] = {s->heads, s->head_dim, kg_attr_f(s->rope_theta), s->rope_mode};
    int64_t rope_k[4] = {s->kv_heads, s->head_dim, kg_attr_f(s->rope_theta), s->rope_mode};
    int64_t heads[3] = {s->heads, s->kv_heads, s->head_dim};
    int third = val(&b, prefill ? "last_rows" : "seq_lens", KG_INPUT, KD_I32, 1, batch, 0, 0, 0);
    if (!prefill && !b.fail && kg_value_set_dynamic(b.g, third))
        b.fail = 1;
    /* Decode: the cache slot of each row, so that a step runs only the
     * sequences that take part, in any slots. */
    int slots = prefill ? -1 : val(&b, "slots", KG_INPUT, KD_I32, 1, batch, 0, 0, 0);
    if (!prefill && !b.fail && kg_value_set_dynamic(b.g, slots))
        b.fail = 1;
    int embd = wval(&b, "token_embd.weight", V, H);
    int x = act(&b, "x.embed", N, H);
    int in2[2] = {embd, tokens};
    op(&b, KOP_EMBED, in2, 2, x, 0);
    for (int l = 0; l < s->layers && !b.fail; l++) {
#define NAME(fmt) (snprintf(nm, sizeof(nm), fmt, l), nm)
        int an = val(&b, NAME("blk.%d.attn_norm"), KG_PARAM, KD_F32, 1, H, 0, 0, 0);
        int wq = wval(&b, NAME("blk.%d.attn_q"), Q, H);
        int wk = wval(&b, NAME("blk.%d.attn_k"), KV, H);
        int wv = wval(&b, NAME("blk.%d.attn_v"), KV, H);
        int wo = wval(&b, NAME("blk.%d.attn_output"), H, Q);
        int fn = val(&b, NAME("blk.%d.ffn_norm"), KG_PARAM, KD_F32, 1, H, 0, 0, 0);
        int wg = wval(&b, NAME("blk.%d.ffn_gate"), F, H);
        int wu = wval(&b, NAME("blk.%d.ffn_up"), F, H);
        int wd = wval(&b, NAME("blk.%d.ffn_down"), H, F);
        /* [sequence][KV head][position][dim]: see k_attn_prefill. */
        int kc = val(&b, NAME("k_cache.%d"), KG_HANDLE, s->cache, 4, batch, s->kv_heads, ctx, s->head_dim);
        int vc = val(&b, NAME("v_cache.%d"), KG_HANDLE, s->cache, 4, batch, s->kv_heads, ctx, s->head_dim);

        int xn = act(&b, NAME("blk.%d.xn"), N, H);
        int t[5] = {x, an};
        op_attr(&b, KOP_RMSNORM, t, 2, xn, 4.0 * (double)(N * H), eps, 1);
        int q = matmul(&b, NAME("blk.%d.q"), xn, wq, N, Q, H);
        int k = matmul(&b, NAME("blk.%d.k"), xn, wk, N, KV, H);
        int v = matmul(&b, NAME("blk.%d.v"), xn, wv, N, KV, H);
        int qr = act(&b, NAME("blk.%d.q_rope"), N, Q);
        t[0] = q, t[1] = pos;
        op_attr(&b, KOP_ROPE, t, 2, qr, 6.0 * (double)(N * Q), rope_q, 4);
        int kr = act(&b, NAME("blk.%d.k_rope"), N, KV);
        t[0] = k;
        op_attr(&b, KOP_ROPE, t, 2, kr, 6.0 * (double)(N * KV), rope_k, 4);
        int at = act(&b, NAME("blk.%d.attn"), N, Q);
        /* Attention writes this step's K and V into the caches and reads the
         * cached positions: the caches are both inputs and outputs. */
        int ain[7] = {qr, kr, v, kc, vc, prefill ? pos : third, slots};
        int aout[3] = {at, kc, vc};
        double span = prefill ? (seq + 1) / 2.0 : (double)ctx;  /* keys per query, causal mean */
        double aflops = 4.0 * (double)N * s->heads * span * s->head_dim;
        double cache_rw = 2.0 * (double)batch * (prefill ? seq : ctx) *
                          (double)kdtype_bytes(s->cache, (size_t)KV);
        double abytes = (double)(b.g->values[qr].bytes + b.g->values[kr].bytes +
                                 b.g->values[v].bytes + b.g->values[at].bytes) + cache_rw;
        if (!b.fail && kg_op_add(b.g, prefill ? KOP_ATTN_PREFILL : KOP_ATTN_DECODE, ain,
                                 prefill ? 6 : 7, aout, 3, heads, 3, aflops, abytes) < 0)
            b.fail = 1;
        int o = matmul(&b, NAME("blk.%d.o"), at, wo, N, H, Q);
        int x2 = act(&b, NAME("blk.%d.x_attn"), N, H);
        t[0] = x, t[1] = o;
        op(&b, KOP_ADD, t, 2, x2, (double)(N * H));
        int xn2 = act(&b, NAME("blk.%d.xn_ffn"), N, H);
        t[0] = x2, t[1] = fn;
        op_attr(&b, KOP_RMSNORM, t, 2, xn2, 4.0 * (double)(N * H), eps, 1);
        int gt = matmul(&b, NAME("blk.%d.gate"), xn2, wg, N, F, H);
        int up = matmul(&b, NAME("blk.%d.up"), xn2, wu, N, F, H);
        int sg = act(&b, NAME("blk.%d.silu"), N, F);
        t[0] = gt;
        op(&b, KOP_SILU, t, 1, sg, 4.0 * (double)(N * F));
        int m = act(&b, NAME("blk.%d.swiglu"), N, F);
        t[0] = sg, t[1] = up;
        op(&b, KOP_MUL, t, 2, m, (double)(N * F));
        int d = matmul(&b, NAME("blk.%d.down"), m, wd, N, H, F);
        if (tp > 1) {
            /* Each rank's down product covers its share of the FFN rows:
             * their sum over ranks is the whole product. */
            int ds = act(&b, NAME("blk.%d.down_sum"), N, H);
            int64_t ranks[1] = {tp};
            t[0] = d;
            op_attr(&b, KOP_ALLREDUCE, t, 1, ds, (double)(N * H), ranks, 1);
            d = ds;
        }
        int x3 = act(&b, NAME("blk.%d.x_out"), N, H);
        t[0] = x2, t[1] = d;
        op(&b, KOP_ADD, t, 2, x3, (double)(N * H));
        x = x3;
#undef NAME
    }
    int on = val(&b, "output_norm", KG_PARAM, KD_F32, 1, H, 0, 0, 0);
    int last = x;
    if (prefill) {
        /* Only each sequence's last token needs logits: gather its row
         * (an embedding lookup with the hidden states as the table). */
        last = val(&b, "x.last", KG_INTER, s->act, 2, batch, H, 0, 0);
        int t[2] = {x, third};
        op(&b, KOP_EMBED, t, 2, last, 0);
    }
    /* Per-sequence rows: dynamic with the rest in decode. */
    int xf = prefill ? val(&b, "x.final", KG_INTER, s->act, 2, batch, H, 0, 0)
                     : act(&b, "x.final", batch, H);
    int t[2] = {last, on};
    op_attr(&b, KOP_RMSNORM, t, 2, xf, 4.0 * (double)batch * (double)H, eps, 1);
    int logits = val(&b, "logits", KG_OUTPUT, s->act, 2, batch, V, 0, 0);
    if (!prefill && !b.fail && kg_value_set_dynamic(b.g, logits))
        b.fail = 1;
    /* Tied embeddings (SmolLM2) use token_embd as the output head. */
    t[0] = xf, t[1] = s->output_head ? wval(&b, "output.weight", V, H) : embd;
    op(&b, KOP_MATMUL, t, 2, logits, 2.0 * (double)batch * (double)V * (double)H);
    int next = val(&b, "next_token", KG_OUTPUT, KD_I32, 1, batch, 0, 0, 0);
    if (!prefill && !b.fail && kg_value_set_dynamic(b.g, next))
        b.fail = 1;
    t[0] = logits;
    op(&b, KOP_ARGMAX, t, 1, next, (double)batch * (double)V);
    if (b.fail) {
        kg_destroy(b.g);
        return NULL;
    }
    return b.g;
}

kg_graph *ktf_build_prefill(const ktf_shape *s, int batch, int seq, int ctx)
{
    return build(s, batch, seq, ctx, true);
}

kg_graph *ktf_build_decode(const ktf_shape *s, int batch, int ctx)
{
    return build(s, batch, 1, ctx, false);
}
