/* The checks at the door (daemon/door.c): each refusal with its code and
 * message, the order in which they apply, and what a request that passes
 * brings through. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/diag.h"
#include "config/config.h"
#include "config/graph.h"
#include "daemon/door.h"

static const char *yaml =
    "version: 1\n"
    "workers: [{name: w0, device: cpu}]\n"
    "models: [{name: m, backend: echo, worker: w0}]\n"
    "graphs:\n"
    "  - name: g\n"
    "    inputs: [a, b]\n"
    "    body:\n"
    "      sequential:\n"
    "        - node: {name: n0, model: m, inputs: [a, b], outputs: [{name: y, to: n1}]}\n"
    "        - loop:\n"
    "            name: loop1\n"
    "            max_iters: 4\n"
    "            body:\n"
    "              node: {name: n1, model: m, inputs: [y], outputs: [{name: y, to: n1}]}\n"
    "            outputs: [{name: y, to: client}]\n";

typedef struct fixture {
    cfg_config *cfg;
    graph_set *gs;
    int32_t a[2], b[3];
    Baton__V1__Tensor ta, tb;
    Baton__V1__Tensor *inputs[4];
    int64_t da[1], db[1];
    Baton__V1__InferRequest q;
    Baton__V1__InferRequest__MaxItersEntry mi;
    Baton__V1__InferRequest__MaxItersEntry *mip[1];
    door_pass p;
    char why[512];
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    bt_diag *d = bt_diag_create("door.yaml");
    int rc = cfg_load_string(yaml, strlen(yaml), "door.yaml", d, &f->cfg);
    if (rc == 0)
        rc = graph_set_build(f->cfg, d, &f->gs);
    bt_diag_print(d, stderr);
    assert_int_equal(rc, 0);
    bt_diag_destroy(d);
    baton__v1__tensor__init(&f->ta);
    baton__v1__tensor__init(&f->tb);
    f->ta.name = "a";
    f->ta.dtype = BATON__V1__DTYPE__I32;
    f->da[0] = 2;
    f->ta.n_dims = 1;
    f->ta.dims = f->da;
    f->ta.data.len = sizeof(f->a);
    f->ta.data.data = (uint8_t *)f->a;
    f->tb.name = "b";
    f->tb.dtype = BATON__V1__DTYPE__I32;
    f->db[0] = 3;
    f->tb.n_dims = 1;
    f->tb.dims = f->db;
    f->tb.data.len = sizeof(f->b);
    f->tb.data.data = (uint8_t *)f->b;
    f->inputs[0] = &f->ta;
    f->inputs[1] = &f->tb;
    baton__v1__infer_request__init(&f->q);
    f->q.request_id = "r1";
    f->q.graph = "g";
    f->q.n_inputs = 2;
    f->q.inputs = f->inputs;
    baton__v1__infer_request__max_iters_entry__init(&f->mi);
    f->mip[0] = &f->mi;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    door_pass_free(&f->p);
    graph_set_destroy(f->gs);
    cfg_config_destroy(f->cfg);
    free(f);
    return 0;
}

static bt_code check(fixture *f)
{
    door_pass_free(&f->p);
    f->why[0] = 0;
    return door_check_infer(f->gs, &f->q, &f->p, f->why, sizeof(f->why));
}

static void test_passes(void **state)
{
    fixture *f = *state;
    f->inputs[0] = &f->tb; /* any order */
    f->inputs[1] = &f->ta;
    f->q.n_max_iters = 1;
    f->q.max_iters = f->mip;
    f->mi.key = "loop1";
    f->mi.value = 2;
    assert_int_equal(check(f), BT_CODE_OK);
    assert_string_equal(f->p.request_id, "r1");
    assert_string_equal(f->p.g->name, "g");
    assert_ptr_equal(f->p.by_input[0], &f->ta);
    assert_ptr_equal(f->p.by_input[1], &f->tb);
    int e = graph_entity_find(f->p.g, "loop1");
    assert_true(e >= 0);
    assert_int_equal(f->p.caps[e], 2);
    assert_int_equal(f->p.caps[graph_entity_find(f->p.g, "n0")], 0);
}

static void test_request_id(void **state)
{
    fixture *f = *state;
    f->q.request_id = "";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "request_id is empty");
    assert_string_equal(f->p.request_id, "");
    char long_id[300];
    memset(long_id, 'x', sizeof(long_id) - 1);
    long_id[sizeof(long_id) - 1] = 0;
    f->q.request_id = long_id;
    f->q.graph = "nope"; /* the id is checked first */
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_non_null(strstr(f->why, "299 bytes; at most 256"));
    assert_string_equal(f->p.request_id, "");
}

static void test_graph(void **state)
{
    fixture *f = *state;
    f->q.graph = "nope";
    f->ta.dtype = 99; /* the graph is checked before the inputs */
    assert_int_equal(check(f), BT_CODE_NOT_FOUND);
    assert_string_equal(f->why, "no graph named 'nope'");
    assert_string_equal(f->p.request_id, "r1");
}

static void test_inputs(void **state)
{
    fixture *f = *state;
    f->ta.name = "z";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "graph 'g' has no input named 'z'");
    f->ta.name = "b";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "input 'b' is given twice");
    f->ta.name = "a";
    f->q.n_inputs = 1;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "graph 'g' needs input 'b', which the request does not give");
}

static void test_tensors(void **state)
{
    fixture *f = *state;
    f->ta.dtype = BATON__V1__DTYPE__DTYPE_UNSPECIFIED;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_non_null(strstr(f->why, "unspecified or not a DType"));
    f->ta.dtype = BATON__V1__DTYPE__I32;
    f->da[0] = -1;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "input 'a' has negative dim 0 (-1)");
    int64_t huge[2] = {INT64_MAX, INT64_MAX};
    f->ta.dims = huge;
    f->ta.n_dims = 2;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "input 'a': the product of its dims overflows");
    f->ta.dims = f->da;
    f->ta.n_dims = 1;
    f->da[0] = 3;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "input 'a': dims give 12 bytes of I32 but the data has 8");
    int64_t many[9] = {1, 1, 1, 1, 1, 1, 1, 1, 2};
    f->ta.dims = many;
    f->ta.n_dims = 9;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "input 'a' has 9 dims; at most 8 are supported");
}

static void test_max_iters(void **state)
{
    fixture *f = *state;
    f->q.n_max_iters = 1;
    f->q.max_iters = f->mip;
    f->mi.key = "n0";
    f->mi.value = 2;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "max_iters names 'n0', which is not a loop of graph 'g'");
    f->mi.key = "loop1";
    f->mi.value = 0;
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "max_iters for loop 'loop1' is 0; a loop runs at least once");
    /* Inputs are checked before max_iters. */
    f->ta.name = "z";
    assert_int_equal(check(f), BT_CODE_INVALID_ARGUMENT);
    assert_string_equal(f->why, "graph 'g' has no input named 'z'");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_passes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_id, setup, teardown),
        cmocka_unit_test_setup_teardown(test_graph, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_iters, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
