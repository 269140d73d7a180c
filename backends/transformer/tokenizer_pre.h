/* Internal to the tokenizer (backends/transformer/tokenizer.c): the pre-tokenizers that
 * cut text into the words BPE merges within, and UTF-8 decoding.  Names
 * are tok__ because they are not part of the tokenizer's interface. */
#ifndef BATON_BACKENDS_TRANSFORMER_TOKENIZER_PRE_H
#define BATON_BACKENDS_TRANSFORMER_TOKENIZER_PRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/transformer/tokenizer.h"

/* The pre-tokenizers (tokenizer.h lists the GGUF names of each). */
enum {
    TOK_PRE_GPT2,         /* the GPT-2 regex */
    TOK_PRE_DIGITS_GPT2,  /* every \p{N} alone, then the GPT-2 regex (SmolLM2, StarCoder) */
    TOK_PRE_LLAMA3        /* the Llama 3 regex */
};

#define TOK_CP_INVALID 0x110000u  /* a byte that starts no valid UTF-8 sequence */

/* Decodes the character at S[0..LEN) (LEN >= 1), setting *N to its length
 * in bytes.  Overlong forms, surrogates, code points past U+10FFFF and
 * truncated sequences give TOK_CP_INVALID and one byte, so every byte of
 * any input is consumed exactly once. */
uint32_t tok__utf8_next(const uint8_t *s, size_t len, size_t *n);

/* An iterator over the pre-tokens of S[0..N); no allocation. */
typedef struct tok_pretok {
    const uint8_t *s;  /* the text; not owned */
    size_t n;          /* bytes of text */
    size_t pos;        /* where the next pre-token starts */
    size_t seg_end;    /* TOK_PRE_DIGITS_GPT2: the end of the digit-free segment at pos */
    int pre;           /* TOK_PRE_* */
} tok_pretok;

void tok__pretok_init(tok_pretok *it, int pre, const uint8_t *s, size_t n);
/* Sets *START and *LEN (> 0) to the next pre-token; false at the end. */
bool tok__pretok_next(tok_pretok *it, size_t *start, size_t *len);

#endif
