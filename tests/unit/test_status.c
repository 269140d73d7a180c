/* The one internal error space (common/status.c): every code has a
 * distinct name and a message, bt_errorf formats and returns its status,
 * and bt_err_to_code maps failures onto the client-facing codes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"

#define FIRST_ERR BT_EDEVICE /* the most negative code */

static void test_names_and_messages(void **state)
{
    (void)state;
    for (int e = 0; e >= FIRST_ERR; e--) {
        const char *name = bt_err_name(e);
        assert_true(strncmp(name, "BT_", 3) == 0);
        assert_string_not_equal(name, "BT_E?");
        assert_string_not_equal(bt_strerror(e), "unknown error");
        for (int f = e + 1; f <= 0; f++) {
            assert_string_not_equal(name, bt_err_name(f));
            assert_string_not_equal(bt_strerror(e), bt_strerror(f));
        }
    }
    assert_string_equal(bt_err_name(BT_ENOMEM), "BT_ENOMEM");
    assert_string_equal(bt_strerror(BT_ENOMEM), "out of memory");
    assert_string_equal(bt_err_name(FIRST_ERR - 1), "BT_E?");
    assert_string_equal(bt_strerror(FIRST_ERR - 1), "unknown error");
    assert_string_equal(bt_strerror(1), "unknown error");
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
    assert_string_equal(bt_code_name(BT_CODE_UNAVAILABLE), "UNAVAILABLE");
    assert_string_equal(bt_code_name((bt_code)7), "UNKNOWN");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_messages),
        cmocka_unit_test(test_errorf),
        cmocka_unit_test(test_to_code),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
