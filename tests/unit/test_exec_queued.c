/* The queued-device path of kernels/exec.c (the one CUDA takes) on a
 * simulated device, so that it is tested on machines without a GPU.
 *
 * The simulator keeps CUDA's semantics where they matter: each queue runs
 * its commands in order; an event wait enqueued after a record waits for
 * that record and no later one; work enqueued while capturing goes into a
 * graph that a launch enqueues again.  Ops are deferred: the table's
 * functions only enqueue a closure, which runs when the simulator picks
 * its queue.  The simulator picks among runnable queues at random (seeded),
 * so a missing wait shows up as a wrong result or a dependency seen out of
 * order, and a wait that can never be met shows up as a deadlock. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/exec.h"
#include "kernels/kernels.h"
#include "kernels/optable.h"
#include "backends/transformer/model.h"

/* ---- the simulated device ------------------------------------------------- */

typedef struct sim_event {
    uint64_t recorded;           /* records enqueued */
    uint64_t completed;          /* the last record that ran */
} sim_event;

typedef enum { CMD_OP, CMD_RECORD, CMD_WAIT, CMD_COPY } cmd_kind;

typedef struct cmd {
    cmd_kind kind;
    struct sim_queue *q;         /* where it goes (for graph replay) */
    kx_op_ctx ctx;               /* CMD_OP */
    kx_op_fn fn;
    sim_event *ev;               /* CMD_RECORD, CMD_WAIT */
    uint64_t target;
    void *dst;                   /* CMD_COPY */
    const void *src;
    size_t n;
} cmd;

typedef struct sim_queue {
    cmd *c;
    size_t n, cap, head;
} sim_queue;

typedef struct sim_graph {
    cmd *c;
    size_t n, cap;
} sim_graph;

typedef struct sim {
    sim_queue *queues[16];
    int n_queues;
    sim_graph *capturing;        /* non-NULL between capture_begin and _end */
    uint64_t rng;
    uint64_t clock;              /* logical time of op starts and ends */
    uint64_t start[4096], end[4096];
    int captures, launches, live_events, live_queues;
} sim;

static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void push_raw(cmd **arr, size_t *n, size_t *cap, const cmd *c)
{
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        *arr = realloc(*arr, *cap * sizeof(cmd));
        assert_non_null(*arr);
    }
    (*arr)[(*n)++] = *c;
}

/* Enqueues C on its queue, or into the graph being captured.  Record and
 * wait targets are fixed here, at enqueue time, as CUDA fixes them. */
static void sim_push(sim *s, cmd c)
{
    if (c.kind == CMD_RECORD)
        c.target = ++c.ev->recorded;
    else if (c.kind == CMD_WAIT)
        c.target = c.ev->recorded;
    if (s->capturing) {
        /* A captured record/wait is re-targeted at launch. */
        push_raw(&s->capturing->c, &s->capturing->n, &s->capturing->cap, &c);
        if (c.kind == CMD_RECORD)
            c.ev->recorded--;
        return;
    }
    push_raw(&c.q->c, &c.q->n, &c.q->cap, &c);
}

static bool runnable(const cmd *c)
{
    return c->kind != CMD_WAIT || c->ev->completed >= c->target;
}

static void exec_cmd(sim *s, cmd *c)
{
    switch (c->kind) {
    case CMD_OP: {
        size_t id = c->ctx.op_id;
        s->start[id] = ++s->clock;
        int rc = c->fn(&c->ctx);
        if (rc && !*c->ctx.flag)
            *c->ctx.flag = -rc;
        s->end[id] = ++s->clock;
        break;
    }
    case CMD_RECORD:
        c->ev->completed = c->target;
        break;
    case CMD_WAIT:
        break;
    case CMD_COPY:
        memcpy(c->dst, c->src, c->n);
        break;
    }
}

/* Runs every queue to empty, taking a random runnable head each step. */
static void sim_drain(sim *s)
{
    for (;;) {
        sim_queue *ready[16];
        int nr = 0, busy = 0;
        for (int k = 0; k < s->n_queues; k++) {
            sim_queue *q = s->queues[k];
            if (!q || q->head == q->n)
                continue;
            busy++;
            if (runnable(&q->c[q->head]))
                ready[nr++] = q;
        }
        if (!busy)
            return;
        if (!nr)
            fail_msg("simulated device deadlock: every queue waits on an event never recorded");
        sim_queue *q = ready[next_rand(&s->rng) % (uint64_t)nr];
        exec_cmd(s, &q->c[q->head++]);
        if (q->head == q->n)
            q->head = q->n = 0;
    }
}

static int sim_alloc(void *dev, size_t bytes, void **out)
{
    (void)dev;
    *out = calloc(1, bytes ? bytes : 1);
    return *out ? 0 : -ENOMEM;
}

static void sim_free(void *dev, void *p)
{
    (void)dev;
    free(p);
}

static int sim_copy(void *dev, void *dst, const void *src, size_t bytes, void *queue)
{
    if (!queue) {
        memcpy(dst, src, bytes);
        return 0;
    }
    cmd c = {.kind = CMD_COPY, .q = queue, .dst = dst, .src = src, .n = bytes};
    sim_push(dev, c);
    return 0;
}

static int sim_queue_create(void *dev, void **q)
{
    sim *s = dev;
    sim_queue *nq = calloc(1, sizeof(*nq));
    s->queues[s->n_queues++] = nq;
    s->live_queues++;
    *q = nq;
    return 0;
}

static void sim_queue_destroy(void *dev, void *q)
{
    sim *s = dev;
    for (int k = 0; k < s->n_queues; k++)
        if (s->queues[k] == q)
            s->queues[k] = NULL;
    free(((sim_queue *)q)->c);
    free(q);
    s->live_queues--;
}

static int sim_event_create(void *dev, void **e)
{
    ((sim *)dev)->live_events++;
    *e = calloc(1, sizeof(sim_event));
    return 0;
}

static void sim_event_destroy(void *dev, void *e)
{
    ((sim *)dev)->live_events--;
    free(e);
}

static int sim_event_record(void *dev, void *e, void *q)
{
    cmd c = {.kind = CMD_RECORD, .q = q, .ev = e};
    sim_push(dev, c);
    return 0;
}

static int sim_queue_wait(void *dev, void *q, void *e)
{
    cmd c = {.kind = CMD_WAIT, .q = q, .ev = e};
    sim_push(dev, c);
    return 0;
}

static int sim_queue_sync(void *dev, void *q)
{
    (void)q;
    sim_drain(dev);
    return 0;
}

static int sim_capture_begin(void *dev, void *q)
{
    (void)q;
    sim *s = dev;
    assert_null(s->capturing);
    s->capturing = calloc(1, sizeof(sim_graph));
    return 0;
}

static int sim_capture_end(void *dev, void *q, void **graph)
{
    (void)q;
    sim *s = dev;
    *graph = s->capturing;
    s->capturing = NULL;
    s->captures++;
    return 0;
}

static int sim_graph_launch(void *dev, void *graph, void *q)
{
    (void)q;
    sim *s = dev;
    sim_graph *g = graph;
    for (size_t i = 0; i < g->n; i++)
        sim_push(s, g->c[i]);
    s->launches++;
    return 0;
}

static void sim_graph_destroy(void *dev, void *graph)
{
    (void)dev;
    free(((sim_graph *)graph)->c);
    free(graph);
}

static kx_device sim_device(sim *s)
{
    return (kx_device){"sim", true, s, sim_alloc, sim_free, sim_copy, sim_queue_create,
                       sim_queue_destroy, sim_event_create, sim_event_destroy, sim_event_record,
                       sim_queue_wait, sim_queue_sync, sim_capture_begin, sim_capture_end,
                       sim_graph_launch, sim_graph_destroy};
}

/* The op tables: every op is deferred onto its queue; what runs later is
 * the CPU table's function (or a test op). */
static kx_op_fn deferred[KOP_COUNT];
static void *deferred_user; /* the inner table's user, which its functions read */

static int defer_op(const kx_op_ctx *c)
{
    cmd d = {.kind = CMD_OP, .q = c->queue, .ctx = *c, .fn = deferred[c->op->op]};
    d.ctx.user = deferred_user;
    assert_non_null(c->queue);
    assert_non_null(c->flag);
    sim_push(c->user, d);
    return 0;
}

static kx_op_table deferred_table(sim *s, const kx_op_table *inner)
{
    kx_op_table t = {{0}, s};
    deferred_user = inner->user;
    for (int k = 0; k < KOP_COUNT; k++) {
        deferred[k] = inner->fn[k];
        t.fn[k] = inner->fn[k] ? defer_op : NULL;
    }
    return t;
}

/* ---- synthetic graphs ------------------------------------------------------- */

/* out = sum of inputs, + 1 for SILU, * 2 for ALLREDUCE. */
static int sum_op(const kx_op_ctx *c)
{
    const kg_value *ov = &c->g->values[c->op->out[0]];
    int64_t n = (int64_t)(ov->bytes / 4);
    if (ov->dynamic && c->upper)
        n = n / c->upper * c->extent;
    float *y = c->out[0];
    for (int64_t i = 0; i < n; i++) {
        float s = 0;
        for (int k = 0; k < c->op->n_in; k++)
            s += ((const float *)c->in[k])[i];
        if (c->op->op == KOP_SILU)
            s += 1;
        if (c->op->op == KOP_ALLREDUCE)
            s *= 2;
        y[i] = s;
    }
    return 0;
}

static int v16(kg_graph *g, kg_kind k, bool dynamic)
{
    int64_t n = 16;
    int v = kg_value_add(g, "", k, KD_F32, 1, &n);
    if (dynamic)
        kg_value_set_dynamic(g, v);
    return v;
}

/* Three chains (compute, compute, comm with a fused op) joined at the end;
 * with DYNAMIC every value is bucketed at 16. */
static kg_graph *wide_graph(bool dynamic)
{
    kg_graph *g = kg_create();
    int x = v16(g, KG_INPUT, dynamic), a = x, b = x, c = x;
    for (int i = 0; i < 4; i++) {
        int na = v16(g, KG_INTER, dynamic), nb = v16(g, KG_INTER, dynamic);
        int nc = v16(g, KG_INTER, dynamic);
        kg_op_add(g, KOP_SILU, &a, 1, &na, 1, NULL, 0, -1, -1);
        kg_op_add(g, KOP_MATMUL, &b, 1, &nb, 1, NULL, 0, -1, -1);
        kg_op_add(g, i == 2 ? KOP_MATMUL_ALLREDUCE : KOP_ALLREDUCE, &c, 1, &nc, 1, NULL, 0, -1, -1);
        a = na, b = nb, c = nc;
    }
    int in[3] = {a, b, c}, y = v16(g, KG_OUTPUT, dynamic);
    kg_op_add(g, KOP_ADD, in, 3, &y, 1, NULL, 0, -1, -1);
    return g;
}

static kx_op_table sum_table(void)
{
    kx_op_table t = {{0}, NULL};
    t.fn[KOP_ADD] = t.fn[KOP_SILU] = t.fn[KOP_ALLREDUCE] = t.fn[KOP_MATMUL] = sum_op;
    t.fn[KOP_MATMUL_ALLREDUCE] = sum_op;
    return t;
}

static void check_order(const kg_graph *g, const sim *s)
{
    for (size_t i = 0; i < g->n_ops; i++)
        for (int k = 0; k < g->ops[i].n_in; k++) {
            int p = g->values[g->ops[i].in[k]].producer;
            if (p >= 0 && (size_t)p < i && !(s->end[p] < s->start[i]))
                fail_msg("op %zu started before its producer %d ended", i, p);
        }
}

/* ---- tests ---------------------------------------------------------------- */

static void test_multi_stream_events(void **state)
{
    (void)state;
    for (int graphs = 0; graphs < 2; graphs++) {
        sim s = {.rng = 42};
        kx_device dev = sim_device(&s);
        kx_op_table inner = sum_table(), t = deferred_table(&s, &inner);
        kg_graph *g = wide_graph(false);
        double cost[64];
        for (size_t i = 0; i < g->n_ops; i++)
            cost[i] = 1e-3;
        kx_options o = {NULL, cost, 2, 1, false, &dev, graphs == 1};
        kx_exec *x;
        assert_int_equal(kx_compile(g, &t, &o, &x), 0);
        assert_true(kx_schedule(x)->multi);
        float in[16];
        for (int r = 0; r < 40; r++) {
            for (int i = 0; i < 16; i++)
                in[i] = (float)(i + r);
            assert_int_equal(kx_input_bind(x, 0, in, sizeof in), 0);
            memset(s.start, 0, sizeof s.start);
            memset(s.end, 0, sizeof s.end);
            assert_int_equal(kx_run(x), 0);
            check_order(g, &s);
            const float *y = kx_output(x, 0, NULL);
            for (int i = 0; i < 16; i++)
                assert_true(y[i] == (in[i] + 4) + in[i] + 8 * in[i]);
        }
        assert_int_equal(kx_graph_count(x), graphs);
        assert_int_equal(kx_graph_replays(x), graphs ? 39 : 0);
        assert_int_equal(s.captures, graphs);
        kx_destroy(x);
        kg_destroy(g);
        assert_int_equal(s.live_events, 0);
        assert_int_equal(s.live_queues, 0);
    }
}

static void test_graph_per_extent(void **state)
{
    (void)state;
    sim s = {.rng = 7};
    kx_device dev = sim_device(&s);
    kx_op_table inner = sum_table(), t = deferred_table(&s, &inner);
    kg_graph *g = wide_graph(true);
    kx_options o = {.n_compute = 2, .n_comm = 1, .device = &dev, .graphs = true};
    kx_exec *x;
    assert_int_equal(kx_compile(g, &t, &o, &x), 0);
    float in[16];
    for (int i = 0; i < 16; i++)
        in[i] = (float)i;
    int extents[6] = {16, 3, 16, 3, 9, 3};
    for (int r = 0; r < 6; r++) {
        assert_int_equal(kx_extent_set(x, extents[r]), 0);
        assert_int_equal(kx_input_bind(x, 0, in, (size_t)extents[r] * 4), 0);
        assert_int_equal(kx_run(x), 0);
        size_t nb;
        const float *y = kx_output(x, 0, &nb);
        assert_int_equal(nb, (size_t)extents[r] * 4);
        for (int i = 0; i < extents[r]; i++)
            assert_true(y[i] == (in[i] + 4) + in[i] + 8 * in[i]);
    }
    assert_int_equal(kx_graph_count(x), 3);
    assert_int_equal(kx_graph_replays(x), 3);
    kx_destroy(x);
    kg_destroy(g);
}

/* The tiny transformer of test_optable, its weights from one seeded stream
 * in value order. */
static kx_exec *tiny_exec(kg_graph *g, const kx_options *o, const kx_op_table *t)
{
    kx_exec *x;
    assert_int_equal(kx_compile(g, t, o, &x), 0);
    uint64_t rs = 99;
    for (size_t v = 0; v < g->n_values; v++) {
        const kg_value *val = &g->values[v];
        if (val->kind != KG_PARAM)
            continue;
        size_t n = val->bytes / 4;
        float *w = malloc(val->bytes);
        bool norm = strstr(val->name, "norm") != NULL;
        for (size_t i = 0; i < n; i++)
            w[i] = (norm ? 1.0f : 0.0f) +
                   0.15f * ((float)(next_rand(&rs) >> 40) / 16777216.0f * 2.0f - 1.0f);
        assert_int_equal(kx_param_set(x, val->name, KD_F32, w, val->bytes), 0);
        free(w);
    }
    return x;
}

static void test_transformer_on_queued_device(void **state)
{
    (void)state;
    ktf_shape sh = {64, 2, 4, 2, 16, 96, 50, KD_F32, KD_F32, KD_F32, 1e-5f, 10000.0f,
                    K_ROPE_NORMAL};
    kg_graph *g = ktf_build_prefill(&sh, 1, 9, 16);
    kx_op_table cpu;
    kt_cpu_ops(&cpu);
    sim s = {.rng = 3};
    kx_device dev = sim_device(&s);
    kx_op_table t = deferred_table(&s, &cpu);
    kx_options oq = {.n_compute = 2, .device = &dev, .graphs = true};
    kx_exec *ref = tiny_exec(g, NULL, &cpu), *q = tiny_exec(g, &oq, &t);
    int32_t tok[9] = {3, 17, 41, 0, 22, 9, 49, 5, 30}, pos[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    for (int n = 9; n >= 5; n -= 2) {
        int32_t last = n - 1;
        kx_exec *xs[2] = {ref, q};
        for (int k = 0; k < 2; k++) {
            assert_int_equal(kx_extent_set(xs[k], n), 0);
            assert_int_equal(kx_input_bind(xs[k], 0, tok, (size_t)n * 4), 0);
            assert_int_equal(kx_input_bind(xs[k], 1, pos, (size_t)n * 4), 0);
            assert_int_equal(kx_input_bind(xs[k], 2, &last, 4), 0);
            assert_int_equal(kx_run(xs[k]), 0);
        }
        assert_memory_equal(kx_output(ref, 0, NULL), kx_output(q, 0, NULL), 50 * 4);
        check_order(g, &s);
    }
    assert_int_equal(kx_graph_count(q), 3);
    kx_destroy(ref);
    kx_destroy(q);
    kg_destroy(g);
}

static int refuse_op(const kx_op_ctx *c)
{
    (void)c;
    return -EINVAL;
}

static void test_bad_data_and_refused_launch(void **state)
{
    (void)state;
    ktf_shape sh = {64, 1, 4, 2, 16, 96, 50, KD_F32, KD_F32, KD_F32, 1e-5f, 10000.0f,
                    K_ROPE_NORMAL};
    kg_graph *g = ktf_build_decode(&sh, 1, 8);
    kx_op_table cpu;
    kt_cpu_ops(&cpu);
    sim s = {.rng = 5};
    kx_device dev = sim_device(&s);
    kx_op_table t = deferred_table(&s, &cpu);
    kx_options o = {.device = &dev, .graphs = true};
    kx_exec *x = tiny_exec(g, &o, &t);
    int32_t tok = 1, pos = 8, len = 8, slot = 0;  /* one past the cache */
    assert_int_equal(kx_input_bind(x, 0, &tok, 4), 0);
    assert_int_equal(kx_input_bind(x, 1, &pos, 4), 0);
    assert_int_equal(kx_input_bind(x, 2, &len, 4), 0);
    assert_int_equal(kx_input_bind(x, 3, &slot, 4), 0);
    assert_int_equal(kx_run(x), BT_EOP);
    int st;
    assert_int_equal(kx_op_error(x, &st), -1);
    assert_int_equal(st, -ERANGE);
    pos = len = 7;
    assert_int_equal(kx_run(x), 0);  /* the flag is cleared per run */
    kx_destroy(x);
    /* A launch refused while capturing: the capture ends, the commit
     * fails naming the op, and nothing stays captured. */
    kx_op_table refuse = deferred_table(&s, &cpu);
    refuse.fn[KOP_ROPE] = refuse_op;
    kx_exec *y = tiny_exec(g, &o, &refuse);
    assert_int_equal(kx_input_bind(y, 0, &tok, 4), 0);
    assert_int_equal(kx_input_bind(y, 1, &pos, 4), 0);
    assert_int_equal(kx_input_bind(y, 2, &len, 4), 0);
    assert_int_equal(kx_input_bind(y, 3, &slot, 4), 0);
    assert_int_equal(kx_run(y), BT_EOP);
    int op = kx_op_error(y, &st);
    assert_true(op >= 0);
    assert_int_equal(g->ops[op].op, KOP_ROPE);
    assert_int_equal(st, -EINVAL);
    assert_null(s.capturing);
    assert_int_equal(kx_graph_count(y), 0);
    kx_destroy(y);
    kg_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_stream_events),
        cmocka_unit_test(test_graph_per_extent),
        cmocka_unit_test(test_transformer_on_queued_device),
        cmocka_unit_test(test_bad_data_and_refused_launch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
