/* Op conformance: every op of kernels/ops.h (KOP_COUNT of them), as a
 * one-op executable on every device flavour, against the reference.
 *
 * The reference is computed here by the scalar kernels of kernels/cpu/
 * (a naive loop for the matrix products).  The flavours are the CPU op
 * table (with its fast paths: OpenBLAS, AVX2) on the CPU device and the
 * CUDA op table on the CUDA device.  Shapes are drawn at random per trial,
 * with ragged tails (sizes that are not multiples of a block or a warp).
 *
 * An op with no case here, or that a flavour refuses, fails the check: a
 * new op must come with its CUDA path and its case.  Exit 1 on a failure;
 * "SKIP: no CUDA device" and exit 77 (a skip, not a pass) where there is
 * no GPU. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/exec.h"
#include "kernels/kernels.h"
#include "kernels/optable.h"

static int failures, checks;
static uint64_t rs = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
    uint64_t z = (rs += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float urand(void)
{
    return (float)((next() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static int irand(int lo, int hi) /* [lo, hi] */
{
    return lo + (int)(next() % (uint64_t)(hi - lo + 1));
}

static float *frand(size_t n, float scale)
{
    float *p = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        p[i] = urand() * scale;
    return p;
}

static void *xmalloc(size_t n)
{
    void *p = calloc(1, n + 4);
    if (!p)
        abort();
    return p;
}

/* ---- one case: a graph, its inputs, handles, and what it must produce ---------- */

enum { MAXV = 8 };

typedef struct tcase {
    char name[96];
    kg_graph *g;
    int n_in;
    const void *in[MAXV];
    size_t in_bytes[MAXV];
    int n_handles;               /* initial contents and expected final ones */
    const char *h_name[MAXV];
    const void *h_init[MAXV], *h_want[MAXV];
    size_t h_bytes[MAXV];
    int n_out;
    const void *want[MAXV];
    size_t want_bytes[MAXV];
    kdtype want_dt[MAXV];
    float tol;                   /* relative (+ the same absolute) bound for f32 */
    void *owned[32];             /* freed after the case */
    int n_owned;
} tcase;

static void *own(tcase *c, void *p)
{
    c->owned[c->n_owned++] = p;
    return p;
}

static int val(tcase *c, const char *name, kg_kind kind, kdtype dt, int ndim, int64_t d0,
               int64_t d1, int64_t d2, int64_t d3)
{
    int64_t s[4] = {d0, d1, d2, d3};
    int v = kg_value_add(c->g, name, kind, dt, ndim, s);
    if (v < 0) {
        fprintf(stderr, "%s: kg_value_add(%s) failed\n", c->name, name);
        exit(2);
    }
    return v;
}

static void input(tcase *c, const void *data, size_t bytes)
{
    c->in[c->n_in] = data;
    c->in_bytes[c->n_in++] = bytes;
}

static void output(tcase *c, const void *want, size_t bytes, kdtype dt)
{
    c->want[c->n_out] = want;
    c->want_bytes[c->n_out] = bytes;
    c->want_dt[c->n_out++] = dt;
}

static void handle(tcase *c, const char *name, const void *init, const void *want, size_t bytes)
{
    int k = c->n_handles++;
    c->h_name[k] = name, c->h_init[k] = init, c->h_want[k] = want, c->h_bytes[k] = bytes;
}

static void op(tcase *c, kop o, const int *in, int n_in, const int *out, int n_out,
               const int64_t *attr, int n_attr)
{
    if (kg_op_add(c->g, o, in, n_in, out, n_out, attr, n_attr, -1, -1) < 0) {
        fprintf(stderr, "%s: kg_op_add failed\n", c->name);
        exit(2);
    }
}

static bool close_enough(const float *got, const float *want, size_t n, float tol, size_t *at)
{
    for (size_t i = 0; i < n; i++) {
        bool both_nan = isnan(got[i]) && isnan(want[i]);
        if (!both_nan && !(fabsf(got[i] - want[i]) <= tol + tol * fabsf(want[i]))) {
            *at = i;
            return false;
        }
    }
    return true;
}

/* Runs C on one flavour (the op table of DEV, with USER as its options);
 * false (after printing why) on any difference. */
static bool run_flavour(tcase *c, const char *flavour, const kx_device *dev, void *user)
{
    char err[256];
    kx_op_table t;
    bool gpu = dev != NULL;
    int rc = gpu ? kt_cuda_check(c->g, err, sizeof(err)) : kt_cpu_check(c->g, err, sizeof(err));
    if (rc) {
        printf("FAIL %-40s %s refuses it: %s\n", c->name, flavour, err);
        return false;
    }
    if (gpu)
        kt_cuda_ops(&t);
    else
        kt_cpu_ops(&t);
    t.user = user;
    kx_options o = {.n_compute = 1, .device = dev};
    kx_exec *x = NULL;
    if ((rc = kx_compile(c->g, &t, &o, &x))) {
        printf("FAIL %-40s %s: kx_compile: %s\n", c->name, flavour, bt_strerror(rc));
        return false;
    }
    bool ok = true;
    for (int h = 0; h < c->n_handles && ok; h++) {
        size_t bytes = 0;
        void *p = kx_handle(x, c->h_name[h], &bytes);
        if (!p || bytes != c->h_bytes[h]) {
            printf("FAIL %-40s %s: handle %s\n", c->name, flavour, c->h_name[h]);
            ok = false;
        } else if (gpu) {
            ok = cudaMemcpy(p, c->h_init[h], bytes, cudaMemcpyHostToDevice) == cudaSuccess;
        } else {
            memcpy(p, c->h_init[h], bytes);
        }
    }
    for (int i = 0; i < c->n_in && ok; i++)
        if ((rc = kx_input_bind(x, i, c->in[i], c->in_bytes[i]))) {
            printf("FAIL %-40s %s: bind input %d: %s\n", c->name, flavour, i, bt_strerror(rc));
            ok = false;
        }
    if (ok && (rc = kx_run(x))) {
        int st = 0;
        kx_op_error(x, &st);
        printf("FAIL %-40s %s: run: %s (op status %d)\n", c->name, flavour, bt_strerror(rc), st);
        ok = false;
    }
    for (int j = 0; j < c->n_out + c->n_handles && ok; j++) {
        bool is_out = j < c->n_out;
        int h = j - c->n_out;
        size_t bytes = 0;
        const void *p = is_out ? kx_output(x, j, &bytes) : kx_handle(x, c->h_name[h], &bytes);
        size_t want_bytes = is_out ? c->want_bytes[j] : c->h_bytes[h];
        const void *want = is_out ? c->want[j] : c->h_want[h];
        kdtype dt = is_out ? c->want_dt[j] : KD_F32;
        if (!p || bytes < want_bytes) {
            printf("FAIL %-40s %s: output %d missing or short\n", c->name, flavour, j);
            ok = false;
            break;
        }
        void *got = xmalloc(want_bytes);
        if (gpu)
            cudaMemcpy(got, p, want_bytes, cudaMemcpyDeviceToHost);
        else
            memcpy(got, p, want_bytes);
        size_t at = 0;
        if (dt == KD_F32 && !close_enough(got, want, want_bytes / 4, c->tol, &at)) {
            printf("FAIL %-40s %s: %s %d element %zu: %.9g, reference %.9g\n", c->name, flavour,
                   is_out ? "output" : "handle", is_out ? j : h, at, (double)((float *)got)[at],
                   (double)((const float *)want)[at]);
            ok = false;
        } else if (dt != KD_F32 && memcmp(got, want, want_bytes)) {
            printf("FAIL %-40s %s: output %d differs from the reference\n", c->name, flavour, j);
            ok = false;
        }
        free(got);
    }
    kx_destroy(x);
    return ok;
}

static void finish(tcase *c, const kx_device *gpu)
{
    checks++;
    /* Each table as it runs by default, and in its batch-invariant mode
     * (its own kernels for the products and attention). */
    static kt_cpu_opts cpu_inv = {NULL, 0, 1};
    static kt_cuda_opts cuda_inv = {NULL, 1};
    bool ok = run_flavour(c, "cpu", NULL, NULL);
    ok = run_flavour(c, "cpu invariant", NULL, &cpu_inv) && ok;
    ok = run_flavour(c, "cuda", gpu, NULL) && ok;
    ok = run_flavour(c, "cuda invariant", gpu, &cuda_inv) && ok;
    if (ok)
        printf("ok   %-40s cpu and cuda, each also invariant, equal the reference\n", c->name);
    failures += !ok;
    kg_destroy(c->g);
    for (int i = 0; i < c->n_owned; i++)
        free(c->owned[i]);
}

static tcase *start(tcase *c, const char *fmt, kop o, int trial)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->name, sizeof(c->name), fmt, kop_name(o), trial);
    c->g = kg_create();
    c->tol = 1e-5f;
    return c;
}

/* ---- the cases, one per op --------------------------------------------------------- */

static void naive_matmul(float *y, const float *a, const float *w, int m, int n, int k)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int t = 0; t < k; t++)
                s += (double)a[(size_t)i * k + t] * w[(size_t)j * k + t];
            y[(size_t)i * n + j] = (float)s;
        }
}

/* A [rows, cols] weight of type T (f32 or a block type) and its f32 view. */
static void *weight(tcase *c, kdtype t, int rows, int cols, float **wf)
{
    float *f = own(c, frand((size_t)rows * cols, 0.5f));
    if (t == KD_F32) {
        *wf = f;
        return f;
    }
    size_t bytes = kdtype_bytes(t, (size_t)rows * cols);
    void *q = own(c, xmalloc(bytes));
    if (k_quantize(q, t, f, (size_t)rows * cols))
        abort();
    *wf = own(c, xmalloc((size_t)rows * cols * 4));
    k_dequantize(*wf, t, q, (size_t)rows * cols);
    return q;
}

static void case_op(kop o, int trial, const kx_device *gpu)
{
    tcase tc, *c = &tc;
    start(c, "%s, trial %d", o, trial);
    switch (o) {
    case KOP_EMBED: {
        int V = irand(5, 70), D = irand(1, 100), N = irand(1, 40);
        float *tab = own(c, frand((size_t)V * D, 1));
        int32_t *ids = own(c, xmalloc(N * 4));
        for (int i = 0; i < N; i++)
            ids[i] = irand(-1, V); /* -1 and V are outside: zeros */
        float *want = own(c, xmalloc((size_t)N * D * 4));
        k_embed(want, tab, V, D, ids, N);
        int vt = val(c, "table", KG_INPUT, KD_F32, 2, V, D, 0, 0);
        int vi = val(c, "ids", KG_INPUT, KD_I32, 1, N, 0, 0, 0);
        int vo = val(c, "out", KG_OUTPUT, KD_F32, 2, N, D, 0, 0);
        int in[2] = {vt, vi};
        op(c, o, in, 2, &vo, 1, NULL, 0);
        input(c, tab, (size_t)V * D * 4), input(c, ids, N * 4);
        output(c, want, (size_t)N * D * 4, KD_F32);
        break;
    }
    case KOP_MATMUL:
    case KOP_MATMUL_ALLREDUCE: {
        kdtype wt = trial % 2 ? KD_Q8_0 : KD_F32;
        int M = irand(1, 20), K = 32 * irand(1, 5), N = irand(1, 70);
        float *a = own(c, frand((size_t)M * K, 1)), *wf;
        void *w = weight(c, wt, N, K, &wf);
        float *want = own(c, xmalloc((size_t)M * N * 4));
        naive_matmul(want, a, wf, M, N, K);
        int va = val(c, "a", KG_INPUT, KD_F32, 2, M, K, 0, 0);
        int vw = val(c, "w", KG_INPUT, wt, 2, N, K, 0, 0);
        int vy = val(c, "y", KG_OUTPUT, KD_F32, 2, M, N, 0, 0);
        int in[2] = {va, vw};
        int64_t ranks = 1;
        op(c, o, in, 2, &vy, 1, &ranks, o == KOP_MATMUL_ALLREDUCE);
        input(c, a, (size_t)M * K * 4), input(c, w, kdtype_bytes(wt, (size_t)N * K));
        output(c, want, (size_t)M * N * 4, KD_F32);
        c->tol = 1e-4f;
        snprintf(c->name + strlen(c->name), sizeof(c->name) - strlen(c->name), " (%s w)",
                 kdtype_name(wt));
        break;
    }
    case KOP_QMATVEC: {
        kdtype ts[3] = {KD_Q8_0, KD_Q4_0, KD_Q4_1}, wt = ts[trial % 3];
        int M = irand(1, 4), K = 32 * irand(1, 6), N = irand(1, 90);
        float *x = own(c, frand((size_t)M * K, 1)), *wf;
        void *w = weight(c, wt, N, K, &wf);
        float *want = own(c, xmalloc((size_t)M * N * 4));
        for (int r = 0; r < M; r++)
            k_qmatvec_ref(want + (size_t)r * N, w, wt, x + (size_t)r * K, N, K);
        int vw = val(c, "w", KG_INPUT, wt, 2, N, K, 0, 0);
        int vx = val(c, "x", KG_INPUT, KD_F32, 2, M, K, 0, 0);
        int vy = val(c, "y", KG_OUTPUT, KD_F32, 2, M, N, 0, 0);
        int in[2] = {vw, vx};
        op(c, o, in, 2, &vy, 1, NULL, 0);
        input(c, w, kdtype_bytes(wt, (size_t)N * K)), input(c, x, (size_t)M * K * 4);
        output(c, want, (size_t)M * N * 4, KD_F32);
        c->tol = 1e-4f;
        break;
    }
    case KOP_ADD:
    case KOP_MUL:
    case KOP_SILU:
    case KOP_GELU: {
        bool binary = o == KOP_ADD || o == KOP_MUL;
        /* Odd trials: ADD broadcasts a row of NB, GELU takes its erf form. */
        int nb = irand(1, 40), n = nb * irand(1, 120);
        bool bcast = o == KOP_ADD && trial % 2, erf_mode = o == KOP_GELU && trial % 2;
        if (!bcast)
            nb = n;
        float *a = own(c, frand(n, 4)), *b = own(c, frand(nb, 4)), *want = own(c, xmalloc(n * 4));
        if (o == KOP_ADD)
            k_add_bcast(want, a, n, b, nb);
        else if (o == KOP_MUL)
            k_mul(want, a, b, n);
        else if (o == KOP_SILU)
            k_silu(want, a, n);
        else if (erf_mode)
            k_gelu_erf(want, a, n);
        else
            k_gelu(want, a, n);
        int va = val(c, "a", KG_INPUT, KD_F32, 2, n / nb, nb, 0, 0);
        int vb = binary ? val(c, "b", KG_INPUT, KD_F32, 1, nb, 0, 0, 0) : -1;
        int vy = val(c, "y", KG_OUTPUT, KD_F32, 2, n / nb, nb, 0, 0);
        int in[2] = {va, vb};
        int64_t mode = K_GELU_ERF;
        op(c, o, in, binary ? 2 : 1, &vy, 1, &mode, erf_mode);
        input(c, a, n * 4);
        if (binary)
            input(c, b, nb * 4);
        output(c, want, n * 4, KD_F32);
        if (bcast || erf_mode)
            snprintf(c->name + strlen(c->name), sizeof(c->name) - strlen(c->name), "%s",
                     bcast ? " (broadcast)" : " (erf)");
        break;
    }
    case KOP_RMSNORM:
    case KOP_LAYERNORM: {
        int R = irand(1, 9), D = irand(1, 700);
        float *x = own(c, frand((size_t)R * D, 3)), *w = own(c, frand(D, 1));
        float *b = own(c, frand(D, 1)), *want = own(c, xmalloc((size_t)R * D * 4));
        if (o == KOP_RMSNORM)
            k_rmsnorm(want, x, w, R, D, 1e-5f);
        else
            k_layernorm(want, x, w, b, R, D, 1e-5f);
        int vx = val(c, "x", KG_INPUT, KD_F32, 2, R, D, 0, 0);
        int vw = val(c, "w", KG_INPUT, KD_F32, 1, D, 0, 0, 0);
        int vb = o == KOP_LAYERNORM ? val(c, "b", KG_INPUT, KD_F32, 1, D, 0, 0, 0) : -1;
        int vy = val(c, "y", KG_OUTPUT, KD_F32, 2, R, D, 0, 0);
        int in[3] = {vx, vw, vb};
        int64_t eps = kg_attr_f(1e-5);
        op(c, o, in, o == KOP_LAYERNORM ? 3 : 2, &vy, 1, &eps, 1);
        input(c, x, (size_t)R * D * 4), input(c, w, D * 4);
        if (o == KOP_LAYERNORM)
            input(c, b, D * 4);
        output(c, want, (size_t)R * D * 4, KD_F32);
        c->tol = 1e-4f;
        break;
    }
    case KOP_ROPE: {
        int N = irand(1, 12), H = irand(1, 6), HD = 2 * irand(1, 40), mode = trial % 2;
        float *x = own(c, frand((size_t)N * H * HD, 2));
        float *want = own(c, xmalloc((size_t)N * H * HD * 4));
        int32_t *pos = own(c, xmalloc(N * 4));
        for (int i = 0; i < N; i++)
            pos[i] = irand(0, 30000);
        memcpy(want, x, (size_t)N * H * HD * 4);
        k_rope(want, pos, N, H, HD, 10000.0f, mode ? K_ROPE_NEOX : K_ROPE_NORMAL);
        int vx = val(c, "x", KG_INPUT, KD_F32, 2, N, (int64_t)H * HD, 0, 0);
        int vp = val(c, "pos", KG_INPUT, KD_I32, 1, N, 0, 0, 0);
        int vy = val(c, "y", KG_OUTPUT, KD_F32, 2, N, (int64_t)H * HD, 0, 0);
        int in[2] = {vx, vp};
        int64_t attr[4] = {H, HD, kg_attr_f(10000.0), mode ? K_ROPE_NEOX : K_ROPE_NORMAL};
        op(c, o, in, 2, &vy, 1, attr, 4);
        input(c, x, (size_t)N * H * HD * 4), input(c, pos, N * 4);
        output(c, want, (size_t)N * H * HD * 4, KD_F32);
        c->tol = 2e-5f;
        break;
    }
    case KOP_ATTN_PREFILL: {
        int KV = irand(1, 3), H = KV * irand(1, 3), HD = irand(1, 40) * 2, N = irand(1, 9);
        int pos0 = irand(0, 20), C = pos0 + N + irand(0, 5);
        size_t row = (size_t)KV * HD, cache = (size_t)C * row;
        float *q = own(c, frand((size_t)N * H * HD, 1)), *k = own(c, frand(N * row, 1));
        float *v = own(c, frand(N * row, 1));
        float *kc0 = own(c, frand(cache, 1)), *vc0 = own(c, frand(cache, 1));
        float *kc = own(c, xmalloc(cache * 4)), *vc = own(c, xmalloc(cache * 4));
        memcpy(kc, kc0, cache * 4), memcpy(vc, vc0, cache * 4);
        float *want = own(c, xmalloc((size_t)N * H * HD * 4));
        k_attn_prefill(want, q, k, v, kc, vc, C, pos0, N, H, KV, HD);
        int32_t *pos = own(c, xmalloc(N * 4));
        for (int i = 0; i < N; i++)
            pos[i] = pos0 + i;
        int vq = val(c, "q", KG_INPUT, KD_F32, 2, N, (int64_t)H * HD, 0, 0);
        int vk = val(c, "k", KG_INPUT, KD_F32, 2, N, (int64_t)row, 0, 0);
        int vv = val(c, "v", KG_INPUT, KD_F32, 2, N, (int64_t)row, 0, 0);
        int vkc = val(c, "kc", KG_HANDLE, KD_F32, 4, 1, KV, C, HD);
        int vvc = val(c, "vc", KG_HANDLE, KD_F32, 4, 1, KV, C, HD);
        int vp = val(c, "pos", KG_INPUT, KD_I32, 1, N, 0, 0, 0);
        int vo = val(c, "o", KG_OUTPUT, KD_F32, 2, N, (int64_t)H * HD, 0, 0);
        int in[6] = {vq, vk, vv, vkc, vvc, vp}, out[3] = {vo, vkc, vvc};
        int64_t attr[3] = {H, KV, HD};
        op(c, o, in, 6, out, 3, attr, 3);
        input(c, q, (size_t)N * H * HD * 4), input(c, k, N * row * 4), input(c, v, N * row * 4);
        input(c, pos, N * 4);
        handle(c, "kc", kc0, kc, cache * 4), handle(c, "vc", vc0, vc, cache * 4);
        output(c, want, (size_t)N * H * HD * 4, KD_F32);
        c->tol = 1e-4f;
        break;
    }
    case KOP_ATTN_DECODE: {
        int KV = irand(1, 3), H = KV * irand(1, 3), HD = irand(1, 40) * 2, B = irand(1, 5);
        int C = irand(2, 30);
        /* Odd trials name each row's cache (slots): NC caches, more than
         * the B rows, these on distinct ones in a random order (row 0 never
         * on cache 0), the others untouched. */
        bool slotted = trial % 2;
        int NC = slotted ? B + irand(1, 2) : B;
        int32_t *slots = own(c, xmalloc(NC * 4));
        for (int i = 0; i < NC; i++)
            slots[i] = i;
        for (int i = NC - 1; slotted && i > 0; i--) {
            int j = irand(0, i), t = slots[i];
            slots[i] = slots[j], slots[j] = t;
        }
        if (slotted && slots[0] == 0)
            slots[0] = slots[NC - 1], slots[NC - 1] = 0;
        size_t row = (size_t)KV * HD, cache = (size_t)C * row;
        float *q = own(c, frand((size_t)B * H * HD, 1)), *k = own(c, frand(B * row, 1));
        float *v = own(c, frand(B * row, 1));
        float *kc0 = own(c, frand(NC * cache, 1)), *vc0 = own(c, frand(NC * cache, 1));
        float *kc = own(c, xmalloc(NC * cache * 4)), *vc = own(c, xmalloc(NC * cache * 4));
        memcpy(kc, kc0, NC * cache * 4), memcpy(vc, vc0, NC * cache * 4);
        int32_t *lens = own(c, xmalloc(B * 4));
        float *want = own(c, xmalloc((size_t)B * H * HD * 4));
        for (int b = 0; b < B; b++) {
            /* The last row of a batch over one is unused (-1): zeros. */
            lens[b] = b == B - 1 && B > 1 ? -1 : irand(0, C - 1);
            float *o_b = want + (size_t)b * H * HD;
            if (lens[b] < 0) {
                memset(o_b, 0, (size_t)H * HD * 4);
                continue;
            }
            float *kb = kc + slots[b] * cache, *vb = vc + slots[b] * cache;
            k_attn_decode(o_b, q + (size_t)b * H * HD, k + b * row, v + b * row, &kb, &vb, C,
                          &lens[b], 1, H, KV, HD);
        }
        int vq = val(c, "q", KG_INPUT, KD_F32, 2, B, (int64_t)H * HD, 0, 0);
        int vk = val(c, "k", KG_INPUT, KD_F32, 2, B, (int64_t)row, 0, 0);
        int vv = val(c, "v", KG_INPUT, KD_F32, 2, B, (int64_t)row, 0, 0);
        int vkc = val(c, "kc", KG_HANDLE, KD_F32, 4, NC, KV, C, HD);
        int vvc = val(c, "vc", KG_HANDLE, KD_F32, 4, NC, KV, C, HD);
        int vl = val(c, "lens", KG_INPUT, KD_I32, 1, B, 0, 0, 0);
        int vs = slotted ? val(c, "slots", KG_INPUT, KD_I32, 1, B, 0, 0, 0) : -1;
        int vo = val(c, "o", KG_OUTPUT, KD_F32, 2, B, (int64_t)H * HD, 0, 0);
        int in[7] = {vq, vk, vv, vkc, vvc, vl, vs}, out[3] = {vo, vkc, vvc};
        int64_t attr[3] = {H, KV, HD};
        op(c, o, in, slotted ? 7 : 6, out, 3, attr, 3);
        input(c, q, (size_t)B * H * HD * 4), input(c, k, B * row * 4), input(c, v, B * row * 4);
        input(c, lens, B * 4);
        if (slotted)
            input(c, slots, B * 4);
        handle(c, "kc", kc0, kc, NC * cache * 4), handle(c, "vc", vc0, vc, NC * cache * 4);
        output(c, want, (size_t)B * H * HD * 4, KD_F32);
        c->tol = 1e-4f;
        break;
    }
    case KOP_SOFTMAX:
    case KOP_ARGMAX: {
        int R = irand(1, 9), N = irand(1, 3000);
        float *x = own(c, frand((size_t)R * N, 5));
        if (trial % 2) /* NaNs in: they never win */
            for (int i = 0; i < R * N; i += 7)
                x[i] = NAN;
        void *want = own(c, xmalloc((size_t)R * N * 4));
        if (o == KOP_SOFTMAX)
            k_softmax(want, x, R, N);
        else
            k_argmax(want, x, R, N);
        int vx = val(c, "x", KG_INPUT, KD_F32, 2, R, N, 0, 0);
        int vy = o == KOP_SOFTMAX ? val(c, "y", KG_OUTPUT, KD_F32, 2, R, N, 0, 0)
                                  : val(c, "y", KG_OUTPUT, KD_I32, 1, R, 0, 0, 0);
        op(c, o, &vx, 1, &vy, 1, NULL, 0);
        input(c, x, (size_t)R * N * 4);
        if (o == KOP_SOFTMAX && trial % 2) { /* NaN in, NaN out: compare the clean case only */
            for (int i = 0; i < R * N; i++)
                x[i] = urand() * 5;
            k_softmax(want, x, R, N);
        }
        output(c, want, o == KOP_SOFTMAX ? (size_t)R * N * 4 : (size_t)R * 4,
               o == KOP_SOFTMAX ? KD_F32 : KD_I32);
        break;
    }
    case KOP_SAMPLE: {
        int R = irand(1, 8), N = irand(2, 3000);
        float *x = own(c, frand((size_t)R * N, 4)), *params = own(c, xmalloc(R * 12));
        int64_t *rng = own(c, xmalloc(R * 16));
        int32_t *want = own(c, xmalloc(R * 4));
        for (int r = 0; r < R; r++) {
            params[3 * r] = r % 4 == 0 ? 0.0f : 0.5f + urand() * 0.4f + 0.4f;
            params[3 * r + 1] = (float)irand(1, 64);
            params[3 * r + 2] = r % 3 == 0 ? 1.0f : 0.9f;
            rng[2 * r] = (int64_t)(next() >> 1), rng[2 * r + 1] = irand(0, 1000);
            k_sample(want + r, x + (size_t)r * N, 1, N, params[3 * r], (int)params[3 * r + 1],
                     params[3 * r + 2], (uint64_t)rng[2 * r], (uint64_t)rng[2 * r + 1]);
        }
        int vx = val(c, "logits", KG_INPUT, KD_F32, 2, R, N, 0, 0);
        int vp = val(c, "params", KG_INPUT, KD_F32, 2, R, 3, 0, 0);
        int vr = val(c, "rng", KG_INPUT, KD_I64, 2, R, 2, 0, 0);
        int vy = val(c, "token", KG_OUTPUT, KD_I32, 1, R, 0, 0, 0);
        int in[3] = {vx, vp, vr};
        op(c, o, in, 3, &vy, 1, NULL, 0);
        input(c, x, (size_t)R * N * 4), input(c, params, R * 12), input(c, rng, R * 16);
        output(c, want, R * 4, KD_I32);
        break;
    }
    case KOP_CAST: {
        kdtype ts[3] = {KD_F32, KD_F16, KD_BF16};
        kdtype from = ts[trial % 3], to = ts[(trial + 1 + trial / 3) % 3];
        if (from == to)
            to = KD_F32 == from ? KD_F16 : KD_F32;
        int n = irand(1, 3000);
        float *f = own(c, frand(n, 100));
        void *src = own(c, xmalloc((size_t)n * 4)), *want = own(c, xmalloc((size_t)n * 4));
        k_cast(src, from, f, KD_F32, n);
        k_cast(want, to, src, from, n);
        int vx = val(c, "x", KG_INPUT, from, 1, n, 0, 0, 0);
        int vy = val(c, "y", KG_OUTPUT, to, 1, n, 0, 0, 0);
        op(c, o, &vx, 1, &vy, 1, NULL, 0);
        input(c, src, kdtype_bytes(from, n));
        output(c, want, kdtype_bytes(to, n), to == KD_F32 ? KD_F32 : to);
        c->tol = 0;
        snprintf(c->name + strlen(c->name), sizeof(c->name) - strlen(c->name), " (%s to %s)",
                 kdtype_name(from), kdtype_name(to));
        break;
    }
    case KOP_ALLREDUCE: {
        int n = irand(1, 3000);
        float *x = own(c, frand(n, 1));
        int vx = val(c, "x", KG_INPUT, KD_F32, 1, n, 0, 0, 0);
        int vy = val(c, "y", KG_OUTPUT, KD_F32, 1, n, 0, 0, 0);
        int64_t ranks = 1;
        op(c, o, &vx, 1, &vy, 1, &ranks, 1);
        input(c, x, n * 4);
        output(c, x, n * 4, KD_F32); /* one rank: the identity */
        c->tol = 0;
        break;
    }
    case KOP_IM2COL: {
        int B = irand(1, 3), T = irand(1, 40), C = irand(1, 9), K = irand(1, 4);
        int stride = irand(1, 2), pad = irand(0, 1);
        if (T + 2 * pad < K)
            T = K;
        int T2 = (T + 2 * pad - K) / stride + 1;
        float *x = own(c, frand((size_t)B * T * C, 1));
        float *want = own(c, xmalloc((size_t)B * T2 * C * K * 4));
        k_im2col(want, x, B, T, C, K, stride, pad);
        int vx = val(c, "x", KG_INPUT, KD_F32, 3, B, T, C, 0);
        int vy = val(c, "col", KG_OUTPUT, KD_F32, 3, B, T2, (int64_t)C * K, 0);
        int64_t attr[3] = {K, stride, pad};
        op(c, o, &vx, 1, &vy, 1, attr, 3);
        input(c, x, (size_t)B * T * C * 4);
        output(c, want, (size_t)B * T2 * C * K * 4, KD_F32);
        c->tol = 0;
        break;
    }
    case KOP_ATTN: {
        /* K and V hold one sequence more than the queries use. */
        int H = irand(1, 4), HD = irand(1, 40) * 2, T = irand(1, 5), S = irand(1, 60);
        int B = irand(1, 3);
        size_t row = (size_t)H * HD, nq = (size_t)B * T * row, nk = (size_t)(B + 1) * S * row;
        float *q = own(c, frand(nq, 1)), *k = own(c, frand(nk, 1)), *v = own(c, frand(nk, 1));
        float *want = own(c, xmalloc(nq * 4));
        k_attn_full_ref(want, q, k, v, B, T, S, H, HD);
        int vq = val(c, "q", KG_INPUT, KD_F32, 2, (int64_t)B * T, (int64_t)row, 0, 0);
        int vk = val(c, "k", KG_INPUT, KD_F32, 3, B + 1, S, (int64_t)row, 0);
        int vv = val(c, "v", KG_INPUT, KD_F32, 3, B + 1, S, (int64_t)row, 0);
        int vo = val(c, "o", KG_OUTPUT, KD_F32, 2, (int64_t)B * T, (int64_t)row, 0, 0);
        int in[3] = {vq, vk, vv};
        int64_t attr[3] = {H, HD, T};
        op(c, o, in, 3, &vo, 1, attr, 3);
        input(c, q, nq * 4), input(c, k, nk * 4), input(c, v, nk * 4);
        output(c, want, nq * 4, KD_F32);
        c->tol = 1e-4f;
        break;
    }
    case KOP_COUNT:
        break;
    }
    if (!c->n_out) {
        checks++;
        failures++;
        printf("FAIL %-40s no conformance case for this op (tests/gpu/check_ops.c)\n", c->name);
        kg_destroy(c->g);
        return;
    }
    finish(c, gpu);
}

int main(int argc, char **argv)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    const kx_device *gpu = kx_device_cuda(0);
    if (!gpu) {
        printf("FAIL the CUDA device could not be set up\n");
        return 1;
    }
    int trials = argc > 1 ? atoi(argv[1]) : 3;
    const char *seed = getenv("CHECK_OPS_SEED");
    if (seed)
        rs = strtoull(seed, NULL, 0);
    for (int k = 0; k < KOP_COUNT; k++)
        for (int t = 0; t < trials; t++)
            case_op((kop)k, t, gpu);
    printf("\n%d checks, %d failed\n", checks, failures);
    k_cuda_blas_shutdown();
    return failures ? 1 : 0;
}
