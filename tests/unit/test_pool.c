/* The pool allocator (worker/pool.c): random allocation and free sequences
 * checked step by step against a shadow model of the pool (one owner per
 * granule), plus the edge cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/pool.h"

#define G WK_POOL_ALIGN

typedef struct live {
    wk_pool_blk *b;
    uint64_t off, granules;
} live;

typedef struct shadow {
    uint32_t *owner;     /* per granule: 0 free, else 1 + index into lives */
    uint64_t granules;
    live *lives;
    size_t n, cap;
    uint64_t used;       /* granules */
} shadow;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    /* xorshift64*: deterministic, so a failure reproduces. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static uint64_t longest_free_run(const shadow *s)
{
    uint64_t best = 0, run = 0;
    for (uint64_t i = 0; i < s->granules; i++) {
        run = s->owner[i] ? 0 : run + 1;
        if (run > best)
            best = run;
    }
    return best;
}

static void check_against(const wk_pool *p, const shadow *s)
{
    char err[256];
    if (wk_pool_check(p, err, sizeof(err)) != 0)
        fail_msg("pool invariant: %s", err);
    wk_pool_stats st;
    wk_pool_get_stats(p, &st);
    assert_int_equal(st.size, s->granules * G);
    assert_int_equal(st.used, s->used * G);
    assert_int_equal(st.free, (s->granules - s->used) * G);
    assert_int_equal(st.n_allocated, s->n);
    assert_int_equal(st.largest_free, longest_free_run(s) * G);
    double frag = st.free ? 1.0 - (double)st.largest_free / (double)st.free : 0.0;
    assert_true(st.fragmentation == frag);
}

static void shadow_alloc(wk_pool *p, shadow *s, uint64_t nbytes)
{
    uint64_t off = UINT64_MAX;
    wk_pool_blk *b = wk_pool_alloc(p, nbytes, &off);
    uint64_t g = nbytes ? (nbytes + G - 1) / G : 1;
    if (!b) {
        /* A refusal is only legal when no free run could hold it. */
        assert_true(longest_free_run(s) < g);
        return;
    }
    assert_int_equal(off % G, 0);
    assert_int_equal(wk_pool_blk_offset(b), off);
    assert_int_equal(wk_pool_blk_size(b), g * G);
    assert_true(off / G + g <= s->granules);
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->lives = realloc(s->lives, s->cap * sizeof(*s->lives));
        assert_non_null(s->lives);
    }
    for (uint64_t i = off / G; i < off / G + g; i++) {
        if (s->owner[i])
            fail_msg("allocation at %llu overlaps a live block", (unsigned long long)off);
        s->owner[i] = (uint32_t)s->n + 1;
    }
    s->lives[s->n++] = (live){b, off / G, g};
    s->used += g;
}

static void shadow_free(wk_pool *p, shadow *s, size_t k)
{
    live l = s->lives[k];
    for (uint64_t i = l.off; i < l.off + l.granules; i++)
        s->owner[i] = 0;
    s->used -= l.granules;
    wk_pool_free(p, l.b);
    s->lives[k] = s->lives[--s->n];
    if (k < s->n)
        for (uint64_t i = s->lives[k].off; i < s->lives[k].off + s->lives[k].granules; i++)
            s->owner[i] = (uint32_t)k + 1;
}

/* Sizes from a few bytes to a sizeable fraction of the pool, skewed small
 * like real tensors. */
static uint64_t random_size(uint64_t pool_bytes)
{
    switch (rnd() % 8) {
    case 0: return rnd() % 64;
    case 1: case 2: return rnd() % (4 * G);
    case 3: case 4: return rnd() % (64 * G);
    case 5: return G * (1 + rnd() % 32);
    case 6: return rnd() % (pool_bytes / 16);
    default: return rnd() % (pool_bytes / 4);
    }
}

static void run_random(uint64_t pool_bytes, int steps, int free_bias)
{
    wk_pool *p = wk_pool_create(pool_bytes);
    assert_non_null(p);
    shadow s = {0};
    s.granules = pool_bytes / G;
    s.owner = calloc(s.granules, sizeof(*s.owner));
    assert_non_null(s.owner);
    check_against(p, &s);
    for (int step = 0; step < steps; step++) {
        if (s.n && (int)(rnd() % 100) < free_bias)
            shadow_free(p, &s, rnd() % s.n);
        else
            shadow_alloc(p, &s, random_size(pool_bytes));
        check_against(p, &s);
    }
    /* Free everything in random order: the pool must coalesce back into one
     * block spanning all of it. */
    while (s.n) {
        shadow_free(p, &s, rnd() % s.n);
        check_against(p, &s);
    }
    wk_pool_stats st;
    wk_pool_get_stats(p, &st);
    assert_int_equal(st.n_free_blocks, 1);
    assert_int_equal(st.largest_free, s.granules * G);
    assert_true(st.fragmentation == 0.0);
    free(s.owner);
    free(s.lives);
    wk_pool_destroy(p);
}

static void test_random_small_pool(void **state)
{
    (void)state;
    run_random(64 * G, 4000, 45);
}

static void test_random_medium_pool(void **state)
{
    (void)state;
    run_random(1u << 20, 6000, 40);
    run_random(1u << 20, 6000, 60);
}

static void test_random_odd_sized_pool(void **state)
{
    (void)state;
    /* Not a power of two, and a tail that is not a whole granule. */
    run_random(3 * 1000 * G + 17, 5000, 50);
}

static void test_edges(void **state)
{
    (void)state;
    assert_null(wk_pool_create(G - 1));
    wk_pool *p = wk_pool_create(16 * G);
    assert_non_null(p);
    uint64_t off;
    assert_null(wk_pool_alloc(p, 16 * G + 1, &off));
    /* Zero bytes still takes one granule: every tensor has its own offset. */
    wk_pool_blk *z = wk_pool_alloc(p, 0, &off);
    assert_non_null(z);
    assert_int_equal(wk_pool_blk_size(z), G);
    wk_pool_blk *rest = wk_pool_alloc(p, 15 * G, &off);
    assert_non_null(rest);
    assert_int_equal(off, G);
    uint64_t off2;
    assert_null(wk_pool_alloc(p, 1, &off2));
    wk_pool_stats st;
    wk_pool_get_stats(p, &st);
    assert_int_equal(st.free, 0);
    assert_true(st.fragmentation == 0.0);
    wk_pool_free(p, z);
    wk_pool_free(p, NULL);
    wk_pool_free(p, rest);
    wk_pool_get_stats(p, &st);
    assert_int_equal(st.n_free_blocks, 1);
    assert_int_equal(st.largest_free, 16 * G);
    wk_pool_destroy(p);
    wk_pool_destroy(NULL);
}

/* A free block whose size is not a class boundary can be allocated whole:
 * the rounded search alone would miss it. */
static void test_exact_largest_fits(void **state)
{
    (void)state;
    wk_pool *p = wk_pool_create(200 * G);
    uint64_t off;
    wk_pool_blk *a = wk_pool_alloc(p, 100 * G, &off);
    wk_pool_blk *b = wk_pool_alloc(p, 1 * G, &off);
    assert_non_null(a);
    assert_non_null(b);
    wk_pool_free(p, a);
    /* Free: 100 granules at 0 and 99 at 101. */
    wk_pool_stats st;
    wk_pool_get_stats(p, &st);
    assert_int_equal(st.largest_free, 100 * G);
    assert_int_equal(st.n_free_blocks, 2);
    assert_true(st.fragmentation > 0.49 && st.fragmentation < 0.51);
    wk_pool_blk *c = wk_pool_alloc(p, st.largest_free, &off);
    assert_non_null(c);
    assert_int_equal(off, 0);
    wk_pool_blk *d = wk_pool_alloc(p, 99 * G, &off);
    assert_non_null(d);
    assert_int_equal(off, 101 * G);
    char err[256];
    assert_int_equal(wk_pool_check(p, err, sizeof(err)), 0);
    wk_pool_free(p, b);
    wk_pool_free(p, d);
    wk_pool_free(p, c);
    wk_pool_get_stats(p, &st);
    assert_int_equal(st.n_free_blocks, 1);
    wk_pool_destroy(p);
}

/* Coalescing in each direction: free the middle last, first, and between. */
static void test_coalesce_orders(void **state)
{
    (void)state;
    static const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                     {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int o = 0; o < 6; o++) {
        wk_pool *p = wk_pool_create(3 * G);
        wk_pool_blk *b[3];
        uint64_t off;
        for (int i = 0; i < 3; i++) {
            b[i] = wk_pool_alloc(p, G, &off);
            assert_int_equal(off, (uint64_t)i * G);
        }
        for (int i = 0; i < 3; i++) {
            wk_pool_free(p, b[orders[o][i]]);
            char err[256];
            if (wk_pool_check(p, err, sizeof(err)) != 0)
                fail_msg("order %d step %d: %s", o, i, err);
        }
        wk_pool_stats st;
        wk_pool_get_stats(p, &st);
        assert_int_equal(st.n_free_blocks, 1);
        wk_pool_destroy(p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_exact_largest_fits),
        cmocka_unit_test(test_coalesce_orders),
        cmocka_unit_test(test_random_small_pool),
        cmocka_unit_test(test_random_medium_pool),
        cmocka_unit_test(test_random_odd_sized_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
