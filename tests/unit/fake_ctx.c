/* Host-memory read and write for fake contexts; see fake_ctx.h.  Ranges
 * past the tensor are refused, as the worker refuses them. */
#include "tests/unit/fake_ctx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fake_ctx_read(baton_ctx *ctx, baton_item *item, const baton_tensor *tensor,
                  uint64_t offset, void *dst, uint64_t n)
{
    (void)ctx, (void)item;
    if (offset > tensor->nbytes || n > tensor->nbytes - offset)
        return -1;
    memcpy(dst, (const char *)tensor->data + offset, n);
    return 0;
}

int fake_ctx_write(baton_ctx *ctx, baton_item *item, baton_tensor *tensor, uint64_t offset,
                   const void *src, uint64_t n)
{
    (void)ctx, (void)item;
    if (offset > tensor->nbytes || n > tensor->nbytes - offset)
        return -1;
    memcpy((char *)tensor->data + offset, src, n);
    return 0;
}

static baton_tensor *one_alloc(baton_ctx *c, baton_item *it, baton_dtype dt, uint32_t nd,
                               const int64_t *dims)
{
    (void)it;
    fake_one *f = (fake_one *)c;
    if (f->n_allocs == FAKE_ONE_ALLOCS || nd > BATON_MAX_DIMS)
        return NULL;
    baton_tensor *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->dtype = dt;
    t->ndim = nd;
    uint64_t n = baton_dtype_size(dt);
    for (uint32_t i = 0; i < nd; i++)
        n *= (uint64_t)(t->dims[i] = dims[i]);
    t->nbytes = n;
    if (!(t->data = calloc(1, n ? n : 1))) {
        free(t);
        return NULL;
    }
    f->allocs[f->n_allocs++] = t;
    return t;
}

static int one_set_output(baton_ctx *c, baton_item *it, uint32_t o, const baton_tensor *t)
{
    if (o >= it->n_outputs || o >= 4)
        return -1;
    ((fake_one *)c)->out[o] = (baton_tensor *)t;
    return 0;
}

static void one_finish(baton_ctx *c, baton_item *it)
{
    (void)it;
    ((fake_one *)c)->finished = 1;
}

static void one_fail(baton_ctx *c, baton_item *it, baton_status code, const char *msg)
{
    (void)it;
    fake_one *f = (fake_one *)c;
    f->code = code;
    snprintf(f->message, sizeof(f->message), "%s", msg);
}

static baton_status one_cancelled(baton_ctx *c, const baton_item *it)
{
    (void)c, (void)it;
    return BATON_STATUS_OK;
}

void fake_one_reset(fake_one *f)
{
    for (int i = 0; i < f->n_allocs; i++) {
        free(f->allocs[i]->data);
        free(f->allocs[i]);
    }
    memset(f, 0, sizeof(*f));
    f->ctx.alloc = one_alloc;
    f->ctx.set_output = one_set_output;
    f->ctx.finish = one_finish;
    f->ctx.fail = one_fail;
    f->ctx.cancelled = one_cancelled;
    f->ctx.read = fake_ctx_read;
    f->ctx.write = fake_ctx_write;
    f->ctx.device = "cpu";
}
