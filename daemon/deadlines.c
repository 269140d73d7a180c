/* A min-heap of request deadlines (daemon/deadlines.h). */
#include <stdlib.h>

#include "common/vec.h"
#include "daemon/deadlines.h"

void dl_init(dl_heap *h)
{
    h->v = NULL;
    h->n = h->cap = 0;
}

void dl_free(dl_heap *h)
{
    free(h->v);
    dl_init(h);
}

uint64_t dl_next(const dl_heap *h)
{
    return h->n ? h->v[0].at_ms : UINT64_MAX;
}

static void swap(dl_heap *h, size_t a, size_t b)
{
    dl_entry t = h->v[a];
    h->v[a] = h->v[b];
    h->v[b] = t;
}

/* Restores the heap below position I. */
static void sift_down(dl_heap *h, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && h->v[l].at_ms < h->v[m].at_ms)
            m = l;
        if (r < h->n && h->v[r].at_ms < h->v[m].at_ms)
            m = r;
        if (m == i)
            return;
        swap(h, i, m);
        i = m;
    }
}

int dl_push(dl_heap *h, uint64_t at_ms, uint64_t key)
{
    int rc = BT_RESERVE(h->v, h->n, h->cap, 64);
    if (rc < 0)
        return rc;
    size_t i = h->n++;
    h->v[i] = (dl_entry){at_ms, key};
    while (i > 0 && h->v[(i - 1) / 2].at_ms > h->v[i].at_ms) {
        swap(h, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    return 0;
}

bool dl_pop_due(dl_heap *h, uint64_t now_ms, dl_entry *out)
{
    if (h->n == 0 || h->v[0].at_ms > now_ms)
        return false;
    *out = h->v[0];
    h->v[0] = h->v[--h->n];
    sift_down(h, 0);
    return true;
}

void dl_compact(dl_heap *h, size_t live, dl_live_fn is_live, void *arg)
{
    if (h->n <= 2 * live + 64)
        return;
    size_t n = 0;
    for (size_t i = 0; i < h->n; i++)
        if (is_live(arg, h->v[i].key, h->v[i].at_ms))
            h->v[n++] = h->v[i];
    h->n = n;
    for (size_t start = n / 2; start-- > 0;)
        sift_down(h, start);
}
