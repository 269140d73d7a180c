/* Op graphs of Whisper (an encoder of two convolutions and pre-LN
 * self-attention blocks; a decoder of pre-LN blocks with causal
 * self-attention over a KV cache, cross-attention over the encoder's
 * output, and logits tied to the token embedding), at given shapes, for
 * the executables of kernels/exec.h.  The graphs name their parameters
 * with wm_param_* below; backends/whisper/wengine.c fills them from a
 * CTranslate2 model file.
 *
 * Three graphs serve a request:
 *   encoder  mel [B, n_frames, n_mels] (time-major) to the audio states
 *            [B, n_audio, d_model]; B is dynamic, so that concurrent
 *            requests share one run.
 *   prompt   one sequence's first tokens (start of transcript, language,
 *            task...) against its audio states: fills the sequence's self
 *            KV cache and computes its cross-attention K and V once, into
 *            handles that the step graph reads in place.
 *   step     one token for each of up to B sequences (B dynamic), row b in
 *            cache slot b.
 * Both decoder graphs output the logits of each sequence's last token (the
 * prompt also those of its start of transcript, where Whisper reads the
 * probability of no speech): the choice of the next token (suppressed
 * tokens, sampling) is the decoder loop's, on the host. */
#ifndef BATON_BACKENDS_WHISPER_WMODEL_H
#define BATON_BACKENDS_WHISPER_WMODEL_H

#include "kernels/graph.h"

typedef struct wm_shape {
    int d_model;     /* 512 for base */
    int heads;       /* 8 */
    int enc_layers;  /* 6 */
    int dec_layers;  /* 6 */
    int ffn;         /* 2048 */
    int n_mels;      /* 80 */
    int n_frames;    /* mel frames per window, 3000 (30 s) */
    int n_audio;     /* encoder positions, n_frames / 2 = 1500 */
    int n_text;      /* decoder positions, 448 */
    int vocab;       /* 51865 */
    kdtype weight;   /* the decoder's per-token matrices: KD_F32, or KD_Q8_0 (8-bit
                        products) */
    kdtype audio;    /* the matrices over a window's positions: KD_F32, or KD_BF16
                        (a CPU that multiplies bf16 in hardware, 8-bit mode),
                        packed by k_matmul_bf16_pack and multiplied as
                        K_MM_PACKED */
    kdtype cross;    /* the cross-attention K and V handles: KD_F32, or KD_F16 (the
                        CPU's 8-bit mode: half the bytes a step reads) */
    float eps;       /* layer norm epsilon, 1e-5 */
} wm_shape;

/* The dtype graph parameter NAME has in a graph of S: `weight` for the
 * decoder's per-token matrices; `audio` for the matrices that multiply a
 * window's audio positions (the encoder's, cross-attention's K and V: 1500
 * rows, faster through sgemm or a bf16 product than as 8-bit products,
 * which are built for a few rows), except that a matrix of ROWS x COLS
 * whose packed bf16 would not take the bytes of its plain rows (the first
 * convolution's 240 columns) stays f32; f32 for norms, biases and
 * positions.  COLS: 0 for a vector. */
kdtype wm_param_dtype(const wm_shape *s, const char *name, int64_t rows, int64_t cols);

kg_graph *wm_build_encoder(const wm_shape *s, int batch);
/* SEQ: the most prompt tokens; CTX: the self KV cache's positions. */
kg_graph *wm_build_prompt(const wm_shape *s, int seq, int ctx);
kg_graph *wm_build_step(const wm_shape *s, int batch, int ctx);

/* Names of the per-layer handles, as the graphs call them: the self KV
 * caches [B, heads, CTX, head_dim] and the cross-attention K and V [B,
 * n_audio, d_model]. */
#define WM_SELF_K "self_k.%d"
#define WM_SELF_V "self_v.%d"
#define WM_CROSS_K "cross_k.%d"
#define WM_CROSS_V "cross_v.%d"

#endif
