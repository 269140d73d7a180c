/* Cross-host GPU transfers: one two-rank NCCL communicator per pair of GPU
 * workers on different hosts, and the ncclSend / ncclRecv of the tensors
 * that cross between them (docs/architecture.md, "Transfers").
 *
 * Threads.  The I/O thread calls every function here; one comm thread per
 * worker (started by wk_nccl_create) joins the communicators, issues the
 * transfers on one stream per pair and polls them, and hands each finished
 * transfer back to the I/O thread as a WK_EV_NCCL event, which
 * wk_nccl_on_event takes in. */
#ifndef BATON_WORKER_NCCL_H
#define BATON_WORKER_NCCL_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/baton.pb-c.h"
#include "worker/worker.h"

typedef struct wk_nccl wk_nccl;
struct wk_event;

/* Creates W's transfer state and, on a GPU worker, starts its comm
 * thread (a CPU worker refuses NCCL parts and ignores the rest).  0 or a
 * negative bt_err. */
int wk_nccl_create(wk_worker *w, wk_nccl **out);
/* Aborts every communicator and stops the comm thread; the transfers it
 * failed are WK_EV_NCCL events on the worker's queue.  Idempotent. */
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
 * goes to wk_dispatch_accept (parts turned into own tensors) or is
 * refused UNAVAILABLE once they end.  0: nothing to receive. */
int wk_nccl_on_dispatch(wk_nccl *x, Baton__V1__ConductorMessage *msg);
/* Takes in a WK_EV_NCCL event of the comm thread. */
void wk_nccl_on_event(wk_nccl *x, struct wk_event *ev);
/* The worker registers again (a reconnect): every communicator is aborted,
 * and the next Peers message makes them anew. */
void wk_nccl_reset(wk_nccl *x);

#endif
