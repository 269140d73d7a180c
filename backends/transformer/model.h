/* Op graphs of a Llama-family decoder (RMSNorm, RoPE, grouped-query
 * attention with a KV cache, SwiGLU, tied embeddings) at given shapes, for
 * arena planning and costing.  The graphs carry each
 * op's flops and bytes; running them needs the kernels (kernels/kernels.h). */
#ifndef BATON_BACKENDS_TRANSFORMER_MODEL_H
#define BATON_BACKENDS_TRANSFORMER_MODEL_H

#include <stdbool.h>

#include "kernels/graph.h"

typedef struct ktf_shape {
    int hidden;        /* 576 for SmolLM2-135M */
    int layers;        /* 30 */
    int heads;         /* query heads, 9 */
    int kv_heads;      /* 3 */
    int head_dim;      /* 64 */
    int ffn;           /* 1536 */
    int vocab;         /* 49152 */
    kdtype act;        /* activations: KD_F32 */
    kdtype weight;     /* weights: KD_F32, KD_F16 or a GGUF block type */
    kdtype cache;      /* KV cache: KD_F32 or KD_F16 */
    float rms_eps;     /* RMSNorm epsilon, 1e-5 */
    float rope_theta;  /* RoPE base, 100000 for SmolLM2 */
    int rope_mode;     /* K_ROPE_NORMAL (GGUF llama) or K_ROPE_NEOX */
    /* Optional: the dtype of weight matrix NAME (a parameter name of the
     * graph) where it differs from `weight`, since GGUF files mix types (a
     * Q8_0 embedding beside Q4_1 layers).  NULL: every matrix is `weight`. */
    kdtype (*weight_dtype)(void *user, const char *name);
    void *weight_user;
    bool output_head;  /* a separate head "output.weight" [vocab, hidden]; false:
                          tied, the head is token_embd.weight */
    int tp;            /* tensor-parallel ranks (0 or 1: none).  Each rank holds
                          ffn / tp of the feed-forward rows (gate, up) and columns
                          (down), and an ALLREDUCE sums the down products; the
                          attention is replicated (its 9 heads do not split in two). */
} ktf_shape;

/* SmolLM2-135M, f32 activations, f16 weights and cache. */
ktf_shape ktf_shape_smollm2_135m(void);

/* Prefill of BATCH sequences of SEQ tokens each; KV caches of CTX positions
 * per sequence (CTX >= SEQ).  With BATCH 1 the token dim is dynamic
 * (bucketed): compiled for SEQ tokens, run at any 1..SEQ (kx_extent_set).  Inputs: 0 tokens [B*SEQ] i32, 1 positions
 * [B*SEQ] i32, 2 last-token rows [B] i32.  Outputs: 0 logits of each
 * sequence's last token [B, vocab], 1 argmax [B] i32.  Handles k_cache.L and
 * v_cache.L [B, kv_heads, CTX, head_dim].  NULL on a bad shape or no memory. */
kg_graph *ktf_build_prefill(const ktf_shape *s, int batch, int seq, int ctx);

/* One decode step of up to BATCH sequences against KV caches of CTX
 * positions (costed as reading all CTX positions: the upper extent).  The
 * sequence dim is dynamic: compiled for BATCH, run at any 1..BATCH
 * (kx_extent_set), row b using the cache slot slots[b], so a step of few
 * sequences does not pay for the others, whichever slots they hold.
 * Inputs: 0 tokens [B] i32, 1 positions [B] i32, 2 sequence lengths [B]
 * i32 (negative: an unused row), 3 slots [B] i32 (each row's cache slot,
 * < BATCH; distinct among the rows in use).  Outputs as prefill; handles
 * [BATCH, kv_heads, CTX, head_dim] whatever the extent. */
kg_graph *ktf_build_decode(const ktf_shape *s, int batch, int ctx);

#endif
