/* Run-ahead chains: a worker running a loop node's next iterations by
 * itself, inside the speculation window the conductor granted.
 *
 * A chain is opened by a Dispatch whose speculate_upto lies past its own
 * innermost iteration.  When iteration i completes without the finish
 * signal, the lane that ran it queues i+1 at once, before the Done of i
 * has even left (it leaves first all the same: events go out in order).
 * Chaining on the lane rather than the I/O thread saves two thread
 * hand-offs per iteration, which is the whole cost of a run-ahead step of
 * a cheap node.  The next iteration is the same Dispatch, the innermost
 * index raised, and each LoopBack pair's output of i bound in place of
 * its input.  Those tensors were reported in Done i, so the conductor owns
 * their lifetime (it releases them later); the chain only borrows them.
 * Only one item of a chain exists at a time, so the Dones of a chain go
 * out in iteration order.  Extend widens a window, Drop cuts it and
 * discards the iterations past it, SessionClose ends every chain of the
 * request.
 *
 * Everything here runs under the worker's lock: on the I/O thread, except
 * wk_runahead_item_ended, which the lane that ran the item calls. */
#ifndef BATON_WORKER_RUNAHEAD_H
#define BATON_WORKER_RUNAHEAD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "proto/baton.pb-c.h"
#include "worker/executor.h"
#include "worker/item.h"
#include "worker/store.h"

/* The run-ahead window of one node of one request (req->chains). */
typedef struct wk_chain {
    wk_request *req;
    uint32_t graph, node;
    wk_dispatch *disp;            /* the dispatch that opened it; a reference held */
    wk_model *model;
    uint32_t upto;                /* last innermost iteration it may run */
    bool active;                  /* false: chain no further */
    bool pending;                 /* an item of it is queued or running */
    bool have_last;
    uint32_t last;                /* innermost iteration last completed */
    wk_ref **next_inputs;         /* per input: loop-back value for last + 1 */
    struct wk_chain *next;
} wk_chain;

typedef struct wk_runahead wk_runahead;

/* Chains over EX's queues and ST's records; STOPPING (borrowed) ends them
 * all.  0 or BT_ENOMEM. */
int wk_runahead_create(wk_executor *ex, wk_store *st, const atomic_bool *stopping,
                       wk_runahead **out);
void wk_runahead_destroy(wk_runahead *ra);

/* Creates and queues the item of DISP (of REQ) on MODEL, opening its
 * node's chain when the dispatch grants a window.  0, or BT_ENOMEM with
 * nothing queued and no chain left open.  [L] */
int wk_runahead_start(wk_runahead *ra, wk_dispatch *disp, wk_request *req, wk_model *model);
/* Opens a chain for DISP's node (replacing the node's old one); NULL when
 * memory is short.  wk_runahead_start's first half, for tests.  [L] */
wk_chain *wk_runahead_open(wk_runahead *ra, wk_request *req, wk_dispatch *disp);
/* IT finished executing (called by its lane before its end is reported):
 * queues its chain's next iteration if the window allows, and detaches IT
 * from the chain.  [L] */
void wk_runahead_item_ended(wk_runahead *ra, wk_item *it);
/* A queued IT is destroyed without running: its chain has nothing
 * pending any more, and with STOP chains no further.  [L] */
void wk_runahead_forget(wk_runahead *ra, wk_item *it, bool stop);
void wk_runahead_extend(wk_runahead *ra, const Baton__V1__Extend *e); /* [L] */
void wk_runahead_drop(wk_runahead *ra, const Baton__V1__Drop *d);     /* [L] */
/* Ends every chain of REQ (SessionClose).  [L] */
void wk_runahead_close(wk_runahead *ra, wk_request *req);

#endif
