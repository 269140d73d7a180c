/* The GGUF reader (backends/transformer/gguf.c): files written here by a small writer
 * into a temporary directory, read back value by value and byte by byte;
 * hostile files, each refused with a message naming the fault; every
 * truncation and random corruptions of a valid file (which the ASan build
 * turns into out-of-bounds checks); and the real SmolLM2 model when it has
 * been downloaded. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/skip.h"
#include "tests/unit/wbuf.h"

#include "backends/transformer/gguf.h"

#define REAL_MODEL "models/smollm2-135m-instruct-q4_1.gguf"

static char tmpdir[64];

static void put_str(wbuf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void put_header(wbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    put(b, "GGUF", 4);
    put_u32(b, version);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}

/* A key and its value type; the caller appends the value. */
static void put_key(wbuf *b, const char *key, uint32_t type)
{
    put_str(b, key);
    put_u32(b, type);
}

static void pad_to(wbuf *b, size_t align)
{
    while (b->n % align)
        put_u8(b, 0);
}

static void wbuf_free(wbuf *b)
{
    free(b->p);
    *b = (wbuf){0};
}

/* Writes B to NAME in the temporary directory; PATH gets the full path. */
static void write_file(const char *name, const uint8_t *p, size_t n, char *path, size_t pathlen)
{
    snprintf(path, pathlen, "%s/%s", tmpdir, name);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(p, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

static gguf_file *open_ok(const wbuf *b, const char *name)
{
    char path[PATH_MAX], err[512];
    write_file(name, b->p, b->n, path, sizeof(path));
    gguf_file *f = NULL;
    int rc = gguf_open(path, &f, err, sizeof(err));
    if (rc)
        print_error("gguf_open(%s): %s: %s\n", name, bt_strerror(rc), err);
    assert_int_equal(rc, 0);
    assert_non_null(f);
    return f;
}

/* Opening B must fail with STATUS and a message holding SUBSTR. */
static void expect_fail(const wbuf *b, const char *name, int status, const char *substr)
{
    char path[PATH_MAX], err[512];
    write_file(name, b->p, b->n, path, sizeof(path));
    gguf_file *f = (gguf_file *)&f;
    int rc = gguf_open(path, &f, err, sizeof(err));
    if (rc != status || !strstr(err, substr))
        print_error("%s: got %d (%s) \"%s\", wanted %d and \"%s\"\n", name, rc,
                    bt_strerror(rc), err, status, substr);
    assert_int_equal(rc, status);
    assert_null(f);
    assert_non_null(strstr(err, substr));
}

/* A tensor for the writer: NE innermost first, N_DIMS of them. */
typedef struct tspec {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[5];
} tspec;

/* Expected bytes of a tensor, from the ggml block layouts written out here
 * (rather than the reader's table, which this checks). */
static size_t spec_bytes(const tspec *t)
{
    size_t blck = 1, bb;
    switch (t->type) {
    case GGUF_GGML_F32: bb = 4; break;
    case GGUF_GGML_F16: bb = 2; break;
    case GGUF_GGML_Q8_0: blck = 32; bb = 34; break;
    case GGUF_GGML_Q4_1: blck = 32; bb = 20; break;
    default: return 0;
    }
    size_t n = t->n_dims ? t->ne[0] / blck * bb : bb;
    for (uint32_t d = 1; d < t->n_dims; d++)
        n *= t->ne[d];
    return n;
}

static uint8_t pattern(size_t tensor, size_t k)
{
    return (uint8_t)(tensor * 37 + k * 7 + 1);
}

/* Writes a file of the tensors TS[N] and the kv general.alignment = ALIGN
 * (none when 0; the data then uses 32), then N_EXTRA kvs that EXTRA (may be
 * NULL) appends.  Offsets are packed and aligned unless OFFSETS gives them.
 * Data bytes are pattern(), written only for tensors of sane size and
 * offset, so hostile shapes do not make a hostile test file. */
static void build_ex(wbuf *b, uint32_t version, uint32_t align, const tspec *ts, size_t n,
                     const uint64_t *offsets, uint64_t n_extra, void (*extra)(wbuf *))
{
    size_t a = align ? align : 32;
    put_header(b, version, n, (align ? 1 : 0) + n_extra);
    if (align) {
        put_key(b, "general.alignment", GGUF_VAL_U32);
        put_u32(b, align);
    }
    if (extra)
        extra(b);
    uint64_t off[16], next = 0;
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++) {
        off[i] = offsets ? offsets[i] : next;
        next = (off[i] + spec_bytes(&ts[i]) + a - 1) / a * a;
        put_str(b, ts[i].name);
        put_u32(b, ts[i].n_dims);
        for (uint32_t d = 0; d < ts[i].n_dims; d++)
            put_u64(b, ts[i].ne[d]);
        put_u32(b, ts[i].type);
        put_u64(b, off[i]);
    }
    pad_to(b, a);
    size_t data = b->n;
    for (size_t i = 0; i < n; i++) {
        if (off[i] > (1u << 20) || spec_bytes(&ts[i]) > (1u << 20))
            continue;
        while (b->n < data + off[i])
            put_u8(b, 0xee);
        for (size_t k = 0; k < spec_bytes(&ts[i]); k++)
            put_u8(b, pattern(i, k));
    }
}

static void build(wbuf *b, uint32_t version, uint32_t align, const tspec *ts, size_t n,
                  const uint64_t *offsets)
{
    build_ex(b, version, align, ts, n, offsets, 0, NULL);
}

static int setup(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/test_gguf.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    static const char *const names[] = {
        "scalars.gguf", "v2.gguf", "arrays.gguf", "tensors.gguf", "align64.gguf",
        "align_bad.gguf", "align_type.gguf", "magic.gguf", "version.gguf", "version1.gguf",
        "bigendian.gguf", "trunc_key.gguf", "trunc_val.gguf", "strlen.gguf",
        "arraycount.gguf", "arraycount_str.gguf", "past_end.gguf", "offset_past.gguf",
        "unaligned.gguf", "row.gguf", "ggml_type.gguf", "dims.gguf", "dup_tensor.gguf",
        "dup_key.gguf", "nested.gguf", "val_type.gguf", "short.gguf", "kvcount.gguf",
        "tcount.gguf", "dimbig.gguf", "prefix.gguf", "mutant.gguf",
    };
    char path[PATH_MAX];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", tmpdir, names[i]);
        unlink(path);
    }
    return rmdir(tmpdir);
}

static void test_scalars(void **state)
{
    (void)state;
    wbuf b = {0};
    put_header(&b, 3, 0, 13);
    put_key(&b, "u8", GGUF_VAL_U8), put_u8(&b, 200);
    put_key(&b, "i8", GGUF_VAL_I8), put_u8(&b, (uint8_t)-5);
    put_key(&b, "u16", GGUF_VAL_U16), put(&b, &(uint16_t){60000}, 2);
    put_key(&b, "i16", GGUF_VAL_I16), put(&b, &(int16_t){-300}, 2);
    put_key(&b, "u32", GGUF_VAL_U32), put_u32(&b, 4000000000u);
    put_key(&b, "i32", GGUF_VAL_I32), put(&b, &(int32_t){-2000000000}, 4);
    put_key(&b, "f32", GGUF_VAL_F32), put(&b, &(float){1.5f}, 4);
    put_key(&b, "bool", GGUF_VAL_BOOL), put_u8(&b, 1);
    put_key(&b, "str", GGUF_VAL_STRING), put_str(&b, "hello");
    put_key(&b, "u64", GGUF_VAL_U64), put_u64(&b, 1ull << 40);
    put_key(&b, "i64", GGUF_VAL_I64), put(&b, &(int64_t){-(1ll << 40)}, 8);
    put_key(&b, "f64", GGUF_VAL_F64), put(&b, &(double){0.25}, 8);
    put_key(&b, "f64_inexact", GGUF_VAL_F64), put(&b, &(double){0.1}, 8);
    gguf_file *f = open_ok(&b, "scalars.gguf");

    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_kv_count(f), 13);
    assert_int_equal(gguf_tensor_count(f), 0);
    assert_int_equal(gguf_alignment(f), 32);
    size_t idx, len;
    assert_int_equal(gguf_find_key(f, "str", &idx), 0);
    assert_int_equal(idx, 8);
    const char *k = gguf_kv_key(f, idx, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(k, "str", 3);
    assert_int_equal(gguf_kv_type(f, idx), GGUF_VAL_STRING);
    assert_int_equal(gguf_kv_type(f, 99), UINT32_MAX);
    assert_null(gguf_kv_key(f, 99, &len));

    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float fv;
    bool bv;
    const char *s;
    assert_int_equal(gguf_get_u32(f, "u8", &u32), 0);
    assert_int_equal(u32, 200);
    assert_int_equal(gguf_get_i32(f, "i8", &i32), 0);
    assert_int_equal(i32, -5);
    assert_int_equal(gguf_get_u32(f, "u16", &u32), 0);
    assert_int_equal(u32, 60000);
    assert_int_equal(gguf_get_i32(f, "i16", &i32), 0);
    assert_int_equal(i32, -300);
    assert_int_equal(gguf_get_u32(f, "u32", &u32), 0);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(gguf_get_i32(f, "i32", &i32), 0);
    assert_int_equal(i32, -2000000000);
    assert_int_equal(gguf_get_u64(f, "u64", &u64), 0);
    assert_int_equal(u64, 1ull << 40);
    assert_int_equal(gguf_get_i64(f, "i64", &i64), 0);
    assert_true(i64 == -(1ll << 40));
    assert_int_equal(gguf_get_f32(f, "f32", &fv), 0);
    assert_true(fv == 1.5f);
    assert_int_equal(gguf_get_f32(f, "f64", &fv), 0);
    assert_true(fv == 0.25f);
    assert_int_equal(gguf_get_bool(f, "bool", &bv), 0);
    assert_true(bv);
    assert_int_equal(gguf_get_str(f, "str", &s, &len), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "hello", 5);

    /* Lossless widenings and narrowings succeed; lossy ones are ERANGE. */
    assert_int_equal(gguf_get_u64(f, "u32", &u64), 0);
    assert_int_equal(u64, 4000000000u);
    assert_int_equal(gguf_get_i64(f, "u8", &i64), 0);
    assert_int_equal(i64, 200);
    assert_int_equal(gguf_get_i32(f, "u16", &i32), 0);
    assert_int_equal(i32, 60000);
    assert_int_equal(gguf_get_i64(f, "i32", &i64), 0);
    assert_true(i64 == -2000000000);
    u32 = 7;
    assert_int_equal(gguf_get_u32(f, "i8", &u32), BT_ERANGE);
    assert_int_equal(u32, 7);  /* untouched on failure */
    assert_int_equal(gguf_get_u32(f, "u64", &u32), BT_ERANGE);
    assert_int_equal(gguf_get_i32(f, "u32", &i32), BT_ERANGE);
    assert_int_equal(gguf_get_u64(f, "i64", &u64), BT_ERANGE);
    assert_int_equal(gguf_get_f32(f, "f64_inexact", &fv), BT_ERANGE);
    /* Other kinds do not convert. */
    assert_int_equal(gguf_get_u32(f, "f32", &u32), BT_ETYPE);
    assert_int_equal(gguf_get_u32(f, "bool", &u32), BT_ETYPE);
    assert_int_equal(gguf_get_u32(f, "str", &u32), BT_ETYPE);
    assert_int_equal(gguf_get_f32(f, "u32", &fv), BT_ETYPE);
    assert_int_equal(gguf_get_bool(f, "u8", &bv), BT_ETYPE);
    assert_int_equal(gguf_get_str(f, "u32", &s, &len), BT_ETYPE);
    assert_int_equal(gguf_get_array(f, "str", NULL, NULL), BT_ETYPE);
    assert_int_equal(gguf_get_u32(f, "missing", &u32), BT_ENOENT);
    assert_int_equal(gguf_get_u32(f, "u", &u32), BT_ENOENT);
    assert_int_equal(gguf_get_u32(f, "u80", &u32), BT_ENOENT);
    assert_int_equal(gguf_find_key(f, "nope", &idx), BT_ENOENT);
    gguf_close(f);
    wbuf_free(&b);

    /* Version 2 has the same layout. */
    put_header(&b, 2, 0, 1);
    put_key(&b, "general.architecture", GGUF_VAL_STRING), put_str(&b, "llama");
    f = open_ok(&b, "v2.gguf");
    assert_int_equal(gguf_version(f), 2);
    assert_int_equal(gguf_get_str(f, "general.architecture", &s, &len), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "llama", 5);
    gguf_close(f);
    gguf_close(NULL);
    wbuf_free(&b);
    assert_string_equal(bt_strerror(BT_ETYPE), "type, dtype or size mismatch");
}

static void test_arrays(void **state)
{
    (void)state;
    wbuf b = {0};
    put_header(&b, 3, 0, 6);
    put_key(&b, "ints", GGUF_VAL_ARRAY), put_u32(&b, GGUF_VAL_I32), put_u64(&b, 3);
    put(&b, (int32_t[]){1, -2, 3}, 12);
    put_key(&b, "bytes", GGUF_VAL_ARRAY), put_u32(&b, GGUF_VAL_U8), put_u64(&b, 2);
    put(&b, (uint8_t[]){9, 255}, 2);
    put_key(&b, "floats", GGUF_VAL_ARRAY), put_u32(&b, GGUF_VAL_F32), put_u64(&b, 2);
    put(&b, (float[]){0.5f, -3.0f}, 8);
    put_key(&b, "strs", GGUF_VAL_ARRAY), put_u32(&b, GGUF_VAL_STRING), put_u64(&b, 3);
    put_str(&b, "a"), put_str(&b, ""), put_str(&b, "ccc");
    put_key(&b, "empty", GGUF_VAL_ARRAY), put_u32(&b, GGUF_VAL_STRING), put_u64(&b, 0);
    put_key(&b, "big", GGUF_VAL_ARRAY), put_u32(&b, GGUF_VAL_U64), put_u64(&b, 1);
    put_u64(&b, UINT64_MAX);
    gguf_file *f = open_ok(&b, "arrays.gguf");

    uint32_t et;
    uint64_t n;
    int64_t v;
    float fv;
    const char *s;
    size_t len;
    const void *data;
    assert_int_equal(gguf_get_array(f, "ints", &et, &n), 0);
    assert_int_equal(et, GGUF_VAL_I32);
    assert_int_equal(n, 3);
    int64_t want[] = {1, -2, 3};
    for (uint64_t i = 0; i < 3; i++) {
        assert_int_equal(gguf_array_i64(f, "ints", i, &v), 0);
        assert_true(v == want[i]);
    }
    assert_int_equal(gguf_array_i64(f, "ints", 3, &v), BT_ERANGE);
    assert_int_equal(gguf_array_data(f, "ints", &data), 0);
    int32_t raw[3];
    memcpy(raw, data, sizeof(raw));
    assert_int_equal(raw[1], -2);
    assert_int_equal(gguf_array_f32(f, "ints", 0, &fv), BT_ETYPE);
    assert_int_equal(gguf_array_string(f, "ints", 0, &s, &len), BT_ETYPE);

    assert_int_equal(gguf_array_i64(f, "bytes", 1, &v), 0);
    assert_int_equal(v, 255);
    assert_int_equal(gguf_array_f32(f, "floats", 1, &fv), 0);
    assert_true(fv == -3.0f);
    assert_int_equal(gguf_array_i64(f, "floats", 0, &v), BT_ETYPE);
    assert_int_equal(gguf_array_i64(f, "big", 0, &v), BT_ERANGE);

    assert_int_equal(gguf_get_array(f, "strs", &et, &n), 0);
    assert_int_equal(et, GGUF_VAL_STRING);
    assert_int_equal(n, 3);
    const char *want_s[] = {"a", "", "ccc"};
    for (uint64_t i = 0; i < 3; i++) {
        assert_int_equal(gguf_array_string(f, "strs", i, &s, &len), 0);
        assert_int_equal(len, strlen(want_s[i]));
        assert_memory_equal(s, want_s[i], len);
    }
    assert_int_equal(gguf_array_string(f, "strs", 3, &s, &len), BT_ERANGE);
    assert_int_equal(gguf_array_data(f, "strs", &data), BT_ETYPE);
    assert_int_equal(gguf_array_i64(f, "strs", 0, &v), BT_ETYPE);
    assert_int_equal(gguf_get_array(f, "empty", &et, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(gguf_array_string(f, "empty", 0, &s, &len), BT_ERANGE);
    assert_int_equal(gguf_get_u32(f, "ints", &et), BT_ETYPE);
    assert_int_equal(gguf_array_string(f, "nope", 0, &s, &len), BT_ENOENT);
    gguf_close(f);
    wbuf_free(&b);
}

/* Checks every tensor of TS[N] in F: shape, size, alignment, bytes. */
static void check_tensors(const gguf_file *f, const tspec *ts, size_t n, size_t align)
{
    assert_int_equal(gguf_tensor_count(f), n);
    assert_int_equal(gguf_alignment(f), align);
    assert_int_equal(gguf_data_offset(f) % align, 0);
    for (size_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        assert_non_null(t);
        assert_ptr_equal(gguf_tensor_find(f, ts[i].name), t);
        assert_string_equal(t->name, ts[i].name);
        assert_int_equal(t->name_len, strlen(ts[i].name));
        assert_int_equal(t->type, ts[i].type);
        assert_int_equal(t->n_dims, ts[i].n_dims);
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
            assert_int_equal(t->ne[d], d < ts[i].n_dims ? (int64_t)ts[i].ne[d] : 1);
        assert_int_equal(t->nbytes, spec_bytes(&ts[i]));
        assert_int_equal(t->offset % align, 0);
        /* The mapping is page-aligned, so aligned offsets are aligned addresses. */
        assert_int_equal((uintptr_t)t->data % align, 0);
        const uint8_t *p = t->data;
        for (size_t k = 0; k < t->nbytes; k++)
            if (p[k] != pattern(i, k))
                fail_msg("tensor %s byte %zu: %u, wanted %u", t->name, k, p[k], pattern(i, k));
    }
    assert_null(gguf_tensor_at(f, n));
    assert_null(gguf_tensor_find(f, "absent"));
}

static const tspec four[] = {
    {"w.f32", GGUF_GGML_F32, 2, {4, 3}},
    {"w.f16", GGUF_GGML_F16, 1, {7}},
    {"blk.0.q8", GGUF_GGML_Q8_0, 2, {64, 2}},
    {"blk.0.q4_1", GGUF_GGML_Q4_1, 3, {32, 3, 2}},
};

static void test_tensors(void **state)
{
    (void)state;
    wbuf b = {0};
    build(&b, 3, 0, four, 4, NULL);
    gguf_file *f = open_ok(&b, "tensors.gguf");
    check_tensors(f, four, 4, 32);
    assert_int_equal(gguf_tensor_at(f, 2)->nbytes, 2 * 2 * 34);
    assert_int_equal(gguf_tensor_at(f, 3)->nbytes, 3 * 2 * 20);
    assert_string_equal(gguf_type_name(GGUF_GGML_Q4_1), "q4_1");
    assert_string_equal(gguf_type_name(GGUF_GGML_Q6_K), "q6_K");
    assert_string_equal(gguf_type_name(4), "?");
    assert_int_equal(gguf_type_block_bytes(GGUF_GGML_Q8_K), 292);
    assert_int_equal(gguf_type_block_elems(GGUF_GGML_Q4_K), 256);
    assert_int_equal(gguf_type_block_bytes(99), 0);
    gguf_close(f);
    wbuf_free(&b);
}

static void test_custom_alignment(void **state)
{
    (void)state;
    wbuf b = {0};
    build(&b, 3, 64, four, 4, NULL);
    gguf_file *f = open_ok(&b, "align64.gguf");
    check_tensors(f, four, 4, 64);
    gguf_close(f);
    wbuf_free(&b);

    build(&b, 3, 48, four, 1, NULL);
    expect_fail(&b, "align_bad.gguf", BT_EFORMAT, "general.alignment 48 at offset");
    wbuf_free(&b);

    put_header(&b, 3, 0, 1);
    put_key(&b, "general.alignment", GGUF_VAL_U64), put_u64(&b, 64);
    expect_fail(&b, "align_type.gguf", BT_EFORMAT, "has type u64, expected u32");
    wbuf_free(&b);
}

static void test_bad_header(void **state)
{
    (void)state;
    wbuf b = {0};
    build(&b, 3, 0, four, 1, NULL);
    memcpy(b.p, "GGUG", 4);
    expect_fail(&b, "magic.gguf", BT_EFORMAT, "bad magic at offset 0");
    wbuf_free(&b);

    build(&b, 4, 0, four, 1, NULL);
    expect_fail(&b, "version.gguf", BT_EFORMAT, "unsupported GGUF version 4 at offset 4");
    wbuf_free(&b);
    build(&b, 1, 0, four, 1, NULL);
    expect_fail(&b, "version1.gguf", BT_EFORMAT, "unsupported GGUF version 1");
    wbuf_free(&b);
    build(&b, 0x03000000u, 0, four, 1, NULL);
    expect_fail(&b, "bigendian.gguf", BT_EFORMAT, "big-endian");
    wbuf_free(&b);

    put(&b, "GGUF\3\0\0", 7);
    expect_fail(&b, "short.gguf", BT_EFORMAT, "smaller than the 24-byte GGUF header");
    wbuf_free(&b);

    put_header(&b, 3, 0, UINT64_MAX);
    put_key(&b, "k", GGUF_VAL_U8), put_u8(&b, 1);
    expect_fail(&b, "kvcount.gguf", BT_EFORMAT, "kv count 18446744073709551615 at offset 16");
    wbuf_free(&b);
    put_header(&b, 3, 1ull << 60, 0);
    put_u64(&b, 0);
    expect_fail(&b, "tcount.gguf", BT_EFORMAT, "tensor count 1152921504606846976 at offset 8");
    wbuf_free(&b);

    char err[256];
    gguf_file *f = (gguf_file *)&f;
    assert_int_equal(gguf_open("/nonexistent/x.gguf", &f, err, sizeof(err)), BT_EIO);
    assert_null(f);
    assert_non_null(strstr(err, "/nonexistent/x.gguf"));
    assert_int_equal(gguf_open(tmpdir, &f, err, sizeof(err)), BT_EIO);
    assert_non_null(strstr(err, "not a regular file"));
    assert_int_equal(gguf_open(NULL, &f, NULL, 0), BT_EINVAL);
}

static void test_bad_kvs(void **state)
{
    (void)state;
    wbuf b = {0};
    /* Key length 10, but the file ends 6 bytes into the key. */
    put_header(&b, 3, 0, 1);
    put_u64(&b, 10);
    put(&b, "genera", 6);
    expect_fail(&b, "trunc_key.gguf", BT_EFORMAT,
                "key of kv 0 at offset 24: string of 10 bytes runs past the end of the file "
                "(38 bytes)");
    wbuf_free(&b);

    put_header(&b, 3, 0, 1);
    put_key(&b, "general.name", GGUF_VAL_STRING);
    put_u64(&b, 20);
    put(&b, "Smol", 4);
    expect_fail(&b, "trunc_val.gguf", BT_EFORMAT,
                "value of key 'general.name' at offset 48: string of 20 bytes runs past");
    wbuf_free(&b);

    put_header(&b, 3, 0, 1);
    put_key(&b, "general.name", GGUF_VAL_STRING);
    put_u64(&b, 1ull << 63);
    put(&b, "Smol", 4);
    expect_fail(&b, "strlen.gguf", BT_EFORMAT, "string of 9223372036854775808 bytes runs past");
    wbuf_free(&b);

    put_header(&b, 3, 0, 1);
    put_key(&b, "tokenizer.ggml.scores", GGUF_VAL_ARRAY), put_u32(&b, GGUF_VAL_U32);
    put_u64(&b, 1ull << 62);
    put_u32(&b, 1);
    expect_fail(&b, "arraycount.gguf", BT_EFORMAT,
                "value of key 'tokenizer.ggml.scores' at offset 57: array of 4611686018427387904 "
                "u32 elements runs past");
    wbuf_free(&b);

    put_header(&b, 3, 0, 1);
    put_key(&b, "tokenizer.ggml.tokens", GGUF_VAL_ARRAY), put_u32(&b, GGUF_VAL_STRING);
    put_u64(&b, 3);
    put_str(&b, "a"), put_str(&b, "b");
    put_u64(&b, 5);
    expect_fail(&b, "arraycount_str.gguf", BT_EFORMAT,
                "element 2 of value of key 'tokenizer.ggml.tokens' at offset");
    wbuf_free(&b);

    put_header(&b, 3, 0, 2);
    put_key(&b, "a.b", GGUF_VAL_U8), put_u8(&b, 1);
    put_key(&b, "a.b", GGUF_VAL_U8), put_u8(&b, 2);
    expect_fail(&b, "dup_key.gguf", BT_EFORMAT, "duplicate key 'a.b' at offset 40");
    wbuf_free(&b);

    put_header(&b, 3, 0, 1);
    put_key(&b, "nest", GGUF_VAL_ARRAY), put_u32(&b, GGUF_VAL_ARRAY), put_u64(&b, 1);
    put_u32(&b, GGUF_VAL_U8), put_u64(&b, 0);
    expect_fail(&b, "nested.gguf", BT_EFORMAT, "arrays of arrays are not supported");
    wbuf_free(&b);

    put_header(&b, 3, 0, 1);
    put_key(&b, "odd", 13), put_u64(&b, 0);
    expect_fail(&b, "val_type.gguf", BT_EFORMAT, "key 'odd': unknown value type 13 at offset 35");
    wbuf_free(&b);
}

static void test_bad_tensors(void **state)
{
    (void)state;
    wbuf b = {0};
    build(&b, 3, 0, four, 4, NULL);
    b.n -= 10;  /* the last tensor loses its last 10 bytes */
    expect_fail(&b, "past_end.gguf", BT_EFORMAT,
                "tensor 'blk.0.q4_1': data at offset");
    expect_fail(&b, "past_end.gguf", BT_EFORMAT, "+ 120 bytes runs past the end of the file");
    wbuf_free(&b);

    tspec two[2] = {four[0], four[1]};
    build(&b, 3, 0, two, 2, (uint64_t[]){0, 1ull << 40});
    expect_fail(&b, "offset_past.gguf", BT_EFORMAT,
                "tensor 'w.f16': data offset 1099511627776 (from the data section at");
    wbuf_free(&b);

    build(&b, 3, 0, two, 2, (uint64_t[]){0, 48});
    expect_fail(&b, "unaligned.gguf", BT_EFORMAT,
                "tensor 'w.f16': data offset 48 is not a multiple of the alignment 32");
    wbuf_free(&b);

    tspec row = {"blk.0.ffn_down.weight", GGUF_GGML_Q8_0, 2, {48, 2}};
    build(&b, 3, 0, &row, 1, NULL);
    expect_fail(&b, "row.gguf", BT_EFORMAT,
                "tensor 'blk.0.ffn_down.weight': a row of 48 elements is not a multiple of the "
                "q8_0 block of 32");
    wbuf_free(&b);

    tspec odd = {"blk.3.attn_k.weight", 99, 1, {32}};
    build(&b, 3, 0, &odd, 1, NULL);
    expect_fail(&b, "ggml_type.gguf", BT_EFORMAT,
                "tensor 'blk.3.attn_k.weight' at offset");
    expect_fail(&b, "ggml_type.gguf", BT_EFORMAT, "unknown ggml type 99");
    wbuf_free(&b);

    tspec five = {"t5", GGUF_GGML_F32, 5, {1, 1, 1, 1, 1}};
    build(&b, 3, 0, &five, 1, NULL);
    expect_fail(&b, "dims.gguf", BT_EFORMAT, "tensor 't5' at offset 34: 5 dims, at most 4");
    wbuf_free(&b);

    tspec huge = {"h", GGUF_GGML_F32, 2, {1ull << 62, 1ull << 62}};
    build(&b, 3, 0, &huge, 1, (uint64_t[]){0});
    expect_fail(&b, "dimbig.gguf", BT_EFORMAT, "overflow a byte count");
    wbuf_free(&b);
    huge.ne[0] = 1ull << 63;
    build(&b, 3, 0, &huge, 1, (uint64_t[]){0});
    expect_fail(&b, "dimbig.gguf", BT_EFORMAT, "more than ggml's int64 holds");
    wbuf_free(&b);

    tspec dup[3] = {four[0], four[1], four[0]};
    build(&b, 3, 0, dup, 3, NULL);
    expect_fail(&b, "dup_tensor.gguf", BT_EFORMAT,
                "duplicate tensor name 'w.f32' (tensors 0 and 2)");
    wbuf_free(&b);
}

/* Every proper prefix of a valid file is refused, cleanly. */
static void test_every_truncation(void **state)
{
    (void)state;
    wbuf b = {0};
    put_header(&b, 3, 2, 2);
    put_key(&b, "general.alignment", GGUF_VAL_U32), put_u32(&b, 16);
    put_key(&b, "toks", GGUF_VAL_ARRAY), put_u32(&b, GGUF_VAL_STRING), put_u64(&b, 2);
    put_str(&b, "x"), put_str(&b, "yz");
    put_str(&b, "a"), put_u32(&b, 1), put_u64(&b, 4), put_u32(&b, GGUF_GGML_F32), put_u64(&b, 0);
    put_str(&b, "b"), put_u32(&b, 1), put_u64(&b, 32), put_u32(&b, GGUF_GGML_Q8_0), put_u64(&b, 16);
    pad_to(&b, 16);
    for (int i = 0; i < 16 + 34; i++)
        put_u8(&b, (uint8_t)i);
    char path[PATH_MAX], err[512];
    for (size_t n = 0; n <= b.n; n++) {
        write_file("prefix.gguf", b.p, n, path, sizeof(path));
        gguf_file *f = NULL;
        int rc = gguf_open(path, &f, err, sizeof(err));
        if (n < b.n) {
            if (rc != BT_EFORMAT)
                fail_msg("prefix of %zu bytes: %d", n, rc);
            assert_true(strlen(err) > 0);
        } else {
            assert_int_equal(rc, 0);
            assert_int_equal(gguf_tensor_find(f, "b")->nbytes, 34);
        }
        gguf_close(f);
    }
    wbuf_free(&b);
}

static void corruption_kvs(wbuf *b)
{
    put_key(b, "toks", GGUF_VAL_ARRAY), put_u32(b, GGUF_VAL_STRING), put_u64(b, 3);
    put_str(b, "x"), put_str(b, "yz"), put_str(b, "");
    put_key(b, "name", GGUF_VAL_STRING), put_str(b, "tiny");
}

/* Random byte flips of a valid file: each is opened or refused, and what
 * opens stays inside the file. */
static void test_random_corruption(void **state)
{
    (void)state;
    wbuf b = {0};
    build_ex(&b, 3, 0, four, 4, NULL, 2, corruption_kvs);
    gguf_file *base = open_ok(&b, "mutant.gguf");
    size_t head = gguf_data_offset(base);  /* the metadata and tensor infos */
    gguf_close(base);
    unsigned seed = 4242;
    char path[PATH_MAX], err[512];
    uint8_t *m = malloc(b.n);
    int opened = 0;
    for (int trial = 0; trial < 3000; trial++) {
        memcpy(m, b.p, b.n);
        int flips = 1 + (int)(rand_r(&seed) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = rand_r(&seed) % b.n;
            /* Mostly the metadata, where lengths and counts live. */
            if (rand_r(&seed) % 4)
                at = 4 + rand_r(&seed) % (head - 4);
            m[at] = (uint8_t)(rand_r(&seed) % 3 ? rand_r(&seed) : 0xff);
        }
        write_file("mutant.gguf", m, b.n, path, sizeof(path));
        gguf_file *f = NULL;
        if (gguf_open(path, &f, err, sizeof(err)) != 0) {
            assert_null(f);
            continue;
        }
        opened++;
        for (size_t i = 0; i < gguf_tensor_count(f); i++) {
            const gguf_tensor *x = gguf_tensor_at(f, i);
            size_t room = b.n - gguf_data_offset(f);
            assert_true(gguf_data_offset(f) <= b.n);
            assert_true(x->offset <= room && x->nbytes <= room - x->offset);
            unsigned sum = 0;
            for (size_t k = 0; k < x->nbytes; k++)
                sum += ((const uint8_t *)x->data)[k];
            (void)sum;
        }
        for (size_t i = 0; i < gguf_kv_count(f); i++) {
            size_t len;
            const char *key = gguf_kv_key(f, i, &len);
            char k[128];
            if (len >= sizeof(k) || memchr(key, 0, len))
                continue;
            memcpy(k, key, len);
            k[len] = '\0';
            uint32_t et;
            uint64_t n;
            if (gguf_get_array(f, k, &et, &n) == 0 && et == GGUF_VAL_STRING) {
                for (uint64_t j = 0; j < n; j++) {
                    const char *s;
                    assert_int_equal(gguf_array_string(f, k, j, &s, &len), 0);
                    assert_true(len <= b.n);
                }
            }
        }
        gguf_close(f);
    }
    free(m);
    wbuf_free(&b);
    print_message("corruption: %d of 3000 mutants opened\n", opened);
}

static void test_real_model(void **state)
{
    (void)state;
    if (access(REAL_MODEL, R_OK) != 0)
        skip_without_model(REAL_MODEL);
    char err[512];
    gguf_file *f = NULL;
    int rc = gguf_open(REAL_MODEL, &f, err, sizeof(err));
    if (rc)
        fail_msg("%s: %s", bt_strerror(rc), err);
    const char *s;
    size_t len;
    uint32_t u;
    assert_int_equal(gguf_get_str(f, "general.architecture", &s, &len), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "llama", 5);
    struct { const char *key; uint32_t want; } ints[] = {
        {"llama.block_count", 30},
        {"llama.embedding_length", 576},
        {"llama.attention.head_count", 9},
        {"llama.attention.head_count_kv", 3},
        {"llama.feed_forward_length", 1536},
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        assert_int_equal(gguf_get_u32(f, ints[i].key, &u), 0);
        assert_int_equal(u, ints[i].want);
    }
    uint32_t et;
    uint64_t n;
    assert_int_equal(gguf_get_array(f, "tokenizer.ggml.tokens", &et, &n), 0);
    assert_int_equal(et, GGUF_VAL_STRING);
    assert_int_equal(n, 49152);
    assert_int_equal(gguf_array_string(f, "tokenizer.ggml.tokens", 1, &s, &len), 0);
    assert_int_equal(len, strlen("<|im_start|>"));
    assert_memory_equal(s, "<|im_start|>", len);
    for (uint64_t i = 0; i < n; i++)
        assert_int_equal(gguf_array_string(f, "tokenizer.ggml.tokens", i, &s, &len), 0);
    assert_int_equal(gguf_array_string(f, "tokenizer.ggml.tokens", n, &s, &len), BT_ERANGE);
    assert_int_equal(gguf_get_array(f, "tokenizer.ggml.merges", &et, &n), 0);
    assert_int_equal(et, GGUF_VAL_STRING);
    assert_int_equal(n, 48900);
    /* A merge is two tokens joined by one space. */
    assert_int_equal(gguf_array_string(f, "tokenizer.ggml.merges", 0, &s, &len), 0);
    assert_non_null(memchr(s, ' ', len));
    assert_int_equal(gguf_tensor_count(f), 272);

    struct { const char *name; uint32_t type; uint32_t n_dims; int64_t ne0, ne1; } ts[] = {
        {"token_embd.weight", GGUF_GGML_Q8_0, 2, 576, 49152},
        {"blk.0.ffn_down.weight", GGUF_GGML_Q4_1, 2, 1536, 576},
        {"blk.0.attn_norm.weight", GGUF_GGML_F32, 1, 576, 1},
    };
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
        const gguf_tensor *t = gguf_tensor_find(f, ts[i].name);
        if (!t)
            fail_msg("no tensor %s", ts[i].name);
        assert_int_equal(t->type, ts[i].type);
        assert_int_equal(t->n_dims, ts[i].n_dims);
        assert_int_equal(t->ne[0], ts[i].ne0);
        assert_int_equal(t->ne[1], ts[i].ne1);
        assert_int_equal(t->ne[2], 1);
        assert_int_equal(t->nbytes, (size_t)(ts[i].ne0 / (int64_t)gguf_type_block_elems(t->type)) *
                                        gguf_type_block_bytes(t->type) * (size_t)ts[i].ne1);
        assert_int_equal((uintptr_t)t->data % gguf_alignment(f), 0);
    }
    const gguf_tensor *norm = gguf_tensor_find(f, "blk.0.attn_norm.weight");
    float w0;
    memcpy(&w0, norm->data, 4);
    assert_true(w0 == w0 && w0 > -100.0f && w0 < 100.0f);  /* a plausible norm weight */
    gguf_close(f);
}

/* A file built in memory answers every reader as a file on disk would;
 * duplicates and tensors whose bytes do not fit their type are refused,
 * leaving the file as it was; the memory handed to it is released at
 * close (the ASan build checks that nothing leaks). */
static void test_built_file(void **state)
{
    (void)state;
    gguf_file *f = NULL;
    assert_int_equal(gguf_build_create(&f), 0);
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_alignment(f), GGUF_DEFAULT_ALIGNMENT);
    assert_int_equal(gguf_kv_count(f), 0);
    assert_int_equal(gguf_tensor_count(f), 0);
    assert_null(gguf_tensor_find(f, "x"));
    /* Keys added out of order are found by the sorted index. */
    assert_int_equal(gguf_build_u32(f, "z.count", 7), 0);
    assert_int_equal(gguf_build_f32(f, "a.eps", 1e-5f), 0);
    assert_int_equal(gguf_build_bool(f, "m.flag", true), 0);
    assert_int_equal(gguf_build_str(f, "general.architecture", "llama", 5), 0);
    assert_int_equal(gguf_build_str(f, "empty", NULL, 0), 0);
    static const int32_t ints[4] = {-1, 0, 3, INT32_MAX};
    assert_int_equal(gguf_build_i32_array(f, "ints", ints, 4), 0);
    const char *strs[3] = {"Hello", "", "wor\0ld"};
    size_t lens[3] = {5, 0, 6};
    assert_int_equal(gguf_build_str_array(f, "strs", strs, lens, 3), 0);
    assert_int_equal(gguf_build_u32(f, "z.count", 8), BT_EEXIST);
    assert_int_equal(gguf_build_str(f, "strs", "x", 1), BT_EEXIST);
    assert_int_equal(gguf_kv_count(f), 7);
    uint32_t u;
    int32_t i32;
    float x;
    bool b;
    const char *s;
    size_t n, idx;
    assert_int_equal(gguf_get_u32(f, "z.count", &u), 0);
    assert_int_equal(u, 7);
    assert_int_equal(gguf_get_i32(f, "z.count", &i32), 0);
    assert_int_equal(gguf_get_f32(f, "a.eps", &x), 0);
    assert_true(x == 1e-5f);
    assert_int_equal(gguf_get_u32(f, "a.eps", &u), BT_ETYPE);
    assert_int_equal(gguf_get_bool(f, "m.flag", &b), 0);
    assert_true(b);
    assert_int_equal(gguf_get_str(f, "general.architecture", &s, &n), 0);
    assert_true(n == 5 && !memcmp(s, "llama", 5));
    assert_int_equal(gguf_get_str(f, "empty", &s, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(gguf_get_u32(f, "missing", &u), BT_ENOENT);
    assert_int_equal(gguf_find_key(f, "m.flag", &idx), 0);
    assert_int_equal(gguf_kv_type(f, idx), GGUF_VAL_BOOL);
    assert_non_null(gguf_kv_key(f, idx, &n));
    assert_int_equal(n, 6);
    uint32_t et;
    uint64_t count;
    int64_t v;
    assert_int_equal(gguf_get_array(f, "ints", &et, &count), 0);
    assert_true(et == GGUF_VAL_I32 && count == 4);
    assert_int_equal(gguf_array_i64(f, "ints", 3, &v), 0);
    assert_int_equal(v, INT32_MAX);
    assert_int_equal(gguf_array_i64(f, "ints", 0, &v), 0);
    assert_int_equal(v, -1);
    assert_int_equal(gguf_array_i64(f, "ints", 4, &v), BT_ERANGE);
    const void *raw;
    assert_int_equal(gguf_array_data(f, "ints", &raw), 0);
    assert_memory_equal(raw, ints, sizeof(ints));
    assert_int_equal(gguf_get_array(f, "strs", &et, &count), 0);
    assert_true(et == GGUF_VAL_STRING && count == 3);
    for (uint64_t k = 0; k < 3; k++) {
        assert_int_equal(gguf_array_string(f, "strs", k, &s, &n), 0);
        assert_int_equal(n, lens[k]);
        assert_memory_equal(s, strs[k], n);
    }
    assert_int_equal(gguf_array_string(f, "strs", 3, &s, &n), BT_ERANGE);
    assert_int_equal(gguf_array_data(f, "strs", &raw), BT_ETYPE);
    /* Tensors: data the file owns (malloc'd and mapped) or not. */
    float *w = malloc(4 * 3 * sizeof(float));
    assert_non_null(w);
    for (int k = 0; k < 12; k++)
        w[k] = (float)k;
    assert_int_equal(gguf_build_own(f, w), 0);
    const int64_t ne[2] = {4, 3};
    assert_int_equal(gguf_build_tensor(f, "w.weight", GGUF_GGML_F32, 2, ne, w, 48), 0);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *m = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(gguf_build_own_map(f, m, page), 0);
    const int64_t nq[1] = {64};
    assert_int_equal(gguf_build_tensor(f, "a.q", GGUF_GGML_Q4_1, 1, nq, m, 40), 0);
    static const uint16_t h[2] = {0x3c00, 0x4000};
    const int64_t n2[1] = {2};
    assert_int_equal(gguf_build_tensor(f, "h", GGUF_GGML_F16, 1, n2, h, 4), 0);
    /* Refused: a name twice, bytes that do not fit, a row not of whole
     * blocks, an unknown type, too many dims. */
    assert_int_equal(gguf_build_tensor(f, "h", GGUF_GGML_F16, 1, n2, h, 4), BT_EEXIST);
    assert_int_equal(gguf_build_tensor(f, "h2", GGUF_GGML_F16, 1, n2, h, 2), BT_EINVAL);
    const int64_t n33[1] = {33};
    assert_int_equal(gguf_build_tensor(f, "q2", GGUF_GGML_Q4_1, 1, n33, m, 40), BT_EINVAL);
    assert_int_equal(gguf_build_tensor(f, "u", 4, 1, n2, h, 4), BT_EINVAL);
    const int64_t n5[5] = {1, 1, 1, 1, 1};
    assert_int_equal(gguf_build_tensor(f, "d5", GGUF_GGML_F32, 5, n5, w, 4), BT_EINVAL);
    assert_int_equal(gguf_tensor_count(f), 3);
    const gguf_tensor *t = gguf_tensor_find(f, "w.weight");
    assert_non_null(t);
    assert_true(t->type == GGUF_GGML_F32 && t->n_dims == 2 && t->ne[0] == 4 && t->ne[1] == 3 &&
                t->ne[2] == 1 && t->ne[3] == 1 && t->nbytes == 48 && t->data == w);
    assert_string_equal(t->name, "w.weight");
    assert_int_equal(t->name_len, 8);
    assert_ptr_equal(gguf_tensor_at(f, 0), t);  /* file order: the order added */
    assert_string_equal(gguf_tensor_at(f, 1)->name, "a.q");
    assert_null(gguf_tensor_at(f, 3));
    assert_ptr_equal(gguf_tensor_find(f, "a.q")->data, m);
    assert_null(gguf_tensor_find(f, "h2"));
    gguf_close(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_arrays),
        cmocka_unit_test(test_tensors),
        cmocka_unit_test(test_custom_alignment),
        cmocka_unit_test(test_bad_header),
        cmocka_unit_test(test_bad_kvs),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_real_model),
        cmocka_unit_test(test_built_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
