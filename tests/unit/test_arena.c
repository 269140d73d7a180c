/* Arena planning (kernels/arena.c): hand-checked chains and diamonds, a
 * brute-force no-overlap check on random DAGs, the peak-live bound, and the
 * transformer graphs' plans. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "kernels/arena.h"
#include "kernels/graph.h"
#include "backends/transformer/model.h"

static int inter(kg_graph *g, int64_t n)
{
    return kg_value_add(g, "", KG_INTER, KD_F32, 1, &n);
}

/* Every pair of values live at one step must not share a byte. */
static void assert_no_overlap(const kg_graph *g, const ka_graph_plan *p)
{
    int *last = malloc(g->n_values * sizeof(int));
    kg_last_uses(g, NULL, last);
    for (size_t a = 0; a < g->n_values; a++) {
        const kg_value *va = &g->values[a];
        if (p->offset[a] == KA_NONE)
            continue;
        assert_int_equal(p->offset[a] % KA_ALIGN, 0);
        assert_true(p->offset[a] + va->bytes <= p->arena);
        int fa = va->producer, la = va->kind == KG_OUTPUT ? (int)g->n_ops : last[a];
        if (la < fa)
            la = fa;
        for (size_t b = a + 1; b < g->n_values; b++) {
            const kg_value *vb = &g->values[b];
            if (p->offset[b] == KA_NONE)
                continue;
            int fb = vb->producer, lb = vb->kind == KG_OUTPUT ? (int)g->n_ops : last[b];
            if (lb < fb)
                lb = fb;
            if (fa > lb || fb > la)
                continue;
            bool disjoint = p->offset[a] + va->bytes <= p->offset[b] ||
                            p->offset[b] + vb->bytes <= p->offset[a];
            assert_true(disjoint);
        }
    }
    free(last);
}

/* x -> v0 -> v1 -> v2 -> v3 -> y (y the output): each value is live
 * from its producer to its reader, so two buffers of 1 KiB ping-pong. */
static void test_chain_reuses_pair(void **state)
{
    (void)state;
    kg_graph *g = kg_create();
    int64_t n = 256;
    int x = kg_value_add(g, "x", KG_INPUT, KD_F32, 1, &n);
    int v[5];
    for (int i = 0; i < 4; i++)
        v[i] = inter(g, n);
    v[4] = kg_value_add(g, "y", KG_OUTPUT, KD_F32, 1, &n);
    int prev = x;
    for (int i = 0; i < 5; i++) {
        assert_true(kg_op_add(g, KOP_SILU, &prev, 1, &v[i], 1, NULL, 0, -1, -1) >= 0);
        prev = v[i];
    }
    ka_graph_plan p;
    assert_int_equal(ka_plan_graph(g, NULL, KA_ALIGN, NULL, NULL, &p), 0);
    assert_int_equal(p.lower_bound, 2048);
    assert_int_equal(p.arena, 2048);
    assert_int_equal(p.offset[v[0]], p.offset[v[2]]);
    assert_true(p.offset[v[0]] != p.offset[v[1]]);
    assert_no_overlap(g, &p);
    ka_graph_plan_free(&p);
    kg_destroy(g);
}

/* a -> (b, c) -> d: a is read by both b and c, so at c's step a, b and c
 * are live together (bound: 3 buffers); d, written after a's last read,
 * reuses a's bytes. */
static void test_diamond(void **state)
{
    (void)state;
    kg_graph *g = kg_create();
    int64_t n = 64;  /* 256 bytes: one alignment unit */
    int x = kg_value_add(g, "x", KG_INPUT, KD_F32, 1, &n);
    int a = inter(g, n), b = inter(g, n), c = inter(g, n);
    int d = kg_value_add(g, "d", KG_OUTPUT, KD_F32, 1, &n);
    kg_op_add(g, KOP_SILU, &x, 1, &a, 1, NULL, 0, -1, -1);
    kg_op_add(g, KOP_SILU, &a, 1, &b, 1, NULL, 0, -1, -1);
    kg_op_add(g, KOP_GELU, &a, 1, &c, 1, NULL, 0, -1, -1);
    int bc[2] = {b, c};
    kg_op_add(g, KOP_ADD, bc, 2, &d, 1, NULL, 0, -1, -1);
    ka_graph_plan p;
    assert_int_equal(ka_plan_graph(g, NULL, KA_ALIGN, NULL, NULL, &p), 0);
    assert_int_equal(p.lower_bound, 3 * 256);
    assert_int_equal(p.arena, 3 * 256);
    assert_int_equal(p.offset[d], p.offset[a]);
    assert_no_overlap(g, &p);
    ka_graph_plan_free(&p);
    kg_destroy(g);
}

static void test_graph_order_checked(void **state)
{
    (void)state;
    kg_graph *g = kg_create();
    int64_t n = 4;
    int a = inter(g, n), b = inter(g, n);
    assert_int_equal(kg_op_add(g, KOP_SILU, &a, 1, &b, 1, NULL, 0, -1, -1), BT_EORDER);
    int p = kg_value_add(g, "w", KG_PARAM, KD_F32, 1, &n);
    assert_int_equal(kg_op_add(g, KOP_SILU, &p, 1, &p, 1, NULL, 0, -1, -1), BT_EREDEF);
    assert_int_equal(kg_op_add(g, KOP_SILU, &p, 1, &a, 1, NULL, 0, -1, -1), 0);
    assert_int_equal(kg_op_add(g, KOP_SILU, &p, 1, &a, 1, NULL, 0, -1, -1), BT_EREDEF);
    kg_destroy(g);
}

/* Random DAGs: random sizes, each op reading 1-3 earlier values. */
static void test_random_dags(void **state)
{
    (void)state;
    unsigned seed = 12345;
    for (int trial = 0; trial < 200; trial++) {
        kg_graph *g = kg_create();
        int64_t n0 = 16;
        int vals[64];
        int nv = 0;
        vals[nv++] = kg_value_add(g, "x", KG_INPUT, KD_F32, 1, &n0);
        int ops = 5 + (int)(rand_r(&seed) % 40);
        for (int i = 0; i < ops; i++) {
            int64_t sz = 1 + (int64_t)(rand_r(&seed) % 5000);
            bool out = rand_r(&seed) % 8 == 0;
            int y = kg_value_add(g, "", out ? KG_OUTPUT : KG_INTER, KD_F32, 1, &sz);
            int in[3], k = 1 + (int)(rand_r(&seed) % 3);
            for (int j = 0; j < k; j++)
                in[j] = vals[rand_r(&seed) % (unsigned)nv];
            assert_true(kg_op_add(g, KOP_ADD, in, k, &y, 1, NULL, 0, -1, -1) >= 0);
            vals[nv++] = y;
        }
        ka_graph_plan p;
        assert_int_equal(ka_plan_graph(g, NULL, KA_ALIGN, NULL, NULL, &p), 0);
        assert_true(p.arena >= p.lower_bound);
        assert_no_overlap(g, &p);
        ka_graph_plan_free(&p);
        kg_destroy(g);
    }
}

static void test_transformer_plans(void **state)
{
    (void)state;
    ktf_shape s = ktf_shape_smollm2_135m();
    kg_graph *gs[2] = {ktf_build_prefill(&s, 1, 16, 32), ktf_build_decode(&s, 2, 64)};
    for (int i = 0; i < 2; i++) {
        assert_non_null(gs[i]);
        ka_graph_plan p;
        assert_int_equal(ka_plan_graph(gs[i], NULL, KA_ALIGN, NULL, NULL, &p), 0);
        assert_true(p.arena >= p.lower_bound);
        assert_no_overlap(gs[i], &p);
        ka_graph_plan_free(&p);
        kg_destroy(gs[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_reuses_pair),
        cmocka_unit_test(test_diamond),
        cmocka_unit_test(test_graph_order_checked),
        cmocka_unit_test(test_random_dags),
        cmocka_unit_test(test_transformer_plans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
