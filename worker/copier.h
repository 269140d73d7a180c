/* Copies between host memory and the pool that the I/O thread would
 * otherwise make itself, off the I/O thread.
 *
 * The I/O thread must never wait for the device: it sends the heartbeats
 * by which the conductor tells a live worker from a stuck one, and the
 * messages the other ranks of a collective wait for.  So on a GPU worker
 * the copies of Put and Fetch run on a thread of their own, with a stream
 * of their own, and each job's end comes back to the I/O thread as an
 * event.  On a CPU worker the pool is host memory and a copy is a memcpy:
 * a job then runs at once on the caller's thread and its end is called
 * right away, as if the thread had been there.
 *
 * A job may first wait for a mark (a copy into the pool that the I/O
 * thread queued itself, whose bytes the job reads).  wk_copier_submit may
 * be called from the I/O thread only. */
#ifndef BATON_WORKER_COPIER_H
#define BATON_WORKER_COPIER_H

#include <stdbool.h>
#include <stdint.h>

#include "worker/device.h"
#include "worker/events.h"

typedef struct wk_copy_job wk_copy_job;
struct wk_copy_job {
    wk_event ev;                  /* first; ev.run: the job's end, on the I/O thread */
    void *wait;                   /* a mark to wait for first, or NULL; borrowed */
    void *dst;                    /* N bytes to copy from SRC, or N = 0: none */
    const void *src;
    uint64_t n;
    int status;                   /* set when it ends: 0, or a negative bt_err */
    char err[256];                /* with it, why */
    wk_copy_job *next;            /* the queue's */
};

typedef struct wk_copier wk_copier;

/* A copier for DEV, whose ends go to EVENTS (both borrowed): on a GPU
 * device, its thread and stream start now.  0, or a negative bt_err with
 * ERR. */
int wk_copier_create(wk_device *dev, wk_events *events, wk_copier **out, char *err,
                     size_t errlen);
/* Runs the jobs queued, posts their ends, and stops the thread.
 * Idempotent. */
void wk_copier_stop(wk_copier *c);
/* Stops, then frees.  NULL is a no-op. */
void wk_copier_destroy(wk_copier *c);
/* Queues JOB (its ev.run set); its end is posted once it ran, or (on a
 * host device) JOB ran and ev.run was called before this returns. */
void wk_copier_submit(wk_copier *c, wk_copy_job *job);
/* Whether jobs run on a thread of their own (a GPU device). */
bool wk_copier_threaded(const wk_copier *c);

#endif
