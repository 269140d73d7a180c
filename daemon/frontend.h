/* The frontend: the client side of the conductor.  It owns the requests
 * in flight and their deadlines.
 *
 * Every frame on the client ROUTER is checked at the door in a fixed order
 * (size, parse, the wire check of daemon/door.h: no field numbered 0, no
 * string with a NUL byte or invalid UTF-8; then door.h's request checks:
 * request_id, graph, messages, inputs, max_iters, raw_inputs, text
 * limits; then an id already in flight on the connection; draining or not ready; the connection's unread replies
 * (client_max_reply_bytes), its client_max_inflight, max_inflight, and its
 * fair share of max_inflight), and the first failing check answers at
 * once.  The connections themselves are daemon/clients.h's: the tick
 * drops one whose replies stay unread (its requests are cancelled and
 * answer nothing).  An accepted request first places its inputs (one
 * Put per graph input, to the worker of its first consumer), then runs in
 * the dispatcher, and gets exactly one terminal InferResponse through its
 * outbound queue; when its text reaches a stop string or max_tokens, it is
 * stopped there (disp_stop).  A cancel is answered at once with a
 * CancelResponse.  Health, Stats and Inspect concern the whole daemon:
 * they go to front_hooks.admin. */
#ifndef BATON_DAEMON_FRONTEND_H
#define BATON_DAEMON_FRONTEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/graph.h"
#include "daemon/dispatch.h"
#include "common/evloop.h"
#include "daemon/outbound.h"
#include "daemon/supervisor.h"
#include "daemon/tensors.h"
#include "proto/baton.pb-c.h"

/* Limits that a reload may change. */
typedef struct front_limits {
    uint32_t max_inflight;        /* requests accepted at once */
    uint32_t request_timeout_ms;  /* deadline of a request that names none */
    uint64_t max_message_bytes;   /* larger frames are refused */
    uint32_t max_request_timeout_ms; /* a request's timeout_ms is clamped to it */
    uint32_t client_max_inflight; /* requests one connection may have accepted at once */
    uint64_t client_max_reply_bytes; /* unread replies past which a connection's new
                                   * requests are refused (twice this: it is dropped) */
    uint32_t client_stall_timeout_ms; /* a connection whose held replies make no progress
                                   * this long is dropped, its requests cancelled */
} front_limits;

/* Whether new requests are let in. */
typedef enum front_admission {
    FRONT_NOT_READY = 0,          /* workers still registering or loading */
    FRONT_OPEN = 1,
    FRONT_DRAINING = 2            /* shutting down */
} front_admission;

typedef struct front_hooks {
    void *arg;
    /* A Health, Stats or Inspect request from client IDENTITY. */
    void (*admin)(void *arg, const uint8_t *identity, size_t identity_len,
                  const Baton__V1__ClientMessage *m);
} front_hooks;

typedef struct front_options {
    const graph_set *gs;
    void *socket;                 /* the bound client ROUTER */
    outbound *out;
    supervisor *sup;
    tensor_table *tt;
    dispatcher *disp;
    replicas *rs;                 /* an input read by a replicated model goes to its pick */
    front_limits limits;
} front_options;                  /* everything borrowed; it outlives the frontend */

typedef struct frontend frontend;

/* 0 or BT_ENOMEM. */
int front_create(const front_options *opt, const front_hooks *hooks, frontend **out);
void front_destroy(frontend *f);

/* The client socket is readable (an evloop callback; ARG is the frontend). */
void front_on_readable(evloop *l, void *arg);
void front_set_limits(frontend *f, const front_limits *limits);
void front_set_admission(frontend *f, front_admission a);
/* Ends the requests whose deadline has passed. */
void front_tick(frontend *f, uint64_t now_ms);
/* When front_tick must next run for a deadline (monotonic ms; maybe early,
 * for a request that already ended), or UINT64_MAX. */
uint64_t front_next_deadline_ms(const frontend *f);

/* Worker W answered a Put, or a Fetch. */
void front_placed(frontend *f, int w, const Baton__V1__Placed *m);
void front_fetched(frontend *f, int w, const Baton__V1__Fetched *m);
/* The dispatcher's CHUNK and RESPONSE actions (disp_hooks). */
void front_on_chunk(frontend *f, uint64_t req, const rt_action *a);
void front_on_response(frontend *f, uint64_t req, const rt_action *a,
                       const disp_timing *timings, size_t n_timings);

/* Ends with CODE the requests still placing an input on worker W (all of
 * them when W < 0); inputs on W are forgotten, not released. */
void front_end_placing(frontend *f, int w, bt_code code, const char *message);
/* Worker W was lost: messages waiting for its bytes go out without them. */
void front_fetches_lost(frontend *f, int w);
/* Ends every request (shutdown): placing, running, and waiting for bytes. */
void front_end_all(frontend *f, bt_code code, const char *message);

/* Requests accepted and not yet answered, and how many still place inputs. */
size_t front_inflight(const frontend *f);
size_t front_placing(const frontend *f);

#endif
