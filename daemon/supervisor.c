/* Worker supervision (daemon/supervisor.h): the face of workers.c,
 * spawner.c, tpgroups.c and roster.c, and what spans them. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "daemon/identity.h"
#include "daemon/pairs.h"
#include "daemon/roster.h"
#include "daemon/spawner.h"
#include "daemon/supervisor.h"
#include "daemon/tpgroups.h"
#include "daemon/workers.h"

struct supervisor {
    void *socket;                 /* the worker ROUTER; borrowed */
    sup_hooks hooks;
    bool stopping;                /* told to shut down: no restarts */
    /* Owned, created in this order and destroyed in the reverse. */
    worker_set *ws;               /* the worker records */
    pair_table *pairs;            /* pair communicators of cross-host GPU transfers */
    spawner *spawner;             /* the processes of `spawn: auto` workers */
    tp_groups *groups;            /* the groups of tensor-parallel models */
    roster *roster;               /* registrations, loads, readiness */
    bool curve_socket;            /* the worker socket is a CURVE server: Registers are
                                     checked against their key (daemon/identity.h) */
    uint64_t refused[IDENT_N];    /* Registers refused, by verdict; counters */
    bt_log_gate refused_gate, unrouted_gate; /* their warnings, and those of messages
                                     from connections no worker registered on */
};

int sup_worker_exe(char *buf, size_t len)
{
    return spawner_worker_exe(buf, len);
}

int sup_check_devices(const cfg_config *cfg, const char *exe, bt_diag *diag)
{
    return spawner_check_devices(cfg, exe, diag);
}

int sup_send(supervisor *s, int worker, const Baton__V1__ConductorMessage *m)
{
    return workers_send(s->ws, worker, m);
}

int sup_send_deferred(supervisor *s, int worker, const Baton__V1__ConductorMessage *m)
{
    return workers_send_deferred(s->ws, worker, m);
}

bool sup_deferred(const supervisor *s)
{
    return workers_deferred(s->ws);
}

const char *sup_group_held(const supervisor *s, size_t m)
{
    return tpg_held(s->groups, m);
}

size_t sup_n_workers(const supervisor *s)
{
    return workers_count(s->ws);
}

const sup_worker *sup_worker_get(const supervisor *s, int w)
{
    return workers_at(s->ws, w);
}

bool sup_ready(const supervisor *s)
{
    return roster_ready(s->roster);
}

bool sup_pair_reserve(supervisor *s, int a, int b, uint32_t n, uint32_t *epoch, uint64_t *seq)
{
    return pairs_reserve(s->pairs, a, b, n, epoch, seq);
}

/* W is lost: it goes DOWN, and every module forgets what it held, in this
 * order: its pool segment and key pair, its registration and pairs, the
 * daemon's readiness, the conductor's requests (sup_hooks.worker_lost),
 * the other workers' list of peers, and its tensor-parallel groups, whose
 * other members are taken down in turn. */
static void worker_lost(supervisor *s, sup_worker *w, const char *why)
{
    if (w->state == SUP_DOWN)
        return;
    bt_warn("worker %s lost: %s", w->cfg->name, why);
    w->state = SUP_DOWN;
    workers_drop_deferred(s->ws, w->index);
    spawner_unlink_pool(w);
    spawner_revoke_key(s->spawner, w);
    roster_forget(w);
    pairs_forget(s->pairs, w->index);
    roster_update_ready(s->roster);
    s->hooks.worker_lost(s->hooks.arg, w->index, why);
    roster_send_peers(s->roster);
    tpg_break(s->groups, w);
}

/* Declares X lost and makes sure its process goes: a spawned one is killed
 * (its exit restarts it, as any crash would), an external one is told to
 * restart. */
static void take_down(supervisor *s, sup_worker *x, const char *why)
{
    if (x->pid) {
        kill(x->pid, SIGKILL);
        worker_lost(s, x, why);
    } else {
        workers_send_shutdown(s->ws, x->index, why);
        worker_lost(s, x, why);
        x->state = SUP_STARTING;
        x->restarts++;
    }
}

void sup_cork(supervisor *s)
{
    workers_cork(s->ws);
}

void sup_uncork(supervisor *s)
{
    const int *failed;
    size_t n = workers_uncork(s->ws, &failed);
    /* A corked message that could not go is known only now: the worker
     * is unreachable (the ROUTER has no route to it), and what it holds
     * is gone with it, as when a send failed at once. */
    for (size_t i = 0; i < n; i++) {
        sup_worker *x = workers_at(s->ws, failed[i]);
        if (workers_live(x))
            take_down(s, x, "the conductor could not send to it");
    }
}

/* ---- hooks: what the modules below report ------------------------------ */

static void on_group_load(void *arg, sup_worker *w, size_t m, size_t k)
{
    roster_send_load(((supervisor *)arg)->roster, w, m, k);
}

static void on_take_down(void *arg, sup_worker *w, const char *why)
{
    take_down(arg, w, why);
}

static void on_lost(void *arg, sup_worker *w, const char *why)
{
    worker_lost(arg, w, why);
}

static void on_ready_changed(void *arg, bool ready)
{
    supervisor *s = arg;
    s->hooks.ready_changed(s->hooks.arg, ready);
}

/* ---- the worker socket ------------------------------------------------- */

/* Worker W, the lower index of a pair of GPU workers on different hosts,
 * made their communicator's id: the peer joins it (PairComm), and the
 * pair's transfers are numbered on it from then on.  An id made for an
 * incarnation of the peer that is gone is dropped: the next one's Peers
 * makes W send another. */
static void on_pair_id(supervisor *s, sup_worker *w, const Baton__V1__PairId *pi)
{
    sup_worker *x = pi->peer < workers_count(s->ws) ? workers_at(s->ws, (int)pi->peer) : NULL;
    if (!x || x->index <= w->index || !pi->epoch || !pi->comm_id.len) {
        bt_warn("worker %s sent a pair communicator id for worker %u, which it cannot make",
                w->cfg->name, pi->peer);
        return;
    }
    if (!workers_live(x) || x->incarnation != pi->peer_incarnation) {
        bt_debug("worker %s made a communicator for a gone incarnation of %s", w->cfg->name,
                 x->cfg->name);
        return;
    }
    Baton__V1__PairComm pc = BATON__V1__PAIR_COMM__INIT;
    pc.peer = (uint32_t)w->index;
    pc.epoch = pi->epoch;
    pc.comm_id = pi->comm_id;
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_PAIR_COMM;
    m.pair_comm = &pc;
    if (workers_send(s->ws, x->index, &m) == 0 &&
        pairs_made(s->pairs, w->index, x->index, pi->epoch) == 0)
        bt_info("workers %s and %s: GPU transfers over NCCL communicator %u", w->cfg->name,
                x->cfg->name, pi->epoch);
}

/* Handles one message of worker W. */
static void on_message(supervisor *s, sup_worker *w, const Baton__V1__WorkerMessage *wm)
{
    w->last_seen_ms = bt_now_ms();
    bool live = workers_live(w);
    /* An external worker declared lost that speaks again (it was stalled,
     * not dead) still holds the lost requests' state: it must start over,
     * and its service manager restarts it. */
    if (!live && w->cfg->spawn == CFG_SPAWN_EXTERNAL &&
        wm->msg_case != BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION && !w->told_to_restart) {
        bt_warn("worker %s speaks again after it was lost: telling it to restart", w->cfg->name);
        workers_send_shutdown(s->ws, w->index,
                              "declared lost by the conductor; restart and register again");
        w->told_to_restart = true;
    }
    switch (wm->msg_case) {
    case BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION:
        w->told_to_restart = false;
        roster_on_register(s->roster, w, wm->registration);
        break;
    case BATON__V1__WORKER_MESSAGE__MSG_LOADED:
        roster_on_loaded(s->roster, w, wm->loaded);
        break;
    case BATON__V1__WORKER_MESSAGE__MSG_HEARTBEAT:
        roster_on_heartbeat(w, wm->heartbeat);
        break;
    case BATON__V1__WORKER_MESSAGE__MSG_TP_GROUP:
        if (live)
            tpg_on_group(s->groups, w, wm->tp_group);
        break;
    case BATON__V1__WORKER_MESSAGE__MSG_TP_STEP:
        if (live)
            tpg_on_step(s->groups, w, wm->tp_step);
        break;
    case BATON__V1__WORKER_MESSAGE__MSG_PAIR_ID:
        if (live)
            on_pair_id(s, w, wm->pair_id);
        break;
    case BATON__V1__WORKER_MESSAGE__MSG_DONE:
    case BATON__V1__WORKER_MESSAGE__MSG_CHUNK:
    case BATON__V1__WORKER_MESSAGE__MSG_PLACED:
    case BATON__V1__WORKER_MESSAGE__MSG_FETCHED:
    case BATON__V1__WORKER_MESSAGE__MSG_CACHE_REPORT:
        /* Results of a lost incarnation belong to requests already ended
         * (and its cache went with it). */
        if (live)
            s->hooks.message(s->hooks.arg, w->index, wm);
        break;
    default:
        break;
    }
}

/* A message other than a Register came on a connection no worker
 * registered on (a worker's old connection after it registered on a new
 * one, or a peer that never registered): nobody it could speak for. */
static void unrouted(supervisor *s)
{
    uint64_t n;
    if (bt_log_gate_pass(&s->unrouted_gate, bt_now_ms(), &n))
        bt_warn("dropped %llu message%s from connections no worker registered on",
                (unsigned long long)n, n == 1 ? "" : "s");
}

/* A Register RG (in BODY) came on the connection IDENT, where BY_ROUTE
 * registered before (NULL: none).  Accepted, the worker it names is
 * routed to this connection and takes it as before (on_message); refused,
 * the worker is left as it is, the refusal is counted and logged, and the
 * connection is told to shut down, saying why.  Returns the worker now
 * routed to IDENT, if any. */
static sup_worker *on_register(supervisor *s, sup_worker *by_route, zmq_msg_t *ident,
                               zmq_msg_t *body, const Baton__V1__WorkerMessage *wm)
{
    const Baton__V1__Register *rg = wm->registration;
    sup_worker *w = rg->worker ? workers_named(s->ws, rg->worker) : NULL;
    const char *key = NULL;
    ident_verdict v = IDENT_OK;
    if (!w) {
        v = IDENT_UNKNOWN_WORKER;
    } else if (by_route && by_route != w) {
        v = IDENT_CONNECTION_TAKEN;
    } else if (s->curve_socket) {
        key = zmq_msg_gets(body, "User-Id");
        v = ident_check(s->ws, w, key, rg->curve_public_key,
                        s->hooks.worker_keys ? s->hooks.worker_keys(s->hooks.arg) : NULL);
    }
    if (v != IDENT_OK) {
        s->refused[v]++;
        uint64_t n;
        if (bt_log_gate_pass(&s->refused_gate, bt_now_ms(), &n)) {
            char fp[BT_CURVE_FINGERPRINT_LEN + 1] = "";
            if (key && bt_curve_z85_valid(key, NULL))
                bt_curve_fingerprint(key, fp);
            /* An unknown name is the peer's text: it is not logged. */
            bt_warn("refused a registration as %s%s from a peer %s%s%s: %s (%llu refused since "
                    "the last such warning)", w ? "worker " : "a worker this config lacks",
                    w ? w->cfg->name : "", fp[0] ? "with key " : "without a CURVE key", fp,
                    fp[0] ? "..." : "", ident_strerror(v), (unsigned long long)n);
        }
        char why[256];
        snprintf(why, sizeof(why), "registration refused: %s", ident_strerror(v));
        workers_refuse(s->ws, zmq_msg_data(ident), zmq_msg_size(ident), why);
        return by_route;
    }
    workers_set_route(s->ws, w->index, zmq_msg_data(ident), zmq_msg_size(ident));
    snprintf(w->auth_key, sizeof(w->auth_key), "%s", key ? key : "");
    w->msgs_in++;
    on_message(s, w, wm);
    return w;
}

uint64_t sup_registrations_refused(const supervisor *s, int verdict)
{
    return s->refused[verdict];
}

void sup_on_readable(evloop *l, void *arg)
{
    (void)l;
    supervisor *s = arg;
    s->hooks.burst_begin(s->hooks.arg);
    for (int budget = 0; budget < 1024; budget++) {
        zmq_msg_t ident;
        zmq_msg_init(&ident);
        if (zmq_msg_recv(&ident, s->socket, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ident);
            break;
        }
        sup_worker *w = workers_by_id(s->ws, zmq_msg_data(&ident), zmq_msg_size(&ident));
        /* A worker may send several WorkerMessages as the frames of one
         * ZeroMQ message (what one round of its loop had to say); each is
         * handled in order. */
        if (w && zmq_msg_more(&ident))
            w->zmq_in++;
        for (bool more = zmq_msg_more(&ident); more;) {
            zmq_msg_t body;
            zmq_msg_init(&body);
            if (zmq_msg_recv(&body, s->socket, 0) < 0) {
                zmq_msg_close(&body);
                break;
            }
            more = zmq_msg_more(&body);
            Baton__V1__WorkerMessage *wm = baton__v1__worker_message__unpack(
                NULL, zmq_msg_size(&body), zmq_msg_data(&body));
            if (!wm)
                bt_warn("%s%s sent a frame that does not parse", w ? "worker " : "a peer",
                        w ? w->cfg->name : " that has not registered");
            else if (wm->msg_case == BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION)
                w = on_register(s, w, &ident, &body, wm);
            else if (w) {
                w->msgs_in++;
                on_message(s, w, wm);
            } else {
                unrouted(s);
            }
            baton__v1__worker_message__free_unpacked(wm, NULL);
            zmq_msg_close(&body);
        }
        zmq_msg_close(&ident);
    }
    s->hooks.burst_end(s->hooks.arg);
}

void sup_child_exited(supervisor *s, pid_t pid, int status)
{
    sup_worker *w = spawner_reaped(s->spawner, pid);
    if (!w)
        return;
    char why[96];
    if (WIFSIGNALED(status))
        snprintf(why, sizeof(why), "killed by signal %d", WTERMSIG(status));
    else
        snprintf(why, sizeof(why), "exited with status %d", WEXITSTATUS(status));
    if (s->stopping) {
        bt_info("worker %s stopped (%s)", w->cfg->name, why);
        w->state = SUP_DOWN;
        spawner_unlink_pool(w);
        return;
    }
    worker_lost(s, w, why);
    spawner_schedule_restart(w, bt_now_ms());
}

void sup_tick(supervisor *s, uint64_t now_ms)
{
    workers_flush_deferred(s->ws);
    if (s->stopping)
        return;
    for (size_t i = 0; i < workers_count(s->ws); i++) {
        sup_worker *w = workers_at(s->ws, (int)i);
        if (w->cfg->spawn == CFG_SPAWN_EXTERNAL) {
            /* It is restarted by its own service manager and registers
             * again; until then its requests must not wait for it. */
            if (roster_silent(w, now_ms)) {
                worker_lost(s, w, "no heartbeat from the external worker");
                w->state = SUP_STARTING;
                w->restarts++;
            }
            continue;
        }
        spawner_tick(s->spawner, w, now_ms);
        /* A worker that says nothing for long is hung: kill it, and the
         * SIGCHLD path restarts it. */
        if (roster_silent(w, now_ms)) {
            bt_warn("worker %s silent for %llu ms: killing it", w->cfg->name,
                    (unsigned long long)(now_ms - w->last_seen_ms));
            kill(w->pid, SIGKILL);
            w->last_seen_ms = now_ms;
        }
    }
}

void sup_start(supervisor *s)
{
    for (size_t w = 0; w < workers_count(s->ws); w++)
        if (workers_at(s->ws, (int)w)->cfg->spawn == CFG_SPAWN_AUTO)
            spawner_spawn(s->spawner, workers_at(s->ws, (int)w));
}

void sup_stop(supervisor *s, const char *reason)
{
    s->stopping = true;
    for (size_t i = 0; i < workers_count(s->ws); i++) {
        sup_worker *w = workers_at(s->ws, (int)i);
        if (w->state == SUP_DOWN && !w->pid)
            continue;
        if (w->state != SUP_STARTING)
            workers_send_shutdown(s->ws, w->index, reason);
        else if (w->pid)
            kill(w->pid, SIGTERM);
    }
}

bool sup_all_exited(const supervisor *s)
{
    return spawner_all_exited(s->spawner);
}

void sup_kill_all(supervisor *s)
{
    spawner_kill_all(s->spawner);
}

void sup_kill_spawned(supervisor *s)
{
    spawner_kill_spawned(s->spawner);
}

int sup_create(const sup_options *opt, const sup_hooks *hooks, supervisor **out)
{
    *out = NULL;
    supervisor *s = calloc(1, sizeof(*s));
    if (!s)
        return BT_ENOMEM;
    s->socket = opt->socket;
    s->hooks = *hooks;
    s->curve_socket = opt->curve_socket;
    spawner_options so = {opt->config_path, opt->run_id, opt->worker_exe,
                          opt->curve_server_public};
    spawner_hooks sh = {hooks->arg, hooks->authorize};
    tpg_hooks th = {s, on_group_load, on_take_down};
    roster_hooks rh = {s, on_ready_changed, on_lost, on_take_down};
    int rc = workers_create(opt->cfg, opt->socket, &s->ws);
    if (rc == 0 && !(s->pairs = pairs_create(workers_count(s->ws))))
        rc = BT_ENOMEM;
    if (rc == 0)
        rc = spawner_create(&so, s->ws, &sh, &s->spawner);
    if (rc == 0)
        rc = tpg_create(opt->cfg, s->ws, &th, &s->groups);
    if (rc == 0)
        rc = roster_create(opt->cfg, opt->gs, s->ws, s->groups, s->pairs, &rh, &s->roster);
    if (rc != 0) {
        sup_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

void sup_destroy(supervisor *s)
{
    if (!s)
        return;
    roster_destroy(s->roster);
    tpg_destroy(s->groups);
    spawner_destroy(s->spawner);
    pairs_destroy(s->pairs);
    workers_destroy(s->ws);
    free(s);
}
