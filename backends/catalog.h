/* The catalog of backends known to this build and the options each
 * declares.  The config loader checks `backend:` and `options:` against it,
 * so a typo is an error at its line rather than a failure at load time on
 * a worker.  The implementations live in the folders beside this file
 * (backends/builtin.c names them); this table is their declaration, data
 * only, so that batond links it without linking any backend. */
#ifndef BATON_BACKENDS_CATALOG_H
#define BATON_BACKENDS_CATALOG_H

#include <stddef.h>

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

#endif
