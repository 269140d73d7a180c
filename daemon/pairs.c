/* Pair communicators and their transfer numbers (daemon/pairs.h). */
#include "daemon/pairs.h"

#include <stdlib.h>

#include "common/status.h"

/* One pair's communicator. */
typedef struct pair_state {
    uint32_t epoch;               /* 0: none */
    uint64_t last_seq;            /* the last number handed out on it */
} pair_state;

struct pair_table {
    size_t n;                     /* workers */
    pair_state *pairs;            /* n * n, only [lo * n + hi] with lo < hi used; owned */
};

pair_table *pairs_create(size_t n_workers)
{
    pair_table *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->n = n_workers;
    t->pairs = calloc(n_workers * n_workers + 1, sizeof(*t->pairs));
    if (!t->pairs) {
        free(t);
        return NULL;
    }
    return t;
}

void pairs_destroy(pair_table *t)
{
    if (!t)
        return;
    free(t->pairs);
    free(t);
}

static pair_state *pair_at(pair_table *t, int a, int b)
{
    if (a < 0 || b < 0 || a == b || (size_t)a >= t->n || (size_t)b >= t->n)
        return NULL;
    size_t lo = (size_t)(a < b ? a : b), hi = (size_t)(a < b ? b : a);
    return &t->pairs[lo * t->n + hi];
}

int pairs_made(pair_table *t, int a, int b, uint32_t epoch)
{
    pair_state *p = pair_at(t, a, b);
    if (!p || epoch == 0)
        return BT_EINVAL;
    p->epoch = epoch;
    p->last_seq = 0;
    return 0;
}

void pairs_forget(pair_table *t, int w)
{
    for (size_t k = 0; k < t->n; k++) {
        pair_state *p = pair_at(t, w, (int)k);
        if (p)
            *p = (pair_state){0, 0};
    }
}

bool pairs_reserve(pair_table *t, int a, int b, uint32_t n, uint32_t *epoch, uint64_t *seq)
{
    pair_state *p = pair_at(t, a, b);
    if (!p || !p->epoch)
        return false;
    *epoch = p->epoch;
    *seq = p->last_seq + 1;
    p->last_seq += n;
    return true;
}
