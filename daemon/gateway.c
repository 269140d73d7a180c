/* The HTTP gateway (daemon/gateway.h).
 *
 * libmicrohttpd runs a thread per connection, so a handler may block on
 * the conductor's answer without holding up other connections.  The
 * conductor's answers to health and stats probes come back on one client
 * connection shared under a mutex: each is a short round trip on the
 * conductor's loop. */
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "baton/client.h"
#include "common/log.h"
#include "common/status.h"
#include "daemon/gateway.h"

#define GW_MAX_CONNECTIONS 256   /* default of gateway_options.max_connections */
#define GW_IDLE_S 30             /* a connection idle this long is closed */
#define GW_PROBE_MS 1000         /* how long /health and /metrics wait for the conductor */

struct gateway {
    struct MHD_Daemon *mhd;      /* owned */
    int listen_fd;               /* owned until MHD has it; then MHD closes it */
    pthread_mutex_t admin_mu;    /* guards admin */
    baton_client *admin;         /* owned: health and stats probes */
};

/* ---- replies -------------------------------------------------------------- */

/* Queues BODY (LEN bytes, copied) with STATUS and CTYPE.  MHD_NO closes the
 * connection, which is what a reply that cannot even be allocated gets. */
static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *ctype,
                             const char *body, size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    enum MHD_Result ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

/* An error in the shape OpenAI's API gives, so that its clients show it:
 * {"error": {"message": ..., "type": ..., "code": null}}.  MSG is plain
 * ASCII written by this file (no escaping needed). */
static enum MHD_Result reply_error(struct MHD_Connection *conn, unsigned status, const char *type,
                                   const char *msg)
{
    char body[512];
    int n = snprintf(body, sizeof(body),
                     "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,"
                     "\"code\":null}}\n", msg, type);
    return reply(conn, status, "application/json", body, (size_t)n);
}

/* ---- the conductor's answers ---------------------------------------------- */

/* Health from the conductor: 1 ready, 0 not (DETAIL says why), -1 no answer. */
static int probe_health(gateway *g, char *detail, size_t len)
{
    baton_client_event *ev = NULL;
    pthread_mutex_lock(&g->admin_mu);
    int rc = baton_client_health(g->admin, GW_PROBE_MS, &ev);
    pthread_mutex_unlock(&g->admin_mu);
    if (rc != 0 || !ev) {
        snprintf(detail, len, "the conductor did not answer: %s", baton_client_strerror(rc));
        return -1;
    }
    int ready = ev->ready ? 1 : 0;
    snprintf(detail, len, "%s", ev->message && *ev->message ? ev->message
                                : ready ? "ready" : "starting or draining");
    baton_client_event_free(ev);
    return ready;
}

static enum MHD_Result serve_health(gateway *g, struct MHD_Connection *conn)
{
    char detail[384], body[512];
    int ready = probe_health(g, detail, sizeof(detail));
    /* The detail names workers and states: keep it JSON-safe. */
    for (char *p = detail; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20)
            *p = ' ';
    int n = snprintf(body, sizeof(body), "{\"status\":\"%s\",\"detail\":\"%s\"}\n",
                     ready == 1 ? "ready" : ready == 0 ? "not ready" : "unavailable", detail);
    return reply(conn, ready == 1 ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE,
                 "application/json", body, (size_t)n);
}

static enum MHD_Result serve_metrics(gateway *g, struct MHD_Connection *conn)
{
    baton_client_event *ev = NULL;
    pthread_mutex_lock(&g->admin_mu);
    int rc = baton_client_stats(g->admin, GW_PROBE_MS, &ev);
    pthread_mutex_unlock(&g->admin_mu);
    if (rc != 0 || !ev || !ev->text) {
        baton_client_event_free(ev);
        return reply_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "unavailable",
                           "the conductor did not answer the stats request");
    }
    enum MHD_Result ok = reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                               ev->text, strlen(ev->text));
    baton_client_event_free(ev);
    return ok;
}

/* ---- routing -------------------------------------------------------------- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version, (void)upload_data;
    gateway *g = cls;
    /* The first call for a request comes with its headers only; answering
     * on the second keeps MHD's "100 Continue" handling right. */
    if (!*con_cls) {
        *con_cls = g;
        return MHD_YES;
    }
    if (*upload_data_size) {
        /* These paths take no body: it is read and dropped. */
        *upload_data_size = 0;
        return MHD_YES;
    }
    bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
               strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    bool health = strcmp(url, "/health") == 0, metrics = strcmp(url, "/metrics") == 0;
    if (!health && !metrics)
        return reply_error(conn, MHD_HTTP_NOT_FOUND, "not_found", "no such path");
    if (!get)
        return reply_error(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error",
                           "this path takes GET");
    return health ? serve_health(g, conn) : serve_metrics(g, conn);
}

/* ---- create / destroy ------------------------------------------------------- */

/* A listening, close-on-exec TCP socket on HOSTPORT, or -1 with *RC set. */
static int listen_on(const char *hostport, int *rc)
{
    char host[256];
    snprintf(host, sizeof(host), "%s", hostport);
    char *colon = strrchr(host, ':');
    *rc = BT_EINVAL;
    if (!colon) {
        bt_error("http listen '%s' is not host:port", hostport);
        return -1;
    }
    *colon = 0;
    /* "[::1]:8000": the brackets are the URL's, not the address's. */
    char *h = host;
    if (*h == '[' && colon > h + 1 && colon[-1] == ']')
        h++, colon[-1] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(*h ? h : NULL, colon + 1, &hints, &ai) != 0 || !ai) {
        bt_error("http listen '%s': cannot resolve", hostport);
        return -1;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 128) < 0) {
        bt_error("http listen '%s': %s", hostport, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        *rc = BT_EIO;
        return -1;
    }
    freeaddrinfo(ai);
    *rc = 0;
    return fd;
}

static void mhd_log(void *arg, const char *fmt, va_list ap)
{
    (void)arg;
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = 0;
    bt_warn("http: %s", msg);
}

int gateway_create(const gateway_options *opts, gateway **out)
{
    *out = NULL;
    gateway *g = calloc(1, sizeof(*g));
    if (!g)
        return BT_ENOMEM;
    g->listen_fd = -1;
    pthread_mutex_init(&g->admin_mu, NULL);
    int rc = baton_client_create(opts->endpoint, &g->admin);
    if (rc != 0) {
        bt_error("http: cannot connect to %s: %s", opts->endpoint, baton_client_strerror(rc));
        rc = BT_EIO;
        goto err;
    }
    baton_client_set_connect_timeout(g->admin, GW_PROBE_MS);
    if ((g->listen_fd = listen_on(opts->hostport, &rc)) < 0)
        goto err;
    unsigned limit = opts->max_connections ? opts->max_connections : GW_MAX_CONNECTIONS;
    /* The logger first, as MHD asks, so that it hears every message. */
    g->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                  MHD_USE_ERROR_LOG,
                              0, NULL, NULL, on_request, g, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                              NULL, MHD_OPTION_LISTEN_SOCKET, g->listen_fd,
                              MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_CONNECTION_TIMEOUT,
                              (unsigned)GW_IDLE_S, MHD_OPTION_END);
    if (!g->mhd) {
        bt_error("http: cannot start the server on %s", opts->hostport);
        rc = BT_EIO;
        goto err;
    }
    g->listen_fd = -1;           /* MHD's now */
    bt_info("http on http://%s (/health, /metrics)", opts->hostport);
    *out = g;
    return 0;
err:
    gateway_destroy(g);
    return rc;
}

void gateway_destroy(gateway *g)
{
    if (!g)
        return;
    if (g->mhd)
        MHD_stop_daemon(g->mhd);
    if (g->listen_fd >= 0)
        close(g->listen_fd);
    baton_client_destroy(g->admin);
    pthread_mutex_destroy(&g->admin_mu);
    free(g);
}
