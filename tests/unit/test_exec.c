/* Executables on the CPU device (kernels/exec.c) with test ops defined
 * here: multi-stream runs equal serial ones, cross-stream events order
 * dependent ops (checked with a logical clock, not time), persistent
 * handles outlive runs, bucketed runs at a smaller extent, typed parameters,
 * and asynchronous commit plus sync. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/exec.h"
#include "kernels/graph.h"

/* A logical clock: every op takes a tick when it starts and when it ends. */
typedef struct clockrec {
    uint64_t now;
    uint64_t start[64], end[64];
} clockrec;

static int64_t rows_of(const kx_op_ctx *c, int v)
{
    const kg_value *val = &c->g->values[v];
    int64_t n = (int64_t)(val->bytes / 4);
    return val->dynamic && c->upper ? n / c->upper * c->extent : n;
}

/* out = sum of inputs (+ 1 for SILU, * 2 for ALLREDUCE, * param for MUL),
 * elementwise over the first input's elements at the current extent. */
static int test_op(const kx_op_ctx *c)
{
    clockrec *clk = c->user;
    clk->start[c->op_id] = __atomic_add_fetch(&clk->now, 1, __ATOMIC_SEQ_CST);
    int64_t n = rows_of(c, c->op->out[0]);
    float *y = c->out[0];
    for (int64_t i = 0; i < n; i++) {
        float s = 0;
        for (int k = 0; k < c->op->n_in; k++)
            s += ((const float *)c->in[k])[i];
        switch (c->op->op) {
        case KOP_SILU: s += 1; break;
        case KOP_ALLREDUCE: s *= 2; break;
        default: break;
        }
        y[i] = s;
    }
    /* Give other streams a chance to run out of order if events were wrong. */
    for (volatile int spin = 0; spin < 20000; spin++)
        ;
    clk->end[c->op_id] = __atomic_add_fetch(&clk->now, 1, __ATOMIC_SEQ_CST);
    return 0;
}

/* handle += in; out = handle. */
static int acc_op(const kx_op_ctx *c)
{
    int64_t n = rows_of(c, c->op->out[0]);
    float *h = c->out[1], *y = c->out[0];
    for (int64_t i = 0; i < n; i++) {
        h[i] += ((const float *)c->in[0])[i];
        y[i] = h[i];
    }
    return 0;
}

static kx_op_table table(clockrec *clk)
{
    kx_op_table t = {{0}, clk};
    t.fn[KOP_ADD] = t.fn[KOP_SILU] = t.fn[KOP_ALLREDUCE] = t.fn[KOP_MATMUL] = test_op;
    t.fn[KOP_MATMUL_ALLREDUCE] = test_op;
    t.fn[KOP_ATTN_DECODE] = acc_op;
    return t;
}

static int v16(kg_graph *g, kg_kind k)
{
    int64_t n = 16;
    return kg_value_add(g, "", k, KD_F32, 1, &n);
}

static int op1(kg_graph *g, kop k, int in, int out)
{
    return kg_op_add(g, k, &in, 1, &out, 1, NULL, 0, -1, -1);
}

/* Two compute chains, one comm chain and a fused op, joined at the end. */
static kg_graph *wide_graph(void)
{
    kg_graph *g = kg_create();
    int x = v16(g, KG_INPUT);
    int a = x, b = x, c = x;
    for (int i = 0; i < 4; i++) {
        int na = v16(g, KG_INTER), nb = v16(g, KG_INTER), nc = v16(g, KG_INTER);
        op1(g, KOP_SILU, a, na);
        op1(g, KOP_MATMUL, b, nb);
        op1(g, i == 2 ? KOP_MATMUL_ALLREDUCE : KOP_ALLREDUCE, c, nc);
        a = na, b = nb, c = nc;
    }
    int in[3] = {a, b, c};
    int y = v16(g, KG_OUTPUT);
    kg_op_add(g, KOP_ADD, in, 3, &y, 1, NULL, 0, -1, -1);
    return g;
}

static void check_clock(const kg_graph *g, const clockrec *clk)
{
    for (size_t i = 0; i < g->n_ops; i++)
        for (int k = 0; k < g->ops[i].n_in; k++) {
            int p = g->values[g->ops[i].in[k]].producer;
            if (p >= 0)
                assert_true(clk->end[p] < clk->start[i]);
        }
}

static void test_multi_equals_serial(void **state)
{
    (void)state;
    kg_graph *g = wide_graph();
    float x[16];
    for (int i = 0; i < 16; i++)
        x[i] = (float)i * 0.5f;
    clockrec clk = {0};
    kx_op_table t = table(&clk);
    double cost[64];
    for (size_t i = 0; i < g->n_ops; i++)
        cost[i] = 1e-3;
    kx_options serial = {NULL, cost, 2, 1, true};
    kx_options multi = {NULL, cost, 2, 1, false};
    kx_exec *xs, *xm;
    assert_int_equal(kx_compile(g, &t, &serial, &xs), 0);
    assert_int_equal(kx_compile(g, &t, &multi, &xm), 0);
    assert_false(kx_schedule(xs)->multi);
    assert_true(kx_schedule(xm)->multi);
    assert_true(kx_schedule(xm)->n_events > 0);
    assert_non_null(strstr(kx_report(xm), "multi-stream"));
    assert_int_equal(kx_input_bind(xs, 0, x, sizeof x), 0);
    assert_int_equal(kx_run(xs), 0);
    size_t nb;
    const float *ys = kx_output(xs, 0, &nb);
    assert_int_equal(nb, sizeof x);
    assert_int_equal(kx_input_bind(xm, 0, x, sizeof x), 0);
    for (int r = 0; r < 50; r++) {
        memset(&clk, 0, sizeof clk);
        assert_int_equal(kx_run(xm), 0);
        const float *ym = kx_output(xm, 0, NULL);
        assert_memory_equal(ys, ym, sizeof x);
        check_clock(g, &clk);
    }
    /* y = (x + 4) + x + 16 x: silu chain adds 1 four times, matmul passes,
     * the comm chain doubles three times (the fused op passes through). */
    for (int i = 0; i < 16; i++)
        assert_true(ys[i] == (x[i] + 4) + x[i] + 8 * x[i]);
    kx_destroy(xs);
    kx_destroy(xm);
    kg_destroy(g);
}

static void test_handle_persists(void **state)
{
    (void)state;
    kg_graph *g = kg_create();
    int x = v16(g, KG_INPUT);
    int64_t n = 16;
    int h = kg_value_add(g, "cache", KG_HANDLE, KD_F32, 1, &n);
    int y = v16(g, KG_OUTPUT);
    int in[2] = {x, h}, out[2] = {y, h};
    assert_true(kg_op_add(g, KOP_ATTN_DECODE, in, 2, out, 2, NULL, 0, -1, -1) >= 0);
    clockrec clk = {0};
    kx_op_table t = table(&clk);
    kx_exec *e;
    assert_int_equal(kx_compile(g, &t, NULL, &e), 0);
    kg_destroy(g);  /* the executable keeps its own copy */
    float ones[16];
    for (int i = 0; i < 16; i++)
        ones[i] = 1;
    size_t hb;
    float *cache = kx_handle(e, "cache", &hb);
    assert_non_null(cache);
    assert_int_equal(hb, sizeof ones);
    cache[3] = 10;
    assert_int_equal(kx_input_bind(e, 0, ones, sizeof ones), 0);
    for (int r = 0; r < 3; r++)
        assert_int_equal(kx_run(e), 0);
    const float *yy = kx_output(e, 0, NULL);
    assert_true(cache[0] == 3 && cache[3] == 13);
    assert_true(yy[0] == 3 && yy[3] == 13);
    assert_null(kx_handle(e, "nope", NULL));
    /* Moved onto the caller's memory: runs update it there, the handle
     * reads it, and the executable does not free it. */
    float mine[16] = {0};
    mine[3] = 100;
    assert_int_equal(kx_handle_borrow(e, "cache", mine, sizeof mine), 0);
    assert_ptr_equal(kx_handle(e, "cache", NULL), mine);
    assert_int_equal(kx_run(e), 0);
    assert_true(mine[0] == 1 && mine[3] == 101 && cache != mine);
    float other[16] = {0};
    assert_int_equal(kx_handle_borrow(e, "cache", other, sizeof other), 0);
    assert_int_equal(kx_run(e), 0);
    assert_true(other[0] == 1 && mine[0] == 1);
    assert_int_equal(kx_handle_borrow(e, "cache", mine, 8), BT_ETYPE);
    assert_int_equal(kx_handle_borrow(e, "nope", mine, sizeof mine), BT_ENOENT);
    kx_destroy(e);
}

/* Compiled at an upper extent of 8 rows, run at 3: the first 3 rows equal a
 * graph compiled at 3. */
static kg_graph *rows_graph(int64_t rows, bool dynamic)
{
    kg_graph *g = kg_create();
    int64_t shape[2] = {rows, 4};
    int x = kg_value_add(g, "x", KG_INPUT, KD_F32, 2, shape);
    int m = kg_value_add(g, "m", KG_INTER, KD_F32, 2, shape);
    int y = kg_value_add(g, "y", KG_OUTPUT, KD_F32, 2, shape);
    if (dynamic) {
        kg_value_set_dynamic(g, x);
        kg_value_set_dynamic(g, m);
        kg_value_set_dynamic(g, y);
    }
    op1(g, KOP_SILU, x, m);
    int in[2] = {m, x};
    kg_op_add(g, KOP_ADD, in, 2, &y, 1, NULL, 0, -1, -1);
    return g;
}

static void test_bucketed(void **state)
{
    (void)state;
    clockrec clk = {0};
    kx_op_table t = table(&clk);
    kg_graph *gb = rows_graph(8, true), *g3 = rows_graph(3, false);
    kx_exec *eb, *e3;
    assert_int_equal(kx_compile(gb, &t, NULL, &eb), 0);
    assert_int_equal(kx_compile(g3, &t, NULL, &e3), 0);
    assert_int_equal(kx_extent_upper(eb), 8);
    float x[12];
    for (int i = 0; i < 12; i++)
        x[i] = (float)i;
    assert_int_equal(kx_extent_set(eb, 9), BT_EINVAL);
    assert_int_equal(kx_extent_set(eb, 3), 0);
    /* 12 floats are enough at extent 3, not at 8. */
    assert_int_equal(kx_input_bind(eb, 0, x, sizeof x), 0);
    assert_int_equal(kx_input_bind(e3, 0, x, sizeof x), 0);
    assert_int_equal(kx_run(eb), 0);
    assert_int_equal(kx_run(e3), 0);
    size_t nb, n3;
    const float *yb = kx_output(eb, 0, &nb), *y3 = kx_output(e3, 0, &n3);
    assert_int_equal(nb, sizeof x);
    assert_int_equal(n3, sizeof x);
    assert_memory_equal(yb, y3, sizeof x);
    assert_int_equal(kx_extent_set(eb, 0), 0);
    assert_int_equal(kx_commit(eb), BT_EUNBOUND);
    kx_destroy(eb);
    kx_destroy(e3);
    kg_destroy(gb);
    kg_destroy(g3);
}

static void test_params_and_async(void **state)
{
    (void)state;
    kg_graph *g = kg_create();
    int x = v16(g, KG_INPUT);
    int64_t n = 16;
    int w = kg_value_add(g, "w", KG_PARAM, KD_F32, 1, &n);
    int y = v16(g, KG_OUTPUT);
    int in[2] = {x, w};
    kg_op_add(g, KOP_ADD, in, 2, &y, 1, NULL, 0, -1, -1);
    clockrec clk = {0};
    kx_op_table t = table(&clk);
    kx_exec *e;
    kx_op_table none = {{0}, NULL};
    assert_int_equal(kx_compile(g, &none, NULL, &e), BT_ENOOP);
    assert_int_equal(kx_compile(g, &t, NULL, &e), 0);
    float xs[16], ws[16];
    for (int i = 0; i < 16; i++)
        xs[i] = (float)i, ws[i] = 100;
    assert_int_equal(kx_input_bind(e, 0, xs, sizeof xs), 0);
    assert_int_equal(kx_commit(e), BT_EUNBOUND);
    assert_int_equal(kx_param_set(e, "w", KD_F16, ws, sizeof ws), BT_ETYPE);
    assert_int_equal(kx_param_set(e, "w", KD_F32, ws, 8), BT_ETYPE);
    assert_int_equal(kx_param_set(e, "v", KD_F32, ws, sizeof ws), BT_ENOENT);
    assert_int_equal(kx_param_set(e, "w", KD_F32, ws, sizeof ws), 0);
    assert_int_equal(kx_commit(e), 0);
    assert_int_equal(kx_commit(e), BT_EBUSY);
    assert_int_equal(kx_sync(e), 0);
    const float *yy = kx_output(e, 0, NULL);
    assert_true(yy[5] == 105);
    assert_true((const char *)yy >= (const char *)kx_arena(e) &&
                (const char *)yy < (const char *)kx_arena(e) + kx_arena_size(e));
    assert_null(kx_output(e, 1, NULL));
    /* A borrowed parameter is read in place: a change to the caller's
     * memory shows in the next run (the caller promises not to do this,
     * but it proves there was no copy).  Set again, it is copied. */
    float wb[16];
    for (int i = 0; i < 16; i++)
        wb[i] = 1000;
    assert_int_equal(kx_param_borrow(e, "w", KD_F16, wb, sizeof wb), BT_ETYPE);
    assert_int_equal(kx_param_borrow(e, "x", KD_F32, wb, sizeof wb), BT_ENOENT);
    assert_int_equal(kx_param_borrow(e, "w", KD_F32, wb, sizeof wb), 0);
    assert_int_equal(kx_run(e), 0);
    assert_true(((const float *)kx_output(e, 0, NULL))[5] == 1005);
    wb[5] = 2000;
    assert_int_equal(kx_run(e), 0);
    assert_true(((const float *)kx_output(e, 0, NULL))[5] == 2005);
    assert_int_equal(kx_param_set(e, "w", KD_F32, ws, sizeof ws), 0);
    wb[5] = 3000;
    assert_int_equal(kx_run(e), 0);
    assert_true(((const float *)kx_output(e, 0, NULL))[5] == 105);
    /* Destroying with a borrowed parameter frees none of the caller's. */
    assert_int_equal(kx_param_borrow(e, "w", KD_F32, wb, sizeof wb), 0);
    kx_destroy(e);
    kg_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_equals_serial),
        cmocka_unit_test(test_handle_persists),
        cmocka_unit_test(test_bucketed),
        cmocka_unit_test(test_params_and_async),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
