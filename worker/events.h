/* The I/O thread's inbox: what the lanes, the load threads and the comm
 * thread hand to the I/O thread, in the order they posted it.
 *
 * An event is a struct of its poster's, with a wk_event first; the poster
 * sets `run`, which the I/O thread calls with the event and which frees
 * it.  So the poster decides what happens on the I/O thread, and this
 * module knows nothing of items, loads or transfers.  One FIFO for every
 * kind is what puts each Chunk of an execution before its Done.
 *
 * Thread safety: wk_events_post may be called from any thread, with or
 * without the worker's lock (it takes only its own, innermost mutex);
 * wk_events_run only by the I/O thread. */
#ifndef BATON_WORKER_EVENTS_H
#define BATON_WORKER_EVENTS_H

#include <stdbool.h>

typedef struct wk_event wk_event;

struct wk_event {
    void (*run)(wk_event *ev);    /* on the I/O thread; frees the event */
    wk_event *next;               /* the queue's */
};

typedef struct wk_events wk_events;

/* 0, or a negative bt_err (no memory, no eventfd). */
int wk_events_create(wk_events **out);
/* Events never run are leaked: the caller runs the queue dry first.  NULL
 * is a no-op. */
void wk_events_destroy(wk_events *q);
/* An eventfd that is readable while events wait (close-on-exec,
 * non-blocking); others may signal it too (wk_events_wake). */
int wk_events_fd(const wk_events *q);
/* Appends EV and signals the fd, unless the caller is the owner. */
void wk_events_post(wk_events *q, wk_event *ev);
/* Signals the fd without an event: the I/O thread wakes and looks. */
void wk_events_wake(wk_events *q);
/* Clears the fd and runs every event posted so far, in order.  Events
 * their handlers post wait for the next call (the fd is readable again,
 * unless the handler runs on the owner: see wk_events_own). */
void wk_events_run(wk_events *q);
/* Makes the calling thread (the I/O thread) the owner: an event it posts
 * itself does not signal the fd, a system call and a spurious wake-up
 * spared, so it must run what waits (wk_events_run_posted) before it next
 * sleeps. */
void wk_events_own(wk_events *q);
/* Whether events wait to be run. */
bool wk_events_pending(wk_events *q);
/* Runs the events posted so far without clearing the fd: for the owner,
 * before it sleeps.  False when none waited.  The fd another thread
 * signalled stays readable, so the next poll returns at once and finds an
 * empty inbox: a wasted round, nothing lost. */
bool wk_events_run_posted(wk_events *q);

#endif
