/* Roofline costs and list scheduling onto streams (kernels/sched.h). */
#include "kernels/sched.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The built-in device profiles: the one table of them (the config's
 * `devices:` entries start from these when they share a name).  h100 is an
 * H100 SXM (dense BF16 peak, NVLink per direction); h200 differs only in
 * memory bandwidth.  The cpu profile is this machine class, measured on it
 * (2 cores of an AMD EPYC with AVX2/FMA): a 256 MiB memcpy moves ~30 GB/s
 * (read + write); a single-core FMA loop reaches ~100 GFLOP/s, so two cores
 * peak near 0.2 TFLOP/s.  "Collectives" on a CPU are copies between
 * threads' buffers: half the memory bandwidth.  A cross-thread event (mutex
 * + condvar wake-up) costs ~10 us.  A worker whose YAML names another
 * profile gets that one instead. */
static const ks_profile builtin[] = {
    {"h100", 3350, 0.8, 989, 450, 0.7, 5},
    {"h200", 4800, 0.8, 989, 450, 0.7, 5},
    {"cpu", 30, 0.6, 0.2, 15, 0.5, 10},
};

const ks_profile *ks_profile_builtins(size_t *n)
{
    *n = sizeof(builtin) / sizeof(builtin[0]);
    return builtin;
}

const ks_profile *ks_profile_builtin(const char *name)
{
    for (size_t i = 0; name && i < sizeof(builtin) / sizeof(builtin[0]); i++)
        if (strcmp(builtin[i].name, name) == 0)
            return &builtin[i];
    return NULL;
}

static double floor_cost(double c)
{
    return c > KS_MIN_COST_S ? c : KS_MIN_COST_S;
}

double ks_op_cost(const ks_profile *p, const kg_graph *g, size_t op)
{
    const kg_op *o = &g->ops[op];
    double mem_bw = p->memory_bandwidth_gbps * 1e9 * p->memory_efficiency;
    double comm_bw = p->comm_bandwidth_gbps * 1e9 * p->comm_efficiency;
    double peak = p->tflops * 1e12;
    double bytes = o->bytes >= 0 ? o->bytes : kg_op_io_bytes(g, op);
    double compute = 0, comm = 0;
    krole role = kop_role(o->op);
    if (role != KROLE_COMM) {
        compute = mem_bw > 0 ? bytes / mem_bw : 0;
        if (o->flops >= 0 && peak > 0 && o->flops / peak > compute)
            compute = o->flops / peak;
    }
    if (role != KROLE_COMPUTE)
        comm = comm_bw > 0 ? bytes / comm_bw : 0;
    return floor_cost(compute + comm);
}

void ks_schedule_destroy(ks_schedule *s)
{
    if (!s)
        return;
    free(s->cost);
    free(s->rank);
    free(s->stream);
    free(s->start);
    free(s->end);
    free(s->order);
    for (int i = 0; i < KS_MAX_STREAMS; i++)
        free(s->stream_ops[i]);
    free(s->wait_off);
    free(s->wait_op);
    free(s->records);
    free(s);
}

/* Consumers of each op, CSR over data edges (an op reading a value another
 * op wrote; handles count from their last writer before the reader). */
typedef struct edges {
    size_t *off;
    int *dst;
} edges;

/* Producer ops of op I's inputs, deduplicated, into P; returns how many.
 * A handle read by op I depends on the last earlier op that wrote it. */
#define KS_MAX_PREDS 64  /* distinct ops one op waits for */

static int preds_of(const kg_graph *g, size_t i, int *p)
{
    const kg_op *o = &g->ops[i];
    int n = 0;
    for (int k = 0; k < o->n_in; k++) {
        int v = o->in[k];
        int prod = -1;
        if (g->values[v].kind == KG_HANDLE) {
            for (size_t j = i; j-- > 0 && prod < 0;)
                for (int m = 0; m < g->ops[j].n_out; m++)
                    if (g->ops[j].out[m] == v)
                        prod = (int)j;
        } else {
            prod = g->values[v].producer;
        }
        if (prod < 0 || prod >= (int)i)
            continue;
        bool dup = false;
        for (int m = 0; m < n; m++)
            dup |= p[m] == prod;
        if (!dup)
            p[n++] = prod;
    }
    /* An op writing a handle follows the previous writer of it and every
     * reader since (write after read: it may not overwrite state an earlier
     * op on another stream still reads). */
    for (int k = 0; k < o->n_out; k++) {
        int v = o->out[k];
        if (g->values[v].kind != KG_HANDLE)
            continue;
        for (size_t j = i; j-- > 0;) {
            bool w = false, r = false;
            for (int m = 0; m < g->ops[j].n_out; m++)
                w |= g->ops[j].out[m] == v;
            for (int m = 0; m < g->ops[j].n_in; m++)
                r |= g->ops[j].in[m] == v;
            if (w || r) {
                bool dup = false;
                for (int m = 0; m < n; m++)
                    dup |= p[m] == (int)j;
                if (!dup) {
                    assert(n < KS_MAX_PREDS && "too many ordering predecessors");
                    p[n++] = (int)j;
                }
            }
            if (w)
                break;
        }
    }
    return n;
}

static int edges_build(const kg_graph *g, edges *e)
{
    size_t n = g->n_ops;
    int p[KS_MAX_PREDS];
    e->off = calloc(n + 1, sizeof(size_t));
    size_t total = 0;
    if (!e->off)
        return BT_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int np = preds_of(g, i, p);
        for (int k = 0; k < np; k++)
            e->off[p[k] + 1]++;
        total += (size_t)np;
    }
    for (size_t i = 0; i < n; i++)
        e->off[i + 1] += e->off[i];
    e->dst = malloc((total ? total : 1) * sizeof(int));
    size_t *fill = malloc((n ? n : 1) * sizeof(size_t));
    if (!e->dst || !fill) {
        free(fill);
        return BT_ENOMEM;
    }
    memcpy(fill, e->off, n * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        int np = preds_of(g, i, p);
        for (int k = 0; k < np; k++)
            e->dst[fill[p[k]]++] = (int)i;
    }
    free(fill);
    return 0;
}

static int by_rank(const void *pa, const void *pb, void *arg)
{
    const double *rank = arg;
    int a = *(const int *)pa, b = *(const int *)pb;
    if (rank[a] != rank[b])
        return rank[a] > rank[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

static int by_start(const void *pa, const void *pb, void *arg)
{
    const double *start = arg;
    int a = *(const int *)pa, b = *(const int *)pb;
    if (start[a] != start[b])
        return start[a] < start[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* List scheduling in rank order; fills stream/start/end and the per-stream
 * lists, returns the makespan. */
static double list_schedule(const kg_graph *g, ks_schedule *s, const ks_config *cfg,
                            const int *by_rank_order, const int *preds, const size_t *pred_off)
{
    double free_at[KS_MAX_STREAMS] = {0};
    int comm = cfg->n_comm ? cfg->n_compute : -1;
    double makespan = 0;
    for (int k = 0; k < s->n_streams; k++)
        s->stream_n[k] = 0;
    for (size_t r = 0; r < s->n_ops; r++) {
        int i = by_rank_order[r];
        krole role = kop_role(g->ops[i].op);
        int lo = 0, hi = cfg->n_compute;  /* candidate streams [lo, hi) */
        if (role == KROLE_COMM && comm >= 0) {
            lo = comm;
            hi = comm + 1;
        }
        bool hold_comm = role == KROLE_HYBRID && comm >= 0;
        int best = -1;
        double best_start = 0, best_end = 0;
        for (int st = lo; st < hi; st++) {
            double t = free_at[st];
            if (hold_comm && free_at[comm] > t)
                t = free_at[comm];
            for (size_t q = pred_off[i]; q < pred_off[i + 1]; q++) {
                int p = preds[q];
                double ready = s->end[p] + (s->stream[p] != st ? cfg->sync_s : 0);
                if (ready > t)
                    t = ready;
            }
            double e = t + s->cost[i];
            if (best < 0 || e < best_end) {
                best = st;
                best_start = t;
                best_end = e;
            }
        }
        s->stream[i] = best;
        s->start[i] = best_start;
        s->end[i] = best_end;
        free_at[best] = best_end;
        s->stream_ops[best][s->stream_n[best]++] = i;
        if (hold_comm) {
            free_at[comm] = best_end;
            s->stream_ops[comm][s->stream_n[comm]++] = i;
        }
        if (best_end > makespan)
            makespan = best_end;
    }
    return makespan;
}

int ks_schedule_build(const kg_graph *g, const double *cost_s, const ks_config *cfg,
                      ks_schedule **out)
{
    *out = NULL;
    if (!g || !cfg || cfg->n_compute < 1 || cfg->n_comm < 0 || cfg->n_comm > 1 ||
        cfg->n_compute + cfg->n_comm > KS_MAX_STREAMS)
        return BT_EINVAL;
    size_t n = g->n_ops;
    size_t n1 = n ? n : 1;
    ks_schedule *s = calloc(1, sizeof(*s));
    edges e = {0};
    int *rorder = malloc(n1 * sizeof(int));
    int *preds = NULL;
    size_t *pred_off = calloc(n + 1, sizeof(size_t));
    int rc = BT_ENOMEM;
    if (!s || !rorder || !pred_off)
        goto err;
    s->n_ops = n;
    s->n_compute = cfg->n_compute;
    s->n_streams = cfg->n_compute + cfg->n_comm;
    s->cost = malloc(n1 * sizeof(double));
    s->rank = malloc(n1 * sizeof(double));
    s->stream = malloc(n1 * sizeof(int));
    s->start = malloc(n1 * sizeof(double));
    s->end = malloc(n1 * sizeof(double));
    s->order = malloc(n1 * sizeof(int));
    s->records = calloc(n1, sizeof(bool));
    s->wait_off = calloc(n + 1, sizeof(size_t));
    if (!s->cost || !s->rank || !s->stream || !s->start || !s->end || !s->order ||
        !s->records || !s->wait_off)
        goto err;
    for (int k = 0; k < s->n_streams; k++)
        if (!(s->stream_ops[k] = malloc(n1 * sizeof(int))))
            goto err;
    if ((rc = edges_build(g, &e)))
        goto err;
    rc = BT_ENOMEM;
    /* Predecessor lists (the reverse of E). */
    {
        int p[KS_MAX_PREDS];
        for (size_t i = 0; i < n; i++)
            pred_off[i + 1] = pred_off[i] + (size_t)preds_of(g, i, p);
        preds = malloc((pred_off[n] ? pred_off[n] : 1) * sizeof(int));
        if (!preds)
            goto err;
        for (size_t i = 0; i < n; i++)
            preds_of(g, i, preds + pred_off[i]);
    }
    for (size_t i = 0; i < n; i++)
        s->cost[i] = cost_s ? (cost_s[i] > KS_MIN_COST_S ? cost_s[i] : KS_MIN_COST_S)
                            : KS_MIN_COST_S;
    /* Upward ranks, consumers before producers (graph order is topological). */
    for (size_t i = n; i-- > 0;) {
        double m = 0;
        for (size_t q = e.off[i]; q < e.off[i + 1]; q++) {
            double r = s->rank[e.dst[q]] + cfg->sync_s;
            if (r > m)
                m = r;
        }
        s->rank[i] = s->cost[i] + m;
    }
    s->serial_s = 0;
    for (size_t i = 0; i < n; i++) {
        s->serial_s += s->cost[i];
        rorder[i] = (int)i;
    }
    /* Ranks strictly decrease along edges (every cost is > 0), so rank order
     * is a topological order. */
    qsort_r(rorder, n, sizeof(int), by_rank, s->rank);
    s->multi_s = list_schedule(g, s, cfg, rorder, preds, pred_off);
    s->multi = !cfg->force_serial && s->n_streams > 1 && s->multi_s < s->serial_s;
    if (!s->multi) {
        double t = 0;
        for (int k = 0; k < s->n_streams; k++)
            s->stream_n[k] = 0;
        for (size_t i = 0; i < n; i++) {
            s->stream[i] = 0;
            s->start[i] = t;
            t += s->cost[i];
            s->end[i] = t;
            s->stream_ops[0][s->stream_n[0]++] = (int)i;
        }
    }
    for (size_t i = 0; i < n; i++)
        s->order[i] = (int)i;
    qsort_r(s->order, n, sizeof(int), by_start, s->start);
    /* Events: an op waits for each producer on another stream. */
    {
        size_t nw = 0;
        for (size_t i = 0; i < n; i++)
            for (size_t q = pred_off[i]; q < pred_off[i + 1]; q++)
                nw += s->stream[preds[q]] != s->stream[i];
        s->wait_op = malloc((nw ? nw : 1) * sizeof(int));
        if (!s->wait_op)
            goto err;
        nw = 0;
        for (size_t i = 0; i < n; i++) {
            s->wait_off[i] = nw;
            for (size_t q = pred_off[i]; q < pred_off[i + 1]; q++) {
                int p = preds[q];
                if (s->stream[p] == s->stream[i])
                    continue;
                s->wait_op[nw++] = p;
                if (!s->records[p]) {
                    s->records[p] = true;
                    s->n_events++;
                }
            }
        }
        s->wait_off[n] = nw;
    }
    free(e.off);
    free(e.dst);
    free(rorder);
    free(preds);
    free(pred_off);
    *out = s;
    return 0;
err:
    free(e.off);
    free(e.dst);
    free(rorder);
    free(preds);
    free(pred_off);
    ks_schedule_destroy(s);
    return rc;
}

int ks_schedule_report(const ks_schedule *s, const kg_graph *g, char *buf, size_t len)
{
    size_t used = 0;
    int total = 0;
#define EMIT(...)                                                                  \
    do {                                                                           \
        int w_ = snprintf(buf ? buf + used : NULL, used < len ? len - used : 0,    \
                          __VA_ARGS__);                                            \
        if (w_ > 0) {                                                              \
            total += w_;                                                           \
            used = used + (size_t)w_ < len ? used + (size_t)w_ : (len ? len - 1 : 0); \
        }                                                                          \
    } while (0)
    double gain = s->multi_s > 0 ? s->serial_s / s->multi_s : 0;
    EMIT("schedule: %zu ops, %d compute + %d comm streams; predicted serial %.1f us, "
         "multi-stream %.1f us (%.2fx); decision: %s; %zu events\n",
         s->n_ops, s->n_compute, s->n_streams - s->n_compute, s->serial_s * 1e6,
         s->multi_s * 1e6, gain, s->multi ? "multi-stream" : "serial", s->n_events);
    for (int k = 0; k < s->n_streams; k++) {
        if (!s->multi && k > 0)
            break;
        EMIT("  stream %d (%s):", k, k < s->n_compute ? "compute" : "comm");
        for (size_t j = 0; j < s->stream_n[k]; j++) {
            int i = s->stream_ops[k][j];
            EMIT(" %s#%d%s", kop_name(g->ops[i].op), i, s->stream[i] != k ? "(held)" : "");
        }
        EMIT("\n");
    }
#undef EMIT
    return total;
}
