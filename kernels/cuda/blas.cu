/* Matrix products through cuBLAS (no hand-written GEMM on the GPU).  The all-reduce through NCCL is in comm.cu.
 *
 * cuBLAS is opened with dlopen when the first GPU is set up, not linked:
 * loading libcublasLt costs about 150 MiB of resident memory at process
 * start (its relocated tables and static initialisers) whether or not a
 * GPU is ever used, which a CPU worker would pay for nothing.  The CUDA
 * emulator (BATON_EMU) provides the four functions itself. */
#include <pthread.h>
#include <string.h>

#include <cublas_v2.h>
#ifndef BATON_EMU
#include <dlfcn.h>
#endif

#include "kernels/cuda/kcuda.cuh"

#ifdef BATON_EMU
#define CB(name) name
static int cublas_load(void)
{
    return 0;
}
#else
/* The entry points in use, by their exported names (cublas_v2.h maps
 * cublasCreate to cublasCreate_v2 and so on). */
static struct {
    cublasStatus_t (*cublasCreate)(cublasHandle_t *);
    cublasStatus_t (*cublasDestroy)(cublasHandle_t);
    cublasStatus_t (*cublasSetStream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*cublasSgemmStridedBatched)(cublasHandle_t, cublasOperation_t,
                                                cublasOperation_t, int, int, int, const float *,
                                                const float *, int, long long, const float *, int,
                                                long long, const float *, float *, int, long long,
                                                int);
} cb;
#define CB(name) cb.name
#define K_STR2(x) #x
#define K_STR(x) K_STR2(x)

/* Opens cuBLAS once (under blas_lock): 0, or -EIO after saying why. */
static int cublas_load(void)
{
    static void *lib;
    if (lib)
        return 0;
    const char *names[] = {"libcublas.so." K_STR(CUBLAS_VER_MAJOR), "libcublas.so"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !lib; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "%s:%d: cannot open cuBLAS: %s\n", __FILE__, __LINE__, dlerror());
        return -EIO;
    }
    void *f[4] = {dlsym(lib, "cublasCreate_v2"), dlsym(lib, "cublasDestroy_v2"),
                  dlsym(lib, "cublasSetStream_v2"), dlsym(lib, "cublasSgemmStridedBatched")};
    if (!f[0] || !f[1] || !f[2] || !f[3]) {
        fprintf(stderr, "%s:%d: cuBLAS lacks an entry point: %s\n", __FILE__, __LINE__, dlerror());
        dlclose(lib);
        lib = NULL;
        return -EIO;
    }
    memcpy(&cb.cublasCreate, &f[0], sizeof(void *));
    memcpy(&cb.cublasDestroy, &f[1], sizeof(void *));
    memcpy(&cb.cublasSetStream, &f[2], sizeof(void *));
    memcpy(&cb.cublasSgemmStridedBatched, &f[3], sizeof(void *));
    return 0;
}
#endif


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
    if (!blas[device] && cublas_load() != 0) {
        rc = -EIO;
    } else if (!blas[device]) {
        cublasStatus_t st = CUBLAS_STATUS_NOT_INITIALIZED;
        if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) {
            st = CB(cublasCreate)(&blas[device]);
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
    cublasStatus_t st = CB(cublasSetStream)(blas[dev], K_STREAM(stream));
    /* Row-major C[m,n] = A[m,k] B[n,k]^T is column-major C^T[n,m] =
     * op_T(B as k x n) op_N(A as k x m). */
    const float one = 1.0f, zero = 0.0f;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = CB(cublasSgemmStridedBatched)(blas[dev], CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, b, k,
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
            CB(cublasDestroy)(blas[d]);
            blas[d] = NULL;
        }
    pthread_mutex_unlock(&blas_lock);
}
