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

/* One handle per device, made by k_cuda_blas_init when the device is set
 * up (kx_device_cuda): creating a handle allocates, which would break a
 * stream capture if it happened on the first product of a captured run.
 * The stream is set on every call, since one handle serves every stream of
 * its device (under the lock). */
enum { BLAS_MAX_DEVICES = 16 };
static cublasHandle_t blas[BLAS_MAX_DEVICES];
static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;

extern "C" int k_cuda_blas_init(int device)
{
    if (device < 0 || device >= BLAS_MAX_DEVICES)
        return -EINVAL;
    pthread_mutex_lock(&blas_lock);
    int rc = 0, prev = 0;
    if (!blas[device]) {
        cublasStatus_t st = CUBLAS_STATUS_NOT_INITIALIZED;
        if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) {
            st = cublasCreate(&blas[device]);
            cudaSetDevice(prev);
        }
        if (st != CUBLAS_STATUS_SUCCESS) {
            (void)cudaGetLastError();
            fprintf(stderr, "%s:%d: cuBLAS handle for device %d: error %d\n", __FILE__, __LINE__,
                    device, (int)st);
            blas[device] = NULL;
            rc = -EIO;
        }
    }
    pthread_mutex_unlock(&blas_lock);
    return rc;
}

extern "C" int k_cuda_matmul(float *c, const float *a, const float *b, int batch, int m, int n,
                             int k, size_t sa, size_t sb, size_t sc, void *stream)
{
    if (batch < 0 || m < 0 || n < 0 || k < 0)
        return -EINVAL;
    if (!batch || !m || !n)
        return 0;
    int dev = 0;
    K_CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= BLAS_MAX_DEVICES || !blas[dev]) {
        fprintf(stderr, "%s:%d: no cuBLAS handle for device %d (k_cuda_blas_init not called)\n",
                __FILE__, __LINE__, dev);
        return -EIO;
    }
    pthread_mutex_lock(&blas_lock);
    int rc = 0;
    cublasStatus_t st = cublasSetStream(blas[dev], K_STREAM(stream));
    /* Row-major C[m,n] = A[m,k] B[n,k]^T is column-major C^T[n,m] =
     * op_T(B as k x n) op_N(A as k x m). */
    const float one = 1.0f, zero = 0.0f;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasSgemmStridedBatched(blas[dev], CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, b, k,
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
    for (int d = 0; d < BLAS_MAX_DEVICES; d++)
        if (blas[d]) {
            cublasDestroy(blas[d]);
            blas[d] = NULL;
        }
    pthread_mutex_unlock(&blas_lock);
}
