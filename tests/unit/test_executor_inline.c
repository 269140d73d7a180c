/* Quick models on the I/O thread (worker/executor.c, wk_executor_run_inline):
 * a model's batches go to a lane until WK_INLINE_AFTER of them in a row ran
 * within inline_ns, and then run on the thread that queues them; one slow
 * batch sends the model back to the lanes, with whatever was queued for it
 * meanwhile (a run-ahead successor queued by the slow step itself, which
 * had been left to the inline thread).  Each test checks on which thread
 * every batch ran, not how long anything took: the batches of a test are
 * either far below or far above its inline_ns. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/status.h"
#include "tests/unit/wk_dispatch_msg.h"
#include "worker/device.h"
#include "worker/executor.h"
#include "worker/item.h"
#include "worker/store.h"

#define MAX_RUNS 64

/* The model's behaviour and what the test saw, shared with the lane. */
typedef struct fixture {
    pthread_mutex_t lock;
    atomic_bool stopping;
    wk_device *dev;
    wk_store *store;
    wk_executor *ex;
    wk_model *model;
    wk_request *req;
    wk_dispatch *disp;
    pthread_t main_thread;
    atomic_uint sleep_us;         /* how long each execute() sleeps */
    atomic_uint defers;           /* items execute() defers (ctx->defer) before it runs any */
    unsigned successors;          /* [lock] items an ended item still queues after it */
    unsigned ended;               /* [lock] items ended */
    bool on_main[MAX_RUNS];       /* [lock] whether item i ended on the test's thread */
} fixture;

static fixture *g_fx; /* the backend reaches the fixture through it */

static void tick_unload(baton_model *m)
{
    (void)m;
}

/* Runs nothing but a sleep of sleep_us, a batch that takes that long;
 * defers the first `defers` items it is given. */
static void tick_execute(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    (void)m;
    for (size_t i = 0; i < n; i++) {
        unsigned d = atomic_load(&g_fx->defers);
        if (d && atomic_compare_exchange_strong(&g_fx->defers, &d, d - 1))
            ctx->defer(ctx, items[i]);
    }
    unsigned us = atomic_load(&g_fx->sleep_us);
    if (us) {
        struct timespec ts = {us / 1000000u, (long)(us % 1000000u) * 1000};
        nanosleep(&ts, NULL);
    }
}

static const baton_backend tick_backend = {.name = "tick", .model_unload = tick_unload,
                                           .execute = tick_execute};

/* Queues one item of the fixture's dispatch.  [lock] */
static void queue_item(fixture *f)
{
    uint32_t iter[1] = {f->ended};
    wk_item *it = wk_item_create(f->disp, f->req, f->model, iter, 1, NULL);
    assert_non_null(it);
    assert_int_equal(wk_executor_enqueue(f->ex, it), 0);
}

/* On the thread that ran it, under the lock: notes where the item ended,
 * frees it and, while successors are asked for, queues the next one as a
 * run-ahead chain does. */
static void hook_item_ended(void *arg, wk_item *it)
{
    fixture *f = arg;
    assert_true(f->ended < MAX_RUNS);
    f->on_main[f->ended++] = pthread_equal(pthread_self(), f->main_thread);
    it->req->n_running--;
    wk_item_destroy(it);
    if (f->successors) {
        f->successors--;
        queue_item(f);
    }
}

static int hook_chunk(void *arg, wk_item *it, const wk_chunk *c)
{
    (void)arg, (void)it, (void)c;
    return 0;
}

/* An executor with one lane and model "m", the test's thread its inline
 * thread, and INLINE_NS as its threshold. */
static void setup(fixture *f, uint64_t inline_ns)
{
    memset(f, 0, sizeof(*f));
    g_fx = f;
    pthread_mutex_init(&f->lock, NULL);
    atomic_init(&f->stopping, false);
    atomic_init(&f->sleep_us, 0);
    atomic_init(&f->defers, 0);
    f->main_thread = pthread_self();
    char err[256], name[64];
    snprintf(name, sizeof(name), "exec-inline-%d", (int)getpid());
    assert_int_equal(wk_device_open(&f->dev, "cpu", "test", name, 1 << 20, err, sizeof(err)), 0);
    assert_int_equal(wk_store_create(f->dev, 0, 0, &f->store), 0);
    wk_executor_options eo = {.lock = &f->lock, .stopping = &f->stopping, .store = f->store,
                              .dev = f->dev, .worker = "w0", .device = "cpu", .threads = 1,
                              .lanes = 1, .inline_ns = inline_ns};
    wk_executor_hooks eh = {.arg = f, .item_ended = hook_item_ended, .chunk = hook_chunk};
    assert_int_equal(wk_executor_create(&eo, &eh, &f->ex), 0);
    f->model = calloc(1, sizeof(*f->model));
    assert_non_null(f->model);
    f->model->name = strdup("m");
    f->model->backend_spec = strdup("tick");
    f->model->backend = &tick_backend;
    f->model->max_batch = 1;
    f->model->tp_size = 1;
    wk_executor_model_add(f->ex, f->model);
    f->req = wk_store_request(f->store, 9, true);
    assert_non_null(f->req);
    f->disp = tu_dispatch_new(f->store, 9, "r9", 0, 0, 1);
    wk_executor_inline_thread(f->ex);
    assert_int_equal(wk_executor_start(f->ex), 0);
}

static void teardown(fixture *f)
{
    pthread_mutex_lock(&f->lock);
    atomic_store(&f->stopping, true);
    pthread_mutex_unlock(&f->lock);
    wk_executor_stop(f->ex);
    assert_int_equal(wk_executor_n_queued(f->ex), 0);
    wk_item_dispatch_unref(f->disp);
    wk_store_request_gc(f->store, f->req);
    wk_executor_destroy(f->ex);
    wk_store_destroy(f->store);
    wk_device_close(f->dev);
    pthread_mutex_destroy(&f->lock);
    g_fx = NULL;
}

/* Waits until N items have ended and no thread holds the model, so that
 * the lane (which drops the lock only to run a batch or to sleep) is
 * asleep.  Runs the inline thread's share meanwhile, as the worker's I/O
 * loop does.  Fails after 20 s. */
static void wait_ended(fixture *f, unsigned n)
{
    for (int i = 0; i < 200000; i++) {
        wk_executor_run_inline(f->ex);
        pthread_mutex_lock(&f->lock);
        bool done = f->ended >= n && !f->model->busy && wk_executor_n_queued(f->ex) == 0;
        pthread_mutex_unlock(&f->lock);
        if (done)
            return;
        usleep(100);
    }
    fail_msg("%u of %u items ended", f->ended, n);
}

/* The first WK_INLINE_AFTER batches run on the lane; once they were all
 * quick, the model's next ones run on the thread that queued them, which
 * no lane is woken for. */
static void test_quick_model_runs_inline(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 1000000000u); /* a second: any batch of this model is quick */
    const unsigned n = WK_INLINE_AFTER + 4;
    for (unsigned i = 0; i < n; i++) {
        pthread_mutex_lock(&f.lock);
        queue_item(&f);
        pthread_mutex_unlock(&f.lock);
        /* Time for a lane to take the item, were it woken: once the model
         * runs inline, none is, and the item is still there. */
        usleep(20000);
        wait_ended(&f, i + 1);
    }
    pthread_mutex_lock(&f.lock);
    for (unsigned i = 0; i < n; i++)
        assert_int_equal(f.on_main[i], i >= WK_INLINE_AFTER);
    assert_int_equal(wk_executor_inline_batches(f.ex), n - WK_INLINE_AFTER);
    pthread_mutex_unlock(&f.lock);
    teardown(&f);
}

/* A model that runs inline and whose step is slow goes back to the lanes;
 * the successor that slow step queued (left to the inline thread, since
 * the model still ran inline when it was queued) must reach a lane, or it
 * waits forever.  The chain then runs on the lane until quick again. */
static void test_slow_batch_goes_back_to_lanes(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 200000000u); /* 200 ms: far above a batch that only returns */
    for (unsigned i = 0; i < WK_INLINE_AFTER; i++) {
        pthread_mutex_lock(&f.lock);
        queue_item(&f);
        pthread_mutex_unlock(&f.lock);
        wait_ended(&f, i + 1);
    }
    /* Inline now.  One slow step (600 ms), queueing two successors in
     * turn: the first is queued during the slow step. */
    atomic_store(&f.sleep_us, 600000u);
    pthread_mutex_lock(&f.lock);
    f.successors = 2;
    queue_item(&f);
    pthread_mutex_unlock(&f.lock);
    /* The slow step runs here; after it only the lane may run the rest. */
    wk_executor_run_inline(f.ex);
    atomic_store(&f.sleep_us, 0);
    pthread_mutex_lock(&f.lock);
    assert_true(f.on_main[WK_INLINE_AFTER]);
    assert_int_equal(wk_executor_inline_batches(f.ex), 1);
    pthread_mutex_unlock(&f.lock);
    for (int i = 0; i < 200000; i++) {
        pthread_mutex_lock(&f.lock);
        bool done = f.ended == WK_INLINE_AFTER + 3 && !f.model->busy;
        pthread_mutex_unlock(&f.lock);
        if (done)
            break;
        usleep(100);
    }
    pthread_mutex_lock(&f.lock);
    assert_int_equal(f.ended, WK_INLINE_AFTER + 3);
    assert_false(f.on_main[WK_INLINE_AFTER + 1]);
    assert_false(f.on_main[WK_INLINE_AFTER + 2]);
    assert_int_equal(wk_executor_inline_batches(f.ex), 1);
    pthread_mutex_unlock(&f.lock);
    teardown(&f);
}

/* Drives the inline thread as the worker's I/O loop does: once, and again
 * only while it says work is due (the loop polls without sleeping then). */
static void run_inline_until_idle(fixture *f)
{
    for (int i = 0; i < 1000 && wk_executor_run_inline(f->ex); i++)
        ;
}

/* An item deferred on the inline thread runs again once another item of
 * its model has ended, with nothing else coming: the end made it ready,
 * and that is work due to the inline thread, as a lane would find it. */
static void test_deferred_item_runs_inline(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 1000000000u);
    for (unsigned i = 0; i < WK_INLINE_AFTER; i++) {
        pthread_mutex_lock(&f.lock);
        queue_item(&f);
        pthread_mutex_unlock(&f.lock);
        wait_ended(&f, i + 1);
    }
    /* A, deferred at its first run; then B, whose end makes A ready. */
    atomic_store(&f.defers, 1);
    pthread_mutex_lock(&f.lock);
    queue_item(&f);
    queue_item(&f);
    pthread_mutex_unlock(&f.lock);
    run_inline_until_idle(&f);
    pthread_mutex_lock(&f.lock);
    assert_int_equal(f.ended, WK_INLINE_AFTER + 2);
    assert_int_equal(wk_executor_n_queued(f.ex), 0);
    assert_true(f.on_main[WK_INLINE_AFTER] && f.on_main[WK_INLINE_AFTER + 1]);
    pthread_mutex_unlock(&f.lock);
    teardown(&f);
}

/* inline_ns 0: every batch runs on a lane, however quick. */
static void test_inline_off(void **state)
{
    (void)state;
    fixture f;
    setup(&f, 0);
    for (unsigned i = 0; i < WK_INLINE_AFTER + 4; i++) {
        pthread_mutex_lock(&f.lock);
        queue_item(&f);
        pthread_mutex_unlock(&f.lock);
        wait_ended(&f, i + 1);
        pthread_mutex_lock(&f.lock);
        assert_false(f.on_main[i]);
        pthread_mutex_unlock(&f.lock);
    }
    assert_int_equal(wk_executor_inline_batches(f.ex), 0);
    teardown(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quick_model_runs_inline),
        cmocka_unit_test(test_slow_batch_goes_back_to_lanes),
        cmocka_unit_test(test_deferred_item_runs_inline),
        cmocka_unit_test(test_inline_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
