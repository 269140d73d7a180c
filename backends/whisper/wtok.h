/* Whisper's tokenizer, the decoding half: ids to text, and the special
 * tokens a decoder needs (start of transcript, languages, tasks, no
 * timestamps, timestamps), read from a Hugging Face tokenizer.json (GPT-2's
 * byte-level BPE with Whisper's added tokens) through jansson.
 *
 * The text of a sequence is what faster-whisper's Tokenizer.decode gives:
 * the ids below <|endoftext|> only, their byte-level pieces mapped back to
 * bytes and joined, and the result made valid UTF-8 the way Hugging Face's
 * tokenizers does (each maximal invalid subpart becomes U+FFFD).
 *
 * Timestamp tokens are not in tokenizer.json: they follow <|notimestamps|>,
 * one per 20 ms from <|0.00|>, up to the model's vocabulary size. */
#ifndef BATON_BACKENDS_WHISPER_WTOK_H
#define BATON_BACKENDS_WHISPER_WTOK_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct wtok wtok;  /* opaque */

/* The special tokens, by id (-1 when the file has none). */
typedef struct wtok_special {
    int32_t eot;             /* <|endoftext|> */
    int32_t sot;             /* <|startoftranscript|> */
    int32_t translate;       /* <|translate|> */
    int32_t transcribe;      /* <|transcribe|> */
    int32_t sot_lm;          /* <|startoflm|> */
    int32_t sot_prev;        /* <|startofprev|> */
    int32_t no_speech;       /* <|nocaptions|> (later models: <|nospeech|>) */
    int32_t no_timestamps;   /* <|notimestamps|> */
    int32_t timestamp_begin; /* <|0.00|>: no_timestamps + 1 */
    int32_t lang_first;      /* the first language token (<|en|>) */
    int32_t lang_count;      /* how many follow it, up to <|translate|> */
} wtok_special;

/* Reads the tokenizer.json at PATH for a model of N_VOCAB ids (the rows of
 * its embedding: 51865 for the multilingual models).  BT_EIO, BT_EFORMAT
 * (with the file and what was wrong in ERR), BT_ENOMEM. */
int wtok_create(const char *path, int32_t n_vocab, wtok **out, char *err, size_t errlen);
void wtok_destroy(wtok *t);  /* NULL is a no-op */

int32_t wtok_vocab_size(const wtok *t);
const wtok_special *wtok_specials(const wtok *t);

/* The text of the N ids at IDS into *OUT (malloc'd, NUL-terminated; the
 * caller frees) and *LEN bytes.  Ids from <|endoftext|> up are left out;
 * an id outside the vocabulary is BT_ERANGE. */
int wtok_decode(const wtok *t, const int32_t *ids, size_t n, char **out, size_t *len);

/* The bytes of one token (a text token's raw bytes, which may be part of
 * a UTF-8 character; a special token's name, "<|en|>"), *LEN bytes; NULL
 * for an id outside the vocabulary.  Owned by T. */
const char *wtok_piece(const wtok *t, int32_t id, size_t *len);

/* The id of a language by its code ("en", "de", "yue"); -1 when unknown. */
int32_t wtok_lang_id(const wtok *t, const char *code);
/* The code of a language token ("en"), NULL when ID is not one. */
const char *wtok_lang_code(const wtok *t, int32_t id);
/* Seconds of a timestamp token (0.02 per step), or -1 when ID is not one. */
double wtok_timestamp(const wtok *t, int32_t id);

#endif
