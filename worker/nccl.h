/* Cross-host GPU transfers: one two-rank NCCL communicator per pair of GPU
 * workers on different hosts, and the ncclSend / ncclRecv of the tensors
 * that cross between them (docs/architecture.md, "Transfers").
 *
 * Threads.  The I/O thread calls every function here; one comm thread per
 * worker (started by wk_nccl_create) joins the communicators, issues the
 * transfers on one stream per pair and polls them, and hands each finished
 * transfer back to the I/O thread as an event (events.h). */
#ifndef BATON_WORKER_NCCL_H
#define BATON_WORKER_NCCL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "proto/baton.pb-c.h"
#include "worker/device.h"
#include "worker/events.h"
#include "worker/store.h"

typedef struct wk_nccl wk_nccl;

typedef struct wk_nccl_hooks {
    void *arg;
    /* Every receive of the Dispatch in MSG (owned from here on) is in:
     * its NCCL parts now name own tensors.  I/O thread, without the lock. */
    void (*accept)(void *arg, Baton__V1__ConductorMessage *msg);
} wk_nccl_hooks;

typedef struct wk_nccl_options {
    pthread_mutex_t *lock;        /* the worker's */
    const atomic_bool *stopping;
    wk_store *store;
    wk_device *dev;
    wk_events *events;            /* finished transfers come back through it */
    void *sock;                   /* the conductor socket (I/O thread) */
    const char *hostname;         /* this worker's host, as registered */
} wk_nccl_options;

/* Every pointer of OPT is borrowed.  On a GPU worker, starts the comm
 * thread (a CPU worker refuses NCCL parts and ignores the rest).  0 or a
 * negative bt_err. */
int wk_nccl_create(const wk_nccl_options *opt, const wk_nccl_hooks *hooks, wk_nccl **out);
/* Aborts every communicator and stops the comm thread; the transfers it
 * failed wait as events on the I/O thread's queue.  Idempotent. */
void wk_nccl_stop(wk_nccl *x);
/* Aborts every communicator (nothing waits for a peer), stops the thread
 * and frees what is left; tensors still pinned by transfers are unpinned.
 * NULL is a no-op. */
void wk_nccl_destroy(wk_nccl *x);

/* A Peers message: makes (as the lower index of a pair) the id of a new
 * communicator with each GPU peer on another host that came up or
 * restarted, and drops the communicators of peers that went down. */
void wk_nccl_on_peers(wk_nccl *x, const Baton__V1__Peers *p);
/* A PairComm: joins the peer's communicator as rank 1. */
void wk_nccl_on_pair_comm(wk_nccl *x, const Baton__V1__PairComm *pc);
/* A Send: sends the own tensor to the peer. */
void wk_nccl_on_send(wk_nccl *x, const Baton__V1__Send *s);
/* A Dispatch (MSG, owned by the caller until this returns 1): when parts
 * of its inputs come over NCCL, their receives are issued now, in arrival
 * order, and the dispatch waits for them: 1, MSG is now owned here and
 * goes to hooks.accept (parts turned into own tensors) or is refused
 * UNAVAILABLE once they end.  0: nothing to receive. */
int wk_nccl_on_dispatch(wk_nccl *x, Baton__V1__ConductorMessage *msg);
/* The worker registers again (a reconnect): every communicator is aborted,
 * and the next Peers message makes them anew. */
void wk_nccl_reset(wk_nccl *x);

#endif
