/* A JSON reader for the files of a Hugging Face model folder (config.json,
 * the header of a .safetensors file, tokenizer.json), built on libyaml,
 * which the project links already: YAML reads JSON, so libyaml's events
 * are turned into a tree of JSON values.
 *
 * The input is untrusted (a safetensors header is whatever the file
 * says), so nesting is limited to JSON_MAX_DEPTH, aliases are refused (no
 * alias expansion, hence no "billion laughs"), and a plain scalar must be
 * a JSON literal: null, true, false or a number in JSON's grammar.  The
 * tree lives in one arena released by json_free.
 *
 * What libyaml does not read, and so neither does this: \u escapes of
 * surrogate pairs (Python's ensure_ascii spelling of characters beyond
 * U+FFFF; writers that emit UTF-8, as Rust's serde_json does for
 * tokenizer.json and safetensors headers, are fine), keys longer than 1024
 * characters, and a tab before the first token of the document.  Being
 * YAML, it also accepts a little more than JSON (single-quoted strings,
 * block-style mappings); nothing relies on that. */
#ifndef BATON_BACKENDS_TRANSFORMER_JSON_H
#define BATON_BACKENDS_TRANSFORMER_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define JSON_MAX_DEPTH 64

typedef enum json_kind {
    JSON_NULL = 0,
    JSON_BOOL = 1,
    JSON_NUMBER = 2,
    JSON_STRING = 3,
    JSON_ARRAY = 4,
    JSON_OBJECT = 5
} json_kind;

typedef struct json_val json_val;
struct json_val {
    json_kind kind;
    const char *key;       /* a member of an object: its key, NUL-terminated; else NULL */
    size_t key_len;        /* bytes of the key (a key may hold a NUL) */
    const char *str;       /* strings: the text, NUL-terminated; numbers and bools: the
                              literal as written; NULL for null and containers */
    size_t len;            /* bytes of str (a string may hold a NUL: use len) */
    const json_val *first; /* arrays, objects: the first element or member, in order */
    const json_val *next;  /* the next element or member of the parent */
    size_t count;          /* arrays, objects: elements or members */
    json_val *last;        /* internal: where the next child is appended */
};

typedef struct json_doc json_doc;

/* Parses the one JSON value in TEXT[LEN] (not necessarily NUL-terminated).
 * On failure *OUT is NULL, the status is returned (BT_EFORMAT, BT_ENOMEM)
 * and ERR[ERRLEN] (may be NULL) says what was wrong and at which line and
 * column. */
int json_parse(const char *text, size_t len, json_doc **out, char *err, size_t errlen);
void json_free(json_doc *d);  /* NULL is a no-op */
const json_val *json_root(const json_doc *d);

/* The member KEY of OBJ (the last one when a key repeats, as most JSON
 * readers take it); NULL when OBJ is not an object or has no such member. */
const json_val *json_get(const json_val *obj, const char *key);

/* A number as an integer (written without fraction or exponent) or as a
 * double.  0, BT_ETYPE (not a number, or not an integer) or BT_ERANGE. */
int json_i64(const json_val *v, int64_t *out);
int json_f64(const json_val *v, double *out);

/* "null", "a boolean", "a number", "a string", "an array", "an object". */
const char *json_kind_name(json_kind k);

#endif
