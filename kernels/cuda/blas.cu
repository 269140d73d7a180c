/* Matrix products through cuBLAS (no hand-written GEMM on the GPU).  The all-reduce through NCCL is in comm.cu. */
#include <pthread.h>

#include <cublas_v2.h>

#include "kernels/cuda/kcuda.cuh"


#define K_CUBLAS_CHECK(call)                                                                  \
    do {                                                                                      \
        cublasStatus_t s_ = (call);                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
            fprintf(stderr, "%s:%d: cuBLAS error %d\n", __FILE__, __LINE__, (int)s_);        \
            return -EIO;                                                                      \
        }                                                                                     \
    } while (0)

/* One handle per process, created on first use: creating a handle costs
 * milliseconds, far more than a decode step's products. */
static cublasHandle_t blas;
static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;

extern "C" int k_cuda_matmul(float *c, const float *a, const float *b, int batch, int m, int n,
                             int k, size_t sa, size_t sb, size_t sc, void *stream)
{
    if (batch < 0 || m < 0 || n < 0 || k < 0)
        return -EINVAL;
    if (!batch || !m || !n)
        return 0;
    pthread_mutex_lock(&blas_lock);
    int rc = 0;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (!blas)
        st = cublasCreate(&blas);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasSetStream(blas, K_STREAM(stream));
    /* Row-major C[m,n] = A[m,k] B[n,k]^T is column-major C^T[n,m] =
     * op_T(B as k x n) op_N(A as k x m). */
    const float one = 1.0f, zero = 0.0f;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, b, k,
                                       (long long)sb, a, k, (long long)sa, &zero, c, n,
                                       (long long)sc, batch);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "%s:%d: cuBLAS error %d\n", __FILE__, __LINE__, (int)st);
        rc = -EIO;
    }
    pthread_mutex_unlock(&blas_lock);
    return rc;
}

extern "C" void k_cuda_blas_shutdown(void)
{
    pthread_mutex_lock(&blas_lock);
    if (blas)
        cublasDestroy(blas);
    blas = NULL;
    pthread_mutex_unlock(&blas_lock);
}
