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

typedef struct conductor conductor;

/* Loads and builds CONFIG_PATH (its diagnostics go to stderr), binds the
 * sockets and sets up signals.  0, or a negative bt_err. */
int conductor_create(const char *config_path, conductor **out);
/* Spawns the workers and serves until a SIGTERM/SIGINT drain ends: 0; or
 * until its event loop fails: a negative bt_err (batond then exits 1). */
int conductor_run(conductor *c);
void conductor_destroy(conductor *c);

#endif
