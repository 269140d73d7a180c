/* Linked into build/tests/batond-pollfail only (see the Makefile), never
 * into batond: with -Wl,--wrap=zmq_poll, the conductor's zmq_poll fails
 * with ETERM, as it would once the ZeroMQ context is gone:
 *   - after the first BATON_TEST_POLL_FAIL_AFTER calls, or
 *   - once the file BATON_TEST_POLL_FAIL_FILE exists, so that a test can
 *     let batond start its workers (and they their pools) first; the
 *     conductor's 10 ms tick makes it poll again soon after.
 * test_loop_failure.sh checks that batond then exits non-zero and leaves
 * nothing behind. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
#include <zmq.h>

int __real_zmq_poll(zmq_pollitem_t *items, int n, long timeout);
int __wrap_zmq_poll(zmq_pollitem_t *items, int n, long timeout);

int __wrap_zmq_poll(zmq_pollitem_t *items, int n, long timeout)
{
    static long calls;
    const char *after = getenv("BATON_TEST_POLL_FAIL_AFTER");
    const char *file = getenv("BATON_TEST_POLL_FAIL_FILE");
    if ((after && ++calls > atol(after)) || (file && access(file, F_OK) == 0)) {
        errno = ETERM;
        return -1;
    }
    return __real_zmq_poll(items, n, timeout);
}
