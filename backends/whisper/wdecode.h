/* Choosing Whisper's next token from its logits, by the rules that
 * faster-whisper's decoder (CTranslate2's Whisper model) applies:
 *
 *   - suppressed tokens: the model's config.json "suppress_ids" (symbols
 *     that are not speech) and the special tokens that never follow the
 *     prompt (transcribe, translate, start of transcript, start of
 *     previous text, start of LM, no speech);
 *   - at the first sampled token, config.json's "suppress_ids_begin" (the
 *     blank and the end of text), so that a transcript does not start
 *     empty;
 *   - then the largest logit at temperature 0 (the lowest id on ties), or
 *     a sample of softmax(logits / temperature) over all tokens.
 *
 * Language detection reads the first step's logits over the language
 * tokens (wdec_language). */
#ifndef BATON_BACKENDS_WHISPER_WDECODE_H
#define BATON_BACKENDS_WHISPER_WDECODE_H

#include <stddef.h>
#include <stdint.h>

#include "backends/whisper/wtok.h"

typedef struct wdec_rules {
    int32_t vocab;              /* logits per row */
    wtok_special sp;            /* the special tokens' ids */
    int32_t *suppress;          /* owned; n_suppress ids, always disabled */
    size_t n_suppress;
    int32_t *suppress_begin;    /* owned; disabled at the first sampled token */
    size_t n_begin;
} wdec_rules;

/* Reads the suppressed ids of the model's config.json at PATH (jansson).
 * BT_EIO, BT_EFORMAT (with the file and the key in ERR), BT_ENOMEM. */
int wdec_rules_load(const char *path, const wtok_special *sp, int32_t vocab, wdec_rules *r,
                    char *err, size_t errlen);
void wdec_rules_free(wdec_rules *r); /* releases what load took; R may be zeroed */

/* Disables (sets to -inf) what the rules forbid in LOGITS (r->vocab
 * floats) when N tokens were sampled after the prompt.  Decoding with
 * timestamps (Whisper's timestamp rules) is not built: prompts end with
 * <|notimestamps|>. */
void wdec_filter(const wdec_rules *r, float *logits, int n);

/* The token of LOGITS (after wdec_filter): the argmax when TEMPERATURE <= 0,
 * else a sample drawn with the counter-based RNG (SEED, COUNTER). */
int32_t wdec_pick(const wdec_rules *r, const float *logits, float temperature, uint64_t seed,
                  uint64_t counter);

/* The most probable language of the first step's LOGITS (after the
 * start-of-transcript token) among the language tokens: its id, and its
 * probability among them in *PROB (may be NULL). */
int32_t wdec_language(const wdec_rules *r, const float *logits, float *prob);

#endif
