#include "config/yaml_tree.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "common/status.h"
#include "common/vec.h"

/* ---- building the tree ---- */

/* An anchor met so far; aliases to it get a copy of its node.  Anchors are
 * registered when their node is complete, so an alias inside the node it
 * names is "undefined" and no cycle can be built. */
typedef struct anchor {
    char *name;     /* owned */
    yt_node *node;  /* borrowed: lives in the tree being built */
} anchor;

/* State of one parse.  The tree is built from libyaml's events rather than
 * from yaml_parser_load's document, so that nesting is refused as soon as it
 * passes YT_MAX_DEPTH: libyaml's scanner is quadratic in flow nesting, and
 * the document loader would read a whole `[[[[...` file first. */
typedef struct builder {
    yt_node *open[YT_MAX_DEPTH + 1]; /* collections being filled, outermost first */
    char *open_anchor[YT_MAX_DEPTH + 1]; /* owned: their anchors, registered at the end */
    int depth;                       /* entries in open */
    yt_node *root;                   /* owned once set */
    anchor *anchors;                 /* owned array */
    size_t n_anchors, cap_anchors;
    size_t budget;                   /* nodes that may still be made */
    yt_error *err;
    int rc;                          /* first failure: BT_EINVAL (err filled) or BT_ENOMEM */
} builder;

static void set_error(yt_error *err, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void set_error(yt_error *err, int line, int col, const char *fmt, ...)
{
    va_list ap;
    err->line = line;
    err->col = col;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
}

static void build_fail(builder *b, const yaml_mark_t *mark, const char *what)
{
    if (b->rc)
        return;
    b->rc = BT_EINVAL;
    set_error(b->err, (int)mark->line + 1, (int)mark->column + 1, "%s", what);
}

void yt_node_destroy(yt_node *n)
{
    if (!n)
        return;
    free(n->str);
    for (size_t i = 0; i < n->n_items; i++)
        yt_node_destroy(n->items[i]);
    free(n->items);
    for (size_t i = 0; i < n->n_pairs; i++) {
        yt_node_destroy(n->pairs[i].key);
        yt_node_destroy(n->pairs[i].value);
    }
    free(n->pairs);
    free(n);
}

static yt_node *node_new(builder *b, yt_kind kind, const yaml_mark_t *mark)
{
    if (b->budget == 0) {
        char msg[96];
        snprintf(msg, sizeof(msg), "YAML document has more than %u nodes, counting each alias's copy",
                 YT_MAX_NODES);
        build_fail(b, mark, msg);
        return NULL;
    }
    yt_node *n = calloc(1, sizeof(*n));
    if (!n) {
        b->rc = BT_ENOMEM;
        return NULL;
    }
    b->budget--;
    n->kind = kind;
    n->line = (int)mark->line + 1;
    n->col = (int)mark->column + 1;
    return n;
}

/* Hangs N under the innermost open collection (or makes it the root).  N is
 * owned by the tree afterwards, even when this fails. */
static int attach(builder *b, yt_node *n)
{
    if (b->depth == 0) {
        assert(!b->root);
        b->root = n;
        return 0;
    }
    yt_node *p = b->open[b->depth - 1];
    if (p->kind == YT_SEQ) {
        if (BT_RESERVE(p->items, p->n_items, p->cap, 4) != 0)
            goto oom;
        p->items[p->n_items++] = n;
        return 0;
    }
    /* In a mapping, events alternate key, value: a pair without a value
     * is waiting for this node. */
    if (p->n_pairs > 0 && !p->pairs[p->n_pairs - 1].value) {
        p->pairs[p->n_pairs - 1].value = n;
        return 0;
    }
    if (BT_RESERVE(p->pairs, p->n_pairs, p->cap, 4) != 0)
        goto oom;
    p->pairs[p->n_pairs].key = n;
    p->pairs[p->n_pairs].value = NULL;
    p->n_pairs++;
    return 0;
oom:
    yt_node_destroy(n);
    b->rc = BT_ENOMEM;
    return BT_ENOMEM;
}

static int add_anchor(builder *b, char *name, yt_node *n)
{
    if (BT_RESERVE(b->anchors, b->n_anchors, b->cap_anchors, 4) != 0) {
        free(name);
        b->rc = BT_ENOMEM;
        return BT_ENOMEM;
    }
    b->anchors[b->n_anchors].name = name;
    b->anchors[b->n_anchors].node = n;
    b->n_anchors++;
    return 0;
}

/* A deep copy of SRC placed DEPTH levels down, for an alias at MARK. */
static yt_node *copy_node(builder *b, const yt_node *src, int depth, const yaml_mark_t *mark)
{
    if (depth > YT_MAX_DEPTH) {
        build_fail(b, mark, "YAML nesting is deeper than the limit once aliases are expanded");
        return NULL;
    }
    /* A failure is reported at the alias; the copy keeps the position of
     * what it copies, where the user wrote the values. */
    yt_node *n = node_new(b, src->kind, mark);
    if (!n)
        return NULL;
    n->line = src->line;
    n->col = src->col;
    n->plain = src->plain;
    if (src->str) {
        n->str = malloc(src->len + 1);
        if (!n->str)
            goto oom;
        memcpy(n->str, src->str, src->len + 1);
        n->len = src->len;
    }
    if (src->n_items) {
        n->items = calloc(src->n_items, sizeof(*n->items));
        if (!n->items)
            goto oom;
        n->cap = src->n_items;
        for (; n->n_items < src->n_items; n->n_items++) {
            n->items[n->n_items] = copy_node(b, src->items[n->n_items], depth + 1, mark);
            if (!n->items[n->n_items])
                goto err;
        }
    }
    if (src->n_pairs) {
        n->pairs = calloc(src->n_pairs, sizeof(*n->pairs));
        if (!n->pairs)
            goto oom;
        n->cap = src->n_pairs;
        for (; n->n_pairs < src->n_pairs; n->n_pairs++) {
            yt_pair *d = &n->pairs[n->n_pairs];
            const yt_pair *s = &src->pairs[n->n_pairs];
            d->key = copy_node(b, s->key, depth + 1, mark);
            d->value = d->key ? copy_node(b, s->value, depth + 1, mark) : NULL;
            if (!d->value) {
                yt_node_destroy(d->key);
                d->key = NULL;
                goto err;
            }
        }
    }
    return n;
oom:
    b->rc = BT_ENOMEM;
err:
    yt_node_destroy(n);
    return NULL;
}

/* Applies one event to the tree; returns 0 or the failure in b->rc. */
static int build_event(builder *b, yaml_event_t *ev)
{
    yt_node *n = NULL;
    char *anchor_name = NULL;

    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        n = node_new(b, YT_SCALAR, &ev->start_mark);
        if (!n)
            return b->rc;
        n->len = ev->data.scalar.length;
        n->str = malloc(n->len + 1);
        if (!n->str) {
            yt_node_destroy(n);
            return b->rc = BT_ENOMEM;
        }
        memcpy(n->str, ev->data.scalar.value, n->len);
        n->str[n->len] = '\0';
        n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        if (attach(b, n) != 0)
            return b->rc;
        if (ev->data.scalar.anchor) {
            anchor_name = strdup((const char *)ev->data.scalar.anchor);
            if (!anchor_name)
                return b->rc = BT_ENOMEM;
            return add_anchor(b, anchor_name, n);
        }
        return 0;
    case YAML_ALIAS_EVENT: {
        const char *name = (const char *)ev->data.alias.anchor;
        const yt_node *src = NULL;
        for (size_t i = b->n_anchors; i > 0 && !src; i--)
            if (strcmp(b->anchors[i - 1].name, name) == 0)
                src = b->anchors[i - 1].node;
        if (!src) {
            build_fail(b, &ev->start_mark,
                       "YAML syntax error: found undefined alias (an alias may only refer to a "
                       "complete node above it)");
            return b->rc;
        }
        n = copy_node(b, src, b->depth, &ev->start_mark);
        if (!n)
            return b->rc;
        return attach(b, n);
    }
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        int seq = ev->type == YAML_SEQUENCE_START_EVENT;
        const yaml_char_t *a = seq ? ev->data.sequence_start.anchor : ev->data.mapping_start.anchor;
        if (b->depth == YT_MAX_DEPTH) {
            char msg[64];
            snprintf(msg, sizeof(msg), "YAML nesting is deeper than %d levels", YT_MAX_DEPTH);
            build_fail(b, &ev->start_mark, msg);
            return b->rc;
        }
        n = node_new(b, seq ? YT_SEQ : YT_MAP, &ev->start_mark);
        if (!n)
            return b->rc;
        if (attach(b, n) != 0)
            return b->rc;
        if (a) {
            anchor_name = strdup((const char *)a);
            if (!anchor_name)
                return b->rc = BT_ENOMEM;
        }
        b->open_anchor[b->depth] = anchor_name;
        b->open[b->depth++] = n;
        return 0;
    }
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        assert(b->depth > 0);
        b->depth--;
        anchor_name = b->open_anchor[b->depth];
        b->open_anchor[b->depth] = NULL;
        return anchor_name ? add_anchor(b, anchor_name, b->open[b->depth]) : 0;
    default:
        return 0;
    }
}

/* Turns libyaml's failure into ERR; returns BT_ENOMEM or BT_EINVAL. */
static int parser_error(const yaml_parser_t *p, const char *buf, size_t len, yt_error *err)
{
    if (p->error == YAML_MEMORY_ERROR)
        return BT_ENOMEM;
    const char *problem = p->problem ? p->problem : "unknown error";
    if (p->error == YAML_READER_ERROR) {
        /* Reader errors (bad encoding) carry a byte offset, not a mark. */
        int line = 1, col = 1;
        for (size_t i = 0; i < p->problem_offset && i < len; i++) {
            if (buf[i] == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        set_error(err, line, col, "YAML encoding error: %s", problem);
        return BT_EINVAL;
    }
    int line = (int)p->problem_mark.line + 1, col = (int)p->problem_mark.column + 1;
    if (p->context)
        set_error(err, line, col, "YAML syntax error: %s (%s at line %d, column %d)", problem,
                  p->context, (int)p->context_mark.line + 1, (int)p->context_mark.column + 1);
    else
        set_error(err, line, col, "YAML syntax error: %s", problem);
    return BT_EINVAL;
}

int yt_parse(const char *buf, size_t len, yt_node **out, yt_error *err)
{
    yaml_parser_t parser;
    builder b;
    int documents = 0;
    int done = 0;

    *out = NULL;
    memset(err, 0, sizeof(*err));
    memset(&b, 0, sizeof(b));
    b.budget = YT_MAX_NODES;
    b.err = err;
    if (!yaml_parser_initialize(&parser))
        return BT_ENOMEM;
    yaml_parser_set_input_string(&parser, (const unsigned char *)buf, len);

    while (!done && !b.rc) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            b.rc = parser_error(&parser, buf, len, err);
            break;
        }
        if (ev.type == YAML_STREAM_END_EVENT) {
            done = 1;
        } else if (ev.type == YAML_DOCUMENT_START_EVENT && ++documents > 1) {
            /* A second document would be silently ignored by a one-shot
             * load; a stray `---` more likely means two files pasted
             * together. */
            build_fail(&b, &ev.start_mark,
                       "a config file holds one YAML document; this is a second one");
        } else {
            build_event(&b, &ev);
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);

    for (int i = 0; i < b.depth; i++)
        free(b.open_anchor[i]);
    for (size_t i = 0; i < b.n_anchors; i++)
        free(b.anchors[i].name);
    free(b.anchors);
    if (b.rc) {
        yt_node_destroy(b.root);
        return b.rc;
    }
    *out = b.root;
    return 0;
}

/* ---- reading values ---- */

bool yt_is_null(const yt_node *n)
{
    if (!n || n->kind != YT_SCALAR || !n->plain)
        return false;
    static const char *const nulls[] = {"", "~", "null", "Null", "NULL"};
    for (size_t i = 0; i < sizeof(nulls) / sizeof(nulls[0]); i++)
        if (strcmp(n->str, nulls[i]) == 0)
            return true;
    return false;
}

const char *yt_kind_name(yt_kind k)
{
    switch (k) {
    case YT_SCALAR: return "a string";
    case YT_SEQ: return "a list";
    case YT_MAP: return "a mapping";
    }
    return "a node";
}

const char *yt_describe(const yt_node *n, char *buf, size_t size)
{
    if (!n || yt_is_null(n))
        snprintf(buf, size, "nothing");
    else if (n->kind != YT_SCALAR)
        snprintf(buf, size, "%s", yt_kind_name(n->kind));
    else if (strlen(n->str) > 40)
        snprintf(buf, size, "'%.37s...'", n->str);
    else
        snprintf(buf, size, "'%s'", n->str);
    return buf;
}

/* The text of a scalar, or NULL for a list, a mapping, or a scalar with a
 * NUL byte inside (which C strings would silently cut short). */
static const char *scalar_text(const yt_node *v)
{
    if (v->kind != YT_SCALAR || strlen(v->str) != v->len)
        return NULL;
    return v->str;
}

int yt_parse_int(const char *text, int64_t *out)
{
    const char *p = text;
    if (*p == '+' || *p == '-')
        p++;
    if (!*p)
        return BT_EINVAL;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9')
            return BT_EINVAL;
    errno = 0;
    long long v = strtoll(text, NULL, 10);
    if (errno == ERANGE)
        return BT_ERANGE;
    *out = (int64_t)v;
    return 0;
}

int yt_parse_float(const char *text, double *out)
{
    /* strtod also takes hex, "inf" and "nan"; none is a sensible bandwidth
     * or efficiency, so only decimal notation gets through. */
    int digits = 0;
    for (const char *q = text; *q; q++) {
        if (*q >= '0' && *q <= '9')
            digits = 1;
        else if (!strchr("+-.eE", *q))
            return BT_EINVAL;
    }
    if (!digits)
        return BT_EINVAL;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (!end || *end)
        return BT_EINVAL;
    if (!isfinite(v) || (errno == ERANGE && (v > 1.0 || v < -1.0)))
        return BT_ERANGE;
    *out = v;
    return 0;
}

int yt_parse_bool(const char *text, bool *out)
{
    static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
    static const char *const no[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcmp(text, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcmp(text, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return BT_EINVAL;
}

bool yt_expect(const yt_node *v, yt_kind kind, const char *key, bt_diag *d)
{
    if (v->kind == kind)
        return true;
    char got[64];
    bt_diag_error(d, v->line, v->col, "expected %s for '%s', got %s", yt_kind_name(kind), key,
                  yt_describe(v, got, sizeof(got)));
    return false;
}

void yt_fields(const yt_node *map, const char *ctx, const char *const *names, size_t n,
               const yt_node **vals, bt_diag *d)
{
    const yt_node *seen[YT_MAX_FIELDS] = {0}; /* the key node of each name met so far */

    assert(map->kind == YT_MAP && n <= YT_MAX_FIELDS);
    for (size_t i = 0; i < n; i++)
        vals[i] = NULL;
    for (size_t p = 0; p < map->n_pairs; p++) {
        const yt_node *key = map->pairs[p].key;
        const char *k = scalar_text(key);
        if (!k) {
            char got[64];
            bt_diag_error(d, key->line, key->col, "expected a key name in %s, got %s", ctx,
                          yt_describe(key, got, sizeof(got)));
            continue;
        }
        size_t i = 0;
        while (i < n && strcmp(names[i], k) != 0)
            i++;
        if (i == n) {
            const char *hint = bt_suggest(k, names, n);
            if (hint)
                bt_diag_error(d, key->line, key->col, "unknown key '%s' in %s; did you mean '%s'?",
                              k, ctx, hint);
            else
                bt_diag_error(d, key->line, key->col, "unknown key '%s' in %s", k, ctx);
            continue;
        }
        if (seen[i]) {
            bt_diag_error(d, key->line, key->col, "duplicate key '%s' in %s (first at line %d)", k,
                          ctx, seen[i]->line);
            continue;
        }
        seen[i] = key;
        if (!yt_is_null(map->pairs[p].value))
            vals[i] = map->pairs[p].value;
    }
}

bool yt_int(const yt_node *v, const char *key, int64_t min, int64_t max, int64_t *out,
            bt_diag *d)
{
    char got[64];
    const char *text = scalar_text(v);
    int64_t x = 0;
    int rc = text ? yt_parse_int(text, &x) : BT_EINVAL;
    if (rc == BT_EINVAL) {
        bt_diag_error(d, v->line, v->col, "expected an integer for '%s', got %s", key,
                      yt_describe(v, got, sizeof(got)));
        return false;
    }
    if (rc == BT_ERANGE || x < min) {
        if (rc == BT_ERANGE && text[0] != '-')
            bt_diag_error(d, v->line, v->col, "%s must be at most %" PRId64 ", got %s", key, max,
                          yt_describe(v, got, sizeof(got)));
        else
            bt_diag_error(d, v->line, v->col, "%s must be at least %" PRId64 ", got %s", key, min,
                          yt_describe(v, got, sizeof(got)));
        return false;
    }
    if (x > max) {
        bt_diag_error(d, v->line, v->col, "%s must be at most %" PRId64 ", got %s", key, max,
                      yt_describe(v, got, sizeof(got)));
        return false;
    }
    *out = x;
    return true;
}

bool yt_u32(const yt_node *v, const char *key, uint32_t min, uint32_t max, uint32_t *out,
            bt_diag *d)
{
    int64_t x;
    if (!yt_int(v, key, min, max, &x, d))
        return false;
    *out = (uint32_t)x;
    return true;
}

bool yt_float(const yt_node *v, const char *key, double min, double max, double *out,
              bt_diag *d)
{
    char got[64];
    const char *text = scalar_text(v);
    double x = 0;
    int rc = text ? yt_parse_float(text, &x) : BT_EINVAL;
    if (rc == BT_EINVAL) {
        bt_diag_error(d, v->line, v->col, "expected a number for '%s', got %s", key,
                      yt_describe(v, got, sizeof(got)));
        return false;
    }
    if (rc == BT_ERANGE || x < min || x > max) {
        bt_diag_error(d, v->line, v->col, "%s must be between %g and %g, got %s", key, min, max,
                      yt_describe(v, got, sizeof(got)));
        return false;
    }
    *out = x;
    return true;
}

bool yt_bool(const yt_node *v, const char *key, bool *out, bt_diag *d)
{
    const char *text = scalar_text(v);
    if (!text || yt_parse_bool(text, out) != 0) {
        char got[64];
        bt_diag_error(d, v->line, v->col, "expected true or false for '%s', got %s", key,
                      yt_describe(v, got, sizeof(got)));
        return false;
    }
    return true;
}

int yt_str(const yt_node *v, const char *key, char **out, bt_diag *d)
{
    if (!yt_expect(v, YT_SCALAR, key, d))
        return BT_EINVAL;
    if (!scalar_text(v)) {
        bt_diag_error(d, v->line, v->col, "'%s' must not contain a NUL character", key);
        return BT_EINVAL;
    }
    char *s = strdup(v->str);
    if (!s)
        return BT_ENOMEM;
    free(*out);
    *out = s;
    return 0;
}
