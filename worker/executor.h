/* The executor: the loaded models, a queue per (model, mode), and the
 * compute lanes that run them (continuous batching).
 *
 * A lane takes a model only when no other lane runs it, and then takes up
 * to max_batch queued items of one of its modes (the mode whose head waited
 * longest) into a single execute().  Items that arrive while it runs wait
 * for the next call, so decode steps of many requests share launches
 * without a batching timer.  Models are visited round robin, so a model
 * that always has work cannot starve the others.  Running one model on one
 * lane at a time is also what the ABI promises backends: no concurrent
 * execute() or session calls per model.
 *
 * Besides items, a model may be given jobs (wk_executor_post_job): work
 * that must run on the model's lane, in order with its batches (a
 * tensor-parallel follower's steps).  The executor knows nothing of what a
 * job does.
 *
 * What happens when an item ends, or when a leader's step must be told to
 * its followers, is the caller's: the executor reports through
 * wk_executor_hooks, which the worker's top wires.
 *
 * Locking: functions marked [L] expect the worker's lock held; the lanes
 * take it themselves around their bookkeeping and never hold it across a
 * backend call or a large copy. */
#ifndef BATON_WORKER_EXECUTOR_H
#define BATON_WORKER_EXECUTOR_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "baton/backend.h"
#include "worker/ctx.h"
#include "worker/device.h"
#include "worker/item.h"
#include "worker/peers.h"
#include "worker/store.h"

#define WK_MAX_BATCH_CAP 4096u        /* larger max_batch values are clamped: lanes keep
                                         batches on the stack */

typedef struct wk_model wk_model;

#define WK_EXIT_GROUP_BROKEN 4        /* exit status when a rank cannot follow its group */

/* Work for a model's lane besides its items, run in the order posted,
 * after the batch the lane took with it. */
typedef struct wk_job wk_job;
struct wk_job {
    /* Runs on the lane that holds M, without the lock, with the lane's
     * STREAM; frees JOB. */
    void (*run)(wk_job *job, wk_model *m, void *stream);
    /* Frees a job that will never run (its model is unloaded). */
    void (*drop)(wk_job *job);
    wk_job *next;                 /* the model's */
};

/* A loaded model.  The first fields are the load's and read-only once the
 * model is added; the rest are the executor's. */
struct wk_model {
    char *name;                   /* owned */
    char *backend_spec;           /* owned: the Load's `backend` */
    const baton_backend *backend;
    baton_model *handle;          /* unloaded by the executor */
    uint32_t max_batch;           /* 1 .. WK_MAX_BATCH_CAP */
    uint32_t tp_rank, tp_size;    /* tp_size 1: no tensor parallelism */
    uint32_t step_ms;             /* tp_size > 1: the longest a lane may run it at once
                                     (Load.tp_step_ms); 0: no limit */
    bool busy;                    /* [L] a lane (or the I/O thread) runs it */
    uint64_t inline_round;        /* [L] the inline thread's call that last ran it */
    uint32_t quick;               /* [L] its last batches in a row that ran within
                                     wk_executor_options.inline_ns (those where
                                     execute() ran and deferred nothing), at most
                                     WK_INLINE_AFTER */
    uint64_t busy_since_ns;       /* [L] when that lane took it (bt_now_ns) */
    uint64_t epoch;               /* [L] counts batches that ended an item and session
                                     closes: what may let a deferred item run */
    struct wk_queue *queues;      /* [L] one per mode */
    struct wk_close *closing;     /* [L] sessions to close when idle */
    wk_job *jobs, *jobs_tail;     /* [L] */
    struct wk_model *next;        /* [L] */
};

typedef struct wk_executor_hooks {
    void *arg;
    /* On the lane, under [L]: IT's execution ended (its closing chunks
     * went to CHUNK first).  The hook must report it (a Done is due) and
     * may queue a run-ahead successor; it must not fail. */
    void (*item_ended)(void *arg, wk_item *it);
    /* A chunk, as wk_ctx_env.chunk. */
    int (*chunk)(void *arg, wk_item *it, const wk_chunk *c);
    /* On the lane, without the lock, before execute() of a model that leads
     * a tensor-parallel group (rank 0 of tp_size > 1): the step is about to
     * run, CLOSED (N_CLOSED request keys; NULL with N_CLOSED > 0 when they
     * could not be listed) naming the sessions closed just before.  0, or
     * -1 after failing every item of RUN: then nothing runs.  NULL: no
     * model leads. */
    int (*lead)(void *arg, baton_ctx *ctx, wk_model *m, const uint64_t *closed,
                size_t n_closed, baton_item *const *run, size_t n);
    /* On the lane, without the lock, after an execute() or session closes
     * of M whose prefix cache changed (baton_backend.cache_report): R is
     * valid for the call only.  NULL: not reported. */
    void (*cache)(void *arg, wk_model *m, const baton_cache_report *r);
} wk_executor_hooks;

typedef struct wk_executor_options {
    pthread_mutex_t *lock;        /* the worker's lock */
    const atomic_bool *stopping;  /* set (under the lock) before wk_executor_stop */
    wk_store *store;
    wk_peers *peers;
    wk_device *dev;
    const char *worker;           /* this worker's name */
    const char *device;           /* "cpu", "cuda:N": ctx->device */
    uint32_t threads;             /* ctx->threads */
    uint32_t lanes;               /* compute lanes, >= 1 */
    /* Wall time, ns: a model whose last WK_INLINE_AFTER batches each ran
     * within it is run by the I/O thread itself (wk_executor_run_inline)
     * instead of being handed to a lane; 0: every batch runs on a lane.
     * Only a worker whose streams are the host's sets it. */
    uint64_t inline_ns;
} wk_executor_options;

/* Batches in a row that must run within inline_ns before a model runs on
 * the I/O thread: one slow batch sends it back to the lanes at once, and
 * it comes back only after this many quick ones there. */
#define WK_INLINE_AFTER 8u

typedef struct wk_executor wk_executor;

/* Every pointer of OPT is borrowed and must outlive the executor; no lane
 * starts yet.  0 or BT_ENOMEM. */
int wk_executor_create(const wk_executor_options *opt, const wk_executor_hooks *hooks,
                       wk_executor **out);
/* Starts the lanes.  0, or BT_ETHREAD: the lanes that did start run until
 * wk_executor_stop (the caller stops the worker). */
int wk_executor_start(wk_executor *ex);
/* Wakes and joins the lanes (*stopping must be set); items still queued are
 * left for the caller.  Idempotent. */
void wk_executor_stop(wk_executor *ex);
/* Stops the lanes, closes the sessions waiting to close, drops the jobs
 * never run and unloads every model.  NULL is a no-op. */
void wk_executor_destroy(wk_executor *ex);
uint32_t wk_executor_lanes(const wk_executor *ex);

/* Takes in a loaded model (its load fields set, the rest zero).  [L] */
void wk_executor_model_add(wk_executor *ex, wk_model *m);
/* The model NAME, or NULL.  [L] */
wk_model *wk_executor_model_find(wk_executor *ex, const char *name);
/* Whether M leads, or follows, a tensor-parallel group. */
bool wk_model_leads(const wk_model *m);
bool wk_model_follows(const wk_model *m);
/* After an execute() of M: when M's tensor-parallel group failed during it
 * (the backend's model_broken), its outputs are undefined: the process
 * exits (WK_EXIT_GROUP_BROKEN) before any of them is sent.  ROLE names the
 * rank's part ("leader", "follower") for the log. */
void wk_model_exit_if_broken(const wk_model *m, const char *role);
/* A model of a tensor-parallel group whose lane has run it longer than its
 * step_ms at NOW_NS: a rank of its group is stuck in a
 * collective (or never reached it).  NULL: none.  [L] */
wk_model *wk_executor_stuck(wk_executor *ex, uint64_t now_ns);

/* Queues IT on its model's queue for its mode and wakes a lane (or, for a
 * quick model queued from the inline thread, leaves it to that thread).
 * 0 or BT_ENOMEM.  [L] */
int wk_executor_enqueue(wk_executor *ex, wk_item *it);
/* Takes a queued IT out of its queue.  [L] */
void wk_executor_dequeue(wk_executor *ex, wk_item *it);
/* Marks IT cancelled and wakes a sleeping execution.  [L] */
void wk_executor_cancel(wk_executor *ex, wk_item *it);
/* Hands the sessions of REQ to their models to close when idle.  [L] */
void wk_executor_close_sessions(wk_executor *ex, wk_request *req);
/* Appends JOB to M's jobs and wakes a lane.  [L] */
void wk_executor_post_job(wk_executor *ex, wk_model *m, wk_job *job);

/* Makes the calling thread (the worker's I/O thread) the one that runs
 * quick models: work it queues for one no longer wakes a lane, and it must
 * call wk_executor_run_inline before it next sleeps.  Without the lock,
 * before the worker's loop starts. */
void wk_executor_inline_thread(wk_executor *ex);
/* On the inline thread, without the lock: runs one step (the session
 * closes due, then a batch) of each idle quick model that has work, as a
 * lane would, and passes again while such work remains, until a pass ends
 * past inline_ns from the start; work of a model whose step was slow is
 * handed to a lane.  Returns true when work for this thread remains (a
 * run-ahead successor, a deferred item that may run): the caller must not
 * sleep before calling it again. */
bool wk_executor_run_inline(wk_executor *ex);
/* Whether work was left to the inline thread since its last
 * wk_executor_run_inline.  Takes the lock. */
bool wk_executor_inline_due(wk_executor *ex);
/* Batches the inline thread has run.  [L] */
uint64_t wk_executor_inline_batches(const wk_executor *ex);

/* Items queued, sessions open (including those counted by
 * wk_executor_count_session).  [L] */
uint32_t wk_executor_n_queued(const wk_executor *ex);
uint32_t wk_executor_n_sessions(const wk_executor *ex);
/* Counts a session opened (+1) or closed (-1) outside the executor (a
 * tensor-parallel follower's).  [L] */
void wk_executor_count_session(wk_executor *ex, int delta);

#endif
