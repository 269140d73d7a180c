/* Linked into build/tests/batond-pollfail only (see the Makefile), never
 * into batond: with -Wl,--wrap=zmq_poll, every zmq_poll of the conductor
 * after the first BATON_TEST_POLL_FAIL_AFTER calls fails with ETERM, as it
 * would once the ZeroMQ context is gone.  test_loop_failure.sh checks that
 * batond then exits non-zero. */
#include <errno.h>
#include <stdlib.h>
#include <zmq.h>

int __real_zmq_poll(zmq_pollitem_t *items, int n, long timeout);
int __wrap_zmq_poll(zmq_pollitem_t *items, int n, long timeout);

int __wrap_zmq_poll(zmq_pollitem_t *items, int n, long timeout)
{
    static long calls;
    const char *after = getenv("BATON_TEST_POLL_FAIL_AFTER");
    if (after && ++calls > atol(after)) {
        errno = ETERM;
        return -1;
    }
    return __real_zmq_poll(items, n, timeout);
}
