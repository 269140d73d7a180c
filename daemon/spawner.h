/* The worker processes batond starts (`spawn: auto`) and their keys.
 *
 * The spawner starts baton-worker as a child (posix_spawn, clean signal
 * mask, a process group of its own), gives it a fresh CURVE key pair
 * through an inherited pipe when the worker socket is a CURVE server,
 * recognises its exit, and schedules its restart: within a second, then
 * with back-off.  It owns the process fields of the worker records
 * (daemon/workers.h: pid, incarnation, restart times, key).
 *
 * It decides nothing about a worker's registration: the supervisor, which
 * owns it, calls it to spawn, to reap and to clean up after a lost worker.
 * A key pair that comes or goes is reported through spawner_hooks. */
#ifndef BATON_DAEMON_SPAWNER_H
#define BATON_DAEMON_SPAWNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/diag.h"
#include "config/config.h"
#include "daemon/workers.h"

typedef struct spawner_hooks {
    void *arg;
    /* With CURVE (spawner_options.curve_server_public): a spawn made the
     * key pair NEW_PUBLIC for its worker, whose previous one, OLD_PUBLIC
     * (NULL at the first spawn), goes.  The hook authorizes the one and
     * forgets the other; a negative bt_err fails the spawn.  NEW_PUBLIC
     * NULL: the worker was lost, OLD_PUBLIC only goes.  May be NULL
     * without CURVE. */
    int (*authorize)(void *arg, const char *old_public, const char *new_public);
} spawner_hooks;

typedef struct spawner_options {
    const char *config_path;      /* absolute; passed to the workers */
    const char *run_id;           /* names this run's shm segments */
    const char *worker_exe;       /* the baton-worker to spawn */
    const char *curve_server_public; /* batond's public key (Z85) when the worker socket is a
                                      * CURVE server: each spawn then gets a fresh key pair
                                      * through an inherited pipe; NULL: none */
} spawner_options;

typedef struct spawner spawner;

/* The worker executable into BUF: $BATON_WORKER, else baton-worker beside
 * the running program.  0 or BT_EIO. */
int spawner_worker_exe(char *buf, size_t len);

/* Checks that EXE can serve the device of every worker of CFG that batond
 * spawns: when one names cuda:N, runs `EXE --devices` once and reports
 * each worker it cannot serve into DIAG at its line, so that a deployment
 * is refused up front instead of a worker failing and restarting forever.
 * 0 or BT_ECONFIG. */
int spawner_check_devices(const cfg_config *cfg, const char *exe, bt_diag *diag);

/* The options' strings are copied; WS is borrowed.  0 or BT_ENOMEM. */
int spawner_create(const spawner_options *opt, worker_set *ws, const spawner_hooks *hooks,
                   spawner **out);
void spawner_destroy(spawner *sp);

/* Starts W's next incarnation: STARTING, or DOWN with its restart
 * scheduled after the same back-off as a crash, so that a missing binary
 * does not spin.  0 or BT_EIO (logged). */
int spawner_spawn(spawner *sp, sup_worker *w);
/* Spawns W again when it is DOWN, not running, and its restart is due. */
void spawner_tick(spawner *sp, sup_worker *w, uint64_t now_ms);
/* The worker whose process PID was (its pid now 0), or NULL when PID is
 * no worker's. */
sup_worker *spawner_reaped(spawner *sp, pid_t pid);
/* W's process died: when to start it again.  At once the first time (or
 * after a long healthy run), then backing off so that a crash loop does
 * not spin. */
void spawner_schedule_restart(sup_worker *w, uint64_t now_ms);

/* W died: its pool segment goes (a SIGKILL leaves the name behind). */
void spawner_unlink_pool(const sup_worker *w);
/* W was lost: its key pair goes with it, so nobody else may log in with it. */
void spawner_revoke_key(spawner *sp, sup_worker *w);

/* Every worker process has exited. */
bool spawner_all_exited(const spawner *sp);
/* Kills what is still running, waits for it, and unlinks every pool segment. */
void spawner_kill_all(spawner *sp);
/* The same for the workers this spawner starts (`spawn: auto`) only: an
 * external worker's process and segment are its own service manager's. */
void spawner_kill_spawned(spawner *sp);

#endif
