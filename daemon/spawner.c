/* The worker processes batond starts, and their keys (daemon/spawner.h). */
#include "daemon/spawner.h"

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

#include "common/clock.h"
#include "common/curve.h"
#include "common/log.h"
#include "common/status.h"

#define RESTART_FIRST_MS 100     /* first restart: well within a second */
#define RESTART_MAX_MS 30000     /* back-off ceiling */
#define STABLE_MS 60000          /* up this long: back-off starts over */

/* Where a spawned worker finds its key pipe (--key-fd). */
#define SUP_KEY_FD 3

extern char **environ;

struct spawner {
    char *config_path;            /* owned copies of the options' strings */
    char *run_id;
    char *worker_exe;
    char *curve_server_public;    /* owned; NULL: spawned workers use no CURVE */
    worker_set *ws;               /* borrowed */
    spawner_hooks hooks;
};

int spawner_worker_exe(char *buf, size_t len)
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

int spawner_check_devices(const cfg_config *cfg, const char *exe, bt_diag *diag)
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

int spawner_create(const spawner_options *opt, worker_set *ws, const spawner_hooks *hooks,
                   spawner **out)
{
    *out = NULL;
    spawner *sp = calloc(1, sizeof(*sp));
    if (!sp)
        return BT_ENOMEM;
    sp->ws = ws;
    sp->hooks = *hooks;
    sp->config_path = strdup(opt->config_path);
    sp->run_id = strdup(opt->run_id);
    sp->worker_exe = strdup(opt->worker_exe);
    if (!sp->config_path || !sp->run_id || !sp->worker_exe ||
        (opt->curve_server_public &&
         !(sp->curve_server_public = strdup(opt->curve_server_public)))) {
        spawner_destroy(sp);
        return BT_ENOMEM;
    }
    *out = sp;
    return 0;
}

void spawner_destroy(spawner *sp)
{
    if (!sp)
        return;
    free(sp->config_path);
    free(sp->run_id);
    free(sp->worker_exe);
    free(sp->curve_server_public);
    free(sp);
}

/* A spawn that did not happen: W is DOWN and tried again after the same
 * back-off as a crash, so that a missing binary does not spin. */
static int spawn_failed(spawner *sp, sup_worker *w, const char *why)
{
    bt_error("cannot start worker %s (%s): %s", w->cfg->name, sp->worker_exe, why);
    w->state = SUP_DOWN;
    w->backoff_ms = w->backoff_ms ? w->backoff_ms * 2 : RESTART_FIRST_MS;
    if (w->backoff_ms > RESTART_MAX_MS)
        w->backoff_ms = RESTART_MAX_MS;
    w->restart_at_ms = bt_now_ms() + w->backoff_ms;
    w->restarts++;
    return BT_EIO;
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
static int key_pipe(spawner *sp, sup_worker *w, int *fd)
{
    bt_curve_keypair k;
    int p[2] = {-1, -1};
    *fd = -1;
    int rc = bt_curve_keypair_generate(&k);
    if (rc) {
        bt_error("worker %s: cannot make a key pair: %s", w->cfg->name, bt_curve_strerror(rc));
        return BT_EIO;
    }
    rc = sp->hooks.authorize(sp->hooks.arg, w->key_public[0] ? w->key_public : NULL,
                             k.public_z85);
    w->key_public[0] = 0;
    if (rc < 0)
        goto err;
    memcpy(w->key_public, k.public_z85, sizeof(w->key_public));
    char buf[3 * BT_CURVE_Z85_SIZE + 1];
    int n = snprintf(buf, sizeof(buf), "%s\n%s\n%s\n", sp->curve_server_public, k.public_z85,
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

int spawner_spawn(spawner *sp, sup_worker *w)
{
    char inc[16], keyfd[16], *argv[14];
    int key_fd = -1;
    w->incarnation = (w->incarnation + 1) & 0xffff;
    if (!w->incarnation)
        w->incarnation = 1;
    snprintf(inc, sizeof(inc), "%u", w->incarnation);
    snprintf(keyfd, sizeof(keyfd), "%d", SUP_KEY_FD);
    snprintf(w->shm_name, sizeof(w->shm_name), "/baton-%s-%s", sp->run_id, w->cfg->name);
    int i = 0;
    argv[i++] = sp->worker_exe;
    argv[i++] = "--config";
    argv[i++] = sp->config_path;
    argv[i++] = "--name";
    argv[i++] = (char *)w->cfg->name;
    argv[i++] = "--run-id";
    argv[i++] = sp->run_id;
    argv[i++] = "--incarnation";
    argv[i++] = inc;
    if (sp->curve_server_public) {
        argv[i++] = "--key-fd";
        argv[i++] = keyfd;
    }
    argv[i] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (sp->curve_server_public) {
        int rc = key_pipe(sp, w, &key_fd);
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
            return spawn_failed(sp, w, "its key pair could not be passed");
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
    int rc = posix_spawn(&pid, sp->worker_exe, &fa, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    if (key_fd >= 0)
        close(key_fd);
    uint64_t now = bt_now_ms();
    if (rc != 0)
        return spawn_failed(sp, w, strerror(rc));
    w->pid = pid;
    w->state = SUP_STARTING;
    w->started_ms = now;
    w->last_seen_ms = now;
    w->restart_at_ms = 0;
    bt_info("worker %s started (pid %d, incarnation %u)", w->cfg->name, (int)pid,
            w->incarnation);
    return 0;
}

void spawner_tick(spawner *sp, sup_worker *w, uint64_t now_ms)
{
    if (w->state == SUP_DOWN && w->pid == 0 && w->restart_at_ms && now_ms >= w->restart_at_ms)
        spawner_spawn(sp, w);
}

sup_worker *spawner_reaped(spawner *sp, pid_t pid)
{
    for (size_t i = 0; i < workers_count(sp->ws); i++) {
        sup_worker *w = workers_at(sp->ws, (int)i);
        if (w->pid == pid) {
            w->pid = 0;
            return w;
        }
    }
    return NULL;
}

void spawner_schedule_restart(sup_worker *w, uint64_t now_ms)
{
    if (now_ms - w->started_ms > STABLE_MS || w->backoff_ms == 0)
        w->backoff_ms = RESTART_FIRST_MS;
    w->restart_at_ms = now_ms + w->backoff_ms;
    w->backoff_ms = w->backoff_ms * 2 > RESTART_MAX_MS ? RESTART_MAX_MS : w->backoff_ms * 2;
    w->restarts++;
}

void spawner_unlink_pool(const sup_worker *w)
{
    if (w->shm_name[0])
        shm_unlink(w->shm_name);
}

void spawner_revoke_key(spawner *sp, sup_worker *w)
{
    if (w->key_public[0]) {
        sp->hooks.authorize(sp->hooks.arg, w->key_public, NULL);
        w->key_public[0] = 0;
    }
}

bool spawner_all_exited(const spawner *sp)
{
    for (size_t i = 0; i < workers_count(sp->ws); i++)
        if (workers_at(sp->ws, (int)i)->pid)
            return false;
    return true;
}

/* Kills W's process if it runs, waits for it, and unlinks its pool. */
static void kill_one(sup_worker *w)
{
    if (w->pid) {
        kill(w->pid, SIGKILL);
        waitpid(w->pid, NULL, 0);
        w->pid = 0;
    }
    spawner_unlink_pool(w);
}

void spawner_kill_all(spawner *sp)
{
    for (size_t i = 0; i < workers_count(sp->ws); i++)
        kill_one(workers_at(sp->ws, (int)i));
}

void spawner_kill_spawned(spawner *sp)
{
    for (size_t i = 0; i < workers_count(sp->ws); i++) {
        sup_worker *w = workers_at(sp->ws, (int)i);
        if (w->cfg->spawn == CFG_SPAWN_AUTO)
            kill_one(w);
    }
}
