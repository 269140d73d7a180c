/* Executable graphs (kernels/exec.h) on two kinds of device.
 *
 * The CPU device: streams are threads, events are per-op generation numbers
 * under one mutex and condition variable.  One lock for all events is
 * deliberate: a graph has at most a few streams and events only at
 * cross-stream edges, so contention is low, and a single lock makes the
 * hybrid reservation (the comm stream holds still while a fused op runs) a
 * plain wait on the same condvar.
 *
 * A queued device (CUDA): the caller's thread walks the schedule's dispatch
 * order once per run and enqueues each op on its stream, waiting on the
 * events of its producers on other streams.  Dispatch order is by predicted
 * start, which respects every stream's own order and every dependency, so a
 * wait always names an event whose record was already enqueued. */
#include "kernels/exec.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/arena.h"

/* Where a parameter's bytes are. */
enum { PARAM_UNSET = 0, PARAM_COPIED = 1, PARAM_BORROWED = 2 };

typedef struct kx_stream {
    kx_exec *x;
    int id;
    pthread_t thread;
    bool started;
} kx_stream;

/* A captured graph for one extent. */
typedef struct kx_graph_entry {
    int64_t extent;
    void *graph;                 /* the device's; destroyed with the executable */
} kx_graph_entry;

struct kx_exec {
    kg_graph g;                  /* owned copy of the graph */
    const kx_device *dev;
    kx_op_table ops;
    ks_schedule *sched;
    ka_graph_plan plan;
    uint8_t *arena;              /* owned, plan.arena bytes */
    void **ptr;                  /* per value: its memory (arena, param, handle, input) */
    size_t *bound_bytes;         /* per input slot: bytes bound; 0 unbound */
    uint8_t *param_state;        /* per value: PARAM_UNSET, _COPIED or _BORROWED */
    int64_t upper, extent;       /* dynamic extents */
    int n_threads;               /* streams with a thread */
    kx_stream streams[KS_MAX_STREAMS];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool sync_init;
    uint64_t gen;                /* commit generation, guarded by mu */
    uint64_t *done_gen;          /* per op: gen of its last completion (event) */
    uint64_t *held_gen;          /* per op: gen the comm stream reserved it */
    int finished;                /* streams done with this gen */
    bool stop;
    bool pending;                /* a commit not yet synced (caller's thread only) */
    int err;                     /* first op error of this gen */
    int err_op;                  /* the op that returned it */
    char *report;
    /* Queued devices only. */
    int n_queues;                /* native streams in use */
    void *q[KS_MAX_STREAMS];     /* the device's streams */
    void **ev;                   /* per op: its event (ops that record) */
    void **ev_hold;              /* per op: the comm stream's reservation event (fused ops) */
    void *ev_fork;               /* stream 0 -> the others at the start of a run */
    void *ev_join[KS_MAX_STREAMS]; /* the others -> stream 0 at the end */
    void **in_buf;               /* per input slot: a device buffer at the upper extent */
    const void **in_src;         /* per input slot: the caller's memory */
    int32_t *flag;               /* device word ops set on bad data */
    bool graphs;
    kx_graph_entry *graph_cache; /* owned */
    int n_graphs;
    uint64_t replays;
};

/* ---- the CPU device ---------------------------------------------------------- */

/* calloc, over-allocated by one alignment unit, rather than aligned_alloc
 * and memset: a large block comes from fresh pages that the kernel zeroes
 * on first touch, so a KV cache of hundreds of MiB costs memory only as
 * positions fill.  The block's own start is kept just below the aligned
 * pointer, for cpu_free. */
static int cpu_alloc(void *dev, size_t bytes, void **out)
{
    (void)dev;
    uint8_t *raw = calloc(1, bytes + KA_ALIGN + sizeof(void *));
    if (!raw)
        return -ENOMEM;
    uintptr_t at = ((uintptr_t)raw + sizeof(void *) + KA_ALIGN - 1) & ~(uintptr_t)(KA_ALIGN - 1);
    ((void **)at)[-1] = raw;
    *out = (void *)at;
    return 0;
}

static void cpu_free(void *dev, void *p)
{
    (void)dev;
    if (p)
        free(((void **)p)[-1]);
}

static int cpu_copy(void *dev, void *dst, const void *src, size_t bytes, void *queue)
{
    (void)dev, (void)queue;
    memcpy(dst, src, bytes);
    return 0;
}

const kx_device *kx_device_cpu(void)
{
    static const kx_device cpu = {"cpu", false, NULL, cpu_alloc, cpu_free, cpu_copy,
                                  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    return &cpu;
}

/* ---- stream threads ------------------------------------------------------ */

static void run_op(kx_exec *x, int stream, int i)
{
    const kg_op *o = &x->g.ops[i];
    kx_op_ctx c = {&x->g, (size_t)i, o, {0}, {0}, x->extent, x->upper, stream, x->ops.user, NULL, NULL};
    for (int k = 0; k < o->n_in; k++)
        c.in[k] = x->ptr[o->in[k]];
    for (int k = 0; k < o->n_out; k++)
        c.out[k] = x->ptr[o->out[k]];
    int rc = x->ops.fn[o->op](&c);
    if (rc) {
        pthread_mutex_lock(&x->mu);
        if (!x->err) {
            x->err_op = i;
            __atomic_store_n(&x->err, rc, __ATOMIC_RELAXED);
        }
        pthread_mutex_unlock(&x->mu);
    }
}

static void *stream_main(void *arg)
{
    kx_stream *st = arg;
    kx_exec *x = st->x;
    const ks_schedule *s = x->sched;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&x->mu);
        while (!x->stop && x->gen == seen)
            pthread_cond_wait(&x->cv, &x->mu);
        if (x->stop) {
            pthread_mutex_unlock(&x->mu);
            return NULL;
        }
        uint64_t gen = seen = x->gen;
        pthread_mutex_unlock(&x->mu);
        for (size_t j = 0; j < s->stream_n[st->id]; j++) {
            int i = s->stream_ops[st->id][j];
            if (s->stream[i] != st->id) {
                /* A fused op's reservation: hold this (comm) stream until
                 * the op is done on its compute stream. */
                pthread_mutex_lock(&x->mu);
                x->held_gen[i] = gen;
                pthread_cond_broadcast(&x->cv);
                while (x->done_gen[i] != gen)
                    pthread_cond_wait(&x->cv, &x->mu);
                pthread_mutex_unlock(&x->mu);
                continue;
            }
            bool hybrid = s->multi && s->n_streams > s->n_compute &&
                          kop_role(x->g.ops[i].op) == KROLE_HYBRID;
            if (hybrid || s->wait_off[i] != s->wait_off[i + 1]) {
                pthread_mutex_lock(&x->mu);
                for (;;) {
                    bool ready = !hybrid || x->held_gen[i] == gen;
                    for (size_t q = s->wait_off[i]; ready && q < s->wait_off[i + 1]; q++)
                        ready = x->done_gen[s->wait_op[q]] == gen;
                    if (ready)
                        break;
                    pthread_cond_wait(&x->cv, &x->mu);
                }
                pthread_mutex_unlock(&x->mu);
            }
            /* Ops after a failure are skipped but still complete their
             * events, so no stream waits forever. */
            if (!__atomic_load_n(&x->err, __ATOMIC_RELAXED))
                run_op(x, st->id, i);
            if (s->records[i] || hybrid) {
                pthread_mutex_lock(&x->mu);
                x->done_gen[i] = gen;
                pthread_cond_broadcast(&x->cv);
                pthread_mutex_unlock(&x->mu);
            }
        }
        pthread_mutex_lock(&x->mu);
        x->finished++;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
    }
}

/* ---- arena conflicts from the schedule's happens-before relation ---------- */

/* Two values may share arena bytes only if every reader of one happens
 * before the writer of the other under the schedule's synchronization
 * (stream order plus events).  In a serial schedule this is the interval
 * test; across streams an order by predicted times would not be safe,
 * since real times differ. */
typedef struct hb_ctx {
    const kg_graph *g;
    size_t words;                /* 64-bit words per op bitset */
    uint64_t *reach;             /* per op: the ops that happen before it */
    uint64_t *uses;              /* per value: its writer and readers */
} hb_ctx;

static bool subset(const uint64_t *a, const uint64_t *b, size_t w)
{
    for (size_t k = 0; k < w; k++)
        if (a[k] & ~b[k])
            return false;
    return true;
}

static bool hb_conflict(void *ctx, size_t a, size_t b)
{
    hb_ctx *h = ctx;
    const kg_value *va = &h->g->values[a], *vb = &h->g->values[b];
    bool a_first = va->kind != KG_OUTPUT &&
                   subset(h->uses + a * h->words, h->reach + (size_t)vb->producer * h->words, h->words);
    bool b_first = vb->kind != KG_OUTPUT &&
                   subset(h->uses + b * h->words, h->reach + (size_t)va->producer * h->words, h->words);
    return !a_first && !b_first;
}

static void bit_set(uint64_t *s, size_t i)
{
    s[i / 64] |= 1ull << (i % 64);
}

static int plan_arena(kx_exec *x)
{
    const kg_graph *g = &x->g;
    const ks_schedule *s = x->sched;
    size_t n = g->n_ops, w = (n + 63) / 64 ? (n + 63) / 64 : 1;
    hb_ctx h = {g, w, calloc((n ? n : 1) * w, 8), calloc((g->n_values ? g->n_values : 1) * w, 8)};
    int *prev = malloc((n ? n : 1) * sizeof(int) * (KS_MAX_STREAMS + 1));
    int rc = BT_ENOMEM;
    if (!h.reach || !h.uses || !prev)
        goto out;
    /* Direct predecessors: the previous entry on each stream the op occupies,
     * and the ops it waits for. */
    int *np = prev;  /* per op: up to KS_MAX_STREAMS+1 entries, -1 padded */
    for (size_t i = 0; i < n * (KS_MAX_STREAMS + 1); i++)
        np[i] = -1;
    for (int k = 0; k < s->n_streams; k++)
        for (size_t j = 1; j < s->stream_n[k]; j++)
            np[(size_t)s->stream_ops[k][j] * (KS_MAX_STREAMS + 1) + (size_t)k] = s->stream_ops[k][j - 1];
    for (size_t t = 0; t < n; t++) {
        int i = s->order[t];
        uint64_t *r = h.reach + (size_t)i * w;
        for (int k = 0; k < KS_MAX_STREAMS; k++) {
            int p = np[(size_t)i * (KS_MAX_STREAMS + 1) + (size_t)k];
            if (p < 0)
                continue;
            bit_set(r, (size_t)p);
            for (size_t m = 0; m < w; m++)
                r[m] |= h.reach[(size_t)p * w + m];
        }
        for (size_t q = s->wait_off[i]; q < s->wait_off[i + 1]; q++) {
            int p = s->wait_op[q];
            bit_set(r, (size_t)p);
            for (size_t m = 0; m < w; m++)
                r[m] |= h.reach[(size_t)p * w + m];
        }
    }
    for (size_t v = 0; v < g->n_values; v++)
        if (g->values[v].producer >= 0)
            bit_set(h.uses + v * w, (size_t)g->values[v].producer);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < g->ops[i].n_in; k++)
            bit_set(h.uses + (size_t)g->ops[i].in[k] * w, i);
    rc = ka_plan_graph(g, s->order, KA_ALIGN, hb_conflict, &h, &x->plan);
out:
    free(h.reach);
    free(h.uses);
    free(prev);
    return rc;
}

/* ---- queued devices ------------------------------------------------------- */

/* Bytes of value V at the current extent. */
static size_t bytes_now(const kx_exec *x, const kg_value *v)
{
    if (!v->dynamic || !x->upper)
        return v->bytes;
    return v->bytes / (size_t)x->upper * (size_t)x->extent;
}


static int queued_setup(kx_exec *x)
{
    const kx_device *d = x->dev;
    void *dv = d->dev;
    const kg_graph *g = &x->g;
    size_t n = g->n_ops ? g->n_ops : 1, ni = g->n_inputs ? (size_t)g->n_inputs : 1;
    x->ev = calloc(n, sizeof(void *));
    x->ev_hold = calloc(n, sizeof(void *));
    x->in_buf = calloc(ni, sizeof(void *));
    x->in_src = calloc(ni, sizeof(void *));
    if (!x->ev || !x->ev_hold || !x->in_buf || !x->in_src)
        return BT_ENOMEM;
    const ks_schedule *s = x->sched;
    x->n_queues = s->multi ? s->n_streams : 1;
    for (int k = 0; k < x->n_queues; k++)
        if (d->queue_create(dv, &x->q[k]))
            return BT_EDEVICE;
    if (x->n_queues > 1) {
        if (d->event_create(dv, &x->ev_fork))
            return BT_EDEVICE;
        for (int k = 1; k < x->n_queues; k++)
            if (d->event_create(dv, &x->ev_join[k]))
                return BT_EDEVICE;
        for (size_t i = 0; i < g->n_ops; i++) {
            bool hybrid = s->n_streams > s->n_compute && kop_role(g->ops[i].op) == KROLE_HYBRID;
            if ((s->records[i] || hybrid) && d->event_create(dv, &x->ev[i]))
                return BT_EDEVICE;
            if (hybrid && d->event_create(dv, &x->ev_hold[i]))
                return BT_EDEVICE;
        }
    }
    if (d->alloc(dv, sizeof(int32_t), (void **)&x->flag))
        return BT_EDEVICE;
    /* Inputs get buffers of their own at the upper extent, so the kernels
     * (and a captured graph) read the same address in every run. */
    for (size_t v = 0; v < g->n_values; v++) {
        const kg_value *val = &g->values[v];
        if (val->kind != KG_INPUT)
            continue;
        if (d->alloc(dv, val->bytes, &x->in_buf[val->slot]))
            return BT_EDEVICE;
        x->ptr[v] = x->in_buf[val->slot];
    }
    return 0;
}

static void queued_teardown(kx_exec *x)
{
    const kx_device *d = x->dev;
    if (!d || !d->queued)
        return;
    void *dv = d->dev;
    for (int k = 0; k < x->n_graphs; k++)
        d->graph_destroy(dv, x->graph_cache[k].graph);
    free(x->graph_cache);
    for (size_t i = 0; x->ev && i < x->g.n_ops; i++) {
        if (x->ev[i])
            d->event_destroy(dv, x->ev[i]);
        if (x->ev_hold[i])
            d->event_destroy(dv, x->ev_hold[i]);
    }
    if (x->ev_fork)
        d->event_destroy(dv, x->ev_fork);
    for (int k = 0; k < KS_MAX_STREAMS; k++) {
        if (x->ev_join[k])
            d->event_destroy(dv, x->ev_join[k]);
        if (x->q[k])
            d->queue_destroy(dv, x->q[k]);
    }
    for (int sl = 0; x->in_buf && sl < x->g.n_inputs; sl++)
        d->free(dv, x->in_buf[sl]);
    d->free(dv, x->flag);
    free(x->ev);
    free(x->ev_hold);
    free(x->in_buf);
    free(x->in_src);
}

/* Enqueues every op once, in dispatch order: stream 0 forks to the others,
 * cross-stream edges become event waits, a fused op first reserves the comm
 * stream (the comm stream records, the op's stream waits, and the comm
 * stream waits for the op), and the others join stream 0 at the end.
 * Returns 0, BT_EOP (an op refused its launch) or BT_EDEVICE. */
static int enqueue_ops(kx_exec *x)
{
    const kx_device *d = x->dev;
    void *dv = d->dev;
    const ks_schedule *s = x->sched;
    int nq = x->n_queues, comm = s->n_compute;
    if (nq > 1) {
        if (d->event_record(dv, x->ev_fork, x->q[0]))
            return BT_EDEVICE;
        for (int k = 1; k < nq; k++)
            if (d->queue_wait(dv, x->q[k], x->ev_fork))
                return BT_EDEVICE;
    }
    for (size_t t = 0; t < x->g.n_ops; t++) {
        int i = s->order[t];
        const kg_op *o = &x->g.ops[i];
        int st = nq > 1 ? s->stream[i] : 0;
        bool hybrid = nq > 1 && x->ev_hold[i];
        if (hybrid && (d->event_record(dv, x->ev_hold[i], x->q[comm]) ||
                       d->queue_wait(dv, x->q[st], x->ev_hold[i])))
            return BT_EDEVICE;
        for (size_t w = s->wait_off[i]; nq > 1 && w < s->wait_off[i + 1]; w++)
            if (d->queue_wait(dv, x->q[st], x->ev[s->wait_op[w]]))
                return BT_EDEVICE;
        kx_op_ctx c = {&x->g, (size_t)i, o, {0}, {0}, x->extent, x->upper, st, x->ops.user,
                       x->q[st], x->flag};
        for (int k = 0; k < o->n_in; k++)
            c.in[k] = x->ptr[o->in[k]];
        for (int k = 0; k < o->n_out; k++)
            c.out[k] = x->ptr[o->out[k]];
        int rc = x->ops.fn[o->op](&c);
        if (rc) {
            x->err = rc;
            x->err_op = i;
            return BT_EOP;
        }
        if (nq > 1 && x->ev[i] && d->event_record(dv, x->ev[i], x->q[st]))
            return BT_EDEVICE;
        if (hybrid && d->queue_wait(dv, x->q[comm], x->ev[i]))
            return BT_EDEVICE;
    }
    for (int k = 1; k < nq; k++)
        if (d->event_record(dv, x->ev_join[k], x->q[k]) ||
            d->queue_wait(dv, x->q[0], x->ev_join[k]))
            return BT_EDEVICE;
    return 0;
}

/* The captured graph of the current extent, capturing it on first use. */
static int graph_for_extent(kx_exec *x, void **graph)
{
    const kx_device *d = x->dev;
    for (int k = 0; k < x->n_graphs; k++)
        if (x->graph_cache[k].extent == x->extent) {
            *graph = x->graph_cache[k].graph;
            x->replays++;
            return 0;
        }
    kx_graph_entry *gc = realloc(x->graph_cache, (size_t)(x->n_graphs + 1) * sizeof(*gc));
    if (!gc)
        return BT_ENOMEM;
    x->graph_cache = gc;
    if (d->capture_begin(d->dev, x->q[0]))
        return BT_EDEVICE;
    int rc = enqueue_ops(x);
    void *g = NULL;
    /* Capture must end even when an op refused, or the stream stays in
     * capture mode. */
    int end = d->capture_end(d->dev, x->q[0], &g);
    if (rc || end || !g) {
        if (g)
            d->graph_destroy(d->dev, g);
        return rc ? rc : BT_EDEVICE;
    }
    x->graph_cache[x->n_graphs++] = (kx_graph_entry){x->extent, g};
    *graph = g;
    return 0;
}

static int queued_commit(kx_exec *x)
{
    const kx_device *d = x->dev;
    static const int32_t zero = 0;
    x->err = 0;
    x->err_op = -1;
    /* Before the ops (and outside any capture): clear the data flag and
     * copy the inputs in, since the caller's addresses change per run. */
    if (d->copy(d->dev, x->flag, &zero, sizeof(zero), x->q[0]))
        return BT_EDEVICE;
    for (size_t v = 0; v < x->g.n_values; v++) {
        const kg_value *val = &x->g.values[v];
        if (val->kind == KG_INPUT &&
            d->copy(d->dev, x->in_buf[val->slot], x->in_src[val->slot], bytes_now(x, val), x->q[0]))
            return BT_EDEVICE;
    }
    int rc;
    if (x->graphs) {
        void *g;
        if (!(rc = graph_for_extent(x, &g)) && d->graph_launch(d->dev, g, x->q[0]))
            rc = BT_EDEVICE;
    } else {
        rc = enqueue_ops(x);
    }
    if (rc) {
        /* Work already enqueued must finish before the caller reuses
         * anything. */
        d->queue_sync(d->dev, x->q[0]);
        for (int k = 1; k < x->n_queues; k++)
            d->queue_sync(d->dev, x->q[k]);
        return rc;
    }
    x->pending = true;
    return 0;
}

static int queued_sync(kx_exec *x)
{
    const kx_device *d = x->dev;
    int32_t flag = 0;
    x->pending = false;
    if (d->queue_sync(d->dev, x->q[0]) || d->copy(d->dev, &flag, x->flag, sizeof(flag), NULL)) {
        x->err = -EIO;
        return BT_EDEVICE;
    }
    if (flag) {
        x->err = -flag;  /* an op found bad data; which one is not known */
        x->err_op = -1;
        return BT_EOP;
    }
    return 0;
}

/* ---- compile and run ------------------------------------------------------ */

int kx_compile(const kg_graph *g, const kx_op_table *ops, const kx_options *opt, kx_exec **out)
{
    *out = NULL;
    if (!g || !ops)
        return BT_EINVAL;
    kx_options o = opt ? *opt : (kx_options){0};
    if (o.n_compute <= 0)
        o.n_compute = 1;
    const ks_profile *prof = o.profile ? o.profile : ks_profile_builtin("cpu");
    for (size_t i = 0; i < g->n_ops; i++)
        if (!ops->fn[g->ops[i].op])
            return BT_ENOOP;
    kx_exec *x = calloc(1, sizeof(*x));
    double *cost = NULL;
    int rc = BT_ENOMEM;
    if (!x)
        return BT_ENOMEM;
    x->ops = *ops;
    x->dev = o.device ? o.device : kx_device_cpu();
    x->graphs = o.graphs && x->dev->queued && x->dev->capture_begin;
    x->g.n_values = x->g.cap_values = g->n_values;
    x->g.n_ops = x->g.cap_ops = g->n_ops;
    x->g.n_inputs = g->n_inputs;
    x->g.n_outputs = g->n_outputs;
    x->g.values = malloc((g->n_values ? g->n_values : 1) * sizeof(kg_value));
    x->g.ops = malloc((g->n_ops ? g->n_ops : 1) * sizeof(kg_op));
    x->ptr = calloc(g->n_values ? g->n_values : 1, sizeof(void *));
    x->param_state = calloc(g->n_values ? g->n_values : 1, 1);
    x->bound_bytes = calloc(g->n_inputs ? (size_t)g->n_inputs : 1, sizeof(size_t));
    x->done_gen = calloc(g->n_ops ? g->n_ops : 1, sizeof(uint64_t));
    x->held_gen = calloc(g->n_ops ? g->n_ops : 1, sizeof(uint64_t));
    cost = malloc((g->n_ops ? g->n_ops : 1) * sizeof(double));
    if (!x->g.values || !x->g.ops || !x->ptr || !x->param_state || !x->bound_bytes ||
        !x->done_gen || !x->held_gen || !cost)
        goto err;
    memcpy(x->g.values, g->values, g->n_values * sizeof(kg_value));
    memcpy(x->g.ops, g->ops, g->n_ops * sizeof(kg_op));
    rc = BT_EINVAL;
    for (size_t v = 0; v < g->n_values; v++) {
        const kg_value *val = &g->values[v];
        if (!val->dynamic)
            continue;
        if (x->upper && x->upper != val->shape[0])
            goto err;  /* one bucketed extent per executable */
        x->upper = val->shape[0];
    }
    x->extent = x->upper;
    for (size_t i = 0; i < g->n_ops; i++)
        cost[i] = o.cost_s ? o.cost_s[i] : ks_op_cost(prof, g, i);
    ks_config kc = {o.n_compute, o.n_comm, prof->sync_overhead_us * 1e-6, o.force_serial};
    if ((rc = ks_schedule_build(&x->g, cost, &kc, &x->sched)))
        goto err;
    if ((rc = plan_arena(x)))
        goto err;
    rc = BT_EDEVICE;
    if (x->plan.arena && x->dev->alloc(x->dev->dev, x->plan.arena, (void **)&x->arena))
        goto err;
    for (size_t v = 0; v < g->n_values; v++) {
        const kg_value *val = &g->values[v];
        if (x->plan.offset[v] != KA_NONE) {
            x->ptr[v] = x->arena + x->plan.offset[v];
        } else if (val->kind == KG_PARAM || val->kind == KG_HANDLE ||
                   val->kind == KG_INTER || val->kind == KG_OUTPUT) {
            /* Parameters and handles own their memory; an intermediate no op
             * writes gets zeroed memory so a reader sees defined bytes. */
            if (x->dev->alloc(x->dev->dev, val->bytes, &x->ptr[v]))
                goto err;
        }
    }
    if (x->dev->queued) {
        if ((rc = queued_setup(x)))
            goto err;
    } else {
        rc = BT_ETHREAD;
        if (pthread_mutex_init(&x->mu, NULL) || pthread_cond_init(&x->cv, NULL))
            goto err;
        x->sync_init = true;
        x->n_threads = x->sched->multi ? x->sched->n_streams : 1;
        for (int k = 0; k < x->n_threads; k++) {
            x->streams[k] = (kx_stream){x, k, 0, false};
            if (pthread_create(&x->streams[k].thread, NULL, stream_main, &x->streams[k]))
                goto err;
            x->streams[k].started = true;
        }
    }
    {
        int need = ks_schedule_report(x->sched, &x->g, NULL, 0) + 160;
        if ((x->report = malloc((size_t)need))) {
            int w = ks_schedule_report(x->sched, &x->g, x->report, (size_t)need);
            snprintf(x->report + w, (size_t)need - (size_t)w,
                     "arena: %zu bytes for %zu values, peak-live bound %zu (%.3fx)\n",
                     x->plan.arena, x->plan.n_items, x->plan.lower_bound,
                     x->plan.lower_bound ? (double)x->plan.arena / (double)x->plan.lower_bound : 1.0);
        }
    }
    free(cost);
    *out = x;
    return 0;
err:
    free(cost);
    kx_destroy(x);
    return rc;
}

void kx_destroy(kx_exec *x)
{
    if (!x)
        return;
    if (x->pending)
        kx_sync(x);
    if (x->sync_init) {
        pthread_mutex_lock(&x->mu);
        x->stop = true;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
    }
    for (int k = 0; k < KS_MAX_STREAMS; k++)
        if (x->streams[k].started)
            pthread_join(x->streams[k].thread, NULL);
    if (x->sync_init) {
        pthread_mutex_destroy(&x->mu);
        pthread_cond_destroy(&x->cv);
    }
    queued_teardown(x);
    for (size_t v = 0; x->ptr && v < x->g.n_values; v++)
        if (x->ptr[v] && x->g.values[v].kind != KG_INPUT &&
            (!x->plan.offset || x->plan.offset[v] == KA_NONE) &&
            x->param_state[v] != PARAM_BORROWED)
            x->dev->free(x->dev->dev, x->ptr[v]);
    free(x->ptr);
    if (x->arena)
        x->dev->free(x->dev->dev, x->arena);
    ka_graph_plan_free(&x->plan);
    ks_schedule_destroy(x->sched);
    free(x->g.values);
    free(x->g.ops);
    free(x->param_state);
    free(x->bound_bytes);
    free(x->done_gen);
    free(x->held_gen);
    free(x->report);
    free(x);
}

int kx_param_set(kx_exec *x, const char *name, kdtype dt, const void *data, size_t bytes)
{
    int v = kg_value_find(&x->g, name);
    if (v < 0 || x->g.values[v].kind != KG_PARAM)
        return BT_ENOENT;
    if (x->g.values[v].dtype != dt || x->g.values[v].bytes != bytes)
        return BT_ETYPE;
    if (x->pending)
        return BT_EBUSY;
    if (x->param_state[v] == PARAM_BORROWED) {
        /* It read the caller's memory until now: it needs its own again. */
        void *mem;
        if (x->dev->alloc(x->dev->dev, bytes, &mem))
            return BT_EDEVICE;
        x->ptr[v] = mem;
        x->param_state[v] = PARAM_UNSET;
    }
    if (x->dev->copy(x->dev->dev, x->ptr[v], data, bytes, NULL))
        return BT_EDEVICE;
    x->param_state[v] = PARAM_COPIED;
    return 0;
}

int kx_param_borrow(kx_exec *x, const char *name, kdtype dt, const void *data, size_t bytes)
{
    if (x->dev->owns && !x->dev->owns(x->dev->dev, data))
        return BT_EINVAL;
    int v = kg_value_find(&x->g, name);
    if (v < 0 || x->g.values[v].kind != KG_PARAM)
        return BT_ENOENT;
    if (x->g.values[v].dtype != dt || x->g.values[v].bytes != bytes)
        return BT_ETYPE;
    if (x->pending)
        return BT_EBUSY;
    if (x->param_state[v] != PARAM_BORROWED)
        x->dev->free(x->dev->dev, x->ptr[v]);
    /* Ops only read parameters, so the const is kept in spirit. */
    x->ptr[v] = (void *)data;
    x->param_state[v] = PARAM_BORROWED;
    return 0;
}

int kx_handle_borrow(kx_exec *x, const char *name, void *data, size_t bytes)
{
    if (x->dev->owns && !x->dev->owns(x->dev->dev, data))
        return BT_EINVAL;
    int v = kg_value_find(&x->g, name);
    if (v < 0 || x->g.values[v].kind != KG_HANDLE)
        return BT_ENOENT;
    if (x->g.values[v].bytes != bytes)
        return BT_ETYPE;
    if (x->plan.offset && x->plan.offset[v] != KA_NONE)
        return BT_EINVAL; /* a handle in the arena (none is planned there today) */
    if (x->pending)
        return BT_EBUSY;
    if (x->param_state[v] != PARAM_BORROWED)
        x->dev->free(x->dev->dev, x->ptr[v]);
    x->ptr[v] = data;
    x->param_state[v] = PARAM_BORROWED;
    return 0;
}

void *kx_handle(kx_exec *x, const char *name, size_t *bytes)
{
    int v = kg_value_find(&x->g, name);
    if (v < 0 || x->g.values[v].kind != KG_HANDLE)
        return NULL;
    if (bytes)
        *bytes = x->g.values[v].bytes;
    return x->ptr[v];
}


int kx_input_bind(kx_exec *x, int slot, const void *data, size_t bytes)
{
    if (slot < 0 || slot >= x->g.n_inputs)
        return BT_ENOENT;
    if (x->pending)
        return BT_EBUSY;
    for (size_t v = 0; v < x->g.n_values; v++) {
        const kg_value *val = &x->g.values[v];
        if (val->kind != KG_INPUT || val->slot != slot)
            continue;
        if (bytes < bytes_now(x, val))
            return BT_ETYPE;
        if (x->dev->queued)
            x->in_src[slot] = data;  /* copied into in_buf at commit */
        else
            x->ptr[v] = (void *)data;  /* read-only by contract */
        x->bound_bytes[slot] = bytes;
        return 0;
    }
    return BT_ENOENT;
}

int kx_extent_set(kx_exec *x, int64_t extent)
{
    if (x->pending)
        return BT_EBUSY;
    if (extent == 0)
        extent = x->upper;
    if (extent < 0 || extent > x->upper || (x->upper && extent < 1))
        return BT_EINVAL;
    x->extent = extent;
    /* Inputs bound for a larger extent stay valid; smaller ones are checked
     * again at commit. */
    return 0;
}

int64_t kx_extent_upper(const kx_exec *x)
{
    return x->upper;
}

int kx_commit(kx_exec *x)
{
    if (x->pending)
        return BT_EBUSY;
    for (size_t v = 0; v < x->g.n_values; v++) {
        const kg_value *val = &x->g.values[v];
        if (val->kind == KG_INPUT && (!x->bound_bytes[val->slot] ||
                                      x->bound_bytes[val->slot] < bytes_now(x, val)))
            return BT_EUNBOUND;
        if (val->kind == KG_PARAM && x->param_state[v] == PARAM_UNSET)
            return BT_EUNBOUND;
    }
    if (x->dev->queued)
        return queued_commit(x);
    pthread_mutex_lock(&x->mu);
    x->gen++;
    x->finished = 0;
    x->err = 0;
    x->err_op = -1;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    x->pending = true;
    return 0;
}

int kx_sync(kx_exec *x)
{
    if (!x->pending)
        return 0;
    if (x->dev->queued)
        return queued_sync(x);
    pthread_mutex_lock(&x->mu);
    while (x->finished < x->n_threads)
        pthread_cond_wait(&x->cv, &x->mu);
    int err = x->err;
    pthread_mutex_unlock(&x->mu);
    x->pending = false;
    return err ? BT_EOP : 0;
}

int kx_run(kx_exec *x)
{
    int rc = kx_commit(x);
    return rc ? rc : kx_sync(x);
}

const void *kx_output(const kx_exec *x, int index, size_t *bytes)
{
    for (size_t v = 0; v < x->g.n_values; v++) {
        const kg_value *val = &x->g.values[v];
        if (val->kind == KG_OUTPUT && val->slot == index) {
            if (bytes)
                *bytes = bytes_now(x, val);
            return x->ptr[v];
        }
    }
    return NULL;
}

int kx_op_error(const kx_exec *x, int *status)
{
    if (status)
        *status = x->err;
    return x->err ? x->err_op : -1;
}

int kx_graph_count(const kx_exec *x)
{
    return x->n_graphs;
}

uint64_t kx_graph_replays(const kx_exec *x)
{
    return x->replays;
}

const void *kx_arena(const kx_exec *x)
{
    return x->arena;
}

size_t kx_arena_size(const kx_exec *x)
{
    return x->plan.arena;
}

size_t kx_arena_lower_bound(const kx_exec *x)
{
    return x->plan.lower_bound;
}

const ks_schedule *kx_schedule(const kx_exec *x)
{
    return x->sched;
}

const char *kx_report(const kx_exec *x)
{
    return x->report ? x->report : "";
}

