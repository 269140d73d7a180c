/* The ops a Llama-family decoder and a small flow/diffusion network need
 * as one enum shared by the kernels (kernels/cpu/, kernels/cuda/),
 * the executable-graph IR (kernels/graph.h) and the cost model of the
 * multi-stream scheduler (kernels/sched.h).
 *
 * Element types: the tensor dtypes of the wire protocol plus the GGUF block
 * quantizations the quantized matrix-vector products read. */
#ifndef BATON_KERNELS_OPS_H
#define BATON_KERNELS_OPS_H

#include <stddef.h>
#include <stdint.h>

typedef enum kdtype {
    KD_F32 = 1,   /* numbers equal proto DType */
    KD_F16 = 2,
    KD_BF16 = 3,
    KD_I32 = 4,
    KD_I64 = 5,
    KD_U8 = 6,
    KD_BOOL = 7,
    KD_Q8_0 = 32, /* GGUF: blocks of 32, one f16 scale + 32 int8 (34 bytes) */
    KD_Q4_0 = 33, /* GGUF: blocks of 32, one f16 scale + 16 bytes of nibbles (18 bytes) */
    KD_Q4_1 = 34  /* GGUF: blocks of 32, f16 scale + f16 min + 16 bytes (20 bytes) */
} kdtype;

/* Bytes for N elements of T (N a multiple of 32 for the block types). */
size_t kdtype_bytes(kdtype t, size_t n);
const char *kdtype_name(kdtype t);

/* The ops, with the operands and attributes (kg_op.attr) each expects when
 * it runs through an op table (kernels/optable.h).  Shapes are row-major,
 * outermost first; "rows" of a value whose outermost dim is dynamic
 * (bucketed) are the run's actual extent.  Real-valued attributes are
 * stored as the bits of a double (kg_attr_f / kg_attr_to_f in graph.h).
 *
 *   EMBED        in {table [V, D] f32|f16|bf16|Q8_0|Q4_0|Q4_1, ids [N] i32}
 *                out {[N, D] f32}; an id outside [0, V) gives zeros.
 *   MATMUL       in {a [.., M, K] f32, w [N, K] f32|f16|bf16|block}
 *                out {[.., M, N] f32}: every row of a times w^T.
 *                attr {layout} (optional): K_MM_PLAIN (0, w's rows as
 *                they are) or K_MM_PACKED (1: bf16 packed by
 *                k_matmul_bf16_pack, the CPU's only).
 *   QMATVEC      in {w [N, K] block, x [M, K] f32} out {[M, N] f32}.
 *   ADD, MUL     in {a, b} out {y}, same element count, f32; ADD also
 *                takes a b whose count divides a's (a bias per row, a
 *                table of positions per sequence): y[i] = a[i] + b[i % nb].
 *   SILU, GELU   in {x} out {y}, f32; GELU attr {mode} (optional):
 *                K_GELU_TANH (0, the default) or K_GELU_ERF (1).
 *   RMSNORM      in {x [R, D], w [D]} out {[R, D]}; attr {eps (f)}.
 *   LAYERNORM    in {x [R, D], w [D], b [D] (optional)} out; attr {eps (f)}.
 *   ROPE         in {x [N, H*HD], pos [N] i32} out {[N, H*HD]};
 *                attr {H, HD, theta (f), mode (K_ROPE_NORMAL | K_ROPE_NEOX)}.
 *   ATTN_PREFILL in {q [N, H*HD], k [N, KV*HD], v, kc [B, KV, C, HD],
 *                vc, pos [N] i32} out {o [N, H*HD], kc, vc}; attr {H, KV,
 *                HD}.  N/B tokens per sequence, sequence b starting at
 *                position pos[b * N/B].
 *   ATTN_DECODE  in {q [B, H*HD], k [B, KV*HD], v, kc, vc, lens [B] i32,
 *                slots [B] i32 (optional)} out {o, kc, vc}; attr {H, KV,
 *                HD}.  Row b's sequence appends at row lens[b] of its
 *                cache and attends over rows 0..lens[b]; a negative
 *                length marks an unused row (its output is zeros).  Row
 *                b's cache is kc[b], or kc[slots[b]] with slots: the rows
 *                of a step need not be the caches' order, so a step
 *                computes only the sequences that take part.
 *   SOFTMAX      in {x [R, N]} out {[R, N]}.
 *   ARGMAX       in {x [R, N]} out {[R] i32}.
 *   SAMPLE       in {logits [R, N], params [R, 3] f32 (temperature, top_k,
 *                top_p), rng [R, 2] i64 (seed, counter)} out {[R] i32}.
 *   CAST         in {x} out {y}: f32, f16, bf16 either way.
 *   IM2COL       in {x [B, T, C]} out {[B, T', C*K]}; attr {K, stride,
 *                pad}: the columns of a 1-D convolution (k_im2col), which a
 *                MATMUL with the weight [C_OUT, C*K] then completes.
 *   ATTN         in {q [B*T, H*HD], k [B', S, H*HD], v} out {o [B*T,
 *                H*HD]}; attr {H, HD, T}: no mask, no cache; the B = rows
 *                of q / T sequences use the first B of k and v (B <= B');
 *                T 0: q's rows, however many this run, are one sequence.
 *                attr[3] (optional): K_ATTN_F32 (0) or K_ATTN_BF16 (1:
 *                the products in bf16, k_attn_full_bf16; the CPU's only).
 *   ALLREDUCE    in {x} out {y} f32; attr {ranks} (1 when absent).
 *   MATMUL_ALLREDUCE  as MATMUL, then as ALLREDUCE; attr {ranks}.
 * Caches are f32 on the CPU. */
typedef enum kop {
    KOP_EMBED = 0,        /* rows of a table by token id */
    KOP_MATMUL,           /* batched C = A x B^T (weights row-major [out, in]) */
    KOP_QMATVEC,          /* y = W x with W in Q8_0/Q4_0/Q4_1, dequantized on the fly */
    KOP_ADD,
    KOP_MUL,
    KOP_SILU,
    KOP_GELU,
    KOP_RMSNORM,
    KOP_LAYERNORM,
    KOP_ROPE,
    KOP_ATTN_PREFILL,     /* causal, grouped-query, writes the KV cache */
    KOP_ATTN_DECODE,      /* one query per sequence, sequences of different lengths */
    KOP_SOFTMAX,
    KOP_ARGMAX,
    KOP_SAMPLE,           /* temperature, top-k, top-p with a counter-based RNG */
    KOP_CAST,             /* f32 <-> f16 <-> bf16 */
    KOP_ALLREDUCE,        /* sum over ranks (NCCL on GPU; identity at one rank) */
    KOP_MATMUL_ALLREDUCE, /* fused compute + collective: holds both resources */
    KOP_IM2COL,           /* a 1-D convolution's columns */
    KOP_ATTN,             /* attention without mask or cache (encoders, cross-attention) */
    KOP_COUNT
} kop;

/* KOP_ATTN's precision attribute. */
enum { K_ATTN_F32 = 0, K_ATTN_BF16 = 1 };

/* KOP_MATMUL's layout attribute. */
enum { K_MM_PLAIN = 0, K_MM_PACKED = 1 };

/* KOP_GELU's mode attribute. */
enum { K_GELU_TANH = 0, K_GELU_ERF = 1 };

/* What hardware an op occupies, for the scheduler. */
typedef enum krole {
    KROLE_COMPUTE = 0,    /* a compute stream */
    KROLE_COMM = 1,       /* the comm stream */
    KROLE_HYBRID = 2      /* a compute stream and the comm stream at once */
} krole;

krole kop_role(kop op);
const char *kop_name(kop op);

#endif
