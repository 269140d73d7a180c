/* The built-in test backends, exactly as config/README.md states them;
 * integration tests and outside users are written against this behaviour.
 *
 * They go through the same ABI as a plugin (include/baton/backend.h).  The
 * echo part of echo, chunks and sleep passes its input through *by
 * reference* (ctx->forward): the output is the very same tensor as the
 * input, with no copy, which is what lets a pipeline of pass-through nodes
 * cost no memory bandwidth at all.  Their options, defaults and limits are
 * those declared in backends/catalog.c, read through its bt_opt_parse: a
 * load that names no option gets the declared defaults, since a backend
 * must not rely on the conductor having filled them in. */
#include <assert.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/builtin.h"
#include "backends/catalog.h"
#include "backends/device.h"
#include "backends/testing/testing.h"
#include "common/clock.h"
#ifdef BATON_CUDA
#include "kernels/kernels.h"
#endif

typedef enum tb_kind {
    TB_ECHO, TB_ADD, TB_COUNTER, TB_CHUNKS, TB_SLEEP, TB_FAIL, TB_GROUP
} tb_kind;

struct baton_model {
    tb_kind kind;
    int64_t finish_after; /* counter: -1 when unset */
    int64_t slots;        /* counter: places; 0 when unset (no limit) */
    int64_t held;         /* counter: places held by sessions */
    int64_t n;            /* chunks: chunks per stream output */
    int64_t ms;           /* sleep: milliseconds */
    char *message;        /* fail: the error text (owned) */
    bool device_fault;    /* fail: break the CUDA context first (GPU workers) */
    int64_t fail_rank;    /* group: the rank whose load fails; -1: none */
    int64_t hang_rank;    /* group: the rank that stops in step hang_at; -1: none */
    int64_t hang_at;      /* group: that step, from 1 */
    uint32_t rank, ranks; /* group: this rank of the group's */
    uint64_t steps;       /* group: steps run */
    void *comm;           /* group: the communicator of its tensor-parallel group, owned */
};

/* Reads P's options into a new model of KIND: each option the catalog
 * declares for the backend, as given or else its declared default, parsed
 * and checked by the catalog; an option it does not declare is refused. */
static baton_status load_common(tb_kind kind, const baton_load_params *p, baton_model **out,
                                char *err, size_t errlen)
{
    static const char *const names[] = {"echo",  "add",  "counter", "chunks",
                                        "sleep", "fail", "group"};
    const bt_backend_desc *b = bt_backend_find(names[kind]);
    assert(b); /* every test backend is declared */
    *out = NULL;
    for (size_t i = 0; i < p->n_options; i++)
        if (!bt_backend_option(b, p->keys[i])) {
            snprintf(err, errlen, "backend %s has no option '%s'", names[kind], p->keys[i]);
            return BATON_STATUS_INVALID_ARGUMENT;
        }
    baton_model *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return BATON_STATUS_RESOURCE_EXHAUSTED;
    }
    m->kind = kind;
    m->finish_after = -1;
    m->fail_rank = m->hang_rank = -1;
    for (size_t k = 0; k < b->n_options; k++) {
        const bt_opt_desc *d = &b->options[k];
        bt_opt_value v;
        if (bt_opt_parse(b, d, baton_load_option(p, d->name), &v, err, errlen) != 0)
            goto err;
        if (!v.set)
            continue; /* finish_after: never */
        if (strcmp(d->name, "finish_after") == 0) {
            m->finish_after = v.i;
        } else if (strcmp(d->name, "slots") == 0) {
            m->slots = v.i;
        } else if (strcmp(d->name, "n") == 0) {
            m->n = v.i;
        } else if (strcmp(d->name, "ms") == 0) {
            m->ms = v.i;
        } else if (strcmp(d->name, "device_fault") == 0) {
            m->device_fault = v.b;
        } else if (strcmp(d->name, "fail_rank") == 0) {
            m->fail_rank = v.i;
        } else if (strcmp(d->name, "hang_rank") == 0) {
            m->hang_rank = v.i;
        } else if (strcmp(d->name, "hang_at") == 0) {
            m->hang_at = v.i;
        } else if (strcmp(d->name, "message") == 0 && !(m->message = strdup(v.s))) {
            snprintf(err, errlen, "out of memory");
            goto err;
        }
    }
    *out = m;
    return BATON_STATUS_OK;
err:
    free(m->message);
    free(m);
    return BATON_STATUS_INVALID_ARGUMENT;
}

static void tb_unload(baton_model *m)
{
    if (!m)
        return;
    bk_comm_group_close(m->comm);
    free(m->message);
    free(m);
}

/* The input an echo-style output carries: the input of the same name,
 * else the first; -1 when the node has no input. */
static int echo_source(const baton_item *it, uint32_t output)
{
    for (uint32_t k = 0; k < it->n_inputs; k++)
        if (strcmp(it->inputs[k].name, it->outputs[output].name) == 0)
            return (int)k;
    return it->n_inputs ? 0 : -1;
}

/* Echo every output of IT, or only its non-stream ones. */
static void echo_outputs(baton_ctx *ctx, baton_item *it, int skip_streams)
{
    for (uint32_t o = 0; o < it->n_outputs; o++) {
        if (skip_streams && it->outputs[o].stream)
            continue;
        int src = echo_source(it, o);
        if (src < 0) {
            char msg[256];
            snprintf(msg, sizeof(msg), "node '%s' has no input for output '%s' to carry",
                     it->node_name, it->outputs[o].name);
            ctx->fail(ctx, it, BATON_STATUS_INVALID_ARGUMENT, msg);
            return;
        }
        ctx->forward(ctx, it, o, (uint32_t)src);
    }
}

static void echo_execute(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    (void)m;
    for (size_t i = 0; i < n; i++)
        echo_outputs(ctx, items[i], 0);
}

/* --- add ----------------------------------------------------------------- */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t exp = (int32_t)((x >> 23) & 0xffu) - 127 + 15;
    uint32_t man = x & 0x7fffffu;
    if (((x >> 23) & 0xffu) == 0xffu)
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t h = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* may carry into the exponent, which is the right rounding */
    return (uint16_t)h;
}

static float bf16_to_float(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu))
        return (uint16_t)((x >> 16) | 0x40u); /* keep NaN a NaN */
    x += 0x7fffu + ((x >> 16) & 1u);          /* round to nearest even */
    return (uint16_t)(x >> 16);
}

/* DST += SRC elementwise over N elements of DTYPE.  Integers wrap (two's
 * complement), BOOL is a logical or. */
static void add_into(baton_dtype dtype, void *dst, const void *src, uint64_t n)
{
    switch (dtype) {
    case BATON_DTYPE_F32: {
        float *d = dst;
        const float *s = src;
        for (uint64_t i = 0; i < n; i++)
            d[i] += s[i];
        break;
    }
    case BATON_DTYPE_F16: case BATON_DTYPE_BF16: {
        uint16_t *d = dst;
        const uint16_t *s = src;
        int h = dtype == BATON_DTYPE_F16;
        for (uint64_t i = 0; i < n; i++) {
            float a = h ? half_to_float(d[i]) : bf16_to_float(d[i]);
            float b = h ? half_to_float(s[i]) : bf16_to_float(s[i]);
            d[i] = h ? float_to_half(a + b) : float_to_bf16(a + b);
        }
        break;
    }
    case BATON_DTYPE_I32: {
        uint32_t *d = dst;
        const uint32_t *s = src;
        for (uint64_t i = 0; i < n; i++)
            d[i] += s[i];
        break;
    }
    case BATON_DTYPE_I64: {
        uint64_t *d = dst;
        const uint64_t *s = src;
        for (uint64_t i = 0; i < n; i++)
            d[i] += s[i];
        break;
    }
    case BATON_DTYPE_U8: {
        uint8_t *d = dst;
        const uint8_t *s = src;
        for (uint64_t i = 0; i < n; i++)
            d[i] = (uint8_t)(d[i] + s[i]);
        break;
    }
    case BATON_DTYPE_BOOL: {
        uint8_t *d = dst;
        const uint8_t *s = src;
        for (uint64_t i = 0; i < n; i++)
            d[i] = (uint8_t)(d[i] || s[i]);
        break;
    }
    case BATON_DTYPE_INVALID:
        break;
    }
}

static void add_one(baton_ctx *ctx, baton_item *it)
{
    char msg[256];
    if (it->n_inputs == 0) {
        snprintf(msg, sizeof(msg), "node '%s': add needs at least one input", it->node_name);
        ctx->fail(ctx, it, BATON_STATUS_INVALID_ARGUMENT, msg);
        return;
    }
    const baton_tensor *a = &it->inputs[0].tensor;
    for (uint32_t k = 1; k < it->n_inputs; k++) {
        const baton_tensor *b = &it->inputs[k].tensor;
        if (b->dtype != a->dtype || b->ndim != a->ndim ||
            memcmp(b->dims, a->dims, sizeof(int64_t) * a->ndim) != 0) {
            snprintf(msg, sizeof(msg), "node '%s': add needs inputs of one dtype and shape; "
                     "input '%s' differs from input '%s'", it->node_name, it->inputs[k].name,
                     it->inputs[0].name);
            ctx->fail(ctx, it, BATON_STATUS_INVALID_ARGUMENT, msg);
            return;
        }
    }
    if (it->n_outputs == 0)
        return;
    baton_tensor *sum = ctx->alloc(ctx, it, a->dtype, a->ndim, a->dims);
    if (!sum)
        return;
    /* The sum is made on the host and written back, so that add runs the
     * same on every device (on a GPU worker its inputs are device memory:
     * two copies per input, which a test backend can afford). */
    uint8_t *acc = malloc(a->nbytes ? a->nbytes : 1), *in = malloc(a->nbytes ? a->nbytes : 1);
    int rc = acc && in ? ctx->read(ctx, it, a, 0, acc, a->nbytes) : -1;
    uint64_t n = a->nbytes / baton_dtype_size(a->dtype);
    for (uint32_t k = 1; rc == 0 && k < it->n_inputs; k++)
        if ((rc = ctx->read(ctx, it, &it->inputs[k].tensor, 0, in, a->nbytes)) == 0)
            add_into(a->dtype, acc, in, n);
    if (rc == 0)
        rc = ctx->write(ctx, it, sum, 0, acc, a->nbytes);
    if (!acc || !in)
        ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of host memory");
    free(acc);
    free(in);
    for (uint32_t o = 0; rc == 0 && o < it->n_outputs; o++)
        ctx->set_output(ctx, it, o, sum);
}

static void add_execute(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    (void)m;
    for (size_t i = 0; i < n; i++)
        add_one(ctx, items[i]);
}

/* --- counter ------------------------------------------------------------- */

/* With option slots: whether a request's loop holds a place.  Execute and
 * session_close of one model never run at once, so no lock. */
typedef struct tb_session {
    bool holds;
} tb_session;

static baton_status counter_session_open(baton_model *m, uint64_t key, baton_session **out,
                                         char *err, size_t errlen)
{
    (void)key;
    *out = NULL;
    if (!m->slots)
        return BATON_STATUS_OK;
    if (!(*out = calloc(1, sizeof(tb_session)))) {
        snprintf(err, errlen, "out of memory");
        return BATON_STATUS_RESOURCE_EXHAUSTED;
    }
    return BATON_STATUS_OK;
}

static void counter_release(baton_model *m, tb_session *s)
{
    if (s && s->holds) {
        s->holds = false;
        m->held--;
    }
}

static void counter_session_close(baton_model *m, baton_session *bs)
{
    counter_release(m, (tb_session *)bs);
    free(bs);
}

static void counter_execute(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        baton_item *it = items[i];
        uint32_t iter = baton_item_iteration(it);
        tb_session *s = (tb_session *)it->session;
        if (s && !s->holds) {
            if (m->held == m->slots) {
                ctx->defer(ctx, it);
                continue;
            }
            s->holds = true;
            m->held++;
        }
        if (it->n_outputs) {
            baton_tensor *t = ctx->alloc(ctx, it, BATON_DTYPE_I32, 1, (int64_t[]){1});
            if (!t)
                continue;
            int32_t v = (int32_t)iter;
            if (ctx->write(ctx, it, t, 0, &v, 4) != 0)
                continue;
            for (uint32_t o = 0; o < it->n_outputs; o++)
                ctx->set_output(ctx, it, o, t);
        }
        if (m->finish_after >= 0 && (int64_t)iter + 1 == m->finish_after) {
            ctx->finish(ctx, it);
            counter_release(m, s);
        }
    }
}

/* --- chunks -------------------------------------------------------------- */

static void chunks_execute(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        baton_item *it = items[i];
        for (uint32_t o = 0; o < it->n_outputs; o++) {
            if (!it->outputs[o].stream)
                continue;
            if (m->n == 0)
                ctx->emit_chunk(ctx, it, o, NULL, 1);
            for (int64_t k = 0; k < m->n; k++) {
                baton_tensor *t = ctx->alloc(ctx, it, BATON_DTYPE_I32, 1, (int64_t[]){1});
                if (!t)
                    break;
                int32_t v = (int32_t)k;
                if (ctx->write(ctx, it, t, 0, &v, 4) != 0)
                    break;
                ctx->emit_chunk(ctx, it, o, t, k == m->n - 1);
            }
        }
        echo_outputs(ctx, it, 1);
    }
}

/* --- sleep --------------------------------------------------------------- */

static void sleep_execute(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    /* The items of a batch sleep together: one wall-clock wait, each item
     * leaving it early on its own cancel or deadline. */
    uint64_t end = bt_now_ms() + (uint64_t)m->ms;
    for (size_t i = 0; i < n; i++) {
        baton_item *it = items[i];
        uint64_t now = bt_now_ms();
        uint32_t left = now < end ? (uint32_t)(end - now) : 0;
        baton_status st = ctx->sleep_ms(ctx, it, left);
        if (st == BATON_STATUS_DEADLINE_EXCEEDED) {
            char msg[256];
            snprintf(msg, sizeof(msg), "node '%s': the deadline passed while sleeping",
                     it->node_name);
            ctx->fail(ctx, it, st, msg);
        } else if (st != BATON_STATUS_OK) {
            ctx->fail(ctx, it, st, "cancelled while sleeping");
        } else {
            echo_outputs(ctx, it, 0);
        }
    }
}

/* --- fail ---------------------------------------------------------------- */

/* Launches an elementwise kernel whose operands are an address no GPU
 * maps: on a GPU the launch faults with an illegal address, an error that
 * leaves the context unusable ("sticky"), which is what device_fault is
 * for.  The worker notices after execute() and exits. */
static void break_device(baton_ctx *ctx)
{
#ifdef BATON_CUDA
    if (strncmp(ctx->device, "cuda:", 5) == 0) {
        float *nowhere = (float *)(uintptr_t)0x1000;
        k_cuda_add(nowhere, nowhere, nowhere, 1024, ctx->stream);
    }
#else
    (void)ctx;
#endif
}

static void fail_execute(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    if (m->device_fault)
        break_device(ctx);
    for (size_t i = 0; i < n; i++)
        ctx->fail(ctx, items[i], BATON_STATUS_INTERNAL, m->message);
}

/* group: echo, after an all-reduce of 1.0 from every rank, whose sum must
 * be the group's size; rank hang_rank never reaches the all-reduce of its
 * step hang_at (it stops there, alive, until the worker ends it). */
static void group_execute(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    if (m->comm && n) {
        if (++m->steps == (uint64_t)m->hang_at && (int64_t)m->rank == m->hang_rank)
            for (;;) {
                struct timespec ts = {0, 10000000}; /* 10 ms */
                nanosleep(&ts, NULL);
            }
        const int64_t one = 1;
        float v = 1.0f;
        baton_tensor *t = ctx->alloc(ctx, items[0], BATON_DTYPE_F32, 1, &one);
        int rc = !t || ctx->write(ctx, items[0], t, 0, &v, sizeof(v)) != 0 ? -1 : 0;
#ifdef BATON_CUDA
        if (rc == 0)
            rc = k_cuda_allreduce(t->data, 1, m->comm, ctx->stream);
#endif
        if (rc == 0)
            rc = ctx->read(ctx, items[0], t, 0, &v, sizeof(v));
        /* A group a rank aborted gave whatever it gave: the worker sees
         * that (group_broken) and sends nothing. */
        if (!bk_comm_group_failed(m->comm) && (rc != 0 || v != (float)m->ranks)) {
            char msg[128];
            snprintf(msg, sizeof(msg), "group: the all-reduce of rank %u %s (%g)", m->rank,
                     rc ? "failed" : "gave a wrong sum", (double)v);
            for (size_t i = 0; i < n; i++)
                ctx->fail(ctx, items[i], BATON_STATUS_INTERNAL, msg);
            return;
        }
    }
    echo_execute(m, ctx, items, n);
}

static int group_broken(baton_model *m)
{
    return bk_comm_group_failed(m->comm);
}

/* group: the step cannot end (a rank is stuck): the communicator is
 * aborted, which ends the other ranks' all-reduce. */
static void group_abort(baton_model *m)
{
    bk_comm_group_abort(m->comm);
}

/* group: echo, loaded as a rank of its tensor-parallel group.  The rank
 * fail_rank fails at once; the others join the group as the transformer
 * does (bk_comm_group_join), so that a test can see what a rank that never
 * joins does to them. */
static baton_status group_load(const baton_load_params *p, baton_model **out, char *err,
                               size_t errlen)
{
    baton_status st = load_common(TB_GROUP, p, out, err, errlen);
    if (st != BATON_STATUS_OK || p->tp_size <= 1)
        return st;
    baton_model *m = *out;
    m->rank = p->tp_rank;
    m->ranks = p->tp_size;
    const kx_device *dev = NULL;
    int device = -1;
    if ((int64_t)p->tp_rank == m->fail_rank) {
        snprintf(err, errlen, "group: rank %u fails its load (fail_rank)", p->tp_rank);
        st = BATON_STATUS_FAILED_PRECONDITION;
    } else if ((st = bk_device_open(p->device, "group", &dev, &device, err, errlen)) !=
               BATON_STATUS_OK) {
        /* the message names the device */
    } else if (!dev) {
        snprintf(err, errlen, "group: tensor parallelism needs a GPU worker, not cpu");
        st = BATON_STATUS_FAILED_PRECONDITION;
    } else if (bk_comm_group_join(&m->comm, device, p, err, errlen) != 0) {
        st = BATON_STATUS_UNAVAILABLE; /* the group's failure, as the transformer says */
    }
    if (st != BATON_STATUS_OK) {
        tb_unload(m);
        *out = NULL;
    }
    return st;
}

/* --- tables -------------------------------------------------------------- */

#define LOADER(fn, kind)                                                                       \
    static baton_status fn(const baton_load_params *p, baton_model **out, char *err,           \
                           size_t errlen)                                                      \
    {                                                                                          \
        return load_common(kind, p, out, err, errlen);                                         \
    }

LOADER(echo_load, TB_ECHO)
LOADER(add_load, TB_ADD)
LOADER(counter_load, TB_COUNTER)
LOADER(chunks_load, TB_CHUNKS)
LOADER(sleep_load, TB_SLEEP)
LOADER(fail_load, TB_FAIL)

/* Sessions (OPEN, CLOSE): only counter's places need them. */
#define BACKEND(var, nm, load, exec, open, close)                                              \
    static const baton_backend var = {                                                         \
        .abi_version = BATON_BACKEND_ABI_VERSION,                                              \
        .name = nm,                                                                            \
        .model_load = load,                                                                    \
        .model_unload = tb_unload,                                                             \
        .session_open = open,                                                                  \
        .session_close = close,                                                                \
        .execute = exec,                                                                       \
    };

BACKEND(echo_backend, "echo", echo_load, echo_execute, NULL, NULL)
BACKEND(add_backend, "add", add_load, add_execute, NULL, NULL)
BACKEND(counter_backend, "counter", counter_load, counter_execute, counter_session_open,
        counter_session_close)
BACKEND(chunks_backend, "chunks", chunks_load, chunks_execute, NULL, NULL)
BACKEND(sleep_backend, "sleep", sleep_load, sleep_execute, NULL, NULL)
BACKEND(fail_backend, "fail", fail_load, fail_execute, NULL, NULL)
static const baton_backend group_backend = {
    .abi_version = BATON_BACKEND_ABI_VERSION,
    .name = "group",
    .model_load = group_load,
    .model_unload = tb_unload,
    .execute = group_execute,
    .model_abort = group_abort,
    .model_broken = group_broken,
};

const baton_backend *bk_testing_backend(const char *name)
{
    static const baton_backend *const all[] = {&echo_backend,   &add_backend,   &counter_backend,
                                               &chunks_backend, &sleep_backend, &fail_backend,
                                               &group_backend};
    for (size_t i = 0; name && i < sizeof(all) / sizeof(all[0]); i++)
        if (strcmp(all[i]->name, name) == 0)
            return all[i];
    return NULL;
}
