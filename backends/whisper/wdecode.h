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
 *   - when decoding with timestamps, Whisper's timestamp rules as
 *     CTranslate2 applies them (wdec_filter);
 *   - then the largest logit at temperature 0 (the lowest id on ties), or
 *     a sample of softmax(logits / temperature) over all tokens.
 *
 * With timestamps, a window's tokens are cut into segments the way
 * faster-whisper cuts them, which also says where the next window starts
 * (wdec_split).  Language detection reads the first step's logits over the
 * language tokens (wdec_language). */
#ifndef BATON_BACKENDS_WHISPER_WDECODE_H
#define BATON_BACKENDS_WHISPER_WDECODE_H

#include <stdbool.h>
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
    int32_t max_initial;        /* with timestamps: the latest first timestamp, in
                                   steps of WDEC_TS_S after <|0.00|> (50: 1 s) */
} wdec_rules;

/* Time steps: a feature frame is 10 ms (hop 160 at 16 kHz), a timestamp
 * token 20 ms, so a timestamp step is two frames. */
#define WDEC_FRAME_S 0.01
#define WDEC_TS_S 0.02
#define WDEC_TS_FRAMES 2

/* Reads the suppressed ids of the model's config.json at PATH (jansson).
 * BT_EIO, BT_EFORMAT (with the file and the key in ERR), BT_ENOMEM. */
int wdec_rules_load(const char *path, const wtok_special *sp, int32_t vocab, wdec_rules *r,
                    char *err, size_t errlen);
void wdec_rules_free(wdec_rules *r); /* releases what load took; R may be zeroed */

/* Disables (sets to -inf) what the rules forbid in LOGITS (r->vocab
 * floats) after the N tokens SAMPLED (those after the prompt).  With
 * TIMESTAMPS (a prompt without <|notimestamps|>) the timestamp rules apply
 * too: the first token is a timestamp of at most r->max_initial;
 * timestamps come in pairs except right before the end of text, never
 * decrease, and close a segment of nonzero length; and when the
 * timestamps together are more probable than any text token, the next
 * token is a timestamp. */
void wdec_filter(const wdec_rules *r, float *logits, const int32_t *sampled, int n,
                 bool timestamps);

/* A segment of a window decoded with timestamps: tokens FIRST to
 * FIRST + COUNT - 1 of the window's sampled tokens (timestamps included),
 * from START to END seconds of the whole audio. */
typedef struct wdec_segment {
    int first, count;
    double start, end;
} wdec_segment;

/* The segments of the N tokens TOKS that a window decoded with timestamps
 * (without the end of text), as faster-whisper cuts them: at every two
 * timestamps in a row; the tail after the last such pair is a segment only
 * when it ends in one timestamp, and is otherwise decoded again by the
 * next window; a window with no such pair is one segment.  SEEK is the
 * window's first feature frame, SIZE its frames (up to 30 s).
 *
 * With FINAL false (decoding goes on) only the segments that two
 * timestamps in a row have closed; with FINAL true all, and *NEXT_SEEK (may
 * be NULL) the frame the next window starts at.  Writes at most N + 1
 * segments to OUT (N / 3 + 1 when the tokens obey the timestamp rules) and
 * returns how many. */
int wdec_split(const wdec_rules *r, const int32_t *toks, int n, int seek, int size, bool final,
               wdec_segment *out, int *next_seek);

/* Whether segment S, whose text is the LEN bytes at TEXT, is one to show:
 * faster-whisper leaves out segments of zero length and of blank text
 * (their timestamps still move the next window). */
bool wdec_segment_shown(const wdec_segment *s, const char *text, size_t len);

/* The token of LOGITS (after wdec_filter): the argmax when TEMPERATURE <= 0,
 * else a sample drawn with the counter-based RNG (SEED, COUNTER). */
int32_t wdec_pick(const wdec_rules *r, const float *logits, float temperature, uint64_t seed,
                  uint64_t counter);

/* What faster-whisper judges a window by (its temperature fallback and
 * its skipping of silent windows):
 *   wdec_logprob          log softmax(LOGITS)[TOKEN], over the logits as
 *                         filtered (wdec_filter) before the token was picked,
 *                         as CTranslate2 scores a sequence;
 *   wdec_no_speech_prob   softmax(LOGITS)[no speech] over the unfiltered
 *                         logits at the start of transcript (weng_prompt's
 *                         SOT_LOGITS); 0 when the vocabulary has no such token;
 *   wdec_compression_ratio  the bytes of TEXT (LEN, stripped of surrounding
 *                         whitespace) over their zlib-compressed size, as
 *                         Python's zlib.compress makes it (a repeating text
 *                         compresses well: the ratio is high); 0 for blank
 *                         text, -1 when out of memory. */
double wdec_logprob(const wdec_rules *r, const float *logits, int32_t token);
double wdec_no_speech_prob(const wdec_rules *r, const float *logits);
double wdec_compression_ratio(const char *text, size_t len);

/* The most probable language of the first step's LOGITS (after the
 * start-of-transcript token) among the language tokens: its id, and its
 * probability among them in *PROB (may be NULL). */
int32_t wdec_language(const wdec_rules *r, const float *logits, float *prob);

#endif
