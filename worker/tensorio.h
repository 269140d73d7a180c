/* The conductor's tensor messages: Put (a client's input into the pool),
 * Fetch (a tensor's bytes out, for a client) and Release (tensors nobody
 * reads any more).  Bytes are copied outside the lock (inputs may be
 * large), and on a GPU worker never waited for on the I/O thread: a Put's
 * copy is queued on the I/O thread's stream and marked, a Fetch's runs on
 * the copier's thread (copier.h), and each answer leaves when its copy has
 * ended.
 *
 * The struct holds borrowed pointers only; the worker's top fills it.
 * I/O thread. */
#ifndef BATON_WORKER_TENSORIO_H
#define BATON_WORKER_TENSORIO_H

#include <pthread.h>

#include "proto/baton.pb-c.h"
#include "worker/copier.h"
#include "worker/device.h"
#include "worker/store.h"

typedef struct wk_tensorio {
    pthread_mutex_t *lock;        /* the worker's */
    wk_store *store;
    wk_device *dev;
    void *io_stream;              /* the I/O thread's stream: a Put's copy is queued there */
    wk_copier *copier;            /* waits for copies off the I/O thread */
    void *sock;                   /* the conductor socket */
    const char *worker;           /* this worker's name, for messages */
} wk_tensorio;

/* Answers each with Placed (Put) or Fetched (Fetch), once the bytes are
 * copied.  Without the lock: they take it around what they touch.  The
 * Put's message (MSG) is owned from here on: its bytes are the copy's
 * source. */
void wk_tensorio_put(const wk_tensorio *io, Baton__V1__ConductorMessage *msg);
void wk_tensorio_fetch(const wk_tensorio *io, const Baton__V1__Fetch *f);
/* Releases the tensors named; ids not held are ignored.  [L] */
void wk_tensorio_release(const wk_tensorio *io, const Baton__V1__Release *r);

#endif
