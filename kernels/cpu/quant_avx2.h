/* The AVX2 + FMA quantized products on f32 activations (quant_avx2.c),
 * declared once for their definitions and their callers (quant.c, and
 * qdot.c's threads).  A caller asks k_have_avx2 first; off x86-64 both
 * still link: k__qmatvec_avx2 runs the scalar reference and
 * k__qmatmul_avx2, never called there, fails. */
#ifndef BATON_KERNELS_CPU_QUANT_AVX2_H
#define BATON_KERNELS_CPU_QUANT_AVX2_H

#include <stddef.h>

#include "kernels/kernels.h"

/* Y[ROWS] = W[ROWS, COLS] X[COLS], as k_qmatvec_ref. */
int k__qmatvec_avx2(float *y, const void *w, kdtype t, const float *x, int rows, int cols);

/* Y[M, ROWS] = X[M, COLS] W[ROWS, COLS]^T, Y's rows LDY floats apart. */
int k__qmatmul_avx2(float *y, size_t ldy, const void *w, kdtype t, const float *x, int m,
                    int rows, int cols);

#endif
