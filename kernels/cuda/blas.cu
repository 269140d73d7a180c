/* Matrix products through cuBLAS and the all-reduce through NCCL (DESIGN.md
 * section 8: no hand-written GEMM on the GPU).  NCCL is compiled in only
 * when the build found nccl.h (BATON_NCCL=1, see the Makefile); without it a
 * one-rank all-reduce is still the identity and anything more is -ENOSYS. */
#include <pthread.h>

#include <cublas_v2.h>

#include "kernels/cuda/kcuda.cuh"

#if defined(BATON_NCCL) && BATON_NCCL
#include <nccl.h>
#endif

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

#if defined(BATON_NCCL) && BATON_NCCL

#define K_NCCL_CHECK(call)                                                                    \
    do {                                                                                      \
        ncclResult_t r_ = (call);                                                             \
        if (r_ != ncclSuccess) {                                                              \
            fprintf(stderr, "%s:%d: NCCL error: %s\n", __FILE__, __LINE__,                    \
                    ncclGetErrorString(r_));                                                  \
            return -EIO;                                                                      \
        }                                                                                     \
    } while (0)

extern "C" int k_cuda_comm_create(void **comm, int ndev)
{
    /* One process driving NDEV devices; this layer supports NDEV = 1 (a
     * multi-device process needs one stream per device, which the executor
     * does not have yet). */
    if (!comm || ndev != 1)
        return -EINVAL;
    int dev;
    K_CUDA_CHECK(cudaGetDevice(&dev));
    ncclComm_t c;
    K_NCCL_CHECK(ncclCommInitAll(&c, 1, &dev));
    *comm = c;
    return 0;
}

extern "C" void k_cuda_comm_destroy(void *comm)
{
    if (comm)
        ncclCommDestroy((ncclComm_t)comm);
}

extern "C" int k_cuda_allreduce(float *buf, size_t n, void *comm, void *stream)
{
    if (!comm || !n)
        return 0; /* one rank: the identity */
    K_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, (ncclComm_t)comm,
                               K_STREAM(stream)));
    return 0;
}

#else

extern "C" int k_cuda_comm_create(void **comm, int ndev)
{
    (void)ndev;
    if (comm)
        *comm = NULL;
    return -ENOSYS;
}

extern "C" void k_cuda_comm_destroy(void *comm)
{
    (void)comm;
}

extern "C" int k_cuda_allreduce(float *buf, size_t n, void *comm, void *stream)
{
    (void)buf;
    (void)n;
    (void)stream;
    return comm ? -ENOSYS : 0;
}

#endif
