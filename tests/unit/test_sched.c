/* The multi-stream scheduler (kernels/sched.c) on synthetic graphs whose
 * best schedule is worked out by hand below.  Costs are given per op in
 * microseconds-as-seconds units (1 = 1 s) so the arithmetic is exact; the
 * sync overhead is 1. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/graph.h"
#include "kernels/sched.h"

static int val(kg_graph *g, kg_kind k)
{
    int64_t n = 16;
    return kg_value_add(g, "", k, KD_F32, 1, &n);
}

/* Adds op K reading IN (or nothing when IN < 0) into a fresh value. */
static int add(kg_graph *g, kop k, int in, int *out_value)
{
    int y = val(g, KG_INTER);
    int id = kg_op_add(g, k, &in, in >= 0 ? 1 : 0, &y, 1, NULL, 0, -1, -1);
    assert_true(id >= 0);
    if (out_value)
        *out_value = y;
    return id;
}

static const ks_config one_one = {1, 1, 1.0, false};

/* Compute chain A0->A1->A2 (10 each) and comm chain C0->C1 (15 each), both
 * from input x, joined by J (compute, 5) reading A2 and C1.
 * Ranks: A2 = 10 + (5 + 1) = 16, A1 = 27, A0 = 38; C1 = 21, C0 = 37; J = 5.
 * Order A0, C0, A1, C1, A2, J.  A0 [0,10] s0, C0 [0,15] comm, A1 [10,20],
 * C1 [15,30], A2 [20,30], J starts at max(30, 30 + sync 1) = 31, ends 36.
 * Serial: 30 + 30 + 5 = 65.  Predicted = max(chains) + sync + J. */
static void test_compute_comm_overlap(void **state)
{
    (void)state;
    kg_graph *g = kg_create();
    int x = val(g, KG_INPUT), a, c;
    int a0 = add(g, KOP_MATMUL, x, &a);
    int c0 = add(g, KOP_ALLREDUCE, x, &c);
    int a1 = add(g, KOP_MATMUL, a, &a);
    int c1 = add(g, KOP_ALLREDUCE, c, &c);
    int a2 = add(g, KOP_MATMUL, a, &a);
    int in[2] = {a, c};
    int y = val(g, KG_OUTPUT);
    int j = kg_op_add(g, KOP_ADD, in, 2, &y, 1, NULL, 0, -1, -1);
    double cost[6];
    cost[a0] = cost[a1] = cost[a2] = 10;
    cost[c0] = cost[c1] = 15;
    cost[j] = 5;
    ks_schedule *s;
    assert_int_equal(ks_schedule_build(g, cost, &one_one, &s), 0);
    assert_true(s->multi);
    assert_true(fabs(s->serial_s - 65) < 1e-9);
    assert_true(fabs(s->multi_s - (30 + 1 + 5)) < 1e-9);
    assert_true(fabs(s->rank[a0] - 38) < 1e-9);
    assert_true(fabs(s->rank[c0] - 37) < 1e-9);
    assert_int_equal(s->stream[c0], 1);
    assert_int_equal(s->stream[c1], 1);
    assert_int_equal(s->stream[a2], 0);
    assert_int_equal(s->stream[j], 0);
    assert_true(fabs(s->start[j] - 31) < 1e-9);
    /* Events only at cross-stream edges: J waits for C1, which records. */
    assert_int_equal(s->n_events, 1);
    assert_true(s->records[c1]);
    assert_int_equal(s->wait_off[j + 1] - s->wait_off[j], 1);
    assert_int_equal(s->wait_op[s->wait_off[j]], c1);
    char buf[1024];
    assert_true(ks_schedule_report(s, g, buf, sizeof buf) > 0);
    assert_non_null(strstr(buf, "decision: multi-stream"));
    ks_schedule_destroy(s);
    kg_destroy(g);
}

/* A strict chain compute -> comm -> compute -> comm (costs 4 each): nothing
 * can overlap, and every stream switch costs a sync, so multi-stream
 * predicts 16 + 3 = 19 against a serial 16 and stays serial. */
static void test_chain_stays_serial(void **state)
{
    (void)state;
    kg_graph *g = kg_create();
    int v = val(g, KG_INPUT);
    kop k[4] = {KOP_MATMUL, KOP_ALLREDUCE, KOP_MATMUL, KOP_ALLREDUCE};
    for (int i = 0; i < 4; i++)
        add(g, k[i], v, &v);
    double cost[4] = {4, 4, 4, 4};
    ks_schedule *s;
    assert_int_equal(ks_schedule_build(g, cost, &one_one, &s), 0);
    assert_false(s->multi);
    assert_true(fabs(s->serial_s - 16) < 1e-9);
    assert_true(fabs(s->multi_s - 19) < 1e-9);
    for (int i = 0; i < 4; i++)
        assert_int_equal(s->stream[i], 0);
    assert_int_equal(s->n_events, 0);
    char buf[512];
    ks_schedule_report(s, g, buf, sizeof buf);
    assert_non_null(strstr(buf, "decision: serial"));
    ks_schedule_destroy(s);
    kg_destroy(g);
}

/* Two compute streams and the comm stream.  X (compute, 10), H (fused
 * matmul+allreduce, 10) and C (allreduce, 10), all independent; equal ranks,
 * so graph order X, H, C.  X on s0 [0,10]; H on s1 holding comm [0,10]; C
 * must wait for the comm stream: [10,20].  Makespan 20 < serial 30. */
static void test_hybrid_blocks_both(void **state)
{
    (void)state;
    kg_graph *g = kg_create();
    int x = val(g, KG_INPUT);
    int ox = add(g, KOP_MATMUL, x, NULL);
    int oh = add(g, KOP_MATMUL_ALLREDUCE, x, NULL);
    int oc = add(g, KOP_ALLREDUCE, x, NULL);
    double cost[3] = {10, 10, 10};
    ks_config cfg = {2, 1, 1.0, false};
    ks_schedule *s;
    assert_int_equal(ks_schedule_build(g, cost, &cfg, &s), 0);
    assert_true(s->multi);
    assert_int_equal(s->stream[ox], 0);
    assert_int_equal(s->stream[oh], 1);
    assert_int_equal(s->stream[oc], 2);
    assert_true(fabs(s->start[oh] - 0) < 1e-9);
    assert_true(fabs(s->start[oc] - 10) < 1e-9);
    assert_true(fabs(s->multi_s - 20) < 1e-9);
    /* The comm stream lists H (a reservation) before C. */
    assert_int_equal(s->stream_n[2], 2);
    assert_int_equal(s->stream_ops[2][0], oh);
    assert_int_equal(s->stream_ops[2][1], oc);
    ks_schedule_destroy(s);

    /* With one compute stream, H must also wait for X's compute stream:
     * X [0,10], H [10,20], C [20,30]: no gain, serial. */
    assert_int_equal(ks_schedule_build(g, cost, &one_one, &s), 0);
    assert_true(fabs(s->start[oh] - 10) < 1e-9);
    assert_true(fabs(s->start[oc] - 20) < 1e-9);
    assert_false(s->multi);
    ks_schedule_destroy(s);
    kg_destroy(g);
}

/* Five independent compute ops of equal cost on one compute stream: equal
 * ranks, so they run in graph order, whatever the stream count of comm. */
static void test_ties_keep_order(void **state)
{
    (void)state;
    kg_graph *g = kg_create();
    int x = val(g, KG_INPUT);
    for (int i = 0; i < 5; i++)
        add(g, KOP_ADD, x, NULL);
    double cost[5] = {3, 3, 3, 3, 3};
    ks_config cfg = {2, 1, 1.0, false};
    ks_schedule *s;
    assert_int_equal(ks_schedule_build(g, cost, &cfg, &s), 0);
    /* Two compute streams: 0 s0, 1 s1, 2 s0, 3 s1, 4 s0 (ties: lowest stream). */
    assert_true(s->multi);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(s->order[i], i);
        assert_int_equal(s->stream[i], i % 2);
    }
    ks_schedule_destroy(s);
    kg_destroy(g);
}

/* The roofline: a matmul costs its flops over peak when compute-bound, its
 * bytes over bandwidth otherwise; an op without figures uses its bytes;
 * every cost has a floor. */
static void test_cost_model(void **state)
{
    (void)state;
    const ks_profile *h100 = ks_profile_builtin("h100");
    assert_non_null(h100);
    assert_non_null(ks_profile_builtin("h200"));
    assert_non_null(ks_profile_builtin("cpu"));
    assert_null(ks_profile_builtin("tpu"));
    kg_graph *g = kg_create();
    int64_t n = 1 << 20;
    int x = kg_value_add(g, "x", KG_INPUT, KD_F32, 1, &n);
    int y = kg_value_add(g, "y", KG_INTER, KD_F32, 1, &n);
    int z = kg_value_add(g, "z", KG_INTER, KD_F32, 1, &n);
    int w = kg_value_add(g, "w", KG_INTER, KD_F32, 1, &n);
    kg_op_add(g, KOP_MATMUL, &x, 1, &y, 1, NULL, 0, 989e12, 1);   /* 1 s of flops */
    kg_op_add(g, KOP_ADD, &y, 1, &z, 1, NULL, 0, -1, -1);         /* 8 MiB of bytes */
    kg_op_add(g, KOP_ALLREDUCE, &z, 1, &w, 1, NULL, 0, -1, 315e9); /* 1 s at 450 x 0.7 */
    assert_true(fabs(ks_op_cost(h100, g, 0) - 1.0) < 1e-9);
    double bytes = 2.0 * 4 * (double)n;
    assert_true(fabs(ks_op_cost(h100, g, 1) - bytes / (3350e9 * 0.8)) < 1e-12);
    assert_true(fabs(ks_op_cost(h100, g, 2) - 1.0) < 1e-9);
    kg_graph *t = kg_create();
    int64_t one = 1;
    int a = kg_value_add(t, "a", KG_INPUT, KD_U8, 1, &one);
    int b = kg_value_add(t, "b", KG_INTER, KD_U8, 1, &one);
    kg_op_add(t, KOP_ADD, &a, 1, &b, 1, NULL, 0, -1, -1);
    assert_true(ks_op_cost(h100, t, 0) == KS_MIN_COST_S);
    kg_destroy(t);
    kg_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compute_comm_overlap),
        cmocka_unit_test(test_chain_stays_serial),
        cmocka_unit_test(test_hybrid_blocks_both),
        cmocka_unit_test(test_ties_keep_order),
        cmocka_unit_test(test_cost_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
