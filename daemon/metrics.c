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

typedef struct graph_stats {
    uint64_t by_code[N_CODES];
    uint64_t buckets[N_BUCKETS]; /* cumulative counts are computed when printed */
    uint64_t latency_count;
    double latency_sum_s;
    node_stats *nodes;           /* per entity */
} graph_stats;

struct metrics {
    const graph_set *gs;         /* borrowed */
    graph_stats *graphs;         /* per graph */
    size_t n_graphs;
    uint64_t rejected[N_CODES];  /* refusals at the door, by code */
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

char *metrics_text(const metrics *m, const metrics_gauges *gg)
{
    const graph_set *set = m->gs;
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
                        set->graphs[g].name, bt_code_name((bt_code)k),
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
                    set->graphs[g].name, bucket_s[b], (unsigned long long)cum);
        }
        fprintf(f, "baton_request_duration_seconds_bucket{graph=\"%s\",le=\"+Inf\"} %llu\n",
                set->graphs[g].name, (unsigned long long)gs->latency_count);
        fprintf(f, "baton_request_duration_seconds_sum{graph=\"%s\"} %.6f\n",
                set->graphs[g].name, gs->latency_sum_s);
        fprintf(f, "baton_request_duration_seconds_count{graph=\"%s\"} %llu\n",
                set->graphs[g].name, (unsigned long long)gs->latency_count);
    }
    fprintf(f, "# HELP baton_node_exec_seconds Node execution time on its worker.\n"
               "# TYPE baton_node_exec_seconds summary\n");
    for (size_t g = 0; g < m->n_graphs; g++) {
        const graph *gr = &set->graphs[g];
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
    fprintf(f, "# HELP baton_inflight_requests Requests accepted and not yet answered.\n"
               "# TYPE baton_inflight_requests gauge\nbaton_inflight_requests %zu\n",
            gg->inflight);
    fprintf(f, "# HELP baton_queue_depth Work waiting: requests placing inputs, and items "
               "queued on workers.\n# TYPE baton_queue_depth gauge\n"
               "baton_queue_depth{where=\"conductor\"} %zu\n", gg->placing);
    fprintf(f, "# HELP baton_tensors_held Tensors the conductor tracks for live requests.\n"
               "# TYPE baton_tensors_held gauge\nbaton_tensors_held %zu\n", gg->tensors_held);
    fprintf(f, "# HELP baton_pool_bytes_used Bytes allocated in a worker's pool.\n"
               "# TYPE baton_pool_bytes_used gauge\n");
    for (size_t w = 0; w < gg->n_workers; w++) {
        const metrics_worker *wk = &gg->workers[w];
        fprintf(f, "baton_pool_bytes_used{worker=\"%s\"} %llu\n", wk->name,
                (unsigned long long)wk->pool_used);
        fprintf(f, "baton_pool_bytes_free{worker=\"%s\"} %llu\n", wk->name,
                (unsigned long long)wk->pool_free);
        fprintf(f, "baton_pool_fragmentation{worker=\"%s\"} %.4f\n", wk->name,
                wk->fragmentation);
        fprintf(f, "baton_queue_depth{where=\"%s\"} %u\n", wk->name, wk->queued);
        fprintf(f, "baton_worker_up{worker=\"%s\"} %d\n", wk->name, wk->up);
        fprintf(f, "baton_worker_restarts_total{worker=\"%s\"} %llu\n", wk->name,
                (unsigned long long)wk->restarts);
    }
    fprintf(f, "# HELP baton_worker_staged_bytes_total Bytes a worker copied to assemble node "
               "inputs: joins of chunks or fan-in parts, and values moved between host and GPU "
               "memory or between GPUs.  An edge read in place adds nothing.  Starts at 0 "
               "with each incarnation of the worker.\n"
               "# TYPE baton_worker_staged_bytes_total counter\n");
    for (size_t w = 0; w < gg->n_workers; w++)
        fprintf(f, "baton_worker_staged_bytes_total{worker=\"%s\"} %llu\n",
                gg->workers[w].name, (unsigned long long)gg->workers[w].staged_bytes);
    fprintf(f, "# HELP baton_worker_sessions Per-request backend sessions (e.g. KV caches) "
               "open on a worker.\n"
               "# TYPE baton_worker_sessions gauge\n");
    for (size_t w = 0; w < gg->n_workers; w++)
        fprintf(f, "baton_worker_sessions{worker=\"%s\"} %u\n", gg->workers[w].name,
                gg->workers[w].sessions);
    fprintf(f, "# HELP baton_worker_tp_steps_total Steps of a tensor-parallel model's rank 0 "
               "that a worker ran as one of the other ranks.  Starts at 0 with each "
               "incarnation of the worker.\n"
               "# TYPE baton_worker_tp_steps_total counter\n");
    for (size_t w = 0; w < gg->n_workers; w++)
        fprintf(f, "baton_worker_tp_steps_total{worker=\"%s\"} %llu\n", gg->workers[w].name,
                (unsigned long long)gg->workers[w].tp_steps);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}
