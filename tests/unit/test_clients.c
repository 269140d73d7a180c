/* The client connection table (daemon/clients.c): lookup by identity,
 * the counts admission reads, the backlog's order and bytes, and when a
 * client may be forgotten. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/clients.h"

static cl_frame *frame_of(const char *text)
{
    size_t n = strlen(text);
    cl_frame *f = malloc(sizeof(*f) + n);
    assert_non_null(f);
    memcpy(f->data, text, n);
    f->len = n;
    return f;
}

static void test_lookup_and_counts(void **state)
{
    (void)state;
    cl_table t;
    cl_init(&t);
    const uint8_t a[] = {0, 1, 2, 3, 4}, b[] = {0, 1, 2, 3, 5};
    assert_null(cl_find(&t, a, sizeof(a)));
    cl_client *ca = cl_get(&t, a, sizeof(a)), *cb = cl_get(&t, b, sizeof(b));
    assert_non_null(ca);
    assert_true(ca != cb);
    assert_ptr_equal(cl_get(&t, a, sizeof(a)), ca);
    assert_ptr_equal(cl_find(&t, b, sizeof(b)), cb);
    assert_null(cl_find(&t, a, 4)); /* a prefix is another identity */
    assert_int_equal(t.n, 2);
    cl_inflight_add(&t, ca);
    cl_inflight_add(&t, ca);
    cl_inflight_add(&t, cb);
    assert_int_equal(t.busy, 2);
    cl_inflight_sub(&t, ca);
    assert_int_equal(t.busy, 2);
    cl_inflight_sub(&t, ca);
    assert_int_equal(t.busy, 1);
    cl_inflight_sub(&t, ca); /* never below 0 */
    assert_int_equal(ca->inflight, 0);
    /* Idle: forgotten; a recent refusal keeps it a while; requests keep it. */
    ca->refused_ms = 1000;
    cl_release_if_idle(&t, ca, 1500, CL_REFUSED_KEEP_MS);
    assert_ptr_equal(cl_find(&t, a, sizeof(a)), ca);
    cl_release_if_idle(&t, ca, 1000 + CL_REFUSED_KEEP_MS + 1, CL_REFUSED_KEEP_MS);
    assert_null(cl_find(&t, a, sizeof(a)));
    cl_release_if_idle(&t, cb, 99999, CL_REFUSED_KEEP_MS);
    assert_ptr_equal(cl_find(&t, b, sizeof(b)), cb);
    assert_int_equal(t.n, 1);
    cl_free(&t);
}

static void test_backlog(void **state)
{
    (void)state;
    cl_table t;
    cl_init(&t);
    const uint8_t a[] = {7}, b[] = {8};
    cl_client *ca = cl_get(&t, a, 1), *cb = cl_get(&t, b, 1);
    cl_backlog_push(&t, ca, frame_of("one"), 10);
    cl_backlog_push(&t, ca, frame_of("three"), 20);
    cl_backlog_push(&t, cb, frame_of("xy"), 30);
    assert_int_equal(ca->backlog_bytes, 8);
    assert_int_equal(ca->n_backlog, 2);
    assert_int_equal(t.backlog_bytes, 10);
    assert_int_equal(ca->stalled_since_ms, 10); /* from the first refusal */
    /* In order; progress restarts the stall; the last one ends it. */
    cl_frame *f = cl_backlog_pop(&t, ca, 40);
    assert_memory_equal(f->data, "one", 3);
    free(f);
    assert_int_equal(ca->stalled_since_ms, 40);
    f = cl_backlog_pop(&t, ca, 50);
    assert_memory_equal(f->data, "three", 5);
    free(f);
    assert_int_equal(ca->stalled_since_ms, 0);
    assert_null(cl_backlog_pop(&t, ca, 60));
    assert_int_equal(t.backlog_bytes, 2);
    /* A client with a backlog is not idle; removing it frees the backlog. */
    cl_release_if_idle(&t, cb, 99999, CL_REFUSED_KEEP_MS);
    assert_ptr_equal(cl_find(&t, b, 1), cb);
    size_t n;
    cl_client **v = cl_list(&t, &n);
    assert_int_equal(n, 2);
    free(v);
    cl_remove(&t, cb);
    assert_int_equal(t.backlog_bytes, 0);
    assert_int_equal(t.n, 1);
    cl_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_and_counts),
        cmocka_unit_test(test_backlog),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
