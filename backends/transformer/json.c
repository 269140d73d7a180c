/* JSON through libyaml's event parser (backends/transformer/json.h).  Each
 * event either opens a container (pushed on a stack no deeper than
 * JSON_MAX_DEPTH), closes one, or is a scalar; a scalar in an object
 * alternates between key and value.  Values and their text are bump
 * allocated from chunks, so a tokenizer.json of a hundred thousand strings
 * costs a few dozen allocations and one free per chunk. */
#include "backends/transformer/json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#define CHUNK_BYTES (256u << 10)

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;     /* bytes of data */
    _Alignas(16) unsigned char data[];
} chunk;

struct json_doc {
    chunk *chunks;        /* the head is the one allocated from */
    json_val *root;
};

/* N bytes from D's arena, 16-aligned; NULL when memory is short. */
static void *arena_alloc(json_doc *d, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    chunk *c = d->chunks;
    if (c && c->cap - c->used >= n) {
        void *p = c->data + c->used;
        c->used += n;
        return p;
    }
    size_t cap = n > CHUNK_BYTES ? n : CHUNK_BYTES;
    chunk *nc = malloc(sizeof(chunk) + cap);
    if (!nc)
        return NULL;
    nc->used = n;
    nc->cap = cap;
    /* A chunk for one large string goes behind the head, whose free room
     * the next small values still use. */
    if (c && cap == n) {
        nc->next = c->next;
        c->next = nc;
    } else {
        nc->next = c;
        d->chunks = nc;
    }
    return nc->data;
}

/* A NUL-terminated copy of S[N] in D's arena. */
static char *arena_str(json_doc *d, const void *s, size_t n)
{
    char *p = arena_alloc(d, n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

void json_free(json_doc *d)
{
    if (!d)
        return;
    for (chunk *c = d->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(d);
}

const json_val *json_root(const json_doc *d)
{
    return d ? d->root : NULL;
}

/* Whether S[N] is a number in JSON's grammar:
 * -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?  */
static bool is_number(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-')
        i++;
    if (i >= n || s[i] < '0' || s[i] > '9')
        return false;
    if (s[i] == '0')
        i++;
    else
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    if (i < n && s[i] == '.') {
        size_t d = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return false;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        size_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return false;
    }
    return i == n;
}

typedef struct builder {
    json_doc *d;
    json_val *stack[JSON_MAX_DEPTH];  /* the open containers, innermost last */
    int depth;
    const char *key;                  /* in an object: the key read, awaiting its value */
    size_t key_len;
    char *err;
    size_t errlen;
} builder;

/* Attaches V to the innermost open container (or makes it the root). */
static int attach(builder *b, json_val *v, const yaml_mark_t *at)
{
    if (b->depth == 0) {
        if (b->d->root)
            return bt_errorf(b->err, b->errlen, BT_EFORMAT,
                             "line %zu, column %zu: a second value after the first",
                             at->line + 1, at->column + 1);
        b->d->root = v;
        return 0;
    }
    json_val *p = b->stack[b->depth - 1];
    if (p->kind == JSON_OBJECT) {
        v->key = b->key;
        v->key_len = b->key_len;
        b->key = NULL;
    }
    if (p->last)
        p->last->next = v;
    else
        p->first = v;
    p->last = v;
    p->count++;
    return 0;
}

/* A scalar event: a key, or a value of one of the four scalar kinds. */
static int on_scalar(builder *b, const yaml_event_t *e)
{
    const char *s = (const char *)e->data.scalar.value;
    size_t n = e->data.scalar.length;
    const yaml_mark_t *at = &e->start_mark;
    json_val *p = b->depth ? b->stack[b->depth - 1] : NULL;
    if (p && p->kind == JSON_OBJECT && !b->key) {
        if (!(b->key = arena_str(b->d, s, n)))
            return bt_errorf(b->err, b->errlen, BT_ENOMEM, "out of memory");
        b->key_len = n;
        return 0;
    }
    json_val *v = arena_alloc(b->d, sizeof(*v));
    if (!v)
        return bt_errorf(b->err, b->errlen, BT_ENOMEM, "out of memory");
    *v = (json_val){.kind = JSON_STRING};
    if (e->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
        if (n == 4 && !memcmp(s, "null", 4))
            v->kind = JSON_NULL;
        else if ((n == 4 && !memcmp(s, "true", 4)) || (n == 5 && !memcmp(s, "false", 5)))
            v->kind = JSON_BOOL;
        else if (is_number(s, n))
            v->kind = JSON_NUMBER;
        else
            return bt_errorf(b->err, b->errlen, BT_EFORMAT,
                             "line %zu, column %zu: '%.*s' is not JSON (a string is quoted)",
                             at->line + 1, at->column + 1, (int)(n > 40 ? 40 : n), s);
    }
    if (v->kind != JSON_NULL) {
        if (!(v->str = arena_str(b->d, s, n)))
            return bt_errorf(b->err, b->errlen, BT_ENOMEM, "out of memory");
        v->len = n;
    }
    return attach(b, v, at);
}

static int on_open(builder *b, json_kind kind, const yaml_mark_t *at)
{
    json_val *p = b->depth ? b->stack[b->depth - 1] : NULL;
    if (p && p->kind == JSON_OBJECT && !b->key)
        return bt_errorf(b->err, b->errlen, BT_EFORMAT,
                         "line %zu, column %zu: an object's key must be a string",
                         at->line + 1, at->column + 1);
    if (b->depth == JSON_MAX_DEPTH)
        return bt_errorf(b->err, b->errlen, BT_EFORMAT,
                         "line %zu, column %zu: nested deeper than %d levels", at->line + 1,
                         at->column + 1, JSON_MAX_DEPTH);
    json_val *v = arena_alloc(b->d, sizeof(*v));
    if (!v)
        return bt_errorf(b->err, b->errlen, BT_ENOMEM, "out of memory");
    *v = (json_val){.kind = kind};
    int rc = attach(b, v, at);
    if (!rc)
        b->stack[b->depth++] = v;
    return rc;
}

/* One event; sets *DONE at the end of the stream. */
static int on_event(builder *b, const yaml_event_t *e, bool *done)
{
    const yaml_mark_t *at = &e->start_mark;
    switch (e->type) {
    case YAML_STREAM_START_EVENT:
    case YAML_DOCUMENT_END_EVENT:
        return 0;
    case YAML_DOCUMENT_START_EVENT:
        if (b->d->root)
            return bt_errorf(b->err, b->errlen, BT_EFORMAT,
                             "line %zu, column %zu: a second document", at->line + 1,
                             at->column + 1);
        return 0;
    case YAML_STREAM_END_EVENT:
        *done = true;
        return 0;
    case YAML_ALIAS_EVENT:
        return bt_errorf(b->err, b->errlen, BT_EFORMAT,
                         "line %zu, column %zu: an alias, which JSON does not have",
                         at->line + 1, at->column + 1);
    case YAML_SCALAR_EVENT:
        return on_scalar(b, e);
    case YAML_SEQUENCE_START_EVENT:
        return on_open(b, JSON_ARRAY, at);
    case YAML_MAPPING_START_EVENT:
        return on_open(b, JSON_OBJECT, at);
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        /* libyaml pairs the events: the innermost container is the one
         * ending (and a mapping's keys have all had values). */
        b->depth--;
        return 0;
    default:
        return 0;
    }
}

int json_parse(const char *text, size_t len, json_doc **out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    *out = NULL;
    builder b = {.d = calloc(1, sizeof(json_doc)), .err = err, .errlen = errlen};
    if (!b.d)
        return bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        free(b.d);
        return bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int rc = 0;
    for (bool done = false; !done && !rc;) {
        yaml_event_t e;
        if (!yaml_parser_parse(&parser, &e)) {
            rc = bt_errorf(err, errlen, parser.error == YAML_MEMORY_ERROR ? BT_ENOMEM : BT_EFORMAT,
                           "line %zu, column %zu: %s%s%s", parser.problem_mark.line + 1,
                           parser.problem_mark.column + 1,
                           parser.problem ? parser.problem : "malformed",
                           parser.context ? " " : "", parser.context ? parser.context : "");
            break;
        }
        rc = on_event(&b, &e, &done);
        yaml_event_delete(&e);
    }
    yaml_parser_delete(&parser);
    if (!rc && !b.d->root)
        rc = bt_errorf(err, errlen, BT_EFORMAT, "empty: no JSON value");
    if (rc) {
        json_free(b.d);
        return rc;
    }
    *out = b.d;
    return 0;
}

const json_val *json_get(const json_val *obj, const char *key)
{
    if (!obj || obj->kind != JSON_OBJECT)
        return NULL;
    size_t n = strlen(key);
    const json_val *hit = NULL;
    for (const json_val *m = obj->first; m; m = m->next)
        if (m->key_len == n && !memcmp(m->key, key, n))
            hit = m;
    return hit;
}

int json_i64(const json_val *v, int64_t *out)
{
    if (!v || v->kind != JSON_NUMBER || strpbrk(v->str, ".eE"))
        return BT_ETYPE;
    errno = 0;
    long long x = strtoll(v->str, NULL, 10);
    if (errno == ERANGE)
        return BT_ERANGE;
    *out = x;
    return 0;
}

int json_f64(const json_val *v, double *out)
{
    if (!v || v->kind != JSON_NUMBER)
        return BT_ETYPE;
    double x = strtod(v->str, NULL);
    if (!isfinite(x))
        return BT_ERANGE;
    *out = x;
    return 0;
}

const char *json_kind_name(json_kind k)
{
    static const char *const names[] = {"null",     "a boolean", "a number",
                                        "a string", "an array",  "an object"};
    return (unsigned)k <= JSON_OBJECT ? names[k] : "?";
}
