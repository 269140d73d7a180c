/* Text to token ids from a tokenizer.json (backends/text_encode.h). */
#include "backends/text_encode.h"

#include <stdlib.h>

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
