/* Two-level segregated fit (TLSF) over a pool, in units of WK_POOL_ALIGN
 * bytes ("granules").
 *
 * Size classes: a first level by the position of the highest set bit and a
 * second level splitting each power-of-two range into 16 linear steps, so a
 * class spans at most 1/16 of its sizes and the waste of a good fit stays
 * under about 6%.  Sizes below 16 granules have exact classes.  A search
 * rounds the request up to the next class boundary, so that the head of any
 * non-empty class found through the bitmaps fits without walking a list.
 * When that finds nothing, the request's own class is walked once: a block
 * that fits may sit there, and without the walk a pool could refuse an
 * allocation of exactly its largest free block (which heartbeats report as
 * "could be allocated now"). */
#include "worker/pool.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#define SL_LOG2 4u
#define SL_COUNT (1u << SL_LOG2)
#define FL_COUNT 64u

struct wk_pool_blk {
    uint64_t off;                    /* granules from the start of the pool */
    uint64_t len;                    /* granules */
    wk_pool_blk *prev_phys, *next_phys; /* neighbours in address order */
    wk_pool_blk *prev_free, *next_free; /* links in its class list while free;
                                           next_free also links spare structs */
    bool free;
};

struct wk_pool {
    uint64_t granules;               /* pool size in granules */
    uint64_t used;                   /* granules in allocated blocks */
    uint64_t n_alloc, n_free;        /* blocks of each kind */
    uint64_t fl_bitmap;              /* bit f: some class of first level f is non-empty */
    uint32_t sl_bitmap[FL_COUNT];    /* bit s: class (f, s) is non-empty */
    wk_pool_blk *heads[FL_COUNT][SL_COUNT];
    wk_pool_blk *first;              /* the block at offset 0 (never merged away) */
    wk_pool_blk *spare;              /* recycled block structs */
};

static unsigned fls64(uint64_t v)
{
    return 63u - (unsigned)__builtin_clzll(v);
}

/* The class holding blocks of G granules. */
static void class_of(uint64_t g, unsigned *fl, unsigned *sl)
{
    if (g < SL_COUNT) {
        *fl = 0;
        *sl = (unsigned)g;
        return;
    }
    unsigned f = fls64(g);
    *fl = f - SL_LOG2 + 1;
    *sl = (unsigned)(g >> (f - SL_LOG2)) - SL_COUNT;
}

/* The first class whose every block holds G granules. */
static void class_search(uint64_t g, unsigned *fl, unsigned *sl)
{
    if (g >= SL_COUNT)
        g += (UINT64_C(1) << (fls64(g) - SL_LOG2)) - 1;
    class_of(g, fl, sl);
}

static void list_insert(wk_pool *p, wk_pool_blk *b)
{
    unsigned fl, sl;
    class_of(b->len, &fl, &sl);
    b->free = true;
    b->prev_free = NULL;
    b->next_free = p->heads[fl][sl];
    if (b->next_free)
        b->next_free->prev_free = b;
    p->heads[fl][sl] = b;
    p->fl_bitmap |= UINT64_C(1) << fl;
    p->sl_bitmap[fl] |= 1u << sl;
    p->n_free++;
}

static void list_remove(wk_pool *p, wk_pool_blk *b)
{
    unsigned fl, sl;
    class_of(b->len, &fl, &sl);
    if (b->prev_free)
        b->prev_free->next_free = b->next_free;
    else
        p->heads[fl][sl] = b->next_free;
    if (b->next_free)
        b->next_free->prev_free = b->prev_free;
    if (!p->heads[fl][sl]) {
        p->sl_bitmap[fl] &= ~(1u << sl);
        if (!p->sl_bitmap[fl])
            p->fl_bitmap &= ~(UINT64_C(1) << fl);
    }
    b->free = false;
    b->prev_free = b->next_free = NULL;
    p->n_free--;
}

static wk_pool_blk *blk_new(wk_pool *p)
{
    wk_pool_blk *b = p->spare;
    if (b)
        p->spare = b->next_free;
    else if (!(b = malloc(sizeof(*b))))
        return NULL;
    *b = (wk_pool_blk){0};
    return b;
}

static void blk_recycle(wk_pool *p, wk_pool_blk *b)
{
    b->next_free = p->spare;
    p->spare = b;
}

wk_pool *wk_pool_create(uint64_t size)
{
    uint64_t granules = size / WK_POOL_ALIGN;
    if (granules == 0)
        return NULL;
    wk_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    wk_pool_blk *b = blk_new(p);
    if (!b) {
        free(p);
        return NULL;
    }
    p->granules = granules;
    b->len = granules;
    p->first = b;
    list_insert(p, b);
    return p;
}

void wk_pool_destroy(wk_pool *p)
{
    if (!p)
        return;
    for (wk_pool_blk *b = p->first, *n; b; b = n) {
        n = b->next_phys;
        free(b);
    }
    for (wk_pool_blk *b = p->spare, *n; b; b = n) {
        n = b->next_free;
        free(b);
    }
    free(p);
}

/* Head of the first non-empty class at or above (fl, sl), or NULL. */
static wk_pool_blk *find_class(const wk_pool *p, unsigned fl, unsigned sl)
{
    if (fl >= FL_COUNT)
        return NULL;
    uint32_t sl_map = sl < SL_COUNT ? p->sl_bitmap[fl] & (~0u << sl) : 0;
    if (!sl_map) {
        uint64_t fl_map = fl + 1 < FL_COUNT ? p->fl_bitmap & (~UINT64_C(0) << (fl + 1)) : 0;
        if (!fl_map)
            return NULL;
        fl = (unsigned)__builtin_ctzll(fl_map);
        sl_map = p->sl_bitmap[fl];
    }
    return p->heads[fl][__builtin_ctz(sl_map)];
}

wk_pool_blk *wk_pool_alloc(wk_pool *p, uint64_t nbytes, uint64_t *offset)
{
    if (nbytes == 0)
        nbytes = 1;
    if (nbytes > p->granules * WK_POOL_ALIGN)
        return NULL;
    uint64_t g = (nbytes + WK_POOL_ALIGN - 1) / WK_POOL_ALIGN;
    unsigned fl, sl;
    class_search(g, &fl, &sl);
    wk_pool_blk *b = find_class(p, fl, sl);
    if (!b) {
        class_of(g, &fl, &sl);
        for (b = p->heads[fl][sl]; b && b->len < g; b = b->next_free)
            ;
        if (!b)
            return NULL;
    }
    list_remove(p, b);
    if (b->len > g) {
        wk_pool_blk *r = blk_new(p);
        if (!r) {
            list_insert(p, b);
            return NULL;
        }
        r->off = b->off + g;
        r->len = b->len - g;
        r->prev_phys = b;
        r->next_phys = b->next_phys;
        if (r->next_phys)
            r->next_phys->prev_phys = r;
        b->next_phys = r;
        b->len = g;
        list_insert(p, r);
    }
    p->used += b->len;
    p->n_alloc++;
    *offset = b->off * WK_POOL_ALIGN;
    return b;
}

/* Merges B's physical successor N into B; N is not in any list. */
static void absorb_next(wk_pool *p, wk_pool_blk *b, wk_pool_blk *n)
{
    b->len += n->len;
    b->next_phys = n->next_phys;
    if (b->next_phys)
        b->next_phys->prev_phys = b;
    blk_recycle(p, n);
}

void wk_pool_free(wk_pool *p, wk_pool_blk *b)
{
    if (!b)
        return;
    p->used -= b->len;
    p->n_alloc--;
    wk_pool_blk *n = b->next_phys;
    if (n && n->free) {
        list_remove(p, n);
        absorb_next(p, b, n);
    }
    wk_pool_blk *prev = b->prev_phys;
    if (prev && prev->free) {
        list_remove(p, prev);
        absorb_next(p, prev, b);
        b = prev;
    }
    list_insert(p, b);
}

uint64_t wk_pool_blk_offset(const wk_pool_blk *b)
{
    return b->off * WK_POOL_ALIGN;
}

uint64_t wk_pool_blk_size(const wk_pool_blk *b)
{
    return b->len * WK_POOL_ALIGN;
}

void wk_pool_get_stats(const wk_pool *p, wk_pool_stats *out)
{
    *out = (wk_pool_stats){0};
    out->size = p->granules * WK_POOL_ALIGN;
    out->used = p->used * WK_POOL_ALIGN;
    out->free = out->size - out->used;
    out->n_allocated = p->n_alloc;
    out->n_free_blocks = p->n_free;
    if (p->fl_bitmap) {
        /* The largest block sits in the highest non-empty class; classes
         * span a range of sizes, so that one list is walked. */
        unsigned fl = fls64(p->fl_bitmap);
        unsigned sl = 31u - (unsigned)__builtin_clz(p->sl_bitmap[fl]);
        uint64_t best = 0;
        for (const wk_pool_blk *b = p->heads[fl][sl]; b; b = b->next_free)
            if (b->len > best)
                best = b->len;
        out->largest_free = best * WK_POOL_ALIGN;
    }
    out->fragmentation =
        out->free ? 1.0 - (double)out->largest_free / (double)out->free : 0.0;
}

int wk_pool_check(const wk_pool *p, char *err, size_t errlen)
{
    uint64_t at = 0, used = 0, n_alloc = 0, n_free = 0;
    const wk_pool_blk *prev = NULL;
    for (const wk_pool_blk *b = p->first; b; prev = b, b = b->next_phys) {
        if (b->off != at || b->len == 0 || b->prev_phys != prev) {
            snprintf(err, errlen, "block at granule %llu breaks the tiling (expected %llu)",
                     (unsigned long long)b->off, (unsigned long long)at);
            return -1;
        }
        if (b->free && prev && prev->free) {
            snprintf(err, errlen, "free neighbours at granules %llu and %llu were not merged",
                     (unsigned long long)prev->off, (unsigned long long)b->off);
            return -1;
        }
        at += b->len;
        if (b->free)
            n_free++;
        else
            used += b->len, n_alloc++;
    }
    if (at != p->granules || used != p->used || n_alloc != p->n_alloc || n_free != p->n_free) {
        snprintf(err, errlen, "counters disagree: tiled %llu/%llu, used %llu/%llu, blocks %llu/%llu "
                 "allocated, %llu/%llu free", (unsigned long long)at,
                 (unsigned long long)p->granules, (unsigned long long)used,
                 (unsigned long long)p->used, (unsigned long long)n_alloc,
                 (unsigned long long)p->n_alloc, (unsigned long long)n_free,
                 (unsigned long long)p->n_free);
        return -1;
    }
    uint64_t listed = 0;
    for (unsigned fl = 0; fl < FL_COUNT; fl++) {
        for (unsigned sl = 0; sl < SL_COUNT; sl++) {
            const wk_pool_blk *h = p->heads[fl][sl];
            bool bit = (p->sl_bitmap[fl] >> sl) & 1u;
            if (bit != (h != NULL) || (h && !((p->fl_bitmap >> fl) & 1u))) {
                snprintf(err, errlen, "bitmap of class (%u, %u) disagrees with its list", fl, sl);
                return -1;
            }
            for (const wk_pool_blk *b = h; b; b = b->next_free) {
                unsigned f, s;
                class_of(b->len, &f, &s);
                if (!b->free || f != fl || s != sl) {
                    snprintf(err, errlen, "block at granule %llu is in the wrong list",
                             (unsigned long long)b->off);
                    return -1;
                }
                listed++;
            }
        }
        if (!p->sl_bitmap[fl] && ((p->fl_bitmap >> fl) & 1u)) {
            snprintf(err, errlen, "first-level bit %u set over empty classes", fl);
            return -1;
        }
    }
    if (listed != n_free) {
        snprintf(err, errlen, "%llu free blocks listed, %llu in the pool",
                 (unsigned long long)listed, (unsigned long long)n_free);
        return -1;
    }
    return 0;
}
