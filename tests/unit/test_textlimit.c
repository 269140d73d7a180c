/* Stop strings and max_tokens on a text stream (daemon/textlimit.c): a
 * stop string found however the values cut it, the text sent never
 * holding one nor more than it must hold back, and max_tokens counting
 * non-empty values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "daemon/textlimit.h"

/* Feeds the NULL-terminated VALUES to a limit of STOP (NULL-terminated)
 * and MAX; SENT gets the bytes sent (after each value, their running
 * length in AFTER when not NULL), flushed at the end when the stream did
 * not end early.  Returns how it ended. */
static tl_end run(const char *const *stop, uint32_t max, const char *const *values, char *sent,
                  size_t *after)
{
    tl_limit l;
    size_t n_stop = 0;
    while (stop && stop[n_stop])
        n_stop++;
    assert_int_equal(tl_init(&l, stop, n_stop, max), 0);
    size_t at = 0;
    tl_end end = TL_RUNNING;
    for (size_t i = 0; values[i]; i++) {
        const uint8_t *out;
        size_t n;
        end = tl_feed(&l, (const uint8_t *)values[i], strlen(values[i]), &out, &n);
        memcpy(sent + at, out, n);
        at += n;
        if (after)
            after[i] = at;
    }
    if (end == TL_RUNNING) {
        const uint8_t *out;
        size_t n;
        tl_flush(&l, &out, &n);
        memcpy(sent + at, out, n);
        at += n;
    }
    sent[at] = 0;
    tl_free(&l);
    return end;
}

static void test_no_limit_passes_everything(void **state)
{
    (void)state;
    const char *v[] = {"Hello", ", ", "world", "", NULL};
    char sent[64];
    size_t after[4];
    assert_int_equal(run(NULL, 0, v, sent, after), TL_RUNNING);
    assert_string_equal(sent, "Hello, world");
    assert_int_equal(after[0], 5); /* nothing held without stop strings */
}

static void test_stop_inside_one_value(void **state)
{
    (void)state;
    const char *stop[] = {"STOP", NULL};
    const char *v[] = {"ab", "cdSTOPef", "gh", NULL};
    char sent[64];
    assert_int_equal(run(stop, 0, v, sent, NULL), TL_STOP);
    assert_string_equal(sent, "abcd");
}

static void test_stop_spans_values(void **state)
{
    (void)state;
    const char *stop[] = {"\n\nUser:", NULL};
    const char *v[] = {"Paris", ".\n", "\nUs", "er", ":", " more", NULL};
    char sent[64];
    size_t after[6];
    assert_int_equal(run(stop, 0, v, sent, after), TL_STOP);
    assert_string_equal(sent, "Paris.");
    /* Only what could begin the stop string waits: "Paris" goes at once,
     * ".\n" sends the "." and holds the "\n". */
    assert_int_equal(after[0], 5);
    assert_int_equal(after[1], 6);
    assert_int_equal(after[4], 6);
}

static void test_held_prefix_released_when_it_diverges(void **state)
{
    (void)state;
    const char *stop[] = {"END", NULL};
    const char *v[] = {"the E", "N", "D-less", NULL};
    char sent[64];
    size_t after[3];
    assert_int_equal(run(stop, 0, v, sent, after), TL_STOP);
    assert_string_equal(sent, "the ");
    const char *w[] = {"the E", "N", "x", NULL};
    assert_int_equal(run(stop, 0, w, sent, after), TL_RUNNING);
    assert_string_equal(sent, "the ENx");
    assert_int_equal(after[0], 4);
    assert_int_equal(after[1], 4);
    assert_int_equal(after[2], 7);
}

static void test_held_prefix_flushed_at_the_end(void **state)
{
    (void)state;
    const char *stop[] = {"###", NULL};
    const char *v[] = {"answer #", "#", NULL};
    char sent[64];
    size_t after[2];
    assert_int_equal(run(stop, 0, v, sent, after), TL_RUNNING);
    assert_int_equal(after[1], 7); /* "answer ", with "##" held */
    assert_string_equal(sent, "answer ##"); /* the end came first: nothing followed */
}

static void test_overlapping_prefixes(void **state)
{
    (void)state;
    /* "aab" in "aaab" starts at 1: the first "a" goes, the rest stops. */
    const char *stop[] = {"aab", NULL};
    const char *v[] = {"aaa", "b", NULL};
    char sent[64];
    assert_int_equal(run(stop, 0, v, sent, NULL), TL_STOP);
    assert_string_equal(sent, "a");
    const char *stop2[] = {"abab", NULL};
    const char *w[] = {"xaba", "bab", NULL};
    assert_int_equal(run(stop2, 0, w, sent, NULL), TL_STOP);
    assert_string_equal(sent, "x");
    /* Two stop strings: the earlier match wins, whichever is listed first. */
    const char *stop3[] = {"cd", "bc", NULL};
    const char *x[] = {"ab", "cd", NULL};
    assert_int_equal(run(stop3, 0, x, sent, NULL), TL_STOP);
    assert_string_equal(sent, "a");
}

static void test_stop_at_the_very_start(void **state)
{
    (void)state;
    const char *stop[] = {"Hi", NULL};
    const char *v[] = {"H", "i there", NULL};
    char sent[64];
    size_t after[2];
    assert_int_equal(run(stop, 0, v, sent, after), TL_STOP);
    assert_string_equal(sent, "");
    assert_int_equal(after[0], 0);
    const char *w[] = {"Hi", NULL};
    assert_int_equal(run(stop, 0, w, sent, NULL), TL_STOP);
    assert_string_equal(sent, "");
}

static void test_utf8_multibyte_split(void **state)
{
    (void)state;
    /* "café." with the é (C3 A9) cut between two values, and a stop
     * string that starts with it. */
    const char *stop[] = {"\xC3\xA9.", NULL};
    const char *v[] = {"caf\xC3", "\xA9", ". More", NULL};
    char sent[64];
    size_t after[3];
    assert_int_equal(run(stop, 0, v, sent, after), TL_STOP);
    assert_string_equal(sent, "caf");
    assert_int_equal(after[0], 3); /* the lead byte waits: it may begin the stop */
    /* A stop string of a character whose lead byte alone is held: the
     * character that comes instead goes whole. */
    const char *stop2[] = {"\xE2\x82\xAC", NULL}; /* € */
    const char *w[] = {"5 \xE2", "\x82", "\xAC", NULL};
    assert_int_equal(run(stop2, 0, w, sent, NULL), TL_STOP);
    assert_string_equal(sent, "5 ");
    const char *x[] = {"5 \xE2", "\x80\x94", NULL}; /* an em dash instead */
    assert_int_equal(run(stop2, 0, x, sent, NULL), TL_RUNNING);
    assert_string_equal(sent, "5 \xE2\x80\x94");
}

static void test_max_tokens_counts_non_empty_values(void **state)
{
    (void)state;
    const char *v[] = {"a", "", "b", "c", "d", NULL};
    char sent[64];
    size_t after[5];
    assert_int_equal(run(NULL, 3, v, sent, after), TL_LENGTH);
    assert_string_equal(sent, "abc");
    assert_int_equal(after[3], 3);
    assert_int_equal(after[4], 3); /* nothing after the end */
}

static void test_max_tokens_releases_held_bytes(void **state)
{
    (void)state;
    const char *stop[] = {"xyz", NULL};
    const char *v[] = {"a", "bx", "cd", NULL};
    char sent[64];
    assert_int_equal(run(stop, 2, v, sent, NULL), TL_LENGTH);
    assert_string_equal(sent, "abx"); /* no value follows that could complete "xyz" */
    /* The stop string is looked for first: in the last value, it wins. */
    const char *w[] = {"a", "bxyz", NULL};
    assert_int_equal(run(stop, 2, w, sent, NULL), TL_STOP);
    assert_string_equal(sent, "ab");
}

static void test_init_refuses_bad_strings(void **state)
{
    (void)state;
    tl_limit l;
    const char *empty[] = {""};
    assert_int_equal(tl_init(&l, empty, 1, 0), BT_EINVAL);
    char big[TL_MAX_STOP_BYTES + 2];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    const char *bigp[] = {big};
    assert_int_equal(tl_init(&l, bigp, 1, 0), BT_EINVAL);
    const char *many[TL_MAX_STOP + 1];
    for (size_t i = 0; i <= TL_MAX_STOP; i++)
        many[i] = "s";
    assert_int_equal(tl_init(&l, many, TL_MAX_STOP + 1, 0), BT_EINVAL);
    big[TL_MAX_STOP_BYTES] = 0; /* exactly the limit */
    assert_int_equal(tl_init(&l, bigp, 1, 0), 0);
    tl_free(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_limit_passes_everything),
        cmocka_unit_test(test_stop_inside_one_value),
        cmocka_unit_test(test_stop_spans_values),
        cmocka_unit_test(test_held_prefix_released_when_it_diverges),
        cmocka_unit_test(test_held_prefix_flushed_at_the_end),
        cmocka_unit_test(test_overlapping_prefixes),
        cmocka_unit_test(test_stop_at_the_very_start),
        cmocka_unit_test(test_utf8_multibyte_split),
        cmocka_unit_test(test_max_tokens_counts_non_empty_values),
        cmocka_unit_test(test_max_tokens_releases_held_bytes),
        cmocka_unit_test(test_init_refuses_bad_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
