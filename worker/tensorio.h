/* The conductor's tensor messages: Put (a client's input into the pool),
 * Fetch (a tensor's bytes out, for a client) and Release (tensors nobody
 * reads any more).  Bytes are copied on the I/O thread's own stream and
 * outside the lock: inputs may be large.
 *
 * The struct holds borrowed pointers only; the worker's top fills it.
 * I/O thread. */
#ifndef BATON_WORKER_TENSORIO_H
#define BATON_WORKER_TENSORIO_H

#include <pthread.h>

#include "proto/baton.pb-c.h"
#include "worker/device.h"
#include "worker/store.h"

typedef struct wk_tensorio {
    pthread_mutex_t *lock;        /* the worker's */
    wk_store *store;
    wk_device *dev;
    void *io_stream;              /* the I/O thread's stream */
    void *sock;                   /* the conductor socket */
    const char *worker;           /* this worker's name, for messages */
} wk_tensorio;

/* Answers each with Placed (Put) or Fetched (Fetch).  Without the lock:
 * they take it around what they touch, and copy the bytes outside it. */
void wk_tensorio_put(const wk_tensorio *io, const Baton__V1__Put *p);
void wk_tensorio_fetch(const wk_tensorio *io, const Baton__V1__Fetch *f);
/* Releases the tensors named; ids not held are ignored.  [L] */
void wk_tensorio_release(const wk_tensorio *io, const Baton__V1__Release *r);

#endif
