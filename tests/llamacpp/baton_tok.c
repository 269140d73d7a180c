/* baton's tokenizer (backends/transformer/tokenizer.c) over a file of
 * texts, the counterpart of llama_tok.c for tests/llamacpp/tokenizer_check.py:
 *
 *   baton_tok MODEL.gguf [--special] < texts.hex > ids.txt
 *
 * Same line format (tests/llamacpp/texts_io.h) and the same encoding: no
 * BOS, control tokens in the text left as text (parse_special false), or
 * made their ids with --special.
 * Built by `make llamacpp-check` into $(BUILD)/llamacpp/. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/transformer/gguf.h"
#include "backends/transformer/tokenizer.h"
#include "tests/llamacpp/texts_io.h"

int main(int argc, char **argv)
{
    bool special = argc == 3 && strcmp(argv[2], "--special") == 0;
    if (argc != 2 && !special) {
        fprintf(stderr, "usage: %s MODEL.gguf [--special] < texts.hex > ids.txt\n", argv[0]);
        return 2;
    }
    char err[512];
    gguf_file *f = NULL;
    tok_vocab *v = NULL;
    if (gguf_open(argv[1], &f, err, sizeof(err)) || tok_vocab_create(f, &v, err, sizeof(err))) {
        fprintf(stderr, "baton_tok: %s: %s\n", argv[1], err);
        return 1;
    }
    gguf_close(f);  /* the vocabulary keeps its own copies */
    char *line = NULL;
    size_t cap = 0, idcap = 1024;
    int32_t *ids = malloc(idcap * sizeof(*ids));
    long len = 0, lineno = 0;
    int rc = 0;
    while (ids && (len = tio_read_text(stdin, &line, &cap, ++lineno)) >= 0) {
        int n = tok_encode(v, line, (size_t)len, special, ids, idcap);
        if (n >= 0 && (size_t)n > idcap) {
            /* The buffer was short: n is the count needed. */
            idcap = (size_t)n;
            int32_t *bigger = realloc(ids, idcap * sizeof(*ids));
            if (!bigger)
                break;
            ids = bigger;
            n = tok_encode(v, line, (size_t)len, special, ids, idcap);
        }
        if (n < 0) {
            fprintf(stderr, "baton_tok: line %ld: tok_encode returned %d\n", lineno, n);
            rc = 1;
            break;
        }
        tio_write_ids(stdout, ids, n);
    }
    if (!ids || len == -2) {
        fprintf(stderr, "baton_tok: stopped at line %ld\n", lineno);
        rc = 1;
    }
    free(ids);
    free(line);
    tok_vocab_destroy(v);
    return fflush(stdout) == 0 ? rc : 1;
}
