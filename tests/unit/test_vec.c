/* Arrays grown by doubling (common/vec.h): BT_RESERVE's first allocation
 * and doubling, BT_RESERVE_N's doubling until MORE fit, the contents kept
 * across growth, and a size that cannot be allocated refused with the
 * array unchanged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "common/vec.h"

static void test_reserve_one(void **state)
{
    (void)state;
    int *v = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(BT_RESERVE(v, n, cap, 4), 0);
    assert_non_null(v);
    assert_int_equal(cap, 4);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(BT_RESERVE(v, n, cap, 4), 0);
        v[n++] = i;
    }
    /* 4, 8, 16, 32, 64, 128: doubled only when full. */
    assert_int_equal(cap, 128);
    for (int i = 0; i < 100; i++)
        assert_int_equal(v[i], i);
    /* Room enough: nothing moves. */
    int *before = v;
    assert_int_equal(BT_RESERVE(v, n, cap, 4), 0);
    assert_ptr_equal(v, before);
    assert_int_equal(cap, 128);
    free(v);
}

static void test_reserve_n(void **state)
{
    (void)state;
    char *b = NULL;
    size_t len = 0, cap = 0;
    /* 300 bytes and a NUL from nothing: 256 doubled once. */
    assert_int_equal(BT_RESERVE_N(b, len, cap, 301, 256), 0);
    assert_int_equal(cap, 512);
    memset(b, 'x', 300), len = 300, b[len] = 0;
    /* 1000 more: 512 -> 1024 -> 2048, the text kept. */
    assert_int_equal(BT_RESERVE_N(b, len, cap, 1001, 256), 0);
    assert_int_equal(cap, 2048);
    assert_int_equal(strlen(b), 300);
    /* Exactly full fits; MORE 0 never allocates. */
    assert_int_equal(BT_RESERVE_N(b, len, cap, 2048 - 300, 256), 0);
    assert_int_equal(cap, 2048);
    assert_int_equal(BT_RESERVE_N(b, 2048, cap, 0, 256), 0);
    assert_int_equal(cap, 2048);
    free(b);
}

static void test_reserve_too_much(void **state)
{
    (void)state;
    uint64_t *v = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(BT_RESERVE(v, n, cap, 8), 0);
    v[n++] = 7;
    uint64_t *before = v;
    /* N + MORE overflows; then elements whose bytes overflow. */
    assert_int_equal(BT_RESERVE_N(v, n, cap, SIZE_MAX, 8), BT_ENOMEM);
    assert_int_equal(BT_RESERVE_N(v, n, cap, SIZE_MAX / 4, 8), BT_ENOMEM);
    assert_ptr_equal(v, before);
    assert_int_equal(cap, 8);
    assert_int_equal(v[0], 7);
    free(v);
}

/* Bytes appended keep their NUL; nothing appended is still a string. */
static void test_bytes_add(void **state)
{
    (void)state;
    char *b = NULL;
    size_t len = 0, cap = 0;
    assert_int_equal(bt_bytes_add(&b, &len, &cap, NULL, 0), 0);
    assert_string_equal(b, "");
    for (int i = 0; i < 100; i++)
        assert_int_equal(bt_bytes_add(&b, &len, &cap, "abcd", 4), 0);
    assert_int_equal(len, 400);
    assert_true(cap > len);
    assert_int_equal(b[400], 0);
    assert_memory_equal(b + 396, "abcd", 4);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reserve_one),
        cmocka_unit_test(test_reserve_n),
        cmocka_unit_test(test_reserve_too_much),
        cmocka_unit_test(test_bytes_add),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
