/* Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11), the counter-based generator the samplers use.  Written once for
 * C and CUDA (K_HD) so that the same (seed, counter) gives the same bits on
 * the CPU and on the GPU: sampling a request on either device draws the same
 * uniform numbers.  A counter-based RNG has no state to carry between decode
 * steps, which is why it was chosen over a stateful generator (xorshift,
 * mt19937): step N of a request uses counter N, on whichever device.
 *
 * Key = the 64-bit seed; counter = (counter lo, counter hi, 0, 0). */
#ifndef BATON_KERNELS_CPU_PHILOX_H
#define BATON_KERNELS_CPU_PHILOX_H

#include <stdint.h>

#include "kernels/cpu/half.h" /* K_HD */

typedef struct k_philox4 {
    uint32_t v[4];
} k_philox4;

K_HD uint32_t k_mulhilo32(uint32_t a, uint32_t b, uint32_t *hi)
{
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

/* The four 32-bit outputs of Philox-4x32-10 for (SEED, COUNTER). */
K_HD k_philox4 k_philox4x32(uint64_t seed, uint64_t counter)
{
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = k_mulhilo32(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = k_mulhilo32(0xCD9E8D57u, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n1 = lo1;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        uint32_t n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    k_philox4 o;
    o.v[0] = c0;
    o.v[1] = c1;
    o.v[2] = c2;
    o.v[3] = c3;
    return o;
}

/* A uniform float in [0, 1) from the top 24 bits of output 0 (24 bits is
 * what an f32 mantissa holds, so every value is exact). */
K_HD float k_philox_uniform(uint64_t seed, uint64_t counter)
{
    k_philox4 o = k_philox4x32(seed, counter);
    return (float)(o.v[0] >> 8) * (1.0f / 16777216.0f);
}

#endif
