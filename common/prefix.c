/* Chained block hashes (common/prefix.h). */
#include "common/prefix.h"

#include <string.h>

#include "common/u64map.h"

/* H with the 8 bytes X folded in (boost's hash_combine, then splitmix64's
 * finalizer): fast, and every input bit reaches every output bit. */
static uint64_t mix(uint64_t h, uint64_t x)
{
    return u64map_mix(h ^ (x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)));
}

size_t bt_prefix_hashes(const void *data, size_t n, size_t block, uint64_t *out, size_t cap)
{
    const uint8_t *p = data;
    size_t blocks = block ? n / block : 0;
    uint64_t h = 0x243f6a8885a308d3ULL ^ block; /* block sizes never share a chain */
    for (size_t j = 0; j < blocks && j < cap; j++) {
        const uint8_t *b = p + j * block;
        size_t k = 0;
        for (; k + 8 <= block; k += 8) {
            uint64_t x;
            memcpy(&x, b + k, 8);
            h = mix(h, x);
        }
        if (k < block) {
            uint64_t x = 0;
            memcpy(&x, b + k, block - k);
            h = mix(h, x ^ (uint64_t)(block - k) << 56);
        }
        h = mix(h, j);
        /* 0 and UINT64_MAX mark empty and deleted slots of a u64map. */
        out[j] = h == 0 || h == UINT64_MAX ? 1 : h;
    }
    return blocks;
}
