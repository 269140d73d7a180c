/* libFuzzer target: the tokenizer of the default model on arbitrary text.
 *
 * The vocabulary is built once from the model's GGUF (BATON_FUZZ_MODEL, by
 * default models/smollm2-135m-instruct-q4_1.gguf from the repository's
 * root; without it the target stops with an error rather than test nothing).
 * Each input is encoded with special-token parsing off and on, and the
 * pieces of the ids joined.  tokenizer.h promises that this gives back the
 * text, less bytes whose byte token the vocabulary lacks (dropped after
 * merging, so such a byte survives inside a merged token), for any bytes:
 * valid UTF-8 by the byte-level alphabet, invalid bytes because each is
 * taken as a character of its own.  So the decoded text must be the input
 * with only such bytes deleted, and exactly the input when it holds none.
 * With BATON_FUZZ_VERBOSE set in the environment the bytes without a token
 * are listed at the start. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/transformer/gguf.h"
#include "backends/transformer/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define DEFAULT_MODEL "models/smollm2-135m-instruct-q4_1.gguf"

static tok_vocab *vocab;
/* missing[b]: byte B alone encodes to no id, the vocabulary lacking its token. */
static bool missing[256];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *path = getenv("BATON_FUZZ_MODEL");
    if (!path || !*path)
        path = DEFAULT_MODEL;
    gguf_file *f = NULL;
    char err[512];
    if (gguf_open(path, &f, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_tokenizer: cannot open %s: %s (run `make model`, or set "
                "BATON_FUZZ_MODEL)\n", path, err);
        exit(1);
    }
    if (tok_vocab_create(f, &vocab, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err);
        exit(1);
    }
    gguf_close(f);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int n = tok_encode(vocab, &c, 1, false, NULL, 0);
        if (n < 0) {
            fprintf(stderr, "fuzz_tokenizer: encoding byte %d failed (%d)\n", b, n);
            exit(1);
        }
        missing[b] = n == 0;
        if (missing[b] && getenv("BATON_FUZZ_VERBOSE"))
            fprintf(stderr, "fuzz_tokenizer: byte 0x%02x has no token\n", b);
    }
    return 0;
}

static void round_trip(const uint8_t *data, size_t size, bool special)
{
    int n = tok_encode(vocab, (const char *)data, size, special, NULL, 0);
    if (n < 0) {
        fprintf(stderr, "fuzz_tokenizer: tok_encode failed (%d)\n", n);
        abort();
    }
    int32_t *ids = malloc(((size_t)n + 1) * sizeof(*ids));
    if (!ids)
        abort();
    if (tok_encode(vocab, (const char *)data, size, special, ids, (size_t)n) != n)
        abort();
    /* No token's piece is longer than the text it came from, so SIZE bytes
     * hold the decoded text when the property holds; the pieces are
     * measured first all the same, to catch one that would not. */
    size_t total = 0;
    int n_vocab = tok_vocab_size(vocab);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n_vocab) {
            fprintf(stderr, "fuzz_tokenizer: id %d outside the vocabulary\n", ids[i]);
            abort();
        }
        int len = tok_piece(vocab, ids[i], NULL, 0);
        if (len < 0)
            abort();
        total += (size_t)len;
    }
    char *out = malloc(total + 1);
    if (!out)
        abort();
    size_t at = 0;
    for (int i = 0; i < n; i++)
        at += (size_t)tok_piece(vocab, ids[i], out + at, total - at);
    if (at != total)
        abort();
    /* OUT must be DATA with only missing bytes deleted: walk both, matching
     * equal bytes (greedy matching is optimal for a subsequence) and
     * skipping a byte of DATA only when it is missing. */
    size_t j = 0;
    for (size_t i = 0; i < size; i++) {
        if (j < total && (uint8_t)out[j] == data[i]) {
            j++;
            continue;
        }
        if (!missing[data[i]]) {
            fprintf(stderr, "fuzz_tokenizer: decode(encode(x)) != x (special %d): byte %zu "
                    "(0x%02x) of %zu lost or changed; %d ids, %zu bytes back\n",
                    special, i, data[i], size, n, total);
            abort();
        }
    }
    if (j != total) {
        fprintf(stderr, "fuzz_tokenizer: decode(encode(x)) has %zu bytes more than x\n",
                total - j);
        abort();
    }
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    round_trip(data, size, false);
    round_trip(data, size, true);
    return 0;
}
