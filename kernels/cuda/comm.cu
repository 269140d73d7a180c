/* The all-reduce, and the point-to-point transfers of cross-host edges,
 * through NCCL.  In a file of its own
 * so that only programs which reduce across ranks link libnccl: NCCL is
 * compiled in only when the build found nccl.h (BATON_NCCL=1, see the
 * Makefile); without it the one-rank identity remains. */
#include <string.h>

#include "kernels/cuda/kcuda.cuh"

#if defined(BATON_NCCL) && BATON_NCCL
#include <nccl.h>
#endif

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

static_assert(sizeof(ncclUniqueId) <= K_CUDA_COMM_ID_BYTES, "K_CUDA_COMM_ID_BYTES too small");

extern "C" int k_cuda_comm_unique_id(void *id, size_t len)
{
    if (!id || len < sizeof(ncclUniqueId))
        return -EINVAL;
    ncclUniqueId u;
    K_NCCL_CHECK(ncclGetUniqueId(&u));
    memcpy(id, &u, sizeof(u));
    return 0;
}

extern "C" int k_cuda_comm_init_rank(void **comm, int device, const void *id, size_t len,
                                     int nranks, int rank)
{
    if (!comm || !id || len < sizeof(ncclUniqueId) || nranks < 1 || rank < 0 || rank >= nranks)
        return -EINVAL;
    *comm = NULL;
    K_CUDA_CHECK(cudaSetDevice(device));
    ncclUniqueId u;
    memcpy(&u, id, sizeof(u));
    ncclComm_t c;
    K_NCCL_CHECK(ncclCommInitRank(&c, nranks, u, rank));
    *comm = c;
    return 0;
}

extern "C" void k_cuda_comm_destroy(void *comm)
{
    if (comm)
        ncclCommDestroy((ncclComm_t)comm);
}

extern "C" int k_cuda_comm_join(void **comm, int device, const void *id, size_t len, int nranks,
                                int rank)
{
    if (!comm || !id || len < sizeof(ncclUniqueId) || nranks < 1 || rank < 0 || rank >= nranks)
        return -EINVAL;
    *comm = NULL;
    K_CUDA_CHECK(cudaSetDevice(device));
    ncclUniqueId u;
    memcpy(&u, id, sizeof(u));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&c, nranks, u, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        if (c)
            ncclCommAbort(c);
        fprintf(stderr, "%s:%d: NCCL error: %s\n", __FILE__, __LINE__, ncclGetErrorString(r));
        return -EIO;
    }
    *comm = c;
    return 0;
}

extern "C" int k_cuda_comm_ready(void *comm)
{
    ncclResult_t r = ncclSuccess;
    if (!comm || ncclCommGetAsyncError((ncclComm_t)comm, &r) != ncclSuccess)
        return -EIO;
    return r == ncclSuccess ? 1 : r == ncclInProgress ? 0 : -EIO;
}

extern "C" void k_cuda_comm_abort(void *comm)
{
    if (comm)
        ncclCommAbort((ncclComm_t)comm);
}

extern "C" int k_cuda_comm_failed(void *comm)
{
    ncclResult_t r = ncclSuccess;
    if (!comm || ncclCommGetAsyncError((ncclComm_t)comm, &r) != ncclSuccess)
        return 1;
    return r != ncclSuccess && r != ncclInProgress;
}

/* R, what an operation's call on C returned, once the operation is on
 * its stream: a non-blocking communicator (k_cuda_comm_join: a pair's, or a
 * group's, so that its forming can be given up) may still be queueing it,
 * and what the caller queues next (an event, a kernel) must come after it.
 * 0, or -EIO. */
static int queued(ncclComm_t c, ncclResult_t r)
{
    while (r == ncclInProgress) {
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(c, &st) != ncclSuccess)
            return -EIO;
        r = st;
    }
    if (r != ncclSuccess) {
        fprintf(stderr, "%s:%d: NCCL error: %s\n", __FILE__, __LINE__, ncclGetErrorString(r));
        return -EIO;
    }
    return 0;
}

extern "C" int k_cuda_comm_p2p(void *comm, int send, void *buf, size_t n, int peer, void *stream)
{
    if (!comm || (!buf && n))
        return -EINVAL;
    ncclComm_t c = (ncclComm_t)comm;
    return queued(c, send ? ncclSend(buf, n, ncclUint8, peer, c, K_STREAM(stream))
                          : ncclRecv(buf, n, ncclUint8, peer, c, K_STREAM(stream)));
}

extern "C" int k_cuda_allreduce(float *buf, size_t n, void *comm, void *stream)
{
    if (!comm || !n)
        return 0; /* one rank: the identity */
    ncclComm_t c = (ncclComm_t)comm;
    return queued(c, ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, c, K_STREAM(stream)));
}

#else

extern "C" int k_cuda_comm_create(void **comm, int ndev)
{
    (void)ndev;
    if (comm)
        *comm = NULL;
    return -ENOSYS;
}

extern "C" int k_cuda_comm_unique_id(void *id, size_t len)
{
    (void)id;
    (void)len;
    return -ENOSYS;
}

extern "C" int k_cuda_comm_init_rank(void **comm, int device, const void *id, size_t len,
                                     int nranks, int rank)
{
    (void)device, (void)id, (void)len, (void)nranks, (void)rank;
    if (comm)
        *comm = NULL;
    return -ENOSYS;
}

extern "C" void k_cuda_comm_destroy(void *comm)
{
    (void)comm;
}

extern "C" void k_cuda_comm_abort(void *comm)
{
    (void)comm;
}

extern "C" int k_cuda_comm_join(void **comm, int device, const void *id, size_t len, int nranks,
                                int rank)
{
    (void)device, (void)id, (void)len, (void)nranks, (void)rank;
    if (comm)
        *comm = NULL;
    return -ENOSYS;
}

extern "C" int k_cuda_comm_ready(void *comm)
{
    (void)comm;
    return -ENOSYS;
}

extern "C" int k_cuda_comm_failed(void *comm)
{
    (void)comm;
    return 1;
}

extern "C" int k_cuda_comm_p2p(void *comm, int send, void *buf, size_t n, int peer, void *stream)
{
    (void)comm, (void)send, (void)buf, (void)n, (void)peer, (void)stream;
    return -ENOSYS;
}

extern "C" int k_cuda_allreduce(float *buf, size_t n, void *comm, void *stream)
{
    (void)buf;
    (void)n;
    (void)stream;
    return comm ? -ENOSYS : 0;
}

#endif
