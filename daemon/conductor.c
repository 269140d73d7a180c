/* The conductor's life and wiring (daemon/conductor.h): load the
 * deployment, bind the sockets, create the modules and connect their hooks,
 * spawn the workers, run the loop, and on SIGTERM drain (refuse new
 * requests, let in-flight ones finish up to drain_timeout_ms), stop the
 * workers and exit 0.  SIGHUP re-reads the config and applies log level,
 * limits and the authorized CURVE keys (client_keys, worker_keys). */
#include <assert.h>
#include <errno.h>
#include <grp.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/curve.h"
#include "common/ipcfile.h"
#include "common/log.h"
#include "common/utf8.h"
#include "config/config.h"
#include "config/graph.h"
#include "daemon/conductor.h"
#include "daemon/dispatch.h"
#include "common/evloop.h"
#include "daemon/frontend.h"
#include "daemon/gateway.h"
#include "daemon/identity.h"
#include "daemon/metrics.h"
#include "daemon/outbound.h"
#include "daemon/supervisor.h"
#include "daemon/tensors.h"
#include "daemon/zap.h"

/* The tick (deadlines, worker liveness and restarts, held Releases,
 * backlogs, the drain) runs when something is due, at the latest every
 * TICK_IDLE_MS; every TICK_HOLD_MS while Releases or deferred messages wait
 * for it; every TICK_BUSY_MS while draining.  A tick at a fixed 10 ms cost
 * an idle conductor a wake-up every 10 ms, and a streaming decode loop
 * about as much CPU as its tokens. */
#define TICK_IDLE_MS 100
#define TICK_HOLD_MS 20
#define TICK_BUSY_MS 10
#define STOP_GRACE_MS 3000
/* Replies ZeroMQ queues for one client before they wait in its backlog. */
#define CLIENT_SNDHWM 64
/* The folders batond makes for its ipc:// sockets that it remembers, to
 * remove at exit; past this many (two very deep new paths) the rest stay. */
#define MAX_MADE_DIRS 16

struct conductor {
    char *config_path;            /* absolute; owned */
    cfg_config *cfg;              /* owned */
    graph_set *gs;                /* owned */
    evloop *loop;
    void *zctx;
    bool own_zctx;                /* zctx was made here (else the caller's) */
    void *front_sock;             /* client ROUTER */
    void *back_sock;              /* worker ROUTER */
    int sigfd, timerfd;
    int room_watch;               /* evloop handle of out_room_fd while a backlog waits; -1 */
    char run_id[32];
    char worker_exe[PATH_MAX];
    /* The modules, created in this order and destroyed in reverse. */
    metrics *m;
    supervisor *sup;
    replicas *rs;
    tensor_table *tt;
    dispatcher *disp;
    outbound *out;
    frontend *front;
    gateway *http;                /* NULL without http_listen */
    /* CURVE (daemon.curve): batond's key pair, the ZAP handler, and the
     * pair of the HTTP gateway's connections to the client socket. */
    bool curve;                   /* daemon.curve is set */
    bt_curve_keypair keys;        /* batond's pair; secret wiped at destroy */
    bt_curve_keypair gw_keys;     /* the gateway's pair, made at start */
    zap *zap;                     /* NULL without curve */
    /* Life cycle. */
    bool started;                 /* the workers were spawned (the loop's first round) */
    bool ready;                   /* every worker loaded */
    bool draining;
    uint64_t drain_deadline_ms;   /* monotonic ms */
    uint32_t drain_timeout_ms;    /* from the config; SIGHUP may change it */
    bool notified;                /* systemd was told READY=1 */
    long backlog_poll_ms;         /* how soon the loop looks at held replies again; -1: none
                                   * held (out_flush_backlogs) */
    bool stopping;                /* workers told to shut down */
    uint64_t stop_deadline_ms;
    bool done;                    /* the loop should end */
    uint64_t last_watchdog_ms;
    uint64_t next_tick_ms;        /* when the timer fires next, monotonic ms */
    uint64_t watchdog_usec;       /* from sd_watchdog_enabled; 0: off */
    /* What batond made in the file system for its ipc:// sockets, removed
     * at exit: the socket files it bound (paths inside cfg's endpoints) and
     * the folders it made for them, in the order made (owned). */
    const char *bound_files[2];
    size_t n_bound_files;
    char *made_dirs[MAX_MADE_DIRS];
    size_t n_made_dirs;
};

/* ---- admission and limits ---------------------------------------------- */

static void update_admission(conductor *c)
{
    front_set_admission(c->front, c->draining ? FRONT_DRAINING
                                  : c->ready  ? FRONT_OPEN
                                              : FRONT_NOT_READY);
}

static void apply_limits(conductor *c, const cfg_config *cfg)
{
    const cfg_daemon *d = &cfg->daemon;
    front_limits l = {d->max_inflight, d->request_timeout_ms, d->max_message_bytes,
                      d->max_request_timeout_ms, d->client_max_inflight,
                      d->client_max_reply_bytes, d->client_stall_timeout_ms};
    if (c->front)
        front_set_limits(c->front, &l);
    c->drain_timeout_ms = cfg->daemon.drain_timeout_ms;
    bt_log_set_level(bt_log_level_parse(cfg->daemon.log_level));
}

/* Reads the authorized-keys files of CFG (client_keys, worker_keys) into
 * the ZAP handler, at start and on SIGHUP, so that keys can be added and
 * revoked without a restart.  batond's own key pair and whether CURVE is
 * on at all are bound to the sockets and need a restart.  Both files are
 * read before either set is replaced.  Returns 0 or a negative bt_err
 * (logged; the keys in use then stay). */
static int load_file_keys(conductor *c, const cfg_config *cfg)
{
    const cfg_str *paths[ZAP_N_SOCKETS] = {&cfg->daemon.curve_client_keys,
                                          &cfg->daemon.curve_worker_keys};
    bt_curve_keyset *sets[ZAP_N_SOCKETS] = {NULL, NULL};
    int rc = 0;
    for (int i = 0; i < ZAP_N_SOCKETS && rc == 0; i++) {
        char err[600];
        int line;
        if (!(sets[i] = bt_curve_keyset_create()))
            rc = BT_ENOMEM;
        else if (paths[i]->s &&
                 bt_curve_keyset_load(sets[i], paths[i]->s, &line, err, sizeof(err)) != 0) {
            bt_error("%s", err);
            rc = BT_ECONFIG;
        }
    }
    if (rc == 0) {
        size_t nc = bt_curve_keyset_count(sets[ZAP_CLIENT]);
        size_t nw = bt_curve_keyset_count(sets[ZAP_WORKER]);
        for (int i = 0; i < ZAP_N_SOCKETS; i++) {
            zap_set_file_keys(c->zap, (zap_socket)i, sets[i]);
            sets[i] = NULL;
        }
        bt_info("curve: %zu client key%s and %zu worker key%s authorized from files", nc,
                nc == 1 ? "" : "s", nw, nw == 1 ? "" : "s");
    }
    for (int i = 0; i < ZAP_N_SOCKETS; i++)
        bt_curve_keyset_destroy(sets[i]);
    return rc;
}

static void reload_keys(conductor *c, const cfg_config *cfg)
{
    if (!c->curve) {
        if (cfg->daemon.curve)
            bt_warn("reload: daemon.curve was added; CURVE starts with a restart");
        return;
    }
    if (!cfg->daemon.curve) {
        bt_warn("reload: daemon.curve was removed; CURVE stays on until a restart");
        return;
    }
    load_file_keys(c, cfg);
}

static void reload(conductor *c)
{
    bt_diag *d = bt_diag_create(c->config_path);
    cfg_config *cfg = NULL;
    if (d && cfg_load_file(c->config_path, d, &cfg) == 0 && cfg_check_keys(cfg, NULL, d) == 0) {
        apply_limits(c, cfg);
        reload_keys(c, cfg);
        bt_info("reloaded %s: log level, max_inflight %u, request_timeout_ms %u, "
                "drain_timeout_ms %u, max_message_bytes %llu, max_request_timeout_ms %u, "
                "client_max_inflight %u, client_max_reply_bytes %llu, "
                "client_stall_timeout_ms %u (graph and worker changes need a restart)",
                c->config_path, cfg->daemon.max_inflight, cfg->daemon.request_timeout_ms,
                cfg->daemon.drain_timeout_ms,
                (unsigned long long)cfg->daemon.max_message_bytes,
                cfg->daemon.max_request_timeout_ms, cfg->daemon.client_max_inflight,
                (unsigned long long)cfg->daemon.client_max_reply_bytes,
                cfg->daemon.client_stall_timeout_ms);
    } else if (d) {
        bt_diag_sort(d);
        bt_diag_print(d, stderr);
        bt_error("reload of %s failed; keeping the running configuration", c->config_path);
    }
    cfg_config_destroy(cfg);
    bt_diag_destroy(d);
}

/* ---- hooks: what modules tell the rest --------------------------------- */

static void on_ready_changed(void *arg, bool ready)
{
    conductor *c = arg;
    c->ready = ready;
    update_admission(c);
}

/* A lost worker takes with it the requests placing inputs on it, its
 * tensors, the requests that use it, and the bytes clients wait for. */
static void on_worker_lost(void *arg, int w, const char *why)
{
    (void)why;
    conductor *c = arg;
    char msg[160];
    snprintf(msg, sizeof(msg), "worker '%s' was lost", sup_worker_get(c->sup, w)->cfg->name);
    front_end_placing(c->front, w, BT_CODE_UNAVAILABLE, msg);
    tt_forget_worker(c->tt, w);
    disp_worker_lost(c->disp, w);
    front_fetches_lost(c->front, w);
    /* Its prefix cache went with it; a new incarnation reports afresh. */
    replicas_worker_reset(c->rs, w);
}

/* A model's prefix cache on worker W changed: its counters for the
 * metrics, its routing keys for the replicas' index. */
static void on_cache_report(conductor *c, int w, const Baton__V1__CacheReport *r)
{
    const cfg_model *md = cfg_model_find(c->cfg, r->model ? r->model : "");
    if (!md)
        return;
    metrics_cache mc = {r->hits, r->misses, r->hit_tokens, r->evictions, r->cached_bytes,
                        r->entries};
    metrics_cache_report(c->m, w, (int)(md - c->cfg->models), &mc);
    if (replicas_cache_event(c->rs, w, md->name, r->stored, r->n_stored, r->removed,
                             r->n_removed) < 0)
        bt_warn("out of memory indexing the prefix cache of worker %s; routing may miss it",
                sup_worker_get(c->sup, w)->cfg->name);
}

static void on_worker_message(void *arg, int w, const Baton__V1__WorkerMessage *m)
{
    conductor *c = arg;
    switch (m->msg_case) {
    case BATON__V1__WORKER_MESSAGE__MSG_DONE: disp_done(c->disp, w, m->done); break;
    case BATON__V1__WORKER_MESSAGE__MSG_CHUNK: disp_chunk(c->disp, w, m->chunk); break;
    case BATON__V1__WORKER_MESSAGE__MSG_PLACED: front_placed(c->front, w, m->placed); break;
    case BATON__V1__WORKER_MESSAGE__MSG_FETCHED: front_fetched(c->front, w, m->fetched); break;
    case BATON__V1__WORKER_MESSAGE__MSG_CACHE_REPORT: on_cache_report(c, w, m->cache_report); break;
    default: break;
    }
}

static int on_authorize(void *arg, const char *old_public, const char *new_public)
{
    conductor *c = arg;
    if (old_public)
        zap_disallow(c->zap, ZAP_WORKER, old_public);
    return new_public ? zap_allow(c->zap, ZAP_WORKER, new_public) : 0;
}

static const bt_curve_keyset *on_worker_keys(void *arg)
{
    return zap_file_keys(((conductor *)arg)->zap, ZAP_WORKER);
}

static void on_burst_begin(void *arg)
{
    disp_burst_begin(((conductor *)arg)->disp);
}

static void on_burst_end(void *arg)
{
    disp_burst_end(((conductor *)arg)->disp);
}

static void on_chunk(void *arg, uint64_t req, const rt_action *a)
{
    front_on_chunk(((conductor *)arg)->front, req, a);
}

static void on_response(void *arg, uint64_t req, const rt_action *a, const disp_timing *t,
                        size_t n)
{
    front_on_response(((conductor *)arg)->front, req, a, t, n);
}

/* ---- answers about the whole daemon ------------------------------------ */

static const char *state_name(sup_state s)
{
    switch (s) {
    case SUP_DOWN: return "down";
    case SUP_STARTING: return "starting";
    case SUP_LOADING: return "loading";
    case SUP_READY: return "ready";
    }
    return "?";
}

static void answer_health(conductor *c, const uint8_t *id, size_t idlen)
{
    size_t nw = sup_n_workers(c->sup);
    Baton__V1__HealthResponse h = BATON__V1__HEALTH_RESPONSE__INIT;
    char **names = calloc(nw + 1, sizeof(*names));
    char msg[512] = "";
    size_t off = 0;
    h.live = true;
    h.ready = c->ready && !c->draining;
    for (size_t w = 0; names && w < nw; w++) {
        const sup_worker *wk = sup_worker_get(c->sup, (int)w);
        if (wk->state == SUP_READY)
            names[h.n_workers_ready++] = (char *)wk->cfg->name;
        else if (off < sizeof(msg))
            off += (size_t)snprintf(msg + off, sizeof(msg) - off, "%sworker %s is %s",
                                    off ? "; " : "", wk->cfg->name, state_name(wk->state));
    }
    for (size_t m = 0; m < c->cfg->n_models && off < sizeof(msg); m++) {
        const char *held = sup_group_held(c->sup, m);
        if (held)
            off += (size_t)snprintf(msg + off, sizeof(msg) - off, "%smodel %s: %s",
                                    off ? "; " : "", c->cfg->models[m].name, held);
    }
    msg[bt_utf8_cut(msg, strlen(msg))] = 0; /* a cut at the buffer's end */
    if (c->draining)
        snprintf(msg, sizeof(msg), "draining: shutting down");
    h.workers_ready = names;
    h.message = msg;
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_HEALTH;
    m.health = &h;
    out_send(c->out, id, idlen, &m);
    free(names);
}

/* The Prometheus text, with the gauges read from the modules that own them. */
static char *stats_text(conductor *c)
{
    size_t nw = sup_n_workers(c->sup);
    metrics_worker *ws = calloc(nw + 1, sizeof(*ws));
    if (!ws)
        return NULL;
    for (size_t w = 0; w < nw; w++) {
        const sup_worker *wk = sup_worker_get(c->sup, (int)w);
        ws[w] = (metrics_worker){wk->cfg->name, wk->state == SUP_READY, wk->restarts,
                                 wk->pool_used, wk->pool_free, wk->fragmentation, wk->queued,
                                 wk->staged_bytes, wk->sessions, wk->tp_steps,
                                 wk->inline_batches, wk->ipc_ahead,
                                 wk->ipc_on_request, wk->msgs_out, wk->msgs_in, wk->zmq_out,
                                 wk->zmq_in};
    }
    /* Each replica of each replicated model: its picks and pins. */
    size_t nr = 0;
    for (size_t m = 0; m < c->cfg->n_models; m++)
        nr += cfg_model_replicated(&c->cfg->models[m]) ? c->cfg->models[m].n_workers : 0;
    metrics_route *rt = calloc(nr + 1, sizeof(*rt));
    if (!rt) {
        free(ws);
        return NULL;
    }
    nr = 0;
    replicas_stats st;
    for (size_t m = 0; m < c->cfg->n_models; m++)
        for (size_t k = 0; replicas_stats_get(c->rs, (int)m, k, &st); k++)
            rt[nr++] = (metrics_route){c->cfg->models[m].name,
                                       st.worker >= 0 ? c->cfg->workers[st.worker].name : "?",
                                       st.picks[REPLICAS_BY_CACHE], st.picks[REPLICAS_BY_LOAD],
                                       st.picks[REPLICAS_BY_TURN], st.pinned, st.cached_blocks};
    metrics_count refused[IDENT_N - 1];
    for (int v = IDENT_OK + 1; v < IDENT_N; v++)
        refused[v - 1] = (metrics_count){ident_label(v), sup_registrations_refused(c->sup, v)};
    metrics_gauges g = {front_inflight(c->front), front_placing(c->front),
                        disp_tensors_held(c->disp), tt_count(c->tt),
                        out_clients(c->out)->backlog_bytes, ws, nw,
                        zap_refused(c->zap, ZAP_CLIENT), zap_refused(c->zap, ZAP_WORKER), refused,
                        IDENT_N - 1, rt, nr};
    char *text = metrics_text(c->m, &g);
    free(ws);
    free(rt);
    return text;
}

/* Each transfer of the partition as the workers' registered hosts decide
 * it now (the printout above shows what the config alone tells). */
static void print_transfers_now(conductor *c, FILE *f)
{
    if (!c->gs->n_transfers)
        return;
    fputs("\ntransfers by registered host:\n", f);
    for (size_t t = 0; t < c->gs->n_transfers; t++) {
        const graph_transfer *x = &c->gs->transfers[t];
        const graph *g = &c->gs->graphs[x->graph];
        const sup_worker *a = sup_worker_get(c->sup, x->from_worker);
        const sup_worker *b = sup_worker_get(c->sup, x->to_worker);
        fprintf(f, "  %s: ", g->name);
        if (x->edge >= 0)
            fprintf(f, "%s -> %s", g->values[g->edges[x->edge].value].name,
                    g->edges[x->edge].consumer >= 0
                        ? g->entities[g->edges[x->edge].consumer].name : "client");
        else
            fprintf(f, "graph input %s", g->inputs[x->graph_input]);
        fprintf(f, ": %s (host %s) -> %s (host %s), ", a->cfg->name,
                a->hostname[0] ? a->hostname : "not registered", b->cfg->name,
                b->hostname[0] ? b->hostname : "not registered");
        if (!a->hostname[0] || !b->hostname[0]) {
            fputs("not decided (a worker has not registered)\n", f);
            continue;
        }
        int code = 0;
        char why[384];
        switch (disp_transfer_kind(c->sup, x->from_worker, x->to_worker, &code, why,
                                   sizeof(why))) {
        case BATON__V1__TRANSFER_KIND__TRANSFER_KIND_IPC:
            fputs(a->cfg->cuda_index >= 0 || b->cfg->cuda_index >= 0
                      ? "ipc (same host: cuda-ipc or host-staged)\n"
                      : "ipc (same host: shm, read in place)\n", f);
            break;
        case BATON__V1__TRANSFER_KIND__TRANSFER_KIND_SOCKET:
            fprintf(f, "socket (pulled from %s)\n", a->peer_endpoint);
            break;
        case BATON__V1__TRANSFER_KIND__TRANSFER_KIND_NCCL:
            fputs("nccl (sent and received over the pair's communicator)\n", f);
            break;
        case BATON__V1__TRANSFER_KIND__TRANSFER_KIND_LOCAL: fputs("local\n", f); break;
        default: fprintf(f, "fails: %s\n", why); break;
        }
    }
}

/* The graphs, their partition, and what each worker's loads built (the
 * executables' schedules: predicted makespans and the decision). */
static char *inspect_text(conductor *c, const char *graph_name)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    if (graph_name && *graph_name && !graph_set_find(c->gs, graph_name))
        fprintf(f, "no graph named '%s'\n", graph_name);
    else
        graph_set_print(c->gs, f);
    print_transfers_now(c, f);
    replicas_print(c->rs, f);
    bool heading = false;
    for (size_t w = 0; w < sup_n_workers(c->sup); w++) {
        const sup_worker *wk = sup_worker_get(c->sup, (int)w);
        if (!wk->loads_text)
            continue;
        if (!heading)
            fputs("\nloaded models:\n", f);
        heading = true;
        fputs(wk->loads_text, f);
    }
    fclose(f);
    return text;
}

static void on_admin(void *arg, const uint8_t *id, size_t idlen,
                     const Baton__V1__ClientMessage *cm)
{
    conductor *c = arg;
    Baton__V1__ServerMessage m = BATON__V1__SERVER_MESSAGE__INIT;
    char *text = NULL;
    Baton__V1__StatsResponse st = BATON__V1__STATS_RESPONSE__INIT;
    Baton__V1__InspectResponse in = BATON__V1__INSPECT_RESPONSE__INIT;
    switch (cm->msg_case) {
    case BATON__V1__CLIENT_MESSAGE__MSG_HEALTH:
        answer_health(c, id, idlen);
        return;
    case BATON__V1__CLIENT_MESSAGE__MSG_STATS:
        text = stats_text(c);
        st.text = text ? text : "";
        m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_STATS;
        m.stats = &st;
        break;
    case BATON__V1__CLIENT_MESSAGE__MSG_INSPECT:
        text = inspect_text(c, cm->inspect->graph);
        in.text = text ? text : "";
        m.msg_case = BATON__V1__SERVER_MESSAGE__MSG_INSPECT;
        m.inspect = &in;
        break;
    default:
        return;
    }
    out_send(c->out, id, idlen, &m);
    free(text);
}

/* ---- signals and the tick ---------------------------------------------- */

static void begin_drain(conductor *c)
{
    if (c->draining)
        return;
    c->draining = true;
    c->drain_deadline_ms = bt_now_ms() + c->drain_timeout_ms;
    update_admission(c);
    size_t n = front_inflight(c->front);
    bt_info("draining: %zu request%s in flight, up to %u ms", n, n == 1 ? "" : "s",
            c->drain_timeout_ms);
    sd_notify(0, "STOPPING=1\nSTATUS=draining");
}

static void on_signal(evloop *l, void *arg)
{
    (void)l;
    conductor *c = arg;
    struct signalfd_siginfo si;
    while (read(c->sigfd, &si, sizeof(si)) == sizeof(si)) {
        switch (si.ssi_signo) {
        case SIGTERM:
        case SIGINT:
            begin_drain(c);
            break;
        case SIGHUP:
            reload(c);
            break;
        case SIGCHLD: {
            int status;
            pid_t pid;
            while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
                sup_child_exited(c->sup, pid, status);
            break;
        }
        default:
            break;
        }
    }
}

/* While draining: past the drain timeout every request ends; once none is
 * left the workers are told to stop.  Once they are gone (or the grace
 * period is over) the loop ends. */
static void drain_step(conductor *c, uint64_t now)
{
    if (c->draining && !c->stopping) {
        size_t n = front_inflight(c->front);
        if (n && now >= c->drain_deadline_ms) {
            bt_warn("drain timeout: ending %zu request%s", n, n == 1 ? "" : "s");
            front_end_all(c->front, BT_CODE_UNAVAILABLE, "the daemon is shutting down");
        }
        if (front_inflight(c->front) == 0) {
            sup_stop(c->sup, "batond is stopping");
            c->stopping = true;
            c->stop_deadline_ms = now + STOP_GRACE_MS;
        }
    }
    if (c->stopping && (sup_all_exited(c->sup) || now >= c->stop_deadline_ms)) {
        sup_kill_all(c->sup);
        c->done = true;
        evloop_stop(c->loop);
    }
}

/* Sets the one-shot timer to AT_MS (monotonic ms; the clock of
 * bt_now_ms). */
static void arm_tick(conductor *c, uint64_t at_ms)
{
    struct itimerspec its = {{0, 0}, {(time_t)(at_ms / 1000), (long)(at_ms % 1000) * 1000000L}};
    if (timerfd_settime(c->timerfd, TFD_TIMER_ABSTIME, &its, NULL) == 0)
        c->next_tick_ms = at_ms;
}

/* When the tick must run next, from NOW_MS. */
static uint64_t tick_due(const conductor *c, uint64_t now_ms)
{
    uint64_t at = now_ms + (c->draining || c->stopping ? TICK_BUSY_MS
                            : tt_holding(c->tt) || sup_deferred(c->sup) ? TICK_HOLD_MS
                                                                          : TICK_IDLE_MS);
    uint64_t dl = front_next_deadline_ms(c->front);
    if (dl < at)
        at = dl > now_ms ? dl : now_ms + 1;
    if (c->watchdog_usec) {
        uint64_t wd = c->last_watchdog_ms + c->watchdog_usec / 2000;
        if (wd < at)
            at = wd > now_ms ? wd : now_ms + 1;
    }
    return at;
}

/* After a round of the loop: a new deadline, or something now held for the
 * tick, may want it sooner than it is set. */
static void retime_tick(conductor *c, uint64_t now_ms)
{
    uint64_t at = tick_due(c, now_ms);
    if (at < c->next_tick_ms)
        arm_tick(c, at);
}

/* The tick's work as of NOW (the clock, or a time ahead of it from
 * conductor_tick_at); the watchdog goes by the clock alone. */
void conductor_tick_at(conductor *c, uint64_t now)
{
    uint64_t clock = bt_now_ms();
    c->next_tick_ms = UINT64_MAX;
    front_tick(c->front, now);
    tt_tick(c->tt);
    sup_tick(c->sup, now);
    if (c->watchdog_usec && (clock - c->last_watchdog_ms) * 1000 >= c->watchdog_usec / 2) {
        sd_notify(0, "WATCHDOG=1");
        c->last_watchdog_ms = clock;
    }
    drain_step(c, now);
    arm_tick(c, tick_due(c, bt_now_ms()));
}

static void on_tick(evloop *l, void *arg)
{
    (void)l;
    conductor *c = arg;
    uint64_t expirations;
    if (read(c->timerfd, &expirations, sizeof(expirations)) < 0) {
        /* Not expired after all (EAGAIN): it is still armed.  Anything
         * else must not leave the daemon without a tick. */
        if (errno != EAGAIN)
            arm_tick(c, bt_now_ms() + TICK_BUSY_MS);
        return;
    }
    conductor_tick_at(c, bt_now_ms());
}

/* ---- creation, in named steps ------------------------------------------ */

/* Replaces the endpoint *SLOT of the loaded config with EP, when set. */
static int override_endpoint(char **slot, const char *ep)
{
    if (!ep)
        return 0;
    char *copy = strdup(ep);
    if (!copy)
        return BT_ENOMEM;
    free(*slot);
    *slot = copy;
    return 0;
}

/* Reads and builds the deployment; its diagnostics go to stderr. */
static int load_deployment(conductor *c, const char *config_path)
{
    bt_diag *d = bt_diag_create(config_path);
    if (!d)
        return BT_ENOMEM;
    char abs[PATH_MAX];
    c->config_path = strdup(realpath(config_path, abs) ? abs : config_path);
    int rc = c->config_path ? cfg_load_file(config_path, d, &c->cfg) : BT_ENOMEM;
    if (rc == 0)
        rc = graph_set_build(c->cfg, d, &c->gs);
    if (rc == 0 && cfg_check_keys(c->cfg, NULL, d) != 0)
        rc = BT_ECONFIG;
    bt_diag_sort(d);
    bt_diag_print(d, stderr);
    bt_diag_destroy(d);
    return rc;
}

/* The worker executable, and whether it serves the devices the workers
 * name; errors go to stderr at their lines. */
static int find_worker_exe(conductor *c)
{
    int rc = sup_worker_exe(c->worker_exe, sizeof(c->worker_exe));
    if (rc)
        return rc;
    bt_diag *d = bt_diag_create(c->config_path);
    if (!d)
        return BT_ENOMEM;
    rc = sup_check_devices(c->cfg, c->worker_exe, d);
    bt_diag_print(d, stderr);
    bt_diag_destroy(d);
    return rc;
}

/* Makes DIR unless it is there, and remembers it for removal at exit. */
static void make_dir(conductor *c, const char *dir)
{
    if (mkdir(dir, 0755) != 0)
        return;
    char *copy = c->n_made_dirs < MAX_MADE_DIRS ? strdup(dir) : NULL;
    if (copy)
        c->made_dirs[c->n_made_dirs++] = copy;
}

/* An ipc:// endpoint needs its folder; it is made if missing, each missing
 * level remembered so that batond leaves no empty folder behind. */
static void ensure_ipc_dir(conductor *c, const char *endpoint)
{
    const char *file = bt_ipcfile_path(endpoint);
    if (!file)
        return;
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s", file);
    char *dir = dirname(path);
    char buf[PATH_MAX] = "";
    for (char *p = dir; *p; p++) {
        if (*p == '/' && p != dir) {
            snprintf(buf, (size_t)(p - dir) + 1, "%s", dir);
            make_dir(c, buf);
        }
    }
    make_dir(c, dir);
}

/* Removes what batond made for its ipc:// sockets: the socket files it
 * bound (ZeroMQ leaves them behind) and then the folders it made, deepest
 * first, each only when empty: a folder that holds anything else, another
 * batond's socket among them, stays. */
static void remove_ipc_files(conductor *c)
{
    for (size_t i = 0; i < c->n_bound_files; i++)
        if (unlink(c->bound_files[i]) != 0 && errno != ENOENT)
            bt_warn("cannot remove the socket file %s: %s", c->bound_files[i], strerror(errno));
    c->n_bound_files = 0;
    while (c->n_made_dirs) {
        char *dir = c->made_dirs[--c->n_made_dirs];
        rmdir(dir);
        free(dir);
    }
}

/* Checks the socket file of an ipc:// ENDPOINT before binding.  ZeroMQ
 * binds an ipc endpoint by unlinking whatever file is there, so a second
 * batond on the same config would silently take the socket from the first,
 * which then serves nobody: a file a process listens on is refused.  A
 * socket file nobody listens on is the leftover of a batond that did not
 * stop cleanly (a crash, SIGKILL) and goes.  0 or BT_EEXIST (logged). */
static int claim_ipc_file(const char *endpoint)
{
    const char *file = bt_ipcfile_path(endpoint);
    if (!file)
        return 0;
    switch (bt_ipcfile_probe(file)) {
    case BT_IPCFILE_LISTENING:
        bt_error("cannot bind %s: another process serves it (is another batond running on "
                 "this config?); stop it first, or give this one other endpoints", endpoint);
        return BT_EEXIST;
    case BT_IPCFILE_STALE:
        if (unlink(file) == 0)
            bt_info("removed %s, a socket file nobody listened on (left by a batond that did "
                    "not stop cleanly)", file);
        return 0;
    default:
        /* Absent, or something the bind itself will report on. */
        return 0;
    }
}

/* Sets one option of the socket for ENDPOINT.  Each option is part of the
 * daemon's promises (no dropped reply, a worker's reconnect taken over, a
 * bound frame size), so a socket without one must not serve: the error
 * names the option and the endpoint. */
static int set_sockopt(void *sock, const char *endpoint, int option, const char *name,
                       const void *value, size_t len)
{
    if (zmq_setsockopt(sock, option, value, len) == 0)
        return 0;
    bt_error("cannot set %s on the socket of %s: %s", name, endpoint, zmq_strerror(errno));
    return BT_EIO;
}
#define SET_SOCKOPT(sock, endpoint, option, value)                                             \
    set_sockopt(sock, endpoint, option, #option, &(value), sizeof(value))

/* Gives the socket file of an ipc:// ENDPOINT the mode and group of
 * daemon.ipc_mode and ipc_group: who may open the file may talk to batond. */
static int ipc_protect(conductor *c, const char *endpoint)
{
    const cfg_daemon *d = &c->cfg->daemon;
    if (strncmp(endpoint, "ipc://", 6) != 0 || endpoint[6] == '@')
        return 0;
    const char *path = endpoint + 6;
    if (d->ipc_group) {
        errno = 0;
        struct group *g = getgrnam(d->ipc_group);
        if (!g) {
            bt_error("ipc_group '%s' (for %s): %s", d->ipc_group, endpoint,
                     errno ? strerror(errno) : "no such group");
            return BT_ECONFIG;
        }
        if (chown(path, (uid_t)-1, g->gr_gid) != 0) {
            bt_error("cannot give %s to group '%s': %s", path, d->ipc_group, strerror(errno));
            return BT_EIO;
        }
    }
    if (chmod(path, (mode_t)d->ipc_mode) != 0) {
        bt_error("cannot set mode %04o on %s: %s", (unsigned)d->ipc_mode, path, strerror(errno));
        return BT_EIO;
    }
    return 0;
}

static int bind_router(conductor *c, void **sock, const char *endpoint, bool workers)
{
    int rc = claim_ipc_file(endpoint);
    if (rc)
        return rc;
    *sock = zmq_socket(c->zctx, ZMQ_ROUTER);
    if (!*sock)
        return BT_EIO;
    int zero = 0, one = 1, hwm = workers ? 0 : CLIENT_SNDHWM;
    /* A ROUTER drops what goes past a high-water mark, which would break
     * "one terminal response per request".  Towards workers there is none.
     * Towards clients there is one, but the socket is ROUTER_MANDATORY: a
     * full pipe refuses the reply (EAGAIN) rather than drop it, and the
     * reply waits in that client's bounded backlog (daemon/clients.h), so
     * a client that does not read cannot make the daemon grow. */
    if (SET_SOCKOPT(*sock, endpoint, ZMQ_SNDHWM, hwm) < 0 ||
        SET_SOCKOPT(*sock, endpoint, ZMQ_RCVHWM, zero) < 0 ||
        SET_SOCKOPT(*sock, endpoint, ZMQ_LINGER, zero) < 0 ||
        SET_SOCKOPT(*sock, endpoint, ZMQ_ROUTER_MANDATORY, one) < 0)
        return BT_EIO;
    /* No ROUTER_HANDOVER: a peer that gave a routing id in use would take
     * that connection's pipe.  Workers give none; the ROUTER names each
     * connection, and a worker's messages go to the connection its last
     * accepted Register came on (daemon/supervisor.c), so a restarted
     * worker is reached on its new connection at once. */
    /* Every tcp socket is a CURVE server when keys are set; its ZAP domain
     * tells the handler which authorized keys apply.  ipc:// sockets stay
     * NULL mechanism: the file's mode and group guard them. */
    if (c->curve && cfg_endpoint_is_tcp(endpoint)) {
        rc = bt_curve_apply_server(*sock, &c->keys,
                                   workers ? ZAP_DOMAIN_WORKER : ZAP_DOMAIN_CLIENT);
        if (rc) {
            bt_error("cannot make the socket of %s a CURVE server: %s (%s)", endpoint,
                     bt_curve_strerror(rc), zmq_strerror(errno));
            return BT_EIO;
        }
        if (zap_watch(c->zap, *sock, workers ? ZAP_WORKER : ZAP_CLIENT) < 0) {
            bt_error("cannot watch the handshakes of %s: %s", endpoint, zmq_strerror(errno));
            return BT_EIO;
        }
    }
    ensure_ipc_dir(c, endpoint);
    if (zmq_bind(*sock, endpoint) < 0) {
        bt_error("cannot bind %s: %s", endpoint, zmq_strerror(errno));
        return BT_EIO;
    }
    /* From here the file is this batond's, to remove at exit. */
    if (bt_ipcfile_path(endpoint)) {
        assert(c->n_bound_files < sizeof(c->bound_files) / sizeof(c->bound_files[0]));
        c->bound_files[c->n_bound_files++] = bt_ipcfile_path(endpoint);
    }
    return ipc_protect(c, endpoint);
}

/* With daemon.curve: batond's key pair, the ZAP handler (bound before any
 * CURVE socket, so that no peer is let in unasked) with the authorized
 * keys of the files, and the gateway's own pair, authorized on the client
 * socket. */
static int setup_curve(conductor *c)
{
    const cfg_daemon *d = &c->cfg->daemon;
    char err[600], fp[BT_CURVE_FINGERPRINT_LEN + 1];
    if (!d->curve)
        return 0;
    int rc = bt_curve_secret_load(d->curve_secret_key.s, &c->keys, err, sizeof(err));
    if (rc) {
        bt_error("curve secret_key: %s", err);
        return BT_ECONFIG;
    }
    c->curve = true;
    if ((rc = zap_create(c->zctx, &c->zap)) < 0)
        return rc;
    if ((rc = load_file_keys(c, c->cfg)) < 0)
        return rc;
    if ((rc = bt_curve_keypair_generate(&c->gw_keys)) != 0) {
        bt_error("curve: cannot make the gateway's key pair: %s", bt_curve_strerror(rc));
        return BT_EIO;
    }
    if ((rc = zap_allow(c->zap, ZAP_CLIENT, c->gw_keys.public_z85)) < 0)
        return rc;
    bt_info("curve: on for the tcp:// sockets; server key %s...",
            bt_curve_fingerprint(c->keys.public_z85, fp));
    return 0;
}

static int bind_sockets(conductor *c, void *zctx)
{
    c->own_zctx = !zctx;
    c->zctx = zctx ? zctx : zmq_ctx_new();
    if (!c->zctx)
        return BT_EIO;
    int rc = setup_curve(c);
    if (rc)
        return rc;
    rc = bind_router(c, &c->back_sock, c->cfg->daemon.workers_endpoint, true);
    if (rc == 0)
        rc = bind_router(c, &c->front_sock, c->cfg->daemon.listen, false);
    if (rc)
        return rc;
    /* A hard cap below which frames are read and answered (the soft check
     * at the door replies RESOURCE_EXHAUSTED); beyond it ZeroMQ drops the
     * connection rather than let one frame take the conductor's memory. */
    int64_t hard = (int64_t)c->cfg->daemon.max_message_bytes * 2 + 65536;
    return SET_SOCKOPT(c->front_sock, c->cfg->daemon.listen, ZMQ_MAXMSGSIZE, hard);
}

static bool worker_ready(void *arg, int w)
{
    return sup_worker_get(arg, w)->state == SUP_READY;
}

/* Creates the modules bottom-up and connects their hooks to this file. */
static int create_modules(conductor *c)
{
    /* With curve, every spawned worker gets a key pair: towards a tcp
     * workers endpoint, and for its worker-to-worker socket either way. */
    sup_options so = {c->cfg, c->config_path, c->run_id, c->worker_exe, c->back_sock,
                      c->curve ? c->keys.public_z85 : NULL,
                      c->curve && cfg_endpoint_is_tcp(c->cfg->daemon.workers_endpoint), c->gs};
    sup_hooks sh = {c, on_ready_changed, on_worker_lost, on_worker_message, on_burst_begin,
                    on_burst_end, on_authorize, on_worker_keys};
    disp_hooks dh = {c, on_chunk, on_response};
    front_hooks fh = {c, on_admin};
    int rc = BT_ENOMEM;
    if (!(c->m = metrics_create(c->gs)))
        return rc;
    if ((rc = sup_create(&so, &sh, &c->sup)) < 0)
        return rc;
    if ((rc = replicas_create(c->cfg, worker_ready, c->sup, &c->rs)) < 0)
        return rc;
    if (!(c->tt = tt_create(c->sup)))
        return BT_ENOMEM;
    rc = disp_create(c->gs, c->cfg->daemon.speculation_window, c->sup, c->rs, c->tt, c->m, &dh,
                     &c->disp);
    if (rc < 0)
        return rc;
    if (!(c->out = out_create(c->front_sock, c->gs, c->sup, c->tt, c->m)))
        return BT_ENOMEM;
    front_options fo = {c->gs, c->front_sock, c->out, c->sup, c->tt, c->disp, c->rs, {0}};
    if ((rc = front_create(&fo, &fh, &c->front)) < 0)
        return rc;
    apply_limits(c, c->cfg);
    update_admission(c);
    return 0;
}

/* TERM/INT drain, HUP reload, CHLD reaping through a signalfd; SIGPIPE
 * ignored; the tick's timer. */
static int setup_signals(conductor *c)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    c->sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    c->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (c->sigfd < 0 || c->timerfd < 0)
        return BT_EIO;
    arm_tick(c, bt_now_ms() + TICK_BUSY_MS);
    return 0;
}

static int watch(conductor *c)
{
    if (evloop_add(c->loop, c->front_sock, -1, front_on_readable, c->front) < 0 ||
        evloop_add(c->loop, c->back_sock, -1, sup_on_readable, c->sup) < 0 ||
        evloop_add(c->loop, NULL, c->sigfd, on_signal, c) < 0 ||
        evloop_add(c->loop, NULL, c->timerfd, on_tick, c) < 0)
        return BT_ENOMEM;
    if (c->zap && evloop_add(c->loop, zap_sock(c->zap), -1, zap_on_readable, c->zap) < 0)
        return BT_ENOMEM;
    for (int i = 0; i < ZAP_N_SOCKETS; i++)
        if (zap_monitor_sock(c->zap, (zap_socket)i) &&
            evloop_add(c->loop, zap_monitor_sock(c->zap, (zap_socket)i), -1, zap_on_monitor,
                       c->zap) < 0)
            return BT_ENOMEM;
    if (c->cfg->daemon.http_listen) {
        /* The gateway is a client of the client socket like any other: on
         * a CURVE socket it uses the pair made (and authorized) for it. */
        bool gw_curve = c->curve && cfg_endpoint_is_tcp(c->cfg->daemon.listen);
        gateway_options go = {c->cfg->daemon.http_listen, c->cfg->daemon.listen, 0,
                              c->cfg->openai, c->cfg->n_openai, 0,
                              c->cfg->daemon.max_message_bytes,
                              gw_curve ? c->keys.public_z85 : NULL,
                              gw_curve ? &c->gw_keys : NULL};
        return gateway_create(&go, &c->http);
    }
    return 0;
}

int conductor_create(const char *config_path, conductor **out)
{
    conductor_options o = {config_path, NULL, NULL, NULL};
    return conductor_create_with(&o, out);
}

int conductor_create_with(const conductor_options *o, conductor **out)
{
    *out = NULL;
    conductor *c = calloc(1, sizeof(*c));
    if (!c)
        return BT_ENOMEM;
    c->sigfd = c->timerfd = c->room_watch = -1;
    c->backlog_poll_ms = -1;
    snprintf(c->run_id, sizeof(c->run_id), "%d-%llx", (int)getpid(),
             (unsigned long long)(bt_now_us() & 0xffffffffffULL));
    int rc = load_deployment(c, o->config_path);
    if (rc == 0)
        rc = override_endpoint(&c->cfg->daemon.listen, o->listen);
    if (rc == 0)
        rc = override_endpoint(&c->cfg->daemon.workers_endpoint, o->workers_endpoint);
    if (rc == 0 && !(c->loop = evloop_create()))
        rc = BT_ENOMEM;
    if (rc == 0)
        rc = find_worker_exe(c);
    if (rc == 0)
        rc = bind_sockets(c, o->zctx);
    if (rc == 0)
        rc = create_modules(c);
    if (rc == 0)
        rc = setup_signals(c);
    if (rc == 0)
        rc = watch(c);
    if (rc != 0) {
        conductor_destroy(c);
        return rc;
    }
    if (sd_watchdog_enabled(0, &c->watchdog_usec) <= 0)
        c->watchdog_usec = 0;
    *out = c;
    return 0;
}

/* The client socket signalled: the flush after this round of the loop
 * sends what the room allows. */
static void on_client_room(evloop *l, void *arg)
{
    (void)l;
    (void)arg;
}

/* Watches the client socket's signal while a reply waits for room
 * (out_room_fd).  Without the watch (no fd, no memory) the timed look of
 * out_flush_backlogs still sends the backlog on, later. */
static void watch_room(conductor *c, bool want)
{
    if (want == (c->room_watch >= 0))
        return;
    if (!want) {
        evloop_remove(c->loop, c->room_watch);
        c->room_watch = -1;
        return;
    }
    int fd = out_room_fd(c->out);
    if (fd >= 0)
        c->room_watch = evloop_add(c->loop, NULL, fd, on_client_room, c);
}

/* One round of the loop: the workers spawned on the first, then what is
 * ready handled, what waits sent on, the tick retimed.  While a reply waits
 * for room in a client's pipe, the round waits no longer than
 * out_flush_backlogs said (not until the next tick). */
int conductor_step(conductor *c, long timeout_ms)
{
    if (!c->started) {
        bt_info("listening on %s, workers on %s", c->cfg->daemon.listen,
                c->cfg->daemon.workers_endpoint);
        sup_start(c->sup);
        c->started = true;
    }
    if (c->backlog_poll_ms >= 0 && c->backlog_poll_ms < timeout_ms)
        timeout_ms = c->backlog_poll_ms;
    sup_cork(c->sup);
    out_cork(c->out);
    int rc = evloop_run_once(c->loop, timeout_ms);
    sup_uncork(c->sup);
    out_uncork(c->out);
    uint64_t now = bt_now_ms();
    if (rc >= 0)
        c->backlog_poll_ms = out_flush_backlogs(c->out, now);
    watch_room(c, c->backlog_poll_ms >= 0);
    retime_tick(c, now);
    if (rc < 0)
        return rc;
    if (c->ready && !c->notified) {
        sd_notify(0, "READY=1\nSTATUS=serving");
        c->notified = true;
    }
    return rc;
}

int conductor_run(conductor *c)
{
    while (!c->done) {
        int rc = conductor_step(c, 1000);
        if (rc < 0) {
            /* A loop that cannot poll serves nobody: the error must reach
             * the exit status, so that systemd (Restart=on-failure) or
             * whatever runs batond starts it again. */
            bt_error("the event loop failed (%s): stopping", zmq_strerror(errno));
            return rc;
        }
    }
    bt_info("stopped");
    return 0;
}

void conductor_counts_get(const conductor *c, conductor_counts *out)
{
    const cl_table *cl = out_clients(c->out);
    *out = (conductor_counts){c->ready, front_inflight(c->front), front_placing(c->front),
                              disp_tensors_held(c->disp), tt_count(c->tt), cl->n,
                              cl->backlog_bytes, out_dropped(c->out)};
}

int conductor_check_clients(const conductor *c, char *why, size_t len)
{
    return cl_check(out_clients(c->out), why, len);
}

void conductor_destroy(conductor *c)
{
    if (!c)
        return;
    /* Every way out comes here (a drained stop, a failed loop, a failed
     * start): no worker batond spawned may outlive it, nor their pool
     * segments, which a worker killed before its own cleanup leaves behind.
     * After a drain this finds nothing left to do. */
    if (c->sup)
        sup_kill_spawned(c->sup);
    gateway_destroy(c->http);
    front_destroy(c->front);
    out_destroy(c->out);
    disp_destroy(c->disp);
    tt_destroy(c->tt);
    replicas_destroy(c->rs);
    sup_destroy(c->sup);
    metrics_destroy(c->m);
    if (c->front_sock)
        zmq_close(c->front_sock);
    if (c->back_sock)
        zmq_close(c->back_sock);
    zap_destroy(c->zap);
    bt_curve_keypair_wipe(&c->keys);
    bt_curve_keypair_wipe(&c->gw_keys);
    if (c->zctx && c->own_zctx)
        zmq_ctx_term(c->zctx);
    remove_ipc_files(c);
    if (c->sigfd >= 0)
        close(c->sigfd);
    if (c->timerfd >= 0)
        close(c->timerfd);
    evloop_destroy(c->loop);
    graph_set_destroy(c->gs);
    cfg_config_destroy(c->cfg);
    free(c->config_path);
    free(c);
}
