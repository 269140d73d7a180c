/* Tensor-parallel groups: the leader's steps, mirrored on the followers.
 *
 * A model with tp N is loaded on N workers, one shard per rank, and its
 * ranks meet in collectives (an all-reduce per layer) that only complete
 * when every rank calls them with the same shapes in the same order.  The
 * conductor dispatches the model's nodes to rank 0 alone, so rank 0 decides
 * every batch: before each execute() it describes the step (the sessions it
 * closed, then each item's request key, inputs by value, outputs and
 * sampling) in a TpStep, which the conductor relays to the other ranks.  A
 * follower runs the same step through the same backend on its own lane,
 * as a job of the executor, with a ctx of its own that keeps its outputs
 * to itself: only the leader reports.  Steps keep their order on the way
 * (one lane runs a model at a time, the I/O thread sends events in order,
 * and ZeroMQ keeps each pipe's order), which is what makes the ranks'
 * sequences of collectives equal.
 *
 * What a step carries is small for the models this serves (prompts and
 * token ids); inputs are copied by value rather than shared by reference so
 * that a follower never reads memory the leader has already freed.  A step
 * whose inputs exceed 64 MiB is refused on the leader.
 *
 * A rank that can no longer run what the others run (out of memory, a pool
 * that is full here but was not on rank 0) exits with WK_EXIT_GROUP_BROKEN:
 * the others would wait for it in a collective forever, and the conductor
 * restarts the whole group. */
#ifndef BATON_WORKER_TP_H
#define BATON_WORKER_TP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "baton/backend.h"
#include "proto/baton.pb-c.h"
#include "worker/device.h"
#include "worker/events.h"
#include "worker/executor.h"
#include "worker/store.h"

typedef struct wk_tp_options {
    pthread_mutex_t *lock;        /* the worker's */
    const atomic_bool *stopping;
    wk_executor *ex;              /* the follower's steps are its jobs */
    wk_store *store;              /* the follower's scratch comes from the pool */
    wk_device *dev;
    wk_events *events;            /* the leader's steps leave on the I/O thread */
    void *sock;                   /* the conductor socket (I/O thread) */
    const char *device;           /* ctx->device of the follower's ctx */
    uint32_t threads;             /* ctx->threads */
} wk_tp_options;

typedef struct wk_tp wk_tp;

/* Every pointer of OPT is borrowed.  0 or BT_ENOMEM. */
int wk_tp_create(const wk_tp_options *opt, wk_tp **out);
/* Closes the followers' sessions and frees the steps kept for models
 * still loading; the lanes must be stopped and the models still loaded.
 * NULL is a no-op. */
void wk_tp_destroy(wk_tp *tp);

/* What the executor's lead hook does (wk_executor_hooks.lead): hands the
 * step about to run to the I/O thread for the followers, with the inputs'
 * bytes read on CTX's stream.  0, or -1 after failing every item of RUN:
 * no rank may run a step the others do not. */
int wk_tp_lead(wk_tp *tp, baton_ctx *ctx, wk_model *m, const uint64_t *closed, size_t n_closed,
               baton_item *const *run, size_t n);

/* A TpStep arrived (MSG, owned from here on): it joins its model's jobs
 * when the model is loaded here as a follower, waits for the model when
 * LOADING (the leader's load finished first), and otherwise breaks the
 * group.  I/O thread. */
void wk_tp_on_step(wk_tp *tp, Baton__V1__ConductorMessage *msg, bool loading);
/* Follower M finished loading: its early steps join its jobs.  [L] */
void wk_tp_loaded(wk_tp *tp, wk_model *m);
/* The load of MODEL failed: its early steps go.  I/O thread. */
void wk_tp_load_failed(wk_tp *tp, const char *model);
/* Steps run as a follower so far. */
uint64_t wk_tp_steps(const wk_tp *tp);

/* Exits with WK_EXIT_GROUP_BROKEN after logging WHY (see above). */
_Noreturn void wk_tp_broken(const char *model, const char *why);

#endif
