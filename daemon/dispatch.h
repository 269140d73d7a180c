/* Dispatch: the work in flight between the graph runtime and the workers.
 *
 * The dispatcher owns the runtime (runtime/runtime.h) and feeds it every
 * event of a running request: its start, completions and chunks from the
 * workers, cancels, deadlines, failures, lost workers.  The runtime's
 * actions become worker messages here (Dispatch, Extend, Drop, batched
 * Release, SessionClose); the two that concern the client (a streamed
 * chunk, the terminal response) go out through disp_hooks to whoever holds
 * the client's side of the request.
 *
 * Per running request it keeps what a Dispatch must carry besides graph
 * state (request_id, sampling, deadline) and the per-node timings that the
 * response reports. */
#ifndef BATON_DAEMON_DISPATCH_H
#define BATON_DAEMON_DISPATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/graph.h"
#include "daemon/metrics.h"
#include "daemon/replicas.h"
#include "daemon/supervisor.h"
#include "daemon/tensors.h"
#include "runtime/runtime.h"

/* One node execution of a request, as a worker reported it. */
typedef struct disp_timing {
    int node;                     /* entity index */
    uint32_t iteration;           /* of its innermost loop; 0 outside loops */
    int worker;
    uint64_t queue_us, exec_us;
} disp_timing;

typedef struct disp_hooks {
    void *arg;
    /* A CHUNK action of request REQ. */
    void (*chunk)(void *arg, uint64_t req, const rt_action *a);
    /* The RESPONSE action of request REQ, with the timings of its nodes.
     * Called before any later action of the batch (its Releases) is sent. */
    void (*response)(void *arg, uint64_t req, const rt_action *a, const disp_timing *timings,
                     size_t n_timings);
} disp_hooks;

/* What a request carries into its Dispatches. */
typedef struct disp_params {
    const char *request_id;       /* copied */
    float temperature, top_p;
    uint32_t top_k;
    uint64_t seed;
    uint64_t deadline_ms;         /* monotonic ms: Dispatch says how long is left */
} disp_params;

typedef struct dispatcher dispatcher;

/* GS, SUP, RS, TT and M are borrowed and must outlive the dispatcher.
 * A node of a replicated model goes to the replica RS pins its request
 * to, picked at the request's first need of the model; the pins go when
 * the request responds.  0 or BT_ENOMEM. */
int disp_create(const graph_set *gs, uint32_t speculation_window, supervisor *sup,
                replicas *rs, tensor_table *tt, metrics *m, const disp_hooks *hooks,
                dispatcher **out);
void disp_destroy(dispatcher *d);

/* Starts request REQ in the runtime (rt_request_start's arguments) and
 * sends its first dispatches.  0, or the runtime's error, in which case
 * nothing was sent and the inputs are still the caller's. */
int disp_start(dispatcher *d, uint64_t req, int gi, const rt_tensor *inputs, bool stream,
               const uint32_t *max_iters, const disp_params *p);
/* Ends REQ: CANCELLED by the client, DEADLINE_EXCEEDED, or CODE with
 * MESSAGE (an input that could not be placed).  Unknown keys are ignored. */
void disp_cancel(dispatcher *d, uint64_t req);
void disp_deadline(dispatcher *d, uint64_t req);
void disp_abort(dispatcher *d, uint64_t req, bt_code code, const char *message);
/* Ends REQ as done (rt_stop): its text reached a stop string or
 * max_tokens.  May be called from a disp_hooks.chunk hook; the response
 * then comes after the hook returns.  Unknown keys are ignored. */
void disp_stop(dispatcher *d, uint64_t req);
/* Ends every running request (shutdown). */
void disp_end_all(dispatcher *d, bt_code code, const char *message);
/* Worker W was lost: ends the requests that use it, among them those
 * pinned to it as a replica. */
void disp_worker_lost(dispatcher *d, int w);

/* Results of live worker W. */
void disp_done(dispatcher *d, int w, const Baton__V1__Done *m);
void disp_chunk(dispatcher *d, int w, const Baton__V1__Chunk *m);

/* While a burst of worker messages is read, Extends are coalesced (one per
 * window, to the furthest iteration) and Releases batched (one message per
 * worker); disp_burst_end sends them. */
void disp_burst_begin(dispatcher *d);
void disp_burst_end(dispatcher *d);

/* Tensor references the runtime holds, all requests. */
size_t disp_tensors_held(const dispatcher *d);

/* How a tensor of worker FROM reaches worker TO, from the hosts both
 * registered from (LOCAL, IPC or SOCKET); TRANSFER_KIND_UNSPECIFIED when
 * it cannot (a cross-host GPU, a producer without peer_listen), with the
 * status code in *CODE and the reason in WHY. */
Baton__V1__TransferKind disp_transfer_kind(const supervisor *sup, int from, int to, int *code,
                                           char *why, size_t whylen);

#endif
