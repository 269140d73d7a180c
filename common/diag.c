#include "common/diag.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"

static const char oom_message[] = "out of memory while reporting an error";

bt_diag *bt_diag_create(const char *file)
{
    bt_diag *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->file = strdup(file ? file : "<input>");
    if (!d->file) {
        free(d);
        return NULL;
    }
    return d;
}

void bt_diag_destroy(bt_diag *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n; i++)
        if (d->items[i].message != oom_message)
            free(d->items[i].message);
    free(d->items);
    free(d->file);
    free(d);
}

void bt_diag_add(bt_diag *d, bt_diag_level level, int line, int col, const char *fmt, ...)
{
    if (BT_RESERVE(d->items, d->n, d->cap, 16) < 0) {
        /* Keep the count right even if the text is lost: callers decide
         * success on n_errors. */
        if (level == BT_DIAG_ERROR)
            d->n_errors++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    if (vasprintf(&msg, fmt, ap) < 0)
        msg = NULL;
    va_end(ap);
    bt_diag_item *it = &d->items[d->n++];
    it->level = level;
    it->line = line;
    it->col = col;
    it->message = msg ? msg : (char *)oom_message;
    if (level == BT_DIAG_ERROR)
        d->n_errors++;
}

static int item_cmp(const void *a, const void *b)
{
    const bt_diag_item *x = a, *y = b;
    if (x->line != y->line)
        return x->line < y->line ? -1 : 1;
    if (x->col != y->col)
        return x->col < y->col ? -1 : 1;
    return 0;
}

void bt_diag_sort(bt_diag *d)
{
    /* Insertion sort keeps equal positions in report order (qsort is not
     * stable) and lists are short. */
    for (size_t i = 1; i < d->n; i++) {
        bt_diag_item t = d->items[i];
        size_t j = i;
        while (j > 0 && item_cmp(&d->items[j - 1], &t) > 0) {
            d->items[j] = d->items[j - 1];
            j--;
        }
        d->items[j] = t;
    }
}

void bt_diag_print(const bt_diag *d, FILE *out)
{
    for (size_t i = 0; i < d->n; i++) {
        const bt_diag_item *it = &d->items[i];
        const char *lv = it->level == BT_DIAG_ERROR ? "error" : "warning";
        if (it->line > 0)
            fprintf(out, "%s:%d:%d: %s: %s\n", d->file, it->line, it->col, lv, it->message);
        else
            fprintf(out, "%s: %s: %s\n", d->file, lv, it->message);
    }
}

const bt_diag_item *bt_diag_find(const bt_diag *d, const char *needle)
{
    for (size_t i = 0; i < d->n; i++)
        if (strstr(d->items[i].message, needle))
            return &d->items[i];
    return NULL;
}

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return (size_t)-1;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t best = diag + cost;
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *bt_suggest(const char *word, const char *const *candidates, size_t n)
{
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        size_t dist = edit_distance(word, candidates[i]);
        if (dist < best_d) {
            best_d = dist;
            best = candidates[i];
        }
    }
    /* A suggestion is only useful when it looks like a typo: allow about a
     * third of the word to differ, and at least one edit. */
    size_t len = strlen(word);
    size_t limit = len / 3 > 1 ? len / 3 : 1;
    if (len >= 4 && limit < 2)
        limit = 2;
    return best && best_d <= limit ? best : NULL;
}
