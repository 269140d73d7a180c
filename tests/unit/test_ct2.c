/* The CTranslate2 model reader (backends/whisper/ct2.c): files written here
 * by a small writer, read back variable by variable; hostile files, each
 * refused with a message naming the file and the fault; every truncation
 * of a valid file and random corruptions of it (which the ASan build turns
 * into out-of-bounds checks); a file on disk; and the real Whisper base
 * model when it has been fetched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/skip.h"
#include "tests/unit/wbuf.h"

#include "backends/whisper/ct2.h"

#define REAL_MODEL "models/whisper-base/model.bin"

static void put_str(wbuf *b, const char *s)
{
    put_u16(b, (uint16_t)(strlen(s) + 1));
    put(b, s, strlen(s) + 1);
}

static void put_header(wbuf *b, uint32_t nvars)
{
    put_u32(b, CT2_BINARY_VERSION);
    put_str(b, "WhisperSpec");
    put_u32(b, 3);
    put_u32(b, nvars);
}

/* A variable of RANK dims DIMS and DTYPE whose bytes are 0, 1, 2, ... */
static void put_var(wbuf *b, const char *name, uint32_t rank, const uint32_t *dims,
                    uint32_t dtype)
{
    put_str(b, name);
    put_u8(b, (uint8_t)rank);
    size_t n = ct2_dtype_size(dtype);
    for (uint32_t d = 0; d < rank; d++) {
        put_u32(b, dims[d]);
        n *= dims[d];
    }
    put_u8(b, (uint8_t)dtype);
    put_u32(b, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        put_u8(b, (uint8_t)i);
}

/* The valid file of most tests: a f16 matrix, a f32 vector, an i32 scalar,
 * an i8 scalar of -3, and an alias of the matrix. */
static void put_valid(wbuf *b)
{
    put_header(b, 4);
    put_var(b, "decoder/embeddings/weight", 2, (uint32_t[]){3, 4}, CT2_F16);
    put_var(b, "encoder/layer_norm/gamma", 1, (uint32_t[]){4}, CT2_F32);
    put_var(b, "encoder/num_heads", 0, NULL, CT2_I32);
    put_str(b, "decoder/activation");
    put_u8(b, 0);
    put_u8(b, CT2_I8);
    put_u32(b, 1);
    put_u8(b, (uint8_t)-3);
    put_u32(b, 1);
    put_str(b, "decoder/projection/weight");
    put_str(b, "decoder/embeddings/weight");
}

/* Opens B's bytes; returns the status, the message in ERR. */
static int open_buf(const wbuf *b, ct2_file **f, char *err, size_t errlen)
{
    return ct2_open_memory(b->p, b->n, "t/model.bin", f, err, errlen);
}

static void test_valid(void **state)
{
    (void)state;
    wbuf b = {0};
    put_valid(&b);
    char err[256];
    ct2_file *f = NULL;
    int rc = open_buf(&b, &f, err, sizeof(err));
    if (rc)
        fail_msg("%s: %s", bt_strerror(rc), err);
    assert_int_equal(ct2_version(f), CT2_BINARY_VERSION);
    assert_string_equal(ct2_spec(f), "WhisperSpec");
    assert_int_equal(ct2_spec_revision(f), 3);
    assert_string_equal(ct2_path(f), "t/model.bin");
    assert_int_equal(ct2_var_count(f), 4);
    assert_int_equal(ct2_alias_count(f), 1);
    /* File order is kept. */
    assert_string_equal(ct2_var_at(f, 0)->name, "decoder/embeddings/weight");
    assert_string_equal(ct2_var_at(f, 3)->name, "decoder/activation");
    assert_null(ct2_var_at(f, 4));

    const ct2_var *w = ct2_find(f, "decoder/embeddings/weight");
    assert_non_null(w);
    assert_int_equal(w->rank, 2);
    assert_int_equal(w->dims[0], 3);
    assert_int_equal(w->dims[1], 4);
    assert_int_equal(w->dims[2], 1);
    assert_int_equal(w->dtype, CT2_F16);
    assert_int_equal(w->nelems, 12);
    assert_int_equal(w->nbytes, 24);
    assert_ptr_equal(w->data, b.p + w->offset);
    for (size_t i = 0; i < w->nbytes; i++)
        assert_int_equal(((const uint8_t *)w->data)[i], (uint8_t)i);
    /* The alias resolves to the variable. */
    assert_ptr_equal(ct2_find(f, "decoder/projection/weight"), w);
    const char *alias, *target;
    assert_int_equal(ct2_alias_at(f, 0, &alias, &target), 0);
    assert_string_equal(alias, "decoder/projection/weight");
    assert_string_equal(target, "decoder/embeddings/weight");
    assert_int_equal(ct2_alias_at(f, 1, &alias, &target), BT_ERANGE);
    assert_null(ct2_find(f, "decoder/embeddings"));
    assert_null(ct2_find(f, ""));

    /* Scalars. */
    int64_t v = 0;
    assert_int_equal(ct2_get_int(f, "encoder/num_heads", &v, err, sizeof(err)), 0);
    assert_int_equal(v, 0x03020100);
    assert_int_equal(ct2_get_int(f, "decoder/activation", &v, err, sizeof(err)), 0);
    assert_int_equal(v, -3);
    assert_int_equal(ct2_get_int(f, "encoder/layer_norm/gamma", &v, err, sizeof(err)), BT_ETYPE);
    assert_non_null(strstr(err, "'encoder/layer_norm/gamma' has shape [4], expected rank 0"));
    assert_int_equal(ct2_get_int(f, "nope", &v, err, sizeof(err)), BT_ENOENT);
    assert_string_equal(err, "t/model.bin: no variable 'nope'");

    /* ct2_expect: dtype, rank, dims with 0 as any. */
    const ct2_var *got = NULL;
    assert_int_equal(ct2_expect(f, "decoder/projection/weight", CT2_F16, 2, (uint32_t[]){0, 4},
                                &got, err, sizeof(err)), 0);
    assert_ptr_equal(got, w);
    assert_int_equal(ct2_expect(f, "decoder/embeddings/weight", CT2_F32, 2, NULL, &got, err,
                                sizeof(err)), BT_ETYPE);
    assert_string_equal(err, "t/model.bin: variable 'decoder/embeddings/weight' is f16, "
                             "expected f32");
    assert_int_equal(ct2_expect(f, "decoder/embeddings/weight", CT2_F16, 2,
                                (uint32_t[]){3, 5}, &got, err, sizeof(err)), BT_ETYPE);
    assert_string_equal(err, "t/model.bin: variable 'decoder/embeddings/weight' has shape "
                             "[3, 4], expected [3, 5]");
    ct2_close(f);
    free(b.p);
}

/* Zero bytes after a variable cut short, so that the variable count fits
 * the file and the reader reaches the fault. */
static void pad(wbuf *b)
{
    static const uint8_t zeros[64];
    put(b, zeros, sizeof(zeros));
}

/* Each hostile file is refused with BT_EFORMAT and a message holding WANT. */
static void refused(const wbuf *b, const char *want)
{
    char err[256];
    ct2_file *f = (ct2_file *)1;
    int rc = open_buf(b, &f, err, sizeof(err));
    assert_null(f);
    if (rc != BT_EFORMAT || !strstr(err, want))
        fail_msg("expected BT_EFORMAT with '%s', got %s: '%s'", want, bt_strerror(rc), err);
    assert_non_null(strstr(err, "t/model.bin"));
}

static void test_hostile(void **state)
{
    (void)state;
    wbuf b = {0};

    put_u32(&b, 5);  /* another version */
    refused(&b, "binary version 5");
    b.n = 0;
    put(&b, "GGUF\3\0\0\0", 8);  /* another format */
    refused(&b, "not a CTranslate2 model");

    b.n = 0;
    put_u32(&b, CT2_BINARY_VERSION);
    put_u16(&b, 4);
    put(&b, "ab\0c", 4);  /* a NUL inside a string */
    refused(&b, "not a non-empty NUL-terminated string");
    b.n = 0;
    put_u32(&b, CT2_BINARY_VERSION);
    put_u16(&b, 1);
    put_u8(&b, 0);  /* an empty string */
    refused(&b, "the spec name is not a non-empty");

    b.n = 0;
    put_header(&b, 1000000);  /* more variables than could fit */
    refused(&b, "1000000 variables cannot fit");

    b.n = 0;
    put_header(&b, 1);
    put_str(&b, "x");
    put_u8(&b, CT2_MAX_RANK + 1);  /* rank */
    pad(&b);
    refused(&b, "variable 'x' has rank 5, more than 4");

    b.n = 0;
    put_header(&b, 1);
    put_str(&b, "x");
    put_u8(&b, 1);
    put_u32(&b, 2);
    put_u8(&b, 9);  /* dtype */
    pad(&b);
    refused(&b, "variable 'x' has dtype 9");

    b.n = 0;
    put_header(&b, 1);
    put_str(&b, "x");
    put_u8(&b, 2);
    put_u32(&b, 3);
    put_u32(&b, 4);
    put_u8(&b, CT2_F16);
    put_u32(&b, 12);  /* 24 bytes expected */
    pad(&b);
    refused(&b, "variable 'x' has 12 bytes, but 12 elements of f16 take 24");

    b.n = 0;
    put_header(&b, 1);
    put_str(&b, "x");
    put_u8(&b, 2);
    put_u32(&b, 0x10000);
    put_u32(&b, 0x10000);  /* 2^32 elements: the u32 byte count cannot say it */
    put_u8(&b, CT2_I8);
    put_u32(&b, 0);
    pad(&b);
    refused(&b, "variable 'x' has 0 bytes");

    b.n = 0;
    put_header(&b, 2);
    put_var(&b, "x", 1, (uint32_t[]){2}, CT2_F32);
    put_var(&b, "x", 1, (uint32_t[]){2}, CT2_F32);
    put_u32(&b, 0);
    refused(&b, "variable 'x' appears twice");

    b.n = 0;
    put_header(&b, 1);
    put_var(&b, "x", 1, (uint32_t[]){2}, CT2_F32);
    put_u32(&b, 1);
    put_str(&b, "y");
    put_str(&b, "z");
    refused(&b, "alias 'y' names 'z', which is not a variable");

    b.n = 0;
    put_header(&b, 1);
    put_var(&b, "x", 1, (uint32_t[]){2}, CT2_F32);
    put_u32(&b, 1);
    put_str(&b, "x");
    put_str(&b, "x");
    refused(&b, "alias 'x' is also the name of a variable");

    b.n = 0;
    put_header(&b, 1);
    put_var(&b, "x", 1, (uint32_t[]){2}, CT2_F32);
    put_u32(&b, 2);
    put_str(&b, "y");
    put_str(&b, "x");
    put_str(&b, "y");
    put_str(&b, "x");
    refused(&b, "alias 'y' appears twice");

    b.n = 0;
    put_valid(&b);
    put_u8(&b, 0);
    refused(&b, "1 bytes after the aliases");
    free(b.p);
}

/* Every prefix of the valid file is refused: truncated at the byte where
 * the reader stopped, or a count that the bytes left cannot hold. */
static void test_every_truncation(void **state)
{
    (void)state;
    wbuf b = {0};
    put_valid(&b);
    char err[256];
    for (size_t n = 0; n < b.n; n++) {
        /* A copy of exactly N bytes, so that ASan sees any read past it. */
        uint8_t *p = malloc(n ? n : 1);
        assert_non_null(p);
        memcpy(p, b.p, n);
        ct2_file *f = NULL;
        int rc = ct2_open_memory(p, n, "t/model.bin", &f, err, sizeof(err));
        if (rc != BT_EFORMAT || (!strstr(err, "truncated at byte") && !strstr(err, "cannot fit")))
            fail_msg("prefix of %zu bytes: %s: '%s'", n, bt_strerror(rc), err);
        assert_null(f);
        free(p);
    }
    free(b.p);
}

/* Random bytes changed in the valid file: opened or refused, never a read
 * outside it, and what opens keeps every variable inside the file. */
static void test_random_corruption(void **state)
{
    (void)state;
    wbuf b = {0};
    put_valid(&b);
    uint8_t *p = malloc(b.n);
    assert_non_null(p);
    srand(7);
    char err[256];
    int opened = 0;
    for (int round = 0; round < 20000; round++) {
        memcpy(p, b.p, b.n);
        int k = 1 + rand() % 3;
        for (int i = 0; i < k; i++)
            p[rand() % b.n] = (uint8_t)rand();
        ct2_file *f = NULL;
        int rc = ct2_open_memory(p, b.n, "t/model.bin", &f, err, sizeof(err));
        if (rc) {
            assert_null(f);
            assert_true(err[0] != '\0');
            continue;
        }
        opened++;
        for (size_t i = 0; i < ct2_var_count(f); i++) {
            const ct2_var *v = ct2_var_at(f, i);
            assert_true(v->offset <= b.n && v->nbytes <= b.n - v->offset);
            assert_ptr_equal(ct2_find(f, v->name), v);
        }
        ct2_close(f);
    }
    /* Most single-byte changes land in the data and leave a valid file. */
    assert_true(opened > 0);
    free(p);
    free(b.p);
}

static void test_file(void **state)
{
    (void)state;
    char path[] = "/tmp/baton-test-ct2-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    wbuf b = {0};
    put_valid(&b);
    assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
    close(fd);
    char err[256];
    ct2_file *f = NULL;
    int rc = ct2_open(path, &f, err, sizeof(err));
    if (rc)
        fail_msg("%s: %s", bt_strerror(rc), err);
    assert_string_equal(ct2_path(f), path);
    assert_int_equal(ct2_var_count(f), 4);
    ct2_close(f);
    /* An empty file, and one that is not there. */
    assert_int_equal(truncate(path, 0), 0);
    assert_int_equal(ct2_open(path, &f, err, sizeof(err)), BT_EFORMAT);
    assert_non_null(strstr(err, "truncated at byte 0 of 0"));
    unlink(path);
    assert_int_equal(ct2_open(path, &f, err, sizeof(err)), BT_EIO);
    assert_non_null(strstr(err, "No such file"));
    assert_int_equal(ct2_open("/tmp", &f, err, sizeof(err)), BT_EIO);
    assert_non_null(strstr(err, "not a regular file"));
    ct2_close(NULL);
    free(b.p);
}

/* Whisper base as faster-whisper has it (scripts/fetch-model.sh
 * whisper-base): its spec, its sizes, and the tied projection. */
static void test_real_model(void **state)
{
    (void)state;
    if (access(REAL_MODEL, R_OK) != 0)
        skip_without_model(REAL_MODEL);
    char err[512];
    ct2_file *f = NULL;
    int rc = ct2_open(REAL_MODEL, &f, err, sizeof(err));
    if (rc)
        fail_msg("%s: %s", bt_strerror(rc), err);
    assert_string_equal(ct2_spec(f), "WhisperSpec");
    assert_int_equal(ct2_var_count(f), 212);
    const ct2_var *v;
    rc = ct2_expect(f, "decoder/embeddings/weight", CT2_F16, 2, (uint32_t[]){51865, 512}, &v,
                    err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
    assert_ptr_equal(ct2_find(f, "decoder/projection/weight"), v);
    rc = ct2_expect(f, "encoder/position_encodings/encodings", CT2_F16, 2,
                    (uint32_t[]){1500, 512}, &v, err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
    int64_t heads;
    assert_int_equal(ct2_get_int(f, "encoder/num_heads", &heads, err, sizeof(err)), 0);
    assert_int_equal(heads, 8);
    /* The data of all variables: most of the file, and less than all of
     * it (the table of names and dims takes the rest). */
    size_t data = 0;
    for (size_t i = 0; i < ct2_var_count(f); i++)
        data += ct2_var_at(f, i)->nbytes;
    assert_true(data > 140u * 1000 * 1000 && data < 145217532u);
    ct2_close(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_file),
        cmocka_unit_test(test_real_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
