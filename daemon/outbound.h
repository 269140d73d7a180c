/* What goes back to a client: the client socket's send, and per request an
 * ordered queue of its messages (streamed chunks, then the terminal
 * response).  A message leaves only when every tensor it carries has its
 * bytes: inline in the worker's report when small, else fetched from the
 * worker that holds it (a Fetch sent before that batch's Release, which the
 * worker answers first because one ZeroMQ pair keeps order).  Messages of
 * one request therefore leave in order even when an early one waits.
 *
 * Streamed values are numbered here, as they leave: a value with no bytes
 * (the end-of-turn token's empty text) is not sent, and a request's text
 * limit (stop strings, max_tokens: daemon/textlimit.h) may hold bytes
 * back or end the text.  This is the one place that sees every value's
 * bytes in order, whether they came inline or were fetched.  When the
 * client asked for no stream but for a text limit, the runtime streams
 * anyway and the values are kept here and joined into the response's
 * outputs, as the runtime would have. */
#ifndef BATON_DAEMON_OUTBOUND_H
#define BATON_DAEMON_OUTBOUND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "config/graph.h"
#include "daemon/clients.h"
#include "daemon/dispatch.h"
#include "daemon/metrics.h"
#include "daemon/supervisor.h"
#include "daemon/tensors.h"
#include "daemon/textlimit.h"
#include "proto/baton.pb-c.h"
#include "runtime/runtime.h"

typedef struct out_msg out_msg;
typedef struct out_kept out_kept;

/* The client messages of one request, in order. */
typedef struct out_queue {
    out_msg *v;                   /* owned */
    size_t n, cap;
    size_t fetches_pending;       /* tensor bytes asked of workers, not yet here */
    uint64_t last_chunk_us;       /* monotonic us the last chunk left; 0: none yet */
    uint64_t next_seq;            /* seq of the next chunk sent */
    tl_limit *limit;              /* the request's text limit; owned, NULL: none */
    const char *limit_name;       /* the text stream it applies to; borrowed from the graph */
    tl_end end;                   /* how the limit ended the text, or TL_RUNNING */
    bool stop_pending;            /* it did, and the request is still to be stopped */
    rt_usage end_usage;           /* the request's tokens when it did */
    bool keep;                    /* the client asked for no stream: keep the values */
    out_kept *kept;               /* owned: per new_token value name, what came */
    size_t n_kept;
    bt_code fail_code;            /* an output's bytes could not be had: the response's
                                     code instead of OK; BT_CODE_OK while none */
    char *fail_message;           /* owned; why, for that response */
} out_queue;

/* Whom a queue's messages are for. */
typedef struct out_client {
    const uint8_t *identity;      /* the client's ZeroMQ routing id */
    size_t identity_len;
    const char *request_id;
    int graph;
    uint64_t start_us;            /* monotonic us at acceptance, for total_us */
    uint64_t seed;                /* the request's sampling seed, reported in the response */
    bool discard;                 /* the client was dropped: build nothing, send nothing */
} out_client;

typedef struct outbound outbound;

/* SOCKET is the client ROUTER; everything is borrowed and outlives it. */
outbound *out_create(void *socket, const graph_set *gs, supervisor *sup, tensor_table *tt,
                     metrics *m);
void out_destroy(outbound *o);

/* Sends one ServerMessage to the client IDENTITY; a client that went away
 * loses it.  A client whose pipe is full (it does not read) gets it later:
 * the message waits in its backlog (daemon/clients.h), after any earlier
 * one. */
void out_send(outbound *o, const uint8_t *identity, size_t identity_len,
              const Baton__V1__ServerMessage *m);
/* Between the two, out_send holds streamed chunks (up to 64; then it
 * sends those first) and out_uncork sends them in order; any other message
 * sends what is held before it, so that each client's order holds.  The
 * conductor corks each round of its loop: a burst of Dones from a worker
 * that ran ahead becomes a burst of chunks that leave back to back, after
 * the round's messages to the workers (the Extend that lets the worker go
 * on), and ZeroMQ's I/O thread is woken about once for them rather than
 * once each.  Responses are not held: a client that keeps requests in
 * flight would wait for the end of every round. */
void out_cork(outbound *o);
void out_uncork(outbound *o);
/* Sends what the backlogs hold, as far as ZeroMQ takes it; a client that
 * went away loses its backlog.  Then forgets the clients that hold
 * nothing any more (the 10 ms tick). */
void out_tick(outbound *o, uint64_t now_ms);
/* Sends the backlogs on as far as ZeroMQ takes them, walking only the
 * clients that have one.  Returns -1 when no reply waits any more, else
 * the milliseconds within which to look again: 1 after progress, growing
 * to 16 while none moves.  The conductor calls it after every round of
 * its loop and polls with that timeout: a client that reads as fast as
 * replies come must not wait for the tick, or a stream bursting past the
 * pipe's high-water mark would run at one pipe's worth of messages per
 * tick. */
long out_flush_backlogs(outbound *o, uint64_t now_ms);
/* The client socket's own signal (ZeroMQ's ZMQ_FD), or -1.  While a backlog
 * waits, the conductor's loop watches it as a plain fd: ZeroMQ signals it
 * when a client's reader has made room in its pipe (a command for every
 * half high-water mark read), which a ROUTER's POLLOUT, always set, never
 * tells.  Then out_flush_backlogs sends on at once, where the timed look
 * alone left a stream outrunning the pipe idle for up to a millisecond per
 * pipe's worth of messages. */
int out_room_fd(const outbound *o);
/* The client table (borrowed; the frontend counts requests in it). */
cl_table *out_clients(outbound *o);
/* Drops client C (its backlog with it) and counts it in the metrics. */
void out_drop_client(outbound *o, cl_client *c);
/* How many clients out_drop_client dropped since start. */
uint64_t out_dropped(const outbound *o);
/* Refuses a request: sends a terminal InferResponse with CODE and a
 * message (at most 511 bytes) that says what was wrong, and counts it. */
void out_reject(outbound *o, const uint8_t *identity, size_t identity_len,
                const char *request_id, bt_code code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Gives Q the text limit of a request of graph G: stop strings and
 * max_tokens on its text stream TEXT_OUTPUT (as the door checked them).
 * STREAM is what the client asked: false makes Q keep the streamed values
 * for the response (the runtime must then stream them).  0, BT_EINVAL or
 * BT_ENOMEM. */
int out_queue_limit(out_queue *q, const graph *g, const char *text_output,
                    const char *const *stop, size_t n_stop, uint32_t max_tokens, bool stream);

/* Queues the CHUNK or the RESPONSE action A, capturing its tensors' bytes
 * now or asking their workers for them. */
void out_queue_chunk(outbound *o, out_queue *q, const rt_action *a);
void out_queue_response(outbound *o, out_queue *q, const rt_action *a,
                        const disp_timing *timings, size_t n_timings);
/* Sends the messages at the head of Q whose bytes are all here.  Returns
 * true once the response has gone (Q is then empty).  When the text limit
 * ended the text, Q->stop_pending is set: the caller stops the request
 * (disp_stop) and clears it. */
bool out_flush(outbound *o, out_queue *q, const out_client *to);
/* The answer to the Fetch of tensor KEY (tt_key) arrived: with CODE OK its
 * bytes fill every part waiting for them; with another code (the tensor
 * was gone: NOT_FOUND) those parts go out empty and the request's response,
 * queued or still to come, says CODE and MESSAGE instead of OK, never an
 * OK with an empty tensor.  True when Q had one. */
bool out_fetched(out_queue *q, uint64_t key, bt_code code, const char *message,
                 const uint8_t *data, size_t len);
/* Worker W was lost: parts waiting for its bytes go out empty, and the
 * response, queued or still to come, says UNAVAILABLE instead of OK.  True
 * when Q had one. */
bool out_worker_lost(out_queue *q, int w);
void out_queue_free(out_queue *q);

#endif
