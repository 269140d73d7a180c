/* The CPU op table (kernels/cpu/optable.c) running the transformer graphs of
 * backends/transformer/model.c through executables (kernels/exec.c), checked
 * against a naive forward pass written here from the model's equations with
 * plain loops (it shares no code with the kernels):
 *   - prefill logits at a bucketed extent below the compiled one;
 *   - a decode step after a prefill equals a prefill of one more token (the
 *     KV cache handle carries over);
 *   - a decode batch of sequences of different lengths, one slot unused,
 *     equals each sequence on its own;
 *   - Q8_0 weights equal their dequantized f32 copy;
 *   - two compute streams give the bytes of one;
 *   - a position past the cache fails the run instead of writing past it;
 *   - kt_cpu_check names the op of a graph with mismatched shapes;
 *   - SAMPLE takes per-row parameters. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/exec.h"
#include "kernels/kernels.h"
#include "kernels/optable.h"
#include "backends/transformer/model.h"

/* A small Llama: every dim a multiple of 32 so the weights can be Q8_0. */
static ktf_shape tiny(kdtype weight)
{
    return (ktf_shape){64, 2, 4, 2, 16, 96, 50, KD_F32, weight, KD_F32, 1e-5f, 10000.0f,
                       K_ROPE_NORMAL};
}

enum { CTX = 24 };

/* ---- weights: a deterministic function of the parameter's name ------------ */

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s)
        h = (h ^ (uint8_t)*s++) * 1099511628211ull;
    return h;
}

static float urand(uint64_t *st)
{
    uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((z >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* The f32 weights of NAME (N floats); norms near 1, matrices small.  With
 * QUANT the matrices are rounded through Q8_0 so that an f32 model can be
 * compared with the quantized one. */
static float *weights(const char *name, size_t n, int quant)
{
    float *w = malloc(n * sizeof(float));
    uint64_t st = hash(name);
    int norm = strstr(name, "norm") != NULL;
    for (size_t i = 0; i < n; i++)
        w[i] = norm ? 1.0f + 0.2f * urand(&st) : 0.15f * urand(&st);
    if (quant && !norm) {
        void *q = malloc(kdtype_bytes(KD_Q8_0, n));
        assert_int_equal(k_quantize(q, KD_Q8_0, w, n), 0);
        assert_int_equal(k_dequantize(w, KD_Q8_0, q, n), 0);
        free(q);
    }
    return w;
}

/* Sets every parameter of X (graph G) from weights(); block-typed ones are
 * quantized, the rest f32. */
static void set_params(kx_exec *x, const kg_graph *g)
{
    for (size_t v = 0; v < g->n_values; v++) {
        const kg_value *val = &g->values[v];
        if (val->kind != KG_PARAM)
            continue;
        size_t n = 1;
        for (int d = 0; d < val->ndim; d++)
            n *= (size_t)val->shape[d];
        float *w = weights(val->name, n, 0);
        if (val->dtype == KD_F32) {
            assert_int_equal(kx_param_set(x, val->name, KD_F32, w, n * 4), 0);
        } else {
            void *q = malloc(val->bytes);
            assert_int_equal(k_quantize(q, val->dtype, w, n), 0);
            assert_int_equal(kx_param_set(x, val->name, val->dtype, q, val->bytes), 0);
            free(q);
        }
        free(w);
    }
}

/* ---- the naive forward pass ------------------------------------------------ */

static void nrms(float *o, const float *x, const float *w, int d, float eps)
{
    double ss = 0;
    for (int i = 0; i < d; i++)
        ss += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ss / d + eps);
    for (int i = 0; i < d; i++)
        o[i] = (float)(x[i] * r * w[i]);
}

/* y[n] = W[n, k] x[k] */
static void nmv(float *y, const float *w, const float *x, int n, int k)
{
    for (int r = 0; r < n; r++) {
        double s = 0;
        for (int i = 0; i < k; i++)
            s += (double)w[(size_t)r * k + i] * x[i];
        y[r] = (float)s;
    }
}

static void nrope(float *v, int heads, int hd, int pos, double theta)
{
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < hd / 2; i++) {
            double ang = pos * pow(theta, -2.0 * i / hd);
            float *p = v + h * hd + 2 * i, a = p[0], b = p[1];
            p[0] = (float)(a * cos(ang) - b * sin(ang));
            p[1] = (float)(a * sin(ang) + b * cos(ang));
        }
}

/* Logits [vocab] after the last of TOKENS[n] (positions 0..n-1). */
static void naive_logits(const ktf_shape *s, const int32_t *tokens, int n, int quant, float *logits)
{
    int H = s->hidden, Q = s->heads * s->head_dim, KV = s->kv_heads * s->head_dim, F = s->ffn;
    int V = s->vocab, hd = s->head_dim, grp = s->heads / s->kv_heads;
    float *x = calloc((size_t)n * H, 4), *K = calloc((size_t)n * KV, 4), *Vv = calloc((size_t)n * KV, 4);
    float *qs = calloc((size_t)n * Q, 4), *xn = malloc((size_t)H * 4), *att = malloc((size_t)Q * 4);
    float *o = malloc((size_t)H * 4), *g = malloc((size_t)F * 4), *u = malloc((size_t)F * 4);
    float *sc = malloc((size_t)n * 4);
    float *emb = weights("token_embd.weight", (size_t)V * H, quant);
    for (int t = 0; t < n; t++)
        memcpy(x + (size_t)t * H, emb + (size_t)tokens[t] * H, (size_t)H * 4);
    char nm[64];
    for (int l = 0; l < s->layers; l++) {
#define W(fmt, cnt) (snprintf(nm, sizeof(nm), fmt, l), weights(nm, (size_t)(cnt), quant))
        float *an = W("blk.%d.attn_norm", H), *wq = W("blk.%d.attn_q", Q * H);
        float *wk = W("blk.%d.attn_k", KV * H), *wv = W("blk.%d.attn_v", KV * H);
        float *wo = W("blk.%d.attn_output", H * Q), *fn = W("blk.%d.ffn_norm", H);
        float *wg = W("blk.%d.ffn_gate", F * H), *wu = W("blk.%d.ffn_up", F * H);
        float *wd = W("blk.%d.ffn_down", H * F);
#undef W
        for (int t = 0; t < n; t++) {
            nrms(xn, x + (size_t)t * H, an, H, s->rms_eps);
            nmv(qs + (size_t)t * Q, wq, xn, Q, H);
            nmv(K + (size_t)t * KV, wk, xn, KV, H);
            nmv(Vv + (size_t)t * KV, wv, xn, KV, H);
            nrope(qs + (size_t)t * Q, s->heads, hd, t, s->rope_theta);
            nrope(K + (size_t)t * KV, s->kv_heads, hd, t, s->rope_theta);
        }
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < s->heads; h++) {
                const float *q = qs + (size_t)t * Q + h * hd;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++)
                        d += (double)q[i] * K[(size_t)j * KV + (h / grp) * hd + i];
                    sc[j] = (float)(d / sqrt((double)hd));
                    m = sc[j] > m ? sc[j] : m;
                }
                for (int j = 0; j <= t; j++)
                    sum += exp(sc[j] - m);
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int j = 0; j <= t; j++)
                        a += exp(sc[j] - m) / sum * Vv[(size_t)j * KV + (h / grp) * hd + i];
                    att[h * hd + i] = (float)a;
                }
            }
            float *xt = x + (size_t)t * H;
            nmv(o, wo, att, H, Q);
            for (int i = 0; i < H; i++)
                xt[i] += o[i];
            nrms(xn, xt, fn, H, s->rms_eps);
            nmv(g, wg, xn, F, H);
            nmv(u, wu, xn, F, H);
            for (int i = 0; i < F; i++)
                g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            nmv(o, wd, g, H, F);
            for (int i = 0; i < H; i++)
                xt[i] += o[i];
        }
        free(an), free(wq), free(wk), free(wv), free(wo), free(fn), free(wg), free(wu), free(wd);
    }
    float *on = weights("output_norm", (size_t)H, quant);
    nrms(xn, x + (size_t)(n - 1) * H, on, H, s->rms_eps);
    nmv(logits, emb, xn, V, H);
    free(on), free(emb), free(x), free(K), free(Vv), free(qs), free(xn), free(att), free(o);
    free(g), free(u), free(sc);
}

/* ---- helpers over executables ------------------------------------------------ */

static kx_exec *compile(kg_graph *g, int n_compute)
{
    char err[256];
    assert_non_null(g);
    if (kt_cpu_check(g, err, sizeof(err)))
        fail_msg("kt_cpu_check: %s", err);
    kx_op_table t;
    kt_cpu_ops(&t);
    kx_options o = {.n_compute = n_compute};
    kx_exec *x = NULL;
    assert_int_equal(kx_compile(g, &t, &o, &x), 0);
    set_params(x, g);
    kg_destroy(g);
    return x;
}

static void close_to(const float *got, const float *want, size_t n, float tol)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= tol * (1.0f + fabsf(want[i]))))
            fail_msg("element %zu: got %.7g, want %.7g", i, (double)got[i], (double)want[i]);
}

static const int32_t SEQ[] = {3, 17, 41, 0, 22, 9, 49, 5, 30, 11, 2, 44};

static void run_ok(kx_exec *x)
{
    int rc = kx_run(x), st = 0;
    if (rc) {
        int op = kx_op_error(x, &st);
        fail_msg("kx_run: %s (op %d, status %d)", bt_strerror(rc), op, st);
    }
}

/* Runs a batch-1 prefill of N tokens; returns the logits (malloc'd). */
static float *prefill(kx_exec *x, const int32_t *tok, int n)
{
    int32_t pos[32], last = n - 1;
    for (int i = 0; i < n; i++)
        pos[i] = i;
    assert_int_equal(kx_extent_set(x, n), 0);
    assert_int_equal(kx_input_bind(x, 0, tok, (size_t)n * 4), 0);
    assert_int_equal(kx_input_bind(x, 1, pos, (size_t)n * 4), 0);
    assert_int_equal(kx_input_bind(x, 2, &last, 4), 0);
    run_ok(x);
    size_t bytes;
    const float *lg = kx_output(x, 0, &bytes);
    float *copy = malloc(bytes);
    memcpy(copy, lg, bytes);
    return copy;
}

/* Copies the prefill executable's caches (batch 1) into slot B of X's. */
static void copy_caches(kx_exec *x, int b, kx_exec *from, const ktf_shape *s)
{
    char nm[32];
    size_t per = (size_t)CTX * s->kv_heads * s->head_dim * 4, have;
    for (int l = 0; l < s->layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            snprintf(nm, sizeof(nm), kv ? "v_cache.%d" : "k_cache.%d", l);
            uint8_t *dst = kx_handle(x, nm, &have);
            const void *src = kx_handle(from, nm, NULL);
            assert_non_null(dst);
            assert_true(have >= (size_t)(b + 1) * per);
            memcpy(dst + (size_t)b * per, src, per);
        }
}

/* Binds a decode step's four inputs, N rows each. */
static void bind_step(kx_exec *d, const int32_t *tok, const int32_t *pos, const int32_t *lens,
                      const int32_t *slots, int n)
{
    const int32_t *in[4] = {tok, pos, lens, slots};
    for (int i = 0; i < 4; i++)
        assert_int_equal(kx_input_bind(d, i, in[i], (size_t)n * 4), 0);
}

/* ---- tests ------------------------------------------------------------------- */

static void test_prefill_matches_naive(void **state)
{
    (void)state;
    ktf_shape s = tiny(KD_F32);
    kx_exec *x = compile(ktf_build_prefill(&s, 1, 9, CTX), 1);
    assert_int_equal(kx_extent_upper(x), 9);
    float want[50];
    for (int n = 1; n <= 9; n += 3) {
        float *got = prefill(x, SEQ, n);
        naive_logits(&s, SEQ, n, 0, want);
        close_to(got, want, 50, 2e-4f);
        int32_t am;
        k_argmax(&am, want, 1, 50);
        assert_int_equal(*(const int32_t *)kx_output(x, 1, NULL), am);
        free(got);
    }
    kx_destroy(x);
}

static void test_decode_continues_prefill(void **state)
{
    (void)state;
    ktf_shape s = tiny(KD_F32);
    kx_exec *p = compile(ktf_build_prefill(&s, 1, 12, CTX), 1);
    kx_exec *d = compile(ktf_build_decode(&s, 1, CTX), 1);
    float *ignored = prefill(p, SEQ, 7);
    free(ignored);
    copy_caches(d, 0, p, &s);
    float want[50];
    /* Three decode steps in a row, each against a prefill of one more. */
    for (int step = 0; step < 3; step++) {
        int32_t tok = SEQ[7 + step], pos = 7 + step, len = 7 + step, slot = 0;
        bind_step(d, &tok, &pos, &len, &slot, 1);
        run_ok(d);
        naive_logits(&s, SEQ, 8 + step, 0, want);
        close_to(kx_output(d, 0, NULL), want, 50, 2e-4f);
        float *pl = prefill(p, SEQ, 8 + step);
        close_to(kx_output(d, 0, NULL), pl, 50, 2e-5f);
        free(pl);
    }
    kx_destroy(p);
    kx_destroy(d);
}

static void test_decode_batch_mixed_lengths(void **state)
{
    (void)state;
    ktf_shape s = tiny(KD_F32);
    kx_exec *p = compile(ktf_build_prefill(&s, 1, 12, CTX), 1);
    kx_exec *d = compile(ktf_build_decode(&s, 4, CTX), 1);
    /* Slot b holds the first lens[b] tokens of its own sequence (SEQ shifted
     * by b); slot 3 is unused. */
    int32_t lens[4] = {3, 1, 6, -1}, tok[4], pos[4];
    int32_t seqs[4][12];
    for (int b = 0; b < 4; b++)
        for (int i = 0; i < 12; i++)
            seqs[b][i] = SEQ[(i + b) % 12];
    for (int b = 0; b < 3; b++) {
        free(prefill(p, seqs[b], lens[b]));
        copy_caches(d, b, p, &s);
        tok[b] = seqs[b][lens[b]];
        pos[b] = lens[b];
    }
    tok[3] = 0, pos[3] = 0;
    int32_t slots[4] = {0, 1, 2, 3};
    bind_step(d, tok, pos, lens, slots, 4);
    run_ok(d);
    const float *lg = kx_output(d, 0, NULL);
    float want[50];
    for (int b = 0; b < 3; b++) {
        naive_logits(&s, seqs[b], lens[b] + 1, 0, want);
        close_to(lg + b * 50, want, 50, 2e-4f);
    }
    kx_destroy(p);
    kx_destroy(d);
}

/* A step of fewer rows than caches, each row naming its cache: two
 * sequences in slots 3 and 1 of four run as rows 0 and 1 of a step of two
 * rows, give their own logits, and leave the caches of slots 0 and 2 as
 * they were. */
static void test_decode_rows_in_any_slot(void **state)
{
    (void)state;
    ktf_shape s = tiny(KD_F32);
    kx_exec *p = compile(ktf_build_prefill(&s, 1, 12, CTX), 1);
    kx_exec *d = compile(ktf_build_decode(&s, 4, CTX), 1);
    int32_t seqs[2][12], lens[2] = {4, 2}, slots[2] = {3, 1}, tok[2], pos[2];
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 12; i++)
            seqs[r][i] = SEQ[(i + 5 * r + 1) % 12];
        free(prefill(p, seqs[r], lens[r]));
        copy_caches(d, slots[r], p, &s);
        tok[r] = seqs[r][lens[r]];
        pos[r] = lens[r];
    }
    /* Slots 0 and 2 hold a marker that must survive the step. */
    size_t bytes;
    float *kc = kx_handle(d, "k_cache.0", &bytes);
    size_t per = bytes / 4 / sizeof(float);
    for (size_t i = 0; i < per; i++)
        kc[i] = kc[2 * per + i] = 7.0f;
    assert_int_equal(kx_extent_set(d, 2), 0);
    bind_step(d, tok, pos, lens, slots, 2);
    run_ok(d);
    const float *lg = kx_output(d, 0, NULL);
    float want[50];
    for (int r = 0; r < 2; r++) {
        naive_logits(&s, seqs[r], lens[r] + 1, 0, want);
        close_to(lg + r * 50, want, 50, 2e-4f);
    }
    for (size_t i = 0; i < per; i++)
        assert_true(kc[i] == 7.0f && kc[2 * per + i] == 7.0f);
    /* A slot past the caches fails the step. */
    slots[1] = 4;
    assert_int_equal(kx_run(d), BT_EOP);
    kx_destroy(p);
    kx_destroy(d);
}

static void test_q8_weights_match_dequantized(void **state)
{
    (void)state;
    ktf_shape s = tiny(KD_Q8_0);
    kx_exec *x = compile(ktf_build_prefill(&s, 1, 9, CTX), 1);
    float want[50];
    /* 9 rows widen the weights for sgemm; 2 rows take the quantized
     * mat-vec: both paths against the f32 model of the rounded weights. */
    for (int n = 2; n <= 9; n += 7) {
        float *got = prefill(x, SEQ, n);
        naive_logits(&s, SEQ, n, 1, want);
        close_to(got, want, 50, 1e-3f);
        free(got);
    }
    kx_destroy(x);
}

static void test_two_streams_same_bytes(void **state)
{
    (void)state;
    ktf_shape s = tiny(KD_F32);
    kx_exec *a = compile(ktf_build_prefill(&s, 1, 9, CTX), 1);
    kx_exec *b = compile(ktf_build_prefill(&s, 1, 9, CTX), 2);
    for (int r = 0; r < 5; r++) {
        float *la = prefill(a, SEQ + r, 7), *lb = prefill(b, SEQ + r, 7);
        assert_memory_equal(la, lb, 50 * 4);
        free(la);
        free(lb);
    }
    kx_destroy(a);
    kx_destroy(b);
}

static void test_position_past_cache_fails(void **state)
{
    (void)state;
    ktf_shape s = tiny(KD_F32);
    kx_exec *d = compile(ktf_build_decode(&s, 1, CTX), 1);
    size_t bytes;
    float *kc = kx_handle(d, "k_cache.0", &bytes);
    int32_t tok = 1, pos = CTX, len = CTX, slot = 0;
    bind_step(d, &tok, &pos, &len, &slot, 1);
    assert_int_equal(kx_run(d), BT_EOP);
    for (size_t i = 0; i < bytes / 4; i++)
        assert_true(kc[i] == 0.0f);  /* nothing written */
    /* The executable still runs afterwards. */
    len = pos = 0;
    assert_int_equal(kx_run(d), 0);
    kx_destroy(d);
}

static void test_check_names_bad_op(void **state)
{
    (void)state;
    kg_graph *g = kg_create();
    int64_t a_s[2] = {4, 64}, w_s[2] = {8, 32}, y_s[2] = {4, 8};
    int a = kg_value_add(g, "a", KG_INPUT, KD_F32, 2, a_s);
    int w = kg_value_add(g, "w", KG_PARAM, KD_F32, 2, w_s);
    int y = kg_value_add(g, "y", KG_OUTPUT, KD_F32, 2, y_s);
    int in[2] = {a, w};
    assert_true(kg_op_add(g, KOP_MATMUL, in, 2, &y, 1, NULL, 0, -1, -1) >= 0);
    char err[256];
    assert_int_equal(kt_cpu_check(g, err, sizeof(err)), BT_EINVAL);
    assert_non_null(strstr(err, "matmul"));
    assert_non_null(strstr(err, "'y'"));
    kg_destroy(g);
    /* RMSNorm without its epsilon attribute. */
    g = kg_create();
    int64_t x_s[2] = {2, 8}, n_s[1] = {8};
    int x = kg_value_add(g, "x", KG_INPUT, KD_F32, 2, x_s);
    int nw = kg_value_add(g, "nw", KG_PARAM, KD_F32, 1, n_s);
    int o = kg_value_add(g, "o", KG_OUTPUT, KD_F32, 2, x_s);
    int in2[2] = {x, nw};
    assert_true(kg_op_add(g, KOP_RMSNORM, in2, 2, &o, 1, NULL, 0, -1, -1) >= 0);
    assert_int_equal(kt_cpu_check(g, err, sizeof(err)), BT_EINVAL);
    assert_non_null(strstr(err, "rmsnorm"));
    kg_destroy(g);
}

static void test_sample_per_row(void **state)
{
    (void)state;
    kg_graph *g = kg_create();
    int64_t l_s[2] = {3, 40}, p_s[2] = {3, 3}, r_s[2] = {3, 2}, o_s[1] = {3};
    int lg = kg_value_add(g, "logits", KG_INPUT, KD_F32, 2, l_s);
    int pr = kg_value_add(g, "params", KG_INPUT, KD_F32, 2, p_s);
    int rn = kg_value_add(g, "rng", KG_INPUT, KD_I64, 2, r_s);
    int out = kg_value_add(g, "token", KG_OUTPUT, KD_I32, 1, o_s);
    int in[3] = {lg, pr, rn};
    assert_true(kg_op_add(g, KOP_SAMPLE, in, 3, &out, 1, NULL, 0, -1, -1) >= 0);
    kx_exec *x = compile(g, 1);
    float logits[120], params[9] = {0, 0, 1, 0.8f, 5, 0.9f, 1.5f, 0, 1};
    int64_t rng[6] = {7, 0, 7, 100, 99, 12345};
    uint64_t st = 5;
    for (int i = 0; i < 120; i++)
        logits[i] = 3.0f * urand(&st);
    assert_int_equal(kx_input_bind(x, 0, logits, sizeof(logits)), 0);
    assert_int_equal(kx_input_bind(x, 1, params, sizeof(params)), 0);
    assert_int_equal(kx_input_bind(x, 2, rng, sizeof(rng)), 0);
    assert_int_equal(kx_run(x), 0);
    const int32_t *got = kx_output(x, 0, NULL);
    for (int r = 0; r < 3; r++) {
        int32_t want;
        k_sample(&want, logits + r * 40, 1, 40, params[3 * r], (int)params[3 * r + 1],
                 params[3 * r + 2], (uint64_t)rng[2 * r], (uint64_t)rng[2 * r + 1]);
        assert_int_equal(got[r], want);
    }
    int32_t greedy;
    k_argmax(&greedy, logits, 1, 40);
    assert_int_equal(got[0], greedy);
    kx_destroy(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_matches_naive),
        cmocka_unit_test(test_decode_continues_prefill),
        cmocka_unit_test(test_decode_batch_mixed_lengths),
        cmocka_unit_test(test_decode_rows_in_any_slot),
        cmocka_unit_test(test_q8_weights_match_dequantized),
        cmocka_unit_test(test_two_streams_same_bytes),
        cmocka_unit_test(test_position_past_cache_fails),
        cmocka_unit_test(test_check_names_bad_op),
        cmocka_unit_test(test_sample_per_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
