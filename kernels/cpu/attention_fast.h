/* Pieces of the fast attention path (attention_fast.c) that the unmasked
 * attention (attention_full.c) shares: one query over f32 keys and values,
 * and softmax rows, both vectorized with AVX2. */
#ifndef BATON_KERNELS_CPU_ATTENTION_FAST_H
#define BATON_KERNELS_CPU_ATTENTION_FAST_H

#include <stddef.h>
#include <stdint.h>

/* Whether the two below may run: an x86-64 CPU with AVX2 and FMA (and not
 * lowered by BATON_CPU_ISA=ref), and HD a multiple of 8 (for
 * k__softmax_f32, pass 8). */
int k__attend_f32_ok(int hd);

/* OUT[HD] = softmax(Q . K[j] / sqrt(HD), j < CTX) . V[j], with K[j] and
 * V[j] ROW floats apart; S: CTX floats of scratch.  The reference's
 * arithmetic (attention.c) with sums taken 8 lanes at a time and e^x from
 * a polynomial: within a few ulp of it, not equal. */
void k__attend_f32(float *out, const float *q, const float *k, const float *v, int ctx,
                   size_t row, int hd, float *s);

/* The same over K and V in f16, widened by F16C as they are read. */
void k__attend_f16(float *out, const float *q, const uint16_t *k, const uint16_t *v, int ctx,
                   size_t row, int hd, float *s);

/* Softmax of ROWS rows of N floats in place, as k_softmax up to the
 * rounding of its sums and its e^x. */
void k__softmax_f32(float *p, int rows, int n);

#endif
