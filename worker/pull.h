/* Dispatches whose inputs lie on another host: parked while their
 * TRANSFER_KIND_SOCKET chunks are pulled into the own pool (xfer.h), then
 * handed back to be started like any other dispatch; and the producer's
 * side of those pulls, which serves this worker's tensors to the others.
 *
 * Each SOCKET chunk gets a tensor of the dispatching request in the own
 * pool, pinned while the bytes arrive.  When the last pull of the dispatch
 * completes, its chunk references are rewritten in place to name those
 * tensors (owner = this worker, transfer LOCAL), so input resolution,
 * joins and run-ahead iterations see ordinary local tensors.  The copies
 * belong to the dispatch: they are released when its last item or chain
 * lets go of it, or with the request at SessionClose.  Inside a loop,
 * where every iteration's dispatch names the same value (a persisted one,
 * such as a handed-off cache), the copy belongs to the request instead and
 * later iterations reuse it, as input resolution does with values it
 * stages: one pull per request, not per step.
 *
 * A pull that fails fails its dispatch with one Done carrying the pull's
 * status (UNAVAILABLE naming the producer when it was lost); the other
 * pulls of that dispatch are cancelled.  Every pull of a dispatch
 * proceeds at once, and so do those of other dispatches: the I/O thread
 * never waits for bytes. */
#ifndef BATON_WORKER_PULL_H
#define BATON_WORKER_PULL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/curve.h"
#include "common/evloop.h"
#include "proto/baton.pb-c.h"
#include "worker/device.h"
#include "worker/item.h"
#include "worker/store.h"

typedef struct wk_pull_hooks {
    void *arg;
    /* Every input of DISP (of REQ) is here: start it (a reference of DISP
     * is held during the call).  On the I/O thread, under [L]. */
    void (*start)(void *arg, wk_dispatch *disp, wk_request *req);
} wk_pull_hooks;

typedef struct wk_pull_options {
    pthread_mutex_t *lock;        /* the worker's */
    const atomic_bool *stopping;
    wk_store *store;
    wk_device *dev;
    void *sock;                   /* the conductor socket: refusals (I/O thread) */
    const char *worker;           /* this worker's name, for messages */
    evloop *loop;                 /* the I/O thread's */
    const char *listen;           /* peer_listen: this worker serves pulls there; NULL: none */
    const bt_curve_keypair *own;  /* CURVE on the worker-to-worker sockets; NULL: none */
    int wake_fd;                  /* signalled when a served reply's bytes are released */
} wk_pull_options;

typedef struct wk_pull wk_pull;

/* Every pointer of OPT is borrowed.  The worker-to-worker sockets get a
 * ZeroMQ context of their own, hence an I/O thread of their own: the bytes
 * of a large pull (encrypted, under CURVE) then never queue in front of
 * the heartbeats on the conductor socket.  0, or a negative bt_err with
 * ERR. */
int wk_pull_create(const wk_pull_options *opt, const wk_pull_hooks *hooks, wk_pull **out,
                   char *err, size_t errlen);
/* Closes the worker-to-worker sockets and terminates their context, which
 * hands back the last replies' pins; wk_pull_destroy then unpins them.
 * NULL is a no-op. */
void wk_pull_close(wk_pull *p);
void wk_pull_destroy(wk_pull *p);

/* The endpoint the worker serves pulls on ("" when none). */
const char *wk_pull_endpoint(const wk_pull *p);
/* Takes in what a Peers message says of peer PI (not this worker).  0 or
 * BT_ENOMEM.  I/O thread, without the lock: a peer found lost fails its
 * pulls at once. */
int wk_pull_peer(wk_pull *p, const Baton__V1__PeerInfo *pi);
/* Hands back the pins of served replies ZeroMQ released (after WAKE_FD
 * was signalled).  I/O thread. */
void wk_pull_drain(wk_pull *p);
/* Fails the pulls of silent producers; milliseconds until the next check
 * is due (-1: none).  I/O thread. */
long wk_pull_tick(wk_pull *p, uint64_t now_ns);

/* Whether dispatch D has a chunk to pull from another host. */
bool wk_pull_needed(const Baton__V1__Dispatch *d);
/* Parks DISP (of REQ; the caller's reference passes to the park) and
 * starts pulling its SOCKET chunks into the own pool; the dispatch is
 * handed to hooks.start when they are all in, or refused with one Done.
 * I/O thread, without the lock. */
void wk_pull_start(wk_pull *p, wk_dispatch *disp, wk_request *req);
/* Drops the parked dispatches of REQ (SessionClose): no Done is sent, and
 * the record of REQ is left for the caller to collect.  [L] */
void wk_pull_request_closed(wk_pull *p, wk_request *req);
/* An Extend or a Drop for a node whose dispatch is parked: its window is
 * widened, or it is discarded (no Done) or its window cut short.  [L] */
void wk_pull_extend(wk_pull *p, const Baton__V1__Extend *e);
void wk_pull_drop(wk_pull *p, const Baton__V1__Drop *dr);
/* Drops every parked dispatch (shutdown).  [L] */
void wk_pull_cancel_all(wk_pull *p);

#endif
