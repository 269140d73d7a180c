/* KOP_MATMUL: C = A x B^T, batched.  The triple loop is the reference;
 * OpenBLAS sgemm is the path the worker runs: matrix products go through
 * a well-kept BLAS rather than hand-written loops. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"

void k_matmul_ref(float *c, const float *a, const float *b, int batch, int m, int n, int k,
                  size_t sa, size_t sb, size_t sc)
{
    for (int p = 0; p < batch; p++) {
        const float *ap = a + p * sa, *bp = b + p * sb;
        float *cp = c + p * sc;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                double acc = 0;
                for (int l = 0; l < k; l++)
                    acc += (double)ap[(size_t)i * k + l] * bp[(size_t)j * k + l];
                cp[(size_t)i * n + j] = (float)acc;
            }
    }
}

void k_matmul_rows_ref(float *y, const float *a, const float *w, int m, int n, int k)
{
    for (int r = 0; r < m; r++)
        for (int j = 0; j < n; j++) {
            /* Lane l's fused multiply-adds over columns l, l + 32, ...;
             * then the warp's butterfly as lane 0 ends it (each lane adds
             * the value of the lane LANE ^ O, for O = 16, 8, 4, 2, 1). */
            float lane[32], next[32];
            for (int l = 0; l < 32; l++) {
                lane[l] = 0;
                for (int i = l; i < k; i += 32)
                    lane[l] = fmaf(w[(size_t)j * k + i], a[(size_t)r * k + i], lane[l]);
            }
            for (int o = 16; o > 0; o >>= 1) {
                for (int l = 0; l < 32; l++)
                    next[l] = lane[l] + lane[l ^ o];
                memcpy(lane, next, sizeof(lane));
            }
            y[(size_t)r * n + j] = lane[0];
        }
}

void k_matmul(float *c, const float *a, const float *b, int batch, int m, int n, int k,
              size_t sa, size_t sb, size_t sc)
{
    for (int p = 0; p < batch; p++) {
        if (m == 1) /* a decode step: gemv reads B once, without packing */
            cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, b + p * sb, k, a + p * sa, 1,
                        0.0f, c + p * sc, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a + p * sa, k,
                        b + p * sb, k, 0.0f, c + p * sc, n);
    }
}
