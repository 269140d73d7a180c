/* The tokenizer of the Llama-family models baton serves: byte-level BPE
 * (GGUF tokenizer.ggml.model "gpt2") read from the GGUF file, and the
 * ChatML chat prompt.
 *
 * Encoding follows llama.cpp, and Hugging Face `tokenizers` where the two
 * agree (tests/llamacpp/tokenizer_check.py compares with llama.cpp on
 * 30,000 texts; tests/unit/data/tokenizer-vectors.tsv holds ids of both):
 * special tokens written literally in the text are cut out first
 * (leftmost, longest), the rest is pre-tokenized by the model's regex,
 * each pre-token's bytes are mapped to GPT-2's byte alphabet and merged
 * pairwise by lowest merge rank (leftmost first among equals).  The
 * Unicode classes of the regexes are those of Unicode 15.1, as in
 * llama.cpp's tables.
 * Supported pre-tokenizers (tokenizer.ggml.pre):
 *   "smollm", "starcoder", "refact": every \p{N} character on its own, then
 *       the GPT-2 regex (HF Sequence[Digits(individual_digits), ByteLevel]);
 *   "gpt2", "gpt-2", or the key absent: the GPT-2 regex alone;
 *   "llama-bpe", "llama3": the Llama 3 regex (\p{N}{1,3}, newline runs),
 *       and a pre-token that is itself a token is taken whole without
 *       merging (ignore_merges in Llama 3's tokenizer.json and llama.cpp).
 * Anything else is refused at create with a message naming it, because a
 * wrong pre-tokenizer gives plausible but wrong ids.
 *
 * Invalid UTF-8 does not fail: each byte that does not start a valid
 * sequence is taken as one character of no class (like punctuation), so it
 * is encoded as its byte token and decodes back to the same byte.  (Here
 * llama.cpp differs on purpose: it encodes each such byte as U+FFFD, which
 * loses it; Hugging Face takes valid UTF-8 only.)  A byte whose token the vocabulary lacks (SmolLM2 has no token for 21 of the 256,
 * 0x04 and 0xff among them) is dropped, so decoding gives back the text
 * less those bytes; it is dropped after merging, as llama.cpp does, so its
 * neighbours do not merge across it ("}\x04," is "}" ","; Hugging Face
 * drops it before merging and gives "},").
 *
 * A tok_vocab is immutable after create and copies what it needs from the
 * GGUF (which may be closed afterwards); every function may be called from
 * several threads at once. */
#ifndef BATON_BACKENDS_TRANSFORMER_TOKENIZER_H
#define BATON_BACKENDS_TRANSFORMER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/transformer/gguf.h"
#include "common/status.h"

typedef struct tok_vocab tok_vocab;

/* Builds the tokenizer from the tokenizer.* keys of F.  On failure *OUT is
 * NULL and ERR[ERRLEN] (may be NULL) says what was missing or unsupported. */
int tok_vocab_create(const gguf_file *f, tok_vocab **out, char *err, size_t errlen);
void tok_vocab_destroy(tok_vocab *v);  /* NULL is a no-op */


int tok_vocab_size(const tok_vocab *v);  /* tokens */
int32_t tok_bos(const tok_vocab *v);     /* -1 when the model has none */
int32_t tok_eos(const tok_vocab *v);     /* -1 when the model has none */
/* Whether ID ends generation: the eos and eot ids of the GGUF, and control
 * tokens spelled like an end of turn (<|im_end|>, <|endoftext|>,
 * <|eot_id|>, <|end|>, <end_of_turn>, </s>).  False for a bad id. */
bool tok_is_eog(const tok_vocab *v, int32_t id);

/* Encodes LEN bytes of TEXT (not necessarily NUL-terminated).  Control
 * tokens written literally become their single id only when PARSE_SPECIAL;
 * user-defined tokens always do (as in Hugging Face and llama.cpp).  No BOS
 * is added.  Writes the first min(CAP, n) ids to IDS (may be NULL when CAP
 * is 0) and returns n, the number of ids the whole text needs, so a caller
 * with n > CAP calls again with a bigger buffer; or a negative status. */
int tok_encode(const tok_vocab *v, const char *text, size_t len, bool parse_special,
               int32_t *ids, size_t cap);

/* The bytes of token ID: the GPT-2 byte alphabet mapped back to bytes for
 * ordinary tokens, the text itself for control and user-defined ones.
 * Writes min(CAP, n) bytes to BUF (no NUL) and returns n, or BT_ERANGE
 * for a bad id.  A piece may end inside a UTF-8 character. */
int tok_piece(const tok_vocab *v, int32_t id, char *buf, size_t cap);

/* How many leading bytes of BUF[LEN] end on a character boundary: LEN less
 * an incomplete UTF-8 sequence at the very end (at most 3 bytes).  A caller
 * streaming pieces sends that many bytes and keeps the rest for the next
 * piece.  Bytes that can never form a character are counted as complete,
 * so a stream of garbage is not held back forever. */
size_t tok_utf8_complete(const char *buf, size_t len);

/* Renders a one-turn ChatML prompt: a system turn (SYSTEM, NUL-terminated;
 * when NULL, the default system text written in the template, if any), the
 * user turn (USER_LEN bytes of USER) and the generation prompt
 * "<|im_start|>assistant\n".  *OUT gets a malloc'd NUL-terminated string
 * (free() it); returns its length in bytes, or BT_ENOTEMPLATE when the
 * GGUF has no template or one without <|im_start|>, or another status. */
int tok_chat_render(const tok_vocab *v, const char *system, const char *user, size_t user_len,
                    char **out);

/* Encodes the prompt tok_chat_render renders, with special-token parsing on
 * for the template's markers only, never for USER's text.  Writes the first
 * min(CAP, n) ids to IDS (NULL when CAP is 0) and returns n, or a negative
 * status (BT_ENOTEMPLATE as tok_chat_render).  No BOS is added. */
int tok_chat_encode(const tok_vocab *v, const char *system, const char *user, size_t user_len,
                    int32_t *ids, size_t cap);

/* One turn of a conversation: ROLE is "system", "user" or "assistant". */
typedef struct tok_turn {
    const char *role;
    size_t role_len;
    const char *text;
    size_t len;
} tok_turn;

/* Renders a ChatML conversation of N >= 1 turns as the ChatML templates
 * (SmolLM2, Qwen2) do: the template's default system turn first when the
 * first turn is not a system turn and the template has one, then each turn
 * as "<|im_start|>ROLE\nTEXT<|im_end|>\n", then the generation prompt
 * "<|im_start|>assistant\n".  *OUT as tok_chat_render; BT_EINVAL for
 * another role or no turn. */
int tok_conv_render(const tok_vocab *v, const tok_turn *turns, size_t n, char **out);

/* The ids of what tok_conv_render renders, where only the template's
 * markers are control tokens: every turn's text is encoded with
 * special-token parsing off.  IDS, CAP and the result as tok_chat_encode. */
int tok_conv_encode(const tok_vocab *v, const tok_turn *turns, size_t n, int32_t *ids,
                    size_t cap);

#endif
