/* The built-in test backends (backends/testing/) called through the
 * ABI with a fake ctx, exactly as config/README.md states them; and the
 * backend registry and plugin loader (worker/plugin.c) with the example
 * plugin tests/unit/plugin/example.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <cmocka.h>

#include "backends/builtin.h"
#include "backends/catalog.h"
#include "backends/testing/testing.h"
#include "backends/transformer/transformer.h"
#include "tests/unit/fake_ctx.h"
#include "worker/plugin.h"

/* --- a fake ctx that records what a backend does ------------------------- */

#define MAXT 64

typedef struct fake_chunk {
    uint32_t output;
    const baton_tensor *t; /* NULL: an empty final chunk */
    int final;
} fake_chunk;

typedef struct fake {
    baton_ctx ctx;
    baton_tensor *allocs[MAXT];
    size_t n_allocs;
    const baton_tensor *outputs[8];
    fake_chunk chunks[MAXT];
    size_t n_chunks;
    int finished;
    int deferred;          /* the backend put the item back (defer) */
    baton_status code;
    char message[256];
    baton_status cancel;   /* what cancelled() and sleep_ms() report */
    uint32_t slept_ms;
} fake;

static fake *of(baton_ctx *c)
{
    return (fake *)c;
}

static baton_tensor *f_alloc(baton_ctx *c, baton_item *it, baton_dtype dt, uint32_t nd,
                             const int64_t *dims)
{
    (void)it;
    fake *f = of(c);
    baton_tensor *t = calloc(1, sizeof(*t));
    t->dtype = dt;
    t->ndim = nd;
    uint64_t n = baton_dtype_size(dt);
    for (uint32_t i = 0; i < nd; i++) {
        t->dims[i] = dims[i];
        n *= (uint64_t)dims[i];
    }
    t->nbytes = n;
    t->data = calloc(1, n ? n : 1);
    t->handle = 1000 + f->n_allocs;
    f->allocs[f->n_allocs++] = t;
    return t;
}

static int f_set_output(baton_ctx *c, baton_item *it, uint32_t o, const baton_tensor *t)
{
    if (o >= it->n_outputs)
        return -1;
    of(c)->outputs[o] = t;
    return 0;
}

static int f_forward(baton_ctx *c, baton_item *it, uint32_t o, uint32_t in)
{
    return f_set_output(c, it, o, &it->inputs[in].tensor);
}

static int f_emit(baton_ctx *c, baton_item *it, uint32_t o, const baton_tensor *t, int final)
{
    fake *f = of(c);
    assert_true(o < it->n_outputs);
    assert_true(it->outputs[o].stream);
    f->chunks[f->n_chunks++] = (fake_chunk){o, t, final};
    return 0;
}

static void f_finish(baton_ctx *c, baton_item *it)
{
    (void)it;
    of(c)->finished = 1;
}

static void f_defer(baton_ctx *c, baton_item *it)
{
    (void)it;
    of(c)->deferred = 1;
}

static void f_fail(baton_ctx *c, baton_item *it, baton_status code, const char *msg)
{
    (void)it;
    of(c)->code = code;
    snprintf(of(c)->message, sizeof(of(c)->message), "%s", msg);
}

static baton_status f_cancelled(baton_ctx *c, const baton_item *it)
{
    (void)it;
    return of(c)->cancel;
}

static baton_status f_sleep(baton_ctx *c, const baton_item *it, uint32_t ms)
{
    (void)it;
    fake *f = of(c);
    f->slept_ms += ms;
    if (f->cancel == BATON_STATUS_OK) {
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return f->cancel;
}

static fake *fake_new(void)
{
    fake *f = calloc(1, sizeof(*f));
    f->ctx = (baton_ctx){.alloc = f_alloc, .set_output = f_set_output, .forward = f_forward,
                         .emit_chunk = f_emit, .finish = f_finish, .defer = f_defer,
                         .fail = f_fail,
                         .cancelled = f_cancelled, .sleep_ms = f_sleep,
                         .read = fake_ctx_read, .write = fake_ctx_write, .threads = 1,
                         .device = "cpu"};
    return f;
}

static void fake_free(fake *f)
{
    for (size_t i = 0; i < f->n_allocs; i++) {
        free(f->allocs[i]->data);
        free(f->allocs[i]);
    }
    free(f);
}

/* An input tensor over caller-owned data. */
static baton_input in_t(const char *name, baton_dtype dt, uint32_t nd, const int64_t *dims,
                        void *data, uint64_t handle)
{
    baton_input in = {0};
    in.name = name;
    in.tensor.dtype = dt;
    in.tensor.ndim = nd;
    uint64_t n = baton_dtype_size(dt);
    for (uint32_t i = 0; i < nd; i++) {
        in.tensor.dims[i] = dims[i];
        n *= (uint64_t)dims[i];
    }
    in.tensor.nbytes = n;
    in.tensor.data = data;
    in.tensor.handle = handle;
    return in;
}

/* Loads built-in NAME with options KEYS=VALUES (N of them). */
static baton_model *load(const char *name, const char **keys, const char **values, size_t n,
                         baton_status want)
{
    const baton_backend *b = bk_testing_backend(name);
    assert_non_null(b);
    assert_int_equal(b->abi_version, BATON_BACKEND_ABI_VERSION);
    baton_load_params p = {name, keys, values, n, 0, 1, "cpu", 4, 1};
    baton_model *m = NULL;
    char err[256] = "";
    baton_status st = b->model_load(&p, &m, err, sizeof(err));
    if (st != want)
        fail_msg("load of %s: status %d (%s), expected %d", name, st, err, want);
    return m;
}

static void run(const char *name, baton_model *m, fake *f, baton_item *it)
{
    baton_item *items[1] = {it};
    bk_testing_backend(name)->execute(m, &f->ctx, items, 1);
}

static void unload(const char *name, baton_model *m)
{
    bk_testing_backend(name)->model_unload(m);
}

/* --- tests --------------------------------------------------------------- */

char *openblas_get_corename(void);

/* The OpenBLAS core check: a CPU with AVX2 never keeps Prescott's kernels
 * (unless the user chose a core), and another choice is left alone. */
static void test_blas_core(void **state)
{
    (void)state;
    const char *core = openblas_get_corename(), *want = bk_blas_better_core();
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    print_message("OpenBLAS core %s; baton would ask for %s\n", core, want ? want : "nothing");
    if (getenv("OPENBLAS_CORETYPE") || strcasecmp(core, "Prescott") != 0 || !avx2)
        assert_null(want);
    else
        assert_true(!strcmp(want, "Haswell") || !strcmp(want, "SkylakeX"));
    /* The user's choice wins. */
    setenv("OPENBLAS_CORETYPE", "Prescott", 1);
    assert_null(bk_blas_better_core());
    unsetenv("OPENBLAS_CORETYPE");
}

static void test_echo_by_reference(void **state)
{
    (void)state;
    baton_model *m = load("echo", NULL, NULL, 0, BATON_STATUS_OK);
    int32_t a = 1, b = 2;
    baton_input ins[2] = {in_t("a", BATON_DTYPE_I32, 1, (int64_t[]){1}, &a, 11),
                          in_t("b", BATON_DTYPE_I32, 1, (int64_t[]){1}, &b, 12)};
    baton_output outs[2] = {{"b", 0, 0}, {"c", 0, 1}};
    baton_item it = {.node_name = "e", .inputs = ins, .n_inputs = 2, .outputs = outs,
                     .n_outputs = 2};
    fake *f = fake_new();
    run("echo", m, f, &it);
    assert_int_equal(f->code, BATON_STATUS_OK);
    /* Output b is input b itself and c is the first input: the very same
     * tensors, no allocation, no copy. */
    assert_ptr_equal(f->outputs[0], &ins[1].tensor);
    assert_ptr_equal(f->outputs[1], &ins[0].tensor);
    assert_int_equal(f->n_allocs, 0);
    fake_free(f);

    baton_item none = {.node_name = "lonely", .outputs = outs, .n_outputs = 1};
    f = fake_new();
    run("echo", m, f, &none);
    assert_int_equal(f->code, BATON_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(f->message, "lonely"));
    fake_free(f);
    unload("echo", m);
}

static void test_add(void **state)
{
    (void)state;
    baton_model *m = load("add", NULL, NULL, 0, BATON_STATUS_OK);
    baton_output outs[2] = {{"s", 0, 0}, {"t", 0, 0}};

    float x[3] = {1, 2, 3}, y[3] = {0.5f, 0.25f, -3}, z[3] = {10, 20, 30};
    baton_input fi[3] = {in_t("x", BATON_DTYPE_F32, 1, (int64_t[]){3}, x, 1),
                         in_t("y", BATON_DTYPE_F32, 1, (int64_t[]){3}, y, 2),
                         in_t("z", BATON_DTYPE_F32, 1, (int64_t[]){3}, z, 3)};
    baton_item it = {.node_name = "sum", .inputs = fi, .n_inputs = 3, .outputs = outs,
                     .n_outputs = 2};
    fake *f = fake_new();
    run("add", m, f, &it);
    assert_int_equal(f->code, BATON_STATUS_OK);
    const float *s = f->outputs[0]->data;
    assert_true(s[0] == 11.5f && s[1] == 22.25f && s[2] == 30.0f);
    assert_ptr_equal(f->outputs[0], f->outputs[1]);
    assert_int_equal(f->outputs[0]->dims[0], 3);
    fake_free(f);

    int32_t ia[2] = {INT32_MAX, -5}, ib[2] = {1, 7};
    baton_input ii[2] = {in_t("a", BATON_DTYPE_I32, 2, (int64_t[]){1, 2}, ia, 1),
                         in_t("b", BATON_DTYPE_I32, 2, (int64_t[]){1, 2}, ib, 2)};
    it.inputs = ii;
    it.n_inputs = 2;
    it.n_outputs = 1;
    f = fake_new();
    run("add", m, f, &it);
    const int32_t *is = f->outputs[0]->data;
    assert_int_equal(is[0], INT32_MIN); /* two's complement wrap, not UB */
    assert_int_equal(is[1], 2);
    fake_free(f);

    /* F16: 1.5 + 2.25 = 3.75 (0x3e00 + 0x4080 = 0x4380); BF16 likewise. */
    uint16_t ha[1] = {0x3e00}, hb[1] = {0x4080};
    baton_input hi[2] = {in_t("a", BATON_DTYPE_F16, 1, (int64_t[]){1}, ha, 1),
                         in_t("b", BATON_DTYPE_F16, 1, (int64_t[]){1}, hb, 2)};
    it.inputs = hi;
    f = fake_new();
    run("add", m, f, &it);
    assert_int_equal(*(const uint16_t *)f->outputs[0]->data, 0x4380);
    fake_free(f);
    uint16_t ba[1] = {0x3fc0}, bb[1] = {0x4010};
    baton_input bi[2] = {in_t("a", BATON_DTYPE_BF16, 1, (int64_t[]){1}, ba, 1),
                         in_t("b", BATON_DTYPE_BF16, 1, (int64_t[]){1}, bb, 2)};
    it.inputs = bi;
    f = fake_new();
    run("add", m, f, &it);
    assert_int_equal(*(const uint16_t *)f->outputs[0]->data, 0x4070);
    fake_free(f);

    /* Shapes that differ: INVALID_ARGUMENT naming the node. */
    baton_input bad[2] = {in_t("a", BATON_DTYPE_I32, 1, (int64_t[]){2}, ia, 1),
                          in_t("b", BATON_DTYPE_I32, 2, (int64_t[]){1, 2}, ib, 2)};
    it.inputs = bad;
    f = fake_new();
    run("add", m, f, &it);
    assert_int_equal(f->code, BATON_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(f->message, "node 'sum'"));
    assert_null(f->outputs[0]);
    fake_free(f);
    baton_input badt[2] = {in_t("a", BATON_DTYPE_I32, 1, (int64_t[]){1}, ia, 1),
                           in_t("b", BATON_DTYPE_F32, 1, (int64_t[]){1}, x, 2)};
    it.inputs = badt;
    f = fake_new();
    run("add", m, f, &it);
    assert_int_equal(f->code, BATON_STATUS_INVALID_ARGUMENT);
    fake_free(f);
    unload("add", m);
}

static void test_counter(void **state)
{
    (void)state;
    const char *k[] = {"finish_after"}, *v[] = {"4"};
    baton_model *m = load("counter", k, v, 1, BATON_STATUS_OK);
    baton_output outs[2] = {{"state", 0, 0}, {"iteration", 0, 1}};
    int32_t x = 99;
    baton_input ins[1] = {in_t("state", BATON_DTYPE_I32, 1, (int64_t[]){1}, &x, 1)};
    for (uint32_t i = 0; i < 5; i++) {
        uint32_t iter[2] = {7, i}; /* the innermost loop counts, not the outer one */
        baton_item it = {.node_name = "tick", .iteration = iter, .depth = 2, .inputs = ins,
                         .n_inputs = 1, .outputs = outs, .n_outputs = 2};
        fake *f = fake_new();
        run("counter", m, f, &it);
        assert_int_equal(f->outputs[0]->dtype, BATON_DTYPE_I32);
        assert_int_equal(f->outputs[0]->ndim, 1);
        assert_int_equal(f->outputs[0]->dims[0], 1);
        assert_int_equal(*(const int32_t *)f->outputs[0]->data, (int32_t)i);
        assert_int_equal(*(const int32_t *)f->outputs[1]->data, (int32_t)i);
        assert_int_equal(f->finished, i + 1 == 4);
        fake_free(f);
    }
    unload("counter", m);

    /* Outside loops: 0; without finish_after: never finishes. */
    m = load("counter", NULL, NULL, 0, BATON_STATUS_OK);
    baton_item top = {.node_name = "c", .outputs = outs, .n_outputs = 1};
    fake *f = fake_new();
    run("counter", m, f, &top);
    assert_int_equal(*(const int32_t *)f->outputs[0]->data, 0);
    assert_false(f->finished);
    fake_free(f);
    unload("counter", m);
}

/* What one execution of counter's node `gate` at ITERATION of session S
 * did, in a fresh recording context. */
typedef struct counter_run {
    bool deferred, finished, output;
    int32_t value;               /* the output's, when there is one */
    baton_status code;
} counter_run;

static counter_run counter_step(baton_model *m, baton_session *s, uint32_t iteration)
{
    baton_output outs[1] = {{"it", 0, 0}};
    baton_item it = {.node_name = "gate", .iteration = &iteration, .depth = 1, .outputs = outs,
                     .n_outputs = 1, .session = s};
    fake *f = fake_new();
    run("counter", m, f, &it);
    counter_run r = {f->deferred != 0, f->finished != 0, f->outputs[0] != NULL,
                     f->outputs[0] ? *(const int32_t *)f->outputs[0]->data : -1, f->code};
    fake_free(f);
    return r;
}

/* counter with slots 1: the loop of a request holds the one place from its
 * first execution to its finish; another request's item is deferred (no
 * output, no failure) until the place is given back, by the finish or by
 * the holder's session closing. */
static void test_counter_slots(void **state)
{
    (void)state;
    const char *k[] = {"finish_after", "slots"}, *v[] = {"2", "1"};
    baton_model *m = load("counter", k, v, 2, BATON_STATUS_OK);
    const baton_backend *b = bk_testing_backend("counter");
    baton_session *sa = NULL, *sb = NULL, *sc = NULL;
    char err[128];
    assert_int_equal(b->session_open(m, 1, &sa, err, sizeof(err)), BATON_STATUS_OK);
    assert_int_equal(b->session_open(m, 2, &sb, err, sizeof(err)), BATON_STATUS_OK);
    assert_int_equal(b->session_open(m, 3, &sc, err, sizeof(err)), BATON_STATUS_OK);
    assert_true(sa && sb && sc);
    /* A takes the place; B waits. */
    counter_run r = counter_step(m, sa, 0);
    assert_true(!r.deferred && r.output);
    r = counter_step(m, sb, 0);
    assert_true(r.deferred && !r.output);
    assert_int_equal(r.code, BATON_STATUS_OK);
    /* A's finish gives it back: B takes it, and C waits. */
    r = counter_step(m, sa, 1);
    assert_true(r.finished && !r.deferred);
    r = counter_step(m, sb, 0);
    assert_true(!r.deferred && r.output);
    assert_int_equal(r.value, 0);
    r = counter_step(m, sc, 0);
    assert_true(r.deferred);
    /* B's session closing before its finish gives it back too. */
    b->session_close(m, sb);
    r = counter_step(m, sc, 0);
    assert_true(!r.deferred && r.output);
    b->session_close(m, sa);
    b->session_close(m, sc);
    unload("counter", m);
}

static void test_chunks(void **state)
{
    (void)state;
    const char *k[] = {"n"}, *v3[] = {"3"}, *v0[] = {"0"};
    baton_model *m = load("chunks", k, v3, 1, BATON_STATUS_OK);
    int32_t x = 5;
    baton_input ins[1] = {in_t("x", BATON_DTYPE_I32, 1, (int64_t[]){1}, &x, 1)};
    baton_output outs[3] = {{"part", 1, 0}, {"x", 0, 0}, {"more", 1, 1}};
    baton_item it = {.node_name = "spread", .inputs = ins, .n_inputs = 1, .outputs = outs,
                     .n_outputs = 3};
    fake *f = fake_new();
    run("chunks", m, f, &it);
    assert_int_equal(f->n_chunks, 6);
    for (size_t c = 0; c < 6; c++) {
        assert_int_equal(f->chunks[c].output, c < 3 ? 0 : 2);
        assert_int_equal(*(const int32_t *)f->chunks[c].t->data, (int32_t)(c % 3));
        assert_int_equal(f->chunks[c].t->dims[0], 1);
        assert_int_equal(f->chunks[c].final, c % 3 == 2);
    }
    assert_ptr_equal(f->outputs[1], &ins[0].tensor);
    assert_null(f->outputs[0]);
    fake_free(f);
    unload("chunks", m);

    m = load("chunks", k, v0, 1, BATON_STATUS_OK);
    f = fake_new();
    run("chunks", m, f, &it);
    assert_int_equal(f->n_chunks, 2); /* one empty final chunk per stream output */
    assert_null(f->chunks[0].t);
    assert_true(f->chunks[0].final);
    fake_free(f);
    unload("chunks", m);
}

static void test_sleep(void **state)
{
    (void)state;
    const char *k[] = {"ms"}, *v[] = {"30"};
    baton_model *m = load("sleep", k, v, 1, BATON_STATUS_OK);
    int32_t x = 5;
    baton_input ins[1] = {in_t("x", BATON_DTYPE_I32, 1, (int64_t[]){1}, &x, 1)};
    baton_output outs[1] = {{"y", 0, 0}};
    baton_item it = {.node_name = "nap", .inputs = ins, .n_inputs = 1, .outputs = outs,
                     .n_outputs = 1};
    struct timespec t0, t1;
    fake *f = fake_new();
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run("sleep", m, f, &it);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    assert_true(ms >= 25.0);
    assert_true(f->slept_ms >= 25 && f->slept_ms <= 30);
    assert_ptr_equal(f->outputs[0], &ins[0].tensor);
    fake_free(f);

    f = fake_new();
    f->cancel = BATON_STATUS_DEADLINE_EXCEEDED;
    run("sleep", m, f, &it);
    assert_int_equal(f->code, BATON_STATUS_DEADLINE_EXCEEDED);
    assert_null(f->outputs[0]);
    fake_free(f);
    f = fake_new();
    f->cancel = BATON_STATUS_CANCELLED;
    run("sleep", m, f, &it);
    assert_int_equal(f->code, BATON_STATUS_CANCELLED);
    fake_free(f);
    unload("sleep", m);
}

static void test_fail(void **state)
{
    (void)state;
    const char *k[] = {"message"}, *v[] = {"boom at step 3"};
    baton_model *m = load("fail", k, v, 1, BATON_STATUS_OK);
    baton_output outs[1] = {{"y", 0, 0}};
    baton_item it = {.node_name = "f", .outputs = outs, .n_outputs = 1};
    fake *f = fake_new();
    run("fail", m, f, &it);
    assert_int_equal(f->code, BATON_STATUS_INTERNAL);
    assert_string_equal(f->message, "boom at step 3");
    fake_free(f);
    unload("fail", m);
    m = load("fail", NULL, NULL, 0, BATON_STATUS_OK);
    f = fake_new();
    run("fail", m, f, &it);
    assert_string_equal(f->message, "failure injected by the fail backend");
    fake_free(f);
    unload("fail", m);
}

static void test_load_options(void **state)
{
    (void)state;
    const char *k[] = {"nn"}, *v[] = {"3"};
    assert_null(load("chunks", k, v, 1, BATON_STATUS_INVALID_ARGUMENT));
    const char *k2[] = {"n"}, *v2[] = {"three"};
    assert_null(load("chunks", k2, v2, 1, BATON_STATUS_INVALID_ARGUMENT));
    const char *v3[] = {"-1"};
    assert_null(load("chunks", k2, v3, 1, BATON_STATUS_INVALID_ARGUMENT));
    assert_null(load("echo", k2, v2, 1, BATON_STATUS_INVALID_ARGUMENT));
    assert_null(bk_testing_backend("transformer"));
    assert_null(bk_testing_backend("nope"));
}

/* The test backends read their options through the catalog: a load that
 * names none gets the declared defaults, and a refusal is the catalog's,
 * the same that `batond --check-config` gives. */
static void test_options_from_catalog(void **state)
{
    (void)state;
    const bt_backend_desc *b = bt_backend_find("chunks");
    const bt_opt_desc *d = bt_backend_option(b, "n");
    bt_opt_value def;
    assert_int_equal(bt_opt_parse(b, d, NULL, &def, NULL, 0), 0);
    baton_model *m = load("chunks", NULL, NULL, 0, BATON_STATUS_OK);
    int32_t x = 5;
    baton_input ins[1] = {in_t("x", BATON_DTYPE_I32, 1, (int64_t[]){1}, &x, 1)};
    baton_output outs[1] = {{"part", 1, 0}};
    baton_item it = {.node_name = "spread", .inputs = ins, .n_inputs = 1, .outputs = outs,
                     .n_outputs = 1};
    fake *f = fake_new();
    run("chunks", m, f, &it);
    assert_int_equal(f->n_chunks, def.i);
    fake_free(f);
    unload("chunks", m);

    /* Out of range and not a number: the backend's message is the
     * catalog's, word for word. */
    static const char *const texts[] = {"-1", "three"};
    for (size_t i = 0; i < 2; i++) {
        const char *k[] = {"n"}, *v[] = {texts[i]};
        baton_load_params p = {"chunks", k, v, 1, 0, 1, "cpu", 4, 1};
        baton_model *bad = NULL;
        char err[256] = "", want[256] = "";
        assert_int_equal(bk_testing_backend("chunks")->model_load(&p, &bad, err, sizeof(err)),
                         BATON_STATUS_INVALID_ARGUMENT);
        assert_null(bad);
        bt_opt_value ignored;
        assert_int_not_equal(bt_opt_parse(b, d, texts[i], &ignored, want, sizeof(want)), 0);
        assert_string_equal(err, want);
    }

    /* fail's message defaults to the declared text. */
    const bt_backend_desc *fb = bt_backend_find("fail");
    m = load("fail", NULL, NULL, 0, BATON_STATUS_OK);
    f = fake_new();
    baton_item fit = {.node_name = "boom"};
    run("fail", m, f, &fit);
    assert_string_equal(f->message, bt_backend_option(fb, "message")->def);
    fake_free(f);
    unload("fail", m);
}

static const char *plugin_path(char *buf, size_t len)
{
    const char *build = getenv("BUILD");
    snprintf(buf, len, "%s/tests/plugin_example.so", build && *build ? build : "build");
    return buf;
}

static void test_registry(void **state)
{
    (void)state;
    wk_registry *r = wk_registry_create();
    const baton_backend *b;
    char err[512];
    assert_int_equal(wk_registry_find(r, "echo", &b, err, sizeof(err)), BATON_STATUS_OK);
    assert_string_equal(b->name, "echo");
    assert_int_equal(wk_registry_find(r, "transformer", &b, err, sizeof(err)), BATON_STATUS_OK);
    assert_string_equal(b->name, "transformer");
    assert_ptr_equal(b, bk_transformer_backend());
    assert_int_equal(wk_registry_find(r, "ech0", &b, err, sizeof(err)), BATON_STATUS_NOT_FOUND);
    assert_non_null(strstr(err, "ech0"));
    assert_int_equal(wk_registry_find(r, "plugin:/nonexistent/libx.so", &b, err, sizeof(err)),
                     BATON_STATUS_FAILED_PRECONDITION);
    assert_non_null(strstr(err, "/nonexistent/libx.so"));
    wk_registry_destroy(r);
}

static void test_plugin(void **state)
{
    (void)state;
    char path[512], spec[600], err[512];
    plugin_path(path, sizeof(path));
    snprintf(spec, sizeof(spec), "plugin:%s", path);
    wk_registry *r = wk_registry_create();
    const baton_backend *b, *b2;
    baton_status st = wk_registry_find(r, spec, &b, err, sizeof(err));
    if (st != BATON_STATUS_OK)
        fail_msg("loading %s: %s", path, err);
    assert_string_equal(b->name, "scale");
    /* Opened once per path. */
    assert_int_equal(wk_registry_find(r, spec, &b2, err, sizeof(err)), BATON_STATUS_OK);
    assert_ptr_equal(b, b2);

    const char *k[] = {"factor"}, *v[] = {"3"};
    baton_load_params p = {"s", k, v, 1, 0, 1, "cpu", 1, 1};
    baton_model *m = NULL;
    assert_int_equal(b->model_load(&p, &m, err, sizeof(err)), BATON_STATUS_OK);
    assert_int_equal(b->model_bytes(m), 1234);
    baton_session *s = NULL;
    assert_int_equal(b->session_open(m, 42, &s, err, sizeof(err)), BATON_STATUS_OK);
    int32_t x[2] = {4, -5};
    baton_input ins[1] = {in_t("x", BATON_DTYPE_I32, 1, (int64_t[]){2}, x, 1)};
    baton_output outs[1] = {{"y", 0, 0}};
    baton_item it = {.node_name = "n", .inputs = ins, .n_inputs = 1, .outputs = outs,
                     .n_outputs = 1, .session = s};
    fake *f = fake_new();
    baton_item *items[1] = {&it};
    b->execute(m, &f->ctx, items, 1);
    const int32_t *y = f->outputs[0]->data;
    assert_int_equal(y[0], 12);
    assert_int_equal(y[1], -15);
    fake_free(f);
    b->session_close(m, s);
    b->model_unload(m);
    wk_registry_destroy(r);

    /* A plugin that reports another ABI version is refused, naming it. */
    setenv("BATON_EXAMPLE_PLUGIN_ABI", "99", 1);
    wk_plugin *pl = NULL;
    st = wk_plugin_open(path, &pl, err, sizeof(err));
    unsetenv("BATON_EXAMPLE_PLUGIN_ABI");
    assert_int_equal(st, BATON_STATUS_FAILED_PRECONDITION);
    assert_null(pl);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "ABI version 99"));

    /* A library without the entry point: the C library itself. */
    st = wk_plugin_open("libm.so.6", &pl, err, sizeof(err));
    assert_int_equal(st, BATON_STATUS_FAILED_PRECONDITION);
    assert_non_null(strstr(err, "does not export baton_backend_entry"));
    st = wk_plugin_open(path, &pl, err, sizeof(err));
    assert_int_equal(st, BATON_STATUS_OK);
    assert_string_equal(wk_plugin_path(pl), path);
    assert_string_equal(wk_plugin_backend(pl)->name, "scale");
    wk_plugin_close(pl);
    wk_plugin_close(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blas_core),
        cmocka_unit_test(test_echo_by_reference),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_counter),
        cmocka_unit_test(test_counter_slots),
        cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_sleep),
        cmocka_unit_test(test_fail),
        cmocka_unit_test(test_load_options),
        cmocka_unit_test(test_options_from_catalog),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_plugin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
