/* Loading models: a Load from the conductor runs the backend's model_load
 * on a thread of its own, so that heartbeats go on during a long load
 * (weights of a real model take seconds), and its end comes back to the
 * I/O thread, which adds the model to the executor and answers Loaded.
 *
 * A tensor-parallel group's rank 0 makes the group's NCCL id before its
 * load and reports it (TpGroup); the other ranks' Loads carry it.
 *
 * Every function runs on the I/O thread; the struct wk_load is opaque. */
#ifndef BATON_WORKER_LOAD_H
#define BATON_WORKER_LOAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "baton/backend.h"
#include "proto/baton.pb-c.h"
#include "worker/device.h"
#include "worker/events.h"
#include "worker/executor.h"
#include "worker/plugin.h"
#include "worker/tp.h"

typedef struct wk_load_options {
    pthread_mutex_t *lock;        /* the worker's */
    const atomic_bool *stopping;  /* when set, loads end quietly */
    wk_registry *registry;        /* resolves a Load's backend */
    wk_executor *ex;              /* takes the loaded models */
    wk_tp *tp;                    /* a follower's early steps */
    wk_device *dev;
    wk_events *events;            /* a load's end comes back through it */
    void *sock;                   /* the conductor socket */
    /* Handed to model_load. */
    const char *device;
    uint32_t threads;
    const baton_device_profile *profile;
    uint32_t streams, comm_streams;
} wk_load_options;

typedef struct wk_load wk_load;

/* Every pointer of OPT is borrowed.  0 or BT_ENOMEM. */
int wk_load_create(const wk_load_options *opt, wk_load **out);
/* Waits for the loads in flight (their ends must have been run since, see
 * wk_load_wait); NULL is a no-op. */
void wk_load_destroy(wk_load *ld);

/* A Load (MSG, owned from here on): answered Loaded at once when the model
 * is there or cannot be loaded, else when its thread is done. */
void wk_load_on_load(wk_load *ld, Baton__V1__ConductorMessage *msg);
/* Whether MODEL is being loaded here. */
bool wk_load_pending(const wk_load *ld, const char *model);
/* Whether any load is in flight. */
bool wk_load_busy(const wk_load *ld);
/* Waits for every load thread (shutdown; loads cannot be interrupted).
 * Their ends then wait as events, which unload what they loaded and
 * answer nothing, the worker stopping. */
void wk_load_wait(wk_load *ld);

#endif
