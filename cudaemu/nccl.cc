/* cudaemu: NCCL between the processes of one host.
 *
 * A communicator is a shared-memory file named by its unique id (made by
 * ncclGetUniqueId in one process and handed to the others by the caller,
 * as with real NCCL): a header of per-rank counters and one chunk-sized
 * slot per rank.  ncclCommInitRank waits until every rank has joined, as
 * the real one does, and the last to join removes the name, so nothing is
 * left in /dev/shm; the name of a group whose maker died before it formed
 * is removed by the next ncclGetUniqueId on the host.
 *
 * Point-to-point: each ordered pair of ranks has a mailbox slot with a
 * posted and an acknowledged chunk count; a send posts chunks into it (the
 * next once the receiver acknowledged the last), a receive copies them out.
 * Between ncclGroupStart and ncclGroupEnd, sends and receives become one
 * command that advances all of them, so two ranks may exchange buffers of
 * any size without deadlock, as NCCL's groups allow.
 *
 * An all-reduce is queued on its stream like a kernel, as a command that
 * makes progress in steps: for each chunk, a rank copies its part into its
 * slot and posts it, waits until every rank has posted, sums the slots
 * into its output, and marks the chunk consumed; it reuses its slot once
 * every rank consumed it.  A step that must wait for another process
 * returns, and the stream scheduler (streams.cc) runs other streams or
 * sleeps, so one process's collective never stops its own other streams,
 * as on a GPU.  A peer that never arrives is a problem after
 * CUDAEMU_NCCL_TIMEOUT seconds (default 60).
 *
 * ncclCommAbort ends the communicator's queued operations at once (their
 * buffers keep whatever they held) and raises a flag in the shared file,
 * so the peers' pending operations end too and ncclCommGetAsyncError
 * reports ncclRemoteError to them: what real NCCL does when a peer's
 * connection closes, on the transports that notice it.
 *
 * ncclCommInitRankConfig with blocking = 0 returns at once
 * (ncclInProgress); ncclCommGetAsyncError reports ncclInProgress until every
 * rank has joined, and an abort before that removes the name. */
#include <atomic>
#include <vector>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cudaemu/emu.h"
#include "nccl.h"

namespace {

const uint32_t MAGIC = 0x6e63636c; /* "nccl" */
const int MAX_RANKS = 64;
const size_t SLOT = (size_t)1 << 20;     /* bytes of one all-reduce chunk */
const size_t P2P_SLOT = (size_t)256 << 10; /* bytes of one send/receive chunk */

struct shared {
    std::atomic<uint32_t> magic;
    std::atomic<int32_t> nranks;
    std::atomic<int32_t> joined;
    std::atomic<uint32_t> aborted;             /* a rank called ncclCommAbort */
    std::atomic<uint64_t> posted[MAX_RANKS];   /* chunks each rank has posted */
    std::atomic<uint64_t> consumed[MAX_RANKS]; /* chunks each rank has summed */
    /* [src * MAX_RANKS + dst]: chunks src posted to dst, and dst took. */
    std::atomic<uint64_t> p2p_posted[MAX_RANKS * MAX_RANKS];
    std::atomic<uint64_t> p2p_acked[MAX_RANKS * MAX_RANKS];
    /* nranks slots of SLOT bytes, then nranks * nranks of P2P_SLOT (sparse:
     * a pair that never talks costs no memory). */
    alignas(64) unsigned char data[];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "atomics in shared memory");

} /* namespace */

struct cudaemu_nccl {
    int nranks, rank;
    shared *sh;        /* NULL for one rank */
    size_t map_bytes;
    uint64_t posted;   /* all-reduce chunks this rank has posted */
    uint64_t sent[MAX_RANKS], taken[MAX_RANKS]; /* p2p chunks to / from each peer */
    bool aborted;      /* ncclCommAbort: queued operations end without touching sh */
    bool joining;      /* non-blocking init: not every rank has joined yet */
    int32_t order;     /* how many had joined with this rank (the last unlinks the name) */
    char name[NCCL_UNIQUE_ID_BYTES]; /* the shared file's name */
};

/* Aborted communicators: commands still queued on streams name them, so
 * they are kept (a few KiB each) rather than freed under those commands. */
static std::vector<cudaemu_nccl *> *aborted_comms;

namespace {

unsigned char *p2p_slot(cudaemu_nccl *c, int src, int dst)
{
    return c->sh->data + (size_t)c->nranks * SLOT +
           ((size_t)src * c->nranks + dst) * P2P_SLOT;
}

/* One send or receive in progress. */
struct p2p_op {
    bool send;
    unsigned char *buf;
    size_t bytes, off;
    int peer;
    cudaemu_nccl *comm;
    cudaStream_t stream;
};

/* Advances OP as far as the peer allows; true when it is complete. */
bool p2p_step(p2p_op &op)
{
    cudaemu_nccl *c = op.comm;
    if (c->aborted || c->sh->aborted.load(std::memory_order_acquire))
        return true; /* ended by an abort: the buffer holds what it held */
    shared *sh = c->sh;
    int me = c->rank, peer = op.peer;
    while (op.off < op.bytes) {
        size_t len = op.bytes - op.off < P2P_SLOT ? op.bytes - op.off : P2P_SLOT;
        if (op.send) {
            size_t k = (size_t)me * MAX_RANKS + peer;
            if (sh->p2p_acked[k].load(std::memory_order_acquire) < c->sent[peer])
                return false; /* the receiver has not taken the last chunk */
            memcpy(p2p_slot(c, me, peer), op.buf + op.off, len);
            sh->p2p_posted[k].store(++c->sent[peer], std::memory_order_release);
        } else {
            size_t k = (size_t)peer * MAX_RANKS + me;
            if (sh->p2p_posted[k].load(std::memory_order_acquire) <= c->taken[peer])
                return false;
            memcpy(op.buf + op.off, p2p_slot(c, peer, me), len);
            sh->p2p_acked[k].store(++c->taken[peer], std::memory_order_release);
        }
        op.off += len;
    }
    return true;
}

thread_local int group_depth;
thread_local std::vector<p2p_op> *group_ops;

} /* namespace */

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
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result";
}

/* Removes the names of communicators whose maker (the process that made
 * the id, the PID in the name) is gone: a group whose rank 0 died before
 * every rank joined never forms, and its name would stay in /dev/shm for
 * good.  A rank still waiting in the join keeps its mapping. */
static void remove_orphans(void)
{
    DIR *dir = opendir("/dev/shm");
    if (!dir)
        return;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        int pid;
        char rest[64];
        if (sscanf(e->d_name, "cudaemu-nccl-%d-%63s", &pid, rest) != 2 || pid <= 0)
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        char name[300];
        snprintf(name, sizeof(name), "/%s", e->d_name);
        shm_unlink(name);
    }
    closedir(dir);
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id)
        return ncclInvalidArgument;
    remove_orphans();
    memset(id, 0, sizeof(*id));
    uint64_t r;
    {
        std::lock_guard<emu_mutex> g(emu_lock);
        r = rng() ^ (uint64_t)seconds_now() * 1000003u;
    }
    snprintf(id->internal, sizeof(id->internal), "/cudaemu-nccl-%d-%016llx", (int)getpid(),
             (unsigned long long)r);
    return ncclSuccess;
}

/* Opens (creating it if need be) the shared file of ID for NRANKS ranks
 * and counts the caller in: *ORDER is how many had joined, the caller
 * included. */
static ncclResult_t comm_join(ncclUniqueId *id, int nranks, shared **out, size_t *bytes_out,
                              int32_t *order)
{
    id->internal[sizeof(id->internal) - 1] = 0;
    if (strncmp(id->internal, "/cudaemu-nccl-", 14) != 0)
        return ncclInvalidArgument;
    size_t bytes = sizeof(shared) + (size_t)nranks * SLOT + (size_t)nranks * nranks * P2P_SLOT;
    int fd = shm_open(id->internal, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return ncclSystemError;
    struct stat st;
    if (fstat(fd, &st) != 0 || ((size_t)st.st_size < bytes && ftruncate(fd, (off_t)bytes) != 0)) {
        close(fd);
        return ncclSystemError;
    }
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return ncclSystemError;
    shared *sh = (shared *)m;
    /* The file starts zeroed: the first rank to set the size sets it for
     * all, and a rank that disagrees is refused. */
    int32_t zero = 0;
    sh->nranks.compare_exchange_strong(zero, nranks);
    if (sh->nranks.load() != nranks) {
        munmap(m, bytes);
        return ncclInvalidUsage;
    }
    sh->magic.store(MAGIC);
    *order = sh->joined.fetch_add(1) + 1;
    *out = sh;
    *bytes_out = bytes;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    if (!comm || nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    *comm = NULL;
    if (nranks == 1) {
        *comm = new cudaemu_nccl{1, 0, NULL, 0, 0, {0}, {0}, false, false, 0, {0}};
        return ncclSuccess;
    }
    shared *sh;
    size_t bytes;
    int32_t order;
    ncclResult_t r = comm_join(&id, nranks, &sh, &bytes, &order);
    if (r != ncclSuccess)
        return r;
    cudaemu_nccl *c = new cudaemu_nccl{nranks, rank, sh, bytes, 0, {0}, {0}, false, true, order,
                                       {0}};
    memcpy(c->name, id.internal, sizeof(c->name));
    if (config && !config->blocking) {
        /* Non-blocking: the caller polls ncclCommGetAsyncError until the
         * others have joined (ncclInProgress until then). */
        *comm = c;
        return sh->joined.load() < nranks ? ncclInProgress : ncclSuccess;
    }
    double t0 = seconds_now(), limit = wait_limit_s();
    while (sh->joined.load() < nranks) {
        if (seconds_now() - t0 > limit) {
            fprintf(stderr, "cudaemu: ncclCommInitRank: rank %d of %d waited %.0f s for the "
                    "others\n", rank, nranks, limit);
            shm_unlink(id.internal); /* this communicator will never form */
            munmap(sh, bytes);
            delete c;
            return ncclSystemError;
        }
        usleep(200);
    }
    if (order == nranks)
        shm_unlink(id.internal); /* everyone has it open: nothing left in /dev/shm */
    c->joining = false;
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    (void)devlist;
    if (!comms || ndev < 1)
        return ncclInvalidArgument;
    if (ndev > 1) {
        /* One process driving several devices: baton runs one process per
         * device, so this emulator does not do it. */
        fprintf(stderr, "cudaemu: ncclCommInitAll of %d devices in one process is not emulated; "
                "use one process per device and ncclCommInitRank\n", ndev);
        return ncclInvalidUsage;
    }
    comms[0] = new cudaemu_nccl{1, 0, NULL, 0, 0, {0}, {0}, false, false, 0, {0}};
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    /* Collectives still queued must finish before the shared file goes. */
    cudaDeviceSynchronize();
    if (comm->sh)
        munmap(comm->sh, comm->map_bytes);
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    std::lock_guard<emu_mutex> g(emu_lock);
    comm->aborted = true;
    if (comm->joining)
        shm_unlink(comm->name); /* it will never form */
    if (comm->sh) {
        comm->sh->aborted.store(1, std::memory_order_release);
        munmap(comm->sh, comm->map_bytes);
        comm->sh = NULL;
    }
    if (!aborted_comms)
        aborted_comms = new std::vector<cudaemu_nccl *>();
    aborted_comms->push_back(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error)
{
    if (!comm || !async_error || comm->aborted)
        return ncclInvalidArgument;
    if (comm->joining) {
        if (comm->sh->joined.load() < comm->nranks) {
            *async_error = ncclInProgress;
            return ncclSuccess;
        }
        comm->joining = false;
        if (comm->order == comm->nranks)
            shm_unlink(comm->name);
    }
    *async_error = comm->sh && comm->sh->aborted.load(std::memory_order_acquire)
                       ? ncclRemoteError : ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    if (!comm || op != ncclSum || (type != ncclFloat32 && type != ncclInt32))
        return ncclInvalidArgument;
    if (sticky_error())
        return ncclUnhandledCudaError;
    size_t bytes = count * 4;
    if (!count)
        return ncclSuccess;
    if (!mem_is_device(send, bytes) || !mem_is_device(recv, bytes)) {
        problem("ncclAllReduce of %zu bytes: a buffer is not inside device memory", bytes);
        return ncclInvalidArgument;
    }
    cudaError_t e;
    if (comm->nranks == 1) {
        e = stream_enqueue(stream, "ncclAllReduce", [send, recv, bytes] {
            if (send != recv)
                memmove(recv, send, bytes);
        });
        return e ? ncclUnhandledCudaError : ncclSuccess;
    }
    /* The steps of one all-reduce; state kept between polls. */
    struct progress {
        size_t off = 0;
        bool posted = false;
    };
    auto st = std::make_shared<progress>();
    e = stream_enqueue_polled(stream, "ncclAllReduce", [=]() -> poll_result {
        if (comm->aborted || comm->sh->aborted.load(std::memory_order_acquire))
            return POLL_DONE;
        shared *sh = comm->sh;
        int n = comm->nranks, me = comm->rank;
        unsigned char *mine = sh->data + (size_t)me * SLOT;
        while (st->off < bytes) {
            size_t len = bytes - st->off < SLOT ? bytes - st->off : SLOT;
            if (!st->posted) {
                /* My slot is free once every rank summed my last chunk. */
                for (int r = 0; r < n; r++)
                    if (sh->consumed[r].load(std::memory_order_acquire) < comm->posted)
                        return POLL_WAIT;
                memcpy(mine, (const unsigned char *)send + st->off, len);
                comm->posted++;
                sh->posted[me].store(comm->posted, std::memory_order_release);
                st->posted = true;
            }
            for (int r = 0; r < n; r++)
                if (sh->posted[r].load(std::memory_order_acquire) < comm->posted)
                    return POLL_WAIT;
            if (type == ncclFloat32) {
                float *out = (float *)((unsigned char *)recv + st->off);
                for (size_t i = 0; i < len / 4; i++) {
                    float s = 0;
                    for (int r = 0; r < n; r++)
                        s += ((const float *)(sh->data + (size_t)r * SLOT))[i];
                    out[i] = s;
                }
            } else {
                int32_t *out = (int32_t *)((unsigned char *)recv + st->off);
                for (size_t i = 0; i < len / 4; i++) {
                    uint32_t s = 0;
                    for (int r = 0; r < n; r++)
                        s += ((const uint32_t *)(sh->data + (size_t)r * SLOT))[i];
                    out[i] = (int32_t)s;
                }
            }
            sh->consumed[me].store(comm->posted, std::memory_order_release);
            st->off += len;
            st->posted = false;
        }
        return POLL_DONE;
    });
    return e ? ncclUnhandledCudaError : ncclSuccess;
}

static ncclResult_t p2p(bool send, void *buf, size_t count, ncclDataType_t type, int peer,
                        ncclComm_t comm, cudaStream_t stream)
{
    std::lock_guard<emu_mutex> g(emu_lock);
    bool byte = type == ncclInt8 || type == ncclUint8;
    if (!comm || (type != ncclFloat32 && type != ncclInt32 && !byte) || peer < 0 ||
        peer >= comm->nranks || peer == comm->rank || comm->aborted || comm->joining)
        return ncclInvalidArgument;
    if (sticky_error())
        return ncclUnhandledCudaError;
    size_t bytes = count * (byte ? 1 : 4);
    if (count && !mem_is_device(buf, bytes)) {
        problem("%s of %zu bytes: the buffer is not inside device memory",
                send ? "ncclSend" : "ncclRecv", bytes);
        return ncclInvalidArgument;
    }
    p2p_op op = {send, (unsigned char *)buf, bytes, 0, peer, comm, stream};
    if (group_depth > 0) {
        if (!group_ops->empty() && group_ops->front().stream != stream) {
            fprintf(stderr, "cudaemu: a group of NCCL operations on several streams is not "
                    "emulated\n");
            return ncclInvalidUsage;
        }
        group_ops->push_back(op);
        return ncclSuccess;
    }
    auto st = std::make_shared<p2p_op>(op);
    cudaError_t e = stream_enqueue_polled(stream, send ? "ncclSend" : "ncclRecv",
                                          [st]() { return p2p_step(*st) ? POLL_DONE : POLL_WAIT; });
    return e ? ncclUnhandledCudaError : ncclSuccess;
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return p2p(true, (void *)send, count, type, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return p2p(false, recv, count, type, peer, comm, stream);
}

ncclResult_t ncclGroupStart(void)
{
    if (group_depth++ == 0)
        group_ops = new std::vector<p2p_op>();
    return ncclSuccess;
}

/* The group's sends and receives as one command that advances each as far
 * as its peer allows, until all are complete.  Two sends to one peer (or
 * two receives from one) share the pair's mailbox and are matched in the
 * order they were posted, as NCCL matches them: a later one waits until
 * the earlier is complete.  Without that, the peer's ack arriving between
 * the two checks of one pass let the later send fill the slot with its
 * chunk while the earlier one still had chunks to send, and the receiver
 * put it in the wrong buffer (seen under load, in a two-rank ring where
 * left and right are the same peer). */
ncclResult_t ncclGroupEnd(void)
{
    if (group_depth <= 0)
        return ncclInvalidUsage;
    if (--group_depth > 0)
        return ncclSuccess;
    std::shared_ptr<std::vector<p2p_op>> ops(group_ops);
    group_ops = NULL;
    if (ops->empty())
        return ncclSuccess;
    std::lock_guard<emu_mutex> g(emu_lock);
    cudaError_t e = stream_enqueue_polled(ops->front().stream, "ncclGroup", [ops]() {
        bool all = true;
        bool waiting[2][MAX_RANKS] = {}; /* [send][peer]: an earlier op is not done */
        for (p2p_op &op : *ops) {
            if (waiting[op.send][op.peer] || !p2p_step(op)) {
                waiting[op.send][op.peer] = true;
                all = false;
            }
        }
        return all ? POLL_DONE : POLL_WAIT;
    });
    return e ? ncclUnhandledCudaError : ncclSuccess;
}

} /* extern "C" */
