/* CTranslate2 model files: the parser and the lookups (ct2.h).
 *
 * The parser walks the file once with a cursor that checks every read
 * against the end of the mapping, so a bad count or length is an error at
 * the offset where it was read, never a read past the file.  The variables
 * and aliases are then sorted by name, which finds duplicates and makes
 * ct2_find a binary search. */
#include "backends/whisper/ct2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mapfile.h"

/* The element count's overflow check needs one value past UINT32_MAX. */
_Static_assert(SIZE_MAX > UINT32_MAX, "ct2.c needs a 64-bit size_t");

typedef struct ct2_alias {
    const char *alias;   /* in the mapping */
    const char *target;  /* in the mapping */
    const ct2_var *var;  /* the variable it names; owned by the file */
} ct2_alias;

struct ct2_file {
    char *path;              /* owned copy, for messages */
    void *map;               /* the mapping, or NULL for ct2_open_memory */
    size_t size;             /* bytes of the file */
    const uint8_t *base;     /* first byte (the mapping or the caller's buffer) */
    uint32_t version;
    const char *spec;        /* in the mapping */
    uint32_t spec_revision;
    ct2_var *vars;           /* owned; file order */
    size_t nvars;
    const ct2_var **sorted;  /* owned; vars by name */
    ct2_alias *aliases;      /* owned; by alias name */
    size_t naliases;
};

/* The smallest encoding of a variable: a 1-character name (u16 length and
 * two bytes), rank 0, a dtype and a zero byte count.  It bounds a count
 * read from the file before anything is allocated for it. */
#define MIN_VAR_BYTES (2 + 2 + 1 + 1 + 4)
#define MIN_ALIAS_BYTES (2 * (2 + 2))

typedef struct cursor {
    const uint8_t *p;  /* the file */
    size_t size;       /* bytes */
    size_t off;        /* bytes read */
    const char *path;  /* for messages */
    char *err;
    size_t errlen;
} cursor;

static int truncated(cursor *c, const char *what)
{
    return bt_errorf(c->err, c->errlen, BT_EFORMAT,
                     "%s: truncated at byte %zu of %zu, reading %s", c->path, c->off, c->size,
                     what);
}

static int read_u8(cursor *c, uint8_t *v, const char *what)
{
    if (c->size - c->off < 1)
        return truncated(c, what);
    *v = c->p[c->off++];
    return 0;
}

static int read_u16(cursor *c, uint16_t *v, const char *what)
{
    if (c->size - c->off < 2)
        return truncated(c, what);
    *v = (uint16_t)(c->p[c->off] | (uint16_t)c->p[c->off + 1] << 8);
    c->off += 2;
    return 0;
}

static int read_u32(cursor *c, uint32_t *v, const char *what)
{
    if (c->size - c->off < 4)
        return truncated(c, what);
    const uint8_t *b = c->p + c->off;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    c->off += 4;
    return 0;
}

/* A string: u16 length with the NUL, then the bytes, which must end in the
 * only NUL; an empty string is refused (no name is empty). */
static int read_str(cursor *c, const char **s, const char *what)
{
    size_t at = c->off;
    uint16_t len = 0;
    int rc = read_u16(c, &len, what);
    if (rc)
        return rc;
    if (c->size - c->off < len)
        return truncated(c, what);
    const char *b = (const char *)c->p + c->off;
    if (len < 2 || b[len - 1] != '\0' || memchr(b, '\0', len - 1))
        return bt_errorf(c->err, c->errlen, BT_EFORMAT,
                         "%s: byte %zu: %s is not a non-empty NUL-terminated string of %u bytes",
                         c->path, at, what, (unsigned)len);
    c->off += len;
    *s = b;
    return 0;
}

const char *ct2_dtype_name(uint32_t dtype)
{
    switch (dtype) {
    case CT2_F32: return "f32";
    case CT2_I8: return "i8";
    case CT2_I16: return "i16";
    case CT2_I32: return "i32";
    case CT2_F16: return "f16";
    case CT2_BF16: return "bf16";
    default: return "?";
    }
}

size_t ct2_dtype_size(uint32_t dtype)
{
    switch (dtype) {
    case CT2_I8: return 1;
    case CT2_I16: case CT2_F16: case CT2_BF16: return 2;
    case CT2_F32: case CT2_I32: return 4;
    default: return 0;
    }
}

static int parse_var(cursor *c, ct2_var *v)
{
    int rc;
    uint8_t rank = 0, dtype = 0;
    uint32_t nbytes = 0;
    if ((rc = read_str(c, &v->name, "a variable's name")))
        return rc;
    if ((rc = read_u8(c, &rank, v->name)))
        return rc;
    if (rank > CT2_MAX_RANK)
        return bt_errorf(c->err, c->errlen, BT_EFORMAT,
                         "%s: byte %zu: variable '%s' has rank %u, more than %d", c->path,
                         c->off - 1, v->name, (unsigned)rank, CT2_MAX_RANK);
    v->rank = rank;
    size_t n = 1;
    for (uint32_t d = 0; d < CT2_MAX_RANK; d++) {
        v->dims[d] = 1;
        if (d >= rank)
            continue;
        if ((rc = read_u32(c, &v->dims[d], v->name)))
            return rc;
        /* The byte count is a u32, so a product past it cannot match. */
        if (v->dims[d] && n > UINT32_MAX / v->dims[d])
            n = (size_t)UINT32_MAX + 1;
        else
            n *= v->dims[d];
    }
    if ((rc = read_u8(c, &dtype, v->name)))
        return rc;
    size_t esize = ct2_dtype_size(dtype);
    if (!esize)
        return bt_errorf(c->err, c->errlen, BT_EFORMAT,
                         "%s: byte %zu: variable '%s' has dtype %u, not one of f32, i8, i16, i32, "
                         "f16, bf16", c->path, c->off - 1, v->name, (unsigned)dtype);
    v->dtype = dtype;
    size_t at = c->off;
    if ((rc = read_u32(c, &nbytes, v->name)))
        return rc;
    if (n > UINT32_MAX || n * esize != nbytes)
        return bt_errorf(c->err, c->errlen, BT_EFORMAT,
                         "%s: byte %zu: variable '%s' has %u bytes, but %zu elements of %s take "
                         "%zu", c->path, at, v->name, (unsigned)nbytes, n, ct2_dtype_name(dtype),
                         n * esize);
    if (c->size - c->off < nbytes)
        return truncated(c, v->name);
    v->nelems = n;
    v->nbytes = nbytes;
    v->offset = c->off;
    v->data = c->p + c->off;
    c->off += nbytes;
    return 0;
}

static int cmp_var(const void *a, const void *b)
{
    return strcmp((*(const ct2_var *const *)a)->name, (*(const ct2_var *const *)b)->name);
}

static int cmp_alias(const void *a, const void *b)
{
    return strcmp(((const ct2_alias *)a)->alias, ((const ct2_alias *)b)->alias);
}

static const ct2_var *find_var(const ct2_file *f, const char *name)
{
    size_t lo = 0, hi = f->nvars;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int d = strcmp(name, f->sorted[mid]->name);
        if (d == 0)
            return f->sorted[mid];
        if (d < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

static int parse(ct2_file *f, cursor *c)
{
    int rc;
    uint32_t n = 0;
    if ((rc = read_u32(c, &f->version, "the binary version")))
        return rc;
    if (f->version != CT2_BINARY_VERSION)
        return bt_errorf(c->err, c->errlen, BT_EFORMAT,
                         "%s: CTranslate2 binary version %u, this reader knows version %d only "
                         "(or the file is not a CTranslate2 model)", c->path,
                         (unsigned)f->version, CT2_BINARY_VERSION);
    if ((rc = read_str(c, &f->spec, "the spec name")) ||
        (rc = read_u32(c, &f->spec_revision, "the spec revision")) ||
        (rc = read_u32(c, &n, "the variable count")))
        return rc;
    if (n > (c->size - c->off) / MIN_VAR_BYTES)
        return bt_errorf(c->err, c->errlen, BT_EFORMAT,
                         "%s: byte %zu: %u variables cannot fit in the %zu bytes left", c->path,
                         c->off - 4, (unsigned)n, c->size - c->off);
    if (n) {
        f->vars = calloc(n, sizeof(*f->vars));
        f->sorted = calloc(n, sizeof(*f->sorted));
        if (!f->vars || !f->sorted)
            return bt_errorf(c->err, c->errlen, BT_ENOMEM, "%s: out of memory", c->path);
    }
    for (uint32_t i = 0; i < n; i++) {
        if ((rc = parse_var(c, &f->vars[i])))
            return rc;
        f->sorted[i] = &f->vars[i];
        f->nvars++;
    }
    /* qsort and bsearch take no NULL array, even of no elements. */
    if (f->nvars > 1)
        qsort(f->sorted, f->nvars, sizeof(*f->sorted), cmp_var);
    for (size_t i = 1; i < f->nvars; i++)
        if (strcmp(f->sorted[i - 1]->name, f->sorted[i]->name) == 0)
            return bt_errorf(c->err, c->errlen, BT_EFORMAT, "%s: variable '%s' appears twice",
                             c->path, f->sorted[i]->name);
    if ((rc = read_u32(c, &n, "the alias count")))
        return rc;
    if (n > (c->size - c->off) / MIN_ALIAS_BYTES)
        return bt_errorf(c->err, c->errlen, BT_EFORMAT,
                         "%s: byte %zu: %u aliases cannot fit in the %zu bytes left", c->path,
                         c->off - 4, (unsigned)n, c->size - c->off);
    if (n && !(f->aliases = calloc(n, sizeof(*f->aliases))))
        return bt_errorf(c->err, c->errlen, BT_ENOMEM, "%s: out of memory", c->path);
    for (uint32_t i = 0; i < n; i++) {
        ct2_alias *a = &f->aliases[i];
        if ((rc = read_str(c, &a->alias, "an alias")) ||
            (rc = read_str(c, &a->target, "an alias's variable")))
            return rc;
        f->naliases++;
        if (find_var(f, a->alias))
            return bt_errorf(c->err, c->errlen, BT_EFORMAT,
                             "%s: alias '%s' is also the name of a variable", c->path, a->alias);
        if (!(a->var = find_var(f, a->target)))
            return bt_errorf(c->err, c->errlen, BT_EFORMAT,
                             "%s: alias '%s' names '%s', which is not a variable", c->path,
                             a->alias, a->target);
    }
    if (f->naliases > 1)
        qsort(f->aliases, f->naliases, sizeof(*f->aliases), cmp_alias);
    for (size_t i = 1; i < f->naliases; i++)
        if (strcmp(f->aliases[i - 1].alias, f->aliases[i].alias) == 0)
            return bt_errorf(c->err, c->errlen, BT_EFORMAT, "%s: alias '%s' appears twice",
                             c->path, f->aliases[i].alias);
    if (c->off != c->size)
        return bt_errorf(c->err, c->errlen, BT_EFORMAT,
                         "%s: %zu bytes after the aliases, at byte %zu (not a CTranslate2 "
                         "model, or a damaged one)", c->path, c->size - c->off, c->off);
    return 0;
}

/* Parses what F holds (BASE and SIZE set, or MAP set from PATH when PATH
 * is not NULL); on success *OUT is F, on failure F is closed. */
static int finish_open(ct2_file *f, const char *path, ct2_file **out, char *err,
                       size_t errlen)
{
    int rc;
    if (!f->path) {
        rc = bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
        goto err;
    }
    if (path) {
        if ((rc = bt_mapfile_map(path, NULL, &f->map, &f->size, err, errlen)))
            goto err;
        f->base = f->map;
    }
    cursor c = {f->base, f->size, 0, f->path, err, errlen};
    if ((rc = parse(f, &c)))
        goto err;
    *out = f;
    return 0;
err:
    ct2_close(f);
    return rc;
}

int ct2_open_memory(const void *buf, size_t len, const char *name, ct2_file **out, char *err,
                    size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!out || (!buf && len))
        return bt_errorf(err, errlen, BT_EINVAL, "ct2_open_memory: NULL %s",
                         out ? "buffer" : "out");
    *out = NULL;
    ct2_file *f = calloc(1, sizeof(*f));
    if (!f)
        return bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
    f->path = strdup(name ? name : "(memory)");
    f->base = buf;
    f->size = len;
    return finish_open(f, NULL, out, err, errlen);
}

int ct2_open(const char *path, ct2_file **out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!out || !path)
        return bt_errorf(err, errlen, BT_EINVAL, "ct2_open: NULL %s", out ? "path" : "out");
    *out = NULL;
    ct2_file *f = calloc(1, sizeof(*f));
    if (!f)
        return bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
    f->path = strdup(path);
    return finish_open(f, path, out, err, errlen);
}

void ct2_close(ct2_file *f)
{
    if (!f)
        return;
    bt_mapfile_unmap(f->map, f->size);
    free(f->aliases);
    free(f->sorted);
    free(f->vars);
    free(f->path);
    free(f);
}

const char *ct2_path(const ct2_file *f) { return f->path; }
uint32_t ct2_version(const ct2_file *f) { return f->version; }
const char *ct2_spec(const ct2_file *f) { return f->spec; }
uint32_t ct2_spec_revision(const ct2_file *f) { return f->spec_revision; }
size_t ct2_var_count(const ct2_file *f) { return f->nvars; }
size_t ct2_alias_count(const ct2_file *f) { return f->naliases; }

const ct2_var *ct2_var_at(const ct2_file *f, size_t i)
{
    return i < f->nvars ? &f->vars[i] : NULL;
}

int ct2_alias_at(const ct2_file *f, size_t i, const char **alias, const char **target)
{
    if (i >= f->naliases)
        return BT_ERANGE;
    *alias = f->aliases[i].alias;
    *target = f->aliases[i].target;
    return 0;
}

const ct2_var *ct2_find(const ct2_file *f, const char *name)
{
    const ct2_var *v = find_var(f, name);
    if (v)
        return v;
    if (!f->naliases)
        return NULL;
    ct2_alias key = {.alias = name};
    const ct2_alias *a = bsearch(&key, f->aliases, f->naliases, sizeof(*f->aliases), cmp_alias);
    return a ? a->var : NULL;
}

/* "[51865, 512]" into BUF. */
static const char *shape_str(char *buf, size_t len, uint32_t rank, const uint32_t *dims)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (uint32_t d = 0; d < rank && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%u", d ? ", " : "", (unsigned)dims[d]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
    return buf;
}

int ct2_expect(const ct2_file *f, const char *name, uint32_t dtype, uint32_t rank,
               const uint32_t *dims, const ct2_var **out, char *err, size_t errlen)
{
    const ct2_var *v = ct2_find(f, name);
    if (!v)
        return bt_errorf(err, errlen, BT_ENOENT, "%s: no variable '%s'", f->path, name);
    if (dtype != UINT32_MAX && v->dtype != dtype)
        return bt_errorf(err, errlen, BT_ETYPE, "%s: variable '%s' is %s, expected %s", f->path,
                         name, ct2_dtype_name(v->dtype), ct2_dtype_name(dtype));
    int ok = v->rank == rank;
    for (uint32_t d = 0; ok && dims && d < rank; d++)
        ok = !dims[d] || dims[d] == v->dims[d];
    if (!ok) {
        char has[96], want[96];
        shape_str(has, sizeof(has), v->rank, v->dims);
        if (dims)
            shape_str(want, sizeof(want), rank, dims);
        else
            snprintf(want, sizeof(want), "rank %u", (unsigned)rank);
        return bt_errorf(err, errlen, BT_ETYPE, "%s: variable '%s' has shape %s, expected %s",
                         f->path, name, has, want);
    }
    *out = v;
    return 0;
}

int ct2_get_int(const ct2_file *f, const char *name, int64_t *out, char *err, size_t errlen)
{
    const ct2_var *v;
    int rc = ct2_expect(f, name, UINT32_MAX, 0, NULL, &v, err, errlen);
    if (rc)
        return rc;
    const uint8_t *b = v->data;
    switch (v->dtype) {
    case CT2_I8: *out = (int8_t)b[0]; return 0;
    case CT2_I16: { int16_t x; memcpy(&x, b, 2); *out = x; return 0; }
    case CT2_I32: { int32_t x; memcpy(&x, b, 4); *out = x; return 0; }
    default:
        return bt_errorf(err, errlen, BT_ETYPE, "%s: variable '%s' is %s, expected an integer",
                         f->path, name, ct2_dtype_name(v->dtype));
    }
}
