/* The body of the x86 integer quantized products (qdot_x86.c includes it
 * once per instruction set).  The includer defines:
 *   QD_ATTR      the target attribute of every function here;
 *   QD_NAME(x)   x with the instruction set's suffix;
 *   QD_VNNI      1 to use AVX-512 VNNI's vpdpbusd (on 256-bit vectors),
 *                0 for AVX2's vpmaddubsw + vpmaddwd.
 *
 * A weight block becomes 32 bytes in one vector, byte i being weight i
 * (for Q4, the low nibbles fill lanes 0..15 and the high ones 16..31, the
 * order of the activation block); its products with an activation block are
 * summed in 8 int32 lanes, exactly, and only then scaled in float.  So each
 * block's contribution is the reference's up to the rounding of one scale,
 * and rows differ from it only in the order the blocks are summed. */

/* Unsigned bytes U times signed bytes S, summed in fours into int32 lanes. */
QD_ATTR static inline __m256i QD_NAME(dot_us)(__m256i u, __m256i s)
{
#if QD_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

QD_ATTR static inline float QD_NAME(f16)(const uint8_t *p)
{
    return _cvtsh_ss((unsigned short)(p[0] | (p[1] << 8)));
}

QD_ATTR static inline float QD_NAME(hsum)(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One weight block: its bytes (unsigned for Q4: nibbles 0..15; for Q8_0
 * the magnitudes, the signs going onto the activations), its scale, and
 * what each activation block's S is multiplied by (Q4_0: -8 d, Q4_1: m). */
typedef struct QD_NAME(wblk) {
    __m256i u;
    __m256i sign;   /* Q8_0 only: the weights, whose signs move to the activations */
    float d, c;
} QD_NAME(wblk);

QD_ATTR static inline QD_NAME(wblk) QD_NAME(unpack)(const uint8_t *b, kdtype t)
{
    QD_NAME(wblk) w;
    w.d = QD_NAME(f16)(b);
    w.c = 0;
    w.sign = _mm256_setzero_si256();
    if (t == KD_Q8_0) {
        w.sign = _mm256_loadu_si256((const __m256i *)(b + 2));
        w.u = _mm256_sign_epi8(w.sign, w.sign);
        return w;
    }
    const uint8_t *qs = b + (t == KD_Q4_1 ? 4 : 2);
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(q, m), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    w.u = _mm256_set_m128i(hi, lo);
    w.c = t == KD_Q4_1 ? QD_NAME(f16)(b + 2) : -8.0f * w.d;
    return w;
}

/* Adds block W times activation block A to ACC (scaled lanes) and *CORR. */
QD_ATTR static inline void QD_NAME(mac)(const QD_NAME(wblk) *w, kdtype t, const k_q8a *a,
                                        __m256 *acc, float *corr)
{
    __m256i q = _mm256_loadu_si256((const __m256i *)a->q);
    if (t == KD_Q8_0)
        q = _mm256_sign_epi8(q, w->sign);
    __m256i s = QD_NAME(dot_us)(w->u, q);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(w->d * a->d), *acc);
    *corr += w->c * a->s;
}

/* Y[j * LDY + r] for NW weight rows from R and NA activation rows from J:
 * a tile whose weights are unpacked once per block for all NA rows. */
#define QD_UNROLL _Pragma("GCC unroll 4")
/* How far ahead each weight row prefetches: the same block of a row whole
 * tiles of 4 rows further on, at least QD_PREFETCH bytes ahead.  A tile
 * reads 4 rows side by side, so a fixed distance smaller than 4 rows (1 KiB
 * was used before) fetched the next tile's first row only, and the other 3
 * streams were left to the hardware prefetcher, which stops at 4 KiB pages:
 * the 576 x 1536 matrices of SmolLM2 ran at half the rate of the 1536 x 576
 * ones.  Whole tiles ahead keep every row of the next tiles in flight
 * (one-thread decode of SmolLM2 went from about 82 to 91 tok/s here). */
#define QD_PREFETCH 2048

/* Y[j * LDY + i] for NW weight rows at W and NA activation rows at A: a
 * tile whose weight blocks are unpacked once for all NA rows, for weight
 * type T (a constant in each instance, so the type's branches fold away). */
#define QD_TILE(NW, NA, T, TN)                                                                  \
    QD_ATTR static void QD_NAME(tile_##TN##_##NW##x##NA)(float *y, size_t ldy,                  \
                                                         const uint8_t *w, size_t wrow,         \
                                                         const k_q8a *a, size_t arow, int nb)   \
    {                                                                                           \
        const size_t bb = T == KD_Q8_0 ? K_Q8_0_BYTES : T == KD_Q4_0 ? K_Q4_0_BYTES            \
                                                                     : K_Q4_1_BYTES;           \
        const size_t ahead = (QD_PREFETCH / (4 * wrow) + 1) * 4 * wrow;                         \
        __m256 acc[NW][NA];                                                                     \
        float corr[NW][NA];                                                                     \
        QD_UNROLL for (int i = 0; i < NW; i++)                                                  \
            QD_UNROLL for (int j = 0; j < NA; j++)                                              \
            {                                                                                   \
                acc[i][j] = _mm256_setzero_ps();                                                \
                corr[i][j] = 0;                                                                 \
            }                                                                                   \
        for (int blk = 0; blk < nb; blk++) {                                                    \
            QD_UNROLL for (int i = 0; i < NW; i++)                                              \
            {                                                                                   \
                const uint8_t *b = w + i * wrow + (size_t)blk * bb;                             \
                _mm_prefetch((const char *)b + ahead, _MM_HINT_T0);                            \
                QD_NAME(wblk) wb = QD_NAME(unpack)(b, T);                                       \
                QD_UNROLL for (int j = 0; j < NA; j++)                                          \
                    QD_NAME(mac)(&wb, T, a + j * arow + blk, &acc[i][j], &corr[i][j]);          \
            }                                                                                   \
        }                                                                                       \
        QD_UNROLL for (int i = 0; i < NW; i++)                                                  \
            QD_UNROLL for (int j = 0; j < NA; j++)                                              \
                y[j * ldy + i] = QD_NAME(hsum)(acc[i][j]) + corr[i][j];                         \
    }

#define QD_TILES(T, TN)                                                                         \
    QD_TILE(1, 1, T, TN)                                                                        \
    QD_TILE(1, 2, T, TN)                                                                        \
    QD_TILE(1, 3, T, TN)                                                                        \
    QD_TILE(1, 4, T, TN)                                                                        \
    QD_TILE(4, 1, T, TN)                                                                        \
    QD_TILE(4, 2, T, TN)                                                                        \
    QD_TILE(4, 3, T, TN)                                                                        \
    QD_TILE(4, 4, T, TN)                                                                        \
                                                                                                \
    /* Rows [R0, R1) of W times the M rows of A: 4 x 4 tiles, then the        */               \
    /* ragged edges.                                                          */               \
    QD_ATTR static void QD_NAME(qmm_##TN)(float *y, size_t ldy, const uint8_t *w,               \
                                          const k_q8a *a, int m, int r0, int r1, int nb,         \
                                          size_t wrow)                                          \
    {                                                                                           \
        size_t arow = (size_t)nb;                                                               \
        int r = r0;                                                                             \
        for (; r + 4 <= r1; r += 4) {                                                           \
            const uint8_t *wr = w + (size_t)r * wrow;                                           \
            int j = 0;                                                                          \
            for (; j + 4 <= m; j += 4)                                                          \
                QD_NAME(tile_##TN##_4x4)(y + j * ldy + r, ldy, wr, wrow, a + j * arow, arow, nb); \
            float *yj = y + j * ldy + r;                                                        \
            const k_q8a *aj = a + j * arow;                                                     \
            switch (m - j) {                                                                    \
            case 3: QD_NAME(tile_##TN##_4x3)(yj, ldy, wr, wrow, aj, arow, nb); break;           \
            case 2: QD_NAME(tile_##TN##_4x2)(yj, ldy, wr, wrow, aj, arow, nb); break;           \
            case 1: QD_NAME(tile_##TN##_4x1)(yj, ldy, wr, wrow, aj, arow, nb); break;           \
            default: break;                                                                     \
            }                                                                                   \
        }                                                                                       \
        for (; r < r1; r++) {                                                                   \
            const uint8_t *wr = w + (size_t)r * wrow;                                           \
            int j = 0;                                                                          \
            for (; j + 4 <= m; j += 4)                                                          \
                QD_NAME(tile_##TN##_1x4)(y + j * ldy + r, ldy, wr, wrow, a + j * arow, arow, nb); \
            float *yj = y + j * ldy + r;                                                        \
            const k_q8a *aj = a + j * arow;                                                     \
            switch (m - j) {                                                                    \
            case 3: QD_NAME(tile_##TN##_1x3)(yj, ldy, wr, wrow, aj, arow, nb); break;           \
            case 2: QD_NAME(tile_##TN##_1x2)(yj, ldy, wr, wrow, aj, arow, nb); break;           \
            case 1: QD_NAME(tile_##TN##_1x1)(yj, ldy, wr, wrow, aj, arow, nb); break;           \
            default: break;                                                                     \
            }                                                                                   \
        }                                                                                       \
    }

QD_TILES(KD_Q8_0, q8_0)
QD_TILES(KD_Q4_0, q4_0)
QD_TILES(KD_Q4_1, q4_1)
#undef QD_TILES
#undef QD_TILE
#undef QD_UNROLL
#undef QD_PREFETCH

/* Y[j, r] for rows [R0, R1) of W and every row j < M of A (Y's rows LDY
 * floats apart). */
QD_ATTR void QD_NAME(k__qmm_q8)(float *y, size_t ldy, const void *w, kdtype t, const k_q8a *a,
                                int m, int r0, int r1, int cols)
{
    int nb = cols / K_QK;
    size_t wrow = (size_t)nb * k_block_bytes(t);
    if (t == KD_Q8_0)
        QD_NAME(qmm_q8_0)(y, ldy, w, a, m, r0, r1, nb, wrow);
    else if (t == KD_Q4_0)
        QD_NAME(qmm_q4_0)(y, ldy, w, a, m, r0, r1, nb, wrow);
    else
        QD_NAME(qmm_q4_1)(y, ldy, w, a, m, r0, r1, nb, wrow);
}

/* N floats of X (a multiple of 32) as activation blocks: the reference's
 * arithmetic exactly (the same maximum, x * (1/d) rounded to nearest even),
 * so both give the same bytes. */
QD_ATTR void QD_NAME(k__quant_act)(k_q8a *a, const float *x, size_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t b = 0; b < n / K_QK; b++, x += K_QK) {
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h);
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        /* int32 -> int16 -> int8 packs interleave 128-bit lanes: undo it. */
        __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
        __m256i p8 = _mm256_packs_epi16(p16a, p16b);
        p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)a[b].q, p8);
        a[b].d = d;
        a[b].s = d * (float)_mm_cvtsi128_si32(s4);
    }
}
