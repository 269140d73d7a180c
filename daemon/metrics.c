/* Counters in the Prometheus text format (daemon/metrics.h): the same text
 * answers a StatsRequest and `GET /metrics`. */
#include <stdio.h>
#include <stdlib.h>

#include "daemon/metrics.h"

#define N_CODES 16
#define N_BUCKETS 14

static const double bucket_s[N_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                           0.25,  0.5,    1,     2.5,  5,     10,   30};

typedef struct node_stats {
    uint64_t count;
    uint64_t exec_us, queue_us; /* sums */
} node_stats;

/* A histogram over bucket_s: counts per bucket (cumulated when printed),
 * the count and the sum of the samples. */
typedef struct histo {
    uint64_t buckets[N_BUCKETS];
    uint64_t count;
    double sum_s;
} histo;

typedef struct graph_stats {
    uint64_t by_code[N_CODES];
    histo latency;               /* acceptance to response */
    histo ttft;                  /* acceptance to the first streamed token */
    histo itl;                   /* between streamed tokens */
    uint64_t tokens;             /* streamed new_token values */
    node_stats *nodes;           /* per entity */
} graph_stats;

static void histo_add(histo *h, uint64_t us)
{
    double s = us / 1e6;
    for (int b = 0; b < N_BUCKETS; b++)
        if (s <= bucket_s[b]) {
            h->buckets[b]++;
            break;
        }
    h->count++;
    h->sum_s += s;
}

struct metrics {
    const graph_set *gs;         /* borrowed */
    graph_stats *graphs;         /* per graph */
    size_t n_graphs;
    uint64_t rejected[N_CODES];  /* refusals at the door, by code */
    uint64_t clients_dropped;    /* connections dropped for not reading */
    metrics_cache *cache;        /* [worker][model]: the last CacheReport; NULL until one */
    uint8_t *cache_seen;         /* [worker][model]: one came */
};

metrics *metrics_create(const graph_set *gs)
{
    metrics *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->gs = gs;
    m->n_graphs = gs->n_graphs;
    m->graphs = calloc(m->n_graphs + 1, sizeof(*m->graphs));
    if (!m->graphs)
        goto err;
    for (size_t g = 0; g < m->n_graphs; g++) {
        m->graphs[g].nodes = calloc(gs->graphs[g].n_entities + 1, sizeof(node_stats));
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
    free(m->cache);
    free(m->cache_seen);
    free(m);
}

void metrics_request_done(metrics *m, int gi, bt_code code, uint64_t latency_us)
{
    if (!m || gi < 0 || (size_t)gi >= m->n_graphs)
        return;
    graph_stats *g = &m->graphs[gi];
    g->by_code[code < N_CODES ? code : BT_CODE_UNKNOWN]++;
    histo_add(&g->latency, latency_us);
}

void metrics_token(metrics *m, int gi, bool first, uint64_t since_us)
{
    if (!m || gi < 0 || (size_t)gi >= m->n_graphs)
        return;
    graph_stats *g = &m->graphs[gi];
    g->tokens++;
    histo_add(first ? &g->ttft : &g->itl, since_us);
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

void metrics_cache_report(metrics *m, int w, int model, const metrics_cache *c)
{
    const cfg_config *cfg = m->gs->cfg;
    size_t n = cfg->n_workers * cfg->n_models;
    if (w < 0 || model < 0 || (size_t)w >= cfg->n_workers || (size_t)model >= cfg->n_models)
        return;
    if (!m->cache && (!(m->cache = calloc(n, sizeof(*m->cache))) ||
                      !(m->cache_seen = calloc(n, 1)))) {
        free(m->cache);
        m->cache = NULL;
        return; /* out of memory: the families stay empty */
    }
    size_t k = (size_t)w * cfg->n_models + (size_t)model;
    m->cache[k] = *c;
    m->cache_seen[k] = 1;
}

static void family(FILE *f, const char *name, const char *type, const char *help);

typedef enum cfield { C_HITS, C_MISSES, C_HIT_TOKENS, C_EVICTIONS, C_BYTES, C_ENTRIES } cfield;

static void cache_family(FILE *f, const metrics *m, const char *name, const char *type,
                         const char *help, cfield which)
{
    family(f, name, type, help);
    const cfg_config *cfg = m->gs->cfg;
    for (size_t k = 0; m->cache && k < cfg->n_workers * cfg->n_models; k++) {
        if (!m->cache_seen[k])
            continue;
        const metrics_cache *c = &m->cache[k];
        uint64_t v = which == C_HITS         ? c->hits
                     : which == C_MISSES     ? c->misses
                     : which == C_HIT_TOKENS ? c->hit_tokens
                     : which == C_EVICTIONS  ? c->evictions
                     : which == C_BYTES      ? c->bytes
                                             : c->entries;
        fprintf(f, "%s{worker=\"%s\",model=\"%s\"} %llu\n", name,
                cfg->workers[k / cfg->n_models].name, cfg->models[k % cfg->n_models].name,
                (unsigned long long)v);
    }
}

static void route_family(FILE *f, const metrics_gauges *gg)
{
    family(f, "baton_route_picks_total", "counter",
           "Requests pinned to a replica of a replicated model, by why it was picked: the "
           "longest cached prefix (cache), the least load (load), or in turn (round_robin).");
    for (size_t r = 0; r < gg->n_routes; r++) {
        const metrics_route *x = &gg->routes[r];
        const uint64_t v[3] = {x->by_cache, x->by_load, x->by_turn};
        static const char *const why[3] = {"cache", "load", "round_robin"};
        for (int k = 0; k < 3; k++)
            fprintf(f, "baton_route_picks_total{model=\"%s\",worker=\"%s\",reason=\"%s\"} "
                    "%llu\n", x->model, x->worker, why[k], (unsigned long long)v[k]);
    }
    family(f, "baton_route_pinned_requests", "gauge",
           "Requests pinned to a replica now (its load as routing counts it).");
    for (size_t r = 0; r < gg->n_routes; r++)
        fprintf(f, "baton_route_pinned_requests{model=\"%s\",worker=\"%s\"} %u\n",
                gg->routes[r].model, gg->routes[r].worker, gg->routes[r].pinned);
    family(f, "baton_route_cached_blocks", "gauge",
           "Blocks of prompt prefixes a replica's worker reported its prefix cache holds, as "
           "cache-aware routing matches them.");
    for (size_t r = 0; r < gg->n_routes; r++)
        fprintf(f, "baton_route_cached_blocks{model=\"%s\",worker=\"%s\"} %zu\n",
                gg->routes[r].model, gg->routes[r].worker, gg->routes[r].blocks);
}

void metrics_client_dropped(metrics *m)
{
    if (m)
        m->clients_dropped++;
}

void metrics_rejected(metrics *m, bt_code code)
{
    if (m)
        m->rejected[code < N_CODES ? code : BT_CODE_UNKNOWN]++;
}

/* HELP and TYPE of a family. */
static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A histogram family NAME over every graph, H picking each graph's. */
static void histo_family(FILE *f, const metrics *m, const char *name, const char *help,
                         const histo *(*h)(const graph_stats *))
{
    family(f, name, "histogram", help);
    for (size_t g = 0; g < m->n_graphs; g++) {
        const histo *x = h(&m->graphs[g]);
        const char *gn = m->gs->graphs[g].name;
        uint64_t cum = 0;
        for (int b = 0; b < N_BUCKETS; b++) {
            cum += x->buckets[b];
            fprintf(f, "%s_bucket{graph=\"%s\",le=\"%g\"} %llu\n", name, gn, bucket_s[b],
                    (unsigned long long)cum);
        }
        fprintf(f, "%s_bucket{graph=\"%s\",le=\"+Inf\"} %llu\n", name, gn,
                (unsigned long long)x->count);
        fprintf(f, "%s_sum{graph=\"%s\"} %.6f\n", name, gn, x->sum_s);
        fprintf(f, "%s_count{graph=\"%s\"} %llu\n", name, gn, (unsigned long long)x->count);
    }
}

static const histo *latency_of(const graph_stats *g) { return &g->latency; }
static const histo *ttft_of(const graph_stats *g) { return &g->ttft; }
static const histo *itl_of(const graph_stats *g) { return &g->itl; }

/* A summary family (sum and count) of every node, QUEUE picking the queue
 * time rather than the execution time. */
static void node_family(FILE *f, const metrics *m, const char *name, const char *help,
                        bool queue)
{
    family(f, name, "summary", help);
    for (size_t g = 0; g < m->n_graphs; g++) {
        const graph *gr = &m->gs->graphs[g];
        for (size_t e = 0; e < gr->n_entities; e++) {
            const node_stats *n = &m->graphs[g].nodes[e];
            if (gr->entities[e].kind != GRAPH_NODE)
                continue;
            fprintf(f, "%s_sum{graph=\"%s\",node=\"%s\"} %.6f\n", name, gr->name,
                    gr->entities[e].name, (queue ? n->queue_us : n->exec_us) / 1e6);
            fprintf(f, "%s_count{graph=\"%s\",node=\"%s\"} %llu\n", name, gr->name,
                    gr->entities[e].name, (unsigned long long)n->count);
        }
    }
}

/* What one worker field is, for worker_family. */
typedef enum wfield {
    W_POOL_USED, W_POOL_FREE, W_FRAG, W_UP, W_RESTARTS, W_STAGED, W_SESSIONS, W_TP_STEPS,
    W_INLINE
} wfield;

static void worker_family(FILE *f, const metrics_gauges *gg, const char *name, const char *type,
                          const char *help, wfield which)
{
    family(f, name, type, help);
    for (size_t w = 0; w < gg->n_workers; w++) {
        const metrics_worker *wk = &gg->workers[w];
        fprintf(f, "%s{worker=\"%s\"} ", name, wk->name);
        switch (which) {
        case W_POOL_USED: fprintf(f, "%llu\n", (unsigned long long)wk->pool_used); break;
        case W_POOL_FREE: fprintf(f, "%llu\n", (unsigned long long)wk->pool_free); break;
        case W_FRAG: fprintf(f, "%.4f\n", wk->fragmentation); break;
        case W_UP: fprintf(f, "%d\n", wk->up); break;
        case W_RESTARTS: fprintf(f, "%llu\n", (unsigned long long)wk->restarts); break;
        case W_STAGED: fprintf(f, "%llu\n", (unsigned long long)wk->staged_bytes); break;
        case W_SESSIONS: fprintf(f, "%u\n", wk->sessions); break;
        case W_TP_STEPS: fprintf(f, "%llu\n", (unsigned long long)wk->tp_steps); break;
        case W_INLINE: fprintf(f, "%llu\n", (unsigned long long)wk->inline_batches); break;
        }
    }
}

char *metrics_text(const metrics *m, const metrics_gauges *gg)
{
    const graph_set *set = m->gs;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    family(f, "baton_requests_total", "counter", "Requests that ended, by graph and status.");
    for (size_t g = 0; g < m->n_graphs; g++)
        for (int k = 0; k < N_CODES; k++)
            if (m->graphs[g].by_code[k] || k == 0)
                fprintf(f, "baton_requests_total{graph=\"%s\",code=\"%s\"} %llu\n",
                        set->graphs[g].name, bt_code_name((bt_code)k),
                        (unsigned long long)m->graphs[g].by_code[k]);
    family(f, "baton_requests_rejected_total", "counter",
           "Requests refused at the door, by status.");
    for (int k = 0; k < N_CODES; k++)
        if (m->rejected[k])
            fprintf(f, "baton_requests_rejected_total{code=\"%s\"} %llu\n",
                    bt_code_name((bt_code)k), (unsigned long long)m->rejected[k]);
    histo_family(f, m, "baton_request_duration_seconds", "Time from acceptance to response.",
                 latency_of);
    family(f, "baton_tokens_generated_total", "counter",
           "Values of new_token edges streamed to clients (one per generated token in an LLM "
           "graph); requests that do not stream are not counted.");
    for (size_t g = 0; g < m->n_graphs; g++)
        fprintf(f, "baton_tokens_generated_total{graph=\"%s\"} %llu\n", set->graphs[g].name,
                (unsigned long long)m->graphs[g].tokens);
    histo_family(f, m, "baton_time_to_first_token_seconds",
                 "Time from acceptance to a streaming request's first new_token value.",
                 ttft_of);
    histo_family(f, m, "baton_inter_token_latency_seconds",
                 "Time between a streaming request's successive new_token values.", itl_of);
    node_family(f, m, "baton_node_exec_seconds", "Node execution time on its worker.", false);
    node_family(f, m, "baton_node_queue_seconds",
                "Time a node's work waited on its worker before it ran.", true);
    family(f, "baton_inflight_requests", "gauge", "Requests accepted and not yet answered.");
    fprintf(f, "baton_inflight_requests %zu\n", gg->inflight);
    family(f, "baton_queue_depth", "gauge",
           "Work waiting: requests placing inputs, and items queued on workers.");
    fprintf(f, "baton_queue_depth{where=\"conductor\"} %zu\n", gg->placing);
    for (size_t w = 0; w < gg->n_workers; w++)
        fprintf(f, "baton_queue_depth{where=\"%s\"} %u\n", gg->workers[w].name,
                gg->workers[w].queued);
    family(f, "baton_tensors_held", "gauge", "Tensors the conductor tracks for live requests.");
    fprintf(f, "baton_tensors_held %zu\n", gg->tensors_held);
    family(f, "baton_tensor_table_entries", "gauge",
           "Tensors on workers the conductor's table knows of (inputs being placed included); "
           "0 when no request is in flight.");
    fprintf(f, "baton_tensor_table_entries %zu\n", gg->tensor_entries);
    family(f, "baton_client_backlog_bytes", "gauge",
           "Reply bytes held for client connections that have not read them yet.");
    fprintf(f, "baton_client_backlog_bytes %llu\n", (unsigned long long)gg->client_backlog_bytes);
    family(f, "baton_clients_dropped_total", "counter",
           "Client connections dropped for leaving their replies unread past "
           "client_stall_timeout_ms (or twice client_max_reply_bytes); their requests were "
           "cancelled.");
    fprintf(f, "baton_clients_dropped_total %llu\n", (unsigned long long)m->clients_dropped);
    family(f, "baton_auth_refused_total", "counter",
           "Peers refused on a CURVE socket: by the ZAP handler (their public key is not "
           "authorized for that socket: daemon.curve client_keys or worker_keys), or because "
           "their handshake failed before the key was checked (no CURVE at all).");
    fprintf(f, "baton_auth_refused_total{socket=\"client\"} %llu\n",
            (unsigned long long)gg->auth_refused_client);
    fprintf(f, "baton_auth_refused_total{socket=\"worker\"} %llu\n",
            (unsigned long long)gg->auth_refused_worker);
    family(f, "baton_worker_registrations_refused_total", "counter",
           "Registers refused because the peer may not speak for the worker it names: an "
           "unknown name, or under CURVE a key that is not that worker's (reason says which).");
    for (size_t i = 0; i < gg->n_registrations_refused; i++)
        fprintf(f, "baton_worker_registrations_refused_total{reason=\"%s\"} %llu\n",
                gg->registrations_refused[i].label,
                (unsigned long long)gg->registrations_refused[i].n);
    worker_family(f, gg, "baton_pool_bytes_used", "gauge", "Bytes allocated in a worker's pool.",
                  W_POOL_USED);
    worker_family(f, gg, "baton_pool_bytes_free", "gauge", "Bytes free in a worker's pool.",
                  W_POOL_FREE);
    worker_family(f, gg, "baton_pool_fragmentation", "gauge",
                  "Share of a worker pool's free bytes outside its largest free block (0..1).",
                  W_FRAG);
    worker_family(f, gg, "baton_worker_up", "gauge",
                  "1 when the worker is registered and every model it holds is loaded.", W_UP);
    worker_family(f, gg, "baton_worker_restarts_total", "counter",
                  "Times the conductor restarted the worker after losing it.", W_RESTARTS);
    worker_family(f, gg, "baton_worker_staged_bytes_total", "counter",
                  "Bytes a worker copied to assemble node inputs: joins of chunks or fan-in "
                  "parts, and values moved between host and GPU memory or between GPUs.  An "
                  "edge read in place adds nothing.  Starts at 0 with each incarnation of the "
                  "worker.", W_STAGED);
    worker_family(f, gg, "baton_worker_sessions", "gauge",
                  "Per-request backend sessions (e.g. KV caches) open on a worker.", W_SESSIONS);
    worker_family(f, gg, "baton_worker_tp_steps_total", "counter",
                  "Steps of a tensor-parallel model's rank 0 that a worker ran as one of the "
                  "other ranks.  Starts at 0 with each incarnation of the worker.", W_TP_STEPS);
    worker_family(f, gg, "baton_worker_inline_batches_total", "counter",
                  "Batches a CPU worker's I/O thread ran itself, without handing them to a "
                  "lane: those of models whose last batches each ran within the worker's "
                  "inline_us.  Starts at 0 with each incarnation of the worker.", W_INLINE);
    family(f, "baton_worker_ipc_opens_total", "counter",
           "Peers' CUDA pools a worker opened by CUDA IPC: when='ahead' as the peers came up "
           "(those on its own GPU, and those the graphs can bring it tensors from), "
           "when='request' on a request's path (a read the graphs did not foresee, or a pool "
           "whose opening ahead failed).  Starts at 0 with each incarnation of the worker.");
    for (size_t w = 0; w < gg->n_workers; w++) {
        const metrics_worker *wk = &gg->workers[w];
        fprintf(f, "baton_worker_ipc_opens_total{worker=\"%s\",when=\"ahead\"} %llu\n",
                wk->name, (unsigned long long)wk->ipc_ahead);
        fprintf(f, "baton_worker_ipc_opens_total{worker=\"%s\",when=\"request\"} %llu\n",
                wk->name, (unsigned long long)wk->ipc_on_request);
    }
    family(f, "baton_worker_messages_total", "counter",
           "Protocol messages between the conductor and a worker, by direction.");
    for (size_t w = 0; w < gg->n_workers; w++)
        fprintf(f, "baton_worker_messages_total{worker=\"%s\",direction=\"to_worker\"} %llu\n"
                   "baton_worker_messages_total{worker=\"%s\",direction=\"from_worker\"} %llu\n",
                gg->workers[w].name, (unsigned long long)gg->workers[w].msgs_out,
                gg->workers[w].name, (unsigned long long)gg->workers[w].msgs_in);
    family(f, "baton_worker_zmq_messages_total", "counter",
           "ZeroMQ messages that carried them: each side sends what one round of its loop had "
           "for the other as one message of several frames.");
    for (size_t w = 0; w < gg->n_workers; w++)
        fprintf(f, "baton_worker_zmq_messages_total{worker=\"%s\",direction=\"to_worker\"} %llu\n"
                   "baton_worker_zmq_messages_total{worker=\"%s\",direction=\"from_worker\"} "
                   "%llu\n",
                gg->workers[w].name, (unsigned long long)gg->workers[w].zmq_out,
                gg->workers[w].name, (unsigned long long)gg->workers[w].zmq_in);
    cache_family(f, m, "baton_prefix_cache_hits_total", "counter",
                 "Prompts that read a cached prefix instead of computing it (per worker and "
                 "model; from the load on that incarnation of the worker).", C_HITS);
    cache_family(f, m, "baton_prefix_cache_misses_total", "counter",
                 "Prompts that found no cached prefix.", C_MISSES);
    cache_family(f, m, "baton_prefix_cache_hit_tokens_total", "counter",
                 "Prompt tokens read from the prefix cache.", C_HIT_TOKENS);
    cache_family(f, m, "baton_prefix_cache_evictions_total", "counter",
                 "Cached prefixes dropped for room (a slot needed, or the host budget full).",
                 C_EVICTIONS);
    cache_family(f, m, "baton_prefix_cache_bytes", "gauge",
                 "Bytes of KV the prefix cache holds, in decode slots and in host memory.",
                 C_BYTES);
    cache_family(f, m, "baton_prefix_cache_entries", "gauge",
                 "Cached prefixes (one per ended request kept).", C_ENTRIES);
    route_family(f, gg);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}
