/* Metrics in the Prometheus text format: the same text answers a
 * StatsRequest and `GET /metrics` on metrics_listen.  The HTTP side is a
 * deliberately tiny one-shot server on the conductor's loop (a scrape is one
 * short request every few seconds), so no HTTP library is pulled in. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/conductor.h"

#define N_CODES 16
#define N_BUCKETS 14

static const double bucket_s[N_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                           0.25,  0.5,    1,     2.5,  5,     10,   30};

typedef struct node_stats {
    uint64_t count;
    uint64_t exec_us, queue_us; /* sums */
} node_stats;

typedef struct graph_stats {
    uint64_t by_code[N_CODES];
    uint64_t buckets[N_BUCKETS]; /* cumulative counts are computed when printed */
    uint64_t latency_count;
    double latency_sum_s;
    node_stats *nodes;           /* per entity */
} graph_stats;

#define HTTP_CONNS 16           /* scrapes served at once; the oldest goes first */
#define HTTP_IDLE_MS 2000        /* a connection that sends no request by then is closed */

/* One scrape connection: never read or written with blocking calls, since
 * the loop it runs on is the conductor's only thread. */
typedef struct http_conn {
    struct conductor *c;         /* borrowed */
    int fd;                      /* -1: free */
    int handle;                  /* evloop handle */
    uint64_t opened_ms;
    char buf[1024];              /* the request so far */
    size_t n;
} http_conn;

struct metrics {
    graph_stats *graphs;
    size_t n_graphs;
    uint64_t rejected[N_CODES];
    int listen_fd;
    int listen_handle;
    http_conn conns[HTTP_CONNS];
};

metrics *metrics_create(const conductor *c)
{
    metrics *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->listen_fd = -1;
    for (int i = 0; i < HTTP_CONNS; i++)
        m->conns[i].fd = -1;
    m->n_graphs = c->gs->n_graphs;
    m->graphs = calloc(m->n_graphs + 1, sizeof(*m->graphs));
    if (!m->graphs)
        goto err;
    for (size_t g = 0; g < m->n_graphs; g++) {
        m->graphs[g].nodes = calloc(c->gs->graphs[g].n_entities + 1, sizeof(node_stats));
        if (!m->graphs[g].nodes)
            goto err;
    }
    return m;
err:
    metrics_destroy(m);
    return NULL;
}

void metrics_destroy(metrics *m)
{
    if (!m)
        return;
    for (size_t g = 0; m->graphs && g < m->n_graphs; g++)
        free(m->graphs[g].nodes);
    free(m->graphs);
    if (m->listen_fd >= 0)
        close(m->listen_fd);
    for (int i = 0; i < HTTP_CONNS; i++)
        if (m->conns[i].fd >= 0)
            close(m->conns[i].fd);
    free(m);
}

void metrics_request_done(metrics *m, int gi, bt_code code, uint64_t latency_us)
{
    if (!m || gi < 0 || (size_t)gi >= m->n_graphs)
        return;
    graph_stats *g = &m->graphs[gi];
    g->by_code[code < N_CODES ? code : BT_CODE_UNKNOWN]++;
    double s = latency_us / 1e6;
    for (int b = 0; b < N_BUCKETS; b++)
        if (s <= bucket_s[b]) {
            g->buckets[b]++;
            break;
        }
    g->latency_count++;
    g->latency_sum_s += s;
}

void metrics_node_done(metrics *m, int gi, int node, uint64_t queue_us, uint64_t exec_us)
{
    if (!m || gi < 0 || (size_t)gi >= m->n_graphs)
        return;
    node_stats *n = &m->graphs[gi].nodes[node];
    n->count++;
    n->exec_us += exec_us;
    n->queue_us += queue_us;
}

void metrics_rejected(metrics *m, bt_code code)
{
    if (m)
        m->rejected[code < N_CODES ? code : BT_CODE_UNKNOWN]++;
}

char *metrics_text(conductor *c)
{
    metrics *m = c->m;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    fprintf(f, "# HELP baton_requests_total Requests that ended, by graph and status.\n"
               "# TYPE baton_requests_total counter\n");
    for (size_t g = 0; g < m->n_graphs; g++)
        for (int k = 0; k < N_CODES; k++)
            if (m->graphs[g].by_code[k] || k == 0)
                fprintf(f, "baton_requests_total{graph=\"%s\",code=\"%s\"} %llu\n",
                        c->gs->graphs[g].name, bt_code_name((bt_code)k),
                        (unsigned long long)m->graphs[g].by_code[k]);
    fprintf(f, "# HELP baton_requests_rejected_total Requests refused at the door, by status.\n"
               "# TYPE baton_requests_rejected_total counter\n");
    for (int k = 0; k < N_CODES; k++)
        if (m->rejected[k])
            fprintf(f, "baton_requests_rejected_total{code=\"%s\"} %llu\n",
                    bt_code_name((bt_code)k), (unsigned long long)m->rejected[k]);
    fprintf(f, "# HELP baton_request_duration_seconds Time from acceptance to response.\n"
               "# TYPE baton_request_duration_seconds histogram\n");
    for (size_t g = 0; g < m->n_graphs; g++) {
        const graph_stats *gs = &m->graphs[g];
        uint64_t cum = 0;
        for (int b = 0; b < N_BUCKETS; b++) {
            cum += gs->buckets[b];
            fprintf(f, "baton_request_duration_seconds_bucket{graph=\"%s\",le=\"%g\"} %llu\n",
                    c->gs->graphs[g].name, bucket_s[b], (unsigned long long)cum);
        }
        fprintf(f, "baton_request_duration_seconds_bucket{graph=\"%s\",le=\"+Inf\"} %llu\n",
                c->gs->graphs[g].name, (unsigned long long)gs->latency_count);
        fprintf(f, "baton_request_duration_seconds_sum{graph=\"%s\"} %.6f\n",
                c->gs->graphs[g].name, gs->latency_sum_s);
        fprintf(f, "baton_request_duration_seconds_count{graph=\"%s\"} %llu\n",
                c->gs->graphs[g].name, (unsigned long long)gs->latency_count);
    }
    fprintf(f, "# HELP baton_node_exec_seconds Node execution time on its worker.\n"
               "# TYPE baton_node_exec_seconds summary\n");
    for (size_t g = 0; g < m->n_graphs; g++) {
        const graph *gr = &c->gs->graphs[g];
        for (size_t e = 0; e < gr->n_entities; e++) {
            const node_stats *n = &m->graphs[g].nodes[e];
            if (gr->entities[e].kind != GRAPH_NODE)
                continue;
            fprintf(f, "baton_node_exec_seconds_sum{graph=\"%s\",node=\"%s\"} %.6f\n", gr->name,
                    gr->entities[e].name, n->exec_us / 1e6);
            fprintf(f, "baton_node_exec_seconds_count{graph=\"%s\",node=\"%s\"} %llu\n",
                    gr->name, gr->entities[e].name, (unsigned long long)n->count);
            fprintf(f, "baton_node_queue_seconds_sum{graph=\"%s\",node=\"%s\"} %.6f\n",
                    gr->name, gr->entities[e].name, n->queue_us / 1e6);
        }
    }
    size_t placing = 0, running = 0;
    size_t pos = 0;
    uint64_t key;
    void *val;
    while (u64map_next(&c->requests, &pos, &key, &val))
        ((creq *)val)->phase == REQ_PLACING ? placing++ : running++;
    fprintf(f, "# HELP baton_inflight_requests Requests accepted and not yet answered.\n"
               "# TYPE baton_inflight_requests gauge\nbaton_inflight_requests %zu\n",
            placing + running);
    fprintf(f, "# HELP baton_queue_depth Work waiting: requests placing inputs, and items "
               "queued on workers.\n# TYPE baton_queue_depth gauge\n"
               "baton_queue_depth{where=\"conductor\"} %zu\n", placing);
    fprintf(f, "# HELP baton_tensors_held Tensors the conductor tracks for live requests.\n"
               "# TYPE baton_tensors_held gauge\nbaton_tensors_held %zu\n",
            rt_tensors_held(c->rt));
    fprintf(f, "# HELP baton_pool_bytes_used Bytes allocated in a worker's pool.\n"
               "# TYPE baton_pool_bytes_used gauge\n");
    for (size_t w = 0; w < c->n_workers; w++) {
        const cworker *wk = &c->workers[w];
        fprintf(f, "baton_pool_bytes_used{worker=\"%s\"} %llu\n", wk->cfg->name,
                (unsigned long long)wk->pool_used);
        fprintf(f, "baton_pool_bytes_free{worker=\"%s\"} %llu\n", wk->cfg->name,
                (unsigned long long)wk->pool_free);
        fprintf(f, "baton_pool_fragmentation{worker=\"%s\"} %.4f\n", wk->cfg->name,
                wk->fragmentation);
        fprintf(f, "baton_queue_depth{where=\"%s\"} %u\n", wk->cfg->name, wk->queued);
        fprintf(f, "baton_worker_up{worker=\"%s\"} %d\n", wk->cfg->name,
                wk->state == CW_READY);
        fprintf(f, "baton_worker_restarts_total{worker=\"%s\"} %llu\n", wk->cfg->name,
                (unsigned long long)wk->restarts);
    }
    fclose(f);
    return text;
}

static void conn_close(conductor *c, http_conn *h)
{
    evloop_remove(c->loop, h->handle);
    close(h->fd);
    h->fd = -1;
}

/* Answers once the request line is complete: GET /metrics gets the text,
 * anything else 404.  The send is best effort (a scrape's text fits a
 * socket buffer); a reader too slow to take it loses the rest. */
static void conn_answer(conductor *c, http_conn *h)
{
    char *body = NULL;
    const char *status = "404 Not Found";
    if (strncmp(h->buf, "GET /metrics ", 13) == 0 || strncmp(h->buf, "GET /metrics\r", 13) == 0 ||
        strncmp(h->buf, "GET /metrics?", 13) == 0) {
        body = metrics_text(c);
        status = "200 OK";
    }
    char head[256];
    size_t blen = body ? strlen(body) : 0;
    int hl = snprintf(head, sizeof(head),
                      "HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                      status, blen);
    if (send(h->fd, head, (size_t)hl, MSG_NOSIGNAL | MSG_DONTWAIT) == hl && blen)
        send(h->fd, body, blen, MSG_NOSIGNAL | MSG_DONTWAIT);
    free(body);
    conn_close(c, h);
}

static void on_conn(evloop *l, void *arg)
{
    (void)l;
    http_conn *h = arg;
    conductor *c = h->c;
    ssize_t n = recv(h->fd, h->buf + h->n, sizeof(h->buf) - 1 - h->n, MSG_DONTWAIT);
    if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            conn_close(c, h);
        return;
    }
    h->n += (size_t)n;
    h->buf[h->n] = 0;
    if (strstr(h->buf, "\r\n") || strstr(h->buf, "\n") || h->n == sizeof(h->buf) - 1)
        conn_answer(c, h);
}

static void on_http(evloop *l, void *arg)
{
    (void)l;
    conductor *c = arg;
    metrics *m = c->m;
    int fd = accept4(m->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
        return;
    http_conn *h = NULL, *oldest = NULL;
    for (int i = 0; i < HTTP_CONNS && !h; i++) {
        if (m->conns[i].fd < 0)
            h = &m->conns[i];
        else if (!oldest || m->conns[i].opened_ms < oldest->opened_ms)
            oldest = &m->conns[i];
    }
    if (!h) {
        conn_close(c, oldest);
        h = oldest;
    }
    h->c = c;
    h->fd = fd;
    h->n = 0;
    h->buf[0] = 0;
    h->opened_ms = cond_now_ms();
    h->handle = evloop_add(c->loop, NULL, fd, on_conn, h);
    if (h->handle < 0) {
        close(fd);
        h->fd = -1;
    }
}

void metrics_tick(conductor *c, uint64_t now_ms)
{
    metrics *m = c->m;
    for (int i = 0; m && i < HTTP_CONNS; i++)
        if (m->conns[i].fd >= 0 && now_ms > m->conns[i].opened_ms + HTTP_IDLE_MS)
            conn_close(c, &m->conns[i]);
}

int metrics_listen(conductor *c, const char *hostport)
{
    char host[256];
    snprintf(host, sizeof(host), "%s", hostport);
    char *colon = strrchr(host, ':');
    if (!colon) {
        bt_error("metrics_listen '%s' is not host:port", hostport);
        return BT_EINVAL;
    }
    *colon = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(*host ? host : NULL, colon + 1, &hints, &ai) != 0 || !ai) {
        bt_error("metrics_listen '%s': cannot resolve", hostport);
        return BT_EINVAL;
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
        return BT_EIO;
    }
    freeaddrinfo(ai);
    c->m->listen_fd = fd;
    c->m->listen_handle = evloop_add(c->loop, NULL, fd, on_http, c);
    bt_info("metrics on http://%s/metrics", hostport);
    return 0;
}
