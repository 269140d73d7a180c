/* The x86 instances of the integer quantized products (qdot_x86.c, built
 * from qdot_body.h), declared once for their definitions and for qdot.c,
 * which picks one by k__cpu_isa.  Off x86-64 only k__cpu_isa exists (it
 * says K_ISA_REF), and the instances are never called. */
#ifndef BATON_KERNELS_CPU_QDOT_X86_H
#define BATON_KERNELS_CPU_QDOT_X86_H

#include <stddef.h>

#include "kernels/kernels.h"

/* The best instance this CPU runs: K_ISA_VNNI, K_ISA_AVX2 or K_ISA_REF. */
int k__cpu_isa(void);

/* Y[j, r] for rows [R0, R1) of W and every row j < M of A, Y's rows LDY
 * floats apart. */
void k__qmm_q8_avx2(float *y, size_t ldy, const void *w, kdtype t, const k_q8a *a, int m, int r0,
                    int r1, int cols);
void k__qmm_q8_vnni(float *y, size_t ldy, const void *w, kdtype t, const k_q8a *a, int m, int r0,
                    int r1, int cols);

/* N floats of X (a multiple of 32) as activation blocks, as k_quantize_act. */
void k__quant_act_avx2(k_q8a *a, const float *x, size_t n);
void k__quant_act_vnni(k_q8a *a, const float *x, size_t n);

#endif
