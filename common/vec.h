/* Arrays grown by doubling, the idiom of every registry and queue in the
 * conductor, written once. */
#ifndef BATON_COMMON_VEC_H
#define BATON_COMMON_VEC_H

#include <stddef.h>

/* Makes room for one more element of ARR, of which N are in use and CAP
 * (a size_t lvalue) are allocated; the first allocation holds FIRST.
 * Returns 0, or BT_ENOMEM with the array unchanged. */
#define BT_RESERVE(arr, n, cap, first)                                                         \
    bt_reserve_((void **)&(arr), (n), &(cap), sizeof(*(arr)), (first))

int bt_reserve_(void **arr, size_t n, size_t *cap, size_t elem, size_t first);

#endif
