/* libFuzzer target: a GGUF file.  The bytes are written to a memfd and
 * opened as a file (gguf_open maps a path), then every accessor is called
 * on every key and tensor that opened, and the tokenizer is built from the
 * file; when it builds, a few texts and the input itself are encoded and
 * every piece decoded.
 *
 * Beyond the sanitizers it asserts the reader's promises: each tensor's
 * bytes lie inside the file, an index past the end answers BT_ERANGE or
 * NULL, a key found by name is the key at that index, and every id the
 * tokenizer returns is inside its vocabulary.  With BATON_FUZZ_VERBOSE set
 * in the environment it says why a file or its tokenizer was refused. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backends/transformer/gguf.h"
#include "backends/transformer/tokenizer.h"
#include "common/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "fuzz_gguf: %s failed at line %d\n", #c, __LINE__); abort(); } } while (0)

/* At most this many elements of an array are read one by one, so that a
 * file announcing millions of elements costs the fuzzer little. */
#define MAX_ELEMS 64

static int memfd = -1;
/* Reads of the mapping land here, so that the compiler keeps them. */
static volatile uint8_t sink;

static void touch(const void *p, size_t len)
{
    uint8_t x = 0;
    for (size_t i = 0; i < len; i++)
        x ^= ((const uint8_t *)p)[i];
    sink = x;
}
static char path[64];

/* Reads KEY through every scalar, string and array accessor. */
static void read_key(const gguf_file *f, const char *key, uint32_t type)
{
    uint32_t u32; int32_t i32; uint64_t u64; int64_t i64; float f32; bool b;
    const char *s; size_t len;
    (void)gguf_get_u32(f, key, &u32);
    (void)gguf_get_i32(f, key, &i32);
    (void)gguf_get_u64(f, key, &u64);
    (void)gguf_get_i64(f, key, &i64);
    (void)gguf_get_f32(f, key, &f32);
    (void)gguf_get_bool(f, key, &b);
    if (gguf_get_str(f, key, &s, &len) == 0) {
        CHECK(type == GGUF_VAL_STRING);
        touch(s, len);
    }
    uint32_t et; uint64_t count;
    if (gguf_get_array(f, key, &et, &count) != 0) {
        CHECK(type != GGUF_VAL_ARRAY);
        return;
    }
    CHECK(type == GGUF_VAL_ARRAY);
    const void *raw;
    (void)gguf_array_data(f, key, &raw);
    uint64_t n = count < MAX_ELEMS ? count : MAX_ELEMS;
    for (uint64_t i = 0; i < n; i++) {
        if (gguf_array_string(f, key, i, &s, &len) == 0) {
            touch(s, len);
        }
        (void)gguf_array_i64(f, key, i, &i64);
        (void)gguf_array_f32(f, key, i, &f32);
    }
    /* The last element and one past it. */
    if (count > 0) {
        (void)gguf_array_string(f, key, count - 1, &s, &len);
        (void)gguf_array_i64(f, key, count - 1, &i64);
        (void)gguf_array_f32(f, key, count - 1, &f32);
    }
    CHECK(gguf_array_string(f, key, count, &s, &len) != 0);
    CHECK(gguf_array_i64(f, key, count, &i64) != 0);
    CHECK(gguf_array_f32(f, key, count, &f32) != 0);
}

/* Builds the tokenizer and runs it on a few texts and on the input. */
static void use_tokenizer(const gguf_file *f, const uint8_t *data, size_t size)
{
    tok_vocab *v = NULL;
    char err[256];
    if (tok_vocab_create(f, &v, err, sizeof(err)) != 0) {
        if (getenv("BATON_FUZZ_VERBOSE"))
            fprintf(stderr, "fuzz_gguf: tokenizer: %s\n", err);
        CHECK(v == NULL);
        return;
    }
    int n_vocab = tok_vocab_size(v);
    CHECK(n_vocab > 0);
    (void)tok_bos(v);
    (void)tok_eos(v);
    static const char *const texts[] = {
        "", "Hello, world!", "  12345 abc\n\n\tdef", "<|im_start|>user\nhi<|im_end|>",
        "\xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80", "\xff\xfe\x80",
    };
    int32_t ids[512];
    for (size_t t = 0; t <= sizeof(texts) / sizeof(texts[0]); t++) {
        const char *x = t < sizeof(texts) / sizeof(texts[0]) ? texts[t] : (const char *)data;
        size_t len = t < sizeof(texts) / sizeof(texts[0]) ? strlen(x) : (size > 256 ? 256 : size);
        for (int special = 0; special < 2; special++) {
            int n = tok_encode(v, x, len, special, ids, sizeof(ids) / sizeof(ids[0]));
            if (n < 0)
                continue;
            size_t got = (size_t)n < sizeof(ids) / sizeof(ids[0]) ? (size_t)n : sizeof(ids) / sizeof(ids[0]);
            for (size_t i = 0; i < got; i++)
                CHECK(ids[i] >= 0 && ids[i] < n_vocab);
        }
    }
    char buf[64];
    int lim = n_vocab < 4096 ? n_vocab : 4096;
    for (int id = 0; id < lim; id++) {
        CHECK(tok_piece(v, id, buf, sizeof(buf)) >= 0);
        (void)tok_is_eog(v, id);
    }
    CHECK(tok_piece(v, n_vocab, buf, sizeof(buf)) < 0);
    CHECK(tok_piece(v, -1, buf, sizeof(buf)) < 0);
    char *out = NULL;
    if (tok_chat_render(v, NULL, "hi", 2, &out) >= 0)
        free(out);
    (void)tok_chat_encode(v, NULL, "hi", 2, ids, sizeof(ids) / sizeof(ids[0]));
    if (getenv("BATON_FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz_gguf: tokenizer of %d tokens\n", n_vocab);
    tok_vocab_destroy(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (memfd < 0) {
        memfd = memfd_create("fuzz_gguf", 0);
        CHECK(memfd >= 0);
        snprintf(path, sizeof(path), "/proc/self/fd/%d", memfd);
    }
    CHECK(ftruncate(memfd, 0) == 0);
    CHECK(pwrite(memfd, data, size, 0) == (ssize_t)size);
    gguf_file *f = NULL;
    char err[256];
    if (gguf_open(path, &f, err, sizeof(err)) != 0) {
        if (getenv("BATON_FUZZ_VERBOSE"))
            fprintf(stderr, "fuzz_gguf: open: %s\n", err);
        CHECK(f == NULL);
        CHECK(err[0] != '\0');
        return 0;
    }
    (void)gguf_version(f);
    CHECK(gguf_alignment(f) > 0);
    size_t data_off = gguf_data_offset(f);
    /* A file without tensors may end before its (aligned) data section. */
    CHECK(data_off <= size || gguf_tensor_count(f) == 0);
    size_t n_kv = gguf_kv_count(f);
    char key[1024];
    for (size_t i = 0; i < n_kv; i++) {
        size_t len = 0;
        const char *k = gguf_kv_key(f, i, &len);
        CHECK(k != NULL);
        uint32_t type = gguf_kv_type(f, i);
        CHECK(type != UINT32_MAX);
        (void)gguf_value_type_name(type);
        if (len >= sizeof(key) || memchr(k, '\0', len))
            continue;
        memcpy(key, k, len);
        key[len] = '\0';
        size_t at;
        CHECK(gguf_find_key(f, key, &at) == 0);
        CHECK(at < n_kv);
        read_key(f, key, gguf_kv_type(f, at));
    }
    CHECK(gguf_kv_type(f, n_kv) == UINT32_MAX);
    /* The fuzzer learns this name from the comparison and writes it into
     * files, so it is absent only when no key of the file spells it. */
    static const char absent[] = "no.such.key.in.any.file";
    size_t at = 0;
    int rc = gguf_find_key(f, absent, &at);
    if (rc == 0) {
        size_t len = 0;
        const char *k = gguf_kv_key(f, at, &len);
        CHECK(at < n_kv && len == strlen(absent) && memcmp(k, absent, len) == 0);
    } else {
        CHECK(rc == BT_ENOENT);
        for (size_t i = 0; i < n_kv; i++) {
            size_t len = 0;
            const char *k = gguf_kv_key(f, i, &len);
            CHECK(len != strlen(absent) || memcmp(k, absent, len) != 0);
        }
    }
    size_t n_t = gguf_tensor_count(f);
    for (size_t i = 0; i < n_t; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        CHECK(t && t->name && t->n_dims <= GGUF_MAX_DIMS);
        CHECK(t->offset <= size - data_off && t->nbytes <= size - data_off - t->offset);
        if (strlen(t->name) == t->name_len)
            CHECK(gguf_tensor_find(f, t->name) == t);
        (void)gguf_type_name(t->type);
        CHECK(gguf_type_block_elems(t->type) > 0 && gguf_type_block_bytes(t->type) > 0);
        if (t->nbytes) {
            touch(t->data, 1);
            touch((const uint8_t *)t->data + t->nbytes - 1, 1);
        }
    }
    CHECK(gguf_tensor_at(f, n_t) == NULL);
    use_tokenizer(f, data, size);
    gguf_close(f);
    return 0;
}
