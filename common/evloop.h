/* A small event loop over zmq_poll: ZeroMQ sockets and plain fds, each with
 * a callback.  Like Redis's ae, it knows nothing about the process it runs
 * in: batond's modules and the worker's I/O thread register what they
 * watch, and a module whose sockets come and go (the worker's peer
 * connections) adds and removes its own.  Timers are the caller's business
 * (a timerfd is just another fd, or a timeout to evloop_run_once), which
 * keeps this loop free of clocks.  One thread only. */
#ifndef BATON_COMMON_EVLOOP_H
#define BATON_COMMON_EVLOOP_H

#include <stddef.h>

typedef struct evloop evloop;

/* Called when the socket or fd is readable.  ARG is the registration's. */
typedef void (*evloop_cb)(evloop *l, void *arg);

evloop *evloop_create(void);
void evloop_destroy(evloop *l);

/* Watches a ZeroMQ socket (SOCKET != NULL) or an fd for input.  Returns a
 * handle >= 0 for evloop_remove, or a negative bt_err. */
int evloop_add(evloop *l, void *socket, int fd, evloop_cb cb, void *arg);
/* Stops watching.  Safe inside a callback: the entry is only marked and
 * swept after the current poll round, never freed under its caller. */
void evloop_remove(evloop *l, int handle);

/* Polls once (up to TIMEOUT_MS, -1 forever) and runs the callbacks of what
 * is ready.  Returns the number of callbacks run, or a negative bt_err. */
int evloop_run_once(evloop *l, long timeout_ms);
/* Runs until evloop_stop. */
void evloop_run(evloop *l);
/* Called from a callback: the callbacks of the round not run yet wait for
 * the next one, and evloop_run returns. */
void evloop_stop(evloop *l);

#endif
