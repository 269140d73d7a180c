/* Cross-host GPU transfers over NCCL (worker/nccl.h).
 *
 * Communicators.  Each pair of GPU workers on different hosts shares one
 * two-rank communicator.  The lower-indexed worker makes its id when a
 * Peers message shows the other one up (first registration, or a new
 * incarnation), joins as rank 0 and sends the id to the conductor in a
 * PairId; the conductor relays it as PairComm and the other worker joins
 * as rank 1.  Made at registration rather than at the first transfer: it
 * costs one id and one join per pair of GPU workers on different hosts (a
 * handful), and the first request then waits for nothing.  Every
 * communicator of a pair has an epoch (1, 2, ...), chosen by its maker and
 * carried by every transfer, so that a transfer meant for an older one
 * fails instead of pairing with the wrong operation on a newer one.
 *
 * Ordering.  NCCL pairs a rank's sends to a peer with the peer's receives
 * from it by the order they are issued in.  The conductor numbers the
 * transfers of each pair with one counter (both directions) and sends the
 * Send messages and the Dispatches holding NCCL parts in that order; ZeroMQ
 * keeps each pipe in order, and here the I/O thread queues them to the comm
 * thread in arrival order, which issues them in that order on the pair's
 * one stream.  So both ranks issue a pair's operations in the same order
 * (the numbers are checked on the way, a gap is logged), and since the two
 * directions share one order and one stream, a transfer A->B queued behind
 * B->A on both sides never waits for one the peer has not reached.
 *
 * Failure.  A transfer that cannot go on must not leave a receive waiting
 * forever.  The comm thread polls each pair's operations (an event after
 * each); it aborts the pair's communicator (ncclCommAbort, which never
 * waits for the peer) when the peer goes down (Peers), when the
 * communicator reports an asynchronous error (the peer aborted it), when a
 * transfer fails to queue, or when the oldest pending one outlives its
 * request's deadline (XFER_DEFAULT_MS without one).  Every pending transfer
 * of the pair then fails: a receive fails its dispatch UNAVAILABLE, a send
 * just unpins its tensor.  The lower-indexed worker then makes a new
 * communicator (a new epoch) if the peer is still up.
 *
 * The consumer's node waits for its receives on the host: the comm thread
 * sees the receive's event complete, and only then does the I/O thread
 * queue the dispatch with the received tensors as its own, in place of the
 * NCCL parts.  A failed receive thus fails the node instead of feeding it
 * undefined bytes, and no compute stream ever waits on an operation that an
 * abort may cut short. */
#include "worker/nccl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/builtin.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "worker/wire.h"

#define XFER_DEFAULT_MS 60000u /* a transfer of a request without a deadline */
#define XFER_POLL_NS 100000L   /* between polls while a transfer is pending */
#define XFER_JOIN_MS 60000u    /* a communicator whose peer has not joined by then is aborted */

typedef struct nccl_wait nccl_wait;

/* One send or receive, or (broke) the news that a pair's communicator was
 * aborted. */
typedef struct nccl_op {
    wk_event ev;                  /* first: handed back to the I/O thread */
    struct wk_nccl *x;
    bool send;
    bool broke;                   /* not a transfer: the pair's communicator was aborted */
    uint32_t peer, epoch;
    uint64_t seq;
    wk_tensor *t;                 /* pinned own tensor: the source or the destination */
    void *buf;                    /* its bytes (device memory) */
    uint64_t n;                   /* bytes */
    uint64_t deadline_ns;         /* abandoned past it (CLOCK_MONOTONIC) */
    nccl_wait *wait;              /* receive: the dispatch waiting for it */
    void *mark;                   /* comm thread: the event after it */
    bool ok;
    char err[200];
    struct nccl_op *next;         /* in a pair's pending list */
} nccl_op;

/* A dispatch waiting for its receives. */
struct nccl_wait {
    Baton__V1__ConductorMessage *msg; /* owned */
    uint32_t left;                /* receives not finished */
    uint32_t n;
    wk_tensor **t;                /* per receive: its destination, pinned until the end */
    Baton__V1__TensorRef **refs;  /* per receive: the chunk reference it replaces */
    Baton__V1__TensorPart **parts; /* per receive: its part */
    bool failed;
    char err[400];
};

typedef enum nccl_cmd_kind { CMD_JOIN, CMD_OP, CMD_ABORT } nccl_cmd_kind;

/* Work for the comm thread, in order. */
typedef struct nccl_cmd {
    nccl_cmd_kind kind;
    uint32_t peer, epoch;         /* JOIN, ABORT */
    int rank;                     /* JOIN */
    uint8_t id[BK_COMM_ID_MAX];   /* JOIN */
    size_t id_len;
    char why[160];                /* ABORT */
    nccl_op *op;                  /* OP */
    struct nccl_cmd *next;
} nccl_cmd;

/* What the I/O thread knows of a peer. */
typedef struct nccl_peer {
    bool nccl;                    /* a GPU worker on another host */
    bool up;
    bool made;                    /* a communicator of this incarnation was made or awaited */
    uint64_t incarnation;         /* the peer's when it was made */
    uint32_t epoch;               /* the pair's current communicator (0: none yet) */
    uint64_t last_seq;            /* the last transfer number seen on that epoch */
} nccl_peer;

/* The comm thread's side of a pair. */
typedef struct nccl_pair {
    void *comm;                   /* NULL: none (never made, or aborted) */
    void *stream;                 /* made with the first communicator, kept */
    uint32_t epoch;
    int rank;                     /* ours; the peer is 1 - rank */
    bool ready;                   /* the peer has joined COMM */
    uint64_t join_deadline_ns;    /* aborted if the peer has not joined by then */
    nccl_op *head, *tail;         /* issued, in order, not finished */
    nccl_op *wait_head, *wait_tail; /* waiting for the peer to join, in order */
} nccl_pair;

struct wk_nccl {
    wk_nccl_options opt;
    wk_nccl_hooks hooks;
    bool gpu;                     /* a GPU worker: the only kind that transfers over NCCL */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    nccl_cmd *cmd_head, *cmd_tail; /* [mu] */
    bool stop;                    /* [mu] */
    nccl_peer *peers;             /* I/O thread, per worker index */
    size_t n_peers;
    uint32_t last_epoch;          /* I/O thread: epochs this worker made */
    nccl_pair *pairs;             /* comm thread, per worker index */
    size_t n_pairs;
};

/* --- comm thread -------------------------------------------------------------- */

/* Hands OP back to the I/O thread. */
static void op_done(wk_event *ev);

static void op_finish(wk_nccl *x, nccl_op *op, bool ok, const char *err)
{
    op->ok = ok;
    if (!ok)
        snprintf(op->err, sizeof(op->err), "%.*s", (int)sizeof(op->err) - 1, err);
    if (op->mark)
        wk_device_mark_free(x->opt.dev, op->mark);
    op->mark = NULL;
    op->x = x;
    op->ev.run = op_done;
    wk_events_post(x->opt.events, &op->ev);
}

static nccl_pair *pair_get(wk_nccl *x, uint32_t peer)
{
    if (peer >= x->n_pairs) {
        size_t n = (size_t)peer + 1;
        nccl_pair *p = realloc(x->pairs, n * sizeof(*p));
        if (!p)
            return NULL;
        memset(p + x->n_pairs, 0, (n - x->n_pairs) * sizeof(*p));
        x->pairs = p;
        x->n_pairs = n;
    }
    return &x->pairs[peer];
}

/* Aborts PEER's communicator, failing every pending transfer with WHY, and
 * tells the I/O thread (which may make a new one). */
static void pair_abort(wk_nccl *x, uint32_t peer, const char *why)
{
    nccl_pair *p = peer < x->n_pairs ? &x->pairs[peer] : NULL;
    if (!p || (!p->comm && !p->head && !p->wait_head))
        return;
    if (p->comm) {
        /* Only one that fails transfers is worth a warning. */
        if (p->head || p->wait_head)
            bt_warn("communicator %u with worker %u aborted: %s", p->epoch, peer, why);
        else
            bt_info("communicator %u with worker %u aborted: %s", p->epoch, peer, why);
        wk_device_pair_close(x->opt.dev, p->comm, true);
        p->comm = NULL;
    }
    p->ready = false;
    for (nccl_op *op = p->head, *nx; op; op = nx) {
        nx = op->next;
        op_finish(x, op, false, why);
    }
    for (nccl_op *op = p->wait_head, *nx; op; op = nx) {
        nx = op->next;
        op_finish(x, op, false, why);
    }
    p->head = p->tail = p->wait_head = p->wait_tail = NULL;
    nccl_op *news = calloc(1, sizeof(*news));
    if (news) {
        news->broke = true;
        news->peer = peer;
        news->epoch = p->epoch;
        op_finish(x, news, true, "");
    }
}

static void run_join(wk_nccl *x, const nccl_cmd *c)
{
    char err[256];
    nccl_pair *p = pair_get(x, c->peer);
    if (!p) {
        bt_error("out of memory joining a communicator with worker %u", c->peer);
        return;
    }
    /* A new communicator replaces the pair's old one, and whatever was
     * pending on it can no longer pair with the peer's operations. */
    pair_abort(x, c->peer, "replaced by a new communicator");
    if (!p->stream && wk_device_stream_create(x->opt.dev, &p->stream, err, sizeof(err)) != 0) {
        bt_error("communicator with worker %u: %s", c->peer, err);
        return;
    }
    void *comm = NULL;
    if (wk_device_pair_join(x->opt.dev, &comm, c->id, c->id_len, c->rank, err, sizeof(err)) != 0) {
        bt_error("communicator %u with worker %u: %s", c->epoch, c->peer, err);
        return;
    }
    /* The join completes when the peer joins too (poll_pairs); a peer that
     * never does must not hold this thread, which serves every pair. */
    p->comm = comm;
    p->epoch = c->epoch;
    p->rank = c->rank;
    p->ready = false;
    p->join_deadline_ns = bt_now_ns() + (uint64_t)XFER_JOIN_MS * 1000000u;
}

static void op_append(nccl_op **head, nccl_op **tail, nccl_op *op)
{
    op->next = NULL;
    if (*tail)
        (*tail)->next = op;
    else
        *head = op;
    *tail = op;
}

/* Queues OP on the pair's stream, with an event after it. */
static void op_issue(wk_nccl *x, uint32_t peer, nccl_pair *p, nccl_op *op)
{
    char err[256];
    if (wk_device_pair_p2p(x->opt.dev, p->comm, p->stream, op->send, op->buf, op->n, 1 - p->rank,
                           err, sizeof(err)) != 0 ||
        wk_device_mark(x->opt.dev, p->stream, &op->mark, err, sizeof(err)) != 0) {
        op_finish(x, op, false, err);
        pair_abort(x, peer, err);
        return;
    }
    op_append(&p->head, &p->tail, op);
}

static void run_op(wk_nccl *x, nccl_op *op)
{
    char err[256];
    nccl_pair *p = pair_get(x, op->peer);
    if (!p || !p->comm || p->epoch != op->epoch) {
        snprintf(err, sizeof(err), "no communicator %u with worker %u here (%s)", op->epoch,
                 op->peer, p && p->comm ? "it was replaced" : "none formed, or it was aborted");
        op_finish(x, op, false, err);
        return;
    }
    if (!p->ready)
        op_append(&p->wait_head, &p->wait_tail, op); /* issued in order once joined */
    else
        op_issue(x, op->peer, p, op);
}

/* A pair still joining: ready (its waiting transfers are issued, in
 * order), failed, or past its deadline.  Returns whether it is ready. */
static bool poll_join(wk_nccl *x, uint32_t peer, nccl_pair *p)
{
    int q = wk_device_pair_ready(x->opt.dev, p->comm);
    if (q == 0 && bt_now_ns() <= p->join_deadline_ns)
        return false;
    if (q != 1) {
        pair_abort(x, peer, q < 0 ? "joining the communicator failed"
                                  : "the peer did not join the communicator in time");
        return false;
    }
    p->ready = true;
    bt_info("communicator %u with worker %u formed (rank %d)", p->epoch, peer, p->rank);
    nccl_op *ops = p->wait_head;
    p->wait_head = p->wait_tail = NULL;
    for (nccl_op *op = ops, *nx; op; op = nx) {
        nx = op->next;
        if (p->comm)
            op_issue(x, peer, p, op);
        else
            op_finish(x, op, false, "the communicator was aborted");
    }
    return p->comm != NULL;
}

/* Finishes what completed on each pair; aborts the pairs that cannot go
 * on.  Returns whether anything is still pending. */
static bool poll_pairs(wk_nccl *x)
{
    bool any = false;
    uint64_t now = bt_now_ns();
    for (uint32_t i = 0; i < x->n_pairs; i++) {
        nccl_pair *p = &x->pairs[i];
        if (p->comm && !p->ready && !poll_join(x, i, p)) {
            any |= p->comm != NULL;
            continue;
        }
        while (p->head) {
            nccl_op *op = p->head;
            int q = wk_device_mark_query(x->opt.dev, op->mark);
            if (q == 1) {
                p->head = op->next;
                if (!p->head)
                    p->tail = NULL;
                op_finish(x, op, true, "");
                continue;
            }
            if (q < 0)
                pair_abort(x, i, "a transfer failed on the device");
            else if (wk_device_pair_failed(x->opt.dev, p->comm))
                pair_abort(x, i, "the peer aborted the communicator (it failed or was lost)");
            else if (now > op->deadline_ns)
                pair_abort(x, i, "a transfer outlived its request's deadline");
            break;
        }
        any |= p->head != NULL;
    }
    return any;
}

static void run_cmd(wk_nccl *x, nccl_cmd *c)
{
    switch (c->kind) {
    case CMD_JOIN: run_join(x, c); break;
    case CMD_OP: run_op(x, c->op); break;
    case CMD_ABORT: pair_abort(x, c->peer, c->why); break;
    }
    free(c);
}

static void *comm_main(void *arg)
{
    wk_nccl *x = arg;
    wk_device_bind_thread(x->opt.dev);
    bool busy = false;
    for (;;) {
        pthread_mutex_lock(&x->mu);
        while (!x->stop && !x->cmd_head && !busy)
            pthread_cond_wait(&x->cv, &x->mu);
        nccl_cmd *cmds = x->cmd_head;
        x->cmd_head = x->cmd_tail = NULL;
        bool stop = x->stop;
        pthread_mutex_unlock(&x->mu);
        for (nccl_cmd *c = cmds, *nx; c; c = nx) {
            nx = c->next;
            /* Stopping: transfers fail without being issued. */
            if (stop && c->kind == CMD_OP) {
                op_finish(x, c->op, false, "the worker is stopping");
                free(c);
            } else if (stop && c->kind == CMD_JOIN) {
                free(c);
            } else {
                run_cmd(x, c);
            }
        }
        if (stop)
            break;
        busy = poll_pairs(x);
        if (busy)
            nanosleep(&(struct timespec){0, XFER_POLL_NS}, NULL);
    }
    for (uint32_t i = 0; i < x->n_pairs; i++) {
        pair_abort(x, i, "the worker is stopping");
        if (x->pairs[i].stream)
            wk_device_stream_destroy(x->opt.dev, x->pairs[i].stream);
    }
    return NULL;
}

/* --- I/O thread ----------------------------------------------------------------- */

static void cmd_post(wk_nccl *x, nccl_cmd *c)
{
    c->next = NULL;
    pthread_mutex_lock(&x->mu);
    if (x->cmd_tail)
        x->cmd_tail->next = c;
    else
        x->cmd_head = c;
    x->cmd_tail = c;
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

static void post_abort(wk_nccl *x, uint32_t peer, const char *why)
{
    nccl_cmd *c = calloc(1, sizeof(*c));
    if (!c) {
        bt_error("out of memory aborting the communicator with worker %u", peer);
        return;
    }
    c->kind = CMD_ABORT;
    c->peer = peer;
    snprintf(c->why, sizeof(c->why), "%s", why);
    cmd_post(x, c);
}

static void post_op(wk_nccl *x, nccl_op *op)
{
    nccl_cmd *c = calloc(1, sizeof(*c));
    if (!c) {
        /* Not issued: the peer's matching operation would wait for it, so
         * the pair goes down instead. */
        op_finish(x, op, false, "out of memory");
        post_abort(x, op->peer, "out of memory queueing a transfer");
        return;
    }
    c->kind = CMD_OP;
    c->op = op;
    cmd_post(x, c);
}

/* Checks a transfer's number against the last of its pair: a gap means a
 * message was lost on the way, and the order the two ranks issue in may
 * then differ (the deadline and the abort still end it). */
static void seq_check(wk_nccl *x, uint32_t peer, uint32_t epoch, uint64_t seq)
{
    nccl_peer *xp = peer < x->n_peers ? &x->peers[peer] : NULL;
    if (!xp)
        return;
    if (xp->epoch == epoch && seq != xp->last_seq + 1)
        bt_warn("transfer %" PRIu64 " with worker %u on communicator %u follows %" PRIu64,
                seq, peer, epoch, xp->last_seq);
    if (xp->epoch != epoch) {
        xp->epoch = epoch;
        xp->last_seq = 0;
    }
    xp->last_seq = seq;
}

/* As the pair's lower index: makes a new communicator with PEER. */
static void pair_make(wk_nccl *x, uint32_t peer)
{
    nccl_peer *xp = &x->peers[peer];
    nccl_cmd *c = calloc(1, sizeof(*c));
    char err[256];
    if (!c) {
        bt_error("out of memory making a communicator with worker %u", peer);
        return;
    }
    size_t len = sizeof(c->id);
    if (bk_comm_unique_id(c->id, &len, err, sizeof(err)) != 0) {
        bt_error("communicator with worker %u: %s", peer, err);
        free(c);
        return;
    }
    c->kind = CMD_JOIN;
    c->peer = peer;
    c->epoch = ++x->last_epoch;
    c->rank = 0;
    c->id_len = len;
    xp->epoch = c->epoch;
    xp->last_seq = 0;
    xp->made = true;
    Baton__V1__PairId pi = BATON__V1__PAIR_ID__INIT;
    pi.peer = peer;
    pi.peer_incarnation = xp->incarnation;
    pi.epoch = c->epoch;
    pi.comm_id.data = c->id;
    pi.comm_id.len = len;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_PAIR_ID;
    m.pair_id = &pi;
    wk_wire_send(x->opt.sock, &m);
    cmd_post(x, c);
}

static bool peer_is_gpu(const Baton__V1__PeerInfo *pi)
{
    for (size_t k = 0; k < pi->n_pools; k++)
        if (pi->pools[k]->kind == BATON__V1__POOL_KIND__POOL_KIND_CUDA_IPC)
            return true;
    return false;
}

void wk_nccl_on_peers(wk_nccl *x, const Baton__V1__Peers *p)
{
    if (!x)
        return;
    /* Indices are 0 .. n_peers - 1 (every worker, this one included); any
     * other is ignored rather than sized for. */
    size_t n = p->n_peers;
    if (n > x->n_peers) {
        nccl_peer *np = realloc(x->peers, n * sizeof(*np));
        if (!np) {
            bt_error("out of memory taking in the peers' communicators");
            return;
        }
        memset(np + x->n_peers, 0, (n - x->n_peers) * sizeof(*np));
        x->peers = np;
        x->n_peers = n;
    }
    bool self_gpu = wk_device_space(x->opt.dev) == WK_SPACE_CUDA;
    for (size_t i = 0; i < p->n_peers; i++) {
        const Baton__V1__PeerInfo *pi = p->peers[i];
        uint32_t k = pi->index;
        if (k == p->self_index || k >= n)
            continue;
        nccl_peer *xp = &x->peers[k];
        bool nccl = self_gpu && peer_is_gpu(pi) && pi->hostname &&
                    strcmp(pi->hostname, x->opt.hostname) != 0;
        bool gone = !pi->up || !nccl || (xp->made && xp->incarnation != pi->incarnation);
        if (xp->made && gone) {
            post_abort(x, k, pi->up ? "the peer restarted" : "the peer is down");
            xp->made = false;
        }
        xp->nccl = nccl;
        xp->up = pi->up;
        if (!nccl || !pi->up || xp->made)
            continue;
        xp->incarnation = pi->incarnation;
        if (p->self_index < k)
            pair_make(x, k);
        else
            xp->made = true; /* the peer makes it; PairComm brings it */
    }
}

void wk_nccl_on_pair_comm(wk_nccl *x, const Baton__V1__PairComm *pc)
{
    if (!x || !x->gpu)
        return;
    if (pc->peer >= x->n_peers || !pc->comm_id.len || pc->comm_id.len > BK_COMM_ID_MAX) {
        bt_warn("a communicator id from worker %u was dropped (unknown peer or bad id)",
                pc->peer);
        return;
    }
    nccl_cmd *c = calloc(1, sizeof(*c));
    if (!c) {
        bt_error("out of memory joining a communicator with worker %u", pc->peer);
        return;
    }
    c->kind = CMD_JOIN;
    c->peer = pc->peer;
    c->epoch = pc->epoch;
    c->rank = 1;
    memcpy(c->id, pc->comm_id.data, pc->comm_id.len);
    c->id_len = pc->comm_id.len;
    x->peers[pc->peer].epoch = pc->epoch;
    x->peers[pc->peer].last_seq = 0;
    cmd_post(x, c);
}

static uint64_t deadline_of(uint32_t remaining_ms)
{
    return bt_now_ns() + (uint64_t)(remaining_ms ? remaining_ms : XFER_DEFAULT_MS) * 1000000u;
}

void wk_nccl_on_send(wk_nccl *x, const Baton__V1__Send *s)
{
    if (!x || !x->gpu)
        return; /* the conductor never asks a CPU worker */
    if (s->peer >= x->n_peers) {
        bt_warn("a Send names worker %u, which is not a peer", s->peer);
        return;
    }
    nccl_op *op = calloc(1, sizeof(*op));
    if (!op) {
        post_abort(x, s->peer, "out of memory taking a Send");
        return;
    }
    op->send = true;
    op->peer = s->peer;
    op->epoch = s->epoch;
    op->seq = s->seq;
    op->deadline_ns = deadline_of(s->remaining_ms);
    seq_check(x, s->peer, s->epoch, s->seq);
    pthread_mutex_lock(x->opt.lock);
    wk_tensor *t = s->ref ? wk_store_tensor_find(x->opt.store, s->ref->id) : NULL;
    /* The receiver takes the size the conductor gave it: a send of any
     * other would not pair with its receive. */
    if (t && t->ref.nbytes != s->ref->nbytes)
        t = NULL;
    if (t) {
        t->pins++;
        op->t = t;
        op->buf = wk_store_tensor_data(x->opt.store, t);
        op->n = t->ref.nbytes;
    }
    pthread_mutex_unlock(x->opt.lock);
    if (!t) {
        /* The receiver waits for these bytes: without them the pair's
         * order is lost, so the pair starts over. */
        bt_warn("Send %" PRIu64 " to worker %u names tensor %" PRIu64 ", not held here (or "
                "of another size)",
                s->seq, s->peer, s->ref ? s->ref->id : 0);
        free(op);
        post_abort(x, s->peer, "a Send named a tensor this worker does not hold");
        return;
    }
    post_op(x, op);
}

static bool part_is_nccl(const Baton__V1__TensorPart *p)
{
    return p->transfer == BATON__V1__TRANSFER_KIND__TRANSFER_KIND_NCCL;
}

/* Ends WAIT: the dispatch runs with its received tensors, or is refused. */
static void wait_finish(wk_nccl *x, nccl_wait *wt)
{
    const Baton__V1__Dispatch *d = wt->msg->dispatch;
    pthread_mutex_lock(x->opt.lock);
    wk_request *req = NULL;
    for (uint32_t i = 0; i < wt->n; i++) {
        wk_tensor *t = wt->t[i];
        if (!t)
            continue;
        req = t->req;
        wt->failed |= t->released; /* the request ended meanwhile */
    }
    /* A stopping worker queues nothing more (its lanes are gone). */
    if (atomic_load(x->opt.stopping) && !wt->failed) {
        wt->failed = true;
        snprintf(wt->err, sizeof(wt->err), "the worker is stopping");
    }
    for (uint32_t i = 0; i < wt->n; i++) {
        wk_tensor *t = wt->t[i];
        if (!t)
            continue;
        if (!wt->failed) {
            /* The received copy is an own tensor of the request, read in
             * place like any other and freed when the request ends. */
            Baton__V1__TensorRef *r = wt->refs[i];
            r->owner = wk_store_self(x->opt.store);
            r->pool = t->ref.pool;
            r->offset = t->ref.offset;
            r->id = t->ref.id;
            wt->parts[i]->transfer = BATON__V1__TRANSFER_KIND__TRANSFER_KIND_LOCAL;
        } else if (!t->released) {
            wk_store_tensor_release(x->opt.store, t->ref.id);
        }
        wk_store_tensor_unpin(x->opt.store, t);
    }
    if (req)
        wk_store_request_gc(x->opt.store, req);
    pthread_mutex_unlock(x->opt.lock);
    if (!wt->failed) {
        x->hooks.accept(x->hooks.arg, wt->msg);
    } else {
        if (!atomic_load(x->opt.stopping))
            wk_wire_refuse(x->opt.sock, d, BATON_STATUS_UNAVAILABLE, wt->err);
        baton__v1__conductor_message__free_unpacked(wt->msg, NULL);
    }
    free(wt->t);
    free(wt->refs);
    free(wt->parts);
    free(wt);
}

static void wait_fail(nccl_wait *wt, const char *fmt, const char *what, uint32_t peer)
{
    if (wt->failed)
        return;
    wt->failed = true;
    snprintf(wt->err, sizeof(wt->err), fmt, what, peer);
}

int wk_nccl_on_dispatch(wk_nccl *x, Baton__V1__ConductorMessage *msg)
{
    /* A CPU worker leaves NCCL parts to the input check, which refuses
     * them. */
    if (!x || !x->gpu)
        return 0;
    const Baton__V1__Dispatch *d = msg->dispatch;
    uint32_t n = 0;
    bool any = false;
    for (size_t k = 0; k < d->n_inputs; k++)
        for (size_t p = 0; p < d->inputs[k]->n_parts; p++)
            if (part_is_nccl(d->inputs[k]->parts[p])) {
                any = true;
                n += (uint32_t)d->inputs[k]->parts[p]->n_chunks;
            }
    if (!any)
        return 0;
    nccl_wait *wt = calloc(1, sizeof(*wt));
    if (wt) {
        wt->t = calloc(n + 1, sizeof(*wt->t));
        wt->refs = calloc(n + 1, sizeof(*wt->refs));
        wt->parts = calloc(n + 1, sizeof(*wt->parts));
    }
    if (!wt || !wt->t || !wt->refs || !wt->parts) {
        if (wt) {
            free(wt->t);
            free(wt->refs);
            free(wt->parts);
            free(wt);
        }
        for (size_t k = 0; k < d->n_inputs; k++)
            for (size_t p = 0; p < d->inputs[k]->n_parts; p++)
                if (part_is_nccl(d->inputs[k]->parts[p]) && d->inputs[k]->parts[p]->n_chunks)
                    post_abort(x, d->inputs[k]->parts[p]->chunks[0]->owner,
                               "out of memory taking a dispatch's receives");
        wk_wire_refuse(x->opt.sock, d, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        baton__v1__conductor_message__free_unpacked(msg, NULL);
        return 1;
    }
    wt->msg = msg;
    wt->n = n;
    /* Every receive is issued, even those of a dispatch that will be
     * refused: the peer sends regardless, and its order must hold.  One
     * that cannot be issued takes its pair down instead. */
    nccl_op *ops = NULL, **tail = &ops;
    uint32_t i = 0;
    pthread_mutex_lock(x->opt.lock);
    uint32_t self = wk_store_self(x->opt.store);
    wk_request *req = wk_store_request(x->opt.store, d->request_key, true);
    for (size_t k = 0; k < d->n_inputs; k++) {
        for (size_t p = 0; p < d->inputs[k]->n_parts; p++) {
            Baton__V1__TensorPart *part = d->inputs[k]->parts[p];
            if (!part_is_nccl(part))
                continue;
            for (size_t c = 0; c < part->n_chunks; c++, i++) {
                Baton__V1__TensorRef *ref = part->chunks[c];
                char err[160];
                wk_ref r;
                wt->refs[i] = ref;
                wt->parts[i] = part;
                wk_tensor *t = NULL;
                nccl_op *op = calloc(1, sizeof(*op));
                if (ref->owner >= x->n_peers || ref->owner == self)
                    wait_fail(wt, "%s: worker %u", "a part to receive names no peer",
                              ref->owner);
                else if (wk_wire_ref_from_proto(ref, self, &r, err, sizeof(err)) != 0)
                    wait_fail(wt, "a received tensor: %s (from worker %u)", err, ref->owner);
                else if (!op || !req ||
                         !(t = wk_store_tensor_new(x->opt.store, req, r.dtype, r.ndim, r.dims,
                                                   true)))
                    wait_fail(wt, "%s for a tensor received from worker %u",
                              "no room in the pool", ref->owner);
                if (!t) {
                    free(op);
                    post_abort(x, ref->owner, "a receive could not be issued");
                    continue;
                }
                wt->t[i] = t;
                op->peer = ref->owner;
                op->epoch = part->nccl_epoch;
                op->seq = part->nccl_seq + c;
                op->t = t;
                op->buf = wk_store_tensor_data(x->opt.store, t);
                op->n = t->ref.nbytes;
                op->deadline_ns = deadline_of(d->remaining_ms);
                op->wait = wt;
                *tail = op;
                tail = &op->next;
                wt->left++;
            }
        }
    }
    if (req && !wt->left)
        wk_store_request_gc(x->opt.store, req);
    pthread_mutex_unlock(x->opt.lock);
    if (!wt->left) {
        wait_finish(x, wt);
        return 1;
    }
    for (nccl_op *op = ops, *nx; op; op = nx) {
        nx = op->next;
        op->next = NULL;
        seq_check(x, op->peer, op->epoch, op->seq);
        post_op(x, op);
    }
    return 1;
}

/* On the I/O thread: a transfer the comm thread finished, or the news that
 * a pair's communicator broke. */
static void op_done(wk_event *ev)
{
    nccl_op *op = (nccl_op *)ev;
    wk_nccl *x = op->x;
    if (op->broke) {
        /* The pair's communicator is gone: the lower index makes the next
         * one while the peer is up (not for an older epoch's news). */
        nccl_peer *xp = op->peer < x->n_peers ? &x->peers[op->peer] : NULL;
        if (xp && xp->made && xp->epoch == op->epoch && xp->nccl && xp->up &&
            wk_store_self(x->opt.store) < op->peer && !atomic_load(x->opt.stopping))
            pair_make(x, op->peer);
        free(op);
        return;
    }
    if (!op->ok)
        bt_warn("%s %" PRIu64 " of %" PRIu64 " bytes with worker %u failed: %s",
                op->send ? "send" : "receive", op->seq, op->n, op->peer, op->err);
    if (op->send) {
        pthread_mutex_lock(x->opt.lock);
        wk_request *req = op->t->req;
        wk_store_tensor_unpin(x->opt.store, op->t);
        wk_store_request_gc(x->opt.store, req);
        pthread_mutex_unlock(x->opt.lock);
    } else {
        nccl_wait *wt = op->wait;
        if (!op->ok && !wt->failed) {
            wt->failed = true;
            snprintf(wt->err, sizeof(wt->err), "receiving an input from worker %u: %s",
                     op->peer, op->err);
        } else if (op->ok) {
            wk_device_count_staged(x->opt.dev, op->n);
        }
        if (--wt->left == 0)
            wait_finish(x, wt);
    }
    free(op);
}

void wk_nccl_reset(wk_nccl *x)
{
    if (!x)
        return;
    for (uint32_t k = 0; k < x->n_peers; k++) {
        nccl_peer *xp = &x->peers[k];
        if (xp->made)
            post_abort(x, k, "this worker registers again");
        xp->made = false;
    }
}

/* --- life ---------------------------------------------------------------------- */

int wk_nccl_create(const wk_nccl_options *opt, const wk_nccl_hooks *hooks, wk_nccl **out)
{
    *out = NULL;
    wk_nccl *x = calloc(1, sizeof(*x));
    if (!x)
        return BT_ENOMEM;
    x->opt = *opt;
    x->hooks = *hooks;
    x->gpu = wk_device_space(opt->dev) == WK_SPACE_CUDA;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    /* A CPU worker never joins a communicator: no thread. */
    if (x->gpu && pthread_create(&x->thread, NULL, comm_main, x) != 0) {
        wk_nccl_destroy(x);
        return BT_ETHREAD;
    }
    x->started = x->gpu;
    *out = x;
    return 0;
}

void wk_nccl_stop(wk_nccl *x)
{
    if (!x || !x->started)
        return;
    pthread_mutex_lock(&x->mu);
    x->stop = true;
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
    pthread_join(x->thread, NULL);
    x->started = false;
}

void wk_nccl_destroy(wk_nccl *x)
{
    if (!x)
        return;
    wk_nccl_stop(x);
    /* Commands posted after the stop never ran: nothing waits for them. */
    for (nccl_cmd *c = x->cmd_head, *nx; c; c = nx) {
        nx = c->next;
        free(c->op);
        free(c);
    }
    free(x->peers);
    free(x->pairs);
    pthread_cond_destroy(&x->cv);
    pthread_mutex_destroy(&x->mu);
    free(x);
}
