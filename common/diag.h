/* Diagnostics: errors and warnings about a file, each with its 1-based line
 * and column.  Loaders append to a bt_diag list and keep going, so that a
 * user sees every error of a file at once rather than one per run. */
#ifndef BATON_COMMON_DIAG_H
#define BATON_COMMON_DIAG_H

#include <stddef.h>
#include <stdio.h>

typedef enum bt_diag_level { BT_DIAG_ERROR = 0, BT_DIAG_WARNING = 1 } bt_diag_level;

typedef struct bt_diag_item {
    bt_diag_level level;
    int line;          /* 1-based; 0 when the message is about the whole file */
    int col;           /* 1-based; 0 when unknown */
    char *message;     /* owned; no trailing newline */
} bt_diag_item;

typedef struct bt_diag {
    char *file;        /* owned; the name errors are reported against */
    bt_diag_item *items; /* owned array, in the order reported */
    size_t n, cap;
    size_t n_errors;
} bt_diag;

/* Creates an empty list for FILE (copied).  NULL on allocation failure. */
bt_diag *bt_diag_create(const char *file);
void bt_diag_destroy(bt_diag *d);

/* Appends a message.  An allocation failure is remembered as an error item
 * with a fixed text, never lost silently. */
void bt_diag_add(bt_diag *d, bt_diag_level level, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
#define bt_diag_error(d, line, col, ...) bt_diag_add((d), BT_DIAG_ERROR, (line), (col), __VA_ARGS__)
#define bt_diag_warn(d, line, col, ...) bt_diag_add((d), BT_DIAG_WARNING, (line), (col), __VA_ARGS__)

/* Sorts items by line then column (stable), so output reads top to bottom. */
void bt_diag_sort(bt_diag *d);

/* Prints every item as "FILE:LINE:COL: error: message". */
void bt_diag_print(const bt_diag *d, FILE *out);

/* Returns the first item whose message contains NEEDLE, or NULL (tests). */
const bt_diag_item *bt_diag_find(const bt_diag *d, const char *needle);

/* Suggests the candidate closest to WORD by edit distance, or NULL when
 * none is close enough to be a plausible typo. */
const char *bt_suggest(const char *word, const char *const *candidates, size_t n);

#endif
