/* The conductor (batond): one thread, one zmq_poll loop (daemon/evloop.c)
 * over the client ROUTER, the worker ROUTER, a signalfd, a timerfd, the
 * ZAP handler's REP socket (with daemon.curve) and the metrics listener.
 * It loads the deployment, creates the modules and wires them together;
 * each module owns its state:
 *
 *   frontend.c    the client socket: checks at the door, admission, the
 *                 requests in flight and their deadlines
 *   outbound.c    what goes back to clients, in order, once its bytes are here
 *   dispatch.c    the work in flight: the graph runtime, its actions as
 *                 worker messages, worker results as runtime events
 *   tensors.c     the tensors workers hold, and their batched Releases
 *   supervisor.c  the worker processes: spawn, register, load, loss, restart
 *   metrics.c     counters and their Prometheus text; gateway.c serves it over HTTP
 *                 (libmicrohttpd threads, a client of this conductor)
 *   zap.c         with daemon.curve: the ZAP handler that lets CURVE peers in on
 *                 the tcp:// sockets (a REP socket on this loop)
 *
 * Calls go down that list (frontend -> dispatch -> tensors -> supervisor);
 * what must go up (a worker lost, a result for a client, a request for the
 * whole daemon's health) goes through hooks that this file connects.  The
 * conductor itself keeps the life cycle: signals, the timer tick, drain and
 * shutdown, reload, and the answers about the whole daemon (health, stats,
 * inspect). */
#ifndef BATON_DAEMON_CONDUCTOR_H
#define BATON_DAEMON_CONDUCTOR_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct conductor conductor;

/* Loads and builds CONFIG_PATH (its diagnostics go to stderr), binds the
 * sockets and sets up signals.  0, or a negative bt_err. */
int conductor_create(const char *config_path, conductor **out);
/* Spawns the workers and serves until a SIGTERM/SIGINT drain ends: 0; or
 * until its event loop fails: a negative bt_err (batond then exits 1). */
int conductor_run(conductor *c);
void conductor_destroy(conductor *c);

/* ---- driving a conductor by hand ----------------------------------------
 * For the fuzzer (tests/fuzz/fuzz_door.c) and tests that put their own
 * sockets beside the conductor's: the same conductor as batond's, on a
 * ZeroMQ context of the caller's, so that inproc:// endpoints reach the
 * caller's sockets and a message sent is at once readable, and run one
 * round of its loop at a time. */
typedef struct conductor_options {
    const char *config_path;
    void *zctx;                   /* the caller's ZeroMQ context (it stays the caller's);
                                   * NULL: the conductor makes its own */
    const char *listen;           /* replaces daemon.listen when set (any endpoint
                                   * ZeroMQ binds, inproc:// included) */
    const char *workers_endpoint; /* replaces daemon.workers_endpoint when set */
} conductor_options;

int conductor_create_with(const conductor_options *o, conductor **out);
/* One round of conductor_run's loop: waits up to TIMEOUT_MS (0: not at
 * all) for its sockets, signals and timer, handles what is ready and sends
 * on what waits.  The first round spawns the workers.  Returns how many
 * watchers ran, or a negative bt_err when the loop failed. */
int conductor_step(conductor *c, long timeout_ms);
/* Runs the periodic tick as if the clock read NOW_MS (monotonic ms, the
 * clock of bt_now_ms): request deadlines, worker liveness, held Releases,
 * stalled clients, the drain.  A time ahead of the clock makes what is
 * due by then happen now. */
void conductor_tick_at(conductor *c, uint64_t now_ms);

/* What the conductor holds, for checks that nothing is left behind. */
typedef struct conductor_counts {
    bool ready;                   /* every worker registered and loaded */
    size_t inflight;              /* requests accepted and not yet answered */
    size_t placing;               /* of those, still placing their inputs */
    size_t tensors_held;          /* tensor references the graph runtime holds */
    size_t tensors;               /* entries of the tensor table */
    size_t clients;               /* client connections the conductor keeps */
    uint64_t backlog_bytes;       /* reply bytes held for clients that did not read */
    uint64_t clients_dropped;     /* connections dropped for not reading, since start */
} conductor_counts;

void conductor_counts_get(const conductor *c, conductor_counts *out);
/* Checks the client table's own sums (requests and held replies per
 * connection, the list of those with held replies) against its entries:
 * 0, or -1 with what disagrees in WHY. */
int conductor_check_clients(const conductor *c, char *why, size_t len);

#endif
