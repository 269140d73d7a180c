/* Host-memory read and write for fake contexts; see fake_ctx.h.  Ranges
 * past the tensor are refused, as the worker refuses them. */
#include "tests/unit/fake_ctx.h"

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
