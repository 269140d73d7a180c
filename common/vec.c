#include "common/vec.h"

#include <stdint.h>
#include <stdlib.h>

#include "common/status.h"

int bt_reserve_(void **arr, size_t n, size_t *cap, size_t elem, size_t first)
{
    if (n < *cap)
        return 0;
    size_t want = *cap ? *cap * 2 : first;
    if (want <= *cap || want > SIZE_MAX / elem)
        return BT_ENOMEM;
    void *p = realloc(*arr, want * elem);
    if (!p)
        return BT_ENOMEM;
    *arr = p;
    *cap = want;
    return 0;
}
