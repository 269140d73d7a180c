/* GGUF block layouts (ggml-common.h), shared by the C reference, the AVX2
 * path and the CUDA kernels.  Blocks are packed byte arrays rather than
 * structs: a 34- or 18-byte block has no natural alignment, and reading the
 * f16 scales through memcpy (C) or two byte loads (CUDA) keeps every access
 * legal on both sides.
 *
 *   Q8_0 (34 bytes): f16 d, int8 q[32];              x[i] = q[i] * d
 *   Q4_0 (18 bytes): f16 d, u8 qs[16];               x[i] = (nib(i) - 8) * d
 *   Q4_1 (20 bytes): f16 d, f16 m, u8 qs[16];        x[i] = nib(i) * d + m
 * where nib(i) is the low nibble of qs[i] for i < 16 and the high nibble of
 * qs[i - 16] for i >= 16. */
#ifndef BATON_KERNELS_CPU_QUANT_H
#define BATON_KERNELS_CPU_QUANT_H

#include <stdint.h>

#include "kernels/cpu/half.h"

#define K_QK 32
#define K_Q8_0_BYTES 34
#define K_Q4_0_BYTES 18
#define K_Q4_1_BYTES 20

K_HD float k_load_f16(const uint8_t *p)
{
    return k_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

K_HD void k_store_f16(uint8_t *p, float v)
{
    uint16_t h = k_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

#endif
