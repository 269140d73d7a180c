#include "common/vec.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

int bt_grow_(void **arr, size_t n, size_t more, size_t *cap, size_t elem, size_t first)
{
    assert(elem > 0 && first > 0);
    if (more > SIZE_MAX - n)
        return BT_ENOMEM;
    size_t need = n + more, want = *cap ? *cap : first;
    while (want < need) {
        if (want > SIZE_MAX / 2)
            return BT_ENOMEM;
        want *= 2;
    }
    if (want > SIZE_MAX / elem)
        return BT_ENOMEM;
    void *p = realloc(*arr, want * elem);
    if (!p)
        return BT_ENOMEM;
    *arr = p;
    *cap = want;
    return 0;
}

int bt_bytes_add(char **buf, size_t *len, size_t *cap, const void *p, size_t n)
{
    if (BT_RESERVE_N(*buf, *len, *cap, n + 1, 256) < 0)
        return BT_ENOMEM;
    if (n)
        memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}
