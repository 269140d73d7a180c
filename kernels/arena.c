/* Greedy-by-size arena planning (kernels/arena.h).  O(n^2) in the number of
 * arena values, which is a few hundred for a 30-layer decoder: cheaper than
 * anything the compile does next, so no interval tree. */
#include "kernels/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct plan_ctx {
    const ka_item *items;
    ka_conflict_fn conflict;
    void *ctx;
} plan_ctx;

static bool items_conflict(const plan_ctx *c, size_t a, size_t b)
{
    if (c->conflict)
        return c->conflict(c->ctx, a, b);
    return c->items[a].first <= c->items[b].last && c->items[b].first <= c->items[a].last;
}

static size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) & ~(a - 1);
}

/* Sorting key: size descending, then earlier definition, then index, so
 * plans are deterministic. */
static int by_size_desc(const void *pa, const void *pb, void *arg)
{
    const ka_item *items = arg;
    size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
    const ka_item *x = &items[a], *y = &items[b];
    if (x->size != y->size)
        return x->size > y->size ? -1 : 1;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* The placed conflicting intervals [off, end), sorted by offset. */
typedef struct span {
    size_t off, end;
} span;

static int by_off(const void *pa, const void *pb)
{
    const span *a = pa, *b = pb;
    return a->off < b->off ? -1 : a->off > b->off;
}

/* One greedy pass; BEST: smallest fitting gap, else lowest.  Writes
 * OFFS[n] and returns the arena size. */
static size_t greedy(const plan_ctx *c, const size_t *order, size_t n, size_t align, bool best,
                     size_t *offs, bool *placed, span *spans)
{
    size_t arena = 0;
    memset(placed, 0, n * sizeof(bool));
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k];
        size_t sz = align_up(c->items[i].size ? c->items[i].size : 1, align);
        size_t ns = 0;
        for (size_t j = 0; j < n; j++)
            if (placed[j] && items_conflict(c, i, j))
                spans[ns++] = (span){offs[j], offs[j] + align_up(c->items[j].size ? c->items[j].size : 1, align)};
        qsort(spans, ns, sizeof(span), by_off);
        size_t pos = 0, chosen = SIZE_MAX, chosen_gap = SIZE_MAX;
        for (size_t s = 0; s < ns; s++) {
            if (spans[s].off > pos && spans[s].off - pos >= sz) {
                size_t gap = spans[s].off - pos;
                if (chosen == SIZE_MAX || (best && gap < chosen_gap)) {
                    chosen = pos;
                    chosen_gap = gap;
                }
                if (!best)
                    break;
            }
            if (spans[s].end > pos)
                pos = spans[s].end;
        }
        if (chosen == SIZE_MAX)
            chosen = pos;
        offs[i] = chosen;
        placed[i] = true;
        if (chosen + sz > arena)
            arena = chosen + sz;
    }
    return arena;
}

int ka_plan(ka_item *items, size_t n, size_t align, ka_conflict_fn conflict, void *ctx,
            size_t *arena)
{
    if ((n && !items) || !arena || !align || (align & (align - 1)))
        return BT_EINVAL;
    *arena = 0;
    if (n == 0)
        return 0;
    size_t *order = malloc(n * sizeof(size_t));
    size_t *offs = malloc(2 * n * sizeof(size_t));
    bool *placed = malloc(n * sizeof(bool));
    span *spans = malloc(n * sizeof(span));
    if (!order || !offs || !placed || !spans) {
        free(order);
        free(offs);
        free(placed);
        free(spans);
        return BT_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, n, sizeof(size_t), by_size_desc, items);
    plan_ctx c = {items, conflict, ctx};
    size_t a_best = greedy(&c, order, n, align, true, offs, placed, spans);
    size_t a_low = greedy(&c, order, n, align, false, offs + n, placed, spans);
    const size_t *win = a_low < a_best ? offs + n : offs;
    for (size_t i = 0; i < n; i++)
        items[i].offset = win[i];
    *arena = a_low < a_best ? a_low : a_best;
    free(order);
    free(offs);
    free(placed);
    free(spans);
    return 0;
}

size_t ka_peak_live(const ka_item *items, size_t n)
{
    int lo = 0, hi = -1;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || items[i].first < lo)
            lo = items[i].first;
        if (items[i].last > hi)
            hi = items[i].last;
    }
    if (n == 0)
        return 0;
    /* A difference array over steps: +size at first, -size after last. */
    size_t steps = (size_t)(hi - lo) + 2;
    long long *d = calloc(steps, sizeof(long long));
    if (!d)
        return 0;
    for (size_t i = 0; i < n; i++) {
        d[items[i].first - lo] += (long long)items[i].size;
        d[items[i].last - lo + 1] -= (long long)items[i].size;
    }
    long long cur = 0, peak = 0;
    for (size_t s = 0; s < steps; s++) {
        cur += d[s];
        if (cur > peak)
            peak = cur;
    }
    free(d);
    return (size_t)peak;
}

/* Adapts a value-id conflict predicate to item indices. */
typedef struct graph_ctx {
    const int *item_value;
    ka_conflict_fn conflict;
    void *ctx;
} graph_ctx;

static bool graph_conflict(void *ctx, size_t a, size_t b)
{
    graph_ctx *c = ctx;
    return c->conflict(c->ctx, (size_t)c->item_value[a], (size_t)c->item_value[b]);
}

int ka_plan_graph(const kg_graph *g, const int *order, size_t align, ka_conflict_fn conflict,
                  void *ctx, ka_graph_plan *p)
{
    memset(p, 0, sizeof(*p));
    size_t nv = g->n_values;
    int *last = malloc((nv ? nv : 1) * sizeof(int));
    int *pos = malloc((g->n_ops ? g->n_ops : 1) * sizeof(int));
    int *item_value = malloc((nv ? nv : 1) * sizeof(int));
    ka_item *items = malloc((nv ? nv : 1) * sizeof(ka_item));
    p->offset = malloc((nv ? nv : 1) * sizeof(size_t));
    int rc = BT_ENOMEM;
    if (!last || !pos || !item_value || !items || !p->offset)
        goto err;
    kg_last_uses(g, order, last);
    for (size_t s = 0; s < g->n_ops; s++)
        pos[order ? (size_t)order[s] : s] = (int)s;
    size_t n = 0;
    for (size_t v = 0; v < nv; v++) {
        const kg_value *val = &g->values[v];
        p->offset[v] = KA_NONE;
        if (val->kind != KG_INTER && val->kind != KG_OUTPUT)
            continue;
        if (val->producer < 0)
            continue;  /* never written: nothing to place */
        int first = pos[val->producer];
        int l = val->kind == KG_OUTPUT ? (int)g->n_ops : last[v];
        items[n] = (ka_item){val->bytes, first, l < first ? first : l, 0};
        item_value[n++] = (int)v;
    }
    graph_ctx gc = {item_value, conflict, ctx};
    rc = ka_plan(items, n, align, conflict ? graph_conflict : NULL, &gc, &p->arena);
    if (rc)
        goto err;
    for (size_t i = 0; i < n; i++)
        p->offset[item_value[i]] = items[i].offset;
    p->lower_bound = ka_peak_live(items, n);
    p->n_items = n;
    free(last);
    free(pos);
    free(item_value);
    free(items);
    return 0;
err:
    free(last);
    free(pos);
    free(item_value);
    free(items);
    ka_graph_plan_free(p);
    return rc;
}

void ka_graph_plan_free(ka_graph_plan *p)
{
    if (!p)
        return;
    free(p->offset);
    p->offset = NULL;
}
