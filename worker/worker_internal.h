/* The worker's state, shared by its modules (store, executor, chains, the
 * I/O thread).  Not a public header: worker/worker.h is the interface.
 *
 * Threads and the one lock.  The I/O thread owns the ZeroMQ socket and
 * handles every conductor message; `streams.compute` lane threads run
 * execute(); a short-lived thread per Load runs model_load().  Everything
 * below marked [L] is guarded by wk_worker.lock: the tensor table, request
 * records, the pool allocator, the executor queues, peer mappings and the
 * event queue.  The lock is never held across a backend call or a large
 * copy, so it stays short; one lock rather than several keeps the
 * invariants that span them (a tensor's request, an item's queue) simple.
 *
 * Who frees what.  Items and request records are freed only by the I/O
 * thread, so a lane may use its items without further locking until it
 * posts their DONE event.  Chains are only touched under the lock (a lane
 * chains the next iteration itself, see dispatch.c).  Tensors are freed only on Release, on
 * SessionClose, or when the worker itself made them and never reported them
 * (a dropped or failed execution, a join or allocation no output took). */
#ifndef BATON_WORKER_WORKER_INTERNAL_H
#define BATON_WORKER_WORKER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/builtin.h"
#include "baton/backend.h"
#include "common/clock.h"
#include "common/u64map.h"
#include "proto/baton.pb-c.h"
#include "worker/device.h"
#include "worker/plugin.h"
#include "worker/pool.h"
#include "worker/shm.h"
#include "worker/worker.h"

#define WK_INLINE_MAX (64u * 1024u) /* client outputs up to this many bytes go inline */
#define WK_MAX_DEPTH 16             /* iteration vector length accepted */
#define WK_MAX_PORTS 1024           /* inputs or outputs of one node accepted */
#define WK_EXIT_DEVICE_LOST 3       /* exit status after a sticky CUDA error */
#define WK_EXIT_GROUP_BROKEN 4      /* exit status when a tensor-parallel rank cannot follow
                                       its group (the conductor restarts the whole group) */

typedef struct wk_request wk_request;
typedef struct wk_item wk_item;
typedef struct wk_chain wk_chain;
typedef struct wk_model wk_model;

/* Where a tensor lives, as the wire names it. */
typedef struct wk_ref {
    bool own;                     /* in this worker's pool (owner = self) */
    uint32_t owner;               /* worker index when !own */
    uint32_t pool;
    uint64_t offset, nbytes;
    uint64_t id;
    baton_dtype dtype;
    uint32_t ndim;
    int64_t dims[BATON_MAX_DIMS];
} wk_ref;

/* A tensor in the own pool. */
typedef struct wk_tensor {
    wk_ref ref;                   /* ref.own is true */
    wk_pool_blk *blk;
    wk_request *req;              /* the request it belongs to */
    uint32_t pins;                /* executions reading or writing it now */
    bool released;                /* out of the table; freed when pins drops to 0 */
    struct wk_tensor *prev, *next; /* in req->tensors */
} wk_tensor;

/* An open backend session of one request on one model. */
typedef struct wk_session {
    wk_model *model;
    baton_session *s;
    struct wk_session *next;
} wk_session;

/* A copy the worker staged for a loop's iterations: the source tensor
 * (owner, id; ids are never reused, so the pair names fixed bytes) and the
 * own tensor holding its copy. */
typedef struct wk_staged {
    uint32_t owner;
    uint64_t src_id;
    uint64_t id;                  /* own tensor; looked up, so a release is noticed */
} wk_staged;

/* Per request key: what the worker holds for it.  Created on the first Put
 * or Dispatch, destroyed when nothing is held any more (no tensor, item,
 * session or chain), so a request that ends leaves no record. */
struct wk_request {
    uint64_t key;
    wk_tensor *tensors;           /* [L] */
    size_t n_items;               /* [L] queued + running */
    size_t n_running;             /* [L] */
    wk_session *sessions;         /* [L] */
    wk_chain *chains;             /* [L] */
    wk_item *items;               /* [L] its queued and running items */
    bool closed;                  /* [L] SessionClose seen; waits for running items */
    wk_staged *staged;            /* [L] copies staged for loop iterations (inputs.c) */
    size_t n_staged, cap_staged;
};

/* A Dispatch shared by the items it gives rise to (its run-ahead chain). */
typedef struct wk_dispatch {
    Baton__V1__ConductorMessage *msg; /* owned (protobuf-c unpacked) */
    const Baton__V1__Dispatch *d;
    uint64_t deadline_ns;         /* from remaining_ms at arrival; 0: none */
    uint32_t refs;                /* [L] items and chains using it */
    uint64_t *pulled;             /* own tensors holding inputs pulled from another host
                                     (pull.c), released with the dispatch; owned */
    size_t n_pulled;
    struct wk_worker *w;          /* set with pulled: who releases them */
} wk_dispatch;

/* A tensor one execution reads or made. */
typedef struct wk_slot {
    baton_tensor t;               /* what the backend sees; t.handle = slot index + 1 */
    wk_ref ref;
    wk_tensor *own;               /* own tensor pinned by the item, or NULL */
    wk_mapping *map;              /* peer mapping pinned by the item, or NULL */
    bool created;                 /* made by this execution (join, alloc) */
    bool writable;                /* from alloc: the backend may write it */
    bool chunked;                 /* emitted as a chunk (reported at once) */
} wk_slot;

/* A result of an execution, kept past the execution for the Done. */
typedef struct wk_result {
    bool set;
    bool created;                 /* the worker made it: free it if never reported */
    wk_ref ref;
} wk_result;

typedef enum wk_item_state { WK_ITEM_QUEUED, WK_ITEM_RUNNING } wk_item_state;

struct wk_item {
    baton_item b;                 /* what the backend sees */
    wk_dispatch *disp;
    wk_request *req;
    wk_model *model;
    struct wk_queue *queue;
    wk_chain *chain;              /* [L] the window it belongs to, or NULL (cleared
                                     when the item finishes executing) */
    bool speculative;             /* run ahead by the worker itself */
    uint32_t iter[WK_MAX_DEPTH];
    wk_ref **overrides;           /* per input: a loop-back value replacing it, or NULL */
    wk_item_state state;          /* [L] */
    atomic_bool cancelled;        /* set under [L]; read by lanes without it */
    uint64_t arrive_ns, start_ns, end_ns; /* CLOCK_MONOTONIC */
    uint64_t deadline_ns;         /* 0: none */
    /* Execution scratch, owned by the running lane. */
    baton_input *inputs;
    baton_output *outputs;
    wk_slot **slots;
    size_t n_slots, cap_slots;
    wk_result *results;           /* per output */
    uint32_t *chunk_next;         /* per output: next chunk index */
    bool *stream_closed;          /* per output */
    baton_status status;
    char *message;
    bool finish;
    uint32_t batch_size;
    uint32_t prompt_tokens;       /* what the backend counted (count_tokens) */
    uint32_t generated_tokens;
    wk_item *prev, *next;         /* [L] in its queue */
    wk_item *req_prev, *req_next; /* [L] in req->items */
};

/* Run-ahead window of one node of one request (a speculation window). */
struct wk_chain {
    wk_request *req;
    uint32_t graph, node;
    wk_dispatch *disp;            /* the dispatch that opened it */
    wk_model *model;
    uint32_t upto;                /* last innermost iteration it may run */
    bool active;                  /* false: chain no further */
    bool pending;                 /* an item of it is queued or running */
    bool have_last;
    uint32_t last;                /* innermost iteration last completed */
    wk_ref **next_inputs;         /* per input: loop-back value for last + 1 */
    struct wk_chain *next;
};

typedef struct wk_queue {
    char *mode;
    wk_item *head, *tail;         /* [L] */
    size_t n;
    struct wk_queue *next;
} wk_queue;

/* A session waiting to be closed when its model is idle. */
typedef struct wk_close {
    baton_session *s;
    uint64_t key;                 /* its request key (a tensor-parallel leader tells its
                                     followers to close theirs) */
    struct wk_close *next;
} wk_close;

/* A TpStep from the conductor waiting for its model's lane (followers). */
typedef struct wk_tp_step {
    Baton__V1__ConductorMessage *msg; /* owned; msg->tp_step */
    struct wk_tp_step *next;
} wk_tp_step;

/* A follower's session of a tensor-parallel model, named by the leader's
 * request key.  Kept apart from the request records: only the leader's
 * steps open and close it, never this worker's own Dispatch traffic. */
typedef struct wk_tp_session {
    uint64_t key;
    baton_session *s;
    struct wk_tp_session *next;
} wk_tp_session;

struct wk_model {
    char *name;
    char *backend_spec;
    const baton_backend *backend;
    baton_model *handle;
    uint32_t max_batch;
    uint32_t tp_rank, tp_size;
    bool busy;                    /* [L] a lane runs it */
    wk_queue *queues;             /* [L] one per mode */
    wk_close *closing;            /* [L] */
    wk_tp_step *tp_head, *tp_tail; /* [L] follower: steps to run, in order */
    wk_tp_session *tp_sessions;   /* follower: the lane running the model only */
    struct wk_model *next;
};

typedef enum wk_event_kind {
    WK_EV_CHUNK,
    WK_EV_DONE,
    WK_EV_LOADED,
    WK_EV_SEND,
    WK_EV_NCCL
} wk_event_kind;

/* What lanes and loaders hand to the I/O thread, in order. */
typedef struct wk_event {
    wk_event_kind kind;
    wk_item *item;                /* CHUNK, DONE */
    uint32_t output;              /* CHUNK: output index */
    bool has_ref, created, final; /* CHUNK */
    wk_ref ref;                   /* CHUNK */
    uint32_t index;               /* CHUNK */
    struct wk_load *load;         /* LOADED */
    uint8_t *bytes;               /* SEND: a packed WorkerMessage (malloc'd) */
    size_t len;                   /* SEND */
    struct nccl_op *nccl;         /* NCCL: a finished transfer (nccl.c, owned) */
    struct wk_event *next;
} wk_event;

typedef struct wk_load {
    pthread_t thread;
    Baton__V1__ConductorMessage *msg; /* owned; msg->load */
    const baton_backend *backend;
    baton_model *handle;
    baton_status status;
    char err[512];
    uint64_t load_us;
    uint32_t threads;
    uint8_t comm_id[BK_COMM_ID_MAX]; /* tp > 1: the group's id (made here on rank 0) */
    size_t comm_id_len;           /* 0: none */
    struct wk_worker *w;
    struct wk_load *next;         /* in w->loading (I/O thread only) */
} wk_load;

struct wk_worker {
    wk_options opt;               /* strings borrowed from the caller */
    uint32_t self_index;          /* TensorRef.owner of our tensors */
    char hostname[256];

    pthread_mutex_t lock;
    pthread_cond_t work;          /* [L] lanes wait for work */
    pthread_cond_t wake;          /* [L] sleeping items wait for cancel */
    atomic_bool stopping;         /* set under [L]; lanes and cancelled() read it */

    wk_device *dev;               /* the pool's memory and copies (device.h) */
    struct wk_nccl *nccl;         /* cross-host GPU transfers (nccl.h); owned */
    void *io_stream;              /* the I/O thread's stream for its copies */
    wk_pool *pool;                /* [L] */
    wk_peers peers;               /* [L] */
    u64map tensors;               /* [L] id -> wk_tensor */
    u64map requests;              /* [L] key + 1 -> wk_request */
    uint64_t next_counter;        /* [L] low 40 bits of the next tensor id */
    uint32_t n_tensors;           /* [L] live tensors */
    uint32_t n_sessions;          /* [L] */
    uint32_t n_queued;            /* [L] */
    atomic_uint_fast64_t tp_steps; /* steps run as a tensor-parallel follower */

    wk_registry *registry;        /* I/O thread */
    wk_model *models;             /* [L] */
    wk_load *loading;             /* I/O thread */
    wk_tp_step *tp_early;         /* I/O thread: steps for a model still loading */

    wk_event *ev_head, *ev_tail;  /* [L] */
    int event_fd;                 /* eventfd: events are waiting */

    pthread_t *lanes;
    uint32_t n_lanes;

    struct wk_xfer *xfer;         /* I/O thread: worker-to-worker pulls (xfer.h) */
    struct wk_pull_job *pull_jobs; /* I/O thread, [L]: dispatches waiting for pulls */

    void *zctx, *sock;
    void *monitor;                /* PAIR receiving the socket's CONNECTED events */
    uint32_t connects;            /* connections made so far (a reconnect re-registers) */
    int signal_fd;           /* read end of the stop-signal pipe */
    int signal_wr;           /* its write end (the handler's) */
    int exit_code;
    bool quit;                    /* I/O thread: leave the loop */
};

/* --- store.c: tensors and request records [L] ---------------------------- */

wk_request *wk_request_get(wk_worker *w, uint64_t key, bool create);
/* Destroys REQ when it holds nothing any more. */
void wk_request_gc(wk_worker *w, wk_request *req);
/* [L] Gives T the id the conductor chose for it (Put.tensor_id); -1 when
 * that id is taken or invalid. */
int wk_tensor_rekey(wk_worker *w, wk_tensor *t, uint64_t id);
/* Allocates a tensor of REQ: dtype and dims as given, a fresh id, pinned
 * once when PIN.  NULL when the pool is full or the shape is invalid. */
wk_tensor *wk_tensor_new(wk_worker *w, wk_request *req, baton_dtype dtype, uint32_t ndim,
                         const int64_t *dims, bool pin);
/* The live tensor ID, or NULL. */
wk_tensor *wk_tensor_find(wk_worker *w, uint64_t id);
/* Takes ID out of the table and frees it now, or at its last unpin.
 * Unknown ids are ignored.  Does not collect the request record. */
void wk_tensor_release(wk_worker *w, uint64_t id);
void wk_tensor_unpin(wk_worker *w, wk_tensor *t);
void *wk_tensor_data(wk_worker *w, const wk_tensor *t);
/* Releases every tensor of REQ. */
void wk_request_release_all(wk_worker *w, wk_request *req);

/* --- executor.c ---------------------------------------------------------- */

int wk_executor_start(wk_worker *w);
/* Stops and joins the lanes; items still queued are left for the caller. */
void wk_executor_stop(wk_worker *w);
wk_model *wk_model_find(wk_worker *w, const char *name); /* [L] */
/* Queues ITEM on its model's queue for its mode and wakes a lane.  [L] */
int wk_executor_enqueue(wk_worker *w, wk_item *item);
/* Takes a queued ITEM out of its queue.  [L] */
void wk_executor_dequeue(wk_worker *w, wk_item *item);
/* Hands the sessions of REQ to their models to close when idle.  [L] */
void wk_executor_close_sessions(wk_worker *w, wk_request *req);
/* Marks ITEM cancelled and wakes a sleeping execution.  [L] */
void wk_item_cancel(wk_worker *w, wk_item *item);
/* Appends an event for the I/O thread and signals it.  [L] */
void wk_event_push(wk_worker *w, wk_event *ev);
/* Closes pending sessions and unloads every model; lanes are stopped. */
void wk_models_destroy(wk_worker *w);
/* Exits the process (WK_EXIT_DEVICE_LOST) when the device context is
 * unusable after a CUDA error on model M. */
void wk_executor_exit_if_lost(wk_worker *w, const wk_model *m);

/* --- tp.c: tensor-parallel groups ----------------------------------------- */

/* Whether this worker holds M as rank 0 of a tensor-parallel group (it
 * runs the steps and tells the others), or as one of the other ranks. */
static inline bool wk_model_leads(const wk_model *m)
{
    return m->tp_size > 1 && m->tp_rank == 0;
}
static inline bool wk_model_follows(const wk_model *m)
{
    return m->tp_size > 1 && m->tp_rank > 0;
}

/* Leader (rank 0 of a group): hands the step about to run (sessions closed
 * first, then the N items of RUN) to the I/O thread for the followers,
 * with the inputs' bytes read on CTX's stream.  Returns 0, or -1 after
 * failing every item of RUN: no rank may run a step the others do not. */
int wk_tp_lead(wk_worker *w, baton_ctx *ctx, wk_model *m, const uint64_t *closed,
               size_t n_closed, baton_item *const *run, size_t n);
/* Follower: queues the TpStep in MSG (owned) on its model, or keeps it
 * until the model has loaded.  I/O thread. */
void wk_tp_on_step(wk_worker *w, Baton__V1__ConductorMessage *msg);
/* Follower: model M finished loading; its early steps join its queue.  [L] */
void wk_tp_loaded(wk_worker *w, wk_model *m);
/* Follower: runs STEPS (a list taken off M's queue, freed here) on the
 * calling lane, whose stream is STREAM. */
void wk_tp_follow(wk_worker *w, wk_model *m, void *stream, wk_tp_step *steps);
/* Closes a follower's sessions of M (unload). */
void wk_tp_sessions_close(wk_model *m);
/* Frees steps never run (shutdown). */
void wk_tp_steps_free(wk_tp_step *steps);
/* Drops the early steps of MODEL, whose load failed.  I/O thread. */
void wk_tp_load_failed(wk_worker *w, const char *model);
/* Exits with WK_EXIT_GROUP_BROKEN after logging WHY: this rank can no
 * longer run what the other ranks of MODEL's group run, and they would wait
 * for it in a collective forever. */
_Noreturn void wk_tp_broken(const char *model, const char *why);

/* --- ctx.c and inputs.c: one execution's view ---------------------------- */

/* Fails IT with CODE and MESSAGE unless it failed already (the first error
 * explains the rest). */
void wk_item_fail(wk_item *it, baton_status code, const char *msg);
/* A new slot of IT (its handle set), or NULL. */
wk_slot *wk_slot_add(wk_item *it);
/* Fills the slot's baton_tensor from its ref, with DATA as element 0. */
void wk_slot_view(wk_slot *s, const void *data);
/* The baton_ctx callbacks (include/baton/backend.h), bound to W and the
 * lane's STREAM (NULL on the host). */
void wk_ctx_init(baton_ctx *ctx, wk_worker *w, void *stream);

/* The own tensor holding REQ's copy of the tensor REF names (staged for a
 * loop's iterations, or pulled from another host), or NULL.  [L] */
wk_tensor *wk_staged_find(wk_worker *w, const wk_request *req, const wk_ref *ref);
/* Remembers that own tensor ID holds REQ's copy of REF.  0 or -1.  [L] */
int wk_staged_add(wk_request *req, const wk_ref *ref, uint64_t id);

typedef struct wk_join_job wk_join_job;
/* Allocates IT's input and output tables and resolves every input (see
 * inputs.c); joins to copy are appended to *JOBS.  On failure the item is
 * failed with a status naming the node and input.  [L] */
void wk_item_prepare(wk_worker *w, wk_item *it, wk_join_job **jobs);
/* Copies and frees the joins on STREAM, the calling lane's, and waits for
 * them; a failed copy fails its item.  Runs without the lock. */
void wk_join_jobs_run(wk_worker *w, wk_join_job *jobs, void *stream);

/* --- dispatch.c: items and run-ahead chains ------------------------------- */

/* Creates the item for (DISP, iteration vector ITER of DEPTH) and queues
 * it.  OVERRIDES (per input, may be NULL) are copied. */
wk_item *wk_item_create(wk_worker *w, wk_dispatch *disp, wk_request *req, wk_model *model,
                        const uint32_t *iter, uint32_t depth, wk_ref *const *overrides);
/* Frees an item that is neither queued nor running.  [L] */
void wk_item_destroy(wk_worker *w, wk_item *item);
void wk_dispatch_unref(wk_dispatch *d);
/* Tensor ID, one of D's pulled copies, was reported to the conductor (a
 * backend passed the input through as an output): the conductor now owns
 * it, and the dispatch no longer releases it.  [L] */
void wk_dispatch_claim(wk_dispatch *d, uint64_t id);

/* A Dispatch with a window opened a chain for ITEM's node. */
wk_chain *wk_chain_open(wk_worker *w, wk_request *req, wk_dispatch *disp);
/* ITEM of a chain finished executing (called by its lane, before its DONE
 * event is posted): queues the next iteration if the window allows, and
 * detaches ITEM from the chain.  [L] */
void wk_chain_after_done(wk_worker *w, wk_item *item);
void wk_chain_extend(wk_worker *w, const Baton__V1__Extend *e); /* [L] */
void wk_chain_drop(wk_worker *w, const Baton__V1__Drop *d);     /* [L] */
/* Ends every chain of REQ (SessionClose).  [L] */
void wk_chain_close_all(wk_worker *w, wk_request *req);
/* Frees CHAIN when it is inactive and has nothing pending.  [L] */
void wk_chain_maybe_free(wk_worker *w, wk_chain *c);

/* --- pull.c: inputs from other hosts --------------------------------------- */

typedef struct wk_pull_job wk_pull_job;
/* Whether dispatch D has a chunk to pull from another host. */
bool wk_pull_needed(const Baton__V1__Dispatch *d);
/* Parks DISP (of REQ) and starts pulling its SOCKET chunks into the own
 * pool; the dispatch starts when they are all in (wk_dispatch_start), or
 * fails with one Done.  I/O thread, without the lock. */
void wk_pull_start(wk_worker *w, wk_dispatch *disp, wk_request *req);
/* Drops the parked dispatches of REQ (SessionClose): no Done is sent, and
 * the record of REQ is left for the caller to collect.  [L] */
void wk_pull_request_closed(wk_worker *w, wk_request *req);
/* An Extend or a Drop for a node whose dispatch is parked: its window is
 * widened, or it is discarded (no Done) or its window cut short.  [L] */
void wk_pull_extend(wk_worker *w, const Baton__V1__Extend *e);
void wk_pull_drop(wk_worker *w, const Baton__V1__Drop *dr);
/* Drops every parked dispatch (shutdown).  [L] */
void wk_pull_cancel_all(wk_worker *w);
/* Creates w->xfer on w->zctx, bound to opt.peer_listen when set.  0, or -1
 * with ERR. */
int wk_pull_xfer_create(wk_worker *w, char *err, size_t errlen);

/* --- worker.c ---------------------------------------------------------- */

/* Creates the item of DISP (opening its run-ahead chain) and queues it;
 * fails it with a Done when its model is gone or memory is short.  [L] */
void wk_dispatch_start(wk_worker *w, wk_dispatch *disp, wk_request *req);
/* Answers dispatch D with a Done of status CODE and MESSAGE alone. */
void wk_dispatch_refuse(wk_worker *w, const Baton__V1__Dispatch *d, baton_status code,
                        const char *message);

/* Cancels every item, stops the lanes, waits for loads, frees every
 * request's tensors and sessions and unloads the models.  No message is
 * sent.  Idempotent. */
void wk_worker_quiesce(wk_worker *w);
/* The I/O thread's two halves, which wk_worker_run calls as its socket
 * and its event fd become readable: one ConductorMessage frame of LEN
 * bytes handled, and the events lanes and loaders posted answered.
 * Exported for tests/fuzz/fuzz_worker.c, which drives them without the
 * loop. */
void wk_handle_frame(wk_worker *w, const void *data, size_t len);
void wk_drain_events(wk_worker *w);
/* Queues the Dispatch in MSG (owned) whose inputs are all in reach (after
 * its NCCL receives, nccl.c). */
void wk_dispatch_accept(wk_worker *w, Baton__V1__ConductorMessage *msg);
/* Answers dispatch D with a Done of status CODE and MESSAGE alone. */
void wk_dispatch_refuse(wk_worker *w, const Baton__V1__Dispatch *d, baton_status code,
                        const char *message);

/* --- wire.c -------------------------------------------------------------- */

/* Packs and sends MSG to the conductor.  0 or -1. */
int wk_send(wk_worker *w, const Baton__V1__WorkerMessage *msg);
/* Fills T (initialized) from REF; IDS/ITER are scratch the caller keeps
 * alive until the message is packed; INLINE_DATA copies the bytes. */
void wk_ref_to_proto(wk_worker *w, const wk_ref *ref, Baton__V1__TensorRef *t, int64_t *dims,
                     const wk_item *item);
/* Converts a TensorRef from the conductor; BT_EINVAL with ERR on a bad
 * dtype, shape or stride. */
int wk_ref_from_proto(wk_worker *w, const Baton__V1__TensorRef *t, wk_ref *out, char *err,
                      size_t errlen);
void wk_send_done(wk_worker *w, wk_item *item);
void wk_send_chunk(wk_worker *w, const wk_event *ev);
/* Pointer to REF's bytes (own pool or a mapped peer), or NULL; *DEVICE
 * tells whether it is device memory.  [L] */
const void *wk_ref_bytes(wk_worker *w, const wk_ref *ref, bool *device);
/* N bytes at P readable by the host: P itself, or (DEVICE memory) a
 * malloc'd copy made on the I/O stream, *COPIED then set.  NULL when P is
 * NULL or the copy failed.  I/O thread. */
void *wk_bytes_to_host(wk_worker *w, const void *p, bool device, uint64_t n, bool *copied);

#endif
