/* cudaemu: cuBLAS on OpenBLAS.
 *
 * cuBLAS is column-major, as the reference BLAS is, so each call maps to
 * cblas_sgemm with CblasColMajor and the same arguments: a transposed or
 * swapped operand in baton's call gives the same wrong answer here as on a
 * GPU.  A product is queued on the handle's stream like a kernel, and its
 * operands must be device memory.  cublasCreate allocates (a real handle
 * allocates its workspace), so it is unsafe inside a stream capture, as on
 * a GPU.
 *
 * OpenBLAS runs single-threaded here: its worker threads started before
 * device memory got its protection key, so they could not read it (see
 * memory.cc), and a product's speed means nothing on the emulator. */
#include <cblas.h>

#include "cublas_v2.h"
#include "cudaemu/emu.h"

struct cudaemu_cublas {
    cudaStream_t stream;
};

using namespace cudaemu;

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (sticky_error() || capture_check_unsafe("cublasCreate"))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    openblas_set_num_threads(1);
    *handle = new cudaemu_cublas{NULL};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

/* Whether a ROWS x COLS column-major matrix with leading dimension LD at P
 * (BATCH of them, STRIDE floats apart) lies in device memory. */
static bool operand_ok(const char *what, const float *p, int rows, int cols, int ld,
                       long long stride, int batch)
{
    if (!rows || !cols || !batch)
        return true;
    size_t span = ((size_t)(cols - 1) * ld + rows) * sizeof(float);
    for (int b = 0; b < batch; b++)
        if (!mem_is_device(p + (size_t)b * stride, span)) {
            problem("cublasSgemm: operand %s (%d x %d, ld %d, batch %d) is not inside device "
                    "memory (%s)",
                    what, rows, cols, ld, b, mem_describe(p + (size_t)b * stride).c_str());
            return false;
        }
    return true;
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
                                         cublasOperation_t tb, int m, int n, int k,
                                         const float *alpha, const float *a, int lda,
                                         long long sa, const float *b, int ldb, long long sb,
                                         const float *beta, float *c, int ldc, long long sc,
                                         int batch)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (sticky_error())
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || ta > CUBLAS_OP_T || tb > CUBLAS_OP_T ||
        !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* The stored shapes: op(A) is m x k, op(B) is k x n. */
    int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    if (lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!m || !n || !batch)
        return CUBLAS_STATUS_SUCCESS;
    if ((k && (!operand_ok("A", a, ar, ac, lda, sa, batch) ||
               !operand_ok("B", b, br, bc, ldb, sb, batch))) ||
        !operand_ok("C", c, m, n, ldc, sc, batch))
        return CUBLAS_STATUS_INVALID_VALUE;
    float al = *alpha, be = *beta; /* host scalars, read at the call as cuBLAS does */
    cudaError_t e = stream_enqueue(h->stream, "cublasSgemm", [=] {
        for (int i = 0; i < batch; i++)
            cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                        tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, al,
                        a + (size_t)i * sa, lda, b + (size_t)i * sb, ldb, be, c + (size_t)i * sc,
                        ldc);
    });
    return e ? CUBLAS_STATUS_EXECUTION_FAILED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *a, int lda,
                           const float *b, int ldb, const float *beta, float *c, int ldc)
{
    return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c,
                                     ldc, 0, 1);
}

} /* extern "C" */
