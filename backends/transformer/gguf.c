/* GGUF parsing (backends/transformer/gguf.h).  One pass over the mapped file with a
 * cursor that never moves past the end: every fixed-size read first checks
 * the bytes left, and every length or count read from the file is compared
 * with the bytes left before it is used, either as a skip or to size an
 * allocation.  Counts are bounded by the smallest encoding of one item, so
 * no allocation can exceed a small multiple of the file size.
 *
 * Keys and tensor names are looked up by binary search over indices sorted
 * at open; the sort also finds duplicates, which a linear check would do in
 * time quadratic in a hostile count. */
#include "backends/transformer/gguf.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/mapfile.h"
#include "common/vec.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads the file's little-endian fields with memcpy; port it first"
#endif

#define HEADER_BYTES 24     /* magic, version u32, tensor count u64, kv count u64 */
#define MIN_KV_BYTES 13     /* key length u64, empty key, type u32, a one-byte value */
#define MIN_TENSOR_BYTES 24 /* name length u64, empty name, n_dims u32 0, type u32, offset u64 */
#define SHOWN 64            /* bytes of a key or name quoted in a message */
#define NO_INDEX UINT64_MAX /* rd_str: the string is not an array element */

typedef struct gguf_kv {
    const char *key;       /* into the mapping; not NUL-terminated */
    size_t key_len;        /* bytes */
    uint32_t type;         /* GGUF_VAL_* */
    uint32_t elem_type;    /* arrays: GGUF_VAL_* of the elements; else TYPE */
    uint64_t count;        /* arrays: elements; else 1 */
    const uint8_t *val;    /* into the mapping: the value; a string's length prefix;
                            * an array's first element */
    uint64_t *str_off;     /* string arrays: bytes from VAL to each element's length
                            * prefix; owned */
} gguf_kv;

struct gguf_file {
    const uint8_t *map;     /* the read-only mapping of SIZE bytes; owned */
    size_t size;            /* bytes */
    uint32_t version;
    size_t alignment;       /* bytes, a power of two */
    size_t data_off;        /* bytes from the file start to the data section */
    gguf_kv *kvs;           /* owned; N_KV of them, in file order */
    size_t n_kv;
    size_t *kv_sorted;      /* owned; kv indices ordered by key */
    gguf_tensor *tensors;   /* owned; N_TENSORS of them, in file order */
    size_t n_tensors;
    size_t *tensor_sorted;  /* owned; tensor indices ordered by name */
    char *names;            /* owned; the tensors' NUL-terminated names back to back */
    /* A file built in memory (gguf_build_create) has no MAP: its keys,
     * values and names are in blocks of its own, and it may own the memory
     * of its tensors.  All are released at close. */
    size_t cap_kv;          /* slots allocated in kvs and kv_sorted */
    size_t cap_tensors;     /* slots allocated in tensors and tensor_sorted */
    void **owned;           /* malloc'd blocks, freed at close */
    size_t n_owned, cap_owned;
    struct gguf_region {    /* mappings, unmapped at close */
        void *p;
        size_t n;
    } *maps;
    size_t n_maps, cap_maps;
};

/* A cursor over the mapping while parsing; POS <= SIZE at all times. */
typedef struct parser {
    const uint8_t *map;
    size_t size;            /* bytes */
    size_t pos;             /* bytes from the file start */
    char *err;              /* the caller's message buffer; may be NULL */
    size_t errlen;          /* bytes */
} parser;

typedef struct type_info {
    const char *name;
    uint32_t blck;          /* elements per block */
    uint32_t bytes;         /* bytes per block */
} type_info;

/* Block layouts as in ggml-common.h: the K-quants hold 256 elements per
 * super-block, the older quants 32; d and m scales are f16 except Q8_K's
 * f32 d (which is why it is 292 = 4 + 256 + 16 * 2 bytes). */
static const type_info ggml_types[] = {
    [GGUF_GGML_F32] = {"f32", 1, 4},
    [GGUF_GGML_F16] = {"f16", 1, 2},
    [GGUF_GGML_Q4_0] = {"q4_0", 32, 18},
    [GGUF_GGML_Q4_1] = {"q4_1", 32, 20},
    [GGUF_GGML_Q5_0] = {"q5_0", 32, 22},
    [GGUF_GGML_Q5_1] = {"q5_1", 32, 24},
    [GGUF_GGML_Q8_0] = {"q8_0", 32, 34},
    [GGUF_GGML_Q8_1] = {"q8_1", 32, 36},
    [GGUF_GGML_Q2_K] = {"q2_K", 256, 84},
    [GGUF_GGML_Q3_K] = {"q3_K", 256, 110},
    [GGUF_GGML_Q4_K] = {"q4_K", 256, 144},
    [GGUF_GGML_Q5_K] = {"q5_K", 256, 176},
    [GGUF_GGML_Q6_K] = {"q6_K", 256, 210},
    [GGUF_GGML_Q8_K] = {"q8_K", 256, 292},
    [GGUF_GGML_I8] = {"i8", 1, 1},
    [GGUF_GGML_I16] = {"i16", 1, 2},
    [GGUF_GGML_I32] = {"i32", 1, 4},
    [GGUF_GGML_I64] = {"i64", 1, 8},
    [GGUF_GGML_F64] = {"f64", 1, 8},
    [GGUF_GGML_BF16] = {"bf16", 1, 2},
};

static const char *const val_names[] = {"u8",  "i8",   "u16",    "i16",   "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
static const uint8_t val_bytes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};  /* 0: variable */

static const type_info *ggml_type(uint32_t t)
{
    if (t >= sizeof(ggml_types) / sizeof(ggml_types[0]) || !ggml_types[t].name)
        return NULL;
    return &ggml_types[t];
}

const char *gguf_type_name(uint32_t ggml_type_id)
{
    const type_info *ti = ggml_type(ggml_type_id);
    return ti ? ti->name : "?";
}

size_t gguf_type_block_elems(uint32_t ggml_type_id)
{
    const type_info *ti = ggml_type(ggml_type_id);
    return ti ? ti->blck : 0;
}

size_t gguf_type_block_bytes(uint32_t ggml_type_id)
{
    const type_info *ti = ggml_type(ggml_type_id);
    return ti ? ti->bytes : 0;
}

const char *gguf_value_type_name(uint32_t type)
{
    return type <= GGUF_VAL_F64 ? val_names[type] : "?";
}

/* The length of a key or name as quoted in messages. */
static int shown(size_t len)
{
    return len > SHOWN ? SHOWN : (int)len;
}

/* Fails unless N bytes are left at the cursor. */
static int need(parser *p, size_t n, const char *what)
{
    if (p->size - p->pos >= n)
        return 0;
    return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                     "truncated: %s at offset %zu needs %zu bytes, the file ends at %zu", what,
                     p->pos, n, p->size);
}

static int rd_u32(parser *p, uint32_t *v, const char *what)
{
    int rc = need(p, 4, what);
    if (rc)
        return rc;
    memcpy(v, p->map + p->pos, 4);
    p->pos += 4;
    return 0;
}

static int rd_u64(parser *p, uint64_t *v, const char *what)
{
    int rc = need(p, 8, what);
    if (rc)
        return rc;
    memcpy(v, p->map + p->pos, 8);
    p->pos += 8;
    return 0;
}

/* A string (u64 length, then the bytes) described by WHAT, or by element
 * IDX of WHAT unless IDX is NO_INDEX; formats only on failure, because the
 * tokenizer's arrays hold ~100k strings. */
static int rd_str(parser *p, const char **s, size_t *len, const char *what, uint64_t idx)
{
    size_t at = p->pos;
    char el[48] = "";
    if (p->size - p->pos < 8) {
        if (idx != NO_INDEX)
            snprintf(el, sizeof(el), "element %" PRIu64 " of ", idx);
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "truncated: string length of %s%s at offset %zu, the file ends at %zu",
                         el, what, at, p->size);
    }
    uint64_t n;
    memcpy(&n, p->map + p->pos, 8);
    p->pos += 8;
    if (n > p->size - p->pos) {
        if (idx != NO_INDEX)
            snprintf(el, sizeof(el), "element %" PRIu64 " of ", idx);
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "%s%s at offset %zu: string of %" PRIu64
                         " bytes runs past the end of the file (%zu bytes)",
                         el, what, at, n, p->size);
    }
    *s = (const char *)p->map + p->pos;
    *len = (size_t)n;
    p->pos += (size_t)n;
    return 0;
}

/* An array value: element type, count, then the elements, which are
 * skipped (numbers) or walked and indexed (strings). */
static int parse_array(parser *p, gguf_kv *kv, const char *what)
{
    size_t at = p->pos;
    int rc = rd_u32(p, &kv->elem_type, what);
    if (rc)
        return rc;
    if (kv->elem_type == GGUF_VAL_ARRAY)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "%s at offset %zu: arrays of arrays are not supported", what, at);
    if (kv->elem_type > GGUF_VAL_F64)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "%s at offset %zu: unknown array element type %" PRIu32, what, at,
                         kv->elem_type);
    if ((rc = rd_u64(p, &kv->count, what)))
        return rc;
    kv->val = p->map + p->pos;
    size_t left = p->size - p->pos;
    /* A string takes at least its 8-byte length, so the count bound also
     * bounds the index allocated below by the file size. */
    size_t min_bytes = kv->elem_type == GGUF_VAL_STRING ? 8 : val_bytes[kv->elem_type];
    if (kv->count > left / min_bytes)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "%s at offset %zu: array of %" PRIu64
                         " %s elements runs past the end of the file (%zu bytes)",
                         what, at, kv->count, val_names[kv->elem_type], p->size);
    if (kv->elem_type != GGUF_VAL_STRING) {
        p->pos += (size_t)kv->count * min_bytes;
        return 0;
    }
    kv->str_off = malloc((kv->count ? (size_t)kv->count : 1) * sizeof(uint64_t));
    if (!kv->str_off)
        return bt_errorf(p->err, p->errlen, BT_ENOMEM,
                         "%s: out of memory indexing %" PRIu64 " strings", what, kv->count);
    for (uint64_t i = 0; i < kv->count; i++) {
        const char *s;
        size_t n;
        kv->str_off[i] = (uint64_t)(p->map + p->pos - kv->val);
        if ((rc = rd_str(p, &s, &n, what, i)))
            return rc;
    }
    return 0;
}

static int parse_value(parser *p, gguf_kv *kv, const char *what)
{
    kv->elem_type = kv->type;
    kv->count = 1;
    kv->val = p->map + p->pos;
    if (kv->type == GGUF_VAL_ARRAY)
        return parse_array(p, kv, what);
    if (kv->type == GGUF_VAL_STRING) {
        const char *s;
        size_t n;
        return rd_str(p, &s, &n, what, NO_INDEX);
    }
    int rc = need(p, val_bytes[kv->type], what);
    if (rc)
        return rc;
    p->pos += val_bytes[kv->type];
    return 0;
}

static int cmp_bytes(const char *a, size_t an, const char *b, size_t bn)
{
    int c = memcmp(a, b, an < bn ? an : bn);
    if (c)
        return c;
    return an < bn ? -1 : an > bn;
}

static int by_key(const void *pa, const void *pb, void *ctx)
{
    const gguf_kv *kvs = ctx;
    const gguf_kv *a = &kvs[*(const size_t *)pa], *b = &kvs[*(const size_t *)pb];
    return cmp_bytes(a->key, a->key_len, b->key, b->key_len);
}

static int by_name(const void *pa, const void *pb, void *ctx)
{
    const gguf_tensor *ts = ctx;
    return strcmp(ts[*(const size_t *)pa].name, ts[*(const size_t *)pb].name);
}

static const gguf_kv *kv_find(const gguf_file *f, const char *key)
{
    size_t n = strlen(key), lo = 0, hi = f->n_kv;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const gguf_kv *kv = &f->kvs[f->kv_sorted[mid]];
        int c = cmp_bytes(kv->key, kv->key_len, key, n);
        if (c == 0)
            return kv;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int parse_kvs(gguf_file *f, parser *p, uint64_t n_kv)
{
    char what[SHOWN + 64];
    if (n_kv > (p->size - p->pos) / MIN_KV_BYTES)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "kv count %" PRIu64 " at offset 16 is more than a file of %zu bytes holds",
                         n_kv, p->size);
    size_t n = (size_t)n_kv;
    f->kvs = calloc(n ? n : 1, sizeof(gguf_kv));
    f->kv_sorted = malloc((n ? n : 1) * sizeof(size_t));
    if (!f->kvs || !f->kv_sorted)
        return bt_errorf(p->err, p->errlen, BT_ENOMEM, "out of memory for %zu kvs", n);
    f->n_kv = n;
    for (size_t i = 0; i < n; i++) {
        gguf_kv *kv = &f->kvs[i];
        snprintf(what, sizeof(what), "key of kv %zu", i);
        int rc = rd_str(p, &kv->key, &kv->key_len, what, NO_INDEX);
        if (rc)
            return rc;
        snprintf(what, sizeof(what), "type of key '%.*s'", shown(kv->key_len), kv->key);
        size_t at = p->pos;
        if ((rc = rd_u32(p, &kv->type, what)))
            return rc;
        if (kv->type > GGUF_VAL_F64)
            return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                             "key '%.*s': unknown value type %" PRIu32 " at offset %zu",
                             shown(kv->key_len), kv->key, kv->type, at);
        snprintf(what, sizeof(what), "value of key '%.*s'", shown(kv->key_len), kv->key);
        if ((rc = parse_value(p, kv, what)))
            return rc;
    }
    for (size_t i = 0; i < n; i++)
        f->kv_sorted[i] = i;
    qsort_r(f->kv_sorted, n, sizeof(size_t), by_key, f->kvs);
    for (size_t i = 1; i < n; i++) {
        const gguf_kv *a = &f->kvs[f->kv_sorted[i - 1]], *b = &f->kvs[f->kv_sorted[i]];
        if (cmp_bytes(a->key, a->key_len, b->key, b->key_len) == 0) {
            const gguf_kv *later = a < b ? b : a;
            return bt_errorf(p->err, p->errlen, BT_EFORMAT, "duplicate key '%.*s' at offset %zu",
                             shown(later->key_len), later->key,
                             (size_t)((const uint8_t *)later->key - p->map) - 8);
        }
    }
    return 0;
}

/* general.alignment: a u32 power of two (as the reference reader
 * requires), else the default. */
static int parse_alignment(gguf_file *f, parser *p)
{
    const gguf_kv *kv = kv_find(f, "general.alignment");
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!kv)
        return 0;
    size_t at = (size_t)(kv->val - p->map);
    if (kv->type != GGUF_VAL_U32)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "general.alignment at offset %zu has type %s, expected u32", at,
                         val_names[kv->type]);
    uint32_t a;
    memcpy(&a, kv->val, 4);
    if (a == 0 || (a & (a - 1)))
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "general.alignment %" PRIu32 " at offset %zu is not a power of two", a,
                         at);
    f->alignment = a;
    return 0;
}

/* One tensor info; sets T->name to the name in the mapping (not yet
 * terminated) for parse_tensors to copy. */
static int parse_tensor_info(parser *p, gguf_tensor *t, size_t i)
{
    char what[SHOWN + 64];
    snprintf(what, sizeof(what), "name of tensor %zu", i);
    size_t at = p->pos;
    int rc = rd_str(p, &t->name, &t->name_len, what, NO_INDEX);
    if (rc)
        return rc;
    int nl = shown(t->name_len);
    if (memchr(t->name, 0, t->name_len))
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "tensor %zu at offset %zu: the name holds a NUL byte", i, at);
    snprintf(what, sizeof(what), "info of tensor '%.*s'", nl, t->name);
    at = p->pos;
    if ((rc = rd_u32(p, &t->n_dims, what)))
        return rc;
    if (t->n_dims > GGUF_MAX_DIMS)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "tensor '%.*s' at offset %zu: %" PRIu32 " dims, at most %d are supported",
                         nl, t->name, at, t->n_dims, GGUF_MAX_DIMS);
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v;
        at = p->pos;
        if ((rc = rd_u64(p, &v, what)))
            return rc;
        if (v > INT64_MAX)
            return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                             "tensor '%.*s' at offset %zu: dim %" PRIu32 " of %" PRIu64
                             " elements is more than ggml's int64 holds",
                             nl, t->name, at, d, v);
        t->ne[d] = (int64_t)v;
    }
    at = p->pos;
    if ((rc = rd_u32(p, &t->type, what)))
        return rc;
    const type_info *ti = ggml_type(t->type);
    if (!ti)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "tensor '%.*s' at offset %zu: unknown ggml type %" PRIu32, nl, t->name, at,
                         t->type);
    if ((rc = rd_u64(p, &t->offset, what)))
        return rc;
    if (t->ne[0] % ti->blck)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "tensor '%.*s': a row of %" PRId64
                         " elements is not a multiple of the %s block of %" PRIu32,
                         nl, t->name, t->ne[0], ti->name, ti->blck);
    size_t bytes;
    bool over = __builtin_mul_overflow((uint64_t)t->ne[0] / ti->blck, ti->bytes, &bytes);
    for (int d = 1; d < GGUF_MAX_DIMS; d++)
        over |= __builtin_mul_overflow(bytes, (uint64_t)t->ne[d], &bytes);
    if (over)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "tensor '%.*s': %" PRId64 " x %" PRId64 " x %" PRId64 " x %" PRId64
                         " %s elements overflow a byte count",
                         nl, t->name, t->ne[0], t->ne[1], t->ne[2], t->ne[3], ti->name);
    t->nbytes = bytes;
    return 0;
}

/* Checks T's data lies, aligned, inside the data section. */
static int check_tensor_data(const gguf_file *f, parser *p, gguf_tensor *t)
{
    if (t->offset % f->alignment)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "tensor '%s': data offset %" PRIu64
                         " is not a multiple of the alignment %zu",
                         t->name, t->offset, f->alignment);
    if (f->data_off > f->size)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "tensor '%s': the data section at offset %zu starts past the end of the "
                         "file (%zu bytes)",
                         t->name, f->data_off, f->size);
    size_t room = f->size - f->data_off;
    if (t->offset > room)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "tensor '%s': data offset %" PRIu64 " (from the data section at %zu) is "
                         "past the end of the file (%zu bytes)",
                         t->name, t->offset, f->data_off, f->size);
    if (t->nbytes > room - t->offset)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "tensor '%s': data at offset %zu + %zu bytes runs past the end of the "
                         "file (%zu bytes)",
                         t->name, f->data_off + (size_t)t->offset, t->nbytes, f->size);
    t->data = f->map + f->data_off + t->offset;
    return 0;
}

static int parse_tensors(gguf_file *f, parser *p, uint64_t n_tensors)
{
    if (n_tensors > (p->size - p->pos) / MIN_TENSOR_BYTES)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "tensor count %" PRIu64
                         " at offset 8 is more than a file of %zu bytes holds",
                         n_tensors, p->size);
    size_t n = (size_t)n_tensors, names_bytes = 0;
    f->tensors = calloc(n ? n : 1, sizeof(gguf_tensor));
    f->tensor_sorted = malloc((n ? n : 1) * sizeof(size_t));
    if (!f->tensors || !f->tensor_sorted)
        return bt_errorf(p->err, p->errlen, BT_ENOMEM, "out of memory for %zu tensors", n);
    f->n_tensors = n;
    int rc;
    for (size_t i = 0; i < n; i++) {
        if ((rc = parse_tensor_info(p, &f->tensors[i], i)))
            return rc;
        names_bytes += f->tensors[i].name_len + 1;  /* names lie in the file: no overflow */
    }
    /* The data section starts at the next multiple of the alignment. */
    f->data_off = (p->pos + f->alignment - 1) & ~(f->alignment - 1);
    f->names = malloc(names_bytes ? names_bytes : 1);
    if (!f->names)
        return bt_errorf(p->err, p->errlen, BT_ENOMEM, "out of memory for tensor names");
    char *dst = f->names;
    for (size_t i = 0; i < n; i++) {
        gguf_tensor *t = &f->tensors[i];
        memcpy(dst, t->name, t->name_len);
        dst[t->name_len] = '\0';
        t->name = dst;
        dst += t->name_len + 1;
        if ((rc = check_tensor_data(f, p, t)))
            return rc;
        f->tensor_sorted[i] = i;
    }
    qsort_r(f->tensor_sorted, n, sizeof(size_t), by_name, f->tensors);
    for (size_t i = 1; i < n; i++) {
        const gguf_tensor *a = &f->tensors[f->tensor_sorted[i - 1]];
        const gguf_tensor *b = &f->tensors[f->tensor_sorted[i]];
        if (strcmp(a->name, b->name) == 0)
            return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                             "duplicate tensor name '%s' (tensors %zu and %zu)", a->name,
                             (size_t)(a < b ? a - f->tensors : b - f->tensors),
                             (size_t)(a < b ? b - f->tensors : a - f->tensors));
    }
    return 0;
}

static int parse(gguf_file *f, parser *p)
{
    const uint8_t *m = p->map;
    if (memcmp(m, "GGUF", 4))
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "bad magic at offset 0: %02x %02x %02x %02x, expected \"GGUF\"", m[0],
                         m[1], m[2], m[3]);
    p->pos = 4;
    uint64_t n_tensors, n_kv;
    int rc = rd_u32(p, &f->version, "version");
    if (rc || (rc = rd_u64(p, &n_tensors, "tensor count")) || (rc = rd_u64(p, &n_kv, "kv count")))
        return rc;
    if (f->version == 0x02000000u || f->version == 0x03000000u)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "version at offset 4 reads as a big-endian file, which is not supported");
    if (f->version != 2 && f->version != 3)
        return bt_errorf(p->err, p->errlen, BT_EFORMAT,
                         "unsupported GGUF version %" PRIu32 " at offset 4 (2 and 3 are supported)",
                         f->version);
    if ((rc = parse_kvs(f, p, n_kv)) || (rc = parse_alignment(f, p)))
        return rc;
    return parse_tensors(f, p, n_tensors);
}

int gguf_open(const char *path, gguf_file **out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!out || !path)
        return bt_errorf(err, errlen, BT_EINVAL, "gguf_open: NULL %s", out ? "path" : "out");
    *out = NULL;
    int rc;
    gguf_file *f = calloc(1, sizeof(*f));
    if (!f) {
        rc = bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
        goto err;
    }
    /* The mapping keeps its own reference to the file, so no fd is held
     * for the life of the model (nor inherited by a forked worker). */
    void *m;
    if ((rc = bt_mapfile_map(path, NULL, &m, &f->size, err, errlen)))
        goto err;
    f->map = m;
    if (f->size < HEADER_BYTES) {
        rc = bt_errorf(err, errlen, BT_EFORMAT,
                       "file is %zu bytes, smaller than the %d-byte GGUF header", f->size,
                       HEADER_BYTES);
        goto err;
    }
    parser p = {f->map, f->size, 0, err, errlen};
    if ((rc = parse(f, &p)))
        goto err;
    *out = f;
    return 0;
err:
    gguf_close(f);
    return rc;
}

void gguf_close(gguf_file *f)
{
    if (!f)
        return;
    free(f->names);
    free(f->tensor_sorted);
    free(f->tensors);
    for (size_t i = 0; i < f->n_kv; i++)
        free(f->kvs[i].str_off);
    free(f->kv_sorted);
    free(f->kvs);
    bt_mapfile_unmap((void *)f->map, f->size);
    for (size_t i = 0; i < f->n_owned; i++)
        free(f->owned[i]);
    free(f->owned);
    for (size_t i = 0; i < f->n_maps; i++)
        munmap(f->maps[i].p, f->maps[i].n);
    free(f->maps);
    free(f);
}

uint32_t gguf_version(const gguf_file *f)
{
    return f->version;
}

size_t gguf_alignment(const gguf_file *f)
{
    return f->alignment;
}

size_t gguf_data_offset(const gguf_file *f)
{
    return f->data_off;
}

size_t gguf_kv_count(const gguf_file *f)
{
    return f->n_kv;
}

const char *gguf_kv_key(const gguf_file *f, size_t i, size_t *len)
{
    if (i >= f->n_kv)
        return NULL;
    if (len)
        *len = f->kvs[i].key_len;
    return f->kvs[i].key;
}

uint32_t gguf_kv_type(const gguf_file *f, size_t i)
{
    return i < f->n_kv ? f->kvs[i].type : UINT32_MAX;
}

/* The kv of KEY: 0, BT_EINVAL or BT_ENOENT. */
static int lookup(const gguf_file *f, const char *key, const gguf_kv **out)
{
    if (!f || !key)
        return BT_EINVAL;
    *out = kv_find(f, key);
    return *out ? 0 : BT_ENOENT;
}

int gguf_find_key(const gguf_file *f, const char *key, size_t *index)
{
    const gguf_kv *kv;
    int rc = lookup(f, key, &kv);
    if (rc)
        return rc;
    if (index)
        *index = (size_t)(kv - f->kvs);
    return 0;
}

/* An integer as its sign and magnitude in 64 bits: S when NEG, else U. */
typedef struct wide_int {
    bool neg;
    int64_t s;
    uint64_t u;
} wide_int;

/* Loads the integer of value type TYPE at P; BT_ETYPE for other types. */
static int load_int(uint32_t type, const uint8_t *p, wide_int *w)
{
    int64_t s;
    switch (type) {
    case GGUF_VAL_U8: { uint8_t v; memcpy(&v, p, 1); *w = (wide_int){false, 0, v}; return 0; }
    case GGUF_VAL_U16: { uint16_t v; memcpy(&v, p, 2); *w = (wide_int){false, 0, v}; return 0; }
    case GGUF_VAL_U32: { uint32_t v; memcpy(&v, p, 4); *w = (wide_int){false, 0, v}; return 0; }
    case GGUF_VAL_U64: { uint64_t v; memcpy(&v, p, 8); *w = (wide_int){false, 0, v}; return 0; }
    case GGUF_VAL_I8: { int8_t v; memcpy(&v, p, 1); s = v; break; }
    case GGUF_VAL_I16: { int16_t v; memcpy(&v, p, 2); s = v; break; }
    case GGUF_VAL_I32: { int32_t v; memcpy(&v, p, 4); s = v; break; }
    case GGUF_VAL_I64: { memcpy(&s, p, 8); break; }
    default: return BT_ETYPE;
    }
    *w = s < 0 ? (wide_int){true, s, 0} : (wide_int){false, 0, (uint64_t)s};
    return 0;
}

static int wide_to_signed(wide_int w, int64_t lo, int64_t hi, int64_t *out)
{
    if (w.neg ? w.s < lo : w.u > (uint64_t)hi)
        return BT_ERANGE;
    *out = w.neg ? w.s : (int64_t)w.u;
    return 0;
}

static int wide_to_unsigned(wide_int w, uint64_t hi, uint64_t *out)
{
    if (w.neg || w.u > hi)
        return BT_ERANGE;
    *out = w.u;
    return 0;
}

/* Loads the float of value type TYPE at P: an f32, or an f64 that
 * converts exactly (NaN and infinities included). */
static int load_f32(uint32_t type, const uint8_t *p, float *out)
{
    if (type == GGUF_VAL_F32) {
        memcpy(out, p, 4);
        return 0;
    }
    if (type != GGUF_VAL_F64)
        return BT_ETYPE;
    double d;
    memcpy(&d, p, 8);
    /* A finite double beyond FLT_MAX does not convert (undefined in C). */
    if (isfinite(d) && fabs(d) > FLT_MAX)
        return BT_ERANGE;
    float v = (float)d;
    if (!isnan(d) && (double)v != d)
        return BT_ERANGE;
    *out = v;
    return 0;
}

/* The scalar under KEY, as a wide integer. */
static int get_int(const gguf_file *f, const char *key, wide_int *w)
{
    const gguf_kv *kv;
    int rc = lookup(f, key, &kv);
    return rc ? rc : load_int(kv->type, kv->val, w);
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out)
{
    wide_int w;
    uint64_t v;
    int rc = get_int(f, key, &w);
    if (rc || (rc = wide_to_unsigned(w, UINT32_MAX, &v)))
        return rc;
    *out = (uint32_t)v;
    return 0;
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out)
{
    wide_int w;
    int rc = get_int(f, key, &w);
    return rc ? rc : wide_to_unsigned(w, UINT64_MAX, out);
}

int gguf_get_i32(const gguf_file *f, const char *key, int32_t *out)
{
    wide_int w;
    int64_t v;
    int rc = get_int(f, key, &w);
    if (rc || (rc = wide_to_signed(w, INT32_MIN, INT32_MAX, &v)))
        return rc;
    *out = (int32_t)v;
    return 0;
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out)
{
    wide_int w;
    int rc = get_int(f, key, &w);
    return rc ? rc : wide_to_signed(w, INT64_MIN, INT64_MAX, out);
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out)
{
    const gguf_kv *kv;
    int rc = lookup(f, key, &kv);
    return rc ? rc : load_f32(kv->type, kv->val, out);
}

int gguf_get_bool(const gguf_file *f, const char *key, bool *out)
{
    const gguf_kv *kv;
    int rc = lookup(f, key, &kv);
    if (rc)
        return rc;
    if (kv->type != GGUF_VAL_BOOL)
        return BT_ETYPE;
    *out = kv->val[0] != 0;  /* any nonzero byte, as the reference reader */
    return 0;
}

/* The string whose u64 length prefix is at P (checked at open). */
static void load_str(const uint8_t *p, const char **s, size_t *len)
{
    uint64_t n;
    memcpy(&n, p, 8);
    *s = (const char *)p + 8;
    *len = (size_t)n;
}

int gguf_get_str(const gguf_file *f, const char *key, const char **s, size_t *len)
{
    const gguf_kv *kv;
    int rc = lookup(f, key, &kv);
    if (rc)
        return rc;
    if (kv->type != GGUF_VAL_STRING)
        return BT_ETYPE;
    load_str(kv->val, s, len);
    return 0;
}

static int find_array(const gguf_file *f, const char *key, const gguf_kv **out)
{
    int rc = lookup(f, key, out);
    if (rc)
        return rc;
    return (*out)->type == GGUF_VAL_ARRAY ? 0 : BT_ETYPE;
}

int gguf_get_array(const gguf_file *f, const char *key, uint32_t *elem_type, uint64_t *count)
{
    const gguf_kv *kv;
    int rc = find_array(f, key, &kv);
    if (rc)
        return rc;
    if (elem_type)
        *elem_type = kv->elem_type;
    if (count)
        *count = kv->count;
    return 0;
}

int gguf_array_data(const gguf_file *f, const char *key, const void **data)
{
    const gguf_kv *kv;
    int rc = find_array(f, key, &kv);
    if (rc)
        return rc;
    if (kv->elem_type == GGUF_VAL_STRING)
        return BT_ETYPE;
    *data = kv->val;
    return 0;
}

int gguf_array_string(const gguf_file *f, const char *key, uint64_t i, const char **s,
                      size_t *len)
{
    const gguf_kv *kv;
    int rc = find_array(f, key, &kv);
    if (rc)
        return rc;
    if (kv->elem_type != GGUF_VAL_STRING)
        return BT_ETYPE;
    if (i >= kv->count)
        return BT_ERANGE;
    load_str(kv->val + kv->str_off[i], s, len);
    return 0;
}

int gguf_array_i64(const gguf_file *f, const char *key, uint64_t i, int64_t *out)
{
    const gguf_kv *kv;
    int rc = find_array(f, key, &kv);
    if (rc)
        return rc;
    uint32_t t = kv->elem_type;
    if (t == GGUF_VAL_STRING || t == GGUF_VAL_F32 || t == GGUF_VAL_F64)
        return BT_ETYPE;
    if (i >= kv->count)
        return BT_ERANGE;
    const uint8_t *p = kv->val + (size_t)i * val_bytes[t];
    if (t == GGUF_VAL_BOOL) {
        *out = p[0] != 0;
        return 0;
    }
    wide_int w;
    if ((rc = load_int(t, p, &w)))
        return rc;
    return wide_to_signed(w, INT64_MIN, INT64_MAX, out);
}

int gguf_array_f32(const gguf_file *f, const char *key, uint64_t i, float *out)
{
    const gguf_kv *kv;
    int rc = find_array(f, key, &kv);
    if (rc)
        return rc;
    uint32_t t = kv->elem_type;
    if (t != GGUF_VAL_F32 && t != GGUF_VAL_F64)
        return BT_ETYPE;
    if (i >= kv->count)
        return BT_ERANGE;
    return load_f32(t, kv->val + (size_t)i * val_bytes[t], out);
}

size_t gguf_tensor_count(const gguf_file *f)
{
    return f->n_tensors;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, size_t i)
{
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name)
{
    size_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const gguf_tensor *t = &f->tensors[f->tensor_sorted[mid]];
        int c = strcmp(t->name, name);
        if (c == 0)
            return t;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ---- files built in memory ------------------------------------------------------ */

int gguf_build_create(gguf_file **out)
{
    *out = calloc(1, sizeof(gguf_file));
    if (!*out)
        return BT_ENOMEM;
    (*out)->version = 3;
    (*out)->alignment = GGUF_DEFAULT_ALIGNMENT;
    return 0;
}

int gguf_build_own(gguf_file *f, void *p)
{
    if (BT_RESERVE(f->owned, f->n_owned, f->cap_owned, 16)) {
        free(p);
        return BT_ENOMEM;
    }
    f->owned[f->n_owned++] = p;
    return 0;
}

int gguf_build_own_map(gguf_file *f, void *p, size_t n)
{
    if (BT_RESERVE(f->maps, f->n_maps, f->cap_maps, 16)) {
        munmap(p, n);
        return BT_ENOMEM;
    }
    f->maps[f->n_maps++] = (struct gguf_region){p, n};
    return 0;
}

/* Where KEY goes in kv_sorted: *POS, and whether it is there already. */
static bool kv_locate(const gguf_file *f, const char *key, size_t n, size_t *pos)
{
    size_t lo = 0, hi = f->n_kv;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const gguf_kv *kv = &f->kvs[f->kv_sorted[mid]];
        int c = cmp_bytes(kv->key, kv->key_len, key, n);
        if (c == 0) {
            *pos = mid;
            return true;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *pos = lo;
    return false;
}

/* Adds KEY with a value of TYPE taking VAL_LEN bytes, encoded as in a file,
 * which the caller writes at *VAL; arrays also set elem_type and count of
 * the kv returned in *OUT.  STR_OFF (string arrays: the index of the
 * elements; else NULL) is the kv's from here on, also on failure. */
static int kv_add(gguf_file *f, const char *key, uint32_t type, size_t val_len,
                  uint64_t *str_off, gguf_kv **out, uint8_t **val)
{
    size_t klen = key ? strlen(key) : 0, pos;
    int rc = BT_EINVAL;
    if (!key)
        goto err;
    rc = BT_EEXIST;
    if (kv_locate(f, key, klen, &pos))
        goto err;
    rc = BT_ENOMEM;
    if (BT_RESERVE(f->kvs, f->n_kv, f->cap_kv, 16))
        goto err;
    /* kv_sorted follows kvs: allocate it to the same capacity. */
    size_t *sorted = realloc(f->kv_sorted, f->cap_kv * sizeof(size_t));
    if (!sorted)
        goto err;
    f->kv_sorted = sorted;
    if (BT_RESERVE(f->owned, f->n_owned, f->cap_owned, 16))
        goto err;
    /* The key and then the value, in one block (a value never empty: a
     * one-byte minimum keeps malloc from returning NULL for it). */
    uint8_t *blob = malloc(klen + (val_len ? val_len : 1));
    if (!blob)
        goto err;
    memcpy(blob, key, klen);
    f->owned[f->n_owned++] = blob;
    gguf_kv *kv = &f->kvs[f->n_kv];
    *kv = (gguf_kv){(const char *)blob, klen, type, type, 1, blob + klen, str_off};
    memmove(&f->kv_sorted[pos + 1], &f->kv_sorted[pos], (f->n_kv - pos) * sizeof(size_t));
    f->kv_sorted[pos] = f->n_kv++;
    *out = kv;
    *val = blob + klen;
    return 0;
err:
    free(str_off);
    return rc;
}

/* A scalar of TYPE whose VAL_BYTES[TYPE] bytes are at V. */
static int build_scalar(gguf_file *f, const char *key, uint32_t type, const void *v)
{
    gguf_kv *kv;
    uint8_t *val;
    int rc = kv_add(f, key, type, val_bytes[type], NULL, &kv, &val);
    if (!rc)
        memcpy(val, v, val_bytes[type]);
    return rc;
}

int gguf_build_u32(gguf_file *f, const char *key, uint32_t v)
{
    return build_scalar(f, key, GGUF_VAL_U32, &v);
}

int gguf_build_f32(gguf_file *f, const char *key, float v)
{
    return build_scalar(f, key, GGUF_VAL_F32, &v);
}

int gguf_build_bool(gguf_file *f, const char *key, bool v)
{
    uint8_t b = v;
    return build_scalar(f, key, GGUF_VAL_BOOL, &b);
}

int gguf_build_str(gguf_file *f, const char *key, const char *s, size_t len)
{
    if (!s && len)
        return BT_EINVAL;
    gguf_kv *kv;
    uint8_t *val;
    uint64_t n = len;
    int rc = kv_add(f, key, GGUF_VAL_STRING, 8 + len, NULL, &kv, &val);
    if (rc)
        return rc;
    memcpy(val, &n, 8);
    if (len)
        memcpy(val + 8, s, len);
    return 0;
}

int gguf_build_i32_array(gguf_file *f, const char *key, const int32_t *v, size_t n)
{
    if ((!v && n) || n > SIZE_MAX / 4)
        return BT_EINVAL;
    gguf_kv *kv;
    uint8_t *val;
    int rc = kv_add(f, key, GGUF_VAL_ARRAY, n * 4, NULL, &kv, &val);
    if (rc)
        return rc;
    kv->elem_type = GGUF_VAL_I32;
    kv->count = n;
    if (n)
        memcpy(val, v, n * 4);
    return 0;
}

int gguf_build_str_array(gguf_file *f, const char *key, const char *const *s, const size_t *len,
                         size_t n)
{
    if ((!s || !len) && n)
        return BT_EINVAL;
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        if ((!s[i] && len[i]) || __builtin_add_overflow(bytes, 8 + (uint64_t)len[i], &bytes))
            return BT_EINVAL;
    /* Each element as in a file, a u64 length and the bytes, with the
     * index that gguf_array_string reads in O(1). */
    uint64_t *off = malloc((n ? n : 1) * sizeof(uint64_t));
    if (!off)
        return BT_ENOMEM;
    gguf_kv *kv;
    uint8_t *val;
    int rc = kv_add(f, key, GGUF_VAL_ARRAY, bytes, off, &kv, &val);
    if (rc)
        return rc;
    kv->elem_type = GGUF_VAL_STRING;
    kv->count = n;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t l = len[i];
        off[i] = at;
        memcpy(val + at, &l, 8);
        if (len[i])
            memcpy(val + at + 8, s[i], len[i]);
        at += 8 + len[i];
    }
    return 0;
}

/* Where NAME goes in tensor_sorted: *POS, and whether it is there already. */
static bool tensor_locate(const gguf_file *f, const char *name, size_t *pos)
{
    size_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[f->tensor_sorted[mid]].name, name);
        if (c == 0) {
            *pos = mid;
            return true;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *pos = lo;
    return false;
}

int gguf_build_tensor(gguf_file *f, const char *name, uint32_t type, uint32_t n_dims,
                      const int64_t *ne, const void *data, size_t nbytes)
{
    const type_info *ti = ggml_type(type);
    if (!name || !ti || n_dims > GGUF_MAX_DIMS || (n_dims && !ne) || (!data && nbytes))
        return BT_EINVAL;
    gguf_tensor t = {.type = type, .n_dims = n_dims, .nbytes = nbytes, .data = data};
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t.ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
    /* The same checks as a tensor info read from a file. */
    size_t bytes = 0;
    bool bad = t.ne[0] % ti->blck != 0;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        bad |= t.ne[d] < 0;
    if (!bad) {
        bad = __builtin_mul_overflow((uint64_t)t.ne[0] / ti->blck, ti->bytes, &bytes);
        for (int d = 1; d < GGUF_MAX_DIMS; d++)
            bad |= __builtin_mul_overflow(bytes, (uint64_t)t.ne[d], &bytes);
    }
    if (bad || bytes != nbytes)
        return BT_EINVAL;
    size_t pos;
    if (tensor_locate(f, name, &pos))
        return BT_EEXIST;
    if (BT_RESERVE(f->tensors, f->n_tensors, f->cap_tensors, 16))
        return BT_ENOMEM;
    size_t *sorted = realloc(f->tensor_sorted, f->cap_tensors * sizeof(size_t));
    if (!sorted)
        return BT_ENOMEM;
    f->tensor_sorted = sorted;
    t.name_len = strlen(name);
    char *copy = malloc(t.name_len + 1);
    if (!copy)
        return BT_ENOMEM;
    memcpy(copy, name, t.name_len + 1);
    if (gguf_build_own(f, copy))
        return BT_ENOMEM;
    t.name = copy;
    f->tensors[f->n_tensors] = t;
    memmove(&f->tensor_sorted[pos + 1], &f->tensor_sorted[pos],
            (f->n_tensors - pos) * sizeof(size_t));
    f->tensor_sorted[pos] = f->n_tensors++;
    return 0;
}
