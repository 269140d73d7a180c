/* Executables on the CUDA device (kernels/exec.c with kx_device_cuda and
 * kt_cuda_ops), checked against the same graphs on the CPU device, then
 * timed.
 *
 * Checks (the tiny Llama of tests/unit/test_optable.c, and SmolLM2-135M's
 * shapes with random f32 weights):
 *   - prefill logits at a bucketed extent equal the CPU's (relative bound);
 *   - decode steps after the prefill (caches copied into the decode
 *     executable) equal the CPU's, with and without CUDA-graph replay, and
 *     on two compute streams;
 *   - a position past the cache fails the run (the device flag), and the
 *     next run succeeds.
 * Timings (SmolLM2 shapes, batch 1 and 16, context 512): one decode step
 * enqueued op by op against the same step replayed as a captured CUDA graph;
 * the scheduler's predicted makespan on the h100 profile against the
 * measured one, serial and multi-stream.
 *
 * Table on stdout, JSON in $OUT/gpu_exec.json (else $BUILD/gpu/ or
 * build/gpu/).  Without a CUDA device: "SKIP: no CUDA device", exit 77 (a skip, not a
 * pass).
 * Exit 1 when a check fails. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "kernels/exec.h"
#include "kernels/kernels.h"
#include "kernels/optable.h"
#include "backends/transformer/model.h"

static int failures, checks;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rs = 12345;

static float urand(void)
{
    uint64_t z = (rs += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((z >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "%s: %s (%d)\n", what, bt_strerror(rc), rc);
    exit(2);
}

/* The values of parameter VAL (VAL->bytes / 4 floats, malloc'd) from the
 * seeded stream: norms near 1, the rest near 0.  Called for the
 * parameters in graph order after `rs = seed`, it gives every executable of
 * one seed the same weights. */
static float *weight_values(const kg_value *val)
{
    size_t n = val->bytes / 4;
    float *w = malloc(val->bytes);
    int norm = strstr(val->name, "norm") != NULL;
    for (size_t i = 0; i < n; i++)
        w[i] = (norm ? 1.0f : 0.0f) + 0.1f * urand();
    return w;
}

/* Compiles G on DEV (NULL: CPU) and sets every parameter from a stream
 * seeded by SEED, so the CPU and CUDA executables hold the same weights. */
static kx_exec *build(const kg_graph *g, const kx_device *dev, int n_compute, bool graphs,
                      uint64_t seed)
{
    char err[256];
    kx_op_table t;
    if (dev) {
        if (kt_cuda_check(g, err, sizeof(err)))
            fprintf(stderr, "kt_cuda_check: %s\n", err), exit(2);
        kt_cuda_ops(&t);
    } else {
        if (kt_cpu_check(g, err, sizeof(err)))
            fprintf(stderr, "kt_cpu_check: %s\n", err), exit(2);
        kt_cpu_ops(&t);
    }
    kx_options o = {.n_compute = n_compute, .device = dev, .graphs = graphs,
                    .profile = ks_profile_builtin(dev ? "h100" : "cpu")};
    /* With more than one stream, equal costs of a millisecond per op make
     * the parallel branches (the Q, K and V products, the gate and up
     * products) worth overlapping, so the multi-stream schedule is used and
     * its event waits are what keeps the results right.  The tiny model's
     * real costs are too small for the scheduler to split it. */
    double *cost = NULL;
    if (n_compute > 1) {
        cost = malloc(g->n_ops * sizeof(double));
        for (size_t i = 0; i < g->n_ops; i++)
            cost[i] = 1e-3;
        o.cost_s = cost;
    }
    kx_exec *x;
    int rc = kx_compile(g, &t, &o, &x);
    free(cost);
    if (rc)
        die("kx_compile", rc);
    if (n_compute > 1) {
        const ks_schedule *sc = kx_schedule(x);
        checks++;
        bool ok = sc->multi && sc->n_events > 0;
        printf("%s %-44s %s, %zu events\n", ok ? "ok  " : "FAIL", "2 streams overlap",
               sc->multi ? "multi-stream" : "serial", sc->n_events);
        failures += !ok;
    }
    rs = seed;
    for (size_t v = 0; v < g->n_values; v++) {
        const kg_value *val = &g->values[v];
        if (val->kind != KG_PARAM)
            continue;
        float *w = weight_values(val);
        if ((rc = kx_param_set(x, val->name, KD_F32, w, val->bytes)))
            die("kx_param_set", rc);
        free(w);
    }
    return x;
}

/* Output 0 of X in host memory (N floats). */
static void logits_of(kx_exec *x, bool on_gpu, float *out, size_t n)
{
    const void *p = kx_output(x, 0, NULL);
    if (on_gpu)
        cudaMemcpy(out, p, n * 4, cudaMemcpyDeviceToHost);
    else
        memcpy(out, p, n * 4);
}

static void cmp(const char *what, const float *got, const float *ref, size_t n, float rel)
{
    checks++;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / (1.0 + fabs((double)ref[i]));
        if (isnan(got[i]) || e > rel) {
            printf("FAIL %-44s element %zu: gpu %.7g, cpu %.7g\n", what, i, (double)got[i],
                   (double)ref[i]);
            failures++;
            return;
        }
        worst = e > worst ? e : worst;
    }
    printf("ok   %-44s %zu values, worst relative error %.2e\n", what, n, worst);
}

static void run(kx_exec *x, const char *what)
{
    int rc = kx_run(x);
    if (rc)
        die(what, rc);
}

/* Copies every cache handle of FROM (batch 1) into slot B of TO, host or
 * device memory alike (unified addressing). */
static void copy_caches(kx_exec *to, int b, kx_exec *from, const ktf_shape *s, int ctx)
{
    char nm[32];
    size_t per = (size_t)ctx * s->kv_heads * s->head_dim * 4;
    for (int l = 0; l < s->layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            snprintf(nm, sizeof(nm), kv ? "v_cache.%d" : "k_cache.%d", l);
            char *dst = kx_handle(to, nm, NULL);
            const char *src = kx_handle(from, nm, NULL);
            cudaMemcpy(dst + (size_t)b * per, src, per, cudaMemcpyDefault);
        }
}

static void bind3(kx_exec *x, const int32_t *a, const int32_t *b, const int32_t *c, int n,
                  int n3)
{
    if (kx_input_bind(x, 0, a, (size_t)n * 4) || kx_input_bind(x, 1, b, (size_t)n * 4) ||
        kx_input_bind(x, 2, c, (size_t)n3 * 4))
        die("kx_input_bind", -1);
}

/* A decode step's inputs: BIND3's, and row b on cache slot b. */
static void bind_decode(kx_exec *x, const int32_t *a, const int32_t *b, const int32_t *c, int n)
{
    static int32_t identity[64];
    if (n > 64)
        die("bind_decode: more than 64 rows", -1);
    for (int i = 0; i < n; i++)
        identity[i] = i;
    bind3(x, a, b, c, n, n);
    if (kx_input_bind(x, 3, identity, (size_t)n * 4))
        die("kx_input_bind", -1);
}

/* Prefill then three decode steps on the CPU and on the GPU (GRAPHS,
 * N_COMPUTE streams), comparing the logits at every step. */
static void check_model(const char *name, const ktf_shape *s, int seq, int ctx, bool graphs,
                        int n_compute, float rel)
{
    const kx_device *gpu = kx_device_cuda(0);
    kg_graph *pg = ktf_build_prefill(s, 1, seq, ctx), *dg = ktf_build_decode(s, 1, ctx);
    kx_exec *pc = build(pg, NULL, 1, false, 7), *pd = build(pg, gpu, n_compute, graphs, 7);
    kx_exec *dc = build(dg, NULL, 1, false, 7), *dd = build(dg, gpu, n_compute, graphs, 7);
    size_t V = (size_t)s->vocab;
    float *a = malloc(V * 4), *b = malloc(V * 4);
    int32_t tok[64], pos[64], last;
    for (int i = 0; i < seq; i++)
        tok[i] = (int32_t)((i * 7919 + 13) % s->vocab), pos[i] = i;
    int n = seq - 2;  /* below the compiled extent */
    last = n - 1;
    char what[96];
    kx_exec *ps[2] = {pc, pd};
    for (int k = 0; k < 2; k++) {
        kx_extent_set(ps[k], n);
        bind3(ps[k], tok, pos, &last, n, 1);
        run(ps[k], "prefill");
    }
    logits_of(pc, false, a, V);
    logits_of(pd, true, b, V);
    snprintf(what, sizeof(what), "%s prefill %d tok%s%s", name, n, graphs ? " graph" : "",
             n_compute > 1 ? " 2 streams" : "");
    cmp(what, b, a, V, rel);
    copy_caches(dc, 0, pc, s, ctx);
    copy_caches(dd, 0, pd, s, ctx);
    for (int step = 0; step < 3; step++) {
        int32_t t1 = tok[n + step < seq ? n + step : 0], p1 = n + step, l1 = n + step;
        bind_decode(dc, &t1, &p1, &l1, 1);
        bind_decode(dd, &t1, &p1, &l1, 1);
        run(dc, "decode cpu");
        run(dd, "decode gpu");
        logits_of(dc, false, a, V);
        logits_of(dd, true, b, V);
        snprintf(what, sizeof(what), "%s decode step %d%s%s", name, step, graphs ? " graph" : "",
                 n_compute > 1 ? " 2 streams" : "");
        cmp(what, b, a, V, rel);
    }
    if (graphs) {
        checks++;
        bool ok = kx_graph_count(dd) == 1 && kx_graph_replays(dd) == 2;
        printf("%s %-44s %d graph(s), %llu replays\n", ok ? "ok  " : "FAIL", "decode graph reuse",
               kx_graph_count(dd), (unsigned long long)kx_graph_replays(dd));
        failures += !ok;
    }
    /* A position past the cache: the run fails through the device flag. */
    int32_t t1 = 1, p1 = ctx, l1 = ctx;
    bind_decode(dd, &t1, &p1, &l1, 1);
    int rc = kx_run(dd), st = 0;
    kx_op_error(dd, &st);
    l1 = p1 = 0;
    int rc2 = kx_run(dd);
    checks++;
    bool ok = rc == BT_EOP && st < 0 && rc2 == 0;
    printf("%s %-44s run %d (status %d), next run %d\n", ok ? "ok  " : "FAIL",
           "position past the cache fails the run", rc, st, rc2);
    failures += !ok;
    free(a);
    free(b);
    kx_destroy(pc), kx_destroy(pd), kx_destroy(dc), kx_destroy(dd);
    kg_destroy(pg), kg_destroy(dg);
}

/* The weights of a model on the GPU once, for every executable of it:
 * each parameter is uploaded once and both the prefill and the decode
 * executable borrow it (kx_param_borrow), which frees their own copies.
 * Checked three ways: the logits still equal the CPU's; zeroing the
 * uploaded output norm in place zeroes both executables' logits (they
 * read the upload itself); a host pointer is refused.  On the emulator
 * the device bytes in use are counted too. */
static void check_shared_weights(const ktf_shape *s, int seq, int ctx)
{
    const kx_device *gpu = kx_device_cuda(0);
    kg_graph *pg = ktf_build_prefill(s, 1, seq, ctx), *dg = ktf_build_decode(s, 1, ctx);
    kx_exec *pc = build(pg, NULL, 1, false, 7), *pd = build(pg, gpu, 1, false, 7);
    kx_exec *dd = build(dg, gpu, 1, false, 7);
#ifdef CUDAEMU
    size_t before = cudaemu_bytes_allocated();
#endif
    void *uploads[256];
    int nu = 0;
    size_t total = 0;
    float *norm_w = NULL;
    size_t norm_bytes = 0;
    rs = 7; /* the weights build() made, in its order */
    bool refused = false;
    for (size_t v = 0; v < pg->n_values && nu < 256; v++) {
        const kg_value *val = &pg->values[v];
        if (val->kind != KG_PARAM)
            continue;
        float *w = weight_values(val);
        if (!refused) /* a host pointer on the GPU: refused */
            refused = kx_param_borrow(pd, val->name, KD_F32, w, val->bytes) == BT_EINVAL;
        void *d = NULL;
        if (cudaMalloc(&d, val->bytes) != cudaSuccess ||
            cudaMemcpy(d, w, val->bytes, cudaMemcpyHostToDevice) != cudaSuccess)
            die("upload", -1);
        free(w);
        uploads[nu++] = d;
        total += val->bytes;
        int rc = kx_param_borrow(pd, val->name, KD_F32, d, val->bytes);
        if (!rc && kg_value_find(dg, val->name) >= 0)
            rc = kx_param_borrow(dd, val->name, KD_F32, d, val->bytes);
        if (rc)
            die("kx_param_borrow", rc);
        if (!strcmp(val->name, "output_norm"))
            norm_w = d, norm_bytes = val->bytes;
    }
    checks++;
    printf("%s %-44s %s\n", refused ? "ok  " : "FAIL", "borrow refuses host memory on the GPU",
           refused ? "BT_EINVAL" : "accepted");
    failures += !refused;
#ifdef CUDAEMU
    /* Each executable freed its own copy of every weight; the uploads are
     * the only copy left. */
    size_t after = cudaemu_bytes_allocated();
    checks++;
    bool once = after + total == before;
    printf("%s %-44s %zu bytes of weights, device bytes %zu -> %zu\n", once ? "ok  " : "FAIL",
           "weights resident once on the GPU", total, before, after);
    failures += !once;
#endif
    size_t V = (size_t)s->vocab;
    float *a = malloc(V * 4), *b = malloc(V * 4);
    int32_t tok[64], pos[64], last = seq - 1;
    for (int i = 0; i < seq; i++)
        tok[i] = (int32_t)((i * 31 + 5) % s->vocab), pos[i] = i;
    kx_exec *ps[2] = {pc, pd};
    for (int k = 0; k < 2; k++) {
        bind3(ps[k], tok, pos, &last, seq, 1);
        run(ps[k], "prefill");
    }
    logits_of(pc, false, a, V);
    logits_of(pd, true, b, V);
    cmp("shared weights prefill", b, a, V, 2e-4f);
    /* Zero the one upload of the output norm: both executables must see it. */
    if (!norm_w || cudaMemset(norm_w, 0, norm_bytes) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
        die("output_norm", -1);
    run(pd, "prefill");
    int32_t t1 = 3, p1 = 0, l1 = 0;
    bind_decode(dd, &t1, &p1, &l1, 1);
    run(dd, "decode");
    int nonzero = 0;
    logits_of(pd, true, b, V);
    for (size_t i = 0; i < V; i++)
        nonzero += b[i] != 0.0f;
    logits_of(dd, true, b, V);
    for (size_t i = 0; i < V; i++)
        nonzero += b[i] != 0.0f;
    checks++;
    printf("%s %-44s %d non-zero logits\n", nonzero ? "FAIL" : "ok  ",
           "both executables read the one upload", nonzero);
    failures += nonzero != 0;
    free(a);
    free(b);
    kx_destroy(pc), kx_destroy(pd), kx_destroy(dd);
    for (int i = 0; i < nu; i++)
        cudaFree(uploads[i]);
    kg_destroy(pg), kg_destroy(dg);
}

/* Microseconds per decode step of X over ITERS runs (after a warm-up). */
static double time_steps(kx_exec *x, int iters)
{
    for (int i = 0; i < 3; i++)
        run(x, "warm-up");
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        run(x, "timed");
    return (now_s() - t0) / iters * 1e6;
}

static void bench(FILE *json, const char *devname)
{
    const kx_device *gpu = kx_device_cuda(0);
    ktf_shape s = ktf_shape_smollm2_135m();
    s.weight = KD_F32, s.cache = KD_F32;
    int ctx = 512;
    printf("\nGPU: %s; SmolLM2-135M shapes, f32 weights, context %d\n", devname, ctx);
    printf("%-30s %12s %12s %12s %12s %8s\n", "decode step", "enqueue us", "graph us",
           "predicted us", "streams", "speedup");
    fprintf(json, "{\"device\": \"%s\", \"decode\": [", devname);
    int batches[2] = {1, 16};
    for (int bi = 0; bi < 2; bi++) {
        int B = batches[bi];
        kg_graph *g = ktf_build_decode(&s, B, ctx);
        int32_t tok[16], pos[16], lens[16];
        for (int i = 0; i < B; i++)
            tok[i] = i * 11, pos[i] = lens[i] = 100 + 20 * i;
        for (int nc = 1; nc <= 2; nc++) {
            kx_exec *e = build(g, gpu, nc, false, 3), *r = build(g, gpu, nc, true, 3);
            bind_decode(e, tok, pos, lens, B);
            bind_decode(r, tok, pos, lens, B);
            double te = time_steps(e, 50), tr = time_steps(r, 200);
            const ks_schedule *sc = kx_schedule(r);
            double pred = (sc->multi ? sc->multi_s : sc->serial_s) * 1e6;
            printf("batch %-2d %-21s %12.1f %12.1f %12.1f %12d %7.2fx\n", B,
                   nc > 1 ? "2 compute streams" : "1 stream", te, tr, pred,
                   sc->multi ? sc->n_streams : 1, te / tr);
            fprintf(json,
                    "%s\n  {\"batch\": %d, \"compute_streams\": %d, \"multi\": %s, "
                    "\"enqueue_us\": %.2f, \"graph_us\": %.2f, \"predicted_us\": %.2f}",
                    bi || nc > 1 ? "," : "", B, nc, sc->multi ? "true" : "false", te, tr, pred);
            kx_destroy(e);
            kx_destroy(r);
        }
        kg_destroy(g);
    }
    fprintf(json, "\n]}\n");
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("device: %s\n", prop.name);
    ktf_shape tiny = {64, 2, 4, 2, 16, 96, 50, KD_F32, KD_F32, KD_F32, 1e-5f, 10000.0f,
                      K_ROPE_NORMAL};
    /* Graphs first: the process's first matrix product then happens inside
     * a stream capture, which must not be where cuBLAS gets its handle. */
    check_model("tiny", &tiny, 12, 24, true, 1, 2e-4f);
    check_model("tiny", &tiny, 12, 24, false, 1, 2e-4f);
    check_model("tiny", &tiny, 12, 24, true, 2, 2e-4f);
    check_shared_weights(&tiny, 10, 24);
    ktf_shape sm = ktf_shape_smollm2_135m();
    sm.weight = KD_F32, sm.cache = KD_F32;
    check_model("smollm2-shapes", &sm, 40, 128, true, 1, 2e-3f);
    printf("%d checks, %d failed\n", checks, failures);
#ifdef CUDAEMU
    /* The CUDA emulator's timings mean nothing: check only. */
    printf("timings skipped: the device is emulated (cudaemu)\n");
    return failures ? 1 : 0;
#endif

    char path[512];
    const char *out = getenv("OUT"), *bdir = getenv("BUILD");
    if (out && *out)
        snprintf(path, sizeof(path), "%s/gpu_exec.json", out);
    else
        snprintf(path, sizeof(path), "%s/gpu/gpu_exec.json", bdir && *bdir ? bdir : "build");
    FILE *json = fopen(path, "w");
    if (!json) {
        perror(path);
        return 2;
    }
    bench(json, prop.name);
    fclose(json);
    printf("wrote %s\n", path);
    return failures ? 1 : 0;
}
