/* cudaemu: NCCL for one rank per communicator.
 *
 * baton's comm layer (kernels/cuda/comm.cu) makes one-rank communicators
 * today, where an all-reduce is a copy.  The collective is queued on its
 * stream like a kernel.  Communicators of several ranks (one process per
 * GPU) are refused with ncclInvalidUsage until baton's tensor parallelism
 * uses them; see docs/cuda-emulator.md. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cudaemu/emu.h"
#include "nccl.h"

struct cudaemu_nccl {
    int nranks, rank;
};

using namespace cudaemu;

extern "C" {

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    }
    return "unknown result";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id)
        return ncclInvalidArgument;
    memset(id, 0, sizeof(*id));
    snprintf(id->internal, sizeof(id->internal), "cudaemu-nccl-%d-%llx", (int)getpid(),
             (unsigned long long)rng());
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    (void)id;
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    if (nranks > 1) {
        fprintf(stderr, "cudaemu: NCCL communicators of %d ranks are not emulated yet\n", nranks);
        return ncclInvalidUsage;
    }
    *comm = new cudaemu_nccl{nranks, rank};
    return ncclSuccess;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    (void)devlist;
    if (!comms || ndev < 1)
        return ncclInvalidArgument;
    if (ndev > 1) {
        fprintf(stderr, "cudaemu: NCCL communicators of %d ranks are not emulated yet\n", ndev);
        return ncclInvalidUsage;
    }
    comms[0] = new cudaemu_nccl{1, 0};
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> g(emu_lock);
    if (!comm || op != ncclSum || (type != ncclFloat32 && type != ncclInt32))
        return ncclInvalidArgument;
    size_t bytes = count * 4;
    if (!count)
        return ncclSuccess;
    if (!mem_is_device(send, bytes) || !mem_is_device(recv, bytes)) {
        problem("ncclAllReduce of %zu bytes: a buffer is not inside device memory", bytes);
        return ncclInvalidArgument;
    }
    cudaError_t e = stream_enqueue(stream, "ncclAllReduce", [send, recv, bytes] {
        if (send != recv)
            memmove(recv, send, bytes);
    });
    return e ? ncclUnhandledCudaError : ncclSuccess;
}

} /* extern "C" */
