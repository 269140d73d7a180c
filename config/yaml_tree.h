/* A small YAML tree that keeps every node's line and column.
 *
 * libyaml gives events (or, through yaml_parser_load, nodes by index) with
 * 0-based marks; the loaders want pointers, 1-based positions and a few
 * typed readers that report "expected an integer for 'x', got 'abc'" at the
 * right place.  The tree is built from libyaml's events, aliases expanded
 * into copies, with limits on depth and size: a config file is input that
 * the fuzzers throw anything at, and `[[[[...` or a billion laughs must
 * end in an error, not a hang. */
#ifndef BATON_CONFIG_YAML_TREE_H
#define BATON_CONFIG_YAML_TREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/diag.h"

/* Nesting deeper than this is refused; it also bounds the recursion of
 * every walker over the tree. */
#define YT_MAX_DEPTH 128
/* Nodes after alias expansion; a config is a few hundred. */
#define YT_MAX_NODES (1u << 18)
/* yt_fields accepts at most this many names. */
#define YT_MAX_FIELDS 24

typedef enum yt_kind { YT_SCALAR = 0, YT_SEQ = 1, YT_MAP = 2 } yt_kind;

typedef struct yt_node yt_node;

typedef struct yt_pair {
    yt_node *key;   /* owned */
    yt_node *value; /* owned */
} yt_pair;

struct yt_node {
    yt_kind kind;
    int line, col;     /* 1-based start of the node */
    char *str;         /* scalars: owned text, NUL-terminated */
    size_t len;        /* scalars: bytes in str; may exceed strlen(str) */
    bool plain;        /* scalars: written without quotes (only those can be null) */
    yt_node **items;   /* lists: owned array of owned nodes */
    size_t n_items;
    yt_pair *pairs;    /* mappings: owned array, in file order */
    size_t n_pairs;
    size_t cap;        /* lists and mappings: allocated slots of items or pairs */
};

/* Why yt_parse failed, at a 1-based position. */
typedef struct yt_error {
    int line, col;
    char message[256];
} yt_error;

/* Parses the single YAML document in BUF.  Returns 0 and sets *OUT (NULL
 * for an empty document), BT_EINVAL with ERR filled for a syntax error, a
 * second document or a tree over the limits, or BT_ENOMEM. */
int yt_parse(const char *buf, size_t len, yt_node **out, yt_error *err);

void yt_node_destroy(yt_node *n);

/* True for a plain `~`, `null` or empty scalar: "not set". */
bool yt_is_null(const yt_node *n);

/* "a string", "a list" or "a mapping", for messages. */
const char *yt_kind_name(yt_kind k);

/* Writes what N is for a "got ..." message into BUF: a scalar's text in
 * quotes (shortened when long), else its kind.  Returns BUF. */
const char *yt_describe(const yt_node *n, char *buf, size_t size);

/* Strict text parsers, shared with the defaults of backend options.  Each
 * returns 0, BT_EINVAL when TEXT is not of the type, or BT_ERANGE. */
int yt_parse_int(const char *text, int64_t *out);
int yt_parse_float(const char *text, double *out);
int yt_parse_bool(const char *text, bool *out);

/* The readers below report to D at the value's position and return false
 * (or BT_EINVAL) when V is not what KEY needs; the target is then left as
 * it was, so it keeps its default. */

/* Checks that V is of KIND: "expected a list for 'inputs', got 'x'". */
bool yt_expect(const yt_node *v, yt_kind kind, const char *key, bt_diag *d);

/* Reads the mapping MAP against NAMES: VALS[i] receives the value of key
 * NAMES[i], or NULL when it is absent or null.  Reports each unknown key
 * ("unknown key 'x' in CTX; did you mean 'y'?"), repeated key and non-string
 * key at the key.  MAP must be a mapping; N at most YT_MAX_FIELDS. */
void yt_fields(const yt_node *map, const char *ctx, const char *const *names, size_t n,
               const yt_node **vals, bt_diag *d);

bool yt_int(const yt_node *v, const char *key, int64_t min, int64_t max, int64_t *out,
            bt_diag *d);
bool yt_u32(const yt_node *v, const char *key, uint32_t min, uint32_t max, uint32_t *out,
            bt_diag *d);
bool yt_float(const yt_node *v, const char *key, double min, double max, double *out,
              bt_diag *d);
bool yt_bool(const yt_node *v, const char *key, bool *out, bt_diag *d);

/* Copies the scalar V into *OUT (freeing what was there).  Returns 0,
 * BT_EINVAL (reported: not a scalar, or it holds a NUL byte) or BT_ENOMEM. */
int yt_str(const yt_node *v, const char *key, char **out, bt_diag *d);

#endif
