/* Cross-host tensor transfers between CPU workers: the worker-to-worker
 * socket protocol of proto/baton.proto (PeerMessage), both sides.
 *
 * Producer side: a worker with `peer_listen` binds a ROUTER there and
 * answers each PullRequest with one PullReply, whose bytes (a second frame)
 * are sent straight from the pool.  Consumer side: one DEALER per producer,
 * connected on first use and cached until the producer's incarnation
 * changes or it goes down; a tensor is pulled in chunks of
 * WK_XFER_CHUNK_BYTES with at most WK_XFER_WINDOW chunks in flight per
 * producer, and the pulls sharing a producer take turns for the window
 * (round robin), so one large tensor never holds the socket while small
 * ones wait.
 *
 * Everything here runs on the worker's I/O thread and never blocks: the
 * module watches its sockets on the I/O thread's event loop, adding and
 * removing them as connections come and go.
 * The one exception is the release of a zero-copy reply, which ZeroMQ
 * calls on its own thread: it only pushes the pin onto a lock-free list and
 * signals WAKE_FD; the I/O thread hands it back (wk_xfer_drain_unpins).
 *
 * The module knows nothing of the worker's tensor table: it reaches the
 * worker through wk_xfer_ops, so tests and the benchmark drive it with a
 * plain buffer. */
#ifndef BATON_WORKER_XFER_H
#define BATON_WORKER_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "baton/backend.h"
#include "common/curve.h"
#include "common/evloop.h"

#define WK_XFER_CHUNK_BYTES (1u << 20)  /* bytes per pull request (the last one may be less) */
#define WK_XFER_WINDOW 8u               /* chunks in flight per producer */
#define WK_XFER_MAX_CHUNK (64u << 20)   /* largest chunk a producer serves */
#define WK_XFER_TIMEOUT_MS 10000u       /* a producer silent this long with chunks in
                                           flight is taken as lost */

typedef struct wk_xfer wk_xfer;

/* A tensor as a producer holds it, and as a consumer names it. */
typedef struct wk_xfer_src {
    uint64_t tensor_id;
    uint32_t pool;
    uint64_t offset;          /* bytes: element 0 in the producer's pool */
    uint64_t nbytes;
} wk_xfer_src;

/* How the module reaches its worker.  Every callback runs on the thread
 * that calls into the module (the worker's I/O thread). */
typedef struct wk_xfer_ops {
    /* Producer: finds tensor TENSOR_ID, pins it, and returns where it lies
 * in *HELD (pool, offset and size as this worker holds it; the
     * module checks the request against them), its element 0 in *DATA and
     * the pin in *PIN.  Returns BATON_STATUS_OK, or an error code with the
     * reason in ERR (NOT_FOUND: not held, or released). */
    baton_status (*pin)(void *arg, uint64_t tensor_id, wk_xfer_src *held, const uint8_t **data,
                        void **pin, char *err, size_t errlen);
    /* Producer: the bytes of PIN are no longer read. */
    void (*unpin)(void *arg, void *pin);
    /* Consumer: pull COOKIE ended: OK (every byte written to its
     * destination) or an error code with MESSAGE.  Called exactly once per
     * pull that was not cancelled; the module forgets the pull first. */
    void (*pull_done)(void *arg, void *cookie, baton_status code, const char *message);
} wk_xfer_ops;

/* Per-pull bookkeeping of the chunking, kept apart so that it can be
 * tested on its own. */
typedef struct wk_xfer_plan {
    uint64_t nbytes;          /* bytes of the tensor */
    uint64_t chunk;           /* bytes per chunk (> 0) */
    uint64_t next;            /* first byte not yet requested */
    uint64_t received;        /* bytes received */
    uint32_t inflight;        /* chunks requested, not answered */
} wk_xfer_plan;

void wk_xfer_plan_init(wk_xfer_plan *p, uint64_t nbytes, uint64_t chunk);
/* The next chunk to request into *OFF and *LEN, counted in flight; false
 * when every chunk was requested. */
bool wk_xfer_plan_next(wk_xfer_plan *p, uint64_t *off, uint64_t *len);
/* Takes in the answer for the chunk at OFF of LEN bytes.  Returns 1 when
 * the tensor is complete, 0 when more is due, BT_EINVAL when OFF/LEN are
 * not a chunk that was requested (a confused or hostile producer). */
int wk_xfer_plan_recv(wk_xfer_plan *p, uint64_t off, uint64_t len);

/* Producer: whether a pull of [OFFSET, OFFSET + LENGTH) of REQ may be
 * served from HELD, the tensor of that id the producer holds.  0, or
 * BT_EINVAL with the reason in ERR (pool, offset or size disagree: a stale
 * reference; range outside the tensor; chunk larger than
 * WK_XFER_MAX_CHUNK). */
int wk_xfer_check_range(const wk_xfer_src *held, const wk_xfer_src *req, uint64_t offset,
                        uint64_t length, char *err, size_t errlen);

/* Creates the module on ZCTX, its sockets watched on LOOP.  LISTEN
 * ("tcp://ADDR:PORT", PORT may be *) binds the producer's ROUTER; NULL:
 * this worker serves no pulls.  OWN (copied; NULL: plain sockets) is this
 * worker's CURVE key pair: the ROUTER is then a CURVE server with it whose
 * ZAP handler (watched with the other sockets) lets in only the keys given
 * by wk_xfer_peer_key, and every pull authenticates its producer by the
 * key given for it.  WAKE_FD is an eventfd the I/O thread polls (see
 * above), or -1 when the caller drains the unpins on its own schedule.
 * 0, or a negative bt_err with ERR. */
int wk_xfer_create(void *zctx, evloop *loop, const char *listen, const bt_curve_keypair *own,
                   int wake_fd, const wk_xfer_ops *ops, void *arg, wk_xfer **out, char *err,
                   size_t errlen);
/* Closes the sockets (linger 0: replies not yet sent are dropped) and
 * forgets every pull without calling pull_done.  The pins of replies
 * ZeroMQ still holds come back when the context is terminated; so the
 * order is wk_xfer_close, zmq_ctx_term, wk_xfer_destroy.  NULL is a no-op. */
void wk_xfer_close(wk_xfer *x);
/* Hands back the last pins and frees the module.  NULL is a no-op. */
void wk_xfer_destroy(wk_xfer *x);
/* Hands back (ops->unpin) the pins of replies ZeroMQ has finished
 * sending.  I/O thread. */
void wk_xfer_drain_unpins(wk_xfer *x);

/* The endpoint the ROUTER is bound to, with an ephemeral port resolved;
 * "" when there is none. */
const char *wk_xfer_endpoint(const wk_xfer *x);

/* Consumer: what the module knows of peer INDEX (from a Peers message).
 * A peer that is down, has a new incarnation or a new endpoint loses its
 * connection, and its pulls fail (UNAVAILABLE, naming it). */
int wk_xfer_peer_update(wk_xfer *x, uint32_t index, const char *name, const char *endpoint,
                        uint64_t incarnation, bool up);

/* Consumer: the CURVE public key (Z85) peer INDEX registered with
 * (PeerInfo.curve_public_key; "" or NULL: none), kept for the client side
 * of its socket (xfer_peer_socket_client_setup).  A changed key drops the
 * connection; its pulls fail.  0 or BT_ENOMEM. */
int wk_xfer_peer_key(wk_xfer *x, uint32_t index, const char *curve_public_key);

/* Consumer: pulls SRC from peer PEER into DST (SRC->nbytes bytes) and
 * reports the end through ops->pull_done(COOKIE).  Returns the pull's id
 * (never 0), or 0 with the reason in ERR (unknown or down peer, no
 * endpoint), in which case pull_done is not called. */
uint64_t wk_xfer_pull(wk_xfer *x, uint32_t peer, const wk_xfer_src *src, void *dst, void *cookie,
                      char *err, size_t errlen);
/* Consumer: forgets pull ID (its request ended); pull_done is not called.
 * Bytes already in flight for it are dropped when they come. */
void wk_xfer_cancel(wk_xfer *x, uint64_t id);

/* Fails the pulls of producers silent for WK_XFER_TIMEOUT_MS; returns the
 * milliseconds until the next check is due (-1: none). */
long wk_xfer_tick(wk_xfer *x, uint64_t now_ns);

/* Chunk size (bytes, 1 to WK_XFER_MAX_CHUNK) and window (chunks in flight
 * per producer, >= 1) of pulls started from now on; the defaults are
 * WK_XFER_CHUNK_BYTES and WK_XFER_WINDOW.  For the benchmark's sweep.
 * BT_EINVAL when out of range. */
int wk_xfer_set_tuning(wk_xfer *x, uint32_t chunk, uint32_t window);

/* Counters, for the bench and tests. */
typedef struct wk_xfer_stats {
    uint64_t pulls_done, pulls_failed;
    uint64_t bytes_pulled, bytes_served;
    uint64_t requests_refused;    /* pull requests answered with an error */
    uint32_t pulls_active;        /* pulls not ended */
    uint32_t pins_out;            /* replies whose bytes ZeroMQ still holds */
} wk_xfer_stats;
void wk_xfer_get_stats(const wk_xfer *x, wk_xfer_stats *out);

#endif
