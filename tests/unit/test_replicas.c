/* Replicas (daemon/replicas.c): a request is pinned to one replica of a
 * model at its first pick and stays there; picks go to the least loaded
 * ready replica (pins per max_batch, over every replicated model a worker
 * holds), in turn under round_robin, and to the longest reported cached
 * prefix under cache_aware unless that replica is a batch busier than the
 * least loaded; a replica that is not ready takes nothing new. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/diag.h"
#include "config/config.h"
#include "daemon/replicas.h"

/* Workers a, b, c; model m on all three (max_batch 2), model n on a and b
 * (max_batch 1, round robin), model k on a, b and c (cache aware), model s
 * on c alone. */
static const char yaml[] =
    "version: 1\n"
    "workers:\n"
    "  - {name: a, device: cpu}\n"
    "  - {name: b, device: cpu}\n"
    "  - {name: c, device: cpu}\n"
    "models:\n"
    "  - {name: m, backend: echo, workers: [a, b, c], max_batch: 2, routing: least_loaded}\n"
    "  - {name: n, backend: echo, workers: [a, b], routing: round_robin}\n"
    "  - {name: k, backend: echo, workers: [a, b, c], max_batch: 4}\n"
    "  - {name: s, backend: echo, worker: c}\n";

enum { M = 0, N = 1, K = 2, S = 3, A = 0, B = 1, C = 2 };

typedef struct harness {
    cfg_config *cfg;
    replicas *rs;
    bool up[3];
} harness;

static bool is_up(void *arg, int w)
{
    return ((harness *)arg)->up[w];
}

static int setup(void **state)
{
    harness *h = calloc(1, sizeof(*h));
    bt_diag *d = bt_diag_create("r.yaml");
    assert_int_equal(cfg_load_string(yaml, strlen(yaml), "r.yaml", d, &h->cfg), 0);
    bt_diag_destroy(d);
    assert_int_equal(replicas_create(h->cfg, is_up, h, &h->rs), 0);
    h->up[A] = h->up[B] = h->up[C] = true;
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    harness *h = *state;
    replicas_destroy(h->rs);
    cfg_config_destroy(h->cfg);
    free(h);
    return 0;
}

static uint32_t pinned(harness *h, int model, size_t k)
{
    replicas_stats st;
    assert_true(replicas_stats_get(h->rs, model, k, &st));
    return st.pinned;
}

static void test_sticky_and_balanced(void **state)
{
    harness *h = *state;
    /* Three requests spread over the three replicas. */
    int w1 = replicas_pick(h->rs, 1, M, NULL), w2 = replicas_pick(h->rs, 2, M, NULL),
        w3 = replicas_pick(h->rs, 3, M, NULL);
    assert_true(w1 >= 0 && w2 >= 0 && w3 >= 0);
    assert_true(w1 != w2 && w2 != w3 && w1 != w3);
    /* A request keeps its replica, whatever the load does since. */
    for (uint64_t r = 10; r < 14; r++)
        replicas_pick(h->rs, r, M, NULL);
    assert_int_equal(replicas_pick(h->rs, 1, M, NULL), w1);
    assert_int_equal(replicas_pinned(h->rs, 1, M), w1);
    assert_int_equal(replicas_pinned(h->rs, 99, M), -1);
    assert_int_equal(pinned(h, M, 0) + pinned(h, M, 1) + pinned(h, M, 2), 7);
    /* Seven over three: no replica has two more than another. */
    for (size_t k = 0; k < 3; k++)
        assert_true(pinned(h, M, k) >= 2 && pinned(h, M, k) <= 3);
    /* The ends free their places. */
    for (uint64_t r = 10; r < 14; r++)
        replicas_unpin(h->rs, r);
    replicas_unpin(h->rs, 12); /* twice: ignored */
    assert_int_equal(pinned(h, M, 0) + pinned(h, M, 1) + pinned(h, M, 2), 3);
    /* Not replicated: no pick. */
    assert_int_equal(replicas_pick(h->rs, 1, S, NULL), -1);
    assert_int_equal(replicas_pick(h->rs, 1, 42, NULL), -1);
}

static void test_load_counts_every_model(void **state)
{
    harness *h = *state;
    /* Two requests of n (max_batch 1) on a: a full batch of work each. */
    h->up[B] = false;
    assert_int_equal(replicas_pick(h->rs, 1, N, NULL), A);
    assert_int_equal(replicas_pick(h->rs, 2, N, NULL), A);
    h->up[B] = true;
    /* m's requests now avoid a (load 2 against 0) until b and c carry as
     * much: four requests of m at max_batch 2 make 2 on each. */
    int on_a = 0;
    for (uint64_t r = 10; r < 18; r++)
        on_a += replicas_pick(h->rs, r, M, NULL) == A;
    assert_int_equal(on_a, 0);
    assert_int_equal(pinned(h, M, 1), 4);
    assert_int_equal(pinned(h, M, 2), 4);
    /* Unpinning request 1 frees both its models' places on a. */
    replicas_unpin(h->rs, 1);
    replicas_unpin(h->rs, 2);
    assert_int_equal(replicas_pick(h->rs, 20, M, NULL), A);
}

static void test_not_ready(void **state)
{
    harness *h = *state;
    h->up[A] = h->up[C] = false;
    for (uint64_t r = 1; r <= 4; r++)
        assert_int_equal(replicas_pick(h->rs, r, M, NULL), B);
    /* A request pinned to a replica stays there even once it is down: it
     * ends with it (replicas_pinned_to), it does not move. */
    h->up[B] = false;
    assert_int_equal(replicas_pick(h->rs, 1, M, NULL), B);
    /* None ready: nothing is pinned. */
    assert_int_equal(replicas_pick(h->rs, 9, M, NULL), -1);
    assert_int_equal(replicas_pinned(h->rs, 9, M), -1);
    uint64_t *keys;
    size_t n;
    assert_int_equal(replicas_pinned_to(h->rs, B, &keys, &n), 0);
    assert_int_equal(n, 4);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += keys[i];
    assert_int_equal(sum, 1 + 2 + 3 + 4);
    free(keys);
    assert_int_equal(replicas_pinned_to(h->rs, A, &keys, &n), 0);
    assert_int_equal(n, 0);
    free(keys);
    /* Back: new requests reach it again. */
    h->up[A] = true;
    assert_int_equal(replicas_pick(h->rs, 9, M, NULL), A);
}

static void test_round_robin(void **state)
{
    harness *h = *state;
    /* In turn, whatever the load: a, b, a, b although nothing ends. */
    int seen[4];
    for (uint64_t r = 0; r < 4; r++)
        seen[r] = replicas_pick(h->rs, r + 1, N, NULL);
    assert_int_equal(seen[0], seen[2]);
    assert_int_equal(seen[1], seen[3]);
    assert_int_not_equal(seen[0], seen[1]);
    replicas_stats st;
    assert_true(replicas_stats_get(h->rs, N, 0, &st));
    assert_int_equal(st.picks[REPLICAS_BY_TURN], 2);
}

static void test_cache_aware(void **state)
{
    harness *h = *state;
    const uint64_t conv[4] = {11, 12, 13, 14}, other[2] = {21, 22};
    /* b reports the first three blocks of a conversation, c one block of
     * another prefix that the request shares only in its first. */
    const uint64_t on_c[2] = {11, 99};
    assert_int_equal(replicas_cache_event(h->rs, B, "k", conv, 3, NULL, 0), 0);
    assert_int_equal(replicas_cache_event(h->rs, C, "k", on_c, 2, NULL, 0), 0);
    /* Unknown models and workers that hold no replica are ignored. */
    assert_int_equal(replicas_cache_event(h->rs, C, "s", conv, 4, NULL, 0), 0);
    assert_int_equal(replicas_cache_event(h->rs, A, "nope", conv, 4, NULL, 0), 0);
    replicas_key key = {conv, 4};
    assert_int_equal(replicas_pick(h->rs, 1, K, &key), B);
    replicas_stats st;
    assert_true(replicas_stats_get(h->rs, K, 1, &st));
    assert_int_equal(st.picks[REPLICAS_BY_CACHE], 1);
    assert_int_equal(st.cached_blocks, 3);
    /* No match: the least loaded, which is not b now. */
    replicas_key none = {other, 2};
    assert_int_not_equal(replicas_pick(h->rs, 2, K, &none), B);
    /* Up to a batch (max_batch 4) busier than the least loaded (c, idle),
     * b still takes the conversation; beyond that it goes elsewhere. */
    for (uint64_t r = 10; r < 14; r++) {
        replicas_key again = {conv, 4};
        assert_int_equal(replicas_pick(h->rs, r, K, &again), B);
    }
    assert_int_equal(pinned(h, K, 1), 5);
    int w = replicas_pick(h->rs, 20, K, &key);
    assert_int_not_equal(w, B);
    assert_true(replicas_stats_get(h->rs, K, (size_t)w, &st));
    assert_true(st.picks[REPLICAS_BY_LOAD] >= 1);
    for (uint64_t r = 10; r < 14; r++)
        replicas_unpin(h->rs, r);
    /* Evicted on b: c's one shared block is now the longest match. */
    assert_int_equal(replicas_cache_event(h->rs, B, "k", NULL, 0, conv, 3), 0);
    assert_int_equal(replicas_pick(h->rs, 30, K, &key), C);
    /* A block two entries hold stays until both went. */
    assert_int_equal(replicas_cache_event(h->rs, A, "k", conv, 2, NULL, 0), 0);
    assert_int_equal(replicas_cache_event(h->rs, A, "k", conv, 2, NULL, 0), 0);
    assert_int_equal(replicas_cache_event(h->rs, A, "k", NULL, 0, conv, 2), 0);
    assert_int_equal(replicas_pick(h->rs, 31, K, &key), A);
    /* Lost or restarted workers: nothing of theirs left. */
    replicas_worker_reset(h->rs, A);
    replicas_worker_reset(h->rs, C);
    for (size_t k = 0; k < 3; k++) {
        assert_true(replicas_stats_get(h->rs, K, k, &st));
        assert_int_equal(st.cached_blocks, 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sticky_and_balanced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_counts_every_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_ready, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_robin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_aware, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
