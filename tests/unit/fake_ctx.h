/* The read and write callbacks of a baton_ctx whose tensors are host
 * memory, for the unit tests that call backends with a fake context. */
#ifndef BATON_TESTS_FAKE_CTX_H
#define BATON_TESTS_FAKE_CTX_H

#include "baton/backend.h"

int fake_ctx_read(baton_ctx *ctx, baton_item *item, const baton_tensor *tensor,
                  uint64_t offset, void *dst, uint64_t n);
int fake_ctx_write(baton_ctx *ctx, baton_item *item, baton_tensor *tensor, uint64_t offset,
                   const void *src, uint64_t n);

#endif
