/* Every CUDA kernel of kernels/cuda/ against its C reference in
 * kernels/cpu/ (llm.c's habit: validated, then timed).
 *
 * Check: random inputs of several shapes, odd ones included; device outputs
 * poisoned with NaN (0xff bytes) before the launch so an element the kernel
 * never wrote fails; relative error bounds by dtype (exact for casts, Philox
 * and argmax; f32 rounding for the rest).  Time: each kernel at a large
 * size, achieved GB/s against a device-to-device cudaMemcpy measured in the
 * same run (bytes read + written, as for the copy), matmul as GFLOP/s at the
 * model's shapes against cuBLAS's own rate on a large square product.
 *
 * Writes a table to stdout and JSON to $OUT/gpu_kernels.json (else
 * $BUILD/gpu/ or build/gpu/).  Without a CUDA device it prints
 * "SKIP: no CUDA device" and exits 77 (a skip, not a pass).  Exit 1 when a check fails. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/wait.h>

#include <cuda_runtime_api.h>

#include "kernels/cpu/philox.h"
#include "kernels/exec.h"
#include "kernels/kernels.h"

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d: CUDA error: %s\n", __FILE__, __LINE__,                    \
                    cudaGetErrorString(e_));                                                  \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)
#define OK(call)                                                                              \
    do {                                                                                      \
        int r_ = (call);                                                                      \
        if (r_ != 0) {                                                                        \
            fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__, __LINE__, #call, r_);       \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

static int failures, checks;
static uint64_t rs = 0x243f6a8885a308d3ull;

static float frand(void)
{
    uint64_t z = (rs += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((z >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float *hrand(size_t n, float scale)
{
    float *p = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * scale;
    return p;
}

static void *dup_dev(const void *h, size_t bytes)
{
    void *d;
    CK(cudaMalloc(&d, bytes + 4));
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void *dev_poison(size_t bytes)
{
    void *d;
    CK(cudaMalloc(&d, bytes + 4));
    CK(cudaMemset(d, 0xff, bytes)); /* NaN as f32, -1 as i32 */
    return d;
}

static void *back(const void *d, size_t bytes)
{
    void *h = malloc(bytes + 4);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

/* Every element written and |got - ref| <= abs + rel * |ref|. */
static void cmp(const char *what, const float *got, const float *ref, size_t n, float abs_tol,
                float rel_tol)
{
    checks++;
    for (size_t i = 0; i < n; i++)
        if (isnan(got[i]) || fabsf(got[i] - ref[i]) > abs_tol + rel_tol * fabsf(ref[i])) {
            printf("FAIL %-28s element %zu: gpu %.9g, reference %.9g\n", what, i, (double)got[i],
                   (double)ref[i]);
            failures++;
            return;
        }
    printf("ok   %-28s %zu elements\n", what, n);
}

static void cmp_exact(const char *what, const void *got, const void *ref, size_t bytes)
{
    checks++;
    if (memcmp(got, ref, bytes)) {
        printf("FAIL %-28s differs from the reference\n", what);
        failures++;
    } else {
        printf("ok   %-28s %zu bytes identical\n", what, bytes);
    }
}

/* ---- checks ---------------------------------------------------------------- */

static void check_elementwise(size_t n)
{
    char name[64];
    float *a = hrand(n, 4), *b = hrand(n, 4), *ref = malloc(n * 4);
    float *da = dup_dev(a, n * 4), *db = dup_dev(b, n * 4);
    /* The broadcast add takes B's first NB elements over the first NN of A,
     * NB dividing NN. */
    size_t nb = n >= 77 ? 77 : 1, nn = n - n % nb;
    struct { const char *op; int bin; } ops[] = {{"add", 1},  {"mul", 1},      {"silu", 0},
                                                 {"gelu", 0}, {"gelu_erf", 0}, {"add_bcast", 1}};
    for (int o = 0; o < 6; o++) {
        float *dout = dev_poison(n * 4);
        switch (o) {
        case 0: k_add(ref, a, b, n); OK(k_cuda_add(dout, da, db, n, NULL)); break;
        case 1: k_mul(ref, a, b, n); OK(k_cuda_mul(dout, da, db, n, NULL)); break;
        case 2: k_silu(ref, a, n); OK(k_cuda_silu(dout, da, n, NULL)); break;
        case 3: k_gelu(ref, a, n); OK(k_cuda_gelu(dout, da, n, NULL)); break;
        case 4: k_gelu_erf(ref, a, n); OK(k_cuda_gelu_erf(dout, da, n, NULL)); break;
        default:
            k_add_bcast(ref, a, nn, b, nb);
            OK(k_cuda_add_bcast(dout, da, nn, db, nb, NULL));
            break;
        }
        size_t cn = o == 5 ? nn : n;
        float *got = back(dout, cn * 4);
        snprintf(name, sizeof(name), "%s n=%zu", ops[o].op, cn);
        cmp(name, got, ref, cn, 1e-6f, ops[o].bin ? 0 : 4e-6f);
        free(got);
        cudaFree(dout);
    }
    /* Casts: bit-exact, every pair of f32/f16/bf16. */
    kdtype ts[3] = {KD_F32, KD_F16, KD_BF16};
    for (int s = 0; s < 3; s++) {
        void *src = malloc(n * 4);
        OK(k_cast(src, ts[s], a, KD_F32, n));
        void *dsrc = dup_dev(src, kdtype_bytes(ts[s], n));
        for (int d = 0; d < 3; d++) {
            size_t ob = kdtype_bytes(ts[d], n);
            void *r = malloc(ob), *dd = dev_poison(ob);
            OK(k_cast(r, ts[d], src, ts[s], n));
            OK(k_cuda_cast(dd, ts[d], dsrc, ts[s], n, NULL));
            void *got = back(dd, ob);
            snprintf(name, sizeof(name), "cast %s->%s n=%zu", kdtype_name(ts[s]),
                     kdtype_name(ts[d]), n);
            cmp_exact(name, got, r, ob);
            free(r);
            free(got);
            cudaFree(dd);
        }
        free(src);
        cudaFree(dsrc);
    }
    /* Embedding: rows of a (as a table of n/64 rows of 64). */
    int dim = 64, vocab = (int)(n / 64), nid = 37;
    if (vocab > 0) {
        int32_t ids[37];
        for (int i = 0; i < nid; i++)
            ids[i] = (int32_t)((i * 7919) % (vocab + 2)) - 1; /* includes -1 and vocab */
        int32_t *dids = dup_dev(ids, sizeof(ids));
        float *r = malloc((size_t)nid * dim * 4), *dout = dev_poison((size_t)nid * dim * 4);
        k_embed(r, a, vocab, dim, ids, nid);
        OK(k_cuda_embed(dout, da, vocab, dim, dids, nid, NULL));
        float *got = back(dout, (size_t)nid * dim * 4);
        snprintf(name, sizeof(name), "embed vocab=%d", vocab);
        cmp_exact(name, got, r, (size_t)nid * dim * 4);
        free(r);
        free(got);
        cudaFree(dout);
        cudaFree(dids);
    }
    free(a);
    free(b);
    free(ref);
    cudaFree(da);
    cudaFree(db);
}

static void check_rows(int rows, int dim)
{
    char name[64];
    size_t n = (size_t)rows * dim;
    float *x = hrand(n, 3), *w = hrand(dim, 1), *bias = hrand(dim, 1), *ref = malloc(n * 4);
    float *dx = dup_dev(x, n * 4), *dw = dup_dev(w, dim * 4), *db = dup_dev(bias, dim * 4);
    float *dout = dev_poison(n * 4), *got;
    k_rmsnorm(ref, x, w, rows, dim, 1e-5f);
    OK(k_cuda_rmsnorm(dout, dx, dw, rows, dim, 1e-5f, NULL));
    got = back(dout, n * 4);
    snprintf(name, sizeof(name), "rmsnorm %dx%d", rows, dim);
    cmp(name, got, ref, n, 1e-5f, 1e-5f);
    free(got);
    CK(cudaMemset(dout, 0xff, n * 4));
    k_layernorm(ref, x, w, bias, rows, dim, 1e-5f);
    OK(k_cuda_layernorm(dout, dx, dw, db, rows, dim, 1e-5f, NULL));
    got = back(dout, n * 4);
    snprintf(name, sizeof(name), "layernorm %dx%d", rows, dim);
    cmp(name, got, ref, n, 1e-5f, 1e-5f);
    free(got);
    CK(cudaMemset(dout, 0xff, n * 4));
    k_softmax(ref, x, rows, dim);
    OK(k_cuda_softmax(dout, dx, rows, dim, NULL));
    got = back(dout, n * 4);
    snprintf(name, sizeof(name), "softmax %dx%d", rows, dim);
    cmp(name, got, ref, n, 1e-8f, 1e-5f);
    free(got);
    int32_t *am = malloc(rows * 4), *dam = dev_poison(rows * 4);
    k_argmax(am, x, rows, dim);
    OK(k_cuda_argmax(dam, dx, rows, dim, NULL));
    int32_t *gam = back(dam, rows * 4);
    snprintf(name, sizeof(name), "argmax %dx%d", rows, dim);
    cmp_exact(name, gam, am, rows * 4);
    /* Sampling: the same token as the reference for each row. */
    int32_t *sr = malloc(rows * 4);
    for (int k = 1; k <= 64 && k <= dim; k *= 8) {
        k_sample(sr, x, rows, dim, 0.9f, k, 0.9f, 1234, 77);
        CK(cudaMemset(dam, 0xff, rows * 4));
        OK(k_cuda_sample(dam, dx, rows, dim, 0.9f, k, 0.9f, 1234, 77, NULL));
        free(gam);
        gam = back(dam, rows * 4);
        snprintf(name, sizeof(name), "sample k=%d %dx%d", k, rows, dim);
        cmp_exact(name, gam, sr, rows * 4);
    }
    free(sr);
    free(am);
    free(gam);
    cudaFree(dam);
    free(x);
    free(w);
    free(bias);
    free(ref);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(db);
    cudaFree(dout);
}

/* NaN logits (kernels/cpu/order.h): never the argmax while a number is in
 * the row, never sampled, a row of NaNs gives 0, and a row of -inf does
 * not turn into NaN; the GPU must pick exactly the reference's tokens. */
static void check_nan_rows(void)
{
    enum { ROWS = 6, N = 3000 };
    float *x = hrand((size_t)ROWS * N, 3);
    for (int i = 0; i < N; i++) {
        if (i % 3 == 0)
            x[i] = NAN;                 /* row 0: NaN first and every third */
        x[N + i] = i == 2000 ? -INFINITY : NAN; /* row 1: one -inf among NaNs */
        x[2 * N + i] = NAN;             /* row 2: all NaN */
        x[3 * N + i] = -INFINITY;       /* row 3: all -inf */
        if (i % 7 == 1)
            x[4 * N + i] = NAN;         /* row 4: NaNs near the top */
    }
    x[4 * N + 8] = 100.0f, x[4 * N + 9] = NAN;
    float *dx = dup_dev(x, (size_t)ROWS * N * 4);
    int32_t ref[ROWS], *dout = dev_poison(ROWS * 4), *got;
    k_argmax(ref, x, ROWS, N);
    OK(k_cuda_argmax(dout, dx, ROWS, N, NULL));
    got = back(dout, ROWS * 4);
    cmp_exact("argmax with NaN rows", got, ref, sizeof(ref));
    free(got);
    for (uint64_t seed = 1; seed <= 4; seed++) {
        char name[64];
        k_sample(ref, x, ROWS, N, 1.5f, 40, 1.0f, seed, 9);
        OK(k_cuda_sample(dout, dx, ROWS, N, 1.5f, 40, 1.0f, seed, 9, NULL));
        got = back(dout, ROWS * 4);
        snprintf(name, sizeof(name), "sample with NaN rows seed %d", (int)seed);
        cmp_exact(name, got, ref, sizeof(ref));
        free(got);
    }
    free(x);
    cudaFree(dx);
    cudaFree(dout);
}

/* Per-row sampling (KOP_SAMPLE on the GPU): a row whose top_k asks for
 * more candidates than the kernel keeps (0 = the whole row of 300) raises
 * the run's flag and gets token 0; the other rows sample as the
 * reference. */
static void check_sample_rows_limit(void)
{
    enum { N = 300 };
    float *x = hrand(2 * N, 3), params[6] = {1.0f, 0.0f, 1.0f, 0.8f, 10.0f, 0.9f};
    int64_t rng[4] = {5, 1, 6, 2};
    float *dx = dup_dev(x, 2 * N * 4), *dp = dup_dev(params, sizeof(params));
    int64_t *dr = dup_dev(rng, sizeof(rng));
    int32_t *dout = dev_poison(2 * 4), *dflag = dev_poison(4), want;
    CK(cudaMemset(dflag, 0, 4));
    OK(k_cuda_sample_rows(dout, dx, dp, dr, 2, N, dflag, NULL));
    int32_t *got = back(dout, 8), *flag = back(dflag, 4);
    k_sample(&want, x + N, 1, N, params[3], (int)params[4], params[5], 6, 2);
    checks++;
    bool ok = *flag == ERANGE && got[0] == 0 && got[1] == want;
    printf("%s %-28s flag %d, tokens %d %d (reference %d)\n", ok ? "ok  " : "FAIL",
           "sample rows: top_k past 256", *flag, got[0], got[1], want);
    failures += !ok;
    free(got), free(flag), free(x);
    cudaFree(dx), cudaFree(dp), cudaFree(dr), cudaFree(dout), cudaFree(dflag);
}

/* A failed CUDA call inside a launcher is reported once: the next launch
 * must not see its error again (K_CUDA_CHECK clears it). */
static void check_error_cleared(void)
{
    float *d = dev_poison(64 * 4);
    int rc = k_cuda_copy(NULL, d, 64, NULL); /* refused by CUDA: a NULL destination */
    int rc2 = k_cuda_add(d, d, d, 64, NULL);
    CK(cudaDeviceSynchronize());
    checks++;
    bool ok = rc == -EIO && rc2 == 0;
    printf("%s %-28s failed call %d, next launch %d\n", ok ? "ok  " : "FAIL",
           "error cleared after a failure", rc, rc2);
    failures += !ok;
    cudaFree(d);
}

/* Memory from the CUDA device of executables is zero for the next kernel
 * on any of its streams, whatever order the GPU runs the streams in (the
 * zeroing must not sit unordered on the legacy stream).  Eight tries: the
 * emulator orders ready streams at random by seed. */
static void check_alloc_zeroed(void)
{
    const kx_device *gd = kx_device_cuda(0);
    void *q = NULL;
    OK(gd->queue_create(gd->dev, &q));
    int bad = 0;
    for (int t = 0; t < 8; t++) {
        float *out = dev_poison(1024 * 4);
        void *p = NULL;
        OK(gd->alloc(gd->dev, 1024 * 4, &p));
        OK(k_cuda_add(out, p, p, 1024, q));
        OK(gd->queue_sync(gd->dev, q));
        float *h = back(out, 1024 * 4);
        for (int i = 0; i < 1024; i++)
            bad += h[i] != 0.0f;
        free(h);
        gd->free(gd->dev, p);
        cudaFree(out);
    }
    gd->queue_destroy(gd->dev, q);
    checks++;
    printf("%s %-28s %d non-zero values\n", bad ? "FAIL" : "ok  ", "device alloc zeroed", bad);
    failures += bad != 0;
}

static void check_rope(int n_tok, int n_head, int hd, int mode)
{
    char name[64];
    size_t n = (size_t)n_tok * n_head * hd;
    float *x = hrand(n, 1);
    int32_t *pos = malloc(n_tok * 4);
    for (int t = 0; t < n_tok; t++)
        pos[t] = t * 997 % 8192;
    float *dx = dup_dev(x, n * 4);
    int32_t *dp = dup_dev(pos, n_tok * 4);
    k_rope(x, pos, n_tok, n_head, hd, 10000.0f, mode);
    OK(k_cuda_rope(dx, dp, n_tok, n_head, hd, 10000.0f, mode, NULL));
    float *got = back(dx, n * 4);
    snprintf(name, sizeof(name), "rope%s %dx%dx%d", mode ? "-neox" : "", n_tok, n_head, hd);
    cmp(name, got, x, n, 2e-6f, 1e-5f);
    free(got);
    free(x);
    free(pos);
    cudaFree(dx);
    cudaFree(dp);
}

static void check_qmatvec(kdtype t, int rows, int cols)
{
    char name[64];
    size_t n = (size_t)rows * cols, qb = kdtype_bytes(t, n);
    float *wf = hrand(n, 1), *x = hrand(cols, 1), *ref = malloc(rows * 4);
    void *w = malloc(qb);
    OK(k_quantize(w, t, wf, n));
    OK(k_qmatvec_ref(ref, w, t, x, rows, cols));
    void *dw = dup_dev(w, qb);
    float *dx = dup_dev(x, cols * 4), *dy = dev_poison(rows * 4);
    OK(k_cuda_qmatvec(dy, dw, t, dx, rows, cols, NULL));
    float *got = back(dy, rows * 4);
    snprintf(name, sizeof(name), "qmatvec %s %dx%d", kdtype_name(t), rows, cols);
    cmp(name, got, ref, rows, 2e-6f * cols, 1e-5f);
    free(got);
    free(wf);
    free(x);
    free(ref);
    free(w);
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dy);
}

static void check_matmul(int batch, int m, int n, int k, int shared)
{
    char name[64];
    size_t sa = (size_t)m * k, sb = shared ? 0 : (size_t)n * k, sc = (size_t)m * n;
    size_t nb = shared ? (size_t)n * k : sb * batch;
    float *a = hrand(sa * batch, 1), *b = hrand(nb, 1), *ref = malloc(sc * batch * 4);
    k_matmul_ref(ref, a, b, batch, m, n, k, sa, sb, sc);
    float *da = dup_dev(a, sa * batch * 4), *db = dup_dev(b, nb * 4);
    float *dc = dev_poison(sc * batch * 4);
    OK(k_cuda_matmul(dc, da, db, batch, m, n, k, sa, sb, sc, NULL));
    float *got = back(dc, sc * batch * 4);
    snprintf(name, sizeof(name), "matmul %dx%dx%dx%d%s", batch, m, n, k, shared ? " shared" : "");
    /* cuBLAS may use TF32 only if asked; it is not, so f32 rounding. */
    cmp(name, got, ref, sc * batch, 2e-6f * k + 1e-6f, 1e-5f);
    free(got);
    free(a);
    free(b);
    free(ref);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
}

/* Frees N host (free_all) or device (cuda_free_all) buffers. */
static void free_all(int n, ...)
{
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        free(va_arg(ap, void *));
    va_end(ap);
}

static void cuda_free_all(int n, ...)
{
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        cudaFree(va_arg(ap, void *));
    va_end(ap);
}

/* The batch-invariant product: the same bits as its C reference, close to
 * the exact product, and each row's outputs the same bits when that row is
 * multiplied alone (from another address). */
static void check_matmul_rows(int m, int n, int k)
{
    char name[64];
    float *a = hrand((size_t)m * k, 1), *w = hrand((size_t)n * k, 1);
    float *ref = malloc((size_t)m * n * 4), *exact = malloc((size_t)m * n * 4);
    k_matmul_rows_ref(ref, a, w, m, n, k);
    k_matmul_ref(exact, a, w, 1, m, n, k, 0, 0, 0);
    float *da = dup_dev(a, (size_t)m * k * 4), *dw = dup_dev(w, (size_t)n * k * 4);
    float *dy = dev_poison((size_t)m * n * 4);
    OK(k_cuda_matmul_rows(dy, da, dw, m, n, k, NULL));
    float *got = back(dy, (size_t)m * n * 4);
    snprintf(name, sizeof(name), "matmul_rows %dx%dx%d", m, n, k);
    cmp_exact(name, got, ref, (size_t)m * n * 4);
    snprintf(name, sizeof(name), "matmul_rows %dx%dx%d ~ exact", m, n, k);
    cmp(name, got, exact, (size_t)m * n, 2e-6f * k + 1e-6f, 1e-5f);
    int r = m / 2 + (m > 2); /* a row in the middle of a tile of eight when m > 8 */
    float *d1 = dup_dev(a + (size_t)r * k, (size_t)k * 4), *dy1 = dev_poison((size_t)n * 4);
    OK(k_cuda_matmul_rows(dy1, d1, dw, 1, n, k, NULL));
    float *alone = back(dy1, (size_t)n * 4);
    snprintf(name, sizeof(name), "matmul_rows row %d of %d alone", r, m);
    cmp_exact(name, alone, got + (size_t)r * n, (size_t)n * 4);
    free_all(6, alone, got, a, w, ref, exact);
    cuda_free_all(5, da, dw, dy, d1, dy1);
}

/* The batch-invariant prefill: close to the reference, and each token's
 * output the same bits as a decode step at its position over the same
 * cache (each step on its own copy of the cache the prefill left). */
static void check_attn_prefill_inv(int pos0, int n_tok, int n_head, int n_kv, int hd)
{
    char name[80];
    size_t row = (size_t)n_kv * hd, qrow = (size_t)n_head * hd;
    size_t cap = (size_t)pos0 + n_tok + 3, cache = cap * row;
    float *kc = hrand(cache, 1), *vc = hrand(cache, 1);
    float *dkc = dup_dev(kc, cache * 4), *dvc = dup_dev(vc, cache * 4);
    float *q = hrand(n_tok * qrow, 1), *k = hrand(n_tok * row, 1), *v = hrand(n_tok * row, 1);
    float *ref = malloc(n_tok * qrow * 4);
    k_attn_prefill(ref, q, k, v, kc, vc, (int)cap, pos0, n_tok, n_head, n_kv, hd);
    float *dq = dup_dev(q, n_tok * qrow * 4), *dk = dup_dev(k, n_tok * row * 4);
    float *dv = dup_dev(v, n_tok * row * 4), *dout = dev_poison(n_tok * qrow * 4);
    int32_t *pos = malloc((size_t)n_tok * 4);
    for (int t = 0; t < n_tok; t++)
        pos[t] = pos0 + t;
    int32_t *dpos = dup_dev(pos, (size_t)n_tok * 4), *dflag = dev_poison(4);
    CK(cudaMemset(dflag, 0, 4));
    OK(k_cuda_attn_prefill_at(dout, dq, dk, dv, dkc, dvc, dpos, (int)cap, dflag, n_tok, n_head,
                              n_kv, hd, 1, NULL));
    float *got = back(dout, n_tok * qrow * 4);
    snprintf(name, sizeof(name), "attn_prefill_inv %d+%d %d/%d hd=%d", pos0, n_tok, n_head, n_kv,
             hd);
    cmp(name, got, ref, n_tok * qrow, 1e-5f, 1e-4f);
    /* The decode steps: N_TOK caches, each the prefill's, token t at
     * length pos0 + t (its append writes the row the prefill wrote). */
    float *after_k = back(dkc, cache * 4), *after_v = back(dvc, cache * 4);
    float *sk = dev_poison(cache * 4 * n_tok), *sv = dev_poison(cache * 4 * n_tok);
    for (int t = 0; t < n_tok; t++) {
        CK(cudaMemcpy(sk + t * cache, after_k, cache * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(sv + t * cache, after_v, cache * 4, cudaMemcpyHostToDevice));
    }
    int32_t *dlens = dup_dev(pos, (size_t)n_tok * 4);
    float *dstep = dev_poison(n_tok * qrow * 4);
    OK(k_cuda_attn_decode_strided(dstep, dq, dk, dv, sk, sv, cache, dlens, NULL, n_tok, n_tok,
                                  n_head, n_kv, hd, (int)cap, dflag, NULL));
    float *step = back(dstep, n_tok * qrow * 4);
    snprintf(name, sizeof(name), "attn_prefill_inv %d+%d = decode steps", pos0, n_tok);
    cmp_exact(name, got, step, n_tok * qrow * 4);
    int32_t flag = -1;
    CK(cudaMemcpy(&flag, dflag, 4, cudaMemcpyDeviceToHost));
    checks++;
    if (flag != 0) {
        printf("FAIL %-28s raised flag %d\n", "attn_prefill_inv flag", flag);
        failures++;
    }
    free_all(11, step, after_k, after_v, got, kc, vc, q, k, v, ref, pos);
    cuda_free_all(12, dkc, dvc, dq, dk, dv, dout, dpos, dflag, sk, sv, dlens, dstep);
}

/* A batch of sequences of different lengths, as in k_attn_decode's test. */
static void check_decode(int batch, int n_head, int n_kv, int hd, int maxlen)
{
    char name[64];
    size_t row = (size_t)n_kv * hd, qrow = (size_t)n_head * hd;
    int cap = maxlen + 1;
    int32_t *lens = malloc(batch * 4);
    float **kc = malloc(batch * sizeof(float *)), **vc = malloc(batch * sizeof(float *));
    float **dkc = malloc(batch * sizeof(float *)), **dvc = malloc(batch * sizeof(float *));
    for (int b = 0; b < batch; b++) {
        lens[b] = (int32_t)((b * 7919 + 3) % (maxlen + 1));
        kc[b] = hrand(cap * row, 1);
        vc[b] = hrand(cap * row, 1);
        dkc[b] = dup_dev(kc[b], cap * row * 4);
        dvc[b] = dup_dev(vc[b], cap * row * 4);
    }
    float *q = hrand(batch * qrow, 1), *k = hrand(batch * row, 1), *v = hrand(batch * row, 1);
    float *ref = malloc(batch * qrow * 4);
    k_attn_decode(ref, q, k, v, kc, vc, cap, lens, batch, n_head, n_kv, hd);
    float *dq = dup_dev(q, batch * qrow * 4), *dk = dup_dev(k, batch * row * 4);
    float *dv = dup_dev(v, batch * row * 4), *dout = dev_poison(batch * qrow * 4);
    float **ddkc = dup_dev(dkc, batch * sizeof(float *)), **ddvc = dup_dev(dvc, batch * sizeof(float *));
    int32_t *dlens = dup_dev(lens, batch * 4);
    OK(k_cuda_attn_decode(dout, dq, dk, dv, ddkc, ddvc, dlens, batch, n_head, n_kv, hd, cap, NULL));
    float *got = back(dout, batch * qrow * 4);
    snprintf(name, sizeof(name), "attn_decode b=%d %d/%d hd=%d", batch, n_head, n_kv, hd);
    cmp(name, got, ref, batch * qrow, 1e-5f, 1e-4f);
    free(got);
    for (int b = 0; b < batch; b++) { /* the appended cache rows */
        float *gk = back(dkc[b], cap * row * 4);
        snprintf(name, sizeof(name), "attn_decode cache b=%d", b);
        if (b < 2)
            cmp_exact(name, gk, kc[b], cap * row * 4);
        free(gk);
        free(kc[b]);
        free(vc[b]);
        cudaFree(dkc[b]);
        cudaFree(dvc[b]);
    }
    free(lens);
    free(kc);
    free(vc);
    free(dkc);
    free(dvc);
    free(q);
    free(k);
    free(v);
    free(ref);
    cudaFree(dq);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dout);
    cudaFree(ddkc);
    cudaFree(ddvc);
    cudaFree(dlens);
}

/* One sequence whose cache already holds POS0 rows, N_TOK new tokens.  The
 * cache has a few spare rows past POS0 + N_TOK, which must stay untouched. */
static void check_attn_prefill(int pos0, int n_tok, int n_head, int n_kv, int hd)
{
    char name[64];
    size_t row = (size_t)n_kv * hd, qrow = (size_t)n_head * hd;
    size_t cap = (size_t)pos0 + n_tok + 3;
    float *kc = hrand(cap * row, 1), *vc = hrand(cap * row, 1);
    float *dkc = dup_dev(kc, cap * row * 4), *dvc = dup_dev(vc, cap * row * 4);
    float *q = hrand(n_tok * qrow, 1), *k = hrand(n_tok * row, 1), *v = hrand(n_tok * row, 1);
    float *ref = malloc(n_tok * qrow * 4);
    k_attn_prefill(ref, q, k, v, kc, vc, (int)cap, pos0, n_tok, n_head, n_kv, hd);
    float *dq = dup_dev(q, n_tok * qrow * 4), *dk = dup_dev(k, n_tok * row * 4);
    float *dv = dup_dev(v, n_tok * row * 4), *dout = dev_poison(n_tok * qrow * 4);
    OK(k_cuda_attn_prefill(dout, dq, dk, dv, dkc, dvc, (int)cap, pos0, n_tok, n_head, n_kv, hd,
                          NULL));
    float *got = back(dout, n_tok * qrow * 4);
    snprintf(name, sizeof(name), "attn_prefill %d+%d %d/%d hd=%d", pos0, n_tok, n_head, n_kv, hd);
    cmp(name, got, ref, n_tok * qrow, 1e-5f, 1e-4f);
    free(got);
    float *gk = back(dkc, cap * row * 4), *gv = back(dvc, cap * row * 4);
    snprintf(name, sizeof(name), "attn_prefill K cache %d+%d", pos0, n_tok);
    cmp_exact(name, gk, kc, cap * row * 4);
    snprintf(name, sizeof(name), "attn_prefill V cache %d+%d", pos0, n_tok);
    cmp_exact(name, gv, vc, cap * row * 4);
    free(gk);
    free(gv);
    free(kc);
    free(vc);
    free(q);
    free(k);
    free(v);
    free(ref);
    cudaFree(dkc);
    cudaFree(dvc);
    cudaFree(dq);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dout);
}

/* The columns of a convolution: a copy, so bit-exact. */
static void check_im2col(int batch, int t_in, int c, int k, int stride, int pad)
{
    char name[64];
    int t_out = (t_in + 2 * pad - k) / stride + 1;
    size_t nx = (size_t)batch * t_in * c, ncol = (size_t)batch * t_out * c * k;
    float *x = hrand(nx, 1), *ref = malloc(ncol * 4);
    k_im2col(ref, x, batch, t_in, c, k, stride, pad);
    float *dx = dup_dev(x, nx * 4), *dcol = dev_poison(ncol * 4);
    OK(k_cuda_im2col(dcol, dx, batch, t_in, c, k, stride, pad, NULL));
    float *got = back(dcol, ncol * 4);
    snprintf(name, sizeof(name), "im2col %dx%dx%d k%d s%d p%d", batch, t_in, c, k, stride, pad);
    cmp_exact(name, got, ref, ncol * 4);
    free(x), free(ref), free(got);
    cudaFree(dx), cudaFree(dcol);
}

static void check_attn_full(int nb, int t, int s, int n_head, int hd)
{
    char name[64];
    size_t row = (size_t)n_head * hd, nq = (size_t)nb * t * row, nk = (size_t)nb * s * row;
    float *q = hrand(nq, 1), *k = hrand(nk, 1), *v = hrand(nk, 1), *ref = malloc(nq * 4);
    OK(k_attn_full_ref(ref, q, k, v, nb, t, s, n_head, hd));
    float *dq = dup_dev(q, nq * 4), *dk = dup_dev(k, nk * 4), *dv = dup_dev(v, nk * 4);
    float *dout = dev_poison(nq * 4);
    OK(k_cuda_attn_full(dout, dq, dk, dv, nb, t, s, n_head, hd, NULL));
    float *got = back(dout, nq * 4);
    snprintf(name, sizeof(name), "attn_full %dx%d over %d, %d heads hd=%d", nb, t, s, n_head, hd);
    cmp(name, got, ref, nq, 1e-5f, 1e-4f);
    free(q), free(k), free(v), free(ref), free(got);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout);
}

static void check_philox(void)
{
    size_t n = 100003;
    float *ref = malloc(n * 4), *d = dev_poison(n * 4);
    for (size_t i = 0; i < n; i++)
        ref[i] = k_philox_uniform(0xdeadbeefcafeull, (1ull << 40) + i);
    OK(k_cuda_philox_uniform(d, 0xdeadbeefcafeull, 1ull << 40, n, NULL));
    float *got = back(d, n * 4);
    cmp_exact("philox uniforms", got, ref, n * 4);
    free(ref);
    free(got);
    cudaFree(d);
}

static void check_allreduce(void)
{
    size_t n = 4097;
    float *x = hrand(n, 1), *dx = dup_dev(x, n * 4);
    void *comm = NULL;
    int rc = k_cuda_comm_create(&comm, 1);
    if (rc == -ENOSYS)
        printf("note allreduce: built without NCCL, identity only\n");
    else
        OK(rc);
    OK(k_cuda_allreduce(dx, n, comm, NULL));
    float *got = back(dx, n * 4);
    cmp_exact("allreduce 1 rank", got, x, n * 4);
    k_cuda_comm_destroy(comm);
    free(got);
    free(x);
    cudaFree(dx);
}

/* Ranks of a multi-process all-reduce: this program again, run as
 * `check_kernels --allreduce-rank R N ID` (ID in hex), one process per
 * rank and device, as tensor parallelism runs.  Each rank reduces a buffer
 * of 3 MiB plus a ragged tail (several chunks) twice, the second time on a
 * non-blocking stream right after a kernel that writes its input, and
 * checks the sums.  Exit 0 when right. */
static float rank_value(int r, size_t i)
{
    return (float)((r + 1) * (int)(i % 7) + r);
}

static int allreduce_rank(int rank, int nranks, const char *hex)
{
    unsigned char id[K_CUDA_COMM_ID_BYTES] = {0};
    for (size_t i = 0; i < sizeof(id) && hex[2 * i] && hex[2 * i + 1]; i++)
        sscanf(hex + 2 * i, "%2hhx", &id[i]);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || cudaSetDevice(rank % ndev) != cudaSuccess)
        return 3;
    void *comm = NULL;
    if (k_cuda_comm_init_rank(&comm, rank % ndev, id, sizeof(id), nranks, rank))
        return 4;
    size_t n = (3u << 20) / 4 + 5;
    float *x = malloc(n * 4), *want = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        x[i] = rank_value(rank, i);
        want[i] = 0;
        for (int r = 0; r < nranks; r++)
            want[i] += rank_value(r, i);
    }
    float *dx = dup_dev(x, n * 4);
    int bad = 0;
    if (k_cuda_allreduce(dx, n, comm, NULL))
        return 5;
    float *got = back(dx, n * 4);
    bad += memcmp(got, want, n * 4) != 0;
    free(got);
    /* Again on a stream, after a kernel (x + x) that the reduce must see. */
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice));
    OK(k_cuda_add(dx, dx, dx, n, s));
    OK(k_cuda_allreduce(dx, n, comm, s));
    CK(cudaStreamSynchronize(s));
    got = back(dx, n * 4);
    for (size_t i = 0; i < n; i++)
        bad += got[i] != 2 * want[i];
    free(got);
    k_cuda_comm_destroy(comm);
    cudaStreamDestroy(s);
    cudaFree(dx);
    free(x);
    free(want);
    return bad ? 6 : 0;
}

static void check_allreduce_ranks(int nranks, int ndev, const char *self)
{
    char name[64];
    snprintf(name, sizeof(name), "allreduce %d processes", nranks);
    if (ndev < nranks) {
        printf("SKIP %-28s needs %d devices, this machine has %d\n", name, nranks, ndev);
        return;
    }
    unsigned char id[K_CUDA_COMM_ID_BYTES];
    int rc = k_cuda_comm_unique_id(id, sizeof(id));
    if (rc == -ENOSYS) {
        printf("SKIP %-28s built without NCCL\n", name);
        return;
    }
    OK(rc);
    char hex[2 * K_CUDA_COMM_ID_BYTES + 1];
    for (size_t i = 0; i < sizeof(id); i++)
        snprintf(hex + 2 * i, 3, "%02x", id[i]);
    pid_t pids[8];
    for (int r = 0; r < nranks; r++) {
        char rs_[16], ns[16];
        snprintf(rs_, sizeof(rs_), "%d", r);
        snprintf(ns, sizeof(ns), "%d", nranks);
        fflush(NULL);
        if ((pids[r] = fork()) == 0) {
            execl(self, self, "--allreduce-rank", rs_, ns, hex, (char *)NULL);
            _exit(127);
        }
    }
    int worst = 0;
    for (int r = 0; r < nranks; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        worst = code > worst ? code : worst;
    }
    checks++;
    printf("%s %-28s %s\n", worst ? "FAIL" : "ok  ", name,
           worst ? "a rank failed" : "every rank has the sums");
    failures += worst != 0;
}

/* ---- timing ------------------------------------------------------------------ */

typedef struct row {
    char op[64];
    double us;        /* per call */
    double bytes;     /* moved per call (read + written) */
    double flops;     /* per call; 0 for memory-bound rows */
} row;

static row rows_[64];
static int nrows;
static cudaEvent_t ev0, ev1;

#define TIME(label, bytes_, flops_, call)                                                     \
    do {                                                                                      \
        OK(call);                                                                             \
        CK(cudaDeviceSynchronize());                                                          \
        int it_ = 50;                                                                         \
        CK(cudaEventRecord(ev0, NULL));                                                       \
        for (int i_ = 0; i_ < it_; i_++)                                                      \
            OK(call);                                                                         \
        CK(cudaEventRecord(ev1, NULL));                                                       \
        CK(cudaEventSynchronize(ev1));                                                        \
        float ms_;                                                                            \
        CK(cudaEventElapsedTime(&ms_, ev0, ev1));                                             \
        row *r_ = &rows_[nrows++];                                                            \
        snprintf(r_->op, sizeof(r_->op), "%s", label);                                        \
        r_->us = ms_ * 1000.0 / it_;                                                          \
        r_->bytes = (bytes_);                                                                 \
        r_->flops = (flops_);                                                                 \
    } while (0)

static void bench(FILE *json, const char *devname)
{
    CK(cudaEventCreate(&ev0));
    CK(cudaEventCreate(&ev1));
    size_t n = 64u << 20; /* 64 Mi floats: 256 MiB per operand */
    float *a, *b, *c;
    CK(cudaMalloc((void **)&a, n * 4));
    CK(cudaMalloc((void **)&b, n * 4));
    CK(cudaMalloc((void **)&c, n * 4));
    CK(cudaMemset(a, 0, n * 4));
    CK(cudaMemset(b, 0, n * 4));
    TIME("memcpy d2d", 2.0 * n * 4, 0, cudaMemcpyAsync(c, a, n * 4, cudaMemcpyDeviceToDevice, NULL));
    double copy_gbs = rows_[0].bytes / rows_[0].us / 1e3;
    TIME("add", 3.0 * n * 4, 0, k_cuda_add(c, a, b, n, NULL));
    TIME("mul", 3.0 * n * 4, 0, k_cuda_mul(c, a, b, n, NULL));
    TIME("silu", 2.0 * n * 4, 0, k_cuda_silu(c, a, n, NULL));
    TIME("gelu", 2.0 * n * 4, 0, k_cuda_gelu(c, a, n, NULL));
    TIME("cast f32->f16", 6.0 * n, 0, k_cuda_cast(c, KD_F16, a, KD_F32, n, NULL));
    TIME("cast bf16->f32", 6.0 * n, 0, k_cuda_cast(c, KD_F32, a, KD_BF16, n, NULL));
    int rows = 16384, dim = 4096;
    TIME("rmsnorm 16384x4096", 2.0 * rows * dim * 4, 0, k_cuda_rmsnorm(c, a, b, rows, dim, 1e-5f, NULL));
    TIME("layernorm 16384x4096", 2.0 * rows * dim * 4, 0,
         k_cuda_layernorm(c, a, b, b, rows, dim, 1e-5f, NULL));
    TIME("softmax 1024x49152", 2.0 * 1024 * 49152 * 4, 0, k_cuda_softmax(c, a, 1024, 49152, NULL));
    TIME("argmax 1024x49152", 1.0 * 1024 * 49152 * 4, 0, k_cuda_argmax((int32_t *)c, a, 1024, 49152, NULL));
    CK(cudaMemset(c, 0, 1 << 20));
    TIME("rope 8192x32x128", 2.0 * 8192 * 32 * 128 * 4, 0,
         k_cuda_rope(a, (const int32_t *)c, 8192, 32, 128, 10000.0f, K_ROPE_NORMAL, NULL));
    kdtype qt[3] = {KD_Q8_0, KD_Q4_0, KD_Q4_1};
    for (int t = 0; t < 3; t++) {
        char lab[64];
        int qr = 49152, qc = 4096; /* an output projection's shape */
        CK(cudaMemset(a, 0, kdtype_bytes(qt[t], (size_t)qr * qc)));
        snprintf(lab, sizeof(lab), "qmatvec %s %dx%d", kdtype_name(qt[t]), qr, qc);
        TIME(lab, (double)kdtype_bytes(qt[t], (size_t)qr * qc) + qc * 4.0 + qr * 4.0,
             2.0 * qr * qc, k_cuda_qmatvec(c, a, qt[t], b, qr, qc, NULL));
    }
    TIME("sample k=40 16x49152", 40.0 * 16 * 49152 * 4, 0,
         k_cuda_sample((int32_t *)c, a, 16, 49152, 0.8f, 40, 0.95f, 1, 2, NULL));
    {
        /* Decode attention: 16 sequences of 2048 tokens, SmolLM2's heads. */
        int B = 16, NH = 9, NKV = 3, HD = 64, L = 2048;
        float *kc[16], *vc[16];
        int32_t lens[16];
        size_t per = (size_t)(L + 1) * NKV * HD;
        for (int i = 0; i < B; i++) {
            kc[i] = a + 2 * i * per;
            vc[i] = a + (2 * i + 1) * per;
            lens[i] = L - 1;
        }
        float **dkc = dup_dev(kc, sizeof(kc)), **dvc = dup_dev(vc, sizeof(vc));
        int32_t *dl = dup_dev(lens, sizeof(lens));
        TIME("attn_decode 16x2048 9/3x64", 2.0 * B * L * NKV * HD * 4, 4.0 * B * NH * L * HD,
             k_cuda_attn_decode(c, b, b, b, dkc, dvc, dl, B, NH, NKV, HD, L + 1, NULL));
        cudaFree(dkc);
        cudaFree(dvc);
        cudaFree(dl);
    }
    {
        /* Prefill attention: 512 tokens from an empty cache, SmolLM2's heads.
         * Bytes: Q read, out written, K/V read and written to the caches,
         * then read back once (more in fact: every block rereads its
         * context, mostly from L2).  Flops: 4 per (query head, key, dim)
         * over the causal triangle, T(T+1)/2 keys per head. */
        int T = 512, NH = 9, NKV = 3, HD = 64;
        size_t per = (size_t)T * NKV * HD;
        TIME("attn_prefill 512 9/3x64", 4.0 * (2.0 * T * NH * HD + 6.0 * per),
             2.0 * NH * HD * T * (T + 1.0),
             k_cuda_attn_prefill(c, b, b, b, a, a + per, T, 0, T, NH, NKV, HD, NULL));
    }
    int mm_first = nrows;
    TIME("matmul 1x8192x8192x8192", 3.0 * 8192 * 8192 * 4, 2.0 * 8192 * 8192 * 8192,
         k_cuda_matmul(c, a, b, 1, 8192, 8192, 8192, 0, 0, 0, NULL));
    TIME("matmul 16x1536x576 (decode b16)", 4.0 * (16 * 576 + 1536 * 576 + 16 * 1536),
         2.0 * 16 * 1536 * 576, k_cuda_matmul(c, a, b, 1, 16, 1536, 576, 0, 0, 0, NULL));
    TIME("matmul 512x1536x576 (prefill)", 4.0 * (512 * 576 + 1536 * 576 + 512 * 1536),
         2.0 * 512 * 1536 * 576, k_cuda_matmul(c, a, b, 1, 512, 1536, 576, 0, 0, 0, NULL));
    TIME("matmul 512x49152x576 (lm head)", 4.0 * (512 * 576 + 49152.0 * 576 + 512 * 49152.0),
         2.0 * 512 * 49152.0 * 576, k_cuda_matmul(c, a, b, 1, 512, 49152, 576, 0, 0, 0, NULL));
    double peak = rows_[mm_first].flops / rows_[mm_first].us / 1e3;

    printf("\nGPU: %s (CUDA kernels; figures from this device only)\n", devname);
    printf("%-34s %10s %10s %8s %10s %8s\n", "op", "us/call", "GB/s", "%copy", "GFLOP/s", "%sgemm");
    fprintf(json, "{\"device\": \"%s\", \"copy_gbs\": %.1f, \"sgemm_gflops\": %.1f, \"ops\": [",
            devname, copy_gbs, peak);
    for (int i = 0; i < nrows; i++) {
        row *r = &rows_[i];
        double gbs = r->bytes / r->us / 1e3, gfl = r->flops / r->us / 1e3;
        printf("%-34s %10.2f %10.1f %7.1f%% %10.1f %7.1f%%\n", r->op, r->us, gbs,
               100 * gbs / copy_gbs, gfl, r->flops ? 100 * gfl / peak : 0.0);
        fprintf(json,
                "%s\n  {\"op\": \"%s\", \"us\": %.3f, \"gbs\": %.2f, \"pct_copy\": %.1f, "
                "\"gflops\": %.2f, \"pct_sgemm\": %.1f}",
                i ? "," : "", r->op, r->us, gbs, 100 * gbs / copy_gbs, gfl,
                r->flops ? 100 * gfl / peak : 0.0);
    }
    fprintf(json, "\n]}\n");
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--allreduce-rank"))
        return allreduce_rank(atoi(argv[2]), atoi(argv[3]), argv[4]);
    /* --no-timing: the checks alone (under compute-sanitizer, whose
     * instrumentation would make the timings meaningless and slow). */
    bool timing = !(argc == 2 && !strcmp(argv[1], "--no-timing"));
    if (argc > 1 && timing) {
        fprintf(stderr, "usage: check_kernels [--no-timing]\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s\n", prop.name);

    size_t sizes[] = {1, 31, 1000, 65536 + 7, 1 << 20};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        check_elementwise(sizes[i]);
    int rs_[][2] = {{1, 1}, {3, 576}, {7, 1000}, {4, 49152}, {33, 1536}};
    for (size_t i = 0; i < sizeof(rs_) / sizeof(rs_[0]); i++)
        check_rows(rs_[i][0], rs_[i][1]);
    check_nan_rows();
    check_error_cleared();
    check_sample_rows_limit();
    check_alloc_zeroed();
    check_rope(1, 1, 2, K_ROPE_NORMAL);
    check_rope(7, 9, 64, K_ROPE_NORMAL);
    check_rope(5, 3, 64, K_ROPE_NEOX);
    check_rope(33, 32, 128, K_ROPE_NORMAL);
    kdtype qt[3] = {KD_Q8_0, KD_Q4_0, KD_Q4_1};
    for (int t = 0; t < 3; t++) {
        check_qmatvec(qt[t], 1, 32);
        check_qmatvec(qt[t], 37, 576);
        check_qmatvec(qt[t], 1536, 576);
        check_qmatvec(qt[t], 100, 4096);
    }
    check_matmul(1, 1, 1, 1, 0);
    check_matmul(3, 17, 33, 65, 0);
    check_matmul(4, 16, 1536, 576, 1);
    check_matmul(1, 128, 576, 576, 0);
    check_matmul_rows(1, 1, 1);
    check_matmul_rows(13, 37, 65);
    check_matmul_rows(16, 576, 576);
    check_matmul_rows(5, 1000, 1536);
    check_decode(1, 1, 1, 16, 0);
    check_decode(5, 9, 3, 64, 40);
    check_decode(16, 9, 3, 64, 700);
    check_decode(3, 32, 8, 128, 20000); /* > 48 KiB of scores: the opt-in path */
    /* Exactly 48 KiB of dynamic scores: with the kernel's static shared
     * memory that is over the limit without the opt-in. */
    check_decode(2, 9, 3, 64, 12223);
    checks++;
    if (k_cuda_attn_decode(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 0, 3, 64, 16, NULL) !=
            -EINVAL ||
        k_cuda_attn_decode(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, -3, 3, 64, 16, NULL) !=
            -EINVAL ||
        /* Dynamic scores of exactly the opt-in maximum leave no room for the
         * static part: refused, not launched. */
        k_cuda_attn_decode(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 9, 3, 64,
                           232448 / 4 - 64, NULL) != -EINVAL) {
        printf("FAIL %-28s accepted a bad argument\n", "attn_decode arguments");
        failures++;
    } else {
        printf("ok   %-28s n_head 0 and -3, scores at the opt-in limit\n", "attn_decode arguments");
    }
    check_attn_prefill(0, 1, 4, 4, 32);
    check_attn_prefill(0, 7, 9, 3, 64);
    check_attn_prefill(5, 33, 9, 3, 64);
    check_attn_prefill(0, 200, 8, 2, 128);
    check_attn_prefill(300, 200, 9, 3, 64);  /* several key tiles, a partial last one */
    check_attn_prefill(130, 33, 4, 4, 32);
    check_attn_prefill(17, 7, 6, 2, 80);     /* a head dimension that is no power of two */
    check_attn_prefill(40, 33, 8, 2, 256);   /* the largest head dimension: two per thread */
    check_attn_prefill(20000, 7, 8, 2, 128); /* a context no shared memory could hold */
    check_attn_prefill_inv(0, 1, 4, 4, 32);
    check_attn_prefill_inv(5, 9, 9, 3, 64);
    check_attn_prefill_inv(300, 7, 6, 2, 80);
    OK(k_cuda_attn_prefill(NULL, NULL, NULL, NULL, NULL, NULL, 0, 0, 0, 9, 3, 64, NULL));
    checks++;
    if (k_cuda_attn_prefill(NULL, NULL, NULL, NULL, NULL, NULL, 1, 0, 1, 9, 3, 512, NULL) != -EINVAL ||
        k_cuda_attn_prefill(NULL, NULL, NULL, NULL, NULL, NULL, 1, 0, 1, 8, 3, 64, NULL) != -EINVAL ||
        /* Tokens past the capacity. */
        k_cuda_attn_prefill(NULL, NULL, NULL, NULL, NULL, NULL, 4, 2, 3, 9, 3, 64, NULL) != -EINVAL) {
        printf("FAIL %-28s accepted a bad argument\n", "attn_prefill arguments");
        failures++;
    } else {
        printf("ok   %-28s n_tok=0, hd=512, 8/3, past the capacity\n", "attn_prefill arguments");
    }
    check_im2col(1, 1, 1, 1, 1, 0);
    check_im2col(2, 30, 8, 3, 1, 1);
    check_im2col(3, 31, 5, 3, 2, 1);   /* an odd length at stride 2 */
    check_im2col(1, 300, 80, 3, 1, 1); /* Whisper's first convolution, shortened */
    check_attn_full(1, 1, 1, 1, 8);
    check_attn_full(2, 1, 150, 8, 64);   /* a cross-attention step */
    check_attn_full(3, 4, 300, 2, 64);   /* several queries, several key tiles */
    check_attn_full(1, 37, 37, 6, 80);   /* self-attention, hd no power of two */
    check_attn_full(2, 3, 130, 2, 256);  /* the largest head dimension */
    checks++;
    if (k_cuda_attn_full(NULL, NULL, NULL, NULL, 1, 1, 1, 1, 512, NULL) != -EINVAL ||
        k_cuda_attn_full(NULL, NULL, NULL, NULL, 1, 1, 0, 1, 64, NULL) != -EINVAL ||
        k_cuda_im2col(NULL, NULL, 1, 1, 1, 5, 1, 1, NULL) != -EINVAL ||
        k_cuda_add_bcast(NULL, NULL, 10, NULL, 3, NULL) != -EINVAL) {
        printf("FAIL %-28s accepted a bad argument\n", "attn_full/im2col arguments");
        failures++;
    } else {
        printf("ok   %-28s hd=512, no keys, a window past the input, 3 into 10\n",
               "attn_full/im2col arguments");
    }
    check_philox();
    check_allreduce();
    check_allreduce_ranks(2, ndev, "/proc/self/exe");
    check_allreduce_ranks(3, ndev, "/proc/self/exe");
    printf("\n%d checks, %d failed\n", checks, failures);
    if (failures)
        return 1;
    if (!timing) {
        printf("timings skipped: --no-timing\n");
        return 0;
    }
#ifdef CUDAEMU
    /* The CUDA emulator's timings mean nothing: check only. */
    printf("timings skipped: the device is emulated (cudaemu)\n");
    return 0;
#endif

    const char *out = getenv("OUT");
    char path[600];
    if (out && *out) {
        snprintf(path, sizeof(path), "%s/gpu_kernels.json", out);
    } else {
        const char *bd = getenv("BUILD");
        snprintf(path, sizeof(path), "%s/gpu", bd && *bd ? bd : "build");
        mkdir(path, 0755);
        strncat(path, "/gpu_kernels.json", sizeof(path) - strlen(path) - 1);
    }
    FILE *json = fopen(path, "w");
    if (!json) {
        fprintf(stderr, "cannot write %s\n", path);
        return 2;
    }
    bench(json, prop.name);
    fclose(json);
    printf("wrote %s\n", path);
    k_cuda_blas_shutdown();
    return 0;
}
