/* The groups of tensor-parallel models (daemon/tpgroups.h): what happens
 * to a group when one of its ranks fails its load, on worker records made
 * by hand, with hooks that stand for the supervisor (a worker taken down
 * is lost, and losing it breaks its groups, as daemon/supervisor.c does).
 *
 * A rank's failed load holds the group: the other live ranks are taken
 * down, but not the failed one, also when their loss breaks the group; no
 * rank may be sent a Load; the reason is UTF-8 whatever the worker said.
 * Another rank registering again releases nothing; the failed worker
 * registering again does, and rank 0, waiting, is sent its Load; its id
 * then lets the others load. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/utf8.h"
#include "config/config.h"
#include "daemon/tpgroups.h"
#include "daemon/workers.h"

typedef struct fixture {
    tp_groups *t;
    worker_set *ws;
    int loads[8][2];              /* (model, rank) of each load hook call */
    size_t n_loads;
    char downs[8];                /* first letter after 'g' of each taken down worker */
    size_t n_downs;
} fixture;

static fixture F;

static void on_load(void *arg, sup_worker *w, size_t m, size_t k)
{
    (void)arg;
    assert_true(F.n_loads < 8);
    F.loads[F.n_loads][0] = (int)m;
    F.loads[F.n_loads][1] = (int)k;
    F.n_loads++;
    tpg_load_sent(F.t, m, k, w->registrations);
}

/* As the supervisor: the worker goes down, and its groups break. */
static void on_take_down(void *arg, sup_worker *w, const char *why)
{
    (void)arg;
    assert_non_null(strstr(why, "tensor-parallel group"));
    assert_true(F.n_downs < 8);
    F.downs[F.n_downs++] = w->cfg->name[1];
    w->state = SUP_DOWN;
    tpg_break(F.t, w);
}

static void test_failed_load_holds_the_group(void **state)
{
    (void)state;
    cfg_worker wc[3] = {{.name = "g0"}, {.name = "g1"}, {.name = "g2"}};
    cfg_str ranks[3] = {{.s = "g0"}, {.s = "g1"}, {.s = "g2"}};
    cfg_str one[1] = {{.s = "g0"}};
    cfg_model mc[2] = {{.name = "big", .workers = ranks, .n_workers = 3, .tp = 3},
                       {.name = "small", .workers = one, .n_workers = 1, .tp = 1}};
    cfg_config cfg = {.workers = wc, .n_workers = 3, .models = mc, .n_models = 2};
    memset(&F, 0, sizeof(F));
    assert_int_equal(workers_create(&cfg, NULL, &F.ws), 0);
    tpg_hooks hooks = {NULL, on_load, on_take_down};
    assert_int_equal(tpg_create(&cfg, F.ws, &hooks, &F.t), 0);
    sup_worker *g[3];
    for (int i = 0; i < 3; i++) {
        g[i] = workers_at(F.ws, i);
        g[i]->state = SUP_LOADING;
        g[i]->registrations = 1;
    }
    assert_null(tpg_held(F.t, 0));
    assert_false(tpg_waits(F.t, 0, 0));
    assert_true(tpg_waits(F.t, 0, 1)); /* no id yet */

    /* A failure of another model, of which g1 is no rank: nothing held. */
    tpg_load_failed(F.t, g[1], "small", "no");
    assert_null(tpg_held(F.t, 0));
    assert_int_equal(F.n_downs, 0);

    /* g1 fails: g0 and g2 go (g2's loss breaks the group again: g1 stays). */
    tpg_load_failed(F.t, g[1], "big", "disk \xff error");
    assert_int_equal(F.n_downs, 2);
    assert_int_equal(F.downs[0], '0');
    assert_int_equal(F.downs[1], '2');
    assert_int_equal(g[1]->state, SUP_LOADING);
    const char *held = tpg_held(F.t, 0);
    assert_non_null(held);
    assert_non_null(strstr(held, "rank 1 (worker g1) failed to load: disk "));
    assert_true(bt_utf8_valid(held, strlen(held)));
    assert_null(tpg_held(F.t, 1));
    for (size_t k = 0; k < 3; k++)
        assert_true(tpg_waits(F.t, 0, k)); /* no rank gets a Load */

    /* g0 and g2 come back: still held. */
    g[0]->state = g[2]->state = SUP_LOADING;
    g[0]->registrations = g[2]->registrations = 2;
    tpg_registered(F.t, g[0]);
    tpg_registered(F.t, g[2]);
    assert_non_null(tpg_held(F.t, 0));
    assert_int_equal(F.n_loads, 0);

    /* g1 registers again: released, and rank 0 (waiting) gets its Load. */
    g[1]->registrations = 2;
    tpg_registered(F.t, g[1]);
    assert_null(tpg_held(F.t, 0));
    assert_int_equal(F.n_loads, 1);
    assert_int_equal(F.loads[0][0], 0);
    assert_int_equal(F.loads[0][1], 0);
    assert_false(tpg_waits(F.t, 0, 0));
    assert_true(tpg_waits(F.t, 0, 1));

    /* Rank 0's id: the other two load with it. */
    uint8_t id[16] = {1, 2, 3};
    Baton__V1__TpGroup tg = BATON__V1__TP_GROUP__INIT;
    tg.model = "big";
    tg.comm_id.data = id;
    tg.comm_id.len = sizeof(id);
    tpg_on_group(F.t, g[0], &tg);
    assert_int_equal(F.n_loads, 3);
    assert_false(tpg_waits(F.t, 0, 1));
    assert_int_equal(F.n_downs, 2);

    tpg_destroy(F.t);
    workers_destroy(F.ws);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failed_load_holds_the_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
