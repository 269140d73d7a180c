/* The event loop both processes run on (common/evloop.c): callbacks of
 * readable fds in registration order, removal and addition inside a
 * callback, a poll set rebuilt when watchers change, and evloop_stop
 * ending the round that called it. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/evloop.h"

#define N_PIPES 4

typedef struct fixture {
    evloop *l;
    int fds[N_PIPES][2];
    int handle[N_PIPES];
    int order[16];                /* indices of the pipes whose callback ran, in order */
    int n_order;
    int remove_in_cb;             /* pipe whose callback removes pipe REMOVE_TARGET; -1: none */
    int remove_target;
    int stop_in_cb;               /* pipe whose callback stops the loop; -1: none */
    int add_in_cb;                /* pipe whose callback adds pipe ADD_TARGET; -1: none */
    int add_target;
} fixture;

typedef struct watch {
    fixture *f;
    int i;
} watch;

static watch watches[N_PIPES];

static void drain(int fd)
{
    char buf[16];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
}

static void on_readable(evloop *l, void *arg)
{
    watch *w = arg;
    fixture *f = w->f;
    drain(f->fds[w->i][0]);
    f->order[f->n_order++] = w->i;
    if (w->i == f->remove_in_cb)
        evloop_remove(l, f->handle[f->remove_target]);
    if (w->i == f->add_in_cb)
        f->handle[f->add_target] =
            evloop_add(l, NULL, f->fds[f->add_target][0], on_readable, &watches[f->add_target]);
    if (w->i == f->stop_in_cb)
        evloop_stop(l);
}

static void poke(fixture *f, int i)
{
    assert_int_equal(write(f->fds[i][1], "x", 1), 1);
}

static int setup(void **state)
{
    static fixture f;
    memset(&f, 0, sizeof(f));
    f.l = evloop_create();
    assert_non_null(f.l);
    f.remove_in_cb = f.stop_in_cb = f.add_in_cb = -1;
    for (int i = 0; i < N_PIPES; i++) {
        assert_int_equal(pipe2(f.fds[i], O_NONBLOCK | O_CLOEXEC), 0);
        watches[i] = (watch){&f, i};
        f.handle[i] = -1;
    }
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    for (int i = 0; i < N_PIPES; i++) {
        close(f->fds[i][0]);
        close(f->fds[i][1]);
    }
    evloop_destroy(f->l);
    return 0;
}

static void add(fixture *f, int i)
{
    f->handle[i] = evloop_add(f->l, NULL, f->fds[i][0], on_readable, &watches[i]);
    assert_true(f->handle[i] >= 0);
}

/* Readable fds run their callbacks once per round, in registration order;
 * one that is not readable does not run. */
static void test_order_and_count(void **state)
{
    fixture *f = *state;
    for (int i = 0; i < 3; i++)
        add(f, i);
    poke(f, 2);
    poke(f, 0);
    assert_int_equal(evloop_run_once(f->l, 1000), 2);
    assert_int_equal(f->n_order, 2);
    assert_int_equal(f->order[0], 0);
    assert_int_equal(f->order[1], 2);
    assert_int_equal(evloop_run_once(f->l, 0), 0);
}

/* A watcher removed by an earlier callback of the same round does not
 * run, nor in later rounds; its slot is reused by the next add, and the
 * rebuilt poll set watches the new fd. */
static void test_remove_in_callback(void **state)
{
    fixture *f = *state;
    for (int i = 0; i < 3; i++)
        add(f, i);
    f->remove_in_cb = 0;
    f->remove_target = 2;
    int removed = f->handle[2];
    poke(f, 0);
    poke(f, 2);
    assert_int_equal(evloop_run_once(f->l, 1000), 1);
    assert_int_equal(f->n_order, 1);
    assert_int_equal(f->order[0], 0);
    f->remove_in_cb = -1;
    assert_int_equal(evloop_run_once(f->l, 0), 0);
    drain(f->fds[2][0]);
    add(f, 3);
    assert_int_equal(f->handle[3], removed);
    poke(f, 3);
    f->n_order = 0;
    assert_int_equal(evloop_run_once(f->l, 1000), 1);
    assert_int_equal(f->order[0], 3);
}

/* A watcher added inside a callback is polled from the next round on,
 * without taking the slot of one removed in the same round. */
static void test_add_in_callback(void **state)
{
    fixture *f = *state;
    add(f, 0);
    add(f, 1);
    f->remove_in_cb = 0;
    f->remove_target = 1;
    f->add_in_cb = 0;
    f->add_target = 2;
    poke(f, 0);
    poke(f, 2);
    assert_int_equal(evloop_run_once(f->l, 1000), 1);
    assert_int_not_equal(f->handle[2], f->handle[1]);
    f->remove_in_cb = f->add_in_cb = -1;
    f->n_order = 0;
    assert_int_equal(evloop_run_once(f->l, 1000), 1);
    assert_int_equal(f->order[0], 2);
}

/* evloop_stop ends the round: the callbacks after the one that stopped
 * run in the next round, and evloop_run returns. */
static void test_stop_ends_the_round(void **state)
{
    fixture *f = *state;
    for (int i = 0; i < 3; i++)
        add(f, i);
    f->stop_in_cb = 1;
    for (int i = 0; i < 3; i++)
        poke(f, i);
    evloop_run(f->l);
    assert_int_equal(f->n_order, 2);
    assert_int_equal(f->order[0], 0);
    assert_int_equal(f->order[1], 1);
    f->stop_in_cb = -1;
    assert_int_equal(evloop_run_once(f->l, 1000), 1);
    assert_int_equal(f->order[2], 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_order_and_count, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_in_callback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_add_in_callback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_ends_the_round, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
