/* llama.cpp's tokenizer over a file of texts, for the comparison with
 * baton's (tests/llamacpp/tokenizer_check.py):
 *
 *   llama_tok MODEL.gguf [--special] < texts.hex > ids.txt
 *
 * Each input line is a text in hex, each output line its ids
 * (tests/llamacpp/texts_io.h).  Only the vocabulary is loaded (vocab_only),
 * so this takes a fraction of a second whatever the weights.  Texts are
 * encoded as a raw continuation would be: no BOS (add_special false) and
 * control tokens written in the text left as text (parse_special false),
 * which is what baton's tok_encode(parse_special = false) does; with
 * --special they become their ids (parse_special true), for the cases of
 * scripts/gen-tokenizer-vectors.py that parse them.
 *
 * Built by tests/llamacpp/run.sh against the llama.cpp that
 * scripts/build-llamacpp.sh builds outside the repository; never part of
 * `make` or `make test`. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "tests/llamacpp/texts_io.h"

/* llama.cpp logs every key of the GGUF while loading; the ids are the only
 * output wanted, so its log goes nowhere unless LLAMA_TOK_LOG is set. */
static void quiet_log(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR || getenv("LLAMA_TOK_LOG"))
        fputs(text, stderr);
}

int main(int argc, char **argv)
{
    bool special = argc == 3 && strcmp(argv[2], "--special") == 0;
    if (argc != 2 && !special) {
        fprintf(stderr, "usage: %s MODEL.gguf [--special] < texts.hex > ids.txt\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llama_tok: cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    char *line = NULL;
    size_t cap = 0, idcap = 1024;
    llama_token *ids = malloc(idcap * sizeof(*ids));
    long len = 0, lineno = 0;
    int rc = 0;
    while (ids && (len = tio_read_text(stdin, &line, &cap, ++lineno)) >= 0) {
        int32_t n = llama_tokenize(vocab, line, (int32_t)len, ids, (int32_t)idcap, false, special);
        if (n < 0 && n != INT32_MIN) {
            /* The buffer was short: -n is the count needed. */
            idcap = (size_t)-n;
            llama_token *bigger = realloc(ids, idcap * sizeof(*ids));
            if (!bigger)
                break;
            ids = bigger;
            n = llama_tokenize(vocab, line, (int32_t)len, ids, (int32_t)idcap, false, special);
        }
        if (n < 0) {
            fprintf(stderr, "llama_tok: line %ld: llama_tokenize returned %d\n", lineno, (int)n);
            rc = 1;
            break;
        }
        tio_write_ids(stdout, ids, n);
    }
    if (!ids || len == -2) {
        fprintf(stderr, "llama_tok: stopped at line %ld\n", lineno);
        rc = 1;
    }
    free(ids);
    free(line);
    llama_model_free(model);
    llama_backend_free();
    return fflush(stdout) == 0 ? rc : 1;
}
