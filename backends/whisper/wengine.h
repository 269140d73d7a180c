/* Whisper's compute: a CTranslate2 model file (backends/whisper/ct2.h)
 * made into the executables of backends/whisper/wmodel.h on the CPU or a
 * CUDA device, with its weights converted once at load and shared by the
 * three executables.
 *
 * The engine owns SLOTS decoding slots: each holds one sequence's self KV
 * cache and its cross-attention K and V.  A window of audio is encoded
 * (weng_encode, several windows in one run), its sequence started in a
 * slot from the encoder's output (weng_prompt, which computes the cross K
 * and V once and runs the prompt tokens), then stepped a token at a time
 * together with the other slots (weng_step).  Logits come back to the
 * host; choosing tokens is the caller's (backends/whisper/wdecode.h).
 *
 * One thread at a time per engine. */
#ifndef BATON_BACKENDS_WHISPER_WENGINE_H
#define BATON_BACKENDS_WHISPER_WENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "backends/whisper/wmodel.h"
#include "kernels/exec.h"

typedef struct weng_opts {
    const kx_device *device; /* NULL: the CPU */
    int threads;             /* CPU threads for the kernels (and OpenBLAS); 0: 1 */
    int act_q8;              /* CPU: matrices in q8_0 and 8-bit products, those over the
                                audio in bf16 where the CPU multiplies bf16 in hardware,
                                and cross-attention's K and V in f16; 0: f32 */
    int slots;               /* sequences decoded at once, and windows per encoder run */
    int max_prompt;          /* most tokens of a prompt (previous text, specials) */
} weng_opts;

typedef struct weng weng;

/* Opens the model file at PATH and builds the engine.  BT_EFORMAT (the
 * file is no Whisper model this engine runs), BT_EIO, BT_ENOMEM, BT_EINVAL
 * (options), with ERR naming the file and what was wrong. */
int weng_create(const char *path, const weng_opts *o, weng **out, char *err, size_t errlen);
void weng_destroy(weng *e); /* NULL is a no-op */

const wm_shape *weng_shape(const weng *e);
int weng_slots(const weng *e);
/* Bytes of weights the engine holds (on its device). */
size_t weng_weight_bytes(const weng *e);

/* Encodes N windows (1..slots): MEL holds N windows of n_frames x n_mels
 * floats, time-major (frame by frame).  The audio states stay in the
 * engine until the next weng_encode.  0 or a negative bt_err. */
int weng_encode(weng *e, const float *mel, int n);

/* The audio states of window WINDOW of the last weng_encode (n_audio x
 * d_model floats, in the engine's device memory), valid until the next
 * weng_encode; NULL for a window that was not encoded. */
const float *weng_audio(const weng *e, int window);

/* Copies BYTES between memory of the engine's device (or the host, on the
 * CPU); 0 or a negative bt_err. */
int weng_copy(const weng *e, void *dst, const void *src, size_t bytes);

/* Starts slot SLOT on AUDIO, a window's states (weng_audio, or a copy of
 * them in the device's memory): computes the slot's cross-attention K and
 * V, then runs the N_TOK prompt TOKENS at positions 0.. into the slot's
 * self cache; the last token's logits (vocab floats) into host memory
 * LOGITS, and those of token SOT (the start of transcript, where Whisper
 * reads the probability of no speech) into SOT_LOGITS (either may be
 * NULL).  BT_EINVAL for a bad slot, token count or SOT. */
int weng_prompt(weng *e, int slot, const float *audio, const int32_t *tokens, int n_tok, int sot,
                float *logits, float *sot_logits);

/* One token for each of slots 0..N-1: TOKENS[b] at position LENS[b] (the
 * slot's tokens so far), or LENS[b] < 0 for a slot left out of this step.
 * Logits of row b into LOGITS + b * vocab (zeros for a left-out slot).
 * BT_ERANGE when a slot's cache is full. */
int weng_step(weng *e, const int32_t *tokens, const int32_t *lens, int n, float *logits);

/* Positions a slot's self cache holds (at most n_text). */
int weng_ctx(const weng *e);

#endif
