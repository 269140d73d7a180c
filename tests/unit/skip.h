/* Skipping a unit test for a missing prerequisite, one way everywhere: a
 * line starting with "SKIP:" says why, and CMocka counts the test as
 * skipped, not passed (tests/run-unit.sh adds skips up apart).  Include it
 * after <cmocka.h>; only a test function may skip.
 *
 * A missing model is no reason to skip in CI: .ci/run fetches the model and
 * sets BATON_CI=1, and there skip_without_model fails the test instead.
 * With BATON_OFFLINE=1 `make test` fetches nothing, and the skip says so. */
#ifndef BATON_TESTS_SKIP_H
#define BATON_TESTS_SKIP_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static inline bool bt_test_in_ci(void)
{
    const char *ci = getenv("BATON_CI");
    return ci && strcmp(ci, "1") == 0;
}

/* BATON_OFFLINE=1: nothing was fetched from the network for this run. */
static inline bool bt_test_offline(void)
{
    const char *off = getenv("BATON_OFFLINE");
    return off && strcmp(off, "1") == 0;
}

#define skip_because(fmt, ...)                                                                 \
    do {                                                                                       \
        print_message("SKIP: " fmt "\n", ##__VA_ARGS__);                                       \
        skip();                                                                                \
    } while (0)

#define skip_without_model(path)                                                               \
    do {                                                                                       \
        if (bt_test_in_ci())                                                                   \
            fail_msg("%s is absent, and with BATON_CI=1 the model tests must run", path);     \
        skip_because("%s is absent (%s)", path,                                              \
                     bt_test_offline() ? "BATON_OFFLINE=1: scripts/fetch-model.sh did not fetch it" \
                                       : "scripts/fetch-model.sh fetches it");                 \
    } while (0)

#endif
