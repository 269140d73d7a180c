/* The CPU kernels (kernels/kernels.h): every fast path against its plain
 * reference on random inputs of several shapes, odd ones included; outputs
 * poisoned with NaN first so an element the kernel never wrote shows up; the
 * f16/bf16 conversions and the Philox generator on known answers; GGUF block
 * layouts on a hand-made block and on quantize -> dequantize round trips;
 * batched decode attention against per-sequence prefill; sampling
 * reproducibility and its agreement with argmax. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "tests/unit/skip.h"

#include "kernels/cpu/attention_fast.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/philox.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/threads.h"
#include "kernels/kernels.h"

/* ---- helpers --------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void) /* uniform in [-1, 1) from a splitmix64 stream */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((z >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float *rnd(size_t n, float scale)
{
    float *p = malloc(n * sizeof(float) + 1);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * scale;
    return p;
}

static float *poisoned(size_t n)
{
    float *p = malloc(n * sizeof(float) + 1);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

/* Every element written (no NaN left) and within ABS + REL * |ref| of REF. */
static void assert_close(const float *got, const float *ref, size_t n, float abs_tol,
                         float rel_tol, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || fabsf(got[i] - ref[i]) > abs_tol + rel_tol * fabsf(ref[i]))
            fail_msg("%s: element %zu: got %.9g, reference %.9g", what, i, (double)got[i],
                     (double)ref[i]);
    }
}

/* ---- conversions and the RNG ----------------------------------------------- */

static void test_half_known(void **state)
{
    (void)state;
    assert_int_equal(k_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(k_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(k_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(k_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(k_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(k_f32_to_f16(ldexpf(1, -24)), 0x0001);
    assert_int_equal(k_f32_to_f16(ldexpf(1, -25)), 0x0000);          /* tie to even */
    assert_int_equal(k_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    assert_int_equal(k_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00);   /* tie to even */
    assert_int_equal(k_f32_to_f16(1.0f + ldexpf(3, -11)), 0x3c02);   /* tie to even, up */
    assert_int_equal(k_f32_to_f16(INFINITY), 0x7c00);
    assert_true((k_f32_to_f16(NAN) & 0x7fff) > 0x7c00);
    assert_int_equal(k_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(k_f32_to_bf16(1.0f + ldexpf(1, -8)), 0x3f80);   /* tie to even */
    assert_true(isnan(k_bf16_to_f32(k_f32_to_bf16(NAN))));
    /* Every f16 that is a number survives f16 -> f32 -> f16. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
            continue;
        assert_int_equal(k_f32_to_f16(k_f16_to_f32((uint16_t)h)), h);
    }
    for (uint32_t b = 0; b < 0x10000; b++) {
        if ((b & 0x7f80) == 0x7f80 && (b & 0x7f))
            continue;
        assert_int_equal(k_f32_to_bf16(k_bf16_to_f32((uint16_t)b)), b);
    }
}

static void test_cast(void **state)
{
    (void)state;
    size_t n = 1001;
    float *x = rnd(n, 100.0f), *back = poisoned(n);
    uint16_t *h = malloc(n * 2);
    assert_int_equal(k_cast(h, KD_F16, x, KD_F32, n), 0);
    assert_int_equal(k_cast(back, KD_F32, h, KD_F16, n), 0);
    assert_close(back, x, n, 1e-6f, 1.0f / 2048, "f32->f16->f32");
    assert_int_equal(k_cast(h, KD_BF16, x, KD_F32, n), 0);
    uint16_t *h2 = malloc(n * 2);
    assert_int_equal(k_cast(h2, KD_F16, h, KD_BF16, n), 0); /* bf16 -> f16 directly */
    assert_int_equal(k_cast(back, KD_F32, h2, KD_F16, n), 0);
    assert_close(back, x, n, 1e-6f, 1.0f / 256 + 1.0f / 2048, "f32->bf16->f16->f32");
    assert_int_equal(k_cast(h, KD_I32, x, KD_F32, n), -EINVAL);
    free(x);
    free(back);
    free(h);
    free(h2);
}

static void test_philox(void **state)
{
    (void)state;
    /* Known answer of Random123 (kat_vectors: philox4x32_10, zero counter
     * and key). */
    k_philox4 o = k_philox4x32(0, 0);
    assert_int_equal(o.v[0], 0x6627e8d5u);
    assert_int_equal(o.v[1], 0xe169c58du);
    assert_int_equal(o.v[2], 0xbc57ac4cu);
    assert_int_equal(o.v[3], 0x9b00dbd8u);
    double mean = 0;
    for (uint64_t c = 0; c < 10000; c++) {
        float u = k_philox_uniform(42, c);
        assert_true(u >= 0.0f && u < 1.0f);
        assert_true(u == k_philox_uniform(42, c));
        mean += u;
    }
    mean /= 10000;
    assert_true(fabs(mean - 0.5) < 0.02);
    assert_true(k_philox_uniform(42, 7) != k_philox_uniform(43, 7));
}

/* ---- matrix products ------------------------------------------------------- */

static void test_matmul_blas_vs_ref(void **state)
{
    (void)state;
    static const int shapes[][4] = {
        {1, 1, 1, 1}, {2, 3, 5, 7}, {3, 17, 33, 65}, {1, 1, 129, 257}, {4, 1, 31, 64}, {2, 64, 48, 576},
    };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int batch = shapes[s][0], m = shapes[s][1], n = shapes[s][2], k = shapes[s][3];
        for (int shared = 0; shared < 2; shared++) {
            size_t sa = (size_t)m * k, sb = shared ? 0 : (size_t)n * k, sc = (size_t)m * n;
            float *a = rnd(sa * batch, 1), *b = rnd((size_t)n * k * batch, 1);
            float *ref = poisoned(sc * batch), *got = poisoned(sc * batch);
            k_matmul_ref(ref, a, b, batch, m, n, k, sa, sb, sc);
            k_matmul(got, a, b, batch, m, n, k, sa, sb, sc);
            /* f32 sums of K products in [-1, 1]: error grows like K eps. */
            assert_close(got, ref, sc * batch, 2e-6f * k + 1e-6f, 1e-5f, "sgemm vs reference");
            free(a);
            free(b);
            free(ref);
            free(got);
        }
    }
}

void omp_set_num_threads(int n);

/* k_matmul_bf16 (oneDNN) against the reference on the operands rounded to
 * bf16 as it rounds them, on a pool (rows in blocks per thread) and
 * alone, with the weights in plain rows and packed. */
static void test_matmul_bf16(void **state)
{
    (void)state;
    /* 300 and 700 rows: oneDNN calls of 128 rows and a padded last one. */
    static const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {130, 48, 240}, {300, 64, 512},
                                    {700, 32, 2048}, {200, 512, 512}};
    kth_pool *pool = NULL;
    assert_int_equal(kth_pool_create(2, &pool), 0);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        size_t na = (size_t)m * k, nw = (size_t)n * k, ny = (size_t)m * n;
        float *a = rnd(na, 1), *w = rnd(nw, 1), *ar = poisoned(na), *wr = poisoned(nw);
        float *ref = poisoned(ny), *got = poisoned(ny), *solo = poisoned(ny);
        uint16_t *wb = malloc(nw * 2), *ab = malloc(na * 2);
        assert_true(wb && ab);
        assert_int_equal(k_cast(wb, KD_BF16, w, KD_F32, nw), 0);
        assert_int_equal(k_cast(ab, KD_BF16, a, KD_F32, na), 0);
        assert_int_equal(k_cast(wr, KD_F32, wb, KD_BF16, nw), 0);
        assert_int_equal(k_cast(ar, KD_F32, ab, KD_BF16, na), 0);
        int rc = k_matmul_bf16(pool, got, a, wb, m, n, k);
        if (rc && !k_matmul_bf16_native()) {
            kth_pool_destroy(pool);
            free(a), free(w), free(ar), free(wr), free(ref), free(got), free(solo), free(wb);
            free(ab);
            skip_because("oneDNN has no bf16 product on this CPU (%d)", rc);
        }
        assert_int_equal(rc, 0);
        assert_int_equal(k_matmul_bf16(NULL, solo, a, wb, m, n, k), 0);
        k_matmul_ref(ref, ar, wr, 1, m, n, k, 0, 0, 0);
        assert_close(got, ref, ny, 2e-6f * k + 1e-6f, 1e-5f, "bf16 product on the pool");
        assert_close(solo, ref, ny, 2e-6f * k + 1e-6f, 1e-5f, "bf16 product alone");
        /* The same weights packed once for oneDNN: the same products. */
        size_t pb = k_matmul_bf16_packed_bytes(n, k);
        assert_true(pb >= nw * 2);
        void *packed = malloc(pb);
        float *pgot = poisoned(ny), *psolo = poisoned(ny);
        assert_non_null(packed);
        /* Packed on a thread that would give oneDNN many OpenMP threads
         * (its layout may narrow then), multiplied on one. */
        omp_set_num_threads(16);
        assert_int_equal(k_matmul_bf16_pack(packed, wb, n, k), 0);
        omp_set_num_threads(1);
        assert_int_equal(k_matmul_bf16_packed(pool, pgot, a, packed, m, n, k), 0);
        assert_int_equal(k_matmul_bf16_packed(NULL, psolo, a, packed, m, n, k), 0);
        assert_close(pgot, ref, ny, 2e-6f * k + 1e-6f, 1e-5f, "packed bf16 product on the pool");
        assert_close(psolo, ref, ny, 2e-6f * k + 1e-6f, 1e-5f, "packed bf16 product alone");
        free(packed), free(pgot), free(psolo);
        free(a), free(w), free(ar), free(wr), free(ref), free(got), free(solo), free(wb), free(ab);
    }
    kth_pool_destroy(pool);
}

static const kdtype qtypes[] = {KD_Q8_0, KD_Q4_0, KD_Q4_1};

static void test_quant_layout(void **state)
{
    (void)state;
    uint8_t b[K_Q8_0_BYTES] = {0}; /* the largest block */
    float y[32];
    /* Q4_0: d = 1 (f16 0x3c00, little-endian), byte 0 = 0x21. */
    b[0] = 0x00;
    b[1] = 0x3c;
    for (int i = 0; i < 16; i++)
        b[2 + i] = 0x88; /* both nibbles 8: value 0 */
    b[2] = 0x21;
    assert_int_equal(k_dequantize(y, KD_Q4_0, b, 32), 0);
    assert_true(y[0] == -7.0f && y[16] == -6.0f && y[1] == 0.0f && y[31] == 0.0f);
    /* Q4_1: d = 2, m = -1 (0xbc00), byte 3 = 0xf0: element 3 = -1, 19 = 29. */
    memset(b, 0, sizeof(b));
    b[1] = 0x40;
    b[3] = 0xbc;
    b[4 + 3] = 0xf0;
    assert_int_equal(k_dequantize(y, KD_Q4_1, b, 32), 0);
    assert_true(y[3] == -1.0f && y[19] == 29.0f && y[0] == -1.0f);
    /* Q8_0: d = 0.5 (0x3800), q[5] = -3. */
    memset(b, 0, sizeof(b));
    b[1] = 0x38;
    b[2 + 5] = (uint8_t)(int8_t)-3;
    assert_int_equal(k_dequantize(y, KD_Q8_0, b, 32), 0);
    assert_true(y[5] == -1.5f && y[4] == 0.0f);
    assert_int_equal(k_block_bytes(KD_Q8_0), kdtype_bytes(KD_Q8_0, 32));
    assert_int_equal(k_block_bytes(KD_Q4_0), kdtype_bytes(KD_Q4_0, 32));
    assert_int_equal(k_block_bytes(KD_Q4_1), kdtype_bytes(KD_Q4_1, 32));
    assert_int_equal(k_quantize(b, KD_F32, y, 32), -EINVAL);
    assert_int_equal(k_quantize(b, KD_Q8_0, y, 31), -EINVAL);
}

static void test_quant_roundtrip(void **state)
{
    (void)state;
    size_t n = 32 * 37;
    for (size_t t = 0; t < 3; t++) {
        float *x = rnd(n, 3.0f), *y = poisoned(n);
        x[5] = 0; /* a block with a zero and one with all zeros */
        for (int i = 64; i < 96; i++)
            x[i] = 0;
        void *q = malloc(kdtype_bytes(qtypes[t], n));
        assert_int_equal(k_quantize(q, qtypes[t], x, n), 0);
        assert_int_equal(k_dequantize(y, qtypes[t], q, n), 0);
        for (size_t blk = 0; blk < n / 32; blk++) {
            float mn = x[blk * 32], mx = mn, amax = 0;
            for (int i = 0; i < 32; i++) {
                float v = x[blk * 32 + i];
                mn = fminf(mn, v);
                mx = fmaxf(mx, v);
                amax = fmaxf(amax, fabsf(v));
            }
            /* Half a step, plus what the f16 rounding of the scale (and of
             * the minimum) moves the extreme codes; Q4_0 clamps its +8 code
             * to 7, a whole step. */
            float step = qtypes[t] == KD_Q8_0 ? amax / 127 : qtypes[t] == KD_Q4_0 ? amax / 8 : (mx - mn) / 15;
            float bound = qtypes[t] == KD_Q4_0 ? 1.01f * step : 0.51f * step + 0.002f * amax;
            for (int i = 0; i < 32; i++) {
                size_t j = blk * 32 + i;
                if (isnan(y[j]) || fabsf(y[j] - x[j]) > bound + 1e-7f)
                    fail_msg("%s element %zu: %g -> %g (bound %g)", kdtype_name(qtypes[t]), j,
                             (double)x[j], (double)y[j], (double)bound);
            }
        }
        free(x);
        free(y);
        free(q);
    }
}

static void test_qmatvec_fast_vs_ref(void **state)
{
    (void)state;
    static const int shapes[][2] = {{1, 32}, {7, 96}, {33, 576}, {3, 4096}, {130, 1536}};
    print_message("qmatvec: AVX2 path %s\n", k_have_avx2() ? "on" : "off (reference only)");
    for (size_t t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            int rows = shapes[s][0], cols = shapes[s][1];
            float *wf = rnd((size_t)rows * cols, 1), *x = rnd(cols, 1);
            void *w = malloc(kdtype_bytes(qtypes[t], (size_t)rows * cols));
            assert_int_equal(k_quantize(w, qtypes[t], wf, (size_t)rows * cols), 0);
            float *ref = poisoned(rows), *got = poisoned(rows), *mm = poisoned(rows);
            assert_int_equal(k_qmatvec_ref(ref, w, qtypes[t], x, rows, cols), 0);
            assert_int_equal(k_qmatvec(got, w, qtypes[t], x, rows, cols), 0);
            assert_close(got, ref, rows, 2e-6f * cols, 1e-5f, kdtype_name(qtypes[t]));
            /* The reference equals an f32 product with the dequantized rows. */
            assert_int_equal(k_dequantize(wf, qtypes[t], w, (size_t)rows * cols), 0);
            k_matmul_ref(mm, x, wf, 1, 1, rows, cols, 0, 0, 0);
            assert_close(ref, mm, rows, 1e-5f, 1e-5f, "qmatvec_ref vs dequantized matmul");
            assert_int_equal(k_qmatvec(got, w, KD_F16, x, rows, cols), -EINVAL);
            free(wf);
            free(x);
            free(w);
            free(ref);
            free(got);
            free(mm);
        }
}

/* k_qmatmul (several rows of X per pass over W) against the row-by-row
 * reference, for row counts on both sides of its 8-row groups. */
static void test_qmatmul_vs_ref(void **state)
{
    (void)state;
    static const int ms[] = {1, 3, 8, 9, 17};
    int rows = 67, cols = 576;
    for (size_t t = 0; t < 3; t++)
        for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++) {
            int m = ms[i];
            float *wf = rnd((size_t)rows * cols, 1), *x = rnd((size_t)m * cols, 1);
            void *w = malloc(kdtype_bytes(qtypes[t], (size_t)rows * cols));
            assert_int_equal(k_quantize(w, qtypes[t], wf, (size_t)rows * cols), 0);
            float *ref = poisoned((size_t)m * rows), *got = poisoned((size_t)m * rows);
            for (int j = 0; j < m; j++)
                assert_int_equal(k_qmatvec_ref(ref + (size_t)j * rows, w, qtypes[t],
                                               x + (size_t)j * cols, rows, cols), 0);
            assert_int_equal(k_qmatmul(got, w, qtypes[t], x, m, rows, cols), 0);
            assert_close(got, ref, (size_t)m * rows, 2e-6f * cols, 1e-5f, kdtype_name(qtypes[t]));
            assert_int_equal(k_qmatmul(got, w, KD_F32, x, m, rows, cols), -EINVAL);
            free(wf);
            free(x);
            free(w);
            free(ref);
            free(got);
        }
}

/* ---- integer products with 8-bit activations ------------------------------------ */

/* The ISAs this machine can run, the reference first. */
static int isas(int *out)
{
    int n = 0, best = k_cpu_isa();
    for (int i = K_ISA_REF; i <= best; i++)
        out[n++] = i;
    return n;
}

/* k_quantize_act: every ISA gives the reference's bytes, d = max|x| / 127,
 * each q within half a step of x / d, and S = d * sum(q). */
static void test_quantize_act(void **state)
{
    (void)state;
    int is[3], n_isa = isas(is);
    size_t n = 32 * 37;
    float *x = rnd(n, 3);
    x[5] = 0, x[40] = -3.5f; /* a block with an exact extreme */
    for (int i = 64; i < 96; i++)
        x[i] = 0;            /* an all-zero block: d = 0, q = 0 */
    for (int i = 96; i < 128; i++)
        x[i] = (float)(i - 112) * 0.5f; /* exact halves: ties to even */
    k_q8a *ref = calloc(n / 32, sizeof(*ref)), *got = calloc(n / 32, sizeof(*got));
    k_quantize_act(ref, x, n, K_ISA_REF);
    for (size_t b = 0; b < n / 32; b++) {
        float amax = 0;
        int sum = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[b * 32 + i]));
        assert_true(ref[b].d == amax / 127.0f);
        for (int i = 0; i < 32; i++) {
            sum += ref[b].q[i];
            if (ref[b].d > 0 && fabsf(ref[b].q[i] * ref[b].d - x[b * 32 + i]) > 0.5001f * ref[b].d)
                fail_msg("block %zu element %d: %g -> %d * %g", b, i, (double)x[b * 32 + i],
                         ref[b].q[i], (double)ref[b].d);
        }
        assert_true(ref[b].s == ref[b].d * (float)sum);
    }
    for (int i = 0; i < 32; i++)
        assert_int_equal(ref[2].q[i], 0);
    for (int k = 1; k < n_isa; k++) {
        memset(got, 0x5a, n / 32 * sizeof(*got));
        k_quantize_act(got, x, n, is[k]);
        assert_memory_equal(got, ref, n / 32 * sizeof(*got));
    }
    free(x);
    free(ref);
    free(got);
}

/* k_qmatmul_q8 on every ISA against its reference, for ragged row counts
 * (not multiples of the 4-row tiles) and activation rows (1..9), each
 * within summation-order noise; and the reference against an f32 product
 * of the dequantized weights with the dequantized activations. */
static void test_qmatmul_q8_vs_ref(void **state)
{
    (void)state;
    static const int shapes[][3] = {{1, 1, 32}, {3, 5, 64}, {4, 4, 96}, {9, 7, 576},
                                    {2, 13, 1536}, {5, 33, 160}, {8, 18, 320}};
    int is[3], n_isa = isas(is);
    print_message("qmatmul_q8: ISAs ref..%d checked\n", is[n_isa - 1]);
    for (size_t t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            int m = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2], nb = cols / 32;
            float *wf = rnd((size_t)rows * cols, 1), *x = rnd((size_t)m * cols, 2);
            void *w = malloc(kdtype_bytes(qtypes[t], (size_t)rows * cols));
            assert_int_equal(k_quantize(w, qtypes[t], wf, (size_t)rows * cols), 0);
            k_q8a *a = calloc((size_t)m * nb, sizeof(*a));
            k_quantize_act(a, x, (size_t)m * cols, K_ISA_REF);
            float *ref = poisoned((size_t)m * rows), *got = poisoned((size_t)m * rows);
            assert_int_equal(k_qmatmul_q8(ref, rows, w, qtypes[t], a, m, 0, rows, cols, K_ISA_REF), 0);
            /* The reference is the product of what the blocks stand for. */
            float *xa = malloc((size_t)m * cols * sizeof(float)), *mm = poisoned((size_t)m * rows);
            for (size_t b = 0; b < (size_t)m * nb; b++)
                for (int i = 0; i < 32; i++)
                    xa[b * 32 + i] = a[b].q[i] * a[b].d;
            assert_int_equal(k_dequantize(wf, qtypes[t], w, (size_t)rows * cols), 0);
            k_matmul_ref(mm, xa, wf, 1, m, rows, cols, 0, 0, 0);
            assert_close(ref, mm, (size_t)m * rows, 4e-6f * cols, 1e-5f, "q8 reference vs f32");
            for (int k = 1; k < n_isa; k++) {
                /* Two calls over a split of the rows, as two threads would. */
                int half = rows / 2;
                assert_int_equal(k_qmatmul_q8(got, rows, w, qtypes[t], a, m, 0, half, cols, is[k]), 0);
                assert_int_equal(k_qmatmul_q8(got, rows, w, qtypes[t], a, m, half, rows, cols, is[k]), 0);
                assert_close(got, ref, (size_t)m * rows, 2e-6f * cols, 1e-5f, kdtype_name(qtypes[t]));
            }
            assert_int_equal(k_qmatmul_q8(got, rows, w, KD_F16, a, m, 0, rows, cols, K_ISA_REF), -EINVAL);
            assert_int_equal(k_qmatmul_q8(got, rows, w, qtypes[t], a, m, 0, rows, cols + 1, K_ISA_REF), -EINVAL);
            free(wf), free(x), free(w), free(a), free(ref), free(got), free(xa), free(mm);
        }
}

/* k_qmatmul_mt on pools of 1..3 threads (and none) equals the one-thread
 * products: f32 activations against k_qmatmul, 8-bit ones against the
 * reference of k_qmatmul_q8; and a pool held elsewhere still computes. */
static void test_qmatmul_threads(void **state)
{
    (void)state;
    static const int ms[] = {1, 2, 7, 8, 33};
    int rows = 101, cols = 576, nb = cols / 32;
    for (int nth = 0; nth <= 3; nth++) {
        kth_pool *p = NULL;
        if (nth)
            assert_int_equal(kth_pool_create(nth, &p), 0);
        assert_int_equal(kth_pool_size(p), nth ? nth : 1);
        for (size_t t = 0; t < 3; t++)
            for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++) {
                int m = ms[i];
                float *wf = rnd((size_t)rows * cols, 1), *x = rnd((size_t)m * cols, 1);
                void *w = malloc(kdtype_bytes(qtypes[t], (size_t)rows * cols));
                assert_int_equal(k_quantize(w, qtypes[t], wf, (size_t)rows * cols), 0);
                float *ref = poisoned((size_t)m * rows), *got = poisoned((size_t)m * rows);
                assert_int_equal(k_qmatmul(ref, w, qtypes[t], x, m, rows, cols), 0);
                assert_int_equal(k_qmatmul_mt(p, got, w, qtypes[t], x, m, rows, cols, 0), 0);
                assert_close(got, ref, (size_t)m * rows, 2e-6f * cols, 1e-5f, "f32 activations");
                k_q8a *a = calloc((size_t)m * nb, sizeof(*a));
                k_quantize_act(a, x, (size_t)m * cols, K_ISA_REF);
                assert_int_equal(k_qmatmul_q8(ref, rows, w, qtypes[t], a, m, 0, rows, cols, K_ISA_REF), 0);
                got = memset(got, 0xff, (size_t)m * rows * sizeof(float));
                assert_int_equal(k_qmatmul_mt(p, got, w, qtypes[t], x, m, rows, cols, 1), 0);
                assert_close(got, ref, (size_t)m * rows, 2e-6f * cols, 1e-5f, "8-bit activations");
                /* Invariant: each row the same bits as that row alone. */
                got = memset(got, 0xff, (size_t)m * rows * sizeof(float));
                assert_int_equal(k_qmatmul_mt(p, got, w, qtypes[t], x, m, rows, cols,
                                              K_QMM_Q8 | K_QMM_INVARIANT), 0);
                assert_close(got, ref, (size_t)m * rows, 2e-6f * cols, 1e-5f, "invariant");
                float *one = poisoned((size_t)rows);
                for (int j = 0; j < m; j++) {
                    assert_int_equal(k_qmatmul_mt(p, one, w, qtypes[t], x + (size_t)j * cols, 1,
                                                  rows, cols, K_QMM_Q8), 0);
                    assert_memory_equal(one, got + (size_t)j * rows, (size_t)rows * sizeof(float));
                }
                free(one);
                if (p) {
                    /* Held by someone else: the caller's thread alone. */
                    assert_int_equal(kth_acquire(p), 0);
                    got = memset(got, 0xff, (size_t)m * rows * sizeof(float));
                    assert_int_equal(k_qmatmul_mt(p, got, w, qtypes[t], x, m, rows, cols, 1), 0);
                    kth_release(p);
                    assert_close(got, ref, (size_t)m * rows, 2e-6f * cols, 1e-5f, "held pool");
                }
                free(wf), free(x), free(w), free(a), free(ref), free(got);
            }
        kth_pool_destroy(p);
    }
    kth_pool_destroy(NULL);
}

typedef struct pool_probe {
    int hits[8];        /* per ith: calls this run */
    int nth_seen;
} pool_probe;

static void probe_fn(void *arg, int ith, int nth)
{
    pool_probe *p = arg;
    p->hits[ith]++;
    p->nth_seen = nth;
}

/* Every run calls each thread exactly once with the pool's size, many times
 * in a row (no lost or doubled wake-up) and after the threads have gone to
 * sleep; kth_split covers [0, n) exactly once in grain-sized pieces. */
static void test_thread_pool(void **state)
{
    (void)state;
    kth_pool *p;
    assert_int_equal(kth_pool_create(0, &p), -EINVAL);
    assert_int_equal(kth_pool_create(3, &p), 0);
    assert_int_equal(kth_acquire(p), 0);
    for (int r = 0; r < 20000; r++) {
        pool_probe pr = {{0}, 0};
        kth_run(p, probe_fn, &pr);
        if (pr.hits[0] != 1 || pr.hits[1] != 1 || pr.hits[2] != 1 || pr.nth_seen != 3)
            fail_msg("run %d: hits %d %d %d, nth %d", r, pr.hits[0], pr.hits[1], pr.hits[2],
                     pr.nth_seen);
        if (r % 5000 == 4999) {
            struct timespec ts = {0, 2000000}; /* past the spin: the threads sleep */
            nanosleep(&ts, NULL);
        }
    }
    assert_int_equal(kth_acquire(p), -EBUSY);
    assert_non_null(kth_scratch(p, 1000));
    assert_true(((uintptr_t)kth_scratch(p, 5000) & 63) == 0);
    kth_release(p);
    kth_pool_destroy(p);
    for (int n = 0; n < 70; n++)
        for (int nth = 1; nth <= 5; nth++) {
            int covered = 0, prev = 0;
            for (int i = 0; i < nth; i++) {
                int lo, hi;
                kth_split(n, 4, i, nth, &lo, &hi);
                assert_int_equal(lo, prev);
                assert_true(hi >= lo && (hi == n || hi % 4 == 0));
                covered += hi - lo;
                prev = hi;
            }
            assert_int_equal(covered, n);
        }
}

/* ---- elementwise, norms, rope, softmax --------------------------------------- */

static void test_elementwise(void **state)
{
    (void)state;
    size_t n = 517;
    float *a = rnd(n, 4), *b = rnd(n, 4), *o = poisoned(n);
    k_add(o, a, b, n);
    for (size_t i = 0; i < n; i++)
        assert_true(o[i] == a[i] + b[i]);
    k_mul(o, a, b, n);
    for (size_t i = 0; i < n; i++)
        assert_true(o[i] == a[i] * b[i]);
    k_silu(o, a, n);
    for (size_t i = 0; i < n; i++)
        assert_true(fabs(o[i] - a[i] / (1 + exp(-(double)a[i]))) < 1e-6);
    k_gelu(o, a, n);
    for (size_t i = 0; i < n; i++) {
        double x = a[i], g = 0.5 * x * (1 + erf(x / sqrt(2.0)));
        assert_true(fabs(o[i] - g) < 1e-3); /* the tanh form is within 1e-3 of erf */
    }
    int32_t ids[4] = {2, 0, -1, 5};
    float *e = poisoned(4 * 3);
    k_embed(e, a, 5, 3, ids, 4);
    assert_true(e[0] == a[6] && e[3] == a[0] && e[6] == 0 && e[11] == 0);
    assert_int_equal(k_allreduce_sum(a, n, 1), 0);
    assert_int_equal(k_allreduce_sum(a, n, 2), -EINVAL);
    free(a);
    free(b);
    free(o);
    free(e);
}

static void test_norms(void **state)
{
    (void)state;
    int rows = 5, dim = 577;
    float *x = rnd((size_t)rows * dim, 3), *w = rnd(dim, 1), *ones = malloc(dim * sizeof(float));
    for (int i = 0; i < dim; i++)
        ones[i] = 1;
    float *o = poisoned((size_t)rows * dim);
    k_rmsnorm(o, x, ones, rows, dim, 1e-6f);
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)o[r * dim + i] * o[r * dim + i];
        assert_true(fabs(ss / dim - 1) < 1e-4);
    }
    k_layernorm(o, x, ones, NULL, rows, dim, 1e-6f);
    for (int r = 0; r < rows; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < dim; i++)
            m += o[r * dim + i];
        m /= dim;
        for (int i = 0; i < dim; i++)
            v += (o[r * dim + i] - m) * (o[r * dim + i] - m);
        assert_true(fabs(m) < 1e-5 && fabs(v / dim - 1) < 1e-4);
    }
    float *o2 = poisoned((size_t)rows * dim);
    k_layernorm(o2, x, w, w, rows, dim, 1e-6f); /* weight and bias */
    for (int i = 0; i < rows * dim; i++)
        assert_true(fabsf(o2[i] - (o[i] * w[i % dim] + w[i % dim])) < 1e-5f);
    free(x);
    free(w);
    free(ones);
    free(o);
    free(o2);
}

static void test_rope(void **state)
{
    (void)state;
    int n_tok = 3, n_head = 2, hd = 64;
    size_t n = (size_t)n_tok * n_head * hd;
    float *x = rnd(n, 1), *y = malloc(n * sizeof(float)), *z = malloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    int32_t pos[3] = {0, 1, 1000};
    k_rope(y, pos, n_tok, n_head, hd, 10000.0f, K_ROPE_NORMAL);
    for (int i = 0; i < n_head * hd; i++) /* position 0: identity */
        assert_true(y[i] == x[i]);
    for (size_t i = n_head * hd; i < n; i += 2) /* each pair keeps its length */
        assert_true(fabsf(hypotf(y[i], y[i + 1]) - hypotf(x[i], x[i + 1])) < 1e-5f);
    /* NEOX on rows permuted (pair i -> lanes i and i + hd/2) is NORMAL,
     * permuted: the equivalence convert_hf_to_gguf.py relies on. */
    for (size_t r = 0; r < n / hd; r++)
        for (int i = 0; i < hd / 2; i++) {
            z[r * hd + i] = x[r * hd + 2 * i];
            z[r * hd + hd / 2 + i] = x[r * hd + 2 * i + 1];
        }
    k_rope(z, pos, n_tok, n_head, hd, 10000.0f, K_ROPE_NEOX);
    for (size_t r = 0; r < n / hd; r++)
        for (int i = 0; i < hd / 2; i++) {
            assert_true(fabsf(z[r * hd + i] - y[r * hd + 2 * i]) < 1e-6f);
            assert_true(fabsf(z[r * hd + hd / 2 + i] - y[r * hd + 2 * i + 1]) < 1e-6f);
        }
    /* Position 1, pair 0 rotates by exactly 1 radian. */
    size_t b = (size_t)n_head * hd;
    assert_true(fabsf(y[b] - (x[b] * cosf(1) - x[b + 1] * sinf(1))) < 1e-6f);
    free(x);
    free(y);
    free(z);
}

/* k_logsumexp (the AVX2 path where the CPU has it) against its reference
 * on random rows of logits: lengths that are and are not multiples of 8,
 * disabled (-inf) entries, values far below the maximum, all disabled. */
static void test_logsumexp(void **state)
{
    (void)state;
    int lens[] = {1, 7, 8, 9, 1003, 51865};
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
        int n = lens[k];
        float *x = rnd((size_t)n, 30);
        for (int i = 0; i < n; i += 5)
            x[i] = i % 10 ? -INFINITY : x[i] - 200; /* disabled, or past expf's range */
        x[n - 1] = 12.5f;
        double want = k_logsumexp_ref(x, n), got = k_logsumexp(x, n);
        assert_true(isfinite(want));
        if (!(fabs(got - want) < 1e-6))
            fail_msg("n %d: k_logsumexp %.9g, the reference %.9g", n, got, want);
        for (int i = 0; i < n; i++)
            x[i] = -INFINITY;
        assert_true(k_logsumexp(x, n) == -INFINITY && k_logsumexp_ref(x, n) == -INFINITY);
        free(x);
    }
    float one = 3.0f;
    assert_true(fabs(k_logsumexp(&one, 1) - 3.0) < 1e-12);
}

static void test_softmax_argmax(void **state)
{
    (void)state;
    int rows = 4, n = 1003;
    float *x = rnd((size_t)rows * n, 20), *o = poisoned((size_t)rows * n);
    x[7] = 50;             /* row 0 max at 7 ... */
    x[9] = 50;             /* ... tied at 9: argmax says 7 */
    x[n + n - 1] = 60;     /* row 1 max at the end */
    k_softmax(o, x, rows, n);
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int i = 0; i < n; i++) {
            assert_false(isnan(o[r * n + i]));
            s += o[r * n + i];
        }
        assert_true(fabs(s - 1) < 1e-5);
    }
    assert_true(fabsf(o[7] - o[9]) == 0 && o[7] > 0.49f);
    int32_t am[4] = {-1, -1, -1, -1};
    k_argmax(am, x, rows, n);
    assert_int_equal(am[0], 7);
    assert_int_equal(am[1], n - 1);
    for (int r = 2; r < rows; r++) {
        assert_true(am[r] >= 0 && am[r] < n);
        for (int i = 0; i < n; i++)
            assert_true(x[r * n + i] <= x[r * n + am[r]]);
    }
    free(x);
    free(o);
}

/* ---- attention --------------------------------------------------------------- */

/* Rounds N floats to what an f16 holds. */
static void round_f16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = k_f16_to_f32(k_f32_to_f16(x[i]));
}

/* Rounds N floats (a multiple of 32) to what a cache of DT holds: f16, or
 * q8_0 (each block of 32 quantized and widened back); f32 as they are. */
static void round_to(kdtype dt, float *x, size_t n)
{
    if (dt == KD_F16) {
        round_f16(x, n);
    } else if (dt == KD_Q8_0) {
        uint8_t blk[34];
        for (size_t i = 0; i + 32 <= n; i += 32) {
            assert_int_equal(k_quantize(blk, KD_Q8_0, x + i, 32), 0);
            assert_int_equal(k_dequantize(x + i, KD_Q8_0, blk, 32), 0);
        }
    }
}

/* N_TOK rows of SRC ([N_TOK][N_KV][HD], f32) into cache C of type DT at
 * positions [POS, POS + N_TOK), in the caches' layout ([N_KV][CAP][HD]); and
 * the way back, into DST as f32 rows. */
static void cache_put(void *c, kdtype dt, int cap, int pos, const float *src, int n_tok,
                      int n_kv, int hd)
{
    for (int t = 0; t < n_tok; t++)
        for (int g = 0; g < n_kv; g++) {
            uint8_t *to = (uint8_t *)c + kdtype_bytes(dt, ((size_t)g * cap + pos + t) * hd);
            const float *from = src + ((size_t)t * n_kv + g) * hd;
            assert_int_equal(dt == KD_Q8_0 ? k_quantize(to, dt, from, (size_t)hd)
                                           : k_cast(to, dt, from, KD_F32, (size_t)hd), 0);
        }
}

static void cache_get(float *dst, const void *c, kdtype dt, int cap, int pos, int n_tok,
                      int n_kv, int hd)
{
    for (int t = 0; t < n_tok; t++)
        for (int g = 0; g < n_kv; g++)
            assert_int_equal(k_widen(dst + ((size_t)t * n_kv + g) * hd, dt,
                                     (const uint8_t *)c +
                                         kdtype_bytes(dt, ((size_t)g * cap + pos + t) * hd),
                                     (size_t)hd), 0);
}

/* k_attn_prefill_mt and k_attn_decode_mt against the references, with no
 * pool and pools of 2 and 3 threads, on f32, f16 and q8_0 caches, for head
 * sizes that take the vector path (64, 16) and one that does not (20),
 * prompts not a multiple of the query block, a cache already holding
 * positions, and contexts past the scores' stack buffer (5000).  For f16
 * and q8_0 the reference runs on K and V rounded to what the cache holds;
 * q8_0 with a head size that is not whole blocks is refused. */
static void test_attention_fast_vs_ref(void **state)
{
    (void)state;
    static const int shapes[][5] = {/* heads, kv heads, hd, pos0, tokens */
                                    {9, 3, 64, 0, 37}, {4, 4, 16, 5, 3}, {6, 2, 20, 7, 18},
                                    {2, 1, 64, 4990, 12}};
    for (int nth = 1; nth <= 3; nth++) {
        kth_pool *pool = NULL;
        if (nth > 1)
            assert_int_equal(kth_pool_create(nth, &pool), 0);
        for (size_t sh = 0; sh < sizeof(shapes) / sizeof(shapes[0]); sh++)
            for (int ty = 0; ty < 3; ty++) {
                int NH = shapes[sh][0], NKV = shapes[sh][1], HD = shapes[sh][2];
                int P0 = shapes[sh][3], T = shapes[sh][4], CAP = P0 + T + 1;
                size_t row = (size_t)NKV * HD, qrow = (size_t)NH * HD;
                const kdtype types[3] = {KD_F32, KD_F16, KD_Q8_0};
                kdtype dt = types[ty];
                float *q = rnd(T * qrow, 2), *k = rnd(T * row, 1), *v = rnd(T * row, 1);
                if (dt == KD_Q8_0 && HD % 32) {
                    float *o = poisoned(T * qrow);
                    void *c = malloc(CAP * row * 4);
                    assert_int_equal(k_attn_prefill_mt(pool, o, q, k, v, c, c, dt, CAP, 0, T, NH,
                                                       NKV, HD), -EINVAL);
                    free(q), free(k), free(v), free(o), free(c);
                    continue;
                }
                float *hk = rnd((size_t)P0 * row + 1, 1), *hv = rnd((size_t)P0 * row + 1, 1);
                /* The reference's caches: history then this chunk, f32. */
                float *rk = poisoned(CAP * row), *rv = poisoned(CAP * row);
                void *ck = malloc(kdtype_bytes(dt, CAP * row));
                void *cv = malloc(kdtype_bytes(dt, CAP * row));
                round_to(dt, k, T * row), round_to(dt, v, T * row);
                round_to(dt, hk, P0 * row), round_to(dt, hv, P0 * row);
                cache_put(rk, KD_F32, CAP, 0, hk, P0, NKV, HD);
                cache_put(rv, KD_F32, CAP, 0, hv, P0, NKV, HD);
                cache_put(ck, dt, CAP, 0, hk, P0, NKV, HD);
                cache_put(cv, dt, CAP, 0, hv, P0, NKV, HD);
                float *ref = poisoned(T * qrow), *got = poisoned(T * qrow);
                k_attn_prefill(ref, q, k, v, rk, rv, CAP, P0, T, NH, NKV, HD);
                assert_int_equal(k_attn_prefill_mt(pool, got, q, k, v, ck, cv, dt, CAP, P0, T,
                                                   NH, NKV, HD), 0);
                char what[96];
                snprintf(what, sizeof(what), "prefill %zu %s, %d threads", sh, kdtype_name(dt),
                         nth);
                assert_close(got, ref, T * qrow, 2e-5f, 2e-5f, what);
                /* Invariant: close to the reference, and each query the
                 * same bits as a decode step of it over the same cache. */
                {
                    void *ik = malloc(kdtype_bytes(dt, CAP * row));
                    void *iv = malloc(kdtype_bytes(dt, CAP * row));
                    cache_put(ik, dt, CAP, 0, hk, P0, NKV, HD);
                    cache_put(iv, dt, CAP, 0, hv, P0, NKV, HD);
                    float *inv = poisoned(T * qrow), *one = poisoned(qrow);
                    assert_int_equal(k_attn_prefill_inv_mt(pool, inv, q, k, v, ik, iv, dt, CAP, P0,
                                                           T, NH, NKV, HD), 0);
                    assert_close(inv, ref, T * qrow, 2e-5f, 2e-5f, "invariant prefill");
                    for (int t = 0; t < T; t++) {
                        int32_t len[1] = {P0 + t};
                        void *ikp[1] = {ik}, *ivp[1] = {iv};
                        assert_int_equal(k_attn_decode_inv_mt(pool, one, q + t * qrow, k + t * row,
                                                              v + t * row, ikp, ivp, dt, CAP, len,
                                                              1, NH, NKV, HD), 0);
                        assert_memory_equal(one, inv + t * qrow, qrow * sizeof(float));
                    }
                    free(ik), free(iv), free(inv), free(one);
                }
                /* The chunk's K and V are in the cache, in its type. */
                float *back = malloc(T * row * sizeof(float));
                cache_get(back, ck, dt, CAP, P0, T, NKV, HD);
                assert_memory_equal(back, k, T * row * sizeof(float));
                /* One decode step on top, in a batch whose middle row is
                 * empty (length -1): zeros there, the same as the reference
                 * elsewhere. */
                float *dq = rnd(3 * qrow, 2), *dk = rnd(3 * row, 1), *dv = rnd(3 * row, 1);
                round_to(dt, dk, 3 * row), round_to(dt, dv, 3 * row);
                int32_t lens[3] = {P0 + T, -1, P0 + T};
                void *kcs[3] = {ck, NULL, ck}, *vcs[3] = {cv, NULL, cv};
                /* Rows 0 and 2 share a cache: give row 2 row 0's token so
                 * both write the same K and V at the same position. */
                memcpy(dk + 2 * row, dk, row * sizeof(float));
                memcpy(dv + 2 * row, dv, row * sizeof(float));
                float *dref = poisoned(qrow), *dgot = poisoned(3 * qrow);
                float *rkp[1] = {rk}, *rvp[1] = {rv};
                int32_t rlen[1] = {P0 + T};
                k_attn_decode(dref, dq, dk, dv, rkp, rvp, CAP, rlen, 1, NH, NKV, HD);
                assert_int_equal(k_attn_decode_mt(pool, dgot, dq, dk, dv, kcs, vcs, dt, CAP, lens,
                                                  3, NH, NKV, HD), 0);
                snprintf(what, sizeof(what), "decode %zu %s, %d threads", sh, kdtype_name(dt),
                         nth);
                assert_close(dgot, dref, qrow, 2e-5f, 2e-5f, what);
                for (size_t i = 0; i < qrow; i++)
                    assert_true(dgot[qrow + i] == 0.0f);
                float *dref2 = poisoned(qrow);
                k_attn_decode(dref2, dq + 2 * qrow, dk, dv, rkp, rvp, CAP, rlen, 1, NH, NKV, HD);
                assert_close(dgot + 2 * qrow, dref2, qrow, 2e-5f, 2e-5f, what);
                assert_int_equal(k_attn_decode_mt(pool, dgot, dq, dk, dv, kcs, vcs, KD_BF16, CAP,
                                                  lens, 3, NH, NKV, HD), -EINVAL);
                /* A length the caches cannot take is refused, not written. */
                int32_t full[1] = {CAP};
                assert_int_equal(k_attn_decode_mt(pool, dgot, dq, dk, dv, kcs, vcs, dt, CAP, full,
                                                  1, NH, NKV, HD), -EINVAL);
                free(q), free(k), free(v), free(hk), free(hv), free(rk), free(rv), free(ck);
                free(cv), free(ref), free(got), free(back), free(dq), free(dk), free(dv);
                free(dref), free(dgot), free(dref2);
            }
        kth_pool_destroy(pool);
    }
}

/* The decode step that splits each (sequence, KV head) into parts of the
 * keys of a long sequence, then merges the parts: a long sequence beside a
 * short one and an empty row, f32, f16 and q8_0 caches, against the reference
 * row by row, and each row equal to the bit to its decode alone on one
 * thread. */
static void test_attention_split_decode(void **state)
{
    (void)state;
    enum { NH = 4, NKV = 2, HD = 64, B = 3, CAPR = 1501 };
    const int32_t lens[B] = {1500, 1, -1};
    size_t row = (size_t)NKV * HD, qrow = (size_t)NH * HD;
    for (int nth = 2; nth <= 3; nth++) {
        kth_pool *pool = NULL;
        assert_int_equal(kth_pool_create(nth, &pool), 0);
        for (int ty = 0; ty < 3; ty++) {
            const kdtype types[3] = {KD_F32, KD_F16, KD_Q8_0};
            kdtype dt = types[ty];
            float *q = rnd(B * qrow, 2), *k = rnd(B * row, 1), *v = rnd(B * row, 1);
            float *hist[B], *rk[B], *rv[B];
            void *kcs[B] = {NULL}, *vcs[B] = {NULL};
            round_to(dt, k, B * row), round_to(dt, v, B * row);
            for (int b = 0; b < B; b++) {
                size_t cap = (size_t)CAPR * row;
                hist[b] = rnd(2 * cap + 1, 1);
                round_to(dt, hist[b], 2 * cap);
                rk[b] = poisoned(cap), rv[b] = poisoned(cap);
                if (lens[b] < 0)
                    continue;
                cache_put(rk[b], KD_F32, CAPR, 0, hist[b], lens[b], NKV, HD);
                cache_put(rv[b], KD_F32, CAPR, 0, hist[b] + cap, lens[b], NKV, HD);
                kcs[b] = malloc(kdtype_bytes(dt, cap)), vcs[b] = malloc(kdtype_bytes(dt, cap));
                cache_put(kcs[b], dt, CAPR, 0, hist[b], lens[b], NKV, HD);
                cache_put(vcs[b], dt, CAPR, 0, hist[b] + cap, lens[b], NKV, HD);
            }
            float *got = poisoned(B * qrow);
            assert_int_equal(k_attn_decode_mt(pool, got, q, k, v, kcs, vcs, dt, CAPR, lens, B, NH,
                                              NKV, HD), 0);
            for (int b = 0; b < B; b++) {
                char what[64];
                snprintf(what, sizeof(what), "split decode row %d %s, %d threads", b,
                         kdtype_name(dt), nth);
                if (lens[b] < 0) {
                    for (size_t i = 0; i < qrow; i++)
                        assert_true(got[b * qrow + i] == 0.0f);
                    continue;
                }
                float *ref = poisoned(qrow), *rkp[1] = {rk[b]}, *rvp[1] = {rv[b]};
                int32_t rlen[1] = {lens[b]};
                k_attn_decode(ref, q + b * qrow, k + b * row, v + b * row, rkp, rvp, CAPR, rlen, 1,
                              NH, NKV, HD);
                assert_close(got + b * qrow, ref, qrow, 2e-5f, 2e-5f, what);
                free(ref);
                /* The same bits alone, on one thread: a sequence's outputs
                 * never depend on its batch or the threads.  The caches
                 * already hold this step's row, written again unchanged. */
                float *alone = poisoned(qrow);
                int32_t len1[1] = {lens[b]};
                assert_int_equal(k_attn_decode_mt(NULL, alone, q + b * qrow, k + b * row,
                                                  v + b * row, &kcs[b], &vcs[b], dt, CAPR, len1, 1,
                                                  NH, NKV, HD), 0);
                assert_memory_equal(alone, got + b * qrow, qrow * sizeof(float));
                free(alone);
            }
            for (int b = 0; b < B; b++)
                free(hist[b]), free(rk[b]), free(rv[b]), free(kcs[b]), free(vcs[b]);
            free(q), free(k), free(v), free(got);
        }
        kth_pool_destroy(pool);
    }
}

/* A decode step over sequences of lengths 0, 1, 5, 17, 40 (9 query heads on 3
 * KV heads, as SmolLM2) must give, for each, the last row of a prefill of
 * that sequence's whole history; and a prefill split in two chunks equals
 * one prefill. */
static void test_attention_decode_vs_prefill(void **state)
{
    (void)state;
    enum { B = 5, NH = 9, NKV = 3, HD = 16, CAP = 64 };
    const int32_t lens[B] = {0, 1, 5, 17, 40};
    size_t row = NKV * HD, qrow = NH * HD;
    float *kc[B], *vc[B], *hist_q[B], *hist_k[B], *hist_v[B];
    float *q = rnd(B * qrow, 1), *k = rnd(B * row, 1), *v = rnd(B * row, 1);
    for (int b = 0; b < B; b++) {
        int T = lens[b] + 1;
        hist_q[b] = rnd((size_t)T * qrow, 1);
        hist_k[b] = rnd((size_t)T * row, 1);
        hist_v[b] = rnd((size_t)T * row, 1);
        /* The step's token is the history's last. */
        memcpy(hist_q[b] + lens[b] * qrow, q + b * qrow, qrow * sizeof(float));
        memcpy(hist_k[b] + lens[b] * row, k + b * row, row * sizeof(float));
        memcpy(hist_v[b] + lens[b] * row, v + b * row, row * sizeof(float));
        kc[b] = poisoned(CAP * row);
        vc[b] = poisoned(CAP * row);
        cache_put(kc[b], KD_F32, CAP, 0, hist_k[b], lens[b], NKV, HD);
        cache_put(vc[b], KD_F32, CAP, 0, hist_v[b], lens[b], NKV, HD);
    }
    float *out = poisoned(B * qrow);
    k_attn_decode(out, q, k, v, kc, vc, CAP, lens, B, NH, NKV, HD);
    for (int b = 0; b < B; b++) {
        int T = lens[b] + 1;
        float *pk = poisoned(CAP * row), *pv = poisoned(CAP * row);
        float *po = poisoned((size_t)T * qrow), *po2 = poisoned((size_t)T * qrow);
        k_attn_prefill(po, hist_q[b], hist_k[b], hist_v[b], pk, pv, CAP, 0, T, NH, NKV, HD);
        assert_close(out + b * qrow, po + (T - 1) * qrow, qrow, 1e-6f, 1e-5f,
                     "decode vs prefill last row");
        for (int g = 0; g < NKV; g++) {
            size_t at = (size_t)g * CAP * HD;
            assert_close(kc[b] + at, pk + at, (size_t)T * HD, 0, 0, "decode cache vs prefill cache");
            assert_close(vc[b] + at, pv + at, (size_t)T * HD, 0, 0, "decode cache vs prefill cache");
        }
        /* Two chunks: the first h tokens, then the rest. */
        int h = T / 2;
        float *ck = poisoned(CAP * row), *cv = poisoned(CAP * row);
        k_attn_prefill(po2, hist_q[b], hist_k[b], hist_v[b], ck, cv, CAP, 0, h, NH, NKV, HD);
        k_attn_prefill(po2 + h * qrow, hist_q[b] + h * qrow, hist_k[b] + h * row,
                       hist_v[b] + h * row, ck, cv, CAP, h, T - h, NH, NKV, HD);
        assert_close(po2, po, (size_t)T * qrow, 1e-6f, 1e-5f, "chunked prefill");
        if (T == 1) /* one key: the output is its value, per group */
            for (int hh = 0; hh < NH; hh++)
                for (int i = 0; i < HD; i++)
                    assert_true(fabsf(po[hh * HD + i] - hist_v[b][(hh / 3) * HD + i]) < 1e-6f);
        free(pk);
        free(pv);
        free(po);
        free(po2);
        free(ck);
        free(cv);
        free(kc[b]);
        free(vc[b]);
        free(hist_q[b]);
        free(hist_k[b]);
        free(hist_v[b]);
    }
    free(q);
    free(k);
    free(v);
    free(out);
}

/* ---- sampling ------------------------------------------------------------------ */

/* A NaN logit never wins while a number is present, on argmax and on every
 * sampling path; a row of NaNs gives index 0; a row of -inf does not become
 * NaN.  (The CUDA kernels follow the same rule: tests/gpu/check_kernels.c.) */
static void test_nan_never_wins(void **state)
{
    (void)state;
    float nan = NAN, inf = INFINITY;
    enum { N = 5 };
    float rows[][N] = {
        {nan, 1, 2, nan, 0},       /* 2 */
        {nan, nan, -inf, nan, nan}, /* 2: -inf beats NaN */
        {nan, nan, nan, nan, nan},  /* 0 */
        {-inf, -inf, -inf, -inf, -inf}, /* 0 */
        {3, nan, 3, nan, 1},       /* 0: the lower index of a tie */
    };
    int want[] = {2, 2, 0, 0, 0};
    int nr = (int)(sizeof(want) / sizeof(want[0]));
    int32_t got[8];
    k_argmax(got, &rows[0][0], nr, N);
    for (int r = 0; r < nr; r++)
        assert_int_equal(got[r], want[r]);
    /* Greedy through the sampler, and top-k 1, agree. */
    k_sample(got, &rows[0][0], nr, N, 0.0f, 0, 1.0f, 1, 0);
    for (int r = 0; r < nr; r++)
        assert_int_equal(got[r], want[r]);
    k_sample(got, &rows[0][0], nr, N, 1.0f, 1, 1.0f, 1, 0);
    for (int r = 0; r < nr; r++)
        assert_int_equal(got[r], want[r]);
    /* Sampling at any seed draws only non-NaN tokens where one exists. */
    for (uint64_t seed = 1; seed < 200; seed++) {
        k_sample(got, &rows[0][0], nr, N, 2.0f, 4, 1.0f, seed, 0);
        for (int r = 0; r < nr; r++) {
            if (r == 2)
                assert_int_equal(got[r], 0);
            else
                assert_false(isnan(rows[r][got[r]]));
        }
        /* The qsort path (k > 64) on a wide row with NaNs spread in. */
        float wide[200];
        for (int i = 0; i < 200; i++)
            wide[i] = i % 3 == 0 ? nan : (float)(i % 17);
        int32_t t;
        k_sample(&t, wide, 1, 200, 1.5f, 100, 1.0f, seed, 3);
        assert_false(isnan(wide[t]));
    }
}

/* GELU's erf form against the definition in double, the broadcast add
 * against a loop with a modulo. */
static void test_gelu_erf_add_bcast(void **state)
{
    (void)state;
    size_t n = 1001, nb = 7 * 11;
    float *x = rnd(n, 6), *y = poisoned(n), *b = rnd(nb, 2);
    k_gelu_erf(y, x, n);
    for (size_t i = 0; i < n; i++) {
        double want = 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0)));
        assert_true(fabs(y[i] - want) <= 1e-6 + 1e-6 * fabs(want));
    }
    /* The fast path, on a pool and alone: the bound of the reference, and
     * the same bits whatever the threads. */
    kth_pool *pool = NULL;
    assert_int_equal(kth_pool_create(3, &pool), 0);
    size_t nf = 3 * 4096 + 13;
    float *xf = rnd(nf, 8), *yf = poisoned(nf), *solo = poisoned(nf);
    xf[0] = 0, xf[1] = -0.0f, xf[2] = 5.7f, xf[3] = -5.7f, xf[4] = 1e-30f, xf[5] = -30;
    k_gelu_erf_mt(pool, yf, xf, nf);
    k_gelu_erf_mt(NULL, solo, xf, nf);
    assert_memory_equal(yf, solo, nf * sizeof(float));
    for (size_t i = 0; i < nf; i++) {
        double want = 0.5 * xf[i] * (1.0 + erf(xf[i] / sqrt(2.0)));
        if (!(fabs(yf[i] - want) <= 1e-6 + 1e-6 * fabs(want)))
            fail_msg("gelu_erf_mt(%.9g) = %.9g, want %.9g", xf[i], yf[i], want);
    }
    kth_pool_destroy(pool);
    free(xf), free(yf), free(solo);
    size_t n2 = nb * 13;
    float *a = rnd(n2, 3), *z = poisoned(n2);
    k_add_bcast(z, a, n2, b, nb);
    for (size_t i = 0; i < n2; i++)
        assert_true(z[i] == a[i] + b[i % nb]);
    free(x), free(y), free(b), free(a), free(z);
}

/* Additions and layer norms shared out over a pool: the bits of one thread,
 * for sizes past the split (rows of B of several widths, a second operand
 * as long as the first) and below it. */
static void test_add_norm_mt(void **state)
{
    (void)state;
    kth_pool *pool = NULL;
    assert_int_equal(kth_pool_create(3, &pool), 0);
    static const size_t widths[] = {512, 77, 5000, 100000};
    for (size_t wi = 0; wi < sizeof(widths) / sizeof(widths[0]); wi++) {
        size_t nb = widths[wi], n = nb * (nb > 70000 ? 2 : 300000 / nb + 3);
        float *a = rnd(n, 3), *b = rnd(n, 2), *y = poisoned(n), *want = poisoned(n);
        k_add_mt(pool, y, a, n, b, nb);
        for (size_t i = 0; i < n; i++)
            if (y[i] != a[i] + b[i % nb])
                fail_msg("add_mt, rows of %zu: element %zu", nb, i);
        k_add_mt(pool, y, a, n, b, n);
        k_add(want, a, b, n);
        assert_memory_equal(y, want, n * sizeof(float));
        int dim = (int)nb, rows = (int)(n / nb);
        float *w = rnd(nb, 1), *bias = rnd(nb, 1);
        k_layernorm_mt(pool, y, a, w, bias, rows, dim, 1e-5f);
        k_layernorm(want, a, w, bias, rows, dim, 1e-5f);
        assert_memory_equal(y, want, n * sizeof(float));
        k_layernorm_mt(pool, y, a, w, NULL, 2, dim, 1e-5f);
        k_layernorm(want, a, w, NULL, 2, dim, 1e-5f);
        assert_memory_equal(y, want, 2 * nb * sizeof(float));
        free(a), free(b), free(y), free(want), free(w), free(bias);
    }
    kth_pool_destroy(pool);
}

/* im2col then a matrix product is the convolution of its definition. */
static void test_im2col_conv(void **state)
{
    (void)state;
    int shapes[][6] = {{1, 1, 1, 1, 1, 0}, {2, 30, 8, 3, 1, 1}, {3, 31, 5, 3, 2, 1},
                       {1, 9, 4, 5, 2, 2}, {2, 12, 3, 2, 3, 0}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int B = shapes[si][0], T = shapes[si][1], C = shapes[si][2], K = shapes[si][3];
        int st = shapes[si][4], pad = shapes[si][5], CO = 6;
        int T2 = (T + 2 * pad - K) / st + 1;
        float *x = rnd((size_t)B * T * C, 1), *w = rnd((size_t)CO * C * K, 1);
        float *col = poisoned((size_t)B * T2 * C * K), *y = poisoned((size_t)B * T2 * CO);
        k_im2col(col, x, B, T, C, K, st, pad);
        k_matmul_ref(y, col, w, 1, B * T2, CO, C * K, 0, 0, 0);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T2; t++)
                for (int o = 0; o < CO; o++) {
                    double acc = 0;
                    for (int c = 0; c < C; c++)
                        for (int j = 0; j < K; j++) {
                            int src = t * st + j - pad;
                            if (src >= 0 && src < T)
                                acc += (double)w[((size_t)o * C + c) * K + j] *
                                       x[((size_t)b * T + src) * C + c];
                        }
                    assert_true(fabs(y[((size_t)b * T2 + t) * CO + o] - acc) < 1e-5);
                }
        free(x), free(w), free(col), free(y);
    }
}

/* k_attn_full on both of its paths (a query at a time on the pool, sgemm
 * for many queries), and k_attn_full_kv16 on its own, against the
 * reference: the row path vectorized (a head
 * dimension that is a multiple of 8 on an AVX2 CPU) within rounding of it,
 * else in the same order, to the bit; either path gives the same bits on
 * the pool and alone. */
static void test_attention_full(void **state)
{
    (void)state;
    kth_pool *pool = NULL;
    assert_int_equal(kth_pool_create(3, &pool), 0);
    int shapes[][5] = {{1, 1, 1, 1, 8},   {2, 1, 150, 8, 64}, {3, 4, 37, 2, 32},
                       {1, 40, 40, 3, 64}, {2, 17, 100, 2, 16}, {2, 3, 1500, 8, 64},
                       {1, 2, 33, 2, 12}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int nb = shapes[si][0], t = shapes[si][1], s = shapes[si][2], h = shapes[si][3];
        int hd = shapes[si][4];
        size_t nq = (size_t)nb * t * h * hd, nk = (size_t)nb * s * h * hd;
        float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1);
        float *ref = poisoned(nq), *got = poisoned(nq), *solo = poisoned(nq);
        assert_int_equal(k_attn_full_ref(ref, q, k, v, nb, t, s, h, hd), 0);
        assert_int_equal(k_attn_full(pool, got, q, k, v, nb, t, s, h, hd), 0);
        assert_int_equal(k_attn_full(NULL, solo, q, k, v, nb, t, s, h, hd), 0);
        assert_memory_equal(solo, got, nq * sizeof(float));
        if (t >= 16)
            assert_close(got, ref, nq, 1e-5f, 1e-4f, "attn_full sgemm");
        else if (k__attend_f32_ok(hd))
            assert_close(got, ref, nq, 1e-6f, 1e-5f, "attn_full rows, AVX2");
        else
            assert_memory_equal(got, ref, nq * sizeof(float));
        /* K and V in f16 (k_cast_f16_fast, which rounds as k_cast): the
         * reference over them widened. */
        uint16_t *k16 = malloc(nk * 2), *v16 = malloc(nk * 2), *cast = malloc(nk * 2);
        assert_true(k16 && v16 && cast);
        k_cast_f16_fast(k16, k, nk);
        k_cast_f16_fast(v16, v, nk);
        assert_int_equal(k_cast(cast, KD_F16, k, KD_F32, nk), 0);
        assert_memory_equal(cast, k16, nk * 2);
        assert_int_equal(k_cast(k, KD_F32, k16, KD_F16, nk), 0);
        assert_int_equal(k_cast(v, KD_F32, v16, KD_F16, nk), 0);
        assert_int_equal(k_attn_full_ref(ref, q, k, v, nb, t, s, h, hd), 0);
        assert_int_equal(k_attn_full_kv16(pool, got, q, k16, v16, nb, t, s, h, hd), 0);
        assert_int_equal(k_attn_full_kv16(NULL, solo, q, k16, v16, nb, t, s, h, hd), 0);
        assert_memory_equal(solo, got, nq * sizeof(float));
        assert_close(got, ref, nq, 1e-5f, 1e-4f, "attn_full, K and V in f16");
        free(k16), free(v16), free(cast);
        free(q), free(k), free(v), free(ref), free(got), free(solo);
    }
    kth_pool_destroy(pool);
}

/* k_attn_full_bf16 against the reference over V rounded to bf16: within
 * the rounding of the weights (peaked scores, so that a wrong row or head
 * would be far off), the same bits on
 * the pool and alone, over blocks of 128 queries, a padded last block and
 * fewer queries than a block. */
static void test_attention_full_bf16(void **state)
{
    (void)state;
    if (!k_matmul_bf16_native())
        skip_because("oneDNN has no bf16 product on this CPU");
    kth_pool *pool = NULL;
    assert_int_equal(kth_pool_create(2, &pool), 0);
    int shapes[][5] = {{1, 1, 1, 1, 32}, {2, 150, 150, 2, 64}, {1, 20, 300, 3, 32},
                       {2, 256, 77, 1, 64}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int nb = shapes[si][0], t = shapes[si][1], s = shapes[si][2], h = shapes[si][3];
        int hd = shapes[si][4];
        size_t nq = (size_t)nb * t * h * hd, nk = (size_t)nb * s * h * hd;
        float *q = rnd(nq, 2), *k = rnd(nk, 1), *v = rnd(nk, 1);
        float *ref = poisoned(nq), *got = poisoned(nq), *solo = poisoned(nq);
        /* V is rounded to bf16; Q and K go in two halves each. */
        uint16_t *vb = malloc(nk * 2);
        assert_non_null(vb);
        assert_int_equal(k_cast(vb, KD_BF16, v, KD_F32, nk), 0);
        assert_int_equal(k_cast(v, KD_F32, vb, KD_BF16, nk), 0);
        free(vb);
        assert_int_equal(k_attn_full_ref(ref, q, k, v, nb, t, s, h, hd), 0);
        assert_int_equal(k_attn_full_bf16(pool, got, q, k, v, nb, t, s, h, hd), 0);
        assert_int_equal(k_attn_full_bf16(NULL, solo, q, k, v, nb, t, s, h, hd), 0);
        assert_memory_equal(solo, got, nq * sizeof(float));
        double sum = 0;
        for (size_t i = 0; i < nq; i++)
            sum += fabsf(got[i] - ref[i]);
        print_message("attn_full_bf16 %dx%dx%dx%dx%d: largest error within bounds, mean %.2g\n",
                      nb, t, s, h, hd, sum / (double)nq);
        assert_close(got, ref, nq, 1e-2f, 1e-2f, "attn_full bf16");
        assert_true(sum / (double)nq < 3e-4);
        free(q), free(k), free(v), free(ref), free(got), free(solo);
    }
    kth_pool_destroy(pool);
}

static void test_sample(void **state)
{
    (void)state;
    int rows = 6, n = 4099;
    float *x = rnd((size_t)rows * n, 5);
    int32_t am[6], s1[6], s2[6];
    k_argmax(am, x, rows, n);
    k_sample(s1, x, rows, n, 0.8f, 1, 1.0f, 7, 100);
    assert_memory_equal(s1, am, sizeof(am));           /* top-k 1 = argmax */
    k_sample(s1, x, rows, n, 0.0f, 40, 0.9f, 7, 100);
    assert_memory_equal(s1, am, sizeof(am));           /* temperature 0 = argmax */
    k_sample(s1, x, rows, n, 1.0f, 0, 1e-9f, 7, 100);
    assert_memory_equal(s1, am, sizeof(am));           /* top-p ~0 = argmax */
    /* Reproducible per (seed, counter); rows use consecutive counters. */
    int k_values[] = {0, 5, 40, 100, 300};
    for (size_t ki = 0; ki < sizeof(k_values) / sizeof(k_values[0]); ki++) {
        k_sample(s1, x, rows, n, 1.0f, k_values[ki], 0.95f, 1234, 50);
        k_sample(s2, x, rows, n, 1.0f, k_values[ki], 0.95f, 1234, 50);
        assert_memory_equal(s1, s2, sizeof(s1));
        int32_t one;
        k_sample(&one, x + 3 * n, 1, n, 1.0f, k_values[ki], 0.95f, 1234, 53);
        assert_int_equal(one, s1[3]);
        if (k_values[ki] > 0) /* the token is among the top k */
            for (int r = 0; r < rows; r++) {
                int above = 0;
                for (int i = 0; i < n; i++)
                    above += x[r * n + i] > x[r * n + s1[r]];
                assert_true(above < k_values[ki]);
            }
    }
    /* Different counters sample different tokens (a flat distribution over
     * 50 candidates would repeat one token 200 times with probability ~0). */
    float flat[64] = {0};
    int32_t first, t;
    k_sample(&first, flat, 1, 64, 1.0f, 50, 1.0f, 9, 0);
    int differs = 0, hist[64] = {0};
    for (uint64_t c = 0; c < 200; c++) {
        k_sample(&t, flat, 1, 64, 1.0f, 50, 1.0f, 9, c);
        assert_true(t >= 0 && t < 50); /* ties: the 50 lowest indices */
        hist[t]++;
        differs |= t != first;
    }
    assert_true(differs);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_known),
        cmocka_unit_test(test_cast),
        cmocka_unit_test(test_philox),
        cmocka_unit_test(test_matmul_blas_vs_ref),
        cmocka_unit_test(test_quant_layout),
        cmocka_unit_test(test_quant_roundtrip),
        cmocka_unit_test(test_qmatvec_fast_vs_ref),
        cmocka_unit_test(test_qmatmul_vs_ref),
        cmocka_unit_test(test_quantize_act),
        cmocka_unit_test(test_qmatmul_q8_vs_ref),
        cmocka_unit_test(test_qmatmul_threads),
        cmocka_unit_test(test_thread_pool),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_softmax_argmax),
        cmocka_unit_test(test_logsumexp),
        cmocka_unit_test(test_attention_decode_vs_prefill),
        cmocka_unit_test(test_attention_fast_vs_ref),
        cmocka_unit_test(test_attention_split_decode),
        cmocka_unit_test(test_sample),
        cmocka_unit_test(test_gelu_erf_add_bcast),
        cmocka_unit_test(test_im2col_conv),
        cmocka_unit_test(test_attention_full),
        cmocka_unit_test(test_matmul_bf16),
        cmocka_unit_test(test_attention_full_bf16),
        cmocka_unit_test(test_add_norm_mt),
        cmocka_unit_test(test_nan_never_wins),
    };
    return cmocka_run_group_tests_name("kernels", tests, NULL, NULL);
}
