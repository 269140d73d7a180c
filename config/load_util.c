/* The loader's toolkit: names sets with the place each name was first
 * defined, and string and allocation helpers that remember a failure in the
 * loader.  Above config.c, below load_model.c, load_graph.c and load.c
 * (load_internal.h); it calls nothing of theirs. */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "config/load_internal.h"

cfg_pos cfg__pos(const yt_node *n)
{
    cfg_pos p = {n->line, n->col};
    return p;
}

char *cfg__strdup(cfg__loader *l, const char *s)
{
    char *d = strdup(s);
    if (!d)
        l->rc = BT_ENOMEM;
    return d;
}

void *cfg__calloc(cfg__loader *l, size_t n, size_t size)
{
    if (n == 0)
        return NULL;
    void *p = calloc(n, size);
    if (!p)
        l->rc = BT_ENOMEM;
    return p;
}

bool cfg__str(cfg__loader *l, const yt_node *v, const char *key, char **out)
{
    int rc = yt_str(v, key, out, l->diag);
    if (rc == BT_ENOMEM)
        l->rc = rc;
    return rc == 0;
}

const char *cfg__peek_name(const yt_node *map)
{
    if (map->kind != YT_MAP)
        return NULL;
    for (size_t i = 0; i < map->n_pairs; i++) {
        const yt_node *k = map->pairs[i].key, *v = map->pairs[i].value;
        if (k->kind == YT_SCALAR && strcmp(k->str, "name") == 0 && v->kind == YT_SCALAR &&
            strlen(v->str) == v->len && !yt_is_null(v))
            return v->str;
    }
    return NULL;
}

static size_t name_hash(const char *s)
{
    /* FNV-1a: short keys, no adversary to fear beyond size. */
    size_t h = (size_t)14695981039346656037ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * (size_t)1099511628211ull;
    return h;
}

/* The slot of NAME in SET: its entry, or the empty slot where it belongs. */
static cfg__name *name_slot(const cfg__names *set, const char *name)
{
    size_t mask = set->cap - 1;
    for (size_t i = name_hash(name) & mask;; i = (i + 1) & mask)
        if (!set->v[i].name || strcmp(set->v[i].name, name) == 0)
            return &set->v[i];
}

const cfg__name *cfg__names_find(const cfg__names *set, const char *name)
{
    if (set->cap == 0)
        return NULL;
    cfg__name *e = name_slot(set, name);
    return e->name ? e : NULL;
}

bool cfg__names_add(cfg__loader *l, cfg__names *set, const char *name, cfg_pos pos,
                    const char *what)
{
    const cfg__name *first = cfg__names_find(set, name);
    if (first) {
        bt_diag_error(l->diag, pos.line, pos.col, "duplicate %s name '%s' (first defined at line %d)",
                      what, name, first->pos.line);
        return false;
    }
    /* Keep the table at most half full so that probes stay short. */
    if ((set->n + 1) * 2 > set->cap) {
        cfg__names bigger = {NULL, 0, set->cap ? set->cap * 2 : 16};
        bigger.v = calloc(bigger.cap, sizeof(*bigger.v));
        if (!bigger.v) {
            l->rc = BT_ENOMEM;
            return true; /* not a duplicate; the failure is in l->rc */
        }
        for (size_t i = 0; i < set->cap; i++)
            if (set->v[i].name)
                *name_slot(&bigger, set->v[i].name) = set->v[i];
        bigger.n = set->n;
        free(set->v);
        *set = bigger;
    }
    cfg__name *e = name_slot(set, name);
    e->name = name;
    e->pos = pos;
    set->n++;
    return true;
}

void cfg__names_free(cfg__names *set)
{
    free(set->v);
    set->v = NULL;
    set->n = set->cap = 0;
}
