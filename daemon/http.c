/* The scrape responder (daemon/http.h). */
#include <errno.h>
#include <stdbool.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "daemon/http.h"

#define HTTP_CONNS 16            /* scrapes served at once; the oldest goes first */
#define HTTP_IDLE_MS 2000        /* a connection that sends no request by then is closed */
#define HTTP_PATH_MAX 256

typedef struct http_conn {
    http_server *srv;            /* borrowed */
    int fd;                      /* -1: free */
    int handle;                  /* evloop handle */
    uint64_t opened_ms;          /* monotonic ms */
    char buf[1024];              /* the request so far */
    size_t n;
} http_conn;

struct http_server {
    evloop *loop;                /* borrowed */
    http_get_fn get;
    void *arg;
    int listen_fd;
    int listen_handle;
    http_conn conns[HTTP_CONNS];
};

static void conn_close(http_conn *c)
{
    evloop_remove(c->srv->loop, c->handle);
    close(c->fd);
    c->fd = -1;
}

/* The path of a "GET /path HTTP/1.x" line without its query, or false. */
static bool request_path(const char *line, char *path, size_t len)
{
    if (strncmp(line, "GET /", 5) != 0)
        return false;
    const char *p = line + 4;
    size_t n = strcspn(p, " ?\r\n");
    if (n >= len)
        return false;
    memcpy(path, p, n);
    path[n] = 0;
    return true;
}

/* Answers once the request line is complete.  The send is best effort (a
 * scrape's text fits a socket buffer); a reader too slow to take it loses
 * the rest. */
static void conn_answer(http_conn *c)
{
    char path[HTTP_PATH_MAX];
    char *body = request_path(c->buf, path, sizeof(path)) ? c->srv->get(c->srv->arg, path) : NULL;
    size_t blen = body ? strlen(body) : 0;
    char head[256];
    int hl = snprintf(head, sizeof(head),
                      "HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                      body ? "200 OK" : "404 Not Found", blen);
    if (send(c->fd, head, (size_t)hl, MSG_NOSIGNAL | MSG_DONTWAIT) == hl && blen)
        send(c->fd, body, blen, MSG_NOSIGNAL | MSG_DONTWAIT);
    free(body);
    conn_close(c);
}

static void on_conn(evloop *l, void *arg)
{
    (void)l;
    http_conn *c = arg;
    ssize_t n = recv(c->fd, c->buf + c->n, sizeof(c->buf) - 1 - c->n, MSG_DONTWAIT);
    if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            conn_close(c);
        return;
    }
    c->n += (size_t)n;
    c->buf[c->n] = 0;
    if (strchr(c->buf, '\n') || c->n == sizeof(c->buf) - 1)
        conn_answer(c);
}

static void on_accept(evloop *l, void *arg)
{
    http_server *h = arg;
    int fd = accept4(h->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return;
    http_conn *c = NULL, *oldest = NULL;
    for (int i = 0; i < HTTP_CONNS && !c; i++) {
        if (h->conns[i].fd < 0)
            c = &h->conns[i];
        else if (!oldest || h->conns[i].opened_ms < oldest->opened_ms)
            oldest = &h->conns[i];
    }
    if (!c) {
        conn_close(oldest);
        c = oldest;
    }
    c->srv = h;
    c->fd = fd;
    c->n = 0;
    c->buf[0] = 0;
    c->opened_ms = bt_now_ms();
    c->handle = evloop_add(l, NULL, fd, on_conn, c);
    if (c->handle < 0) {
        close(fd);
        c->fd = -1;
    }
}

void http_tick(http_server *h, uint64_t now_ms)
{
    for (int i = 0; h && i < HTTP_CONNS; i++)
        if (h->conns[i].fd >= 0 && now_ms > h->conns[i].opened_ms + HTTP_IDLE_MS)
            conn_close(&h->conns[i]);
}

/* A listening, non-blocking, close-on-exec TCP socket on HOSTPORT, or -1. */
static int listen_on(const char *hostport, int *rc)
{
    char host[256];
    snprintf(host, sizeof(host), "%s", hostport);
    char *colon = strrchr(host, ':');
    *rc = BT_EINVAL;
    if (!colon) {
        bt_error("metrics_listen '%s' is not host:port", hostport);
        return -1;
    }
    *colon = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(*host ? host : NULL, colon + 1, &hints, &ai) != 0 || !ai) {
        bt_error("metrics_listen '%s': cannot resolve", hostport);
        return -1;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 16) < 0) {
        bt_error("metrics_listen '%s': %s", hostport, strerror(errno));
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

int http_create(evloop *loop, const char *hostport, http_get_fn get, void *arg,
                http_server **out)
{
    int rc = BT_ENOMEM;
    *out = NULL;
    http_server *h = calloc(1, sizeof(*h));
    if (!h)
        return rc;
    h->loop = loop;
    h->get = get;
    h->arg = arg;
    h->listen_handle = -1;
    for (int i = 0; i < HTTP_CONNS; i++)
        h->conns[i].fd = -1;
    h->listen_fd = listen_on(hostport, &rc);
    if (h->listen_fd < 0)
        goto err;
    h->listen_handle = evloop_add(loop, NULL, h->listen_fd, on_accept, h);
    if (h->listen_handle < 0) {
        rc = h->listen_handle;
        goto err;
    }
    bt_info("metrics on http://%s/metrics", hostport);
    *out = h;
    return 0;
err:
    http_destroy(h);
    return rc;
}

void http_destroy(http_server *h)
{
    if (!h)
        return;
    for (int i = 0; i < HTTP_CONNS; i++)
        if (h->conns[i].fd >= 0)
            conn_close(&h->conns[i]);
    if (h->listen_handle >= 0)
        evloop_remove(h->loop, h->listen_handle);
    if (h->listen_fd >= 0)
        close(h->listen_fd);
    free(h);
}
