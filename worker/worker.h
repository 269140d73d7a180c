/* baton-worker: the process that holds models and runs nodes.
 * main_worker.c reads the command line and the config into wk_options;
 * worker.c makes the modules and runs the I/O thread (see there for the
 * layers).
 *
 * One I/O thread (the caller of wk_worker_run) owns a ZeroMQ DEALER
 * connected to the conductor's workers endpoint and answers every
 * ConductorMessage as proto/baton.proto describes; an executor batches
 * dispatches per (model, mode) and runs them on `streams` lane threads. */
#ifndef BATON_WORKER_WORKER_H
#define BATON_WORKER_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "baton/backend.h"
#include "common/curve.h"
#include "worker/pool.h"

typedef struct wk_options {
    const char *name;         /* worker name: its Register, shm name, logs */
    const char *run_id;       /* the conductor's run id, part of the shm name */
    uint64_t incarnation;     /* high bits of every tensor id (restarts never reuse ids) */
    const char *endpoint;     /* conductor's workers endpoint */
    const char *device;       /* "cpu" or "cuda:N" */
    uint64_t pool_bytes;      /* pool size */
    uint32_t streams;         /* compute lanes (threads), >= 1 */
    uint32_t threads;         /* CPU threads one kernel may use */
    uint32_t inline_us;       /* wk_executor_options.inline_ns, µs; used on a CPU only */
    uint32_t index;           /* worker index until Peers says otherwise */
    uint32_t comm_streams;    /* the config's streams.comm, handed to model_load */
    baton_device_profile profile; /* the device's cost model (strings borrowed) */
    /* CURVE: the conductor's public key, set when the workers endpoint is
     * tcp with daemon.curve (NULL: a plain connection), and this worker's
     * own pair, set whenever daemon.curve is (NULL: no CURVE anywhere),
     * which the worker-to-worker socket uses too.  Borrowed, Z85. */
    const char *curve_server_public;
    const bt_curve_keypair *curve_own;
    const char *host;         /* host name to report; NULL: gethostname() */
    const char *peer_listen;  /* endpoint of the worker-to-worker ROUTER; NULL: none */
} wk_options;

typedef struct wk_worker wk_worker;

/* Creates the pool, the socket, the modules and the lanes.  Returns 0, or a
 * negative bt_err with the reason in ERR (nothing is left behind).  The
 * strings of OPT must outlive the worker. */
int wk_worker_create(const wk_options *opt, wk_worker **out, char *err, size_t errlen);

/* Registers, then serves until Shutdown, SIGTERM or SIGINT.  Returns the
 * process exit status (0 on an orderly stop).  SIGTERM and SIGINT must be
 * blocked in every thread before wk_worker_create (they are read from a
 * signalfd). */
int wk_worker_run(wk_worker *w);

/* Stops the lanes, unloads models, unlinks the segment.  NULL is a no-op. */
void wk_worker_destroy(wk_worker *w);

/* The I/O thread's two halves, which wk_worker_run calls as the conductor
 * socket and the inbox's fd become readable: one ConductorMessage frame of
 * LEN bytes handled, and what the lanes and loaders posted taken in.  For
 * tests/fuzz/fuzz_worker.c, which drives them without the loop. */
void wk_worker_handle_frame(wk_worker *w, const void *data, size_t len);
void wk_worker_run_events(wk_worker *w);
/* The inbox's fd: readable while wk_worker_run_events has work. */
int wk_worker_events_fd(const wk_worker *w);

/* What a worker holds, for tests. */
typedef struct wk_worker_stats {
    wk_pool_stats pool;
    uint32_t live_tensors;
    uint32_t open_sessions;
    uint32_t queued;          /* items waiting for a lane */
    size_t items;             /* items queued or running */
    bool loading;             /* a model load is in flight */
    bool quit;                /* a Shutdown was handled */
} wk_worker_stats;
void wk_worker_get_stats(wk_worker *w, wk_worker_stats *out);
/* Whether MODEL is loaded. */
bool wk_worker_has_model(wk_worker *w, const char *model);

#endif
