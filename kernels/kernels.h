/* The ops of kernels/ops.h as C functions.
 *
 * Two families with one contract each:
 *   k_*        host functions in kernels/cpu/: the plain C references (the
 *              "_ref" ones and every op that has only one version) and the
 *              fast paths (OpenBLAS sgemm, AVX2 quantized products) that the
 *              unit tests check against them.
 *   k_cuda_*   launchers of the CUDA kernels in kernels/cuda/ (device
 *              pointers, a cudaStream_t passed as void *, NULL = the default
 *              stream).  They are declared here always so C callers need no
 *              CUDA header; they are defined only when the build has CUDA
 *              (BATON_CUDA=1, $(CU_LIB)).  Each returns 0 or a negative
 *              status (-EINVAL for a bad argument, -EIO for a CUDA, cuBLAS
 *              or NCCL error, after printing it with file and line).
 *
 * A negative errno returned here is a bt_err (common/status.h): -ENOMEM is
 * BT_ENOMEM, -EINVAL BT_EINVAL, and bt_strerror describes any other.
 *
 * Compute is f32 everywhere; f16/bf16 appear only as storage (KOP_CAST and
 * loads), and the GGUF block types only as weights of the quantized products.
 * Layouts are row-major; shapes are element counts. */
#ifndef BATON_KERNELS_KERNELS_H
#define BATON_KERNELS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

/* ---- embedding, elementwise, casts, collectives ---------------------------- */

/* OUT[i, :] = TABLE[IDS[i], :] for N ids; DIM floats per row.  Ids out of
 * [0, VOCAB) give a row of zeros (a bad token must not read out of bounds). */
void k_embed(float *out, const float *table, int vocab, int dim, const int32_t *ids, int n);

void k_add(float *out, const float *a, const float *b, size_t n);
/* OUT[i] = A[i] + B[i % NB] for i < N: a bias row added to every row, or a
 * table of positions to every sequence of a batch.  NB divides N. */
void k_add_bcast(float *out, const float *a, size_t n, const float *b, size_t nb);
void k_mul(float *out, const float *a, const float *b, size_t n);
void k_silu(float *out, const float *x, size_t n);
/* GELU, tanh approximation (GPT-2, ggml_gelu). */
void k_gelu(float *out, const float *x, size_t n);
/* GELU as defined, x * Phi(x) = x/2 (1 + erf(x / sqrt 2)): Whisper's. */
void k_gelu_erf(float *out, const float *x, size_t n);
/* The same on the threads of POOL (NULL or held elsewhere: the caller's
 * thread), with erf from a polynomial on AVX2 where the CPU has it: within
 * 2e-7 of k_gelu_erf relatively (a few ulp). */
typedef struct kth_pool kth_pool;
void k_gelu_erf_mt(kth_pool *pool, float *out, const float *x, size_t n);
/* k_add (NB == N) or k_add_bcast, and k_layernorm, shared out over the
 * threads of POOL (NULL or held elsewhere: the caller's thread) when they
 * are large: each value or row is computed as alone, so the bits are the
 * same. */
void k_add_mt(kth_pool *pool, float *out, const float *a, size_t n, const float *b, size_t nb);
void k_layernorm_mt(kth_pool *pool, float *out, const float *x, const float *w, const float *b,
                    int rows, int dim, float eps);

/* The columns of a 1-D convolution, so that the convolution is one matrix
 * product: X [BATCH, T_IN, C] (time-major, channels innermost) to COL
 * [BATCH, T_OUT, C * K] with T_OUT = (T_IN + 2 PAD - K) / STRIDE + 1 and
 * COL[b, t, c * K + j] = X[b, t * STRIDE + j - PAD, c] (0 outside).  A
 * weight [C_OUT, C, K], as PyTorch stores Conv1d's, is then the product's
 * [C_OUT, C * K] matrix as it lies. */
void k_im2col(float *col, const float *x, int batch, int t_in, int c, int k, int stride, int pad);

/* N elements from SRC of type ST to DST of type DT, each one of KD_F32,
 * KD_F16, KD_BF16 (round to nearest even).  -EINVAL for another type. */
int k_cast(void *dst, kdtype dt, const void *src, kdtype st, size_t n);
/* F32 to F16 as k_cast, bit for bit, with F16C where the CPU has AVX2. */
void k_cast_f16_fast(uint16_t *dst, const float *src, size_t n);

/* Sum over ranks, in place.  On the CPU there is only one rank: the identity
 * (NRANKS must be 1, else -EINVAL). */
int k_allreduce_sum(float *buf, size_t n, int nranks);

/* ---- matrix products --------------------------------------------------------- */

/* For each of BATCH problems: C[M, N] = A[M, K] x B[N, K]^T (B holds weights
 * row-major [out, in]).  SA, SB, SC are the strides between the problems in
 * elements (SB = 0 shares one weight matrix across the batch).
 * k_matmul_ref: the triple loop (double accumulators); k_matmul: OpenBLAS. */
void k_matmul_ref(float *c, const float *a, const float *b, int batch, int m, int n, int k,
                  size_t sa, size_t sb, size_t sc);
void k_matmul(float *c, const float *a, const float *b, int batch, int m, int n, int k,
              size_t sa, size_t sb, size_t sc);
/* Y[M, N] = A[M, K] x W[N, K]^T with each output summed in one fixed order
 * that depends on K alone (32 interleaved fused multiply-add chains, then a
 * butterfly): the reference of k_cuda_matmul_rows, bit for bit, and so of
 * its batch invariance. */
void k_matmul_rows_ref(float *y, const float *a, const float *w, int m, int n, int k);

/* Y[M, N] = A[M, K] x W[N, K]^T with W in bf16 and A rounded to bf16 (to
 * nearest even), sums in f32, by oneDNN on the threads of POOL (NULL or
 * held elsewhere: the caller's thread): kernels/cpu/matmul_bf16.c says why.  0, -EINVAL (oneDNN did not start,
 * or a bad shape), -ENOMEM or -EIO (oneDNN failed).
 * k_matmul_bf16_native: whether oneDNN multiplies bf16 in hardware here (AMX
 * or AVX-512 BF16, and k_cpu_isa not lowered below K_ISA_VNNI); elsewhere
 * its product is slower than sgemm in f32 and should not be chosen. */
int k_matmul_bf16(kth_pool *pool, float *y, const float *a, const uint16_t *w, int m, int n, int k);
int k_matmul_bf16_native(void);
/* The same with W packed once by k_matmul_bf16_pack into the layout
 * oneDNN's product reads (repacking plain rows costs it more than the
 * product on every call).  k_matmul_bf16_packed_bytes: the packed size of
 * N x K weights, 0 when oneDNN did not start; k_matmul_bf16_pack: W[N, K]
 * in plain bf16 rows into DST of that size. */
int k_matmul_bf16_packed(kth_pool *pool, float *y, const float *a, const void *w, int m, int n,
                         int k);
size_t k_matmul_bf16_packed_bytes(int n, int k);
int k_matmul_bf16_pack(void *dst, const uint16_t *w, int n, int k);

/* Bytes of one 32-element block of a GGUF type (0 for a non-block type). */
size_t k_block_bytes(kdtype t);
/* Quantizes N floats (a multiple of 32) into blocks of T (KD_Q8_0, KD_Q4_0,
 * KD_Q4_1) the way ggml's reference quantizers do, and back. -EINVAL for
 * another type or N not a multiple of 32. */
int k_quantize(void *dst, kdtype t, const float *src, size_t n);
int k_dequantize(float *dst, kdtype t, const void *src, size_t n);
/* N elements of any float or block type T to f32: a copy, a cast or a
 * dequantization.  0 or -EINVAL. */
int k_widen(float *dst, kdtype t, const void *src, size_t n);

/* Y[ROWS] = W[ROWS, COLS] x X[COLS] with W in blocks of T, dequantized on the
 * fly (COLS a multiple of 32).  k_qmatvec_ref: scalar; k_qmatvec: the AVX2
 * path when the CPU has AVX2 and FMA (checked once with cpuid), else the
 * reference.  -EINVAL for a bad type or shape. */
int k_qmatvec_ref(float *y, const void *w, kdtype t, const float *x, int rows, int cols);
int k_qmatvec(float *y, const void *w, kdtype t, const float *x, int rows, int cols);
/* Y[M, ROWS] = X[M, COLS] W[ROWS, COLS]^T, the product of M rows with
 * blocks of T: the AVX2 path dequantizes each block once for up to 8 rows
 * of X, so a few rows (a decode batch) cost about one pass over W. */
int k_qmatmul(float *y, const void *w, kdtype t, const float *x, int m, int rows, int cols);
/* Whether k_qmatvec takes the AVX2 path on this machine. */
int k_have_avx2(void);

/* ---- integer quantized products --------------------------------------------- */

/* What the CPU's fast paths may use: K_ISA_REF (plain C), K_ISA_AVX2 (AVX2,
 * FMA, F16C) or K_ISA_VNNI (AVX-512 VNNI and BW on 256-bit vectors, which
 * multiplies bytes in one instruction).  k_cpu_isa is the best this machine
 * has, lowered by the environment variable BATON_CPU_ISA (ref, avx2, vnni)
 * so that every path can be run and compared on one machine. */
enum { K_ISA_REF = 0, K_ISA_AVX2 = 1, K_ISA_VNNI = 2 };
int k_cpu_isa(void);

/* A block of 32 activations quantized to 8 bits: x[i] ~ q[i] * d, with
 * S = d * sum(q) kept for the weight types with an offset (ggml's Q8_1,
 * with f32 scales).  Products of these with weight blocks are sums of
 * integer products, scaled once per block: llama.cpp's way of computing a
 * quantized matrix product, several times faster than widening the weights
 * to f32, at the cost of rounding the activations to 8 bits. */
typedef struct k_q8a {
    float d;
    float s;
    int8_t q[32];
} k_q8a;

/* N floats (a multiple of 32) into N / 32 blocks: d = max|x| / 127 and q
 * the nearest integer (ties to even) to x / d.  Every ISA gives the same
 * bytes. */
void k_quantize_act(k_q8a *a, const float *x, size_t n, int isa);

/* Y[j * LDY + r] = W[r, :] . A[j, :] for rows R0 <= r < R1 of W (blocks of
 * T: KD_Q8_0, KD_Q4_0, KD_Q4_1) and the M rows of A (COLS / 32 blocks
 * each), on instruction set ISA (K_ISA_REF: the scalar reference, exact
 * integer sums scaled per block in order).  -EINVAL for a bad type or
 * shape. */
int k_qmatmul_q8(float *y, size_t ldy, const void *w, kdtype t, const k_q8a *a, int m, int r0,
                 int r1, int cols, int isa);

/* Y[M, ROWS] = X[M, COLS] W[ROWS, COLS]^T with W in blocks of T, on the
 * threads of POOL (NULL or held by another thread: the caller's thread
 * alone), each taking a share of W's rows.  FLAGS: K_QMM_Q8: X is first
 * quantized (k_quantize_act) and the products are integer ones
 * (k_qmatmul_q8); else they are f32 products with the blocks widened on the
 * fly (k_qmatmul), which agree with the f32 reference up to summation order.
 * K_QMM_INVARIANT (with K_QMM_Q8): each row of X alone, so a row's result
 * is the same bits whatever the other rows (the tiles of several rows
 * round differently); slower for many rows. */
#define K_QMM_Q8 1
#define K_QMM_INVARIANT 2
int k_qmatmul_mt(kth_pool *pool, float *y, const void *w, kdtype t, const float *x, int m,
                 int rows, int cols, int flags);

/* ---- normalization, position, softmax --------------------------------------- */

/* Per row of DIM: OUT = X / sqrt(mean(X^2) + EPS) * W. */
void k_rmsnorm(float *out, const float *x, const float *w, int rows, int dim, float eps);
/* Per row of DIM: OUT = (X - mean) / sqrt(var + EPS) * W + B (B may be NULL). */
void k_layernorm(float *out, const float *x, const float *w, const float *b, int rows, int dim,
                 float eps);

/* Rotary position embedding, in place, on X[N_TOK, N_HEAD, HEAD_DIM]; token
 * t sits at position POS[t].  Angle of pair i: pos * THETA^(-2i/HEAD_DIM).
 *
 * K_ROPE_NORMAL rotates adjacent pairs (x[2i], x[2i+1]): llama.cpp's
 * LLAMA_ROPE_TYPE_NORM, which GGUF files of the llama architecture (SmolLM2
 * among them) expect, because convert_hf_to_gguf.py permutes the rows of Q
 * and K so that this equals Hugging Face's rotate-half on the original
 * weights.  K_ROPE_NEOX rotates (x[i], x[i + HEAD_DIM/2]): rotate-half
 * itself, for weights that were not permuted (GPT-NeoX, Qwen2 GGUF). */
enum { K_ROPE_NORMAL = 0, K_ROPE_NEOX = 1 };
/* 0, or -ENOMEM (a head of over 1024 dims needs memory for its angles). */
int k_rope(float *x, const int32_t *pos, int n_tok, int n_head, int head_dim, float theta,
           int mode);

/* Per row of N: numerically stable softmax (max subtracted). */
void k_softmax(float *out, const float *x, int rows, int n);
/* Per row of N: index of the largest value, the lowest index on ties. */
void k_argmax(int32_t *out, const float *x, int rows, int n);
/* log(sum_i e^X[i]) over N floats (-inf entries count for nothing; -inf
 * when all are), the log softmax's denominator.  k_logsumexp_ref sums in
 * double with libm's exp; k_logsumexp, on an x86-64 CPU with AVX2 (unless
 * BATON_CPU_ISA=ref), takes e^x from a polynomial 8 lanes at a time and
 * sums in double: within 1e-6 of the reference, several times faster over
 * a vocabulary (a row of Whisper's 51865 logits a decoder step). */
double k_logsumexp(const float *x, int n);
double k_logsumexp_ref(const float *x, int n);

/* ---- attention ----------------------------------------------------------------- */

/* KV cache of one sequence: K and V, each [N_KV_HEAD, CAP, HEAD_DIM], CAP
 * rows of capacity.  A KV head's rows are contiguous, so that a decode
 * step streams each head's keys and values in order: on a context larger
 * than the CPU's caches that ran about 1.6x faster than rows holding every
 * head side by side, which the hardware prefetcher follows poorly. */

/* Causal grouped-query attention over N_TOK new tokens of one sequence whose
 * cache already holds POS0 tokens.  Q [N_TOK, N_HEAD, HD]; K, V [N_TOK,
 * N_KV, HD] are written into KC/VC at rows POS0.. before attending; query t
 * sees cache rows 0..POS0+t.  Query head h reads KV head h / (N_HEAD/N_KV).
 * OUT [N_TOK, N_HEAD, HD].  Scale 1/sqrt(HD).  0, or -ENOMEM when a context
 * of over 1024 positions finds no memory for its scores. */
int k_attn_prefill(float *out, const float *q, const float *k, const float *v, float *kc,
                   float *vc, int cap, int pos0, int n_tok, int n_head, int n_kv, int hd);

/* One query per sequence for a BATCH of sequences of different lengths, each
 * with its own cache: Q [BATCH, N_HEAD, HD]; K, V [BATCH, N_KV, HD] go to row
 * LENS[b] of KC[b]/VC[b], then query b attends over rows 0..LENS[b].  The
 * caller advances LENS afterwards.  OUT [BATCH, N_HEAD, HD].  0, or -ENOMEM
 * as k_attn_prefill. */
int k_attn_decode(float *out, const float *q, const float *k, const float *v, float *const *kc,
                  float *const *vc, int cap, const int32_t *lens, int batch, int n_head,
                  int n_kv, int hd);

/* The same two on the threads of POOL (NULL or held elsewhere: the
 * caller's thread), vectorized with AVX2 where the CPU has it and HD is a
 * multiple of 8, over caches of CACHE_DT: KD_F32, KD_F16 (K and V are
 * rounded to f16 as they are written, and widened as they are read), or
 * KD_Q8_0 for HD a multiple of 32 (quantized in blocks of 32 as they are
 * written, as k_quantize does: a row of a head is HD / 32 blocks, and a
 * cache takes kdtype_bytes(KD_Q8_0, N_KV * CAP * HD) bytes).  In the
 * decode form a negative LENS[b] marks a row without a sequence: its
 * output is zeros and its cache untouched.  0, -EINVAL for a bad type or
 * head count or a position past CAP, or -ENOMEM when a thread had no memory
 * for a long context's scores. */
int k_attn_prefill_mt(kth_pool *pool, float *out, const float *q, const float *k, const float *v,
                      void *kc, void *vc, kdtype cache_dt, int cap, int pos0, int n_tok,
                      int n_head, int n_kv, int hd);
int k_attn_decode_mt(kth_pool *pool, float *out, const float *q, const float *k, const float *v,
                     void *const *kc, void *const *vc, kdtype cache_dt, int cap,
                     const int32_t *lens, int batch, int n_head, int n_kv, int hd);
/* The same two with every query computed alone over its whole context by
 * one routine (no query tiles, no KV-head groups, no key splits): a
 * query's output is then the same bits in a prefill of any chunking and in
 * a decode step of any batch, which batch-invariant runs (and exact prefix
 * caching) need.  Slower: the tiles and splits are what make the other two
 * fast on long contexts. */
int k_attn_prefill_inv_mt(kth_pool *pool, float *out, const float *q, const float *k,
                          const float *v, void *kc, void *vc, kdtype cache_dt, int cap, int pos0,
                          int n_tok, int n_head, int n_kv, int hd);
int k_attn_decode_inv_mt(kth_pool *pool, float *out, const float *q, const float *k,
                         const float *v, void *const *kc, void *const *vc, kdtype cache_dt,
                         int cap, const int32_t *lens, int batch, int n_head, int n_kv, int hd);

/* Attention without a mask or a cache (Whisper's encoder, and its
 * decoder's cross-attention): for each of NB sequences, T queries Q [NB, T,
 * N_HEAD * HD] attend over all S keys and values K, V [NB, S, N_HEAD * HD],
 * head by head (no grouping); OUT [NB, T, N_HEAD * HD]; scale 1/sqrt(HD).
 * k_attn_full_ref: a query at a time, as k_attn_prefill.  k_attn_full:
 * for many queries an sgemm per (sequence, head) for the scores and one for
 * their sum of V, else a query at a time on the threads of POOL (NULL or
 * held elsewhere: the caller's thread).  0, or -ENOMEM. */
int k_attn_full_ref(float *out, const float *q, const float *k, const float *v, int nb, int t,
                    int s, int n_head, int hd);
int k_attn_full(kth_pool *pool, float *out, const float *q, const float *k, const float *v, int nb,
                int t, int s, int n_head, int hd);
/* The same with K and V in f16 (Whisper's cross-attention K and V in its
 * 8-bit mode: half the bytes a decoder step reads).  A few queries are the
 * decode path's AVX2 query, widening them as it reads; many queries, or a
 * CPU without AVX2, widen K and V to f32 first.  0, or -ENOMEM. */
int k_attn_full_kv16(kth_pool *pool, float *out, const float *q, const uint16_t *k,
                     const uint16_t *v, int nb, int t, int s, int n_head, int hd);
/* The same with bf16 products on oneDNN (kernels/cpu/matmul_bf16.c): the
 * scores from Q (scaled) and K each split into two bf16 halves, which
 * keeps about 16 bits of them; the scores' e^x and V rounded to bf16; sums
 * in f32.  For many queries (Whisper's encoder: half its time went to the
 * f32 products and the 9 MB score matrix of a head) where
 * k_matmul_bf16_native.  0, -EINVAL, -ENOMEM or -EIO. */
int k_attn_full_bf16(kth_pool *pool, float *out, const float *q, const float *k, const float *v,
                     int nb, int t, int s, int n_head, int hd);

/* ---- sampling ------------------------------------------------------------------- */

/* Largest top-k the GPU sampler supports (it selects candidates by repeated
 * block argmax); the CPU reference has no limit. */
#define K_SAMPLE_MAX_K 256

/* One token from each row of LOGITS [ROWS, N], row r with RNG counter
 * COUNTER + r:
 *   TEMPERATURE <= 0: argmax.  Else the K = TOP_K candidates (TOP_K <= 0 or
 *   > N: all N) in descending logit order (lower index first on ties);
 *   p_i = softmax(logit_i / TEMPERATURE) over them; the shortest prefix whose
 *   mass reaches TOP_P (>= 1: all); u = k_philox_uniform(SEED, counter)
 *   times that prefix's mass; the first candidate whose running sum exceeds u.
 * The same rule runs on the GPU, so one (seed, counter) samples alike on both
 * (up to last-ulp differences of expf).  0, or -ENOMEM when a TOP_K over 64
 * finds no memory for its candidates (rows before the failing one are
 * written). */
int k_sample(int32_t *out, const float *logits, int rows, int n, float temperature, int top_k,
             float top_p, uint64_t seed, uint64_t counter);

/* ---- CUDA launchers (kernels/cuda/, only with BATON_CUDA) ------------------------ */

int k_cuda_embed(float *out, const float *table, int vocab, int dim, const int32_t *ids, int n,
                 void *stream);
int k_cuda_add(float *out, const float *a, const float *b, size_t n, void *stream);
int k_cuda_mul(float *out, const float *a, const float *b, size_t n, void *stream);
int k_cuda_silu(float *out, const float *x, size_t n, void *stream);
int k_cuda_gelu(float *out, const float *x, size_t n, void *stream);
int k_cuda_gelu_erf(float *out, const float *x, size_t n, void *stream);
int k_cuda_add_bcast(float *out, const float *a, size_t n, const float *b, size_t nb,
                     void *stream);
int k_cuda_im2col(float *col, const float *x, int batch, int t_in, int c, int k, int stride,
                  int pad, void *stream);
/* k_attn_full on the device: one block per (sequence, query, head) with the
 * online softmax of the prefill kernel; HD at most 256 (-EINVAL else). */
int k_cuda_attn_full(float *out, const float *q, const float *k, const float *v, int nb, int t,
                     int s, int n_head, int hd, void *stream);
int k_cuda_cast(void *dst, kdtype dt, const void *src, kdtype st, size_t n, void *stream);
int k_cuda_rmsnorm(float *out, const float *x, const float *w, int rows, int dim, float eps,
                   void *stream);
int k_cuda_layernorm(float *out, const float *x, const float *w, const float *b, int rows,
                     int dim, float eps, void *stream);
int k_cuda_rope(float *x, const int32_t *pos, int n_tok, int n_head, int head_dim, float theta,
                int mode, void *stream);
int k_cuda_softmax(float *out, const float *x, int rows, int n, void *stream);
int k_cuda_argmax(int32_t *out, const float *x, int rows, int n, void *stream);
/* KC, VC, LENS are device arrays; MAX_CTX (host) is the caches' capacity
 * in rows: it bounds LENS[b] + 1 and sizes the shared memory of the kernel. */
int k_cuda_attn_decode(float *out, const float *q, const float *k, const float *v,
                       float *const *kc, float *const *vc, const int32_t *lens, int batch,
                       int n_head, int n_kv, int hd, int max_ctx, void *stream);
/* k_attn_prefill on the device: KC, VC are one sequence's caches.  The
 * softmax is computed online over tiles of keys, so the context length has
 * no shared-memory bound; HD must be at most 256 (-EINVAL else). */
int k_cuda_attn_prefill(float *out, const float *q, const float *k, const float *v, float *kc,
                        float *vc, int cap, int pos0, int n_tok, int n_head, int n_kv, int hd,
                        void *stream);
/* The forms an executable uses (kernels/optable.h), whose positions and
 * lengths live in device memory and may change between replays of a
 * captured graph.  Decode: the caches of the batch are one allocation, STRIDE
 * floats between sequences, CAP rows each, N_CACHE of them; row b uses
 * cache SLOTS[b] (a device array; NULL: cache b).  A length L with L + 1 >
 * CAP, or a slot outside [0, N_CACHE), writes nothing, outputs zeros and
 * sets *FLAG = ERANGE (FLAG may be NULL); a negative length is an unused
 * row (zeros).  Prefill: the first position
 * is POS[0] (device), checked against CAP the same way; with INVARIANT each
 * query is attended by the decode kernel's own routine, as a decode step at
 * its position would (the same bits, whatever the chunking: the
 * batch-invariant mode), its CAP scores held in shared memory (-EINVAL when
 * the device has not that much). */
int k_cuda_attn_decode_strided(float *out, const float *q, const float *k, const float *v,
                               float *kc, float *vc, size_t stride, const int32_t *lens,
                               const int32_t *slots, int n_cache, int batch, int n_head,
                               int n_kv, int hd, int cap, int32_t *flag, void *stream);
int k_cuda_attn_prefill_at(float *out, const float *q, const float *k, const float *v, float *kc,
                           float *vc, const int32_t *pos, int cap, int32_t *flag, int n_tok,
                           int n_head, int n_kv, int hd, int invariant, void *stream);
/* An asynchronous device-to-device copy on STREAM. */
int k_cuda_copy(void *dst, const void *src, size_t bytes, void *stream);
int k_cuda_qmatvec(float *y, const void *w, kdtype t, const float *x, int rows, int cols,
                   void *stream);
/* TOP_K must be in 1..K_SAMPLE_MAX_K when TEMPERATURE > 0 (-EINVAL else). */
int k_cuda_sample(int32_t *out, const float *logits, int rows, int n, float temperature,
                  int top_k, float top_p, uint64_t seed, uint64_t counter, void *stream);
/* Each row with its own parameters in device memory, as KOP_SAMPLE takes
 * them: PARAMS [ROWS, 3] f32 (temperature, top_k, top_p), RNG [ROWS, 2]
 * i64 (seed, counter).  A row asking for more than K_SAMPLE_MAX_K
 * candidates (top_k 0 or over that) raises FLAG (when not NULL). */
int k_cuda_sample_rows(int32_t *out, const float *logits, const float *params,
                       const int64_t *rng, int rows, int n, int32_t *flag, void *stream);
/* Philox uniforms for counters COUNTER..COUNTER+N-1 (the CPU/GPU RNG check). */
int k_cuda_philox_uniform(float *out, uint64_t seed, uint64_t counter, size_t n, void *stream);

/* k_matmul_rows_ref on the device, the same bits: one row's outputs do not
 * depend on M or on the rows beside it (the batch-invariant product). */
int k_cuda_matmul_rows(float *y, const float *a, const float *w, int m, int n, int k,
                       void *stream);
/* Matrix products through cuBLAS (the current device's handle, bound to
 * STREAM for each call). */
int k_cuda_matmul(float *c, const float *a, const float *b, int batch, int m, int n, int k,
                  size_t sa, size_t sb, size_t sc, void *stream);
/* Makes DEVICE's cuBLAS handle (once; kx_device_cuda calls it before any
 * capture).  k_cuda_matmul uses the handle of the current device. */
int k_cuda_blas_init(int device);
void k_cuda_blas_shutdown(void);

/* All-reduce (sum, in place) through NCCL.  k_cuda_comm_create makes a
 * single-process communicator over NDEV devices (ncclCommInitAll; 1 is
 * fine); without NCCL in the build it returns -ENOSYS, and k_cuda_allreduce
 * with a NULL communicator is the one-rank identity. */
int k_cuda_comm_create(void **comm, int ndev);
/* A communicator of NRANKS processes (one per GPU): one of them makes the
 * id (K_CUDA_COMM_ID_BYTES) and hands it to the others out of band; each
 * calls k_cuda_comm_init_rank with its RANK and its GPU DEVICE (made
 * current on the calling thread), which returns once all have joined.
 * -ENOSYS without NCCL in the build. */
#define K_CUDA_COMM_ID_BYTES 128
int k_cuda_comm_unique_id(void *id, size_t len);
int k_cuda_comm_init_rank(void **comm, int device, const void *id, size_t len, int nranks,
                          int rank);
void k_cuda_comm_destroy(void *comm);
/* k_cuda_comm_init_rank without waiting: *COMM is made at once and
 * k_cuda_comm_ready says when every rank has joined (1; 0 before; a
 * negative errno when it failed).  Until then it may only be polled or
 * aborted. */
int k_cuda_comm_join(void **comm, int device, const void *id, size_t len, int nranks, int rank);
int k_cuda_comm_ready(void *comm);
/* Ends COMM at once (ncclCommAbort): its queued operations stop, their
 * buffers undefined, and COMM is gone.  For a communicator whose peer may
 * never come: ncclCommDestroy would wait for it. */
void k_cuda_comm_abort(void *comm);
/* Nonzero once COMM has an asynchronous error (a peer aborted or was lost,
 * ncclCommGetAsyncError); it must then be aborted. */
int k_cuda_comm_failed(void *comm);
/* Queues on STREAM an ncclSend (SEND nonzero) of the N bytes at BUF to rank
 * PEER of COMM, or an ncclRecv of N bytes into BUF from it.  Both ranks of a
 * pair must issue their sends and receives in the same order. */
int k_cuda_comm_p2p(void *comm, int send, void *buf, size_t n, int peer, void *stream);
int k_cuda_allreduce(float *buf, size_t n, void *comm, void *stream);

#endif
