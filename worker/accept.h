/* Taking a Dispatch in: the checks a dispatch must pass, its request
 * record, its NCCL receives and its pulls from other hosts (either parks
 * it until its inputs are here), and then its item and run-ahead chain.
 * Whatever cannot be taken in is answered at once with a failed Done.
 *
 * The struct holds borrowed pointers only; the worker's top fills it. */
#ifndef BATON_WORKER_ACCEPT_H
#define BATON_WORKER_ACCEPT_H

#include <pthread.h>

#include "proto/baton.pb-c.h"
#include "worker/executor.h"
#include "worker/item.h"
#include "worker/nccl.h"
#include "worker/pull.h"
#include "worker/runahead.h"
#include "worker/store.h"

typedef struct wk_accept {
    pthread_mutex_t *lock;        /* the worker's */
    wk_store *store;
    wk_executor *ex;
    wk_runahead *ra;
    wk_pull *pull;
    wk_nccl *nccl;
    void *sock;                   /* the conductor socket: refusals */
    const char *worker;           /* this worker's name, for messages */
} wk_accept;

/* A Dispatch from the conductor (MSG, owned from here on).  Parts that
 * come over NCCL are received first, in arrival order (the peer's sends
 * are matched by that order).  I/O thread, without the lock. */
void wk_accept_dispatch(const wk_accept *a, Baton__V1__ConductorMessage *msg);
/* The same once every NCCL receive of MSG is in (nccl.h's accept hook). */
void wk_accept_received(const wk_accept *a, Baton__V1__ConductorMessage *msg);
/* Creates the item of DISP (of REQ; a reference held by the caller),
 * opening its run-ahead chain, and queues it; answers with a failed Done
 * when its model is gone or memory is short (pull.h's start hook).  [L] */
void wk_accept_start(const wk_accept *a, wk_dispatch *disp, wk_request *req);

#endif
