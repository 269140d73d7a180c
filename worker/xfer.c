/* Cross-host pulls between CPU workers (see xfer.h).
 *
 * Chunk size and window.  A pull asks for WK_XFER_CHUNK_BYTES at a time and
 * keeps at most WK_XFER_WINDOW chunks per producer in flight.  A chunk is
 * the unit of interleaving: while one 256 MiB tensor moves, another pull
 * from the same producer waits for at most one chunk's turn per window
 * slot, not for the whole tensor.  A window of several chunks keeps the
 * TCP pipe full across the request round trip while bounding what one
 * producer has in flight for one consumer (8 x 1 MiB: a 0.5 ms round trip
 * at over 100 Gbit/s, or a 6 ms one at 10 Gbit/s).  tests/bench/bench_xhost.c
 * sweeps 1 to 8 MiB chunks and windows of 1 to 8 at 64 MiB; on loopback on
 * the 2 shared CPUs it was written on, 1 MiB chunks with a window of 4 to
 * 8 came out on top in three sweeps of four, by up to a quarter, though
 * the noise between runs was of the same size as the differences.  Small
 * chunks also interleave best.  A real network (the bench takes its
 * endpoints from the environment) is where the numbers should be settled.
 *
 * Zero copy on the producer.  A reply's data frame points into the pool
 * (zmq_msg_init_data) and the tensor stays pinned until ZeroMQ has written
 * it to the kernel.  ZeroMQ calls the release on its own I/O thread, which
 * must not take the worker's lock (the worker's I/O thread may hold it
 * while it sends, and a lock taken from ZeroMQ's thread there could order
 * against ZeroMQ's internal ones); so the release only pushes the pin onto
 * a lock-free list and signals the worker's eventfd, and the worker's I/O
 * thread unpins under its lock.  Copying each chunk out under the lock
 * would be simpler, but costs a memory pass per byte sent, which on
 * loopback is a large part of the transfer's own cost.
 *
 * The consumer copies each chunk once, from the received message into the
 * destination tensor in its pool; ZeroMQ cannot receive into caller memory. */
#include "worker/xfer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/evloop.h"
#include "common/curve.h"
#include "common/log.h"
#include "common/status.h"
#include "common/u64map.h"
#include "common/vec.h"
#include "common/zapwire.h"
#include "proto/baton.pb-c.h"

typedef struct xfer_pull xfer_pull;

/* A producer as the consumer side knows it. */
typedef struct xfer_peer {
    struct wk_xfer *x;
    uint32_t index;
    char *name;                  /* owned */
    char *endpoint;              /* owned; "" when it has none */
    char *curve_public_key;      /* owned, Z85; NULL when it registered none */
    uint64_t incarnation;
    bool up;
    void *sock;                  /* DEALER connected to endpoint, or NULL */
    int watch;                   /* its handle in the loop while sock is open */
    uint32_t inflight;           /* requests sent on sock, not answered */
    uint64_t last_rx_ns;         /* last answer, or the request that opened the window */
    xfer_pull *rr_head, *rr_tail; /* pulls with chunks left to request, in turn order */
    struct xfer_peer *next;
} xfer_peer;

struct xfer_pull {
    uint64_t id;
    xfer_peer *peer;
    wk_xfer_src src;
    uint8_t *dst;                /* SRC.nbytes bytes, the caller's */
    void *cookie;
    wk_xfer_plan plan;
    bool queued;                 /* in peer's rr list */
    xfer_pull *rr_next;
};

/* A reply's pin, released by ZeroMQ (any thread), handed back by the I/O thread. */
typedef struct xfer_unpin {
    struct wk_xfer *x;
    void *pin;
    struct xfer_unpin *next;
} xfer_unpin;

/* The ZAP domain of the worker-to-worker ROUTER. */
#define XFER_ZAP_DOMAIN "baton-peer"

struct wk_xfer {
    void *zctx;                  /* borrowed */
    evloop *loop;                /* borrowed: the I/O thread's; the sockets watch on it */
    void *router;                /* producer side, or NULL */
    int router_watch, zap_watch; /* their handles in the loop, or -1 */
    bool curve;                  /* the sockets speak CURVE with OWN */
    bt_curve_keypair own;        /* this worker's key pair (when curve); wiped at destroy */
    void *zap;                   /* ZAP handler of the ROUTER (curve and a router), or NULL */
    char endpoint[256];          /* router's resolved endpoint, or "" */
    int wake_fd;                 /* borrowed; -1: none */
    wk_xfer_ops ops;
    void *arg;
    xfer_peer *peers;
    u64map pulls;                /* id -> xfer_pull */
    uint64_t next_id;
    uint32_t chunk;              /* bytes per chunk of new pulls */
    uint32_t window;             /* chunks in flight per producer */
    _Atomic(xfer_unpin *) unpins;
    atomic_uint pins_out;
    wk_xfer_stats st;
};

/* --- the chunk plan -------------------------------------------------------- */

void wk_xfer_plan_init(wk_xfer_plan *p, uint64_t nbytes, uint64_t chunk)
{
    *p = (wk_xfer_plan){.nbytes = nbytes, .chunk = chunk ? chunk : WK_XFER_CHUNK_BYTES};
}

bool wk_xfer_plan_next(wk_xfer_plan *p, uint64_t *off, uint64_t *len)
{
    if (p->next >= p->nbytes)
        return false;
    *off = p->next;
    *len = p->nbytes - p->next < p->chunk ? p->nbytes - p->next : p->chunk;
    p->next += *len;
    p->inflight++;
    return true;
}

int wk_xfer_plan_recv(wk_xfer_plan *p, uint64_t off, uint64_t len)
{
    /* Chunks start at multiples of the chunk size and span it, the last
     * one excepted; anything else was never asked for. */
    if (p->inflight == 0 || off % p->chunk != 0 || off >= p->next ||
        len != (p->nbytes - off < p->chunk ? p->nbytes - off : p->chunk))
        return BT_EINVAL;
    p->inflight--;
    p->received += len;
    return p->received == p->nbytes && p->next == p->nbytes ? 1 : 0;
}

int wk_xfer_check_range(const wk_xfer_src *held, const wk_xfer_src *req, uint64_t offset,
                        uint64_t length, char *err, size_t errlen)
{
    if (held->pool != req->pool || held->offset != req->offset || held->nbytes != req->nbytes) {
        snprintf(err, errlen, "tensor %" PRIu64 " is held as pool %u, offset %" PRIu64 ", %"
                 PRIu64 " bytes, not pool %u, offset %" PRIu64 ", %" PRIu64 " bytes (a stale "
                 "reference)", held->tensor_id, held->pool, held->offset, held->nbytes,
                 req->pool, req->offset, req->nbytes);
        return BT_EINVAL;
    }
    if (length == 0 || length > WK_XFER_MAX_CHUNK) {
        snprintf(err, errlen, "a chunk of %" PRIu64 " bytes was asked (1 to %u)", length,
                 WK_XFER_MAX_CHUNK);
        return BT_EINVAL;
    }
    if (offset > held->nbytes || length > held->nbytes - offset) {
        snprintf(err, errlen, "bytes %" PRIu64 " to %" PRIu64 " lie outside tensor %" PRIu64
                 " of %" PRIu64 " bytes", offset, offset + length, held->tensor_id,
                 held->nbytes);
        return BT_EINVAL;
    }
    return 0;
}

/* --- sockets ----------------------------------------------------------------- */

/* Options of the producer's ROUTER, before it binds.  The one place where
 * the server side of the worker-to-worker socket is set up: security
 * (CURVE server keys, a ZAP domain) belongs here.  Linger 0: a stopping
 * worker drops replies nobody can use; no send high-water mark, since the
 * consumers' windows bound what is queued and a ROUTER would otherwise
 * drop replies silently. */
static int xfer_peer_socket_server_setup(wk_xfer *x, void *sock, char *err, size_t errlen)
{
    int zero = 0;
    if (zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDHWM, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(sock, ZMQ_RCVHWM, &zero, sizeof(zero)) != 0) {
        snprintf(err, errlen, "worker-to-worker socket options: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    if (!x->curve)
        return 0;
    /* With CURVE the socket is a server with this worker's key, and its
     * ZAP handler (bound first, so that nobody gets in unasked) lets in
     * only the keys the conductor announced for the other workers. */
    if (bt_zap_bind(x->zctx, &x->zap) != 0) {
        snprintf(err, errlen, "worker-to-worker ZAP handler: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    int rc = bt_curve_apply_server(sock, &x->own, XFER_ZAP_DOMAIN);
    if (rc != 0) {
        snprintf(err, errlen, "worker-to-worker socket: CURVE: %s", bt_curve_strerror(rc));
        return -1;
    }
    return 0;
}

/* Options of a consumer's DEALER to PEER, before it connects.  The one
 * place where the client side is set up: CURVE client keys and the
 * producer's public key (PEER->curve_public_key) belong here. */
static int xfer_peer_socket_client_setup(const wk_xfer *x, void *sock, const xfer_peer *peer,
                                         char *err, size_t errlen)
{
    int zero = 0;
    if (zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDHWM, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(sock, ZMQ_RCVHWM, &zero, sizeof(zero)) != 0) {
        snprintf(err, errlen, "socket to worker %s: %s", peer->name, zmq_strerror(zmq_errno()));
        return -1;
    }
    if (!x->curve && peer->curve_public_key) {
        snprintf(err, errlen, "worker %s serves its tensors over CURVE, and this worker has no "
                 "key pair (give it 'key:')", peer->name);
        return -1;
    }
    if (!x->curve)
        return 0;
    /* The producer must prove the key the conductor announced for it; a
     * producer that registered none cannot be reached over CURVE. */
    if (!peer->curve_public_key) {
        snprintf(err, errlen, "worker %s registered no CURVE key, and the deployment sets "
                 "daemon.curve: its tensors cannot be pulled", peer->name);
        return -1;
    }
    int rc = bt_curve_apply_client(sock, &x->own, peer->curve_public_key);
    if (rc != 0) {
        snprintf(err, errlen, "socket to worker %s: CURVE: %s", peer->name,
                 bt_curve_strerror(rc));
        return -1;
    }
    return 0;
}

/* The ZAP decision of the ROUTER (a bt_zap_decide_fn): a CURVE peer whose
 * key one of the other workers, up now, registered with. */
static int xfer_zap_decide(void *arg, const bt_zap_request *req, const char **user_id)
{
    const wk_xfer *x = arg;
    (void)user_id;
    if (strcmp(req->domain, XFER_ZAP_DOMAIN) != 0 || strcmp(req->mechanism, "CURVE") != 0 ||
        req->cred_len != 32)
        return 400;
    uint8_t key[32];
    for (const xfer_peer *p = x->peers; p; p = p->next)
        if (p->up && p->curve_public_key && bt_curve_z85_valid(p->curve_public_key, key) &&
            memcmp(key, req->cred, 32) == 0)
            return 200;
    char z85[BT_CURVE_Z85_SIZE], fp[BT_CURVE_FINGERPRINT_LEN + 1] = "?";
    if (zmq_z85_encode(z85, req->cred, 32))
        bt_curve_fingerprint(z85, fp);
    bt_warn("refused a worker-to-worker peer from %s: its public key (%s...) is not one the "
            "conductor announced", req->address, fp);
    return 400;
}

static void on_zap(evloop *l, void *arg);
static void on_router(evloop *l, void *arg);
static void on_peer(evloop *l, void *arg);

int wk_xfer_create(void *zctx, evloop *loop, const char *listen, const bt_curve_keypair *own,
                   int wake_fd, const wk_xfer_ops *ops, void *arg, wk_xfer **out, char *err,
                   size_t errlen)
{
    *out = NULL;
    wk_xfer *x = calloc(1, sizeof(*x));
    if (!x) {
        snprintf(err, errlen, "out of memory");
        return BT_ENOMEM;
    }
    x->zctx = zctx;
    x->loop = loop;
    x->router_watch = x->zap_watch = -1;
    x->wake_fd = wake_fd;
    x->ops = *ops;
    x->arg = arg;
    x->next_id = 1;
    x->chunk = WK_XFER_CHUNK_BYTES;
    x->window = WK_XFER_WINDOW;
    u64map_init(&x->pulls);
    atomic_init(&x->unpins, NULL);
    atomic_init(&x->pins_out, 0);
    if (own) {
        x->curve = true;
        x->own = *own;
    }
    if (listen && *listen) {
        size_t len = sizeof(x->endpoint);
        if (!(x->router = zmq_socket(zctx, ZMQ_ROUTER))) {
            snprintf(err, errlen, "peer_listen socket: %s", zmq_strerror(zmq_errno()));
            goto err;
        }
        if (xfer_peer_socket_server_setup(x, x->router, err, errlen) != 0)
            goto err;
        if (zmq_bind(x->router, listen) != 0) {
            snprintf(err, errlen, "peer_listen %s: cannot bind: %s", listen,
                     zmq_strerror(zmq_errno()));
            goto err;
        }
        if (zmq_getsockopt(x->router, ZMQ_LAST_ENDPOINT, x->endpoint, &len) != 0) {
            snprintf(err, errlen, "peer_listen %s: %s", listen, zmq_strerror(zmq_errno()));
            goto err;
        }
        if ((x->router_watch = evloop_add(loop, x->router, -1, on_router, x)) < 0 ||
            (x->zap && (x->zap_watch = evloop_add(loop, x->zap, -1, on_zap, x)) < 0)) {
            snprintf(err, errlen, "peer_listen %s: out of memory", listen);
            goto err;
        }
    }
    *out = x;
    return 0;
err:
    wk_xfer_close(x);
    wk_xfer_destroy(x);
    return BT_EIO;
}

const char *wk_xfer_endpoint(const wk_xfer *x)
{
    return x ? x->endpoint : "";
}

/* --- consumer ------------------------------------------------------------------ */

static xfer_peer *peer_find(const wk_xfer *x, uint32_t index)
{
    for (xfer_peer *p = x->peers; p; p = p->next)
        if (p->index == index)
            return p;
    return NULL;
}

static void rr_push(xfer_peer *p, xfer_pull *pl)
{
    pl->rr_next = NULL;
    pl->queued = true;
    if (p->rr_tail)
        p->rr_tail->rr_next = pl;
    else
        p->rr_head = pl;
    p->rr_tail = pl;
}

static void rr_remove(xfer_peer *p, xfer_pull *pl)
{
    if (!pl->queued)
        return;
    xfer_pull *prev = NULL;
    for (xfer_pull *q = p->rr_head; q; prev = q, q = q->rr_next)
        if (q == pl) {
            if (prev)
                prev->rr_next = q->rr_next;
            else
                p->rr_head = q->rr_next;
            if (p->rr_tail == q)
                p->rr_tail = prev;
            break;
        }
    pl->queued = false;
    pl->rr_next = NULL;
}

/* Forgets PL (out of the table and its peer's turn list) and frees it. */
static void pull_forget(wk_xfer *x, xfer_pull *pl)
{
    u64map_del(&x->pulls, pl->id);
    rr_remove(pl->peer, pl);
    free(pl);
}

/* Ends PL with CODE and MESSAGE through pull_done. */
static void pull_end(wk_xfer *x, xfer_pull *pl, baton_status code, const char *message)
{
    void *cookie = pl->cookie;
    if (code == BATON_STATUS_OK) {
        x->st.pulls_done++;
        x->st.bytes_pulled += pl->src.nbytes;
    } else {
        x->st.pulls_failed++;
    }
    pull_forget(x, pl);
    x->ops.pull_done(x->arg, cookie, code, message);
}

/* Closes P's socket and fails every pull from it with UNAVAILABLE. */
/* Closes P's socket, out of the loop first. */
static void peer_close(wk_xfer *x, xfer_peer *p)
{
    if (!p->sock)
        return;
    evloop_remove(x->loop, p->watch);
    zmq_close(p->sock);
    p->sock = NULL;
}

static void peer_lose(wk_xfer *x, xfer_peer *p, const char *why)
{
    peer_close(x, p);
    p->inflight = 0;
    size_t n = 0, cap = 0, pos = 0;
    uint64_t *ids = NULL, id;
    void *val;
    while (u64map_next(&x->pulls, &pos, &id, &val)) {
        if (((xfer_pull *)val)->peer != p)
            continue;
        if (BT_RESERVE(ids, n, cap, 16) != 0)
            break; /* the rest time out instead */
        ids[n++] = id;
    }
    char msg[512];
    snprintf(msg, sizeof(msg), "worker %s (index %u), which holds an input, is lost: %s",
             p->name, p->index, why);
    /* A pull_done may cancel other pulls of the same item: look each one
     * up again. */
    for (size_t i = 0; i < n; i++) {
        xfer_pull *pl = u64map_get(&x->pulls, ids[i]);
        if (pl)
            pull_end(x, pl, BATON_STATUS_UNAVAILABLE, msg);
    }
    free(ids);
}

int wk_xfer_peer_update(wk_xfer *x, uint32_t index, const char *name, const char *endpoint,
                        uint64_t incarnation, bool up)
{
    if (!x)
        return 0;
    xfer_peer *p = peer_find(x, index);
    name = name ? name : "";
    endpoint = endpoint ? endpoint : "";
    if (!p) {
        if (!(p = calloc(1, sizeof(*p))))
            return BT_ENOMEM;
        if (!(p->name = strdup(name)) || !(p->endpoint = strdup(endpoint))) {
            free(p->name);
            free(p);
            return BT_ENOMEM;
        }
        p->x = x;
        p->index = index;
        p->incarnation = incarnation;
        p->up = up;
        p->next = x->peers;
        x->peers = p;
        return 0;
    }
    bool changed = p->incarnation != incarnation || strcmp(p->endpoint, endpoint) != 0;
    if (!up && p->up)
        peer_lose(x, p, "the conductor reports it down");
    else if (changed)
        peer_lose(x, p, "it restarted (a new incarnation)");
    char *nn = strdup(name), *ne = strdup(endpoint);
    if (!nn || !ne) {
        free(nn);
        free(ne);
        return BT_ENOMEM;
    }
    free(p->name);
    free(p->endpoint);
    p->name = nn;
    p->endpoint = ne;
    p->incarnation = incarnation;
    p->up = up;
    return 0;
}

/* Sends one PullRequest for PL's chunk at OFF of LEN bytes.  0 or -1. */
static int send_request(wk_xfer *x, xfer_pull *pl, uint64_t off, uint64_t len)
{
    (void)x;
    Baton__V1__PullRequest rq = BATON__V1__PULL_REQUEST__INIT;
    rq.xfer_id = pl->id;
    rq.tensor_id = pl->src.tensor_id;
    rq.pool = pl->src.pool;
    rq.tensor_offset = pl->src.offset;
    rq.tensor_nbytes = pl->src.nbytes;
    rq.offset = off;
    rq.length = len;
    Baton__V1__PeerMessage m = BATON__V1__PEER_MESSAGE__INIT;
    m.protocol_version = BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    m.msg_case = BATON__V1__PEER_MESSAGE__MSG_PULL;
    m.pull = &rq;
    uint8_t buf[128];
    size_t n = baton__v1__peer_message__get_packed_size(&m);
    if (n > sizeof(buf))
        return -1;
    baton__v1__peer_message__pack(&m, buf);
    return zmq_send(pl->peer->sock, buf, n, ZMQ_DONTWAIT) == (int)n ? 0 : -1;
}

/* Fills P's window: the pulls waiting take one chunk each in turn. */
static void peer_pump(wk_xfer *x, xfer_peer *p)
{
    while (p->sock && p->inflight < x->window && p->rr_head) {
        xfer_pull *pl = p->rr_head;
        p->rr_head = pl->rr_next;
        if (!p->rr_head)
            p->rr_tail = NULL;
        pl->queued = false;
        uint64_t off, len;
        if (!wk_xfer_plan_next(&pl->plan, &off, &len))
            continue;
        if (send_request(x, pl, off, len) != 0) {
            char why[256];
            snprintf(why, sizeof(why), "cannot send to %s: %s", p->endpoint,
                     zmq_strerror(zmq_errno()));
            peer_lose(x, p, why);
            return;
        }
        if (p->inflight++ == 0)
            p->last_rx_ns = bt_now_ns();
        if (pl->plan.next < pl->plan.nbytes)
            rr_push(p, pl);
    }
}

static int peer_connect(wk_xfer *x, xfer_peer *p, char *err, size_t errlen)
{
    if (!(p->sock = zmq_socket(x->zctx, ZMQ_DEALER))) {
        snprintf(err, errlen, "socket to worker %s: %s", p->name, zmq_strerror(zmq_errno()));
        return -1;
    }
    if (xfer_peer_socket_client_setup(x, p->sock, p, err, errlen) != 0)
        goto err;
    if (zmq_connect(p->sock, p->endpoint) != 0) {
        snprintf(err, errlen, "connect to worker %s at %s: %s", p->name, p->endpoint,
                 zmq_strerror(zmq_errno()));
        goto err;
    }
    if ((p->watch = evloop_add(x->loop, p->sock, -1, on_peer, p)) < 0) {
        snprintf(err, errlen, "socket to worker %s: out of memory", p->name);
        goto err;
    }
    p->inflight = 0;
    return 0;
err:
    zmq_close(p->sock);
    p->sock = NULL;
    return BT_EIO;
}

uint64_t wk_xfer_pull(wk_xfer *x, uint32_t peer, const wk_xfer_src *src, void *dst, void *cookie,
                      char *err, size_t errlen)
{
    xfer_peer *p = x ? peer_find(x, peer) : NULL;
    if (!p) {
        snprintf(err, errlen, "worker %u is not among the known peers", peer);
        return 0;
    }
    if (!p->up) {
        snprintf(err, errlen, "worker %s (index %u), which holds an input, is down", p->name,
                 peer);
        return 0;
    }
    if (!*p->endpoint) {
        snprintf(err, errlen, "worker %s runs on another host and has no peer endpoint: set "
                 "'peer_listen' in its entry under workers:", p->name);
        return 0;
    }
    if (src->nbytes == 0) {
        snprintf(err, errlen, "a pull of 0 bytes");
        return 0;
    }
    if (!p->sock && peer_connect(x, p, err, errlen) != 0)
        return 0;
    xfer_pull *pl = calloc(1, sizeof(*pl));
    if (!pl) {
        snprintf(err, errlen, "out of memory");
        return 0;
    }
    pl->id = x->next_id++;
    pl->peer = p;
    pl->src = *src;
    pl->dst = dst;
    pl->cookie = cookie;
    wk_xfer_plan_init(&pl->plan, src->nbytes, x->chunk);
    if (u64map_put(&x->pulls, pl->id, pl) != 0) {
        free(pl);
        snprintf(err, errlen, "out of memory");
        return 0;
    }
    uint64_t id = pl->id;
    rr_push(p, pl);
    /* The pump may lose the peer, which ends this very pull through
     * pull_done: the caller learns that from its callback either way, so
     * the id is returned all the same (cancelling it is then a no-op). */
    peer_pump(x, p);
    return id;
}

int wk_xfer_peer_key(wk_xfer *x, uint32_t index, const char *curve_public_key)
{
    xfer_peer *p = x ? peer_find(x, index) : NULL;
    if (!p)
        return 0;
    const char *now = curve_public_key && *curve_public_key ? curve_public_key : NULL;
    if ((!now && !p->curve_public_key) ||
        (now && p->curve_public_key && strcmp(now, p->curve_public_key) == 0))
        return 0;
    char *k = now ? strdup(now) : NULL;
    if (now && !k)
        return BT_ENOMEM;
    if (p->sock)
        peer_lose(x, p, "its key changed");
    free(p->curve_public_key);
    p->curve_public_key = k;
    return 0;
}

void wk_xfer_cancel(wk_xfer *x, uint64_t id)
{
    if (!x)
        return;
    xfer_pull *pl = u64map_get(&x->pulls, id);
    if (pl)
        pull_forget(x, pl);
}

/* One reply on P's socket: header frame, then the bytes when OK. */
static void consumer_recv(wk_xfer *x, xfer_peer *p)
{
    zmq_msg_t hdr, data;
    zmq_msg_init(&hdr);
    zmq_msg_init(&data);
    if (zmq_msg_recv(&hdr, p->sock, ZMQ_DONTWAIT) < 0)
        goto out;
    bool have_data = false;
    if (zmq_msg_more(&hdr)) {
        if (zmq_msg_recv(&data, p->sock, 0) < 0)
            goto out;
        have_data = true;
        while (zmq_msg_more(&data)) {
            /* Frames beyond the protocol's two are drained and ignored. */
            zmq_msg_t extra;
            zmq_msg_init(&extra);
            int rc = zmq_msg_recv(&extra, p->sock, 0);
            zmq_msg_close(&extra);
            if (rc < 0)
                break;
        }
    }
    if (p->inflight)
        p->inflight--;
    p->last_rx_ns = bt_now_ns();
    Baton__V1__PeerMessage *m =
        baton__v1__peer_message__unpack(NULL, zmq_msg_size(&hdr), zmq_msg_data(&hdr));
    if (!m || m->msg_case != BATON__V1__PEER_MESSAGE__MSG_REPLY) {
        bt_warn("worker %s sent a frame that is no PullReply; dropped", p->name);
        if (m)
            baton__v1__peer_message__free_unpacked(m, NULL);
        goto out;
    }
    const Baton__V1__PullReply *r = m->reply;
    xfer_pull *pl = u64map_get(&x->pulls, r->xfer_id);
    if (!pl || pl->peer != p) {
        /* A cancelled pull's chunk: nobody waits for it. */
        baton__v1__peer_message__free_unpacked(m, NULL);
        goto out;
    }
    char msg[768];
    if (r->status && r->status->code != BATON__V1__CODE__OK) {
        snprintf(msg, sizeof(msg), "worker %s refused to send tensor %" PRIu64 ": %s", p->name,
                 pl->src.tensor_id, r->status->message ? r->status->message : "");
        baton_status code = r->status->code == BATON__V1__CODE__NOT_FOUND
                                ? BATON_STATUS_UNAVAILABLE : BATON_STATUS_INTERNAL;
        pull_end(x, pl, code, msg);
    } else if (!have_data || zmq_msg_size(&data) != r->length ||
               wk_xfer_plan_recv(&pl->plan, r->offset, r->length) < 0) {
        snprintf(msg, sizeof(msg), "worker %s answered a pull of tensor %" PRIu64 " with %zu "
                 "bytes at offset %" PRIu64 ", which were not asked", p->name, pl->src.tensor_id,
                 have_data ? zmq_msg_size(&data) : (size_t)0, r->offset);
        pull_end(x, pl, BATON_STATUS_INTERNAL, msg);
    } else {
        /* Ask for the next chunk before copying this one, so that the
         * request's round trip overlaps the copy.  The pump may lose the
         * peer and end this very pull: look it up again. */
        uint64_t id = pl->id;
        peer_pump(x, p);
        if ((pl = u64map_get(&x->pulls, id)) != NULL) {
            memcpy(pl->dst + r->offset, zmq_msg_data(&data), r->length);
            if (pl->plan.received == pl->plan.nbytes)
                pull_end(x, pl, BATON_STATUS_OK, "");
        }
    }
    baton__v1__peer_message__free_unpacked(m, NULL);
out:
    zmq_msg_close(&data);
    zmq_msg_close(&hdr);
}

/* --- producer -------------------------------------------------------------------- */

static void reply_release(void *data, void *hint)
{
    (void)data;
    xfer_unpin *u = hint;
    wk_xfer *x = u->x;
    xfer_unpin *head = atomic_load(&x->unpins);
    do
        u->next = head;
    while (!atomic_compare_exchange_weak(&x->unpins, &head, u));
    if (x->wake_fd >= 0) {
        uint64_t one = 1;
        if (write(x->wake_fd, &one, sizeof(one)) < 0) {
            /* A full eventfd is already signalled. */
        }
    }
}

void wk_xfer_drain_unpins(wk_xfer *x)
{
    if (!x)
        return;
    xfer_unpin *u = atomic_exchange(&x->unpins, NULL);
    while (u) {
        xfer_unpin *nx = u->next;
        x->ops.unpin(x->arg, u->pin);
        atomic_fetch_sub(&x->pins_out, 1);
        free(u);
        u = nx;
    }
}

/* Sends the reply to ID: the header, and the bytes from DATA when OK. */
static void send_reply(wk_xfer *x, const zmq_msg_t *id, const Baton__V1__PullRequest *rq,
                       baton_status code, const char *message, const uint8_t *data, void *pin)
{
    Baton__V1__Status st = BATON__V1__STATUS__INIT;
    st.code = (Baton__V1__Code)code;
    st.message = (char *)message;
    Baton__V1__PullReply r = BATON__V1__PULL_REPLY__INIT;
    r.xfer_id = rq->xfer_id;
    r.offset = rq->offset;
    r.length = code == BATON_STATUS_OK ? rq->length : 0;
    r.status = &st;
    Baton__V1__PeerMessage m = BATON__V1__PEER_MESSAGE__INIT;
    m.protocol_version = BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    m.msg_case = BATON__V1__PEER_MESSAGE__MSG_REPLY;
    m.reply = &r;
    zmq_msg_t idm, hdr, body;
    zmq_msg_init(&idm);
    bool ok = code == BATON_STATUS_OK;
    xfer_unpin *u = NULL;
    if (zmq_msg_copy(&idm, (zmq_msg_t *)id) != 0 ||
        zmq_msg_init_size(&hdr, baton__v1__peer_message__get_packed_size(&m)) != 0) {
        zmq_msg_close(&idm);
        if (pin)
            x->ops.unpin(x->arg, pin);
        return;
    }
    baton__v1__peer_message__pack(&m, zmq_msg_data(&hdr));
    if (ok) {
        if (!(u = malloc(sizeof(*u))) ||
            zmq_msg_init_data(&body, (void *)(data + rq->offset), rq->length, reply_release,
                              u) != 0) {
            free(u);
            x->ops.unpin(x->arg, pin);
            zmq_msg_close(&hdr);
            zmq_msg_close(&idm);
            return;
        }
        *u = (xfer_unpin){x, pin, NULL};
        atomic_fetch_add(&x->pins_out, 1);
        x->st.bytes_served += rq->length;
    }
    /* Sends on a ROUTER never block; a consumer gone since its request
     * makes them drop the frames, and closing them then releases the pin. */
    if (zmq_msg_send(&idm, x->router, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&idm);
        zmq_msg_close(&hdr);
        if (ok)
            zmq_msg_close(&body);
        return;
    }
    if (zmq_msg_send(&hdr, x->router, (ok ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&hdr);
        if (ok)
            zmq_msg_close(&body);
        return;
    }
    if (ok && zmq_msg_send(&body, x->router, ZMQ_DONTWAIT) < 0)
        zmq_msg_close(&body);
}

/* One request on the ROUTER. */
static void producer_recv(wk_xfer *x)
{
    zmq_msg_t id, req;
    zmq_msg_init(&id);
    zmq_msg_init(&req);
    if (zmq_msg_recv(&id, x->router, ZMQ_DONTWAIT) < 0)
        goto out;
    if (!zmq_msg_more(&id) || zmq_msg_recv(&req, x->router, 0) < 0)
        goto out;
    while (zmq_msg_more(&req)) {
        zmq_msg_t extra;
        zmq_msg_init(&extra);
        int rc = zmq_msg_recv(&extra, x->router, 0);
        zmq_msg_close(&extra);
        if (rc < 0)
            goto out;
    }
    Baton__V1__PeerMessage *m =
        baton__v1__peer_message__unpack(NULL, zmq_msg_size(&req), zmq_msg_data(&req));
    if (!m || m->msg_case != BATON__V1__PEER_MESSAGE__MSG_PULL) {
        /* Nothing names a transfer to answer for. */
        x->st.requests_refused++;
        bt_warn("dropped a worker-to-worker frame of %zu bytes that is no PullRequest",
                zmq_msg_size(&req));
        if (m)
            baton__v1__peer_message__free_unpacked(m, NULL);
        goto out;
    }
    const Baton__V1__PullRequest *rq = m->pull;
    char err[384];
    const uint8_t *data = NULL;
    void *pin = NULL;
    baton_status code = BATON_STATUS_OK;
    wk_xfer_src want = {rq->tensor_id, rq->pool, rq->tensor_offset, rq->tensor_nbytes};
    wk_xfer_src held = {0};
    if (m->protocol_version != BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT) {
        code = BATON_STATUS_FAILED_PRECONDITION;
        snprintf(err, sizeof(err), "protocol version %u, this worker speaks %d",
                 m->protocol_version, BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT);
    } else if ((code = x->ops.pin(x->arg, rq->tensor_id, &held, &data, &pin, err,
                                  sizeof(err))) == BATON_STATUS_OK &&
               wk_xfer_check_range(&held, &want, rq->offset, rq->length, err, sizeof(err)) != 0) {
        code = BATON_STATUS_INVALID_ARGUMENT;
        x->ops.unpin(x->arg, pin);
        pin = NULL;
    }
    if (code != BATON_STATUS_OK)
        x->st.requests_refused++;
    send_reply(x, &id, rq, code, code == BATON_STATUS_OK ? "" : err, data, pin);
    baton__v1__peer_message__free_unpacked(m, NULL);
out:
    zmq_msg_close(&req);
    zmq_msg_close(&id);
}

/* --- the loop's callbacks ---------------------------------------------------------- */

/* Whether SOCK has a message waiting (the poll's revents are only a hint
 * once other messages were read). */
static bool readable(void *sock)
{
    int ev = 0;
    size_t len = sizeof(ev);
    return zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &len) == 0 && (ev & ZMQ_POLLIN);
}

static void on_zap(evloop *l, void *arg)
{
    (void)l;
    wk_xfer *x = arg;
    if (bt_zap_serve(x->zap, xfer_zap_decide, x) < 0)
        bt_warn("cannot answer a worker-to-worker ZAP request: %s", zmq_strerror(zmq_errno()));
}

static void on_router(evloop *l, void *arg)
{
    (void)l;
    wk_xfer *x = arg;
    /* A bounded batch, so that a busy producer still lets the worker's
     * other sockets in. */
    for (int k = 0; k < 64 && x->router && readable(x->router); k++)
        producer_recv(x);
}

static void on_peer(evloop *l, void *arg)
{
    (void)l;
    xfer_peer *p = arg;
    /* Each answer costs a copy of up to a chunk on this thread: a few per
     * round keep the worker's other sockets served meanwhile. */
    for (int k = 0; k < 8 && p->sock && readable(p->sock); k++) {
        consumer_recv(p->x, p);
        peer_pump(p->x, p);
    }
}

long wk_xfer_tick(wk_xfer *x, uint64_t now_ns)
{
    if (!x)
        return -1;
    const uint64_t limit = (uint64_t)WK_XFER_TIMEOUT_MS * 1000000u;
    long next = -1;
    for (xfer_peer *p = x->peers; p; p = p->next) {
        if (!p->sock || !p->inflight)
            continue;
        if (now_ns - p->last_rx_ns >= limit) {
            char why[128];
            snprintf(why, sizeof(why), "no answer from %s for %u ms", p->endpoint,
                     WK_XFER_TIMEOUT_MS);
            peer_lose(x, p, why);
            continue;
        }
        long ms = (long)((limit - (now_ns - p->last_rx_ns)) / 1000000u) + 1;
        if (next < 0 || ms < next)
            next = ms;
    }
    return next;
}

int wk_xfer_set_tuning(wk_xfer *x, uint32_t chunk, uint32_t window)
{
    if (chunk == 0 || chunk > WK_XFER_MAX_CHUNK || window == 0)
        return BT_EINVAL;
    x->chunk = chunk;
    x->window = window;
    return 0;
}

void wk_xfer_get_stats(const wk_xfer *x, wk_xfer_stats *out)
{
    *out = x->st;
    out->pulls_active = (uint32_t)x->pulls.n;
    out->pins_out = atomic_load(&x->pins_out);
}

void wk_xfer_close(wk_xfer *x)
{
    if (!x)
        return;
    size_t pos = 0;
    uint64_t id;
    void *val;
    while (u64map_next(&x->pulls, &pos, &id, &val))
        free(val);
    u64map_free(&x->pulls);
    u64map_init(&x->pulls);
    for (xfer_peer *p = x->peers; p; p = p->next) {
        p->rr_head = p->rr_tail = NULL;
        peer_close(x, p);
    }
    evloop_remove(x->loop, x->router_watch);
    evloop_remove(x->loop, x->zap_watch);
    x->router_watch = x->zap_watch = -1;
    if (x->router)
        zmq_close(x->router);
    x->router = NULL;
    if (x->zap)
        zmq_close(x->zap);
    x->zap = NULL;
}

void wk_xfer_destroy(wk_xfer *x)
{
    if (!x)
        return;
    wk_xfer_drain_unpins(x);
    if (atomic_load(&x->pins_out))
        bt_warn("%u worker-to-worker replies were never released by ZeroMQ",
                atomic_load(&x->pins_out));
    for (xfer_peer *p = x->peers, *nx; p; p = nx) {
        nx = p->next;
        free(p->name);
        free(p->endpoint);
        free(p->curve_public_key);
        free(p);
    }
    u64map_free(&x->pulls);
    bt_curve_keypair_wipe(&x->own);
    free(x);
}
