/* Worker supervision (daemon/supervisor.h). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/curve.h"
#include "common/log.h"
#include "common/status.h"
#include "daemon/pairs.h"
#include "daemon/supervisor.h"

#define RESTART_FIRST_MS 100     /* first restart: well within a second */
#define RESTART_MAX_MS 30000     /* back-off ceiling */
#define STABLE_MS 60000          /* up this long: back-off starts over */
#define SILENT_MS 10000          /* no message this long: presumed hung */
#define EXTERNAL_SILENT_MS 3000  /* an external worker (no pid to watch): three missed
                                    heartbeats and it is lost */

extern char **environ;

int sup_worker_exe(char *buf, size_t len)
{
    const char *env = getenv("BATON_WORKER");
    if (env) {
        snprintf(buf, len, "%s", env);
        return 0;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return BT_EIO;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    snprintf(buf, len, "%s/baton-worker", slash ? self : ".");
    return 0;
}

/* Runs `EXE --devices` and reads its one line into OUT.  0, or -1 with
 * the reason in OUT. */
static int worker_devices(const char *exe, char *out, size_t len)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        snprintf(out, len, "pipe: %s", strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    char *argv[] = {(char *)exe, "--devices", NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        snprintf(out, len, "cannot run %s: %s", exe, strerror(rc));
        return -1;
    }
    /* The answer is one short line; a program that says nothing for 10 s
     * is not a baton-worker. */
    size_t at = 0;
    bool hung = false;
    for (;;) {
        struct pollfd p = {fds[0], POLLIN, 0};
        int r = poll(&p, 1, 10000);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0) {
            hung = true;
            kill(pid, SIGKILL);
            break;
        }
        ssize_t n = r > 0 && at + 1 < len ? read(fds[0], out + at, len - 1 - at) : 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        at += (size_t)n;
    }
    out[at] = 0;
    close(fds[0]);
    int status = 0, w;
    while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
    if (hung) {
        snprintf(out, len, "%s --devices did not answer within 10 s", exe);
        return -1;
    }
    if (w < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(out, len, "%s --devices failed (an older baton-worker, or not one at all)",
                 exe);
        return -1;
    }
    out[strcspn(out, "\n")] = 0;
    return 0;
}

int sup_check_devices(const cfg_config *cfg, const char *exe, bt_diag *diag)
{
    char devices[256] = "";
    int have = 0, rc = 0;
    for (size_t i = 0; i < cfg->n_workers; i++) {
        const cfg_worker *w = &cfg->workers[i];
        if (w->cuda_index < 0 || w->spawn == CFG_SPAWN_EXTERNAL)
            continue;
        if (!have)
            have = worker_devices(exe, devices, sizeof(devices)) == 0 ? 1 : -1;
        if (have < 0) {
            bt_diag_error(diag, w->pos.line, w->pos.col, "worker %s: device %s: %s", w->name,
                          w->device, devices);
            rc = BT_ECONFIG;
            continue;
        }
        /* The answer is a list of words: "cpu" or "cpu cuda". */
        char words[258];
        snprintf(words, sizeof(words), " %s ", devices);
        if (!strstr(words, " cuda ")) {
            bt_diag_error(diag, w->pos.line, w->pos.col,
                          "worker %s: device %s needs a baton-worker built with CUDA, and %s "
                          "serves only: %s", w->name, w->device, exe, devices);
            rc = BT_ECONFIG;
        }
    }
    return rc;
}

/* A tensor-parallel model's group: the communicator id its rank 0 made
 * (TpGroup), which the other ranks' Loads carry.  Forgotten whenever a
 * member is lost, since the whole group then starts over. */
typedef struct sup_group {
    uint8_t id[128];
    size_t id_len;                /* 0: not known yet */
    uint32_t *sent;               /* per rank: registration of its worker that got a Load
                                     with this id (0: none) */
} sup_group;

struct supervisor {
    const cfg_config *cfg;        /* borrowed */
    char *config_path;            /* owned copies of the options' strings */
    char *run_id;
    char *worker_exe;
    char *curve_server_public;    /* owned; NULL: spawned workers use no CURVE */
    void *socket;                 /* the worker ROUTER; borrowed */
    sup_hooks hooks;
    sup_worker *workers;          /* one per configured worker, in config order */
    size_t n_workers;
    bool ready;                   /* every worker READY */
    bool stopping;                /* told to shut down: no restarts */
    sup_group *groups;            /* per config model: its tensor-parallel group */
    pair_table *pairs;            /* pair communicators of cross-host GPU transfers; owned */
};

static void worker_lost(supervisor *s, sup_worker *w, const char *why);

/* Where a spawned worker finds its key pipe (--key-fd). */
#define SUP_KEY_FD 3

/* A spawn that did not happen: W is DOWN and tried again after the same
 * back-off as a crash, so that a missing binary does not spin. */
static int spawn_failed(supervisor *s, sup_worker *w, const char *why)
{
    bt_error("cannot start worker %s (%s): %s", w->cfg->name, s->worker_exe, why);
    w->state = SUP_DOWN;
    w->backoff_ms = w->backoff_ms ? w->backoff_ms * 2 : RESTART_FIRST_MS;
    if (w->backoff_ms > RESTART_MAX_MS)
        w->backoff_ms = RESTART_MAX_MS;
    w->restart_at_ms = bt_now_ms() + w->backoff_ms;
    w->restarts++;
    return BT_EIO;
}

static void send_shutdown(supervisor *s, sup_worker *w, const char *reason);

int sup_send(supervisor *s, int worker, const Baton__V1__ConductorMessage *m)
{
    size_t n = baton__v1__conductor_message__get_packed_size(m);
    uint8_t stackbuf[4096];
    uint8_t *buf = n <= sizeof(stackbuf) ? stackbuf : malloc(n);
    if (!buf)
        return BT_ENOMEM;
    baton__v1__conductor_message__pack(m, buf);
    const char *name = s->workers[worker].cfg->name;
    int rc = 0;
    if (zmq_send(s->socket, name, strlen(name), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s->socket, buf, n, ZMQ_DONTWAIT) < 0) {
        bt_warn("cannot send to worker %s: %s", name, zmq_strerror(errno));
        rc = BT_EIO;
    }
    if (buf != stackbuf)
        free(buf);
    return rc;
}

size_t sup_n_workers(const supervisor *s)
{
    return s->n_workers;
}

const sup_worker *sup_worker_get(const supervisor *s, int w)
{
    return &s->workers[w];
}

bool sup_ready(const supervisor *s)
{
    return s->ready;
}

static void update_ready(supervisor *s)
{
    bool was = s->ready, now = true;
    for (size_t w = 0; w < s->n_workers; w++)
        now = now && s->workers[w].state == SUP_READY;
    s->ready = now;
    if (now && !was)
        bt_info("ready: %zu worker%s loaded", s->n_workers, s->n_workers == 1 ? "" : "s");
    else if (!now && was)
        bt_warn("not ready: a worker is down");
    if (now != was)
        s->hooks.ready_changed(s->hooks.arg, now);
}

/* Makes a key pair for W's next incarnation, authorizes it (forgetting the
 * previous one), and puts batond's public key and the pair, one a line, in
 * a pipe whose read end is returned in *FD (close-on-exec; the caller
 * hands it to the child).
 *
 * A pipe rather than an environment variable or the command line: those
 * stay readable in /proc/PID/environ and /proc/PID/cmdline for the
 * process's whole life (unsetenv does not wipe the copy the kernel shows),
 * while a pipe's bytes are gone once the child has read them.  The 123
 * bytes fit in the pipe's buffer, so the write end is filled and closed
 * before the spawn, and the child reads to the end at once. */
static int key_pipe(supervisor *s, sup_worker *w, int *fd)
{
    bt_curve_keypair k;
    int p[2] = {-1, -1};
    *fd = -1;
    int rc = bt_curve_keypair_generate(&k);
    if (rc) {
        bt_error("worker %s: cannot make a key pair: %s", w->cfg->name, bt_curve_strerror(rc));
        return BT_EIO;
    }
    rc = s->hooks.authorize(s->hooks.arg, w->key_public[0] ? w->key_public : NULL, k.public_z85);
    w->key_public[0] = 0;
    if (rc < 0)
        goto err;
    memcpy(w->key_public, k.public_z85, sizeof(w->key_public));
    char buf[3 * BT_CURVE_Z85_SIZE + 1];
    int n = snprintf(buf, sizeof(buf), "%s\n%s\n%s\n", s->curve_server_public, k.public_z85,
                     k.secret_z85);
    rc = BT_EIO;
    if (pipe2(p, O_CLOEXEC) != 0 || write(p[1], buf, (size_t)n) != n) {
        bt_error("worker %s: cannot pass its key pair: %s", w->cfg->name, strerror(errno));
        goto err_pipe;
    }
    bt_curve_keypair_wipe(&k);
    bt_curve_wipe(buf, sizeof(buf));
    close(p[1]);
    *fd = p[0];
    return 0;

err_pipe:
    bt_curve_wipe(buf, sizeof(buf));
    if (p[0] >= 0)
        close(p[0]);
    if (p[1] >= 0)
        close(p[1]);
err:
    bt_curve_keypair_wipe(&k);
    return rc;
}

static int spawn(supervisor *s, sup_worker *w)
{
    char inc[16], keyfd[16], *argv[14];
    int key_fd = -1;
    w->incarnation = (w->incarnation + 1) & 0xffff;
    if (!w->incarnation)
        w->incarnation = 1;
    snprintf(inc, sizeof(inc), "%u", w->incarnation);
    snprintf(keyfd, sizeof(keyfd), "%d", SUP_KEY_FD);
    snprintf(w->shm_name, sizeof(w->shm_name), "/baton-%s-%s", s->run_id, w->cfg->name);
    int i = 0;
    argv[i++] = s->worker_exe;
    argv[i++] = "--config";
    argv[i++] = s->config_path;
    argv[i++] = "--name";
    argv[i++] = (char *)w->cfg->name;
    argv[i++] = "--run-id";
    argv[i++] = s->run_id;
    argv[i++] = "--incarnation";
    argv[i++] = inc;
    if (s->curve_server_public) {
        argv[i++] = "--key-fd";
        argv[i++] = keyfd;
    }
    argv[i] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (s->curve_server_public) {
        int rc = key_pipe(s, w, &key_fd);
        /* dup2 onto itself would keep close-on-exec: move it out of the way. */
        if (rc == 0 && key_fd == SUP_KEY_FD) {
            int moved = fcntl(key_fd, F_DUPFD_CLOEXEC, SUP_KEY_FD + 1);
            close(key_fd);
            key_fd = moved;
            rc = moved < 0 ? BT_EIO : 0;
        }
        if (rc != 0 || posix_spawn_file_actions_adddup2(&fa, key_fd, SUP_KEY_FD) != 0) {
            posix_spawn_file_actions_destroy(&fa);
            if (key_fd >= 0)
                close(key_fd);
            return spawn_failed(s, w, "its key pair could not be passed");
        }
    }
    /* The conductor blocks its signals for the signalfd; a child must
     * start with a clean mask and default dispositions.  Each worker leads
     * a process group of its own, so that a terminal's Ctrl-C (SIGINT to
     * the foreground group) reaches the conductor alone, which drains and
     * then stops the workers; a conductor that dies takes them with it
     * through PR_SET_PDEATHSIG. */
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                         POSIX_SPAWN_SETPGROUP);
    pid_t pid;
    int rc = posix_spawn(&pid, s->worker_exe, &fa, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    if (key_fd >= 0)
        close(key_fd);
    uint64_t now = bt_now_ms();
    if (rc != 0)
        return spawn_failed(s, w, strerror(rc));
    w->pid = pid;
    w->state = SUP_STARTING;
    w->started_ms = now;
    w->last_seen_ms = now;
    w->restart_at_ms = 0;
    bt_info("worker %s started (pid %d, incarnation %u)", w->cfg->name, (int)pid,
            w->incarnation);
    return 0;
}

static void send_peers(supervisor *s)
{
    size_t n = s->n_workers;
    Baton__V1__PeerInfo *infos = calloc(n + 1, sizeof(*infos));
    Baton__V1__PeerInfo **ip = calloc(n + 1, sizeof(*ip));
    if (!infos || !ip)
        goto out;
    for (size_t w = 0; w < n; w++) {
        sup_worker *wk = &s->workers[w];
        baton__v1__peer_info__init(&infos[w]);
        infos[w].index = (uint32_t)w;
        infos[w].name = (char *)wk->cfg->name;
        infos[w].hostname = wk->hostname;
        infos[w].peer_endpoint = wk->peer_endpoint;
        infos[w].curve_public_key = wk->curve_public_key;
        infos[w].incarnation = wk->incarnation;
        infos[w].up = wk->state == SUP_LOADING || wk->state == SUP_READY;
        infos[w].n_pools = wk->n_pools;
        Baton__V1__PoolHandle **pp = calloc(wk->n_pools + 1, sizeof(*pp));
        for (size_t k = 0; pp && k < wk->n_pools; k++)
            pp[k] = &wk->pools[k];
        infos[w].pools = pp;
        ip[w] = &infos[w];
    }
    for (size_t w = 0; w < n; w++) {
        if (s->workers[w].state != SUP_LOADING && s->workers[w].state != SUP_READY)
            continue;
        Baton__V1__Peers p = BATON__V1__PEERS__INIT;
        p.self_index = (uint32_t)w;
        p.n_peers = n;
        p.peers = ip;
        p.speculation_window = s->cfg->daemon.speculation_window;
        Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
        m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_PEERS;
        m.peers = &p;
        sup_send(s, (int)w, &m);
    }
out:
    for (size_t w = 0; infos && w < n; w++)
        free(infos[w].pools);
    free(infos);
    free(ip);
}

/* Forgets what W's last incarnation registered and loaded. */
static void forget_registration(sup_worker *w)
{
    free(w->loads_text);
    w->loads_text = NULL;
    for (size_t k = 0; k < w->n_pools; k++) {
        free(w->pools[k].shm_name);
        free(w->pools[k].cuda_ipc_handle.data);
    }
    free(w->pools);
    w->pools = NULL;
    w->n_pools = 0;
}

/* The worker named NAME, or NULL. */
static sup_worker *worker_named(supervisor *s, const char *name)
{
    for (size_t i = 0; i < s->n_workers; i++)
        if (strcmp(s->workers[i].cfg->name, name) == 0)
            return &s->workers[i];
    return NULL;
}

/* Sends W the Load of model M as its rank K.  0, or a negative bt_err. */
static int send_load(supervisor *s, sup_worker *w, size_t m, size_t k)
{
    const cfg_model *md = &s->cfg->models[m];
    Baton__V1__Load__OptionsEntry *ents = calloc(md->n_options + 1, sizeof(*ents));
    Baton__V1__Load__OptionsEntry **ep = calloc(md->n_options + 1, sizeof(*ep));
    char (*vals)[64] = calloc(md->n_options + 1, sizeof(*vals));
    int rc = BT_ENOMEM;
    if (!ents || !ep || !vals)
        goto out;
    for (size_t o = 0; o < md->n_options; o++) {
        const cfg_option *op = &md->options[o];
        baton__v1__load__options_entry__init(&ents[o]);
        ents[o].key = op->name;
        switch (op->type) {
        case BT_OPT_INT: snprintf(vals[o], 64, "%lld", (long long)op->v.i); break;
        case BT_OPT_FLOAT: snprintf(vals[o], 64, "%.17g", op->v.f); break;
        case BT_OPT_BOOL: snprintf(vals[o], 64, "%s", op->v.b ? "true" : "false"); break;
        default: vals[o][0] = 0; break;
        }
        ents[o].value = op->type == BT_OPT_STRING || op->type == BT_OPT_PATH ? op->v.s : vals[o];
        ep[o] = &ents[o];
    }
    Baton__V1__Load ld = BATON__V1__LOAD__INIT;
    ld.model = md->name;
    ld.backend = md->backend;
    ld.n_options = md->n_options;
    ld.options = ep;
    ld.tp_rank = (uint32_t)k;
    ld.tp_size = md->tp ? md->tp : 1;
    ld.max_batch = md->max_batch;
    sup_group *g = &s->groups[m];
    if (ld.tp_size > 1 && k > 0) {
        ld.comm_id.data = g->id;
        ld.comm_id.len = g->id_len;
    }
    Baton__V1__ConductorMessage msg = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    msg.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_LOAD;
    msg.load = &ld;
    rc = sup_send(s, w->index, &msg);
    if (rc == 0 && ld.tp_size > 1 && g->sent)
        g->sent[k] = w->registrations;
out:
    free(ents);
    free(ep);
    free(vals);
    return rc;
}

/* Sends W a Load per model placed on it.  The other ranks of a
 * tensor-parallel model wait for the id of their group (TpGroup from rank
 * 0); their Load goes out when it comes, and counts as pending till then. */
static void send_loads(supervisor *s, sup_worker *w)
{
    const cfg_config *cfg = s->cfg;
    w->loads_pending = 0;
    for (size_t m = 0; m < cfg->n_models; m++) {
        const cfg_model *md = &cfg->models[m];
        for (size_t k = 0; k < md->n_workers; k++) {
            if (strcmp(md->workers[k].s, w->cfg->name) != 0)
                continue;
            if (md->tp > 1 && k > 0 && !s->groups[m].id_len)
                w->loads_pending++;
            else if (send_load(s, w, m, k) == 0)
                w->loads_pending++;
        }
    }
    if (w->loads_pending == 0) {
        w->state = SUP_READY;
        update_ready(s);
    }
}

/* W's rank in the group of tensor-parallel model MD, or -1 when MD is not
 * tensor parallel or W is none of its ranks. */
static int group_rank(const cfg_model *md, const sup_worker *w)
{
    for (size_t k = 0; md->tp > 1 && k < md->n_workers; k++)
        if (strcmp(md->workers[k].s, w->cfg->name) == 0)
            return (int)k;
    return -1;
}

/* The index of the tensor-parallel model called NAME that W is rank 0 of,
 * or -1: the only worker whose TpGroup and TpStep are taken. */
static int led_model(const supervisor *s, const sup_worker *w, const char *name)
{
    for (size_t m = 0; m < s->cfg->n_models; m++)
        if (strcmp(s->cfg->models[m].name, name ? name : "") == 0)
            return group_rank(&s->cfg->models[m], w) == 0 ? (int)m : -1;
    return -1;
}

/* Rank 0 of model NAME, worker W, made its group's id: the other ranks
 * that registered and wait for it get their Load now. */
static void on_tp_group(supervisor *s, sup_worker *w, const Baton__V1__TpGroup *tg)
{
    int m = led_model(s, w, tg->model);
    sup_group *g = m >= 0 ? &s->groups[m] : NULL;
    if (!g || tg->comm_id.len == 0 || tg->comm_id.len > sizeof(g->id)) {
        bt_warn("worker %s sent a group id for model %s, of which it is not rank 0",
                w->cfg->name, tg->model ? tg->model : "?");
        return;
    }
    const cfg_model *md = &s->cfg->models[m];
    memcpy(g->id, tg->comm_id.data, tg->comm_id.len);
    g->id_len = tg->comm_id.len;
    for (size_t k = 1; k < md->n_workers; k++) {
        sup_worker *x = worker_named(s, md->workers[k].s);
        if (x && x->state == SUP_LOADING && g->sent[k] != x->registrations)
            send_load(s, x, (size_t)m, k);
    }
}

/* Worker W, the lower index of a pair of GPU workers on different hosts,
 * made their communicator's id: the peer joins it (PairComm), and the
 * pair's transfers are numbered on it from then on.  An id made for an
 * incarnation of the peer that is gone is dropped: the next one's Peers
 * makes W send another. */
static void on_pair_id(supervisor *s, sup_worker *w, const Baton__V1__PairId *pi)
{
    sup_worker *x = pi->peer < s->n_workers ? &s->workers[pi->peer] : NULL;
    if (!x || x->index <= w->index || !pi->epoch || !pi->comm_id.len) {
        bt_warn("worker %s sent a pair communicator id for worker %u, which it cannot make",
                w->cfg->name, pi->peer);
        return;
    }
    if ((x->state != SUP_LOADING && x->state != SUP_READY) ||
        x->incarnation != pi->peer_incarnation) {
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
    if (sup_send(s, x->index, &m) == 0 && pairs_made(s->pairs, w->index, x->index, pi->epoch) == 0)
        bt_info("workers %s and %s: GPU transfers over NCCL communicator %u", w->cfg->name,
                x->cfg->name, pi->epoch);
}

bool sup_pair_reserve(supervisor *s, int a, int b, uint32_t n, uint32_t *epoch, uint64_t *seq)
{
    return pairs_reserve(s->pairs, a, b, n, epoch, seq);
}

/* Is W one of the ranks of a tensor-parallel model? */
static bool in_group(const supervisor *s, const sup_worker *w)
{
    for (size_t m = 0; m < s->cfg->n_models; m++)
        if (group_rank(&s->cfg->models[m], w) >= 0)
            return true;
    return false;
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
        send_shutdown(s, x, why);
        worker_lost(s, x, why);
        x->state = SUP_STARTING;
        x->restarts++;
    }
}

/* Relays rank 0's step of a tensor-parallel model to the other ranks. */
static void on_tp_step(supervisor *s, sup_worker *w, const Baton__V1__TpStep *st)
{
    int m = led_model(s, w, st->model);
    if (m < 0) {
        bt_warn("worker %s sent a step of model %s, of which it is not rank 0", w->cfg->name,
                st->model ? st->model : "?");
        return;
    }
    const cfg_model *md = &s->cfg->models[m];
    Baton__V1__ConductorMessage cm = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    cm.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_TP_STEP;
    cm.tp_step = (Baton__V1__TpStep *)st;
    for (size_t k = 1; k < md->n_workers; k++) {
        sup_worker *x = worker_named(s, md->workers[k].s);
        /* A step a rank does not get leaves the others waiting for it in a
         * collective: the group starts over. */
        if (x && (x->state == SUP_LOADING || x->state == SUP_READY) &&
            sup_send(s, x->index, &cm) != 0)
            take_down(s, x, "a step of its tensor-parallel group could not be sent to it");
    }
}

/* W was lost: every tensor-parallel group it belonged to is broken (the
 * others wait in collectives that will never complete), so its other
 * members are taken down too and the group starts over with a new id. */
static void break_groups(supervisor *s, sup_worker *w)
{
    const cfg_config *cfg = s->cfg;
    for (size_t m = 0; m < cfg->n_models; m++) {
        const cfg_model *md = &cfg->models[m];
        if (group_rank(md, w) < 0)
            continue;
        sup_group *g = &s->groups[m];
        g->id_len = 0;
        if (g->sent)
            memset(g->sent, 0, md->n_workers * sizeof(*g->sent));
        for (size_t k = 0; k < md->n_workers; k++) {
            sup_worker *x = worker_named(s, md->workers[k].s);
            if (!x || x == w || (x->state != SUP_LOADING && x->state != SUP_READY))
                continue;
            char why[160];
            snprintf(why, sizeof(why), "worker %s of its tensor-parallel group (model %s) was "
                     "lost", w->cfg->name, md->name);
            take_down(s, x, why);
        }
    }
}

/* Tells worker W to exit, saying why: a protocol mismatch, or an external
 * worker declared lost that speaks again and must start over. */
static void send_shutdown(supervisor *s, sup_worker *w, const char *reason)
{
    Baton__V1__Shutdown sd = BATON__V1__SHUTDOWN__INIT;
    sd.reason = (char *)reason;
    Baton__V1__ConductorMessage m = BATON__V1__CONDUCTOR_MESSAGE__INIT;
    m.msg_case = BATON__V1__CONDUCTOR_MESSAGE__MSG_SHUTDOWN;
    m.shutdown = &sd;
    sup_send(s, w->index, &m);
}

static void on_register(supervisor *s, sup_worker *w, const Baton__V1__Register *rg)
{
    if (rg->protocol_version != BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT) {
        bt_error("worker %s speaks protocol %u, this batond %u: shutting it down",
                 w->cfg->name, rg->protocol_version,
                 (unsigned)BATON__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT);
        send_shutdown(s, w, "protocol version mismatch");
        return;
    }
    if ((w->state == SUP_LOADING || w->state == SUP_READY) && in_group(s, w)) {
        /* It keeps its models, loaded on a communicator the rest of its
         * group is about to leave: it must start over with them. */
        take_down(s, w, "it registered again, and its tensor-parallel group starts over");
        return;
    }
    if (w->state == SUP_LOADING || w->state == SUP_READY)
        worker_lost(s, w, "it registered again");
    forget_registration(w);
    pairs_forget(s->pairs, w->index);
    w->registrations++;
    w->pools = calloc(rg->n_pools + 1, sizeof(*w->pools));
    for (size_t k = 0; w->pools && k < rg->n_pools; k++) {
        const Baton__V1__PoolHandle *src = rg->pools[k];
        Baton__V1__PoolHandle *dst = &w->pools[w->n_pools++];
        baton__v1__pool_handle__init(dst);
        dst->pool = src->pool;
        dst->kind = src->kind;
        dst->shm_name = strdup(src->shm_name ? src->shm_name : "");
        dst->pool_bytes = src->pool_bytes;
        dst->cuda_device = src->cuda_device;
        if (src->cuda_ipc_handle.len && (dst->cuda_ipc_handle.data =
                                             malloc(src->cuda_ipc_handle.len))) {
            memcpy(dst->cuda_ipc_handle.data, src->cuda_ipc_handle.data,
                   src->cuda_ipc_handle.len);
            dst->cuda_ipc_handle.len = src->cuda_ipc_handle.len;
        }
    }
    /* The segment to unlink when it dies: as registered (an external
     * worker's name is not ours to derive). */
    for (size_t k = 0; k < w->n_pools; k++)
        if (w->pools[k].kind == BATON__V1__POOL_KIND__POOL_KIND_SHM && w->pools[k].shm_name[0]) {
            snprintf(w->shm_name, sizeof(w->shm_name), "%s", w->pools[k].shm_name);
            break;
        }
    snprintf(w->hostname, sizeof(w->hostname), "%s", rg->hostname ? rg->hostname : "");
    snprintf(w->peer_endpoint, sizeof(w->peer_endpoint), "%s",
             rg->peer_endpoint ? rg->peer_endpoint : "");
    /* Only a well-formed key is passed on; anything else is as good as none
     * (its peers then refuse to pull from it under CURVE). */
    snprintf(w->curve_public_key, sizeof(w->curve_public_key), "%s",
             rg->curve_public_key && bt_curve_z85_valid(rg->curve_public_key, NULL)
                 ? rg->curve_public_key
                 : "");
    w->pool_bytes = rg->pool_bytes;
    if (!w->pid && rg->pid && w->cfg->spawn == CFG_SPAWN_EXTERNAL)
        bt_info("external worker %s registered (pid %u on %s)", w->cfg->name, rg->pid,
                w->hostname);
    w->state = SUP_LOADING;
    bt_info("worker %s registered: %zu pool%s, %llu MiB", w->cfg->name, w->n_pools,
            w->n_pools == 1 ? "" : "s", (unsigned long long)(w->pool_bytes >> 20));
    send_peers(s);
    send_loads(s, w);
}

/* Appends what LD says to W's inspect text: a heading line, then the
 * backend's report indented under it.  Out of memory only loses the text. */
static void record_load(sup_worker *w, const Baton__V1__Loaded *ld)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return;
    if (w->loads_text)
        fputs(w->loads_text, f);
    fprintf(f, "model %s on worker %s: loaded in %.1f ms, %.1f MiB of weights\n",
            ld->model ? ld->model : "?", w->cfg->name, ld->load_us / 1000.0,
            ld->weight_bytes / 1048576.0);
    const char *r = ld->report ? ld->report : "";
    while (*r) {
        const char *nl = strchr(r, '\n');
        size_t n = nl ? (size_t)(nl - r) : strlen(r);
        fprintf(f, "  %.*s\n", (int)n, r);
        r += n + (nl != NULL);
    }
    if (fclose(f) == 0) {
        free(w->loads_text);
        w->loads_text = text;
    } else {
        free(text);
    }
}

static void on_loaded(supervisor *s, sup_worker *w, const Baton__V1__Loaded *ld)
{
    if (ld->status && ld->status->code != BATON__V1__CODE__OK) {
        bt_error("worker %s cannot load model %s: %s", w->cfg->name, ld->model ? ld->model : "?",
                 ld->status->message ? ld->status->message : "");
        return; /* it stays LOADING: health says why the daemon is not ready */
    }
    bt_info("worker %s loaded model %s in %.1f ms", w->cfg->name, ld->model ? ld->model : "?",
            ld->load_us / 1000.0);
    record_load(w, ld);
    if (w->loads_pending && --w->loads_pending == 0 && w->state == SUP_LOADING) {
        w->state = SUP_READY;
        update_ready(s);
    }
}

static void on_heartbeat(sup_worker *w, const Baton__V1__Heartbeat *h)
{
    w->pool_used = h->pool_used_bytes;
    w->pool_free = h->pool_free_bytes;
    w->largest_free = h->largest_free_bytes;
    w->fragmentation = h->fragmentation;
    w->live_tensors = h->live_tensors;
    w->queued = h->queued;
    w->staged_bytes = h->staged_bytes;
    w->sessions = h->open_sessions;
    w->tp_steps = h->tp_steps;
}

/* Handles one message of worker W. */
static void on_message(supervisor *s, sup_worker *w, const Baton__V1__WorkerMessage *wm)
{
    w->last_seen_ms = bt_now_ms();
    bool live = w->state == SUP_LOADING || w->state == SUP_READY;
    /* An external worker declared lost that speaks again (it was stalled,
     * not dead) still holds the lost requests' state: it must start over,
     * and its service manager restarts it. */
    if (!live && w->cfg->spawn == CFG_SPAWN_EXTERNAL &&
        wm->msg_case != BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION && !w->told_to_restart) {
        bt_warn("worker %s speaks again after it was lost: telling it to restart", w->cfg->name);
        send_shutdown(s, w, "declared lost by the conductor; restart and register again");
        w->told_to_restart = true;
    }
    switch (wm->msg_case) {
    case BATON__V1__WORKER_MESSAGE__MSG_REGISTRATION:
        w->told_to_restart = false;
        on_register(s, w, wm->registration);
        break;
    case BATON__V1__WORKER_MESSAGE__MSG_LOADED:
        on_loaded(s, w, wm->loaded);
        break;
    case BATON__V1__WORKER_MESSAGE__MSG_HEARTBEAT:
        on_heartbeat(w, wm->heartbeat);
        break;
    case BATON__V1__WORKER_MESSAGE__MSG_TP_GROUP:
        if (live)
            on_tp_group(s, w, wm->tp_group);
        break;
    case BATON__V1__WORKER_MESSAGE__MSG_TP_STEP:
        if (live)
            on_tp_step(s, w, wm->tp_step);
        break;
    case BATON__V1__WORKER_MESSAGE__MSG_PAIR_ID:
        if (live)
            on_pair_id(s, w, wm->pair_id);
        break;
    case BATON__V1__WORKER_MESSAGE__MSG_DONE:
    case BATON__V1__WORKER_MESSAGE__MSG_CHUNK:
    case BATON__V1__WORKER_MESSAGE__MSG_PLACED:
    case BATON__V1__WORKER_MESSAGE__MSG_FETCHED:
        /* Results of a lost incarnation belong to requests already ended. */
        if (live)
            s->hooks.message(s->hooks.arg, w->index, wm);
        break;
    default:
        break;
    }
}

/* The worker whose routing id is ID, or NULL. */
static sup_worker *worker_by_id(supervisor *s, const void *id, size_t len)
{
    for (size_t i = 0; i < s->n_workers; i++)
        if (strlen(s->workers[i].cfg->name) == len &&
            memcmp(s->workers[i].cfg->name, id, len) == 0)
            return &s->workers[i];
    return NULL;
}

void sup_on_readable(evloop *l, void *arg)
{
    (void)l;
    supervisor *s = arg;
    s->hooks.burst_begin(s->hooks.arg);
    for (int budget = 0; budget < 1024; budget++) {
        zmq_msg_t ident, body;
        zmq_msg_init(&ident);
        if (zmq_msg_recv(&ident, s->socket, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ident);
            break;
        }
        zmq_msg_init(&body);
        bool got = zmq_msg_more(&ident) && zmq_msg_recv(&body, s->socket, 0) >= 0;
        while (got && zmq_msg_more(&body)) { /* extra frames: not ours, skip */
            zmq_msg_t x;
            zmq_msg_init(&x);
            zmq_msg_recv(&x, s->socket, 0);
            int more = zmq_msg_more(&x);
            zmq_msg_close(&x);
            if (!more)
                break;
        }
        size_t idlen = zmq_msg_size(&ident);
        sup_worker *w = worker_by_id(s, zmq_msg_data(&ident), idlen);
        Baton__V1__WorkerMessage *wm =
            got && w ? baton__v1__worker_message__unpack(NULL, zmq_msg_size(&body),
                                                         zmq_msg_data(&body))
                     : NULL;
        if (!w)
            bt_warn("a peer that is no configured worker (%.*s) sent a message", (int)idlen,
                    (const char *)zmq_msg_data(&ident));
        else if (!wm)
            bt_warn("worker %s sent a frame that does not parse", w->cfg->name);
        else
            on_message(s, w, wm);
        baton__v1__worker_message__free_unpacked(wm, NULL);
        zmq_msg_close(&body);
        zmq_msg_close(&ident);
    }
    s->hooks.burst_end(s->hooks.arg);
}

static void worker_lost(supervisor *s, sup_worker *w, const char *why)
{
    if (w->state == SUP_DOWN)
        return;
    bt_warn("worker %s lost: %s", w->cfg->name, why);
    w->state = SUP_DOWN;
    /* Its pool dies with it; a SIGKILL left the name behind. */
    if (w->shm_name[0])
        shm_unlink(w->shm_name);
    /* Its key pair died with it too: nobody else may log in with it. */
    if (w->key_public[0]) {
        s->hooks.authorize(s->hooks.arg, w->key_public, NULL);
        w->key_public[0] = 0;
    }
    forget_registration(w);
    pairs_forget(s->pairs, w->index);
    update_ready(s);
    s->hooks.worker_lost(s->hooks.arg, w->index, why);
    send_peers(s);
    break_groups(s, w);
}

/* Restart at once the first time (or after a long healthy run), then back
 * off so that a crash loop does not spin. */
static void schedule_restart(sup_worker *w, uint64_t now)
{
    if (now - w->started_ms > STABLE_MS || w->backoff_ms == 0)
        w->backoff_ms = RESTART_FIRST_MS;
    w->restart_at_ms = now + w->backoff_ms;
    w->backoff_ms = w->backoff_ms * 2 > RESTART_MAX_MS ? RESTART_MAX_MS : w->backoff_ms * 2;
    w->restarts++;
}

void sup_child_exited(supervisor *s, pid_t pid, int status)
{
    for (size_t i = 0; i < s->n_workers; i++) {
        sup_worker *w = &s->workers[i];
        if (w->pid != pid)
            continue;
        w->pid = 0;
        char why[96];
        if (WIFSIGNALED(status))
            snprintf(why, sizeof(why), "killed by signal %d", WTERMSIG(status));
        else
            snprintf(why, sizeof(why), "exited with status %d", WEXITSTATUS(status));
        if (s->stopping) {
            bt_info("worker %s stopped (%s)", w->cfg->name, why);
            w->state = SUP_DOWN;
            if (w->shm_name[0])
                shm_unlink(w->shm_name);
            return;
        }
        worker_lost(s, w, why);
        schedule_restart(w, bt_now_ms());
        return;
    }
}

void sup_tick(supervisor *s, uint64_t now_ms)
{
    if (s->stopping)
        return;
    for (size_t i = 0; i < s->n_workers; i++) {
        sup_worker *w = &s->workers[i];
        if (w->cfg->spawn == CFG_SPAWN_EXTERNAL) {
            /* It is restarted by its own service manager and registers
             * again; until then its requests must not wait for it.
             * Written as a sum: last_seen_ms may be later than now_ms (a
             * message read during this tick), and a difference would wrap. */
            if ((w->state == SUP_LOADING || w->state == SUP_READY) &&
                now_ms > w->last_seen_ms + EXTERNAL_SILENT_MS) {
                worker_lost(s, w, "no heartbeat from the external worker");
                w->state = SUP_STARTING;
                w->restarts++;
            }
            continue;
        }
        if (w->state == SUP_DOWN && w->pid == 0 && w->restart_at_ms && now_ms >= w->restart_at_ms)
            spawn(s, w);
        /* A worker that says nothing for long is hung: kill it, and the
         * SIGCHLD path restarts it. */
        if (w->state != SUP_DOWN && w->pid && now_ms > w->last_seen_ms + SILENT_MS) {
            bt_warn("worker %s silent for %llu ms: killing it", w->cfg->name,
                    (unsigned long long)(now_ms - w->last_seen_ms));
            kill(w->pid, SIGKILL);
            w->last_seen_ms = now_ms;
        }
    }
}

void sup_start(supervisor *s)
{
    for (size_t w = 0; w < s->n_workers; w++)
        if (s->workers[w].cfg->spawn == CFG_SPAWN_AUTO)
            spawn(s, &s->workers[w]);
}

void sup_stop(supervisor *s, const char *reason)
{
    s->stopping = true;
    for (size_t i = 0; i < s->n_workers; i++) {
        sup_worker *w = &s->workers[i];
        if (w->state == SUP_DOWN && !w->pid)
            continue;
        if (w->state != SUP_STARTING)
            send_shutdown(s, w, reason);
        else if (w->pid)
            kill(w->pid, SIGTERM);
    }
}

bool sup_all_exited(const supervisor *s)
{
    for (size_t i = 0; i < s->n_workers; i++)
        if (s->workers[i].pid)
            return false;
    return true;
}

void sup_kill_all(supervisor *s)
{
    for (size_t i = 0; i < s->n_workers; i++) {
        sup_worker *w = &s->workers[i];
        if (w->pid) {
            kill(w->pid, SIGKILL);
            waitpid(w->pid, NULL, 0);
            w->pid = 0;
        }
        if (w->shm_name[0])
            shm_unlink(w->shm_name);
    }
}

int sup_create(const sup_options *opt, const sup_hooks *hooks, supervisor **out)
{
    *out = NULL;
    supervisor *s = calloc(1, sizeof(*s));
    if (!s)
        return BT_ENOMEM;
    s->cfg = opt->cfg;
    s->socket = opt->socket;
    s->hooks = *hooks;
    s->n_workers = opt->cfg->n_workers;
    s->workers = calloc(s->n_workers + 1, sizeof(*s->workers));
    s->groups = calloc(opt->cfg->n_models + 1, sizeof(*s->groups));
    for (size_t m = 0; s->groups && m < opt->cfg->n_models; m++)
        if (opt->cfg->models[m].tp > 1 &&
            !(s->groups[m].sent = calloc(opt->cfg->models[m].n_workers, sizeof(uint32_t)))) {
            sup_destroy(s);
            return BT_ENOMEM;
        }
    s->config_path = strdup(opt->config_path);
    s->run_id = strdup(opt->run_id);
    s->worker_exe = strdup(opt->worker_exe);
    if (opt->curve_server_public && !(s->curve_server_public = strdup(opt->curve_server_public))) {
        sup_destroy(s);
        return BT_ENOMEM;
    }
    s->pairs = pairs_create(s->n_workers);
    if (!s->workers || !s->groups || !s->config_path || !s->run_id || !s->worker_exe ||
        !s->pairs) {
        sup_destroy(s);
        return BT_ENOMEM;
    }
    for (size_t w = 0; w < s->n_workers; w++) {
        s->workers[w].index = (int)w;
        s->workers[w].cfg = &s->cfg->workers[w];
        s->workers[w].state =
            s->cfg->workers[w].spawn == CFG_SPAWN_AUTO ? SUP_DOWN : SUP_STARTING;
    }
    *out = s;
    return 0;
}

void sup_destroy(supervisor *s)
{
    if (!s)
        return;
    for (size_t w = 0; s->workers && w < s->n_workers; w++)
        forget_registration(&s->workers[w]);
    for (size_t m = 0; s->groups && m < s->cfg->n_models; m++)
        free(s->groups[m].sent);
    free(s->groups);
    pairs_destroy(s->pairs);
    free(s->workers);
    free(s->config_path);
    free(s->run_id);
    free(s->worker_exe);
    free(s->curve_server_public);
    free(s);
}
