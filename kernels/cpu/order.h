/* The order of logits that argmax and the samplers use, written once for C
 * and CUDA (K_HD) so the CPU and the GPU pick the same token: descending
 * logit, then ascending index, and a NaN below every number (so a NaN never
 * wins while any logit is a number; a row of NaNs gives index 0).  NaN
 * is tested as v != v, which holds without <math.h> on either side. */
#ifndef BATON_KERNELS_CPU_ORDER_H
#define BATON_KERNELS_CPU_ORDER_H

#include "kernels/cpu/half.h" /* K_HD */

/* Whether logit LA at index IA ranks before logit LB at index IB. */
K_HD int k_logit_better(float la, int ia, float lb, int ib)
{
    int na = la != la, nb = lb != lb;
    if (na != nb)
        return nb;
    if (na)
        return ia < ib;
    return la > lb || (la == lb && ia < ib);
}

/* The unnormalised probability of a candidate with logit L given the best
 * logit TOP and temperature T: 0 for a NaN, 1 for a tie with the best (so a
 * row of -inf does not become NaN), else exp((L - TOP) / T). */
#define K_CAND_WEIGHT(l, top, t) ((l) != (l) ? 0.0f : (l) == (top) ? 1.0f : expf(((l) - (top)) / (t)))

#endif
