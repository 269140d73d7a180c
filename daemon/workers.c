/* The worker records and the worker socket (daemon/workers.h). */
#include "daemon/workers.h"

#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/log.h"
#include "common/status.h"
#include "common/vec.h"

/* Deferred messages wait for company at most this many to a worker. */
#define DEFER_MAX 64

/* One message packed while corked. */
typedef struct kept_msg {
    zmq_msg_t msg;                /* initialised; owned until sent */
    bool deferred;                /* it waits for the next other message */
} kept_msg;

/* A worker's messages packed while corked, in order. */
typedef struct outbox {
    kept_msg *msgs;               /* owned */
    size_t n, cap;
    size_t n_urgent;              /* messages not deferred */
    bool aged;                    /* deferred ones waited through a tick */
    bool flush;                   /* ... through two: the next uncork sends them */
} outbox;

struct worker_set {
    sup_worker *workers;          /* one per configured worker, in config order; owned */
    size_t n;
    void *socket;                 /* the worker ROUTER; borrowed */
    bool corked;                  /* workers_send keeps messages in the outboxes */
    outbox *outboxes;             /* one per worker; owned */
    int *pending;                 /* the workers with a non-empty outbox, each once */
    size_t n_pending;
    int *failed;                  /* workers the last uncork could not send to */
    size_t n_failed;
};

int workers_create(const cfg_config *cfg, void *socket, worker_set **out)
{
    *out = NULL;
    worker_set *ws = calloc(1, sizeof(*ws));
    if (!ws)
        return BT_ENOMEM;
    ws->n = cfg->n_workers;
    ws->socket = socket;
    ws->workers = calloc(ws->n + 1, sizeof(*ws->workers));
    ws->outboxes = calloc(ws->n + 1, sizeof(*ws->outboxes));
    ws->pending = calloc(ws->n + 1, sizeof(*ws->pending));
    ws->failed = calloc(ws->n + 1, sizeof(*ws->failed));
    if (!ws->workers || !ws->outboxes || !ws->pending || !ws->failed) {
        workers_destroy(ws);
        return BT_ENOMEM;
    }
    for (size_t w = 0; w < ws->n; w++) {
        ws->workers[w].index = (int)w;
        ws->workers[w].cfg = &cfg->workers[w];
        ws->workers[w].state = cfg->workers[w].spawn == CFG_SPAWN_AUTO ? SUP_DOWN : SUP_STARTING;
    }
    *out = ws;
    return 0;
}

void workers_destroy(worker_set *ws)
{
    if (!ws)
        return;
    for (size_t w = 0; ws->outboxes && w < ws->n; w++) {
        outbox *ob = &ws->outboxes[w];
        for (size_t i = 0; i < ob->n; i++)
            zmq_msg_close(&ob->msgs[i].msg);
        free(ob->msgs);
    }
    free(ws->outboxes);
    free(ws->pending);
    free(ws->failed);
    free(ws->workers);
    free(ws);
}

size_t workers_count(const worker_set *ws)
{
    return ws->n;
}

sup_worker *workers_at(worker_set *ws, int w)
{
    return &ws->workers[w];
}

sup_worker *workers_named(worker_set *ws, const char *name)
{
    for (size_t i = 0; i < ws->n; i++)
        if (strcmp(ws->workers[i].cfg->name, name) == 0)
            return &ws->workers[i];
    return NULL;
}

sup_worker *workers_by_id(worker_set *ws, const void *id, size_t len)
{
    for (size_t i = 0; i < ws->n; i++)
        if (len && ws->workers[i].route_len == len &&
            memcmp(ws->workers[i].route, id, len) == 0)
            return &ws->workers[i];
    return NULL;
}

void workers_set_route(worker_set *ws, int w, const void *id, size_t len)
{
    assert(len <= WORKERS_ROUTE_MAX);
    sup_worker *wk = &ws->workers[w];
    memcpy(wk->route, id, len);
    wk->route_len = len;
}

bool workers_live(const sup_worker *w)
{
    return w->state == SUP_LOADING || w->state == SUP_READY;
}

/* M packed into Z (initialised by this); 0 or BT_ENOMEM. */
static int pack(zmq_msg_t *z, const Baton__V1__ConductorMessage *m)
{
    if (zmq_msg_init_size(z, baton__v1__conductor_message__get_packed_size(m)) != 0)
        return BT_ENOMEM;
    baton__v1__conductor_message__pack(m, zmq_msg_data(z));
    return 0;
}

/* Sends the N messages MSGS[i].msg to the connection whose routing id is
 * ID as the frames of one ZeroMQ message; closes those that did not go.
 * Returns how many went (N: all; -1: not even the routing id, errno set).
 * The ROUTER takes the frames of one message whole or not at all, as it
 * does the identity frame and one body. */
static ptrdiff_t send_to(worker_set *ws, const void *id, size_t len, kept_msg *msgs, size_t n)
{
    size_t i = 0;
    ptrdiff_t sent = -1;
    if (len && zmq_send(ws->socket, id, len, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0) {
        for (; i < n; i++)
            if (zmq_msg_send(&msgs[i].msg, ws->socket,
                             (i + 1 < n ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0)
                break;
        sent = (ptrdiff_t)i;
    } else if (!len) {
        errno = EHOSTUNREACH; /* nothing routes there */
    }
    /* A sent message is closed by ZeroMQ; the rest are closed here. */
    for (size_t k = i; k < n; k++)
        zmq_msg_close(&msgs[k].msg);
    return sent;
}

/* Sends worker W the N messages MSGS as one ZeroMQ message on the
 * connection it registered on (a worker not registered yet has none:
 * nothing reaches it).  True when all went. */
static bool send_frames(worker_set *ws, int w, kept_msg *msgs, size_t n)
{
    sup_worker *wk = &ws->workers[w];
    ptrdiff_t sent = send_to(ws, wk->route, wk->route_len, msgs, n);
    if (sent >= 0) {
        wk->msgs_out += (uint64_t)sent;
        wk->zmq_out++;
    }
    if (sent == (ptrdiff_t)n)
        return true;
    bt_warn("cannot send %zu messages to worker %s: %s", n - (size_t)(sent < 0 ? 0 : sent),
            wk->cfg->name, zmq_strerror(errno));
    return false;
}

/* Keeps M, packed, in worker W's outbox. */
static int keep(worker_set *ws, int w, const Baton__V1__ConductorMessage *m, bool deferred)
{
    outbox *ob = &ws->outboxes[w];
    if (BT_RESERVE(ob->msgs, ob->n, ob->cap, 8) < 0 || pack(&ob->msgs[ob->n].msg, m) < 0)
        return BT_ENOMEM;
    ob->msgs[ob->n].deferred = deferred;
    ob->n_urgent += !deferred;
    if (ob->n++ == 0) {
        ws->pending[ws->n_pending++] = w;
        ob->aged = ob->flush = false;
    }
    return 0;
}

void workers_cork(worker_set *ws)
{
    ws->corked = true;
}

size_t workers_uncork(worker_set *ws, const int **failed)
{
    ws->corked = false;
    ws->n_failed = 0;
    size_t kept = 0;
    for (size_t p = 0; p < ws->n_pending; p++) {
        int w = ws->pending[p];
        outbox *ob = &ws->outboxes[w];
        if (!ob->n)
            continue; /* emptied by workers_drop_deferred: no identity frame alone */
        if (!ob->n_urgent && ob->n < DEFER_MAX && !ob->flush) {
            ws->pending[kept++] = w; /* deferred only: they wait for company */
            continue;
        }
        if (!send_frames(ws, w, ob->msgs, ob->n))
            ws->failed[ws->n_failed++] = w;
        ob->n = ob->n_urgent = 0;
    }
    ws->n_pending = kept;
    *failed = ws->failed;
    return ws->n_failed;
}

int workers_send_deferred(worker_set *ws, int w, const Baton__V1__ConductorMessage *m)
{
    return ws->corked ? keep(ws, w, m, true) : workers_send(ws, w, m);
}

void workers_flush_deferred(worker_set *ws)
{
    for (size_t p = 0; p < ws->n_pending; p++) {
        outbox *ob = &ws->outboxes[ws->pending[p]];
        ob->flush = ob->aged;
        ob->aged = true;
    }
}

bool workers_deferred(const worker_set *ws)
{
    return ws->n_pending > 0;
}

void workers_drop_deferred(worker_set *ws, int w)
{
    outbox *ob = &ws->outboxes[w];
    size_t k = 0;
    for (size_t i = 0; i < ob->n; i++) {
        if (ob->msgs[i].deferred)
            zmq_msg_close(&ob->msgs[i].msg);
        else
            ob->msgs[k++] = ob->msgs[i]; /* as the outbox's own growth moves them */
    }
    ob->n = k;
    /* An emptied outbox leaves the pending list: a worker is on it only
     * while it has messages, so that a later one puts it there once. */
    if (k == 0)
        for (size_t p = 0; p < ws->n_pending; p++)
            if (ws->pending[p] == w) {
                ws->pending[p] = ws->pending[--ws->n_pending];
                break;
            }
}

int workers_send(worker_set *ws, int worker, const Baton__V1__ConductorMessage *m)
{
    if (ws->corked)
        return keep(ws, worker, m, false);
    kept_msg one = {.deferred = false};
    if (pack(&one.msg, m) < 0)
        return BT_ENOMEM;
    return send_frames(ws, worker, &one, 1) ? 0 : BT_EIO;
}

/* M, holding SD: a Shutdown saying REASON (borrowed). */
static void shutdown_message(Baton__V1__ConductorMessage *m, Baton__V1__Shutdown *sd,
                             const char *reason)
{
    baton__v1__shutdown__init(sd);
    sd->reason = (char *)reason;
    baton__v1__conductor_message__init(m);
    m->msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_SHUTDOWN;
    m->shutdown = sd;
}

void workers_send_shutdown(worker_set *ws, int w, const char *reason)
{
    Baton__V1__Shutdown sd;
    Baton__V1__ConductorMessage m;
    shutdown_message(&m, &sd, reason);
    workers_send(ws, w, &m);
}

void workers_refuse(worker_set *ws, const void *id, size_t len, const char *reason)
{
    Baton__V1__Shutdown sd;
    Baton__V1__ConductorMessage m;
    shutdown_message(&m, &sd, reason);
    kept_msg one = {.deferred = false};
    if (pack(&one.msg, &m) == 0)
        send_to(ws, id, len, &one, 1);
}
