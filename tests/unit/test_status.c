/* The one internal error space (common/status.c): every code has a
 * distinct name and a message, the errno codes are the errno values and
 * any other errno reads as the C library says, bt_errorf formats and
 * returns its status, and bt_err_to_code maps failures onto the
 * client-facing codes. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"

/* Every named code.  The errno codes are scattered over the errno numbers
 * and baton's own ones sit below BT_ERR_OWN_BASE, so the list is written
 * out; test_own_codes_listed checks that it misses none of baton's own. */
static const int all_codes[] = {
    BT_OK,        BT_ENOMEM,  BT_EINVAL,       BT_ENOENT,      BT_EEXIST, BT_EIO,
    BT_ERANGE,    BT_EBUSY,   BT_ECONFIG,      BT_ESTATE,      BT_EINTERNAL,
    BT_EFORMAT,   BT_ETYPE,   BT_EUNSUPPORTED, BT_ENOTEMPLATE, BT_EORDER,
    BT_EREDEF,    BT_ENOOP,   BT_EUNBOUND,     BT_ETHREAD,     BT_EOP,
    BT_EDEVICE,
};
#define N_CODES (sizeof(all_codes) / sizeof(all_codes[0]))

static void test_names_and_messages(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_CODES; i++) {
        int e = all_codes[i];
        const char *name = bt_err_name(e);
        assert_true(strncmp(name, "BT_", 3) == 0);
        assert_string_not_equal(name, "BT_E?");
        assert_string_not_equal(bt_strerror(e), "unknown error");
        for (size_t j = i + 1; j < N_CODES; j++) {
            assert_int_not_equal(e, all_codes[j]);
            assert_string_not_equal(name, bt_err_name(all_codes[j]));
            assert_string_not_equal(bt_strerror(e), bt_strerror(all_codes[j]));
        }
    }
    assert_string_equal(bt_err_name(BT_ENOMEM), "BT_ENOMEM");
    assert_string_equal(bt_strerror(BT_ENOMEM), "out of memory");
    assert_string_equal(bt_err_name(BT_ERR_OWN_LAST - 1), "BT_E?");
    assert_string_equal(bt_strerror(BT_ERR_OWN_LAST - 1), "unknown error");
    assert_string_equal(bt_strerror(1), "unknown error");
    assert_string_equal(bt_err_name(1), "BT_E?");
}

/* Baton's own codes fill BT_ERR_OWN_BASE - 1 down to BT_ERR_OWN_LAST, all
 * named, and the list above has each of them. */
static void test_own_codes_listed(void **state)
{
    (void)state;
    for (int e = BT_ERR_OWN_BASE - 1; e >= BT_ERR_OWN_LAST; e--) {
        assert_string_not_equal(bt_err_name(e), "BT_E?");
        bool listed = false;
        for (size_t i = 0; i < N_CODES; i++)
            listed |= all_codes[i] == e;
        assert_true(listed);
    }
}

/* The errno codes are the errno values, so a kernel's -ENOMEM is
 * BT_ENOMEM; baton's own codes are no errno at all. */
static void test_errno_space(void **state)
{
    (void)state;
    assert_int_equal(BT_ENOMEM, -ENOMEM);
    assert_int_equal(BT_EINVAL, -EINVAL);
    assert_int_equal(BT_ENOENT, -ENOENT);
    assert_int_equal(BT_EEXIST, -EEXIST);
    assert_int_equal(BT_EIO, -EIO);
    assert_int_equal(BT_ERANGE, -ERANGE);
    assert_int_equal(BT_EBUSY, -EBUSY);
    assert_string_equal(bt_strerror(-ENOMEM), bt_strerror(BT_ENOMEM));
    assert_string_equal(bt_err_name(-ENOMEM), "BT_ENOMEM");
    assert_non_null(strstr(bt_strerror(-ENOMEM), "memory"));
    /* Baton's own codes lie beyond every errno the C library knows. */
    for (int e = BT_ERR_OWN_BASE; e >= BT_ERR_OWN_LAST; e--)
        assert_true(strncmp(strerror(-e), "Unknown error", 13) == 0);
}

/* A negative errno that has no name of baton's reads as the C library
 * says it, from any thread. */
static void test_other_errno(void **state)
{
    (void)state;
    char want[128];
    snprintf(want, sizeof(want), "%s", strerror(ENOSPC));
    assert_string_equal(bt_strerror(-ENOSPC), want);
    assert_string_not_equal(bt_strerror(-ENOSPC), "unknown error");
    assert_string_equal(bt_err_name(-ENOSPC), "ENOSPC");
    assert_string_equal(bt_err_name(-EAGAIN), "EAGAIN");
    assert_string_equal(bt_err_name(-ENOSYS), "ENOSYS");
    snprintf(want, sizeof(want), "%s", strerror(ENOSYS));
    assert_string_equal(bt_strerror(-ENOSYS), want);
    /* A number that is no errno and no code of baton's. */
    assert_string_equal(bt_strerror(-3999), "unknown error");
    assert_string_equal(bt_err_name(-3999), "BT_E?");
    assert_string_equal(bt_strerror(-1000000), "unknown error");
}

static void test_errorf(void **state)
{
    (void)state;
    char buf[16];
    assert_int_equal(bt_errorf(buf, sizeof(buf), BT_EFORMAT, "tensor %s: %d", "x", 42),
                     BT_EFORMAT);
    assert_string_equal(buf, "tensor x: 42");
    assert_int_equal(bt_errorf(buf, sizeof(buf), BT_ERANGE, "%s", "a message longer than 16"),
                     BT_ERANGE);
    assert_int_equal(strlen(buf), sizeof(buf) - 1); /* truncated, terminated */
    assert_int_equal(bt_errorf(NULL, 0, BT_EIO, "nowhere"), BT_EIO);
    buf[0] = 'z';
    assert_int_equal(bt_errorf(buf, 0, BT_EIO, "nothing written"), BT_EIO);
    assert_int_equal(buf[0], 'z');
}

static void test_to_code(void **state)
{
    (void)state;
    assert_int_equal(bt_err_to_code(0), BT_CODE_OK);
    assert_int_equal(bt_err_to_code(BT_EINVAL), BT_CODE_INVALID_ARGUMENT);
    assert_int_equal(bt_err_to_code(BT_EFORMAT), BT_CODE_INVALID_ARGUMENT);
    assert_int_equal(bt_err_to_code(BT_ENOENT), BT_CODE_NOT_FOUND);
    assert_int_equal(bt_err_to_code(BT_EEXIST), BT_CODE_ALREADY_EXISTS);
    assert_int_equal(bt_err_to_code(BT_ENOMEM), BT_CODE_RESOURCE_EXHAUSTED);
    assert_int_equal(bt_err_to_code(BT_EBUSY), BT_CODE_RESOURCE_EXHAUSTED);
    assert_int_equal(bt_err_to_code(BT_ESTATE), BT_CODE_FAILED_PRECONDITION);
    assert_int_equal(bt_err_to_code(BT_EUNSUPPORTED), BT_CODE_FAILED_PRECONDITION);
    assert_int_equal(bt_err_to_code(BT_EDEVICE), BT_CODE_INTERNAL);
    assert_int_equal(bt_err_to_code(-1000), BT_CODE_INTERNAL);
    /* As before the codes took errno values, and whichever name a module
     * used. */
    assert_int_equal(bt_err_to_code(BT_ETYPE), BT_CODE_INVALID_ARGUMENT);
    assert_int_equal(bt_err_to_code(BT_ENOTEMPLATE), BT_CODE_FAILED_PRECONDITION);
    assert_int_equal(bt_err_to_code(BT_ERANGE), BT_CODE_RESOURCE_EXHAUSTED);
    assert_int_equal(bt_err_to_code(BT_ECONFIG), BT_CODE_INTERNAL);
    assert_int_equal(bt_err_to_code(BT_EINTERNAL), BT_CODE_INTERNAL);
    assert_int_equal(bt_err_to_code(BT_EOP), BT_CODE_INTERNAL);
    assert_int_equal(bt_err_to_code(-ENOMEM), BT_CODE_RESOURCE_EXHAUSTED);
    assert_int_equal(bt_err_to_code(-EINVAL), BT_CODE_INVALID_ARGUMENT);
    assert_int_equal(bt_err_to_code(-ENOSPC), BT_CODE_INTERNAL);
    assert_string_equal(bt_code_name(BT_CODE_UNAVAILABLE), "UNAVAILABLE");
    assert_string_equal(bt_code_name((bt_code)7), "UNKNOWN");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_messages),
        cmocka_unit_test(test_own_codes_listed),
        cmocka_unit_test(test_errno_space),
        cmocka_unit_test(test_other_errno),
        cmocka_unit_test(test_errorf),
        cmocka_unit_test(test_to_code),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
