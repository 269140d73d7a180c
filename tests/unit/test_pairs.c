/* The conductor's pair communicators (daemon/pairs.c): transfers of a pair
 * are numbered 1, 2, ... on one counter for both directions, a part of N
 * chunks reserves N numbers, a new communicator (epoch) numbers from 1
 * again, and a lost worker's pairs have none until the next one forms. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/status.h"
#include "daemon/pairs.h"

static void test_numbering(void **state)
{
    (void)state;
    pair_table *t = pairs_create(4);
    assert_non_null(t);
    uint32_t epoch = 0;
    uint64_t seq = 0;
    /* No communicator yet: nothing can be numbered. */
    assert_false(pairs_reserve(t, 0, 1, 1, &epoch, &seq));
    assert_int_equal(pairs_made(t, 0, 1, 1), 0);
    assert_true(pairs_reserve(t, 0, 1, 1, &epoch, &seq));
    assert_int_equal(epoch, 1);
    assert_int_equal(seq, 1);
    /* The other direction shares the counter: NCCL orders the pair's sends
     * and receives together. */
    assert_true(pairs_reserve(t, 1, 0, 1, &epoch, &seq));
    assert_int_equal(seq, 2);
    /* A part of three chunks takes 3, 4, 5. */
    assert_true(pairs_reserve(t, 0, 1, 3, &epoch, &seq));
    assert_int_equal(seq, 3);
    assert_true(pairs_reserve(t, 1, 0, 1, &epoch, &seq));
    assert_int_equal(seq, 6);
    /* Another pair counts on its own. */
    assert_int_equal(pairs_made(t, 3, 1, 7), 0);
    assert_true(pairs_reserve(t, 1, 3, 1, &epoch, &seq));
    assert_int_equal(epoch, 7);
    assert_int_equal(seq, 1);
    /* A new communicator of (0, 1) starts over. */
    assert_int_equal(pairs_made(t, 1, 0, 2), 0);
    assert_true(pairs_reserve(t, 0, 1, 1, &epoch, &seq));
    assert_int_equal(epoch, 2);
    assert_int_equal(seq, 1);
    pairs_destroy(t);
}

static void test_forget(void **state)
{
    (void)state;
    pair_table *t = pairs_create(3);
    assert_non_null(t);
    uint32_t epoch;
    uint64_t seq;
    assert_int_equal(pairs_made(t, 0, 1, 1), 0);
    assert_int_equal(pairs_made(t, 0, 2, 1), 0);
    assert_int_equal(pairs_made(t, 1, 2, 1), 0);
    /* Worker 1 is lost: its pairs, and only those, have no communicator. */
    pairs_forget(t, 1);
    assert_false(pairs_reserve(t, 0, 1, 1, &epoch, &seq));
    assert_false(pairs_reserve(t, 2, 1, 1, &epoch, &seq));
    assert_true(pairs_reserve(t, 2, 0, 1, &epoch, &seq));
    assert_int_equal(seq, 1);
    pairs_destroy(t);
}

static void test_bad_pairs(void **state)
{
    (void)state;
    pair_table *t = pairs_create(2);
    assert_non_null(t);
    uint32_t epoch;
    uint64_t seq;
    assert_int_equal(pairs_made(t, 0, 0, 1), BT_EINVAL);
    assert_int_equal(pairs_made(t, 0, 2, 1), BT_EINVAL);
    assert_int_equal(pairs_made(t, -1, 1, 1), BT_EINVAL);
    assert_int_equal(pairs_made(t, 0, 1, 0), BT_EINVAL);
    assert_false(pairs_reserve(t, 1, 1, 1, &epoch, &seq));
    assert_false(pairs_reserve(t, 0, 5, 1, &epoch, &seq));
    pairs_forget(t, 9);
    pairs_destroy(t);
    pairs_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numbering),
        cmocka_unit_test(test_forget),
        cmocka_unit_test(test_bad_pairs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
