/* What executions produced, reported to the conductor, and the end of a
 * request on this worker.
 *
 * A lane reports a chunk or the end of an item through the executor's
 * hooks; this module turns each into an event for the I/O thread, which
 * then sends a Chunk or a Done (outputs as pool references, client-bound
 * ones of at most WK_INLINE_MAX bytes with their bytes inline), or, when
 * the item was cancelled, its request closed or the worker is stopping,
 * frees what the execution made instead, since nobody will ask for it.
 *
 * A request ends here with SessionClose: its queued items go, its running
 * ones are cancelled, and once the last of them has ended, its chains,
 * tensors and backend sessions go too (wk_report_finalize).
 *
 * The struct holds borrowed pointers only; the worker's top fills it. */
#ifndef BATON_WORKER_REPORT_H
#define BATON_WORKER_REPORT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "worker/ctx.h"
#include "worker/device.h"
#include "worker/events.h"
#include "worker/executor.h"
#include "worker/item.h"
#include "worker/peers.h"
#include "worker/pull.h"
#include "worker/runahead.h"
#include "worker/store.h"

typedef struct wk_report {
    pthread_mutex_t *lock;        /* the worker's */
    const atomic_bool *stopping;
    wk_store *store;
    wk_peers *peers;              /* inline bytes of a peer's tensor passed through */
    wk_device *dev;
    wk_events *events;
    void *sock;                   /* the conductor socket (I/O thread) */
    wk_executor *ex;
    wk_runahead *ra;
    wk_pull *pull;
} wk_report;

/* The executor's chunk hook: C goes to the I/O thread.  0, or BT_ENOMEM
 * (nothing posted). */
int wk_report_chunk(const wk_report *rp, wk_item *it, const wk_chunk *c);
/* The executor's item_ended hook, after the run-ahead chain has had its
 * say: the item's Done goes to the I/O thread.  [L] */
void wk_report_item_ended(const wk_report *rp, wk_item *it);

/* Model MODEL's prefix cache changed (R, copied): a CacheReport goes to
 * the I/O thread, after what was posted before it.  Out of memory loses it
 * (the conductor's routing then misses a prefix, nothing worse). */
void wk_report_cache(const wk_report *rp, const char *model, const baton_cache_report *r);

/* SessionClose of request KEY.  [L] */
void wk_report_session_close(const wk_report *rp, uint64_t key);
/* REQ's last running item ended (or none ran): frees what is left of it
 * (chains, tensors, sessions) and its record.  [L] */
void wk_report_finalize(const wk_report *rp, wk_request *req);

#endif
