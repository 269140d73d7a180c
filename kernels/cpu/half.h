/* f16 and bf16 conversions, written once for C and CUDA (K_HD) so the CPU
 * reference and the GPU kernels round exactly alike: round to nearest even,
 * subnormals kept, NaN stays NaN (quiet), overflow goes to infinity.
 *
 * We do not use the CUDA intrinsics (__float2half_rn) on the device: they
 * round the same way, but keeping one definition makes "bit-identical on CPU
 * and GPU" a property of the source rather than of two libraries. */
#ifndef BATON_KERNELS_CPU_HALF_H
#define BATON_KERNELS_CPU_HALF_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define K_HD __host__ __device__ __forceinline__
#else
#define K_HD static inline
#endif

K_HD uint32_t k_f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    return x;
}

K_HD float k_bits_f32(uint32_t x)
{
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

K_HD uint16_t k_f32_to_f16(float f)
{
    uint32_t x = k_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or NaN (NaN keeps a quiet bit) */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: a half subnormal or zero */
        if (ax < 0x33000000u) /* <= 2^-25 rounds to (even) zero */
            return (uint16_t)sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t s = 126u - e; /* 14..24 */
        uint32_t h = m >> s;
        uint32_t rem = m & ((1u << s) - 1u);
        uint32_t half = 1u << (s - 1u);
        if (rem > half || (rem == half && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t v = (ax >> 13) - (112u << 10);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (v & 1u)))
        v++; /* a carry into the exponent is the right answer */
    return (uint16_t)(sign | v);
}

K_HD float k_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1fu)
        return k_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        /* subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return k_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

K_HD uint16_t k_f32_to_bf16(float f)
{
    uint32_t x = k_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

K_HD float k_bf16_to_f32(uint16_t b)
{
    return k_bits_f32((uint32_t)b << 16);
}

#endif
