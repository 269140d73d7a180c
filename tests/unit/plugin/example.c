/* An example backend plugin, built as a shared library by the Makefile
 * ($(BUILD)/tests/plugin_example.so) and loaded by tests/unit/test_backends.c
 * and tests/unit/test_worker_proc.c as `backend: plugin:/path/to/it.so`.
 *
 * "scale": every output carries the first input (I32 or F32) multiplied by
 * options.factor (default 2).  It keeps a per-request session that counts
 * the executions of its request, so tests see session_open/session_close
 * being called, and it reports model_bytes so tests see the optional slots.
 *
 * For the loader's own tests, the environment variable
 * BATON_EXAMPLE_PLUGIN_ABI, when set, replaces the ABI version it reports:
 * that is how a test sees a version mismatch refused without a second
 * library. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/backend.h"

struct baton_model {
    long factor;
};

struct baton_session {
    uint64_t request_key;
    unsigned executions;
};

static baton_status scale_load(const baton_load_params *p, baton_model **out, char *err,
                               size_t errlen)
{
    baton_model *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return BATON_STATUS_RESOURCE_EXHAUSTED;
    }
    m->factor = 2;
    const char *f = baton_load_option(p, "factor");
    if (f) {
        char *end;
        m->factor = strtol(f, &end, 10);
        if (end == f || *end) {
            snprintf(err, errlen, "scale: factor must be an integer, not '%s'", f);
            free(m);
            return BATON_STATUS_INVALID_ARGUMENT;
        }
    }
    *out = m;
    return BATON_STATUS_OK;
}

static void scale_unload(baton_model *m)
{
    free(m);
}

static uint64_t scale_bytes(const baton_model *m)
{
    (void)m;
    return 1234;
}

static baton_status scale_session_open(baton_model *m, uint64_t key, baton_session **out,
                                       char *err, size_t errlen)
{
    (void)m;
    baton_session *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return BATON_STATUS_RESOURCE_EXHAUSTED;
    }
    s->request_key = key;
    *out = s;
    return BATON_STATUS_OK;
}

static void scale_session_close(baton_model *m, baton_session *s)
{
    (void)m;
    free(s);
}

static void scale_execute(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        baton_item *it = items[i];
        if (it->session)
            it->session->executions++;
        if (it->n_inputs == 0) {
            ctx->fail(ctx, it, BATON_STATUS_INVALID_ARGUMENT, "scale needs an input");
            continue;
        }
        const baton_tensor *in = &it->inputs[0].tensor;
        if (in->dtype != BATON_DTYPE_I32 && in->dtype != BATON_DTYPE_F32) {
            ctx->fail(ctx, it, BATON_STATUS_INVALID_ARGUMENT, "scale takes I32 or F32");
            continue;
        }
        baton_tensor *out = ctx->alloc(ctx, it, in->dtype, in->ndim, in->dims);
        if (!out)
            continue;
        /* Through the host, so that the plugin runs on any worker: on a
         * GPU worker the tensors are device memory (a real GPU plugin would
         * launch a kernel on ctx->stream instead). */
        uint64_t count = in->nbytes / 4;
        void *buf = malloc(in->nbytes ? in->nbytes : 1);
        if (!buf || ctx->read(ctx, it, in, 0, buf, in->nbytes) != 0) {
            free(buf);
            if (!buf)
                ctx->fail(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            continue;
        }
        for (uint64_t k = 0; k < count; k++) {
            if (in->dtype == BATON_DTYPE_I32)
                ((int32_t *)buf)[k] *= (int32_t)m->factor;
            else
                ((float *)buf)[k] *= (float)m->factor;
        }
        int rc = ctx->write(ctx, it, out, 0, buf, in->nbytes);
        free(buf);
        for (uint32_t o = 0; rc == 0 && o < it->n_outputs; o++)
            ctx->set_output(ctx, it, o, out);
    }
}

static baton_backend scale_backend = {
    .abi_version = BATON_BACKEND_ABI_VERSION,
    .name = "scale",
    .model_load = scale_load,
    .model_unload = scale_unload,
    .model_bytes = scale_bytes,
    .session_open = scale_session_open,
    .session_close = scale_session_close,
    .execute = scale_execute,
};

const baton_backend *baton_backend_entry(void);

const baton_backend *baton_backend_entry(void)
{
    const char *abi = getenv("BATON_EXAMPLE_PLUGIN_ABI");
    scale_backend.abi_version = abi ? (uint32_t)strtoul(abi, NULL, 10) : BATON_BACKEND_ABI_VERSION;
    return &scale_backend;
}
