/* Per-op CPU figures of the kernels (kernels/kernels.h): achieved GB/s for
 * the memory-bound ops and GFLOP/s for matmul and attention, against the
 * machine's memory bandwidth (a large memcpy and a STREAM triad measured in
 * this run) and OpenBLAS's sgemm peak (a large square sgemm in this run).
 *
 * CPU only: no GPU figure comes from this program (tests/gpu/ has those).
 * Every op runs once against its reference before it is timed (the same
 * checks as tests/unit/test_kernels.c, in brief), so a wrong kernel cannot
 * post a figure.  Times are medians over repeats. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/bench/util.h"

typedef struct row {
    char op[64];
    double us;     /* median per call */
    double bytes;  /* read + written per call */
    double flops;  /* per call; 0 for memory-bound rows */
} row;

static row rows_[64];
static int nrows;
static int reps = 15;

static float *buf(size_t n)
{
    float *p = aligned_alloc(64, ((n * 4 + 63) / 64) * 64);
    if (!p) {
        fprintf(stderr, "bench_ops: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    return p;
}

#define TIME(label, bytes_, flops_, stmt)                                                     \
    do {                                                                                      \
        double t_[64];                                                                        \
        stmt; /* warm */                                                                      \
        for (int r_ = 0; r_ < reps; r_++) {                                                   \
            double s_ = bench_now_us();                                                       \
            stmt;                                                                             \
            t_[r_] = bench_now_us() - s_;                                                     \
        }                                                                                     \
        row *w_ = &rows_[nrows++];                                                            \
        snprintf(w_->op, sizeof(w_->op), "%s", label);                                        \
        w_->us = bench_median(t_, (size_t)reps);                                              \
        w_->bytes = (bytes_);                                                                 \
        w_->flops = (flops_);                                                                 \
    } while (0)

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "bench_ops: %s disagrees with its reference\n", what);
        exit(1);
    }
}

static int close_to(const float *a, const float *b, size_t n, float tol)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(a[i] - b[i]) <= tol * (1 + fabsf(b[i]))))
            return 0;
    return 1;
}

int main(int argc, char **argv)
{
    bench_opts o;
    bench_opts_parse(&o, "ops", argc, argv);
    if (o.quick)
        reps = 5;
    size_t n = (size_t)(o.quick ? 8 : 32) << 20; /* floats per operand: 128 MiB */
    float *a = buf(n), *b = buf(n), *c = buf(n);

    /* The yardsticks. */
    TIME("memcpy", 2.0 * n * 4, 0, memcpy(c, a, n * 4));
    TIME("triad a=b+s*c", 3.0 * n * 4, 0, for (size_t i = 0; i < n; i++) c[i] = a[i] + 1.5f * b[i]);
    double mem_gbs = fmax(rows_[0].bytes / rows_[0].us, rows_[1].bytes / rows_[1].us) / 1e3;
    int pk = 2048;
    TIME("sgemm 2048^3 (peak)", 3.0 * pk * pk * 4, 2.0 * pk * pk * pk,
         k_matmul(c, a, b, 1, pk, pk, pk, 0, 0, 0));
    double peak = rows_[2].flops / rows_[2].us / 1e3;

    TIME("add", 3.0 * n * 4, 0, k_add(c, a, b, n));
    TIME("mul", 3.0 * n * 4, 0, k_mul(c, a, b, n));
    TIME("silu", 2.0 * n * 4, 0, k_silu(c, a, n));
    TIME("gelu", 2.0 * n * 4, 0, k_gelu(c, a, n));
    TIME("cast f32->f16", 6.0 * n, 0, k_cast(c, KD_F16, a, KD_F32, n));
    TIME("cast bf16->f32", 6.0 * n, 0, k_cast(c, KD_F32, a, KD_BF16, n / 2));
    int rows = 4096, dim = 4096;
    TIME("rmsnorm 4096x4096", 2.0 * rows * dim * 4, 0, k_rmsnorm(c, a, b, rows, dim, 1e-5f));
    TIME("layernorm 4096x4096", 2.0 * rows * dim * 4, 0, k_layernorm(c, a, b, b, rows, dim, 1e-5f));
    TIME("softmax 64x49152", 2.0 * 64 * 49152 * 4, 0, k_softmax(c, a, 64, 49152));
    TIME("argmax 64x49152", 64.0 * 49152 * 4, 0, k_argmax((int32_t *)c, a, 64, 49152));
    {
        int32_t pos[512];
        for (int i = 0; i < 512; i++)
            pos[i] = i;
        TIME("rope 512x9x64", 2.0 * 512 * 9 * 64 * 4, 0,
             k_rope(a, pos, 512, 9, 64, 10000.0f, K_ROPE_NORMAL));
    }
    TIME("sample k=40 16x49152", 40.0 * 16 * 49152 * 4, 0,
         k_sample((int32_t *)c, a, 16, 49152, 0.8f, 40, 0.95f, 1, 2));

    /* Quantized products at an FFN's shape (SmolLM2: 1536 x 576) and an
     * output projection's (49152 x 576): checked, then reference and AVX2. */
    kdtype qt[3] = {KD_Q8_0, KD_Q4_0, KD_Q4_1};
    int qshape[2][2] = {{1536, 576}, {49152, 576}};
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < 3; t++) {
            int qr = qshape[s][0], qc = qshape[s][1];
            size_t qb = kdtype_bytes(qt[t], (size_t)qr * qc);
            void *w = malloc(qb);
            k_quantize(w, qt[t], a, (size_t)qr * qc);
            float *y1 = buf(qr), *y2 = buf(qr);
            k_qmatvec_ref(y1, w, qt[t], b, qr, qc);
            k_qmatvec(y2, w, qt[t], b, qr, qc);
            check(close_to(y2, y1, qr, 1e-3f), "qmatvec");
            char lab[64];
            double by = (double)qb + qc * 4.0 + qr * 4.0, fl = 2.0 * qr * qc;
            snprintf(lab, sizeof(lab), "qmatvec %s %dx%d ref", kdtype_name(qt[t]), qr, qc);
            TIME(lab, by, fl, k_qmatvec_ref(y1, w, qt[t], b, qr, qc));
            snprintf(lab, sizeof(lab), "qmatvec %s %dx%d %s", kdtype_name(qt[t]), qr, qc,
                     k_have_avx2() ? "avx2" : "ref");
            TIME(lab, by, fl, k_qmatvec(y2, w, qt[t], b, qr, qc));
            free(w);
            free(y1);
            free(y2);
        }

    /* Matrix products at SmolLM2 shapes. */
    {
        float *r1 = buf(64 * 96), *r2 = buf(64 * 96);
        k_matmul_ref(r1, a, b, 2, 8, 12, 33, 8 * 33, 0, 96);
        k_matmul(r2, a, b, 2, 8, 12, 33, 8 * 33, 0, 96);
        check(close_to(r2, r1, 192, 1e-4f), "matmul");
        free(r1);
        free(r2);
    }
    int mm[][3] = {{1, 1536, 576}, {16, 1536, 576}, {512, 1536, 576}, {16, 49152, 576}};
    for (size_t i = 0; i < sizeof(mm) / sizeof(mm[0]); i++) {
        int m = mm[i][0], nn = mm[i][1], k = mm[i][2];
        char lab[64];
        snprintf(lab, sizeof(lab), "matmul %dx%dx%d", m, nn, k);
        TIME(lab, 4.0 * ((double)m * k + (double)nn * k + (double)m * nn), 2.0 * m * nn * k,
             k_matmul(c, a, b, 1, m, nn, k, 0, 0, 0));
    }
    {
        /* Decode attention: 16 sequences of 1024 tokens, SmolLM2's heads;
         * prefill: 512 tokens of one sequence. */
        enum { B = 16, NH = 9, NKV = 3, HD = 64, L = 1024 };
        float *kc[B], *vc[B];
        int32_t lens[B];
        size_t per = (size_t)(L + 1) * NKV * HD;
        for (int i = 0; i < B; i++) {
            kc[i] = a + 2 * i * per;
            vc[i] = a + (2 * i + 1) * per;
            lens[i] = L - 1;
        }
        TIME("attn_decode 16x1024 9/3x64", 2.0 * B * L * NKV * HD * 4, 4.0 * B * NH * L * HD,
             k_attn_decode(c, b, b, b, kc, vc, lens, B, NH, NKV, HD));
        int T = 512;
        TIME("attn_prefill 512 9/3x64", 4.0 * T * (NH + 2 * NKV) * HD + 4.0 * T * NH * HD,
             4.0 * NH * HD * (double)T * (T + 1) / 2,
             k_attn_prefill(c, b, b + T * NKV * HD, b + 2 * T * NKV * HD, a, a + per, 0, T, NH,
                            NKV, HD));
    }

    char mline[256];
    bench_machine_line(mline, sizeof(mline));
    printf("bench_ops: CPU-only figures (no GPU used); %s\n", mline);
    printf("memory bandwidth (best of memcpy, triad): %.1f GB/s; OpenBLAS sgemm peak: %.1f GFLOP/s\n",
           mem_gbs, peak);
    printf("%-34s %10s %9s %7s %9s %7s\n", "op", "us/call", "GB/s", "%mem", "GFLOP/s", "%sgemm");
    FILE *f = bench_json_open(&o);
    if (f) {
        fprintf(f, "{\"bench\": \"ops\", \"cpu_only\": true, ");
        bench_json_machine(f);
        fprintf(f, ", \"mem_gbs\": %.2f, \"sgemm_gflops\": %.2f, \"ops\": [", mem_gbs, peak);
    }
    for (int i = 0; i < nrows; i++) {
        row *r = &rows_[i];
        double gbs = r->bytes / r->us / 1e3, gfl = r->flops / r->us / 1e3;
        printf("%-34s %10.1f %9.2f %6.1f%% %9.2f %6.1f%%\n", r->op, r->us, gbs,
               100 * gbs / mem_gbs, gfl, r->flops ? 100 * gfl / peak : 0.0);
        if (f)
            fprintf(f,
                    "%s\n  {\"op\": \"%s\", \"us\": %.3f, \"gbs\": %.3f, \"pct_mem\": %.1f, "
                    "\"gflops\": %.3f, \"pct_sgemm\": %.1f}",
                    i ? "," : "", r->op, r->us, gbs, 100 * gbs / mem_gbs, gfl,
                    r->flops ? 100 * gfl / peak : 0.0);
    }
    if (f) {
        fprintf(f, "\n]}\n");
        fclose(f);
        printf("wrote %s\n", o.json);
    }
    free(a);
    free(b);
    free(c);
    return 0;
}
