/* The worker process: it creates the modules bottom-up, wires the hooks
 * through which they report upwards, answers every ConductorMessage
 * (proto/baton.proto, "conductor -> worker") from one handler table, and
 * runs the I/O thread's loop.
 *
 * The I/O thread watches, on its event loop (common/evloop.h): a
 * self-pipe for SIGTERM/SIGINT (PR_SET_PDEATHSIG delivers SIGTERM when the
 * conductor dies), the DEALER socket to the conductor, the eventfd of its
 * inbox (events.h: what lanes, load threads and the comm thread post), the
 * socket monitor that tells a reconnect, and the worker-to-worker sockets,
 * which pull.c's transfers add and remove.  Results leave in the order
 * they were posted, which is what puts every Chunk of an execution before
 * its Done.
 *
 * The modules, lowest first (each calls only those before it; what must
 * travel upwards goes through hooks filled here):
 *
 *   pool, join, segment, device, peers, plugin, xfer, events   no worker state
 *   store      tensors and request records (under the one lock)
 *   wire       messages to the conductor, tensor references
 *   item       items and the dispatches they share
 *   inputs     an item's inputs resolved, joined, staged
 *   ctx        the baton_ctx backends call back into
 *   executor   models, queues, lanes, batches
 *   runahead   run-ahead chains of loop nodes
 *   tp         tensor-parallel steps, led and followed
 *   pull       dispatches parked for inputs on other hosts
 *   nccl       GPU tensors between hosts
 *   report     Chunk and Done, the end of requests
 *   load       Load and Loaded
 *   accept     a Dispatch taken in
 *   tensorio   Put, Fetch, Release
 *   worker     this file
 *
 * Threads and the one lock.  The I/O thread handles every conductor
 * message; `streams.compute` lane threads run execute(); a thread per
 * Load runs model_load(); a GPU worker's comm thread runs NCCL transfers.
 * What the modules mark [L] is guarded by the worker's one lock: the
 * store, the executor's queues, the run-ahead chains, the peers' mappings,
 * the parked pulls.  The lock is never held across a backend call or a
 * large copy, so it stays short; one lock rather than several keeps the
 * invariants that span those tables (a tensor's request, an item's queue)
 * simple.  The inbox has its own innermost mutex.
 *
 * Who frees what.  Items and request records are freed only by the I/O
 * thread, so a lane may use its items without further locking until it
 * posts their end.  Tensors are freed only on Release, on SessionClose, or
 * when the worker itself made them and never reported them (a dropped or
 * failed execution, a join or allocation no output took). */
#include "worker/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/evloop.h"
#include "common/log.h"
#include "common/status.h"
#include "worker/accept.h"
#include "worker/copier.h"
#include "worker/device.h"
#include "worker/events.h"
#include "worker/executor.h"
#include "worker/load.h"
#include "worker/nccl.h"
#include "worker/peers.h"
#include "worker/plugin.h"
#include "worker/pull.h"
#include "worker/report.h"
#include "worker/runahead.h"
#include "worker/store.h"
#include "worker/tensorio.h"
#include "worker/tp.h"
#include "worker/wire.h"

#define HEARTBEAT_NS 1000000000ull

struct wk_worker {
    wk_options opt;               /* strings borrowed from the caller */
    char hostname[256];           /* as registered: `host:`, else gethostname() */
    pthread_mutex_t lock;         /* the one lock (see above) */
    atomic_bool stopping;         /* set under the lock; every module reads it */
    /* The modules, lowest first; owned. */
    wk_device *dev;
    void *io_stream;              /* the I/O thread's stream for its copies */
    wk_peers peers;
    wk_store *store;
    wk_events *events;
    wk_copier *copier;
    wk_registry *registry;
    wk_executor *ex;
    wk_runahead *ra;
    wk_tp *tp;
    wk_pull *pull;
    wk_nccl *nccl;
    wk_report report;             /* borrowed pointers only */
    wk_load *load;
    wk_accept accept;             /* borrowed pointers only */
    wk_tensorio tio;              /* borrowed pointers only */
    /* The I/O thread's. */
    evloop *loop;
    void *zctx, *sock;
    void *monitor;                /* PAIR receiving the socket's CONNECTED events */
    uint32_t connects;            /* connections made so far (a reconnect re-registers) */
    int signal_fd;                /* read end of the stop-signal pipe */
    int signal_wr;                /* its write end (the handler's) */
    bool quiesced;
    int exit_code;
    bool quit;                    /* leave the loop */
};

/* --- the hooks the modules report through ----------------------------------- */

/* The executor: a lane emitted a chunk. */
static int hook_chunk(void *arg, wk_item *it, const wk_chunk *c)
{
    wk_worker *w = arg;
    return wk_report_chunk(&w->report, it, c);
}

/* The executor: a model's prefix cache changed; the report goes out
 * before the Dones of the batch that changed it. */
static void hook_cache(void *arg, wk_model *m, const baton_cache_report *r)
{
    wk_worker *w = arg;
    wk_report_cache(&w->report, m->name, r);
}

/* The executor: an item ended on its lane [L]; a run-ahead chain queues its
 * next iteration before the item's Done is posted. */
static void hook_item_ended(void *arg, wk_item *it)
{
    wk_worker *w = arg;
    wk_runahead_item_ended(w->ra, it);
    wk_report_item_ended(&w->report, it);
}

/* The executor: a tensor-parallel leader's step is about to run. */
static int hook_lead(void *arg, baton_ctx *ctx, wk_model *m, const uint64_t *closed,
                     size_t n_closed, baton_item *const *run, size_t n)
{
    wk_worker *w = arg;
    return wk_tp_lead(w->tp, ctx, m, closed, n_closed, run, n);
}

/* Pull: a parked dispatch has its inputs [L]. */
static void hook_pulled(void *arg, wk_dispatch *disp, wk_request *req)
{
    wk_worker *w = arg;
    wk_accept_start(&w->accept, disp, req);
}

/* NCCL: a dispatch has its receives. */
static void hook_received(void *arg, Baton__V1__ConductorMessage *msg)
{
    wk_worker *w = arg;
    wk_accept_received(&w->accept, msg);
}

/* --- handlers of conductor messages ----------------------------------------- */

static void on_load(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    wk_load_on_load(w->load, msg);
}

static void on_dispatch(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    wk_accept_dispatch(&w->accept, msg);
}

static void on_tp_step(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    wk_tp_on_step(w->tp, msg, wk_load_pending(w->load, msg->tp_step->model));
}

static void on_extend(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    wk_runahead_extend(w->ra, msg->extend);
    wk_pull_extend(w->pull, msg->extend);
}

static void on_drop(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    wk_pull_drop(w->pull, msg->drop);
    wk_runahead_drop(w->ra, msg->drop);
}

static void on_release(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    wk_tensorio_release(&w->tio, msg->release);
}

static void on_session_close(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    wk_report_session_close(&w->report, msg->session_close->request_key);
}

static void on_fetch(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    wk_tensorio_fetch(&w->tio, msg->fetch);
}

static void on_put(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    wk_tensorio_put(&w->tio, msg);
}

static void on_shutdown(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    const char *why = msg->shutdown->reason;
    bt_info("shutdown: %s", why && *why ? why : "asked by the conductor");
    w->quit = true;
    w->exit_code = 0;
}

static void on_peers(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    const Baton__V1__Peers *p = msg->peers;
    pthread_mutex_lock(&w->lock);
    wk_store_set_self(w->store, p->self_index);
    int rc = wk_peers_update(&w->peers, p, p->self_index);
    pthread_mutex_unlock(&w->lock);
    /* Without the lock: a peer found lost fails its pulls, whose callbacks
     * take it. */
    for (size_t i = 0; i < p->n_peers && !rc; i++)
        if (p->peers[i]->index != p->self_index)
            rc = wk_pull_peer(w->pull, p->peers[i]);
    if (rc)
        bt_error("out of memory taking in the peers");
    bt_info("peers: %zu workers, this one is index %u", p->n_peers, p->self_index);
    wk_nccl_on_peers(w->nccl, p);
}

static void on_pair_comm(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    wk_nccl_on_pair_comm(w->nccl, msg->pair_comm);
}

static void on_send(wk_worker *w, Baton__V1__ConductorMessage *msg)
{
    wk_nccl_on_send(w->nccl, msg->send);
}

/* Every conductor message, and how its handler is called.  One rule for
 * the message: a handler that `keeps` it owns it from the call on (a load
 * thread, a dispatch or a queued step frees it when done); for every other
 * one the loop frees it after the handler returns.  One place for the
 * lock: a `locked` handler runs under it, taken here; the others take it
 * themselves around what they touch, since they copy bytes, start threads
 * or call modules that call back into the lock. */
typedef struct handler {
    void (*fn)(wk_worker *w, Baton__V1__ConductorMessage *msg);
    bool keeps;
    bool locked;
} handler;

static const handler HANDLERS[] = {
    [BATON__V1__CONDUCTOR_MESSAGE__MSG_LOAD] = {on_load, true, false},
    [BATON__V1__CONDUCTOR_MESSAGE__MSG_DISPATCH] = {on_dispatch, true, false},
    [BATON__V1__CONDUCTOR_MESSAGE__MSG_TP_STEP] = {on_tp_step, true, false},
    [BATON__V1__CONDUCTOR_MESSAGE__MSG_EXTEND] = {on_extend, false, true},
    [BATON__V1__CONDUCTOR_MESSAGE__MSG_DROP] = {on_drop, false, true},
    [BATON__V1__CONDUCTOR_MESSAGE__MSG_RELEASE] = {on_release, false, true},
    [BATON__V1__CONDUCTOR_MESSAGE__MSG_SESSION_CLOSE] = {on_session_close, false, true},
    [BATON__V1__CONDUCTOR_MESSAGE__MSG_FETCH] = {on_fetch, false, false},
    [BATON__V1__CONDUCTOR_MESSAGE__MSG_SHUTDOWN] = {on_shutdown, false, false},
    [BATON__V1__CONDUCTOR_MESSAGE__MSG_PUT] = {on_put, true, false},
    [BATON__V1__CONDUCTOR_MESSAGE__MSG_PEERS] = {on_peers, false, false},
    [BATON__V1__CONDUCTOR_MESSAGE__MSG_PAIR_COMM] = {on_pair_comm, false, false},
    [BATON__V1__CONDUCTOR_MESSAGE__MSG_SEND] = {on_send, false, false},
};

void wk_worker_handle_frame(wk_worker *w, const void *data, size_t len)
{
    Baton__V1__ConductorMessage *msg =
        baton__v1__conductor_message__unpack(NULL, len, (const uint8_t *)data);
    if (!msg) {
        wk_wire_salvage(w->sock, data, len, w->opt.name);
        return;
    }
    size_t c = (size_t)msg->msg_case;
    const handler *h = c < sizeof(HANDLERS) / sizeof(HANDLERS[0]) ? &HANDLERS[c] : NULL;
    if (!h || !h->fn) {
        bt_warn("dropped a conductor message with no member set");
        baton__v1__conductor_message__free_unpacked(msg, NULL);
        return;
    }
    if (h->locked)
        pthread_mutex_lock(&w->lock);
    h->fn(w, msg);
    if (h->locked)
        pthread_mutex_unlock(&w->lock);
    if (!h->keeps)
        baton__v1__conductor_message__free_unpacked(msg, NULL);
}

/* --- the loop ----------------------------------------------------------------- */

static void send_register(wk_worker *w)
{
    Baton__V1__PoolHandle ph = BATON__V1__POOL_HANDLE__INIT;
    wk_device_pool_handle(w->dev, &ph);
    Baton__V1__PoolHandle *phs[1] = {&ph};
    Baton__V1__Register r = BATON__V1__REGISTER__INIT;
    r.protocol_version = BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    r.worker = (char *)w->opt.name;
    r.device = (char *)w->opt.device;
    r.n_pools = 1;
    r.pools = phs;
    r.pool_bytes = wk_device_pool_size(w->dev);
    r.pid = (uint32_t)getpid();
    r.hostname = w->hostname;
    r.peer_endpoint = (char *)wk_pull_endpoint(w->pull);
    /* Peers authenticate this worker's peer socket by it (and it theirs). */
    r.curve_public_key = w->opt.curve_own ? (char *)w->opt.curve_own->public_z85 : "";
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION;
    m.registration = &r;
    wk_wire_send(w->sock, &m);
}

static void send_heartbeat(wk_worker *w)
{
    Baton__V1__Heartbeat hb = BATON__V1__HEARTBEAT__INIT;
    wk_pool_stats st;
    pthread_mutex_lock(&w->lock);
    wk_store_pool_stats(w->store, &st);
    hb.live_tensors = wk_store_n_tensors(w->store);
    hb.open_sessions = wk_executor_n_sessions(w->ex);
    hb.queued = wk_executor_n_queued(w->ex);
    hb.ipc_opens_ahead = w->peers.ipc_opens_ahead;
    hb.ipc_opens_on_request = w->peers.ipc_opens_on_request;
    hb.inline_batches = wk_executor_inline_batches(w->ex);
    pthread_mutex_unlock(&w->lock);
    hb.staged_bytes = wk_device_staged_bytes(w->dev);
    hb.tp_steps = wk_tp_steps(w->tp);
    hb.pool_used_bytes = st.used;
    hb.pool_free_bytes = st.free;
    hb.fragmentation = st.fragmentation;
    hb.largest_free_bytes = st.largest_free;
    Baton__V1__WorkerMessage m = BATON__V1__WORKER_MESSAGE__INIT;
    m.msg_case = BATON__V1__WORKER_MESSAGE__MSG_HEARTBEAT;
    m.heartbeat = &hb;
    wk_wire_send(w->sock, &m);
}

/* A stop signal: the loop ends, and nothing else of this round runs. */
static void on_signal(evloop *l, void *arg)
{
    wk_worker *w = arg;
    unsigned char sig;
    if (read(w->signal_fd, &sig, 1) == 1)
        bt_info("%s received; stopping", strsignal(sig));
    w->quit = true;
    w->exit_code = 0;
    evloop_stop(l);
}

static void on_socket(evloop *l, void *arg)
{
    (void)l;
    wk_worker *w = arg;
    while (!w->quit) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, w->sock, ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&m);
            if (e != EAGAIN && e != EINTR)
                bt_error("receive from the conductor failed: %s", zmq_strerror(e));
            return;
        }
        wk_worker_handle_frame(w, zmq_msg_data(&m), zmq_msg_size(&m));
        zmq_msg_close(&m);
    }
}

void wk_worker_run_events(wk_worker *w)
{
    wk_pull_drain(w->pull);
    wk_events_run(w->events);
}

static void on_events(evloop *l, void *arg)
{
    (void)l;
    wk_worker_run_events(arg);
}

/* Reads the monitor's events; every connection after the first is a
 * reconnect, and the conductor on the other side may not know us. */
static void on_monitor(evloop *l, void *arg)
{
    (void)l;
    wk_worker *w = arg;
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, w->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        bool more = zmq_msg_more(&ev);
        uint16_t id = 0;
        if (zmq_msg_size(&ev) >= 2)
            memcpy(&id, zmq_msg_data(&ev), 2);
        zmq_msg_close(&ev);
        if (more) {
            zmq_msg_init(&addr);
            zmq_msg_recv(&addr, w->monitor, 0);
            zmq_msg_close(&addr);
        }
        if (id == ZMQ_EVENT_CONNECTED && w->connects++ > 0) {
            bt_info("reconnected to %s; registering again", w->opt.endpoint);
            /* The conductor may be a new one that knows none of our pair
             * communicators: the next Peers makes them again. */
            wk_nccl_reset(w->nccl);
            send_register(w);
        }
    }
}

/* Heartbeats come from this thread whatever the lanes do, so they alone
 * cannot tell a group stuck in a collective (a rank that never reaches
 * it, or one that died in a way NCCL does not notice) from a healthy one,
 * and a long healthy step does not silence them.  A step of a
 * tensor-parallel model that outlives its limit ends here: its
 * communicator is aborted (model_abort), which ends the wait of the other
 * ranks too, and this worker exits at once, without waiting for the stuck
 * lane (which may still touch the aborted communicator): the conductor
 * makes the group again, as after a crash, and the group's requests end
 * UNAVAILABLE. */
static void check_steps(wk_worker *w, uint64_t now)
{
    pthread_mutex_lock(&w->lock);
    wk_model *m = wk_executor_stuck(w->ex, now);
    uint64_t ran_ms = m ? (now - m->busy_since_ns) / 1000000u : 0;
    pthread_mutex_unlock(&w->lock);
    if (!m)
        return;
    bt_error("a step of tensor-parallel model %s has run for %llu ms, past its limit of %u ms "
             "(tp_step_timeout_ms): a rank of its group is stuck; aborting the group and "
             "exiting so that it starts over", m->name, (unsigned long long)ran_ms, m->step_ms);
    if (m->backend->model_abort)
        m->backend->model_abort(m->handle);
    _exit(WK_EXIT_GROUP_BROKEN);
}

/* After a round of the loop: the quick models' batches, then what this
 * thread posted to its own inbox (their Dones).  True when more work is
 * due at once: the next poll must not sleep. */
static bool run_own_work(wk_worker *w)
{
    bool due = wk_executor_run_inline(w->ex);
    if (wk_events_run_posted(w->events))
        due = due || wk_executor_inline_due(w->ex) || wk_events_pending(w->events);
    return due;
}

int wk_worker_run(wk_worker *w)
{
    send_register(w);
    bt_info("registered with %s: pool %s, %" PRIu64 " bytes, %u lane(s)", w->opt.endpoint,
            wk_device_pool_describe(w->dev), wk_device_pool_size(w->dev),
            wk_executor_lanes(w->ex));
    uint64_t next_hb = bt_now_ns() + HEARTBEAT_NS;
    /* This thread runs the quick models' batches itself and takes in what
     * it posts to its own inbox before it polls again. */
    wk_executor_inline_thread(w->ex);
    wk_events_own(w->events);
    bool due = false;
    while (!w->quit) {
        /* The transfers' tick first: a producer it finds silent loses its
         * socket before the next poll. */
        uint64_t now = bt_now_ns();
        long timeout = now >= next_hb ? 0 : (long)((next_hb - now) / 1000000u) + 1;
        long xt = wk_pull_tick(w->pull, now);
        if (xt >= 0 && xt < timeout)
            timeout = xt;
        if (due)
            timeout = 0;
        wk_wire_cork(w->sock);
        int rc = evloop_run_once(w->loop, timeout);
        /* Within the cork, so that the Dones of what ran inline leave in
         * the round's one message; a stop (a signal, Shutdown) ends the
         * round's work. */
        due = rc >= 0 && !w->quit && run_own_work(w);
        wk_wire_uncork();
        if (rc < 0) {
            bt_error("zmq_poll: %s", zmq_strerror(zmq_errno()));
            w->exit_code = 1;
            break;
        }
        now = bt_now_ns();
        if (now >= next_hb && !w->quit) {
            check_steps(w, now);
            send_heartbeat(w);
            next_hb = next_hb + HEARTBEAT_NS > now ? next_hb + HEARTBEAT_NS : now + HEARTBEAT_NS;
        }
    }
    return w->exit_code;
}

void wk_worker_get_stats(wk_worker *w, wk_worker_stats *out)
{
    pthread_mutex_lock(&w->lock);
    wk_store_pool_stats(w->store, &out->pool);
    out->live_tensors = wk_store_n_tensors(w->store);
    out->open_sessions = wk_executor_n_sessions(w->ex);
    out->queued = wk_executor_n_queued(w->ex);
    out->items = 0;
    size_t pos = 0;
    wk_request *req;
    while (wk_store_request_next(w->store, &pos, &req))
        out->items += req->n_items;
    out->loading = wk_load_busy(w->load);
    pthread_mutex_unlock(&w->lock);
    out->quit = w->quit;
}

bool wk_worker_has_model(wk_worker *w, const char *model)
{
    pthread_mutex_lock(&w->lock);
    bool have = wk_executor_model_find(w->ex, model) != NULL;
    pthread_mutex_unlock(&w->lock);
    return have;
}

int wk_worker_events_fd(const wk_worker *w)
{
    return wk_events_fd(w->events);
}

/* --- creation and destruction --------------------------------------------------- */

static int socket_open(wk_worker *w, char *err, size_t errlen)
{
    if (!(w->zctx = zmq_ctx_new()))
        return bt_errorf(err, errlen, BT_EIO, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    if (!(w->sock = zmq_socket(w->zctx, ZMQ_DEALER)))
        return bt_errorf(err, errlen, BT_EIO, "zmq_socket: %s", zmq_strerror(zmq_errno()));
    /* No routing id: the conductor's ROUTER names each connection itself,
     * and knows which worker it is from the Register that comes first
     * (under CURVE, checked against the key it authenticated with).  A
     * chosen id could only collide with another connection.  Linger 0:
     * a worker that stops drops what the conductor can no longer use.
     * High-water marks off: Done and Chunk must never be dropped or block
     * the I/O thread; the conductor's own limits bound the traffic. */
    int zero = 0;
    if (zmq_setsockopt(w->sock, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(w->sock, ZMQ_SNDHWM, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(w->sock, ZMQ_RCVHWM, &zero, sizeof(zero)) != 0)
        return bt_errorf(err, errlen, BT_EIO, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
    if (w->opt.curve_server_public) {
        int rc = bt_curve_apply_client(w->sock, w->opt.curve_own, w->opt.curve_server_public);
        if (rc)
            return bt_errorf(err, errlen, BT_EIO, "CURVE towards %s: %s", w->opt.endpoint,
                             bt_curve_strerror(rc));
    }
    /* Watch the connection: after a reconnect (a conductor restarted on the
     * same endpoint, as with spawn: external) the worker registers again,
     * as the protocol asks. */
    char mon[64];
    snprintf(mon, sizeof(mon), "inproc://baton-worker-monitor-%p", (void *)w);
    if (zmq_socket_monitor(w->sock, mon, ZMQ_EVENT_CONNECTED) != 0 ||
        !(w->monitor = zmq_socket(w->zctx, ZMQ_PAIR)) || zmq_connect(w->monitor, mon) != 0 ||
        zmq_setsockopt(w->monitor, ZMQ_LINGER, &zero, sizeof(zero)) != 0)
        return bt_errorf(err, errlen, BT_EIO, "socket monitor: %s", zmq_strerror(zmq_errno()));
    if (zmq_connect(w->sock, w->opt.endpoint) != 0)
        return bt_errorf(err, errlen, BT_EIO, "connect to %s: %s", w->opt.endpoint,
                         zmq_strerror(zmq_errno()));
    return 0;
}

/* Write end of the stop-signal pipe, for the handler (one worker per
 * process). */
static volatile int signal_pipe_wr = -1;

/* Async-signal-safe: one byte naming the signal; the I/O loop does the rest. */
static void on_stop_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (signal_pipe_wr >= 0 && write(signal_pipe_wr, &b, 1) < 0) {
        /* Full pipe: a stop is already pending. */
    }
    errno = saved;
}

static int signals_open(wk_worker *w, char *err, size_t errlen)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC | O_NONBLOCK) < 0)
        return bt_errorf(err, errlen, BT_EIO, "pipe: %s", strerror(errno));
    w->signal_fd = pfd[0];
    w->signal_wr = pfd[1];
    signal_pipe_wr = pfd[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGINT, &sa, NULL) < 0)
        return bt_errorf(err, errlen, BT_EIO, "sigaction: %s", strerror(errno));
    return 0;
}

static void signals_close(wk_worker *w)
{
    if (w->signal_fd < 0)
        return;
    /* Back to the default first: a late signal must not write to a closed
     * (or reused) descriptor. */
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal_pipe_wr = -1;
    close(w->signal_fd);
    close(w->signal_wr);
    w->signal_fd = -1;
}

/* The executor, the run-ahead chains, tensor parallelism, transfers and
 * loads, each given what it reaches and the hooks it reports through. */
static int modules_create(wk_worker *w, char *err, size_t errlen)
{
    const wk_options *o = &w->opt;
    /* Only the host's models run on the I/O thread: a GPU's would need a
     * stream, and the thread bound to the device, of its own. */
    bool host = wk_device_space(w->dev) == WK_SPACE_HOST;
    wk_executor_options eo = {&w->lock, &w->stopping, w->store, &w->peers, w->dev,
                              o->name, o->device, o->threads, o->streams ? o->streams : 1,
                              host ? (uint64_t)o->inline_us * 1000u : 0};
    wk_executor_hooks eh = {w, hook_item_ended, hook_chunk, hook_lead, hook_cache};
    int rc = wk_executor_create(&eo, &eh, &w->ex);
    wk_tp_options to = {&w->lock, &w->stopping, w->ex, w->store, w->dev, w->events, w->sock,
                        o->device, o->threads};
    if (rc == 0)
        rc = wk_tp_create(&to, &w->tp);
    if (rc == 0)
        rc = wk_runahead_create(w->ex, w->store, &w->stopping, &w->ra);
    if (rc)
        return bt_errorf(err, errlen, rc, "out of memory");
    wk_pull_options po = {&w->lock, &w->stopping, w->store, w->dev, w->sock, o->name, w->loop,
                          o->peer_listen, o->curve_own, wk_events_fd(w->events)};
    wk_pull_hooks ph = {w, hook_pulled};
    if ((rc = wk_pull_create(&po, &ph, &w->pull, err, errlen)) != 0)
        return rc;
    wk_nccl_options no = {&w->lock, &w->stopping, w->store, w->dev, w->events, w->sock,
                          w->hostname};
    wk_nccl_hooks nh = {w, hook_received};
    if ((rc = wk_nccl_create(&no, &nh, &w->nccl)) != 0)
        return bt_errorf(err, errlen, rc, "cannot start the comm thread");
    wk_load_options lo = {&w->lock, &w->stopping, w->registry, w->ex, w->tp, w->dev, w->events,
                          w->sock, o->device, o->threads, &o->profile, o->streams,
                          o->comm_streams};
    if ((rc = wk_load_create(&lo, &w->load)) != 0)
        return bt_errorf(err, errlen, rc, "out of memory");
    w->report = (wk_report){&w->lock, &w->stopping, w->store, &w->peers, w->dev, w->events,
                            w->sock, w->ex, w->ra, w->pull};
    w->accept = (wk_accept){&w->lock, w->store, w->ex, w->ra, w->pull, w->nccl, w->sock,
                            o->name};
    w->tio = (wk_tensorio){&w->lock, w->store, w->dev, w->io_stream, w->copier, w->sock,
                           o->name};
    return 0;
}

int wk_worker_create(const wk_options *opt, wk_worker **out, char *err, size_t errlen)
{
    *out = NULL;
    wk_worker *w = calloc(1, sizeof(*w));
    if (!w)
        return bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
    w->opt = *opt;
    w->signal_fd = -1;
    atomic_init(&w->stopping, false);
    pthread_mutex_init(&w->lock, NULL);
    /* A configured host name wins: several "hosts" may share one kernel
     * (network namespaces, containers), and the conductor tells same-host
     * from cross-host transfers by these names. */
    if (opt->host && *opt->host)
        snprintf(w->hostname, sizeof(w->hostname), "%s", opt->host);
    else if (gethostname(w->hostname, sizeof(w->hostname) - 1) != 0)
        snprintf(w->hostname, sizeof(w->hostname), "localhost");
    int rc = BT_EINVAL;
    if (!opt->name || !opt->endpoint || !opt->device || opt->pool_bytes < WK_POOL_ALIGN) {
        snprintf(err, errlen, "worker options incomplete (name, endpoint, device, pool size)");
        goto err;
    }
    if ((rc = wk_device_open(&w->dev, opt->device, opt->run_id, opt->name, opt->pool_bytes, err,
                             errlen)) != 0 ||
        (rc = wk_device_stream_create(w->dev, &w->io_stream, err, errlen)) != 0)
        goto err;
    wk_peers_init(&w->peers, w->hostname, w->dev);
    if ((rc = wk_store_create(w->dev, opt->incarnation, opt->index, &w->store)) != 0 ||
        (rc = wk_events_create(&w->events)) != 0 ||
        (rc = (w->registry = wk_registry_create()) ? 0 : BT_ENOMEM) != 0 ||
        (rc = (w->loop = evloop_create()) ? 0 : BT_ENOMEM) != 0) {
        snprintf(err, errlen, "%s", bt_strerror(rc));
        goto err;
    }
    if ((rc = wk_copier_create(w->dev, w->events, &w->copier, err, errlen)) != 0 ||
        (rc = signals_open(w, err, errlen)) != 0 || (rc = socket_open(w, err, errlen)) != 0 ||
        (rc = modules_create(w, err, errlen)) != 0)
        goto err;
    /* The signal pipe first: a stop ends the round before anything else. */
    if (evloop_add(w->loop, NULL, w->signal_fd, on_signal, w) < 0 ||
        evloop_add(w->loop, w->sock, -1, on_socket, w) < 0 ||
        evloop_add(w->loop, NULL, wk_events_fd(w->events), on_events, w) < 0 ||
        evloop_add(w->loop, w->monitor, -1, on_monitor, w) < 0) {
        rc = bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
        goto err;
    }
    if (*wk_pull_endpoint(w->pull))
        bt_info("serving worker-to-worker pulls on %s", wk_pull_endpoint(w->pull));
    if ((rc = wk_executor_start(w->ex)) != 0) {
        snprintf(err, errlen, "cannot start %u compute lane thread(s)", opt->streams);
        goto err;
    }
    *out = w;
    return 0;
err:
    wk_worker_destroy(w);
    return rc;
}

/* Cancels every item, stops the lanes, waits for loads, takes in what the
 * threads posted (answering nothing), frees every request's tensors and
 * sessions and unloads the models.  No message is sent.  Idempotent. */
static void quiesce(wk_worker *w)
{
    if (w->quiesced)
        return;
    w->quiesced = true;
    /* Cancel everything first, so that lanes finish their batches quickly
     * (a sleeping item wakes at once), then join them. */
    pthread_mutex_lock(&w->lock);
    atomic_store(&w->stopping, true);
    if (w->pull)
        wk_pull_cancel_all(w->pull);
    size_t pos = 0;
    wk_request *req;
    while (w->store && wk_store_request_next(w->store, &pos, &req))
        for (wk_item *it = req->items, *nx; it; it = nx) {
            nx = it->req_next;
            if (it->state == WK_ITEM_QUEUED) {
                wk_executor_dequeue(w->ex, it);
                wk_runahead_forget(w->ra, it, false);
                wk_item_destroy(it);
            } else {
                wk_executor_cancel(w->ex, it);
            }
        }
    pthread_mutex_unlock(&w->lock);
    wk_executor_stop(w->ex);
    /* A load that waits for its tensor-parallel group gives up now (it
     * polls the stopping flag); others run to their end: wait for them.
     * Their ends, every
     * completion the lanes posted and the transfers the comm thread fails
     * as it stops are then taken in, the worker stopping: nothing is
     * answered and what was made is freed. */
    if (w->load)
        wk_load_wait(w->load);
    wk_copier_stop(w->copier);
    wk_nccl_stop(w->nccl);
    if (w->events)
        wk_events_run(w->events);
    pthread_mutex_lock(&w->lock);
    pos = 0;
    while (w->store && wk_store_request_next(w->store, &pos, &req))
        wk_report_finalize(&w->report, req);
    pthread_mutex_unlock(&w->lock);
    wk_tp_destroy(w->tp);
    w->tp = NULL;
    wk_executor_destroy(w->ex);
    w->ex = NULL;
}

void wk_worker_destroy(wk_worker *w)
{
    if (!w)
        return;
    if (w->ex)
        quiesce(w);
    wk_nccl_destroy(w->nccl);
    wk_pull_close(w->pull);
    if (w->sock) {
        zmq_socket_monitor(w->sock, NULL, 0);
        zmq_close(w->sock);
    }
    if (w->monitor)
        zmq_close(w->monitor);
    if (w->zctx)
        zmq_ctx_term(w->zctx);
    /* After the pulls' context is terminated (wk_pull_close): ZeroMQ has
     * handed back the last zero-copy replies, whose tensors are unpinned
     * here. */
    wk_pull_destroy(w->pull);
    wk_load_destroy(w->load);
    wk_runahead_destroy(w->ra);
    wk_tp_destroy(w->tp);
    evloop_destroy(w->loop);
    signals_close(w);
    wk_copier_destroy(w->copier);
    wk_events_destroy(w->events);
    wk_registry_destroy(w->registry);
    pthread_mutex_lock(&w->lock);
    wk_peers_destroy(&w->peers);
    pthread_mutex_unlock(&w->lock);
    if (w->store && wk_store_n_tensors(w->store))
        bt_warn("%u tensors still held at exit", wk_store_n_tensors(w->store));
    wk_store_destroy(w->store);
    if (w->dev) {
        wk_device_stream_destroy(w->dev, w->io_stream);
        wk_device_close(w->dev);
    }
    pthread_mutex_destroy(&w->lock);
    free(w);
}
