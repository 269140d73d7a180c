/* KOP_MATMUL: C = A x B^T, batched.  The triple loop is the reference;
 * OpenBLAS sgemm is the path the worker runs: matrix products go through
 * a well-kept BLAS rather than hand-written loops. */
#include <cblas.h>

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
