/* Text to token ids for backends that decode with a Hugging Face
 * tokenizer.json but have no tokenizer of their own (Whisper, for a
 * request's prompt): the transformer backend's byte-level BPE
 * (backends/transformer/tokenizer.h), built from the folder's
 * tokenizer.json as that backend reads it (hf_tokenizer_open).  Here, in
 * backends/ itself, because one backend's folder does not include
 * another's headers.
 *
 * An encoder is immutable once open; bk_text_encode may be called from
 * several threads at once. */
#ifndef BATON_BACKENDS_TEXT_ENCODE_H
#define BATON_BACKENDS_TEXT_ENCODE_H

#include <stddef.h>
#include <stdint.h>

typedef struct bk_text_encoder bk_text_encoder;

/* The encoder of DIR/tokenizer.json for a model of N_VOCAB ids.  0, or a
 * negative bt_err with ERR saying what was wrong (no tokenizer.json, a
 * tokenizer of another kind). */
int bk_text_encoder_open(const char *dir, int64_t n_vocab, bk_text_encoder **out, char *err,
                         size_t errlen);
void bk_text_encoder_close(bk_text_encoder *e); /* NULL is a no-op */

/* The ids of LEN bytes of TEXT, special tokens written in it taken as
 * text: the first min(CAP, n) into IDS, n returned (call again with a
 * bigger buffer when n > CAP), or a negative bt_err. */
int bk_text_encode(const bk_text_encoder *e, const char *text, size_t len, int32_t *ids,
                   size_t cap);

/* Previous text as Whisper models take it (faster-whisper's
 * initial_prompt): " " and TEXT[LEN] without the ASCII whitespace around
 * it (Python's str.strip also removes Unicode's other spaces, which are
 * kept here), encoded, of which the last MAX ids go to IDS.  How many were
 * kept, or BT_ENOMEM, or the tokenizer's error. */
int bk_text_encode_prompt(const bk_text_encoder *e, const char *text, size_t len, int32_t *ids,
                          int max);

#endif
