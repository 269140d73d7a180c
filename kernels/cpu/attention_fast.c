/* The fast CPU path of KOP_ATTN_PREFILL and KOP_ATTN_DECODE: the same
 * arithmetic as the references in attention.c (scores, max-subtracted
 * softmax, weighted sum of V), vectorized with AVX2 over the head dimension
 * and spread over the kernels' thread pool, one task per (query head, block
 * of queries).
 *
 * Tasks are taken from a shared counter rather than split evenly: under
 * the causal mask the last queries of a prompt attend to many more keys
 * than the first, so equal counts of queries are unequal work.
 *
 * The cache holds f32, f16 (half the memory and half the bytes a long
 * context's decode step reads) or q8_0 (about half of f16 again); f16 and
 * q8_0 are widened as they are read, and new rows are rounded to nearest
 * even as k_cast does, or quantized as k_quantize does, as they are
 * written.
 *
 * Scratch is one score row per query, on the stack up to SCORES_ON_STACK
 * keys and on the heap beyond: memory grows with the context, never with
 * the square of the prompt. */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/attention_fast.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/threads.h"
#include "kernels/kernels.h"

#define SCORES_ON_STACK 4096
/* Queries per prefill task: enough to amortize taking a task, few enough
 * that two threads share a short prompt evenly. */
#define QUERY_BLOCK 16
/* The split decode (k_attn_decode_mt): keys in a part, and the most parts
 * of one sequence. */
#define SPLIT_KEYS 256
#define SPLIT_MAX 64

/* The element types of a cache.  Q8 is ggml's q8_0 (kernels/cpu/quant.h):
 * blocks of K_QK = 32 elements, each an f16 scale and 32 int8
 * (K_Q8_0_BYTES = 34), a row of a head holding HD / 32 blocks; it needs HD
 * a multiple of 32, so that element i of a cache is in its block i / 32
 * whatever the row. */
typedef enum kv_fmt { KV_F32, KV_F16, KV_Q8 } kv_fmt;

/* Bytes of the first N elements of a cache (N a multiple of 32 for Q8). */
static inline size_t kv_bytes(size_t n, kv_fmt fmt)
{
    return fmt == KV_Q8 ? n / K_QK * K_Q8_0_BYTES : n * (fmt == KV_F16 ? 2 : 4);
}

/* The f16 scale of the Q8 block at B (its first two bytes; a block may
 * start at any even offset, so they are copied, not dereferenced). */
static inline uint16_t q8_scale(const uint8_t *b)
{
    uint16_t d;
    memcpy(&d, b, 2);
    return d;
}

/* Element I of a cache, as a float. */
static inline float cache_at(const void *c, size_t i, kv_fmt fmt)
{
    if (fmt == KV_Q8) {
        const uint8_t *b = (const uint8_t *)c + i / K_QK * K_Q8_0_BYTES;
        return k_f16_to_f32(q8_scale(b)) * (float)(int8_t)b[2 + i % K_QK];
    }
    return fmt == KV_F16 ? k_f16_to_f32(((const uint16_t *)c)[i]) : ((const float *)c)[i];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "kernels/cpu/vmath_avx2.h"

/* Softmax numerators of S[0, N) in place (the maximum subtracted), their
 * sum returned and the maximum in *MAX when MAX is not NULL; S[N, PAD) are
 * zeroed so that a tile may read them. */
AVX2 static float softmax_row(float *s, int n, int pad, float *max)
{
    float m = max_row(s, n);
    if (max)
        *max = m;
    __m256 vm = _mm256_set1_ps(m), vsum = _mm256_setzero_ps();
    float sum = 0;
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(s + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    for (; j < n; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    for (; j < pad; j++)
        s[j] = 0;
    return sum + hsum8(vsum);
}

/* Eight int8 at P as floats. */
AVX2 static inline __m256 widen_i8(const uint8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Eight cache elements from element I of P (I a multiple of 8): f32, f16
 * widened by F16C, or q8 times its block's scale. */
AVX2 static inline __m256 load8(const void *p, size_t i, kv_fmt fmt)
{
    if (fmt == KV_Q8) {
        const uint8_t *b = (const uint8_t *)p + i / K_QK * K_Q8_0_BYTES;
        return _mm256_mul_ps(widen_i8(b + 2 + i % K_QK), _mm256_set1_ps(_cvtsh_ss(q8_scale(b))));
    }
    if (fmt == KV_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

/* OUT[HD] = softmax(Q . K[j] * scale, j < CTX) . V[j], K and V rows ROW
 * elements apart, f16 or f32 (F16, a constant in each caller, so each
 * instance has only its loads); HD a multiple of 8.  S: CTX floats of
 * scratch. */
AVX2 static inline __attribute__((always_inline)) void
attend(float *out, const float *q, const void *kc, const void *vc, int ctx, size_t row, int hd,
       float *s, kv_fmt fmt)
{
    float scale = 1.0f / sqrtf((float)hd);
    int j = 0;
    /* Two keys at a time: two independent chains of FMAs. */
    for (; j + 2 <= ctx; j += 2) {
        size_t k0 = (size_t)j * row, k1 = k0 + row;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int i = 0; i < hd; i += 8) {
            __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, load8(kc, k0 + (size_t)i, fmt), a0);
            a1 = _mm256_fmadd_ps(qv, load8(kc, k1 + (size_t)i, fmt), a1);
        }
        s[j] = hsum8(a0) * scale;
        s[j + 1] = hsum8(a1) * scale;
    }
    for (; j < ctx; j++) {
        size_t k0 = (size_t)j * row;
        __m256 a0 = _mm256_setzero_ps();
        for (int i = 0; i < hd; i += 8)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(kc, k0 + (size_t)i, fmt), a0);
        s[j] = hsum8(a0) * scale;
    }
    float inv = 1.0f / softmax_row(s, ctx, ctx, NULL);
    /* OUT = sum_j p_j V[j], 32 dims at a time in four named accumulators
     * (an array of them would live in memory). */
    __m256 vinv = _mm256_set1_ps(inv);
    for (int i0 = 0; i0 < hd; i0 += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        if (hd - i0 >= 32) {
            for (j = 0; j < ctx; j++) {
                size_t vj = (size_t)j * row + (size_t)i0;
                __m256 p = _mm256_set1_ps(s[j]);
                a0 = _mm256_fmadd_ps(p, load8(vc, vj, fmt), a0);
                a1 = _mm256_fmadd_ps(p, load8(vc, vj + 8, fmt), a1);
                a2 = _mm256_fmadd_ps(p, load8(vc, vj + 16, fmt), a2);
                a3 = _mm256_fmadd_ps(p, load8(vc, vj + 24, fmt), a3);
            }
            _mm256_storeu_ps(out + i0, _mm256_mul_ps(a0, vinv));
            _mm256_storeu_ps(out + i0 + 8, _mm256_mul_ps(a1, vinv));
            _mm256_storeu_ps(out + i0 + 16, _mm256_mul_ps(a2, vinv));
            _mm256_storeu_ps(out + i0 + 24, _mm256_mul_ps(a3, vinv));
            continue;
        }
        /* The last 8 to 24 dims, 8 at a time. */
        for (int i = i0; i < hd; i += 8) {
            a0 = _mm256_setzero_ps();
            for (j = 0; j < ctx; j++)
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(s[j]), load8(vc, (size_t)j * row + (size_t)i, fmt),
                                     a0);
            _mm256_storeu_ps(out + i, _mm256_mul_ps(a0, vinv));
        }
    }
}

AVX2 static void attend_avx2(float *out, const float *q, const void *kc, const void *vc, int ctx,
                             size_t row, int hd, float *s, kv_fmt fmt)
{
    if (fmt == KV_Q8)
        attend(out, q, kc, vc, ctx, row, hd, s, KV_Q8);
    else if (fmt == KV_F16)
        attend(out, q, kc, vc, ctx, row, hd, s, KV_F16);
    else
        attend(out, q, kc, vc, ctx, row, hd, s, KV_F32);
}

/* ---- prefill in tiles ---------------------------------------------------------- */

/* A prefill's queries are many, so its attention is two matrix products
 * per head, S = Q K^T and O = P V, computed in tiles of TQ queries: the
 * keys of a KV head are first widened to f32 and transposed into a panel
 * (KT[dim][key]), and the values widened (VP[key][dim]), once for all the
 * heads and queries of a task; each tile then keeps TQ x 16 outputs in
 * registers and streams the panels with one broadcast per FMA pair.  The
 * scores of a tile (TQ rows of the context) are the only scratch. */
#define TQ 4

/* S[q][0, NK) = Q[q] . K[j] * SCALE for the NQ (<= TQ) queries at Q (QS
 * floats apart); KT is [HD][LDK] with LDK a multiple of 16 >= NK.  The
 * accumulators are named variables, not an array: that is what keeps them
 * in registers. */
AVX2 static void tile_qk(float *s, size_t lds, const float *q, size_t qs, int nq, const float *kt,
                         size_t ldk, int nk, int hd, float scale)
{
    /* Rows past NQ repeat the last query: no branch in the loop. */
    const float *q0 = q, *q1 = q + (size_t)(nq > 1 ? 1 : 0) * qs;
    const float *q2 = q + (size_t)(nq > 2 ? 2 : nq - 1) * qs, *q3 = q + (size_t)(nq - 1) * qs;
    __m256 vs = _mm256_set1_ps(scale);
    for (int j = 0; j < nk; j += 16) {
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
        __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
        const float *k = kt + j;
        for (int i = 0; i < hd; i++, k += ldk) {
            __m256 k0 = _mm256_loadu_ps(k), k1 = _mm256_loadu_ps(k + 8), b;
            b = _mm256_broadcast_ss(q0 + i);
            a00 = _mm256_fmadd_ps(b, k0, a00), a01 = _mm256_fmadd_ps(b, k1, a01);
            b = _mm256_broadcast_ss(q1 + i);
            a10 = _mm256_fmadd_ps(b, k0, a10), a11 = _mm256_fmadd_ps(b, k1, a11);
            b = _mm256_broadcast_ss(q2 + i);
            a20 = _mm256_fmadd_ps(b, k0, a20), a21 = _mm256_fmadd_ps(b, k1, a21);
            b = _mm256_broadcast_ss(q3 + i);
            a30 = _mm256_fmadd_ps(b, k0, a30), a31 = _mm256_fmadd_ps(b, k1, a31);
        }
        __m256 out[TQ][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
        for (int r = 0; r < nq; r++) {
            _mm256_storeu_ps(s + (size_t)r * lds + j, _mm256_mul_ps(out[r][0], vs));
            _mm256_storeu_ps(s + (size_t)r * lds + j + 8, _mm256_mul_ps(out[r][1], vs));
        }
    }
}

/* O[q][0, HD) = INV[q] * sum_{j < NK} P[q][j] V[j] for NQ queries, V
 * [NK][HD] f32. */
AVX2 static void tile_pv(float *o, size_t os, const float *p, size_t ldp, int nq, const float *v,
                         int nk, int hd, const float *inv)
{
    const float *p0 = p, *p1 = p + (size_t)(nq > 1 ? 1 : 0) * ldp;
    const float *p2 = p + (size_t)(nq > 2 ? 2 : nq - 1) * ldp, *p3 = p + (size_t)(nq - 1) * ldp;
    for (int d = 0; d < hd; d += 16) {
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
        __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
        const float *vj = v + d;
        for (int j = 0; j < nk; j++, vj += hd) {
            __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8), b;
            b = _mm256_broadcast_ss(p0 + j);
            a00 = _mm256_fmadd_ps(b, v0, a00), a01 = _mm256_fmadd_ps(b, v1, a01);
            b = _mm256_broadcast_ss(p1 + j);
            a10 = _mm256_fmadd_ps(b, v0, a10), a11 = _mm256_fmadd_ps(b, v1, a11);
            b = _mm256_broadcast_ss(p2 + j);
            a20 = _mm256_fmadd_ps(b, v0, a20), a21 = _mm256_fmadd_ps(b, v1, a21);
            b = _mm256_broadcast_ss(p3 + j);
            a30 = _mm256_fmadd_ps(b, v0, a30), a31 = _mm256_fmadd_ps(b, v1, a31);
        }
        __m256 out[TQ][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
        for (int r = 0; r < nq; r++) {
            __m256 vi = _mm256_set1_ps(inv[r]);
            _mm256_storeu_ps(o + (size_t)r * os + d, _mm256_mul_ps(out[r][0], vi));
            _mm256_storeu_ps(o + (size_t)r * os + d + 8, _mm256_mul_ps(out[r][1], vi));
        }
    }
}

/* Per-thread panels of a tiled task, grown as contexts grow. */
typedef struct tile_ws {
    float *kt, *vp, *s;
    size_t keys;                        /* capacity in keys (a multiple of 16) */
} tile_ws;

static int tile_ws_reserve(tile_ws *w, size_t keys, int hd)
{
    if (keys <= w->keys)
        return 0;
    free(w->kt), free(w->vp), free(w->s);
    w->kt = malloc(keys * (size_t)hd * sizeof(float));
    w->vp = malloc(keys * (size_t)hd * sizeof(float));
    w->s = malloc(keys * TQ * sizeof(float));
    w->keys = w->kt && w->vp && w->s ? keys : 0;
    return w->keys ? 0 : -ENOMEM;
}

/* Queries [T0, T1) of the heads of KV head G of one sequence whose cache
 * (KC, VC: its rows for head G, ROW elements apart) held CTX0 rows before
 * this chunk; token t sees CTX0 + t + 1 rows. */
AVX2 static int tiled_task(float *out, const float *q, size_t qrow, const uint8_t *kc,
                           const uint8_t *vc, size_t row, kv_fmt fmt, int ctx0, int t0, int t1,
                           int g, int group, int hd, tile_ws *w)
{
    int nk = ctx0 + t1;
    size_t ldk = ((size_t)nk + 15) & ~(size_t)15;
    if (tile_ws_reserve(w, ldk, hd))
        return -ENOMEM;
    /* The panels: K transposed, V as rows, both f32; keys past NK are
     * zero, so that a 16-key tile may read them. */
    for (int j = 0; j < nk; j++)
        for (int i = 0; i < hd; i += 8) {
            __m256 kv = load8(kc, (size_t)j * row + (size_t)i, fmt);
            _mm256_storeu_ps(w->vp + (size_t)j * hd + i, load8(vc, (size_t)j * row + (size_t)i, fmt));
            float tmp[8];
            _mm256_storeu_ps(tmp, kv);
            for (int e = 0; e < 8; e++)
                w->kt[(size_t)(i + e) * ldk + (size_t)j] = tmp[e];
        }
    for (int i = 0; i < hd; i++)
        for (size_t j = (size_t)nk; j < ldk; j++)
            w->kt[(size_t)i * ldk + j] = 0;
    float scale = 1.0f / sqrtf((float)hd);
    for (int h = g * group; h < (g + 1) * group; h++)
        for (int t = t0; t < t1; t += TQ) {
            int nq = t1 - t < TQ ? t1 - t : TQ;
            /* Keys the last query of the tile sees; the others see fewer. */
            int seen = ctx0 + t + nq;
            size_t lds = ldk;
            const float *qt = q + (size_t)t * qrow + (size_t)h * hd;
            tile_qk(w->s, lds, qt, qrow, nq, w->kt, ldk, seen, hd, scale);
            float inv[TQ];
            for (int r = 0; r < nq; r++) {
                int own = ctx0 + t + r + 1;
                int pad = (seen + 15) & ~15;
                inv[r] = 1.0f / softmax_row(w->s + (size_t)r * lds, own, pad, NULL);
            }
            tile_pv(out + (size_t)t * qrow + (size_t)h * hd, qrow, w->s, lds, nq, w->vp, seen,
                    hd, inv);
        }
    return 0;
}

/* ---- decode: the heads of a KV head together ------------------------------------- */

/* A decode step has one query per head, so a KV head's rows are read once
 * for all the query heads that share it (GQA): each key row is widened
 * once into registers and dotted with every query of the group, and each
 * value row is widened once per 32 dims and added into up to three
 * queries' accumulators. */

/* Rows ahead that the decode loops prefetch. */
#define PREFETCH_ROWS 8

/* O[r][I0, I0 + 32) = INV[r] * sum_j P[r][j] V[j][I0..], for NQ (1..3,
 * a constant after inlining) queries. */
AVX2 static inline __attribute__((always_inline)) void
pv_group(float *const *o, const float *const *p, const float *inv, const void *vc, size_t row,
         int ctx, int i0, kv_fmt fmt, const int nq)
{
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m256 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    for (int j = 0; j < ctx; j++) {
        size_t at = (size_t)j * row + (size_t)i0;
        _mm_prefetch((const char *)vc + kv_bytes(at + PREFETCH_ROWS * row, fmt), _MM_HINT_T0);
        __m256 v0, v1, v2, v3, b;
        /* A q8 row's 32 dims here are one block (I0 is a multiple of 32):
         * its scale goes into the weights, once per query, rather than
         * into every element. */
        float d = 1.0f;
        if (fmt == KV_Q8) {
            const uint8_t *blk = (const uint8_t *)vc + kv_bytes(at, KV_Q8);
            d = _cvtsh_ss(q8_scale(blk));
            v0 = widen_i8(blk + 2), v1 = widen_i8(blk + 10);
            v2 = widen_i8(blk + 18), v3 = widen_i8(blk + 26);
        } else {
            v0 = load8(vc, at, fmt), v1 = load8(vc, at + 8, fmt);
            v2 = load8(vc, at + 16, fmt), v3 = load8(vc, at + 24, fmt);
        }
        b = _mm256_set1_ps(p[0][j] * d);
        a00 = _mm256_fmadd_ps(b, v0, a00), a01 = _mm256_fmadd_ps(b, v1, a01);
        a02 = _mm256_fmadd_ps(b, v2, a02), a03 = _mm256_fmadd_ps(b, v3, a03);
        if (nq > 1) {
            b = _mm256_set1_ps(p[1][j] * d);
            a10 = _mm256_fmadd_ps(b, v0, a10), a11 = _mm256_fmadd_ps(b, v1, a11);
            a12 = _mm256_fmadd_ps(b, v2, a12), a13 = _mm256_fmadd_ps(b, v3, a13);
        }
        if (nq > 2) {
            b = _mm256_set1_ps(p[2][j] * d);
            a20 = _mm256_fmadd_ps(b, v0, a20), a21 = _mm256_fmadd_ps(b, v1, a21);
            a22 = _mm256_fmadd_ps(b, v2, a22), a23 = _mm256_fmadd_ps(b, v3, a23);
        }
    }
    __m256 acc[3][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}};
    for (int r = 0; r < nq; r++) {
        __m256 vi = _mm256_set1_ps(inv[r]);
        for (int k = 0; k < 4; k++)
            _mm256_storeu_ps(o[r] + i0 + 8 * k, _mm256_mul_ps(acc[r][k], vi));
    }
}

/* The G queries at Q (HD floats apart, heads of one KV head) over CTX rows
 * of KC/VC (ROW elements apart); HD a multiple of 32; S: G * CTX floats.
 * When ML is not NULL, each query's score maximum and softmax sum go to
 * ML[r] and ML[G + r], so that attention over a part of the keys can be
 * merged with the other parts' (merge_parts).  F16 is a constant in each
 * caller (attend_group). */
AVX2 static inline __attribute__((always_inline)) void
attend_group_t(float *out, const float *q, int g, const void *kc, const void *vc, int ctx,
               size_t row, int hd, float *s, float *ml, kv_fmt fmt)
{
    float scale = 1.0f / sqrtf((float)hd);
    if (hd == 64) {
        /* The common head size: a key row lives in eight registers while
         * every query of the group is dotted with it. */
        for (int j = 0; j < ctx; j++) {
            size_t at = (size_t)j * row;
            _mm_prefetch((const char *)kc + kv_bytes(at + PREFETCH_ROWS * row, fmt), _MM_HINT_T0);
            __m256 k0 = load8(kc, at, fmt), k1 = load8(kc, at + 8, fmt);
            __m256 k2 = load8(kc, at + 16, fmt), k3 = load8(kc, at + 24, fmt);
            __m256 k4 = load8(kc, at + 32, fmt), k5 = load8(kc, at + 40, fmt);
            __m256 k6 = load8(kc, at + 48, fmt), k7 = load8(kc, at + 56, fmt);
            for (int r = 0; r < g; r++) {
                const float *qr = q + (size_t)r * 64;
                __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(qr), k0);
                __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(qr + 8), k1);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 16), k2, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 24), k3, a1);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 32), k4, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 40), k5, a1);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 48), k6, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 56), k7, a1);
                s[(size_t)r * ctx + (size_t)j] = hsum8(_mm256_add_ps(a0, a1)) * scale;
            }
        }
    } else {
        for (int j = 0; j < ctx; j++) {
            size_t at = (size_t)j * row;
            _mm_prefetch((const char *)kc + kv_bytes(at + PREFETCH_ROWS * row, fmt), _MM_HINT_T0);
            for (int r = 0; r < g; r++) {
                const float *qr = q + (size_t)r * hd;
                __m256 a0 = _mm256_setzero_ps(), a1 = a0;
                for (int i = 0; i < hd; i += 16) {
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qr + i), load8(kc, at + (size_t)i, fmt),
                                         a0);
                    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qr + i + 8),
                                         load8(kc, at + (size_t)i + 8, fmt), a1);
                }
                s[(size_t)r * ctx + (size_t)j] = hsum8(_mm256_add_ps(a0, a1)) * scale;
            }
        }
    }
    float inv[64];
    for (int r = 0; r < g; r++) {
        float sum = softmax_row(s + (size_t)r * ctx, ctx, ctx, ml ? ml + r : NULL);
        inv[r] = 1.0f / sum;
        if (ml)
            ml[g + r] = sum;
    }
    for (int r0 = 0; r0 < g; r0 += 3) {
        int nq = g - r0 < 3 ? g - r0 : 3;
        float *o[3];
        const float *p[3];
        for (int r = 0; r < nq; r++) {
            o[r] = out + (size_t)(r0 + r) * hd;
            p[r] = s + (size_t)(r0 + r) * ctx;
        }
        for (int i0 = 0; i0 < hd; i0 += 32) {
            if (nq == 3)
                pv_group(o, p, inv + r0, vc, row, ctx, i0, fmt, 3);
            else if (nq == 2)
                pv_group(o, p, inv + r0, vc, row, ctx, i0, fmt, 2);
            else
                pv_group(o, p, inv + r0, vc, row, ctx, i0, fmt, 1);
        }
    }
}

AVX2 static void attend_group(float *out, const float *q, int g, const void *kc, const void *vc,
                              int ctx, size_t row, int hd, float *s, float *ml, kv_fmt fmt)
{
    if (fmt == KV_Q8)
        attend_group_t(out, q, g, kc, vc, ctx, row, hd, s, ml, KV_Q8);
    else if (fmt == KV_F16)
        attend_group_t(out, q, g, kc, vc, ctx, row, hd, s, ml, KV_F16);
    else
        attend_group_t(out, q, g, kc, vc, ctx, row, hd, s, ml, KV_F32);
}

static int have_avx2(void)
{
    return k_cpu_isa() >= K_ISA_AVX2;
}

int k__attend_f32_ok(int hd)
{
    return have_avx2() && hd % 8 == 0;
}

AVX2 void k__attend_f32(float *out, const float *q, const float *k, const float *v, int ctx,
                        size_t row, int hd, float *s)
{
    attend(out, q, k, v, ctx, row, hd, s, KV_F32);
}

AVX2 void k__attend_f16(float *out, const float *q, const uint16_t *k, const uint16_t *v, int ctx,
                        size_t row, int hd, float *s)
{
    attend(out, q, k, v, ctx, row, hd, s, KV_F16);
}

AVX2 void k__softmax_f32(float *p, int rows, int n)
{
    for (int r = 0; r < rows; r++, p += n) {
        __m256 inv = _mm256_set1_ps(1.0f / softmax_row(p, n, n, NULL));
        int j = 0;
        for (; j + 8 <= n; j += 8)
            _mm256_storeu_ps(p + j, _mm256_mul_ps(_mm256_loadu_ps(p + j), inv));
        for (; j < n; j++)
            p[j] *= _mm256_cvtss_f32(inv);
    }
}

#else

int k__attend_f32_ok(int hd)
{
    (void)hd;
    return 0;
}

void k__attend_f32(float *out, const float *q, const float *k, const float *v, int ctx, size_t row,
                   int hd, float *s)
{
    (void)out, (void)q, (void)k, (void)v, (void)ctx, (void)row, (void)hd, (void)s;
    abort(); /* k__attend_f32_ok() is 0: never called */
}

void k__attend_f16(float *out, const float *q, const uint16_t *k, const uint16_t *v, int ctx,
                   size_t row, int hd, float *s)
{
    (void)out, (void)q, (void)k, (void)v, (void)ctx, (void)row, (void)hd, (void)s;
    abort(); /* k__attend_f32_ok() is 0: never called */
}

void k__softmax_f32(float *p, int rows, int n)
{
    (void)p, (void)rows, (void)n;
    abort(); /* k__attend_f32_ok() is 0: never called */
}

static int have_avx2(void)
{
    return 0;
}

static void attend_avx2(float *out, const float *q, const void *kc, const void *vc, int ctx,
                        size_t row, int hd, float *s, kv_fmt fmt)
{
    (void)out, (void)q, (void)kc, (void)vc, (void)ctx, (void)row, (void)hd, (void)s, (void)fmt;
    abort(); /* have_avx2() is 0: never called */
}

typedef struct tile_ws {
    float *kt, *vp, *s;
    size_t keys;
} tile_ws;

static void attend_group(float *out, const float *q, int g, const void *kc, const void *vc,
                         int ctx, size_t row, int hd, float *s, float *ml, kv_fmt fmt)
{
    (void)out, (void)q, (void)g, (void)kc, (void)vc, (void)ctx, (void)row, (void)hd, (void)s;
    (void)ml, (void)fmt;
    abort(); /* have_avx2() is 0: never called */
}

static int tiled_task(float *out, const float *q, size_t qrow, const uint8_t *kc,
                      const uint8_t *vc, size_t row, kv_fmt fmt, int ctx0, int t0, int t1, int g,
                      int group, int hd, tile_ws *w)
{
    (void)out, (void)q, (void)qrow, (void)kc, (void)vc, (void)row, (void)fmt, (void)ctx0;
    (void)t0, (void)t1, (void)g, (void)group, (void)hd, (void)w;
    abort(); /* have_avx2() is 0: never called */
}

#endif

/* The portable version of attend: the reference's order of operations
 * (attention.c), reading the cache in either type. */
static void attend_scalar(float *out, const float *q, const void *kc, const void *vc, int ctx,
                          size_t row, int hd, float *s, kv_fmt fmt)
{
    float scale = 1.0f / sqrtf((float)hd);
    float m = -INFINITY;
    for (int j = 0; j < ctx; j++) {
        float d = 0;
        for (int i = 0; i < hd; i++)
            d += q[i] * cache_at(kc, (size_t)j * row + (size_t)i, fmt);
        s[j] = d * scale;
        m = s[j] > m ? s[j] : m;
    }
    float sum = 0;
    for (int j = 0; j < ctx; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < hd; i++)
        out[i] = 0;
    for (int j = 0; j < ctx; j++) {
        float p = s[j] * inv;
        for (int i = 0; i < hd; i++)
            out[i] += p * cache_at(vc, (size_t)j * row + (size_t)i, fmt);
    }
}

/* One attention problem: N_SEQ sequences of N_TOK new tokens each, query
 * rows at Q (head H of token t of sequence q at ((q * N_TOK + t) * N_HEAD
 * + H) * HD), each token t seeing CTX0[seq] + t + 1 cache rows. */
typedef struct attn_job {
    float *out;
    const float *q;
    void *const *kc, *const *vc;        /* per sequence, elements of KV_DT */
    const int32_t *ctx0;                /* per sequence: rows before its first token; < 0: none */
    int n_seq, n_tok;
    int n_head, n_kv, hd;
    size_t hstride;                     /* elements between KV heads in a cache: CAP * HD */
    kv_fmt fmt;                         /* the caches' element type */
    bool fast;                          /* attend_avx2, else attend_scalar */
    int blocks;                         /* query blocks per (sequence, head) */
    _Atomic int next;                   /* the next task */
    int err;                            /* -ENOMEM from a thread */
    int splits;                         /* grouped decode: the most parts of the keys of a
                                         * (sequence, KV head), each a task (split_parts);
                                         * 1: no split */
    float *part;                        /* splits > 1: per task, the group's outputs, then
                                         * their maxima and sums (PART_FLOATS); owned by
                                         * k_attn_decode_mt */
} attn_job;

/* Parts the keys of a sequence of CTX rows are split into: one below
 * 2 * SPLIT_KEYS, else SPLIT_KEYS keys each (more, past SPLIT_MAX parts).
 * It depends on the sequence alone, never on the batch or the threads, so
 * a sequence's outputs are the same bits whatever runs beside it. */
static int split_parts(int ctx)
{
    if (ctx < 2 * SPLIT_KEYS)
        return 1;
    int n = (ctx + SPLIT_KEYS - 1) / SPLIT_KEYS;
    return n < SPLIT_MAX ? n : SPLIT_MAX;
}

/* Floats of one task's part in the split decode: G output rows of HD,
 * then G maxima and G sums. */
#define PART_FLOATS(g, hd) ((size_t)(g) * (size_t)((hd) + 2))

static void attn_part(void *arg, int ith, int nth)
{
    (void)ith, (void)nth;
    attn_job *j = arg;
    size_t row = (size_t)j->hd, qrow = (size_t)j->n_head * j->hd;
    int group = j->n_head / j->n_kv, tasks = j->n_seq * j->n_head * j->blocks;
    float stack[SCORES_ON_STACK], *heap = NULL;
    size_t heap_n = 0;
    for (;;) {
        /* Heaviest first: the last query block of each head. */
        int task = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (task >= tasks)
            break;
        int blk = j->blocks - 1 - task / (j->n_seq * j->n_head);
        int sh = task % (j->n_seq * j->n_head), seq = sh / j->n_head, h = sh % j->n_head;
        if (j->ctx0[seq] < 0) {
            /* A row of the batch with no sequence: zeros, as the reference. */
            memset(j->out + ((size_t)seq * j->n_tok) * qrow + (size_t)h * j->hd, 0,
                   (size_t)j->hd * sizeof(float));
            continue;
        }
        int t0 = blk * QUERY_BLOCK, t1 = t0 + QUERY_BLOCK < j->n_tok ? t0 + QUERY_BLOCK : j->n_tok;
        size_t need = (size_t)j->ctx0[seq] + (size_t)t1;
        float *s = stack;
        if (need > SCORES_ON_STACK) {
            if (need > heap_n) {
                free(heap);
                heap_n = need;
                if (!(heap = malloc(heap_n * sizeof(float)))) {
                    j->err = -ENOMEM;
                    heap_n = 0;
                    continue;
                }
            }
            s = heap;
        }
        size_t koff = kv_bytes((size_t)(h / group) * j->hstride, j->fmt);
        const uint8_t *kc = (const uint8_t *)j->kc[seq] + koff;
        const uint8_t *vc = (const uint8_t *)j->vc[seq] + koff;
        for (int t = t0; t < t1; t++) {
            size_t qo = ((size_t)seq * j->n_tok + (size_t)t) * qrow + (size_t)h * j->hd;
            int ctx = j->ctx0[seq] + t + 1;
            if (j->fast)
                attend_avx2(j->out + qo, j->q + qo, kc, vc, ctx, row, j->hd, s, j->fmt);
            else
                attend_scalar(j->out + qo, j->q + qo, kc, vc, ctx, row, j->hd, s, j->fmt);
        }
    }
    free(heap);
}

/* The grouped decode's tasks: (sequence, KV head, part of the keys).  With
 * one part, a task writes its queries' outputs; with several, each part
 * writes its own outputs, maxima and sums into J->part, and merge_parts
 * combines them. */
static void attn_group_part(void *arg, int ith, int nth)
{
    (void)ith, (void)nth;
    attn_job *j = arg;
    size_t row = (size_t)j->hd, qrow = (size_t)j->n_head * j->hd;
    int group = j->n_head / j->n_kv, tasks = j->n_seq * j->n_kv * j->splits;
    float *s = NULL;
    size_t cap = 0;
    for (;;) {
        int task = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (task >= tasks)
            break;
        int c = task % j->splits, sg = task / j->splits;
        int seq = sg / j->n_kv, g = sg % j->n_kv;
        size_t qo = (size_t)seq * qrow + (size_t)g * group * j->hd;
        float *o = j->out + qo, *ml = NULL;
        if (j->splits > 1) {
            o = j->part + (size_t)task * PART_FLOATS(group, j->hd);
            ml = o + (size_t)group * j->hd;
        }
        int ctx = j->ctx0[seq] + 1, parts = split_parts(ctx);
        int per = (ctx + parts - 1) / parts;
        int c0 = c * per < ctx ? c * per : ctx;
        int c1 = c0 + per < ctx ? c0 + per : ctx;
        if (c >= parts)
            c0 = c1 = ctx;
        if (j->ctx0[seq] < 0 || c1 <= c0) {
            /* No sequence (zeros, as the reference), or no key in this part
             * (a weight of zero in the merge). */
            memset(o, 0, (size_t)group * j->hd * sizeof(float));
            if (ml)
                for (int r = 0; r < group; r++)
                    ml[r] = -INFINITY, ml[group + r] = 0;
            continue;
        }
        if ((size_t)group * (size_t)(c1 - c0) > cap) {
            free(s);
            cap = (size_t)group * (size_t)(c1 - c0);
            if (!(s = malloc(cap * sizeof(float)))) {
                cap = 0;
                j->err = -ENOMEM;
                continue;
            }
        }
        size_t koff = kv_bytes((size_t)g * j->hstride + (size_t)c0 * row, j->fmt);
        attend_group(o, j->q + qo, group, (const uint8_t *)j->kc[seq] + koff,
                     (const uint8_t *)j->vc[seq] + koff, c1 - c0, row, j->hd, s, ml, j->fmt);
    }
    free(s);
}

/* The outputs of a split decode: per query, the parts' outputs weighted by
 * their share of the softmax, sum_i l_i exp(m_i - M) over the total. */
static void merge_parts(const attn_job *j)
{
    int group = j->n_head / j->n_kv;
    size_t qrow = (size_t)j->n_head * j->hd, pf = PART_FLOATS(group, j->hd);
    for (int seq = 0; seq < j->n_seq; seq++)
        for (int g = 0; g < j->n_kv; g++) {
            const float *base = j->part + (size_t)(seq * j->n_kv + g) * j->splits * pf;
            for (int r = 0; r < group; r++) {
                float *o = j->out + (size_t)seq * qrow + ((size_t)g * group + r) * j->hd;
                float m = -INFINITY, w[64], total = 0;
                for (int c = 0; c < j->splits; c++) {
                    float mc = base[c * pf + (size_t)group * j->hd + r];
                    m = mc > m ? mc : m;
                }
                for (int c = 0; c < j->splits; c++) {
                    const float *ml = base + c * pf + (size_t)group * j->hd;
                    w[c] = ml[group + r] > 0 ? ml[group + r] * expf(ml[r] - m) : 0;
                    total += w[c];
                }
                memset(o, 0, (size_t)j->hd * sizeof(float));
                if (!(total > 0))
                    continue;                /* no sequence: zeros */
                for (int c = 0; c < j->splits; c++) {
                    const float *oc = base + c * pf + (size_t)r * j->hd;
                    float wc = w[c] / total;
                    for (int i = 0; i < j->hd; i++)
                        o[i] += wc * oc[i];
                }
            }
        }
}

/* Queries of a prefill task in the tiled path: enough that the panels a
 * task builds serve many queries. */
#define TILED_BLOCK 32

/* The tiled path's tasks: (sequence, KV head, block of TILED_BLOCK
 * queries), the last blocks first. */
static void attn_tiled_part(void *arg, int ith, int nth)
{
    (void)ith, (void)nth;
    attn_job *j = arg;
    size_t row = (size_t)j->hd, qrow = (size_t)j->n_head * j->hd;
    int group = j->n_head / j->n_kv, per = j->n_seq * j->n_kv, tasks = per * j->blocks;
    tile_ws w = {NULL, NULL, NULL, 0};
    for (;;) {
        int task = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (task >= tasks)
            break;
        int blk = j->blocks - 1 - task / per;
        int sg = task % per, seq = sg / j->n_kv, g = sg % j->n_kv;
        int t0 = blk * TILED_BLOCK, t1 = t0 + TILED_BLOCK < j->n_tok ? t0 + TILED_BLOCK : j->n_tok;
        size_t koff = kv_bytes((size_t)g * j->hstride, j->fmt);
        const uint8_t *kc = (const uint8_t *)j->kc[seq] + koff;
        const uint8_t *vc = (const uint8_t *)j->vc[seq] + koff;
        size_t base = (size_t)seq * j->n_tok * qrow;
        if (tiled_task(j->out + base, j->q + base, qrow, kc, vc, row, j->fmt, j->ctx0[seq], t0,
                       t1, g, group, j->hd, &w))
            j->err = -ENOMEM;
    }
    free(w.kt), free(w.vp), free(w.s);
}

static int run_job(kth_pool *pool, attn_job *j, kth_fn part)
{
    bool held = kth_acquire(pool) == 0;
    kth_run(held ? pool : NULL, part, j);
    if (held)
        kth_release(pool);
    return j->err;
}

/* Whether the kernels keep caches of DT for heads of HD: f32 and f16 for
 * any head size, q8_0 for a multiple of 32 (a row of a head is whole
 * blocks). */
static bool cache_type_ok(kdtype dt, int hd)
{
    return hd >= 1 && (dt == KD_F32 || dt == KD_F16 || (dt == KD_Q8_0 && hd % K_QK == 0));
}

static kv_fmt fmt_of(kdtype dt)
{
    return dt == KD_Q8_0 ? KV_Q8 : dt == KD_F16 ? KV_F16 : KV_F32;
}

/* N_TOK rows of K (or V), SRC [N_TOK][N_KV][HD], into CACHE [N_KV][CAP][HD]
 * at position POS, in the cache's type. */
static int put_rows(void *cache, kdtype dt, int cap, int pos, const float *src, int n_tok,
                    int n_kv, int hd)
{
    for (int t = 0; t < n_tok; t++)
        for (int g = 0; g < n_kv; g++) {
            size_t at = ((size_t)g * cap + (size_t)pos + t) * hd;
            uint8_t *to = (uint8_t *)cache + kdtype_bytes(dt, at);
            const float *from = src + ((size_t)t * n_kv + g) * hd;
            int rc = dt == KD_Q8_0 ? k_quantize(to, KD_Q8_0, from, (size_t)hd)
                                   : k_cast(to, dt, from, KD_F32, (size_t)hd);
            if (rc)
                return -EINVAL;
        }
    return 0;
}

/* INV: every query by attn_part's one routine (batch invariance). */
static int attn_prefill(kth_pool *pool, float *out, const float *q, const float *k,
                        const float *v, void *kc, void *vc, kdtype cache_dt, int cap, int pos0,
                        int n_tok, int n_head, int n_kv, int hd, bool inv)
{
    if (!cache_type_ok(cache_dt, hd) || n_head % n_kv || pos0 < 0 || n_tok < 0 ||
        pos0 > cap - n_tok)
        return -EINVAL;
    int rc = put_rows(kc, cache_dt, cap, pos0, k, n_tok, n_kv, hd);
    if (!rc)
        rc = put_rows(vc, cache_dt, cap, pos0, v, n_tok, n_kv, hd);
    if (rc)
        return rc;
    void *kcs[1] = {kc}, *vcs[1] = {vc};
    int32_t ctx0[1] = {pos0};
    /* Enough queries per KV head make the tiles pay for their panels. */
    bool tiled = !inv && have_avx2() && hd % 16 == 0 && n_tok >= 8;
    int per = tiled ? TILED_BLOCK : QUERY_BLOCK;
    attn_job j = {out, q, kcs, vcs, ctx0, 1, n_tok, n_head, n_kv, hd, (size_t)cap * hd,
                  fmt_of(cache_dt), have_avx2() && hd % 8 == 0, (n_tok + per - 1) / per, 0, 0};
    return run_job(pool, &j, tiled ? attn_tiled_part : attn_part);
}

static int attn_decode(kth_pool *pool, float *out, const float *q, const float *k,
                       const float *v, void *const *kc, void *const *vc, kdtype cache_dt, int cap,
                       const int32_t *lens, int batch, int n_head, int n_kv, int hd, bool inv)
{
    if (!cache_type_ok(cache_dt, hd) || n_head % n_kv)
        return -EINVAL;
    size_t row = (size_t)n_kv * hd;
    for (int b = 0; b < batch; b++) {
        if (lens[b] < 0)
            continue;
        if (lens[b] >= cap)
            return -EINVAL;
        int rc = put_rows(kc[b], cache_dt, cap, lens[b], k + (size_t)b * row, 1, n_kv, hd);
        if (!rc)
            rc = put_rows(vc[b], cache_dt, cap, lens[b], v + (size_t)b * row, 1, n_kv, hd);
        if (rc)
            return rc;
    }
    attn_job j = {out, q, kc, vc, lens, batch, 1, n_head, n_kv, hd, (size_t)cap * hd,
                  fmt_of(cache_dt), have_avx2() && hd % 8 == 0, 1, 0, 0, 1, NULL};
    bool grouped = !inv && have_avx2() && hd % 32 == 0 && n_head / n_kv <= 64;
    if (!grouped)
        return run_job(pool, &j, attn_part);
    /* A long sequence's keys are split into parts of SPLIT_KEYS, each a
     * task, and merge_parts weighs the parts' outputs by their softmax sums.
     * Few (sequence, KV head) tasks would leave threads idle (SmolLM2's 3
     * KV heads on 2 threads: one thread does two of them), and after a long
     * context attention is a good part of a decode step.  The parts depend
     * on each sequence's length only (split_parts): choosing them by the
     * batch or the threads would make a request's tokens depend on what
     * else runs at the time. */
    int tasks = batch * n_kv;
    for (int b = 0; b < batch; b++) {
        int parts = split_parts(lens[b] + 1);
        j.splits = parts > j.splits ? parts : j.splits;
    }
    if (j.splits > 1) {
        j.part = malloc((size_t)tasks * j.splits * PART_FLOATS(n_head / n_kv, hd) * sizeof(float));
        if (!j.part)
            return -ENOMEM;
    }
    int rc = run_job(pool, &j, attn_group_part);
    if (!rc && j.splits > 1)
        merge_parts(&j);
    free(j.part);
    return rc;
}

int k_attn_prefill_mt(kth_pool *pool, float *out, const float *q, const float *k, const float *v,
                      void *kc, void *vc, kdtype cache_dt, int cap, int pos0, int n_tok,
                      int n_head, int n_kv, int hd)
{
    return attn_prefill(pool, out, q, k, v, kc, vc, cache_dt, cap, pos0, n_tok, n_head, n_kv, hd,
                        false);
}

int k_attn_decode_mt(kth_pool *pool, float *out, const float *q, const float *k, const float *v,
                     void *const *kc, void *const *vc, kdtype cache_dt, int cap,
                     const int32_t *lens, int batch, int n_head, int n_kv, int hd)
{
    return attn_decode(pool, out, q, k, v, kc, vc, cache_dt, cap, lens, batch, n_head, n_kv, hd,
                       false);
}

int k_attn_prefill_inv_mt(kth_pool *pool, float *out, const float *q, const float *k,
                          const float *v, void *kc, void *vc, kdtype cache_dt, int cap, int pos0,
                          int n_tok, int n_head, int n_kv, int hd)
{
    return attn_prefill(pool, out, q, k, v, kc, vc, cache_dt, cap, pos0, n_tok, n_head, n_kv, hd,
                        true);
}

int k_attn_decode_inv_mt(kth_pool *pool, float *out, const float *q, const float *k,
                         const float *v, void *const *kc, void *const *vc, kdtype cache_dt,
                         int cap, const int32_t *lens, int batch, int n_head, int n_kv, int hd)
{
    return attn_decode(pool, out, q, k, v, kc, vc, cache_dt, cap, lens, batch, n_head, n_kv, hd,
                       true);
}
