/* Arrays grown by doubling, the idiom of every registry, queue and buffer,
 * written once:
 *
 *     if (BT_RESERVE(q->v, q->n, q->cap, 16))      one more element
 *         return BT_ENOMEM;
 *     q->v[q->n++] = x;
 *
 *     if (BT_RESERVE_N(b->p, b->len, b->cap, n + 1, 256))   n bytes and a NUL
 *         return BT_ENOMEM;
 *
 * ARR is the array (any pointer lvalue, NULL before the first allocation),
 * N the elements in use, CAP a size_t lvalue holding the elements
 * allocated (0 before the first allocation).  When N + MORE do not fit,
 * CAP doubles (from FIRST when it is 0) until they do, and ARR is
 * reallocated.  Both return 0, or BT_ENOMEM with ARR and CAP unchanged.
 * New elements are not initialised.  The common case, room enough, is a
 * comparison inline. */
#ifndef BATON_COMMON_VEC_H
#define BATON_COMMON_VEC_H

#include <stddef.h>

/* Makes room for one more element of ARR. */
#define BT_RESERVE(arr, n, cap, first) BT_RESERVE_N(arr, n, cap, 1, first)

/* Makes room for MORE more elements of ARR, N + MORE in all. */
#define BT_RESERVE_N(arr, n, cap, more, first)                                                 \
    bt_reserve_((void **)&(arr), (n), (more), &(cap), sizeof(*(arr)), (first))

/* The reallocation, out of line; FIRST and ELEM are at least 1. */
int bt_grow_(void **arr, size_t n, size_t more, size_t *cap, size_t elem, size_t first);

static inline int bt_reserve_(void **arr, size_t n, size_t more, size_t *cap, size_t elem,
                              size_t first)
{
    if (n <= *cap && more <= *cap - n)
        return 0;
    return bt_grow_(arr, n, more, cap, elem, first);
}

/* Appends the N bytes at P to the NUL-terminated text *BUF (LEN bytes in
 * it, CAP allocated; NULL and 0 before the first), keeping the NUL.  0 or
 * BT_ENOMEM (nothing appended). */
int bt_bytes_add(char **buf, size_t *len, size_t *cap, const void *p, size_t n);

#endif
