/* What goes back to a client: the client socket's send, and per request an
 * ordered queue of its messages (streamed chunks, then the terminal
 * response).  A message leaves only when every tensor it carries has its
 * bytes: inline in the worker's report when small, else fetched from the
 * worker that holds it (a Fetch sent before that batch's Release, which the
 * worker answers first because one ZeroMQ pair keeps order).  Messages of
 * one request therefore leave in order even when an early one waits. */
#ifndef BATON_DAEMON_OUTBOUND_H
#define BATON_DAEMON_OUTBOUND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "config/graph.h"
#include "daemon/dispatch.h"
#include "daemon/metrics.h"
#include "daemon/supervisor.h"
#include "daemon/tensors.h"
#include "proto/baton.pb-c.h"
#include "runtime/runtime.h"

typedef struct out_msg out_msg;

/* The client messages of one request, in order. */
typedef struct out_queue {
    out_msg *v;                   /* owned */
    size_t n, cap;
    size_t fetches_pending;       /* tensor bytes asked of workers, not yet here */
    uint64_t last_chunk_us;       /* monotonic us the last chunk left; 0: none yet */
} out_queue;

/* Whom a queue's messages are for. */
typedef struct out_client {
    const uint8_t *identity;      /* the client's ZeroMQ routing id */
    size_t identity_len;
    const char *request_id;
    int graph;
    uint64_t start_us;            /* monotonic us at acceptance, for total_us */
    uint64_t seed;                /* the request's sampling seed, reported in the response */
} out_client;

typedef struct outbound outbound;

/* SOCKET is the client ROUTER; everything is borrowed and outlives it. */
outbound *out_create(void *socket, const graph_set *gs, supervisor *sup, tensor_table *tt,
                     metrics *m);
void out_destroy(outbound *o);

/* Sends one ServerMessage to the client IDENTITY; a client that went away
 * loses it (ROUTER drops it). */
void out_send(outbound *o, const uint8_t *identity, size_t identity_len,
              const Baton__V1__ServerMessage *m);
/* Refuses a request: sends a terminal InferResponse with CODE and a
 * message (at most 511 bytes) that says what was wrong, and counts it. */
void out_reject(outbound *o, const uint8_t *identity, size_t identity_len,
                const char *request_id, bt_code code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Queues the CHUNK or the RESPONSE action A, capturing its tensors' bytes
 * now or asking their workers for them. */
void out_queue_chunk(outbound *o, out_queue *q, const rt_action *a);
void out_queue_response(outbound *o, out_queue *q, const rt_action *a,
                        const disp_timing *timings, size_t n_timings);
/* Sends the messages at the head of Q whose bytes are all here.  Returns
 * true once the response has gone (Q is then empty). */
bool out_flush(outbound *o, out_queue *q, const out_client *to);
/* The bytes of tensor KEY (tt_key) arrived: fills every part waiting for
 * them.  True when Q had one. */
bool out_fetched(out_queue *q, uint64_t key, const uint8_t *data, size_t len);
/* Worker W was lost: parts waiting for its bytes go out empty, and a
 * response that was OK says UNAVAILABLE.  True when Q had one. */
bool out_worker_lost(out_queue *q, int w);
void out_queue_free(out_queue *q);

#endif
