/* Creating and destroying a worker: segment, allocator, fds, socket, lanes.
 * Destruction undoes creation in reverse and copes with a half-made
 * worker, so creation has one error path. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "common/log.h"
#include "worker/worker_internal.h"
#include "worker/nccl.h"
#include "worker/xfer.h"

static int socket_open(wk_worker *w, char *err, size_t errlen)
{
    if (!(w->zctx = zmq_ctx_new())) {
        snprintf(err, errlen, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    if (!(w->sock = zmq_socket(w->zctx, ZMQ_DEALER))) {
        snprintf(err, errlen, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    /* The routing id is the worker's name: the conductor's ROUTER knows
     * which worker a frame came from without any field in it.  Linger 0:
     * a worker that stops drops what the conductor can no longer use.
     * High-water marks off: Done and Chunk must never be dropped or block
     * the I/O thread; the conductor's own limits bound the traffic. */
    int zero = 0;
    if (zmq_setsockopt(w->sock, ZMQ_ROUTING_ID, w->opt.name, strlen(w->opt.name)) != 0 ||
        zmq_setsockopt(w->sock, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(w->sock, ZMQ_SNDHWM, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(w->sock, ZMQ_RCVHWM, &zero, sizeof(zero)) != 0) {
        snprintf(err, errlen, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    if (w->opt.curve_server_public) {
        int rc = bt_curve_apply_client(w->sock, w->opt.curve_own, w->opt.curve_server_public);
        if (rc) {
            snprintf(err, errlen, "CURVE towards %s: %s", w->opt.endpoint, bt_curve_strerror(rc));
            return -1;
        }
    }
    /* Watch the connection: after a reconnect (a conductor restarted on the
     * same endpoint, as with spawn: external) the worker registers again,
     * as the protocol asks. */
    char mon[64];
    snprintf(mon, sizeof(mon), "inproc://baton-worker-monitor-%p", (void *)w);
    if (zmq_socket_monitor(w->sock, mon, ZMQ_EVENT_CONNECTED) != 0 ||
        !(w->monitor = zmq_socket(w->zctx, ZMQ_PAIR)) || zmq_connect(w->monitor, mon) != 0 ||
        zmq_setsockopt(w->monitor, ZMQ_LINGER, &zero, sizeof(zero)) != 0) {
        snprintf(err, errlen, "socket monitor: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    if (zmq_connect(w->sock, w->opt.endpoint) != 0) {
        snprintf(err, errlen, "connect to %s: %s", w->opt.endpoint, zmq_strerror(zmq_errno()));
        return -1;
    }
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

int wk_worker_create(const wk_options *opt, wk_worker **out, char *err, size_t errlen)
{
    *out = NULL;
    wk_worker *w = calloc(1, sizeof(*w));
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    w->opt = *opt;
    w->self_index = opt->index;
    w->event_fd = -1;
    w->signal_fd = -1;
    w->next_counter = 1;
    atomic_init(&w->stopping, false);
    u64map_init(&w->tensors);
    u64map_init(&w->requests);
    /* A configured host name wins: several "hosts" may share one kernel
     * (network namespaces, containers), and the conductor tells same-host
     * from cross-host transfers by these names. */
    if (opt->host && *opt->host)
        snprintf(w->hostname, sizeof(w->hostname), "%s", opt->host);
    else if (gethostname(w->hostname, sizeof(w->hostname) - 1) != 0)
        snprintf(w->hostname, sizeof(w->hostname), "localhost");

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    /* Sleeps measure monotonic time: a clock step must not stretch them. */
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->work, NULL);
    pthread_cond_init(&w->wake, &ca);
    pthread_condattr_destroy(&ca);

    if (!opt->name || !opt->endpoint || !opt->device || opt->pool_bytes < WK_POOL_ALIGN) {
        snprintf(err, errlen, "worker options incomplete (name, endpoint, device, pool size)");
        goto err;
    }
    if (wk_device_open(&w->dev, opt->device, opt->run_id, opt->name, opt->pool_bytes, err,
                       errlen) != 0 ||
        wk_device_stream_create(w->dev, &w->io_stream, err, errlen) != 0)
        goto err;
    wk_peers_init(&w->peers, w->hostname, w->dev);
    if (!(w->pool = wk_pool_create(wk_device_pool_size(w->dev))) ||
        !(w->registry = wk_registry_create())) {
        snprintf(err, errlen, "out of memory");
        goto err;
    }
    if ((w->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        goto err;
    }
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC | O_NONBLOCK) < 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        goto err;
    }
    w->signal_fd = pfd[0];
    w->signal_wr = pfd[1];
    signal_pipe_wr = pfd[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGINT, &sa, NULL) < 0) {
        snprintf(err, errlen, "sigaction: %s", strerror(errno));
        goto err;
    }
    if (socket_open(w, err, errlen) != 0 || wk_pull_xfer_create(w, err, errlen) != 0)
        goto err;
    if (wk_nccl_create(w, &w->nccl) != 0) {
        snprintf(err, errlen, "cannot start the comm thread");
        goto err;
    }
    if (*wk_xfer_endpoint(w->xfer))
        bt_info("serving worker-to-worker pulls on %s", wk_xfer_endpoint(w->xfer));
    if (wk_executor_start(w) != 0) {
        snprintf(err, errlen, "cannot start %u compute lane thread(s)", opt->streams);
        goto err;
    }
    *out = w;
    return 0;
err:
    wk_worker_destroy(w);
    return -1;
}

void wk_worker_destroy(wk_worker *w)
{
    if (!w)
        return;
    wk_worker_quiesce(w);
    wk_nccl_destroy(w->nccl);
    wk_xfer_close(w->xfer);
    if (w->sock) {
        zmq_socket_monitor(w->sock, NULL, 0);
        zmq_close(w->sock);
    }
    if (w->monitor)
        zmq_close(w->monitor);
    if (w->zctx)
        zmq_ctx_term(w->zctx);
    /* After the context: ZeroMQ hands back the last zero-copy replies by
     * then, and their tensors are unpinned here. */
    wk_xfer_destroy(w->xfer);
    if (w->signal_fd >= 0) {
        /* Back to the default first: a late signal must not write to a
         * closed (or reused) descriptor. */
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal_pipe_wr = -1;
        close(w->signal_fd);
        close(w->signal_wr);
    }
    if (w->event_fd >= 0)
        close(w->event_fd);
    wk_registry_destroy(w->registry);
    pthread_mutex_lock(&w->lock);
    wk_peers_destroy(&w->peers);
    pthread_mutex_unlock(&w->lock);
    if (w->n_tensors)
        bt_warn("%u tensors still held at exit", w->n_tensors);
    wk_pool_destroy(w->pool);
    if (w->dev) {
        wk_device_stream_destroy(w->dev, w->io_stream);
        wk_device_close(w->dev);
    }
    u64map_free(&w->tensors);
    u64map_free(&w->requests);
    pthread_cond_destroy(&w->wake);
    pthread_cond_destroy(&w->work);
    pthread_mutex_destroy(&w->lock);
    free(w);
}
