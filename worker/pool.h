/* The worker's sub-allocator over its pool.
 *
 * The pool is one region of `size` bytes allocated once (a POSIX shm
 * segment on CPU workers, a cudaMalloc slab on GPU ones); tensors are carved
 * out of it by offset.  The allocator is a two-level segregated fit (TLSF):
 * free blocks sit in lists by size class, found in O(1) through two levels
 * of bitmaps, split on allocation and merged with free physical neighbours
 * on release (boundary-tag coalescing), so both operations are O(1).
 *
 * Block bookkeeping lives on the heap, not inside the pool, for two
 * reasons: GPU memory cannot hold host-readable headers, and peers map the
 * pool, so a header in it could be read (or, mapped writable, corrupted) by
 * another process.  Every offset is a multiple of WK_POOL_ALIGN.
 *
 * Not thread-safe: the caller serializes (the worker holds its state lock). */
#ifndef BATON_WORKER_POOL_H
#define BATON_WORKER_POOL_H

#include <stddef.h>
#include <stdint.h>

#define WK_POOL_ALIGN 256u

typedef struct wk_pool wk_pool;
typedef struct wk_pool_blk wk_pool_blk; /* an allocated block; opaque */

typedef struct wk_pool_stats {
    uint64_t size;          /* bytes managed (a multiple of WK_POOL_ALIGN) */
    uint64_t used;          /* bytes in allocated blocks (rounded up to the alignment) */
    uint64_t free;          /* size - used */
    uint64_t largest_free;  /* bytes of the largest free block */
    double fragmentation;   /* 1 - largest_free / free; 0 when nothing is free */
    uint64_t n_allocated;   /* allocated blocks */
    uint64_t n_free_blocks; /* free blocks */
} wk_pool_stats;

/* Creates an allocator over SIZE bytes (rounded down to the alignment).
 * NULL on allocation failure or when SIZE holds no aligned block. */
wk_pool *wk_pool_create(uint64_t size);
/* Frees the bookkeeping (outstanding blocks included); NULL is a no-op. */
void wk_pool_destroy(wk_pool *p);

/* Allocates NBYTES (0 is taken as 1).  Returns the block and sets *offset,
 * or NULL when no free block is large enough. */
wk_pool_blk *wk_pool_alloc(wk_pool *p, uint64_t nbytes, uint64_t *offset);
/* Frees a block from wk_pool_alloc; NULL is a no-op. */
void wk_pool_free(wk_pool *p, wk_pool_blk *b);

uint64_t wk_pool_blk_offset(const wk_pool_blk *b);
uint64_t wk_pool_blk_size(const wk_pool_blk *b); /* bytes the block spans */

void wk_pool_get_stats(const wk_pool *p, wk_pool_stats *out);

/* Walks every block and free list and checks the invariants (blocks tile
 * the pool, no two free neighbours, lists and bitmaps agree, counters
 * exact).  Returns 0, or -1 with a description in ERR.  For tests. */
int wk_pool_check(const wk_pool *p, char *err, size_t errlen);

#endif
