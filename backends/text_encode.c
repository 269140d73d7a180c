/* Text to token ids from a tokenizer.json (backends/text_encode.h). */
#include "backends/text_encode.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backends/transformer/hf.h"
#include "backends/transformer/tokenizer.h"
#include "common/status.h"

struct bk_text_encoder {
    tok_vocab *vocab; /* owned */
};

int bk_text_encoder_open(const char *dir, int64_t n_vocab, bk_text_encoder **out, char *err,
                         size_t errlen)
{
    *out = NULL;
    bk_text_encoder *e = calloc(1, sizeof(*e));
    if (!e)
        return bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
    gguf_file *f = NULL;
    int rc = hf_tokenizer_open(dir, n_vocab, &f, err, errlen);
    if (!rc)
        rc = tok_vocab_create(f, &e->vocab, err, errlen);
    /* The vocabulary copies what it needs. */
    gguf_close(f);
    if (rc) {
        free(e);
        return rc;
    }
    *out = e;
    return 0;
}

void bk_text_encoder_close(bk_text_encoder *e)
{
    if (!e)
        return;
    tok_vocab_destroy(e->vocab);
    free(e);
}

int bk_text_encode(const bk_text_encoder *e, const char *text, size_t len, int32_t *ids,
                   size_t cap)
{
    return tok_encode(e->vocab, text, len, false, ids, cap);
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

int bk_text_encode_prompt(const bk_text_encoder *e, const char *text, size_t len, int32_t *ids,
                          int max)
{
    while (len && is_space(*text))
        text++, len--;
    while (len && is_space(text[len - 1]))
        len--;
    char *spaced = malloc(len + 1);
    /* Byte-level BPE gives at most one id per byte (no normalizer). */
    int32_t *all = malloc((len + 1) * sizeof(*all));
    int n = spaced && all ? 0 : BT_ENOMEM;
    if (!n) {
        spaced[0] = ' ';
        memcpy(spaced + 1, text, len);
        n = bk_text_encode(e, spaced, len + 1, all, len + 1);
    }
    if (n > (int)(len + 1))
        n = BT_ERANGE; /* more ids than bytes: not byte-level BPE after all */
    if (n >= 0) {
        int keep = n < max ? n : max;
        memcpy(ids, all + (n - keep), (size_t)keep * sizeof(*ids));
        n = keep;
    }
    free(all);
    free(spaced);
    return n;
}
