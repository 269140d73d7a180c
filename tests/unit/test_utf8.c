/* UTF-8 validity and lossy decoding (common/utf8.c): Unicode's own example
 * of maximal subparts (chapter 3, Table 3-8), truncated sequences at the
 * end, surrogates, overlongs, and that valid text passes unchanged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/utf8.h"

#define FFFD "\xEF\xBF\xBD"

static void lossy_is(const char *in, size_t len, const char *want)
{
    char out[256];
    size_t n = bt_utf8_lossy(in, len, out);
    assert_true(n <= 3 * len);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(out, want, n);
    assert_true(bt_utf8_valid(out, n));
    assert_int_equal(bt_utf8_valid(in, len), strcmp(in, want) == 0 && len == strlen(want));
}

static void test_lossy(void **state)
{
    (void)state;
    /* Table 3-8: F1 80 80 and E1 80 are cut short, C2 is followed by a
     * non-continuation, 80 and BF stand alone. */
    lossy_is("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64", 13,
             "a" FFFD FFFD FFFD "b" FFFD "c" FFFD FFFD "d");
    lossy_is("h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80", 15, "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80");
    lossy_is("\xE2\x82", 2, FFFD);            /* cut at the end: one subpart */
    lossy_is("\xF0\x9F\x98", 3, FFFD);
    lossy_is("\xED\xA0\x80", 3, FFFD FFFD FFFD);  /* a surrogate: ED then two alone */
    lossy_is("\xC0\xAF", 2, FFFD FFFD);       /* overlong */
    lossy_is("\xF4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD);  /* past U+10FFFF */
    lossy_is("", 0, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lossy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
