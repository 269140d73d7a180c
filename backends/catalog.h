/* The catalog of backends known to this build and the options each
 * declares: type, default, and what values are allowed (a range for a
 * number, a list for an enumerated string).  The config loader checks
 * `backend:` and `options:` against it, so a typo or a value out of range is
 * an error at its line rather than a failure at load time on a worker; the
 * built-in backends read their options through it too (bt_opt_parse), so
 * each fact about an option is stated once, here.  The implementations live
 * in the folders beside this file (backends/builtin.c names them); this
 * table is their declaration, data and its checks only, so that batond
 * links it without linking any backend. */
#ifndef BATON_BACKENDS_CATALOG_H
#define BATON_BACKENDS_CATALOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum bt_opt_type {
    BT_OPT_INT = 0,    /* a YAML integer (int64) */
    BT_OPT_FLOAT = 1,  /* a YAML number */
    BT_OPT_BOOL = 2,   /* true/false */
    BT_OPT_STRING = 3, /* any scalar */
    BT_OPT_PATH = 4    /* a file path; --check-config warns when it is missing */
} bt_opt_type;

typedef struct bt_opt_desc {
    const char *name;
    bt_opt_type type;
    const char *def;   /* default as text; NULL: no default (unset unless given) */
    int required;      /* 1: the option must be given */
    const char *doc;   /* one line for config/README.md and --help */
    int64_t min, max;  /* BT_OPT_INT: the values allowed, both ends included */
    double fmin, fmax; /* BT_OPT_FLOAT: likewise */
    const char *const *allowed; /* BT_OPT_STRING: the values allowed, NULL-terminated;
                                   NULL: any text */
} bt_opt_desc;

typedef struct bt_backend_desc {
    const char *name;
    const char *doc;
    const bt_opt_desc *options;
    size_t n_options;
} bt_backend_desc;

/* Returns the built-in backend called NAME, or NULL. */
const bt_backend_desc *bt_backend_find(const char *name);

/* All built-in backends, for listings and "did you mean". */
const bt_backend_desc *const *bt_backend_all(size_t *n);

const bt_opt_desc *bt_backend_option(const bt_backend_desc *b, const char *name);
const char *bt_opt_type_name(bt_opt_type t);

/* A value of an option: the member of its type.  SET is false only for an
 * option that was not given and has no default. */
typedef struct bt_opt_value {
    bool set;
    int64_t i;         /* BT_OPT_INT */
    double f;          /* BT_OPT_FLOAT */
    bool b;            /* BT_OPT_BOOL */
    const char *s;     /* BT_OPT_STRING, BT_OPT_PATH: the text (borrowed) */
} bt_opt_value;

/* Checks V, a value of option D of backend B written as TEXT, against D's
 * range or allowed values.  Returns 0, or BT_ERANGE (a number out of
 * range) or BT_EINVAL (a string not allowed) with ERR saying what is
 * allowed: "option kv_dtype = 'q4': use auto, f16, q8_0 or f32 (backend
 * 'transformer')".  ERR may be NULL. */
int bt_opt_check(const bt_backend_desc *b, const bt_opt_desc *d, const bt_opt_value *v,
                 const char *text, char *err, size_t errlen);

/* Reads TEXT, the value of option D of backend B as a backend receives it
 * (baton_load_option; NULL when not given), into *V: D's default when
 * TEXT is NULL, else TEXT parsed as D's type ("true"/"false" for a
 * boolean, a decimal integer) and checked as bt_opt_check does.  Returns
 * 0, or BT_EINVAL / BT_ERANGE with ERR as above.  V->s borrows TEXT or the
 * default. */
int bt_opt_parse(const bt_backend_desc *b, const bt_opt_desc *d, const char *text,
                 bt_opt_value *v, char *err, size_t errlen);

#endif
