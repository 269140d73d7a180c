/* Bounds on the ZeroMQ sockets a unit test makes itself, so that a test
 * that goes wrong fails instead of hanging: a send or a receive that would
 * block gives up after TEST_SOCK_TIMEOUT_MS (-1, EAGAIN, which the test's
 * assertion reports), and closing drops what was not sent, so that
 * zmq_ctx_term never waits for a peer that is gone.  The tests' runner
 * (tests/run-unit.sh) stops a whole program past its time limit; these
 * bounds make the failure name the call. */
#ifndef BATON_TESTS_UNIT_SOCK_LIMITS_H
#define BATON_TESTS_UNIT_SOCK_LIMITS_H

#include <zmq.h>

#define TEST_SOCK_TIMEOUT_MS 10000

static inline void test_sock_limit(void *sock)
{
    int zero = 0, ms = TEST_SOCK_TIMEOUT_MS;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(sock, ZMQ_SNDTIMEO, &ms, sizeof(ms));
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &ms, sizeof(ms));
}

#endif
