/* The conductor's life: load the deployment, bind the sockets, spawn the
 * workers, run the loop, and on SIGTERM drain (refuse new requests, let
 * in-flight ones finish up to drain_timeout_ms), stop the workers and exit 0.
 * SIGHUP re-reads the config and applies log level and limits. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/log.h"
#include "daemon/conductor.h"

#define TICK_MS 10
#define STOP_GRACE_MS 3000

uint64_t cond_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t cond_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static void apply_limits(conductor *c, const cfg_config *cfg)
{
    c->max_inflight = cfg->daemon.max_inflight;
    c->request_timeout_ms = cfg->daemon.request_timeout_ms;
    c->drain_timeout_ms = cfg->daemon.drain_timeout_ms;
    c->max_message_bytes = cfg->daemon.max_message_bytes;
    bt_log_set_level(bt_log_level_parse(cfg->daemon.log_level));
}

/* An ipc:// endpoint needs its folder; it is made if missing. */
static void ensure_ipc_dir(const char *endpoint)
{
    if (strncmp(endpoint, "ipc://", 6) != 0 || endpoint[6] == '@')
        return;
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s", endpoint + 6);
    char *dir = dirname(path);
    char buf[PATH_MAX] = "";
    for (char *p = dir; *p; p++) {
        if (*p == '/' && p != dir) {
            snprintf(buf, (size_t)(p - dir) + 1, "%s", dir);
            mkdir(buf, 0755);
        }
    }
    mkdir(dir, 0755);
}

static int bind_router(conductor *c, void **sock, const char *endpoint, bool mandatory)
{
    *sock = zmq_socket(c->zctx, ZMQ_ROUTER);
    if (!*sock)
        return BT_EIO;
    int zero = 0, one = 1;
    /* No high-water mark: a dropped reply would break "one terminal
     * response per request"; memory is bounded by max_inflight instead. */
    zmq_setsockopt(*sock, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(*sock, ZMQ_RCVHWM, &zero, sizeof(zero));
    zmq_setsockopt(*sock, ZMQ_LINGER, &zero, sizeof(zero));
    if (mandatory) {
        zmq_setsockopt(*sock, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
        /* A restarted worker reconnects under its old routing id, possibly
         * before the dead connection is noticed: let the new one take over
         * rather than be refused. */
        zmq_setsockopt(*sock, ZMQ_ROUTER_HANDOVER, &one, sizeof(one));
    }
    ensure_ipc_dir(endpoint);
    if (zmq_bind(*sock, endpoint) < 0) {
        bt_error("cannot bind %s: %s", endpoint, zmq_strerror(errno));
        return BT_EIO;
    }
    if (strncmp(endpoint, "ipc://", 6) == 0 && endpoint[6] != '@')
        chmod(endpoint + 6, 0660);
    return 0;
}

static void begin_drain(conductor *c)
{
    if (c->draining)
        return;
    c->draining = true;
    c->drain_deadline_ms = cond_now_ms() + c->drain_timeout_ms;
    bt_info("draining: %zu request%s in flight, up to %u ms", c->requests.n,
            c->requests.n == 1 ? "" : "s", c->drain_timeout_ms);
    sd_notify(0, "STOPPING=1\nSTATUS=draining");
}

static void reload(conductor *c)
{
    bt_diag *d = bt_diag_create(c->config_path);
    cfg_config *cfg = NULL;
    if (d && cfg_load_file(c->config_path, d, &cfg) == 0) {
        apply_limits(c, cfg);
        bt_info("reloaded %s: log level, max_inflight %u, request_timeout_ms %u, "
                "drain_timeout_ms %u, max_message_bytes %llu (graph and worker changes "
                "need a restart)", c->config_path, c->max_inflight, c->request_timeout_ms,
                c->drain_timeout_ms, (unsigned long long)c->max_message_bytes);
    } else if (d) {
        bt_diag_sort(d);
        bt_diag_print(d, stderr);
        bt_error("reload of %s failed; keeping the running configuration", c->config_path);
    }
    cfg_config_destroy(cfg);
    bt_diag_destroy(d);
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
                sup_child_exited(c, pid, status);
            break;
        }
        default:
            break;
        }
    }
}

/* Restores the min-heap below position I of the deadline heap. */
static void deadline_sift_down(conductor *c, size_t i)
{
    size_t n = c->n_deadlines;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && c->deadlines[l].at_ms < c->deadlines[m].at_ms)
            m = l;
        if (r < n && c->deadlines[r].at_ms < c->deadlines[m].at_ms)
            m = r;
        if (m == i)
            return;
        deadline t = c->deadlines[i];
        c->deadlines[i] = c->deadlines[m];
        c->deadlines[m] = t;
        i = m;
    }
}

/* Entries of ended requests stay in the heap until they come due; a long
 * client timeout would let them pile up.  Past twice the live requests,
 * keep only the live ones and heapify again. */
static void compact_deadlines(conductor *c)
{
    if (c->n_deadlines <= 2 * c->requests.n + 64)
        return;
    size_t n = 0;
    for (size_t i = 0; i < c->n_deadlines; i++) {
        creq *r = u64map_get(&c->requests, c->deadlines[i].key);
        if (r && r->deadline_ms == c->deadlines[i].at_ms)
            c->deadlines[n++] = c->deadlines[i];
    }
    c->n_deadlines = n;
    for (size_t start = n / 2; start-- > 0;)
        deadline_sift_down(c, start);
}

static void expire_deadlines(conductor *c, uint64_t now)
{
    compact_deadlines(c);
    while (c->n_deadlines && c->deadlines[0].at_ms <= now) {
        deadline top = c->deadlines[0];
        c->deadlines[0] = c->deadlines[--c->n_deadlines];
        deadline_sift_down(c, 0);
        creq *r = u64map_get(&c->requests, top.key);
        if (!r || r->deadline_ms != top.at_ms)
            continue;
        if (r->phase == REQ_PLACING) {
            front_end_placing(c, r, BT_CODE_DEADLINE_EXCEEDED, "deadline exceeded");
        } else if (r->phase == REQ_RUNNING) {
            rt_deadline(c->rt, r->key);
            disp_actions(c);
        }
    }
}

static bool workers_gone(const conductor *c)
{
    for (size_t i = 0; i < c->n_workers; i++)
        if (c->workers[i].pid)
            return false;
    return true;
}

static void on_tick(evloop *l, void *arg)
{
    conductor *c = arg;
    uint64_t expirations;
    if (read(c->timerfd, &expirations, sizeof(expirations)) < 0)
        return;
    uint64_t now = cond_now_ms();
    expire_deadlines(c, now);
    sup_tick(c, now);
    metrics_tick(c, now);
    if (c->watchdog_usec && (now - c->last_watchdog_ms) * 1000 >= c->watchdog_usec / 2) {
        sd_notify(0, "WATCHDOG=1");
        c->last_watchdog_ms = now;
    }
    if (c->draining && !c->stopping) {
        if (c->requests.n && now >= c->drain_deadline_ms) {
            bt_warn("drain timeout: ending %zu request%s", c->requests.n,
                    c->requests.n == 1 ? "" : "s");
            front_end_placing_all(c, -1, BT_CODE_UNAVAILABLE, "the daemon is shutting down");
            rt_end_all(c->rt, BT_CODE_UNAVAILABLE, "the daemon is shutting down");
            disp_actions(c);
            /* Messages still waiting for fetched bytes go out as they are. */
            for (size_t w = 0; w < c->n_workers; w++)
                disp_fetches_lost(c, (int)w);
        }
        if (c->requests.n == 0) {
            sup_shutdown_all(c, "batond is stopping");
            c->stop_deadline_ms = now + STOP_GRACE_MS;
        }
    }
    if (c->stopping && (workers_gone(c) || now >= c->stop_deadline_ms)) {
        for (size_t i = 0; i < c->n_workers; i++) {
            cworker *w = &c->workers[i];
            if (w->pid) {
                kill(w->pid, SIGKILL);
                waitpid(w->pid, NULL, 0);
                w->pid = 0;
            }
            if (w->shm_name[0])
                shm_unlink(w->shm_name);
        }
        c->done = true;
        evloop_stop(l);
    }
}

static int find_worker_exe(conductor *c)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return BT_EIO;
    self[n] = 0;
    const char *env = getenv("BATON_WORKER");
    if (env)
        snprintf(c->worker_exe, sizeof(c->worker_exe), "%s", env);
    else
        snprintf(c->worker_exe, sizeof(c->worker_exe), "%s/baton-worker", dirname(self));
    return 0;
}

int conductor_create(const char *config_path, conductor **out)
{
    int rc = BT_ENOMEM;
    *out = NULL;
    conductor *c = calloc(1, sizeof(*c));
    bt_diag *d = bt_diag_create(config_path);
    if (!c || !d)
        goto err;
    c->sigfd = c->timerfd = -1;
    u64map_init(&c->requests);
    u64map_init(&c->by_client);
    u64map_init(&c->tensors);
    char abs[PATH_MAX];
    c->config_path = strdup(realpath(config_path, abs) ? abs : config_path);
    rc = cfg_load_file(config_path, d, &c->cfg);
    if (rc == 0)
        rc = graph_set_build(c->cfg, d, &c->gs);
    bt_diag_sort(d);
    bt_diag_print(d, stderr);
    if (rc != 0)
        goto err;
    apply_limits(c, c->cfg);
    rt_options ro = {.speculation_window = c->cfg->daemon.speculation_window};
    c->rt = rt_create(c->gs, &ro);
    c->loop = evloop_create();
    c->m = metrics_create(c);
    c->n_workers = c->cfg->n_workers;
    c->workers = calloc(c->n_workers + 1, sizeof(*c->workers));
    c->release_ids = calloc(c->n_workers + 1, sizeof(*c->release_ids));
    c->n_release = calloc(c->n_workers + 1, sizeof(*c->n_release));
    c->cap_release = calloc(c->n_workers + 1, sizeof(*c->cap_release));
    c->graph_input_worker = calloc(c->gs->n_graphs + 1, sizeof(*c->graph_input_worker));
    c->graph_input_local = calloc(c->gs->n_graphs + 1, sizeof(*c->graph_input_local));
    rc = BT_ENOMEM;
    if (!c->rt || !c->loop || !c->m || !c->workers || !c->release_ids || !c->n_release ||
        !c->cap_release || !c->graph_input_worker || !c->graph_input_local)
        goto err;
    for (size_t g = 0; g < c->gs->n_graphs; g++) {
        const graph *gr = &c->gs->graphs[g];
        c->graph_input_worker[g] = malloc((gr->n_inputs + 1) * sizeof(int));
        c->graph_input_local[g] = calloc(gr->n_inputs + 1, 1);
        if (!c->graph_input_worker[g] || !c->graph_input_local[g])
            goto err;
        for (size_t k = 0; k < gr->n_inputs; k++) {
            c->graph_input_worker[g][k] = -1;
            for (size_t e = 0; e < gr->n_entities && c->graph_input_worker[g][k] < 0; e++) {
                const graph_entity *en = &gr->entities[e];
                if (en->kind != GRAPH_NODE)
                    continue;
                for (size_t x = 0; x < en->u.node.n_inputs; x++)
                    if (en->u.node.inputs[x].graph_input == (int)k)
                        c->graph_input_worker[g][k] = en->u.node.worker;
            }
            /* When every consumer reads it on that worker, nobody needs its
             * pool offset: a Dispatch names it by the id the Put gave it. */
            bool local = c->graph_input_worker[g][k] >= 0;
            for (size_t e = 0; e < gr->n_entities && local; e++) {
                const graph_entity *en = &gr->entities[e];
                if (en->kind != GRAPH_NODE)
                    continue;
                for (size_t x = 0; x < en->u.node.n_inputs; x++)
                    if (en->u.node.inputs[x].graph_input == (int)k &&
                        en->u.node.worker != c->graph_input_worker[g][k])
                        local = false;
            }
            c->graph_input_local[g][k] = local;
        }
    }
    for (size_t w = 0; w < c->n_workers; w++) {
        c->workers[w].index = (int)w;
        c->workers[w].cfg = &c->cfg->workers[w];
        c->workers[w].state = c->cfg->workers[w].spawn == CFG_SPAWN_AUTO ? CW_DOWN : CW_STARTING;
    }
    snprintf(c->run_id, sizeof(c->run_id), "%d-%llx", (int)getpid(),
             (unsigned long long)(cond_now_us() & 0xffffffffffULL));
    rc = find_worker_exe(c);
    if (rc)
        goto err;
    c->zctx = zmq_ctx_new();
    if (!c->zctx)
        goto err;
    rc = bind_router(c, &c->back, c->cfg->daemon.workers_endpoint, true);
    if (rc)
        goto err;
    rc = bind_router(c, &c->front, c->cfg->daemon.listen, false);
    if (rc)
        goto err;
    /* A hard cap below which frames are read and answered (the soft check
     * at the door replies RESOURCE_EXHAUSTED); beyond it ZeroMQ drops the
     * connection rather than let one frame take the conductor's memory. */
    int64_t hard = (int64_t)c->max_message_bytes * 2 + 65536;
    zmq_setsockopt(c->front, ZMQ_MAXMSGSIZE, &hard, sizeof(hard));
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
    rc = BT_EIO;
    if (c->sigfd < 0 || c->timerfd < 0)
        goto err;
    struct itimerspec its = {{0, TICK_MS * 1000000L}, {0, TICK_MS * 1000000L}};
    timerfd_settime(c->timerfd, 0, &its, NULL);
    if (evloop_add(c->loop, c->front, -1, front_on_readable, c) < 0 ||
        evloop_add(c->loop, c->back, -1, sup_on_readable, c) < 0 ||
        evloop_add(c->loop, NULL, c->sigfd, on_signal, c) < 0 ||
        evloop_add(c->loop, NULL, c->timerfd, on_tick, c) < 0)
        goto err;
    if (c->cfg->daemon.metrics_listen && metrics_listen(c, c->cfg->daemon.metrics_listen) < 0)
        goto err;
    if (sd_watchdog_enabled(0, &c->watchdog_usec) <= 0)
        c->watchdog_usec = 0;
    bt_diag_destroy(d);
    *out = c;
    return 0;
err:
    bt_diag_destroy(d);
    conductor_destroy(c);
    return rc ? rc : BT_EIO;
}

int conductor_run(conductor *c)
{
    bt_info("listening on %s, workers on %s", c->cfg->daemon.listen,
            c->cfg->daemon.workers_endpoint);
    for (size_t w = 0; w < c->n_workers; w++)
        if (c->workers[w].cfg->spawn == CFG_SPAWN_AUTO)
            sup_spawn(c, &c->workers[w]);
    bool notified = false;
    while (!c->done && evloop_run_once(c->loop, 1000) >= 0) {
        if (c->ready && !notified) {
            sd_notify(0, "READY=1\nSTATUS=serving");
            notified = true;
        }
    }
    bt_info("stopped");
    return 0;
}

void conductor_destroy(conductor *c)
{
    if (!c)
        return;
    size_t pos = 0;
    uint64_t key;
    void *val;
    /* Freeing a request removes it from the map: restart the scan. */
    while (u64map_next(&c->requests, &pos, &key, &val)) {
        front_request_free(c, val);
        pos = 0;
    }
    pos = 0;
    while (u64map_next(&c->tensors, &pos, &key, &val)) {
        free(((ctensor *)val)->data);
        free(val);
    }
    u64map_free(&c->requests);
    u64map_free(&c->by_client);
    u64map_free(&c->tensors);
    for (size_t w = 0; c->workers && w < c->n_workers; w++) {
        cworker *wk = &c->workers[w];
        for (size_t k = 0; k < wk->n_pools; k++) {
            free(wk->pools[k].shm_name);
            free(wk->pools[k].cuda_ipc_handle.data);
        }
        free(wk->pools);
        free(wk->loads_text);
        if (c->release_ids)
            free(c->release_ids[w]);
    }
    for (size_t g = 0; c->graph_input_worker && c->gs && g < c->gs->n_graphs; g++)
        free(c->graph_input_worker[g]);
    for (size_t g = 0; c->graph_input_local && c->gs && g < c->gs->n_graphs; g++)
        free(c->graph_input_local[g]);
    free(c->graph_input_worker);
    free(c->graph_input_local);
    free(c->release_ids);
    free(c->n_release);
    free(c->cap_release);
    free(c->workers);
    free(c->deadlines);
    free(c->extends);
    metrics_destroy(c->m);
    if (c->front)
        zmq_close(c->front);
    if (c->back)
        zmq_close(c->back);
    if (c->zctx)
        zmq_ctx_term(c->zctx);
    if (c->sigfd >= 0)
        close(c->sigfd);
    if (c->timerfd >= 0)
        close(c->timerfd);
    evloop_destroy(c->loop);
    rt_destroy(c->rt);
    graph_set_destroy(c->gs);
    cfg_config_destroy(c->cfg);
    free(c->config_path);
    free(c);
}
