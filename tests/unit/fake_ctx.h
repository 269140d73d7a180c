/* The read and write callbacks of a baton_ctx whose tensors are host
 * memory, for the unit tests that call backends with a fake context. */
#ifndef BATON_TESTS_FAKE_CTX_H
#define BATON_TESTS_FAKE_CTX_H

#include "baton/backend.h"

int fake_ctx_read(baton_ctx *ctx, baton_item *item, const baton_tensor *tensor,
                  uint64_t offset, void *dst, uint64_t n);
int fake_ctx_write(baton_ctx *ctx, baton_item *item, baton_tensor *tensor, uint64_t offset,
                   const void *src, uint64_t n);

/* A fake context for one item at a time: host tensors it allocates (freed
 * by the next fake_one_reset), the outputs set, and how the item ended. */
#define FAKE_ONE_ALLOCS 16
typedef struct fake_one {
    baton_ctx ctx;                 /* first: the backend's ctx points here */
    baton_tensor *out[4];          /* outputs 0..3 as set */
    baton_tensor *allocs[FAKE_ONE_ALLOCS];
    int n_allocs;
    baton_status code;             /* OK unless the item failed */
    char message[512];
    int finished;                  /* the finish signal was raised */
} fake_one;

/* Frees what F allocated and makes it a fresh context; call it once on a
 * zeroed F before the first use, and once more at the end. */
void fake_one_reset(fake_one *f);

#endif
