/* The table of built-in backends: each folder under backends/ exports its
 * baton_backend, and this file is the only place that names them all. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "backends/builtin.h"
#include "backends/testing/testing.h"
#include "backends/transformer/transformer.h"
#include "backends/whisper/whisper.h"
#include "common/clock.h"
#include "common/status.h"
#include "kernels/kernels.h"

const baton_backend *bk_builtin_find(const char *name)
{
    if (!name)
        return NULL;
    const baton_backend *b = bk_testing_backend(name);
    if (b)
        return b;
    const baton_backend *const own[] = {bk_transformer_backend(), bk_whisper_backend()};
    for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
        if (strcmp(own[i]->name, name) == 0)
            return own[i];
    return NULL;
}

char *openblas_get_corename(void);

const char *bk_blas_better_core(void)
{
    if (getenv("OPENBLAS_CORETYPE") || getenv("BATON_BLAS_CORE_SET"))
        return NULL;
    const char *core = openblas_get_corename();
    if (!core || strcasecmp(core, "Prescott") != 0)
        return NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512cd"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
    return NULL;
}

void bk_blas_check_core(char **argv)
{
    const char *want = bk_blas_better_core();
    if (!want)
        return;
    /* The marker keeps a second start from trying again, whatever the
     * library chooses then. */
    if (setenv("OPENBLAS_CORETYPE", want, 1) != 0 || setenv("BATON_BLAS_CORE_SET", want, 1) != 0)
        return;
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE");
}

int bk_comm_unique_id(void *id, size_t *len, char *err, size_t errlen)
{
#ifdef BATON_CUDA
    if (*len < K_CUDA_COMM_ID_BYTES) {
        snprintf(err, errlen, "a communicator id needs %d bytes", K_CUDA_COMM_ID_BYTES);
        return BT_EINVAL;
    }
    int rc = k_cuda_comm_unique_id(id, *len);
    if (rc) {
        snprintf(err, errlen, "cannot make a communicator id: %s", bt_strerror(rc));
        return rc;
    }
    *len = K_CUDA_COMM_ID_BYTES;
    return 0;
#else
    (void)id, (void)len;
    snprintf(err, errlen, "this baton-worker was built without CUDA, and tensor parallelism "
             "runs over NCCL");
    return BT_EINVAL;
#endif
}

int bk_comm_group_join(void **comm, int device, const baton_load_params *p, char *err,
                       size_t errlen)
{
    *comm = NULL;
#ifdef BATON_CUDA
    int rc = k_cuda_comm_join(comm, device, p->comm_id, p->comm_id_len, (int)p->tp_size,
                              (int)p->tp_rank);
    if (rc) {
        snprintf(err, errlen, "joining the tensor-parallel group as rank %u of %u: %s",
                 p->tp_rank, p->tp_size, bt_strerror(rc));
        return rc;
    }
    /* Polled, not blocking in ncclCommInitRank: a rank that never comes
     * (its load failed, its worker died) must not keep this one waiting
     * until it is killed, and an abort here ends the others' wait too. */
    uint64_t t0 = bt_now_ms();
    const char *why = NULL;
    while ((rc = k_cuda_comm_ready(*comm)) == 0) {
        if (p->cancelled && p->cancelled(p->cancel_arg)) {
            why = "the worker is stopping";
            break;
        }
        if (p->group_ms && bt_now_ms() - t0 >= p->group_ms) {
            why = "not every rank joined in time";
            break;
        }
        struct timespec ts = {0, 1000000}; /* 1 ms */
        nanosleep(&ts, NULL);
    }
    if (rc == 1)
        return 0;
    k_cuda_comm_abort(*comm);
    *comm = NULL;
    if (why)
        snprintf(err, errlen, "the tensor-parallel group did not form (rank %u of %u, after %llu "
                 "ms): %s", p->tp_rank, p->tp_size, (unsigned long long)(bt_now_ms() - t0), why);
    else
        snprintf(err, errlen, "joining the tensor-parallel group as rank %u of %u: NCCL failed "
                 "(a rank aborted, or its connection closed)", p->tp_rank, p->tp_size);
    return BT_EIO;
#else
    (void)device, (void)p;
    snprintf(err, errlen, "this baton-worker was built without CUDA, and tensor parallelism "
             "runs over NCCL");
    return BT_EINVAL;
#endif
}

void bk_comm_group_abort(void *comm)
{
#ifdef BATON_CUDA
    if (comm)
        k_cuda_comm_abort(comm);
#else
    (void)comm;
#endif
}

int bk_comm_group_failed(void *comm)
{
#ifdef BATON_CUDA
    return comm && k_cuda_comm_failed(comm);
#else
    (void)comm;
    return 0;
#endif
}

void bk_comm_group_close(void *comm)
{
#ifdef BATON_CUDA
    k_cuda_comm_destroy(comm);
#else
    (void)comm;
#endif
}

int bk_comm_pair_join(void **comm, int device, const void *id, size_t len, int rank, char *err,
                      size_t errlen)
{
    *comm = NULL;
#ifdef BATON_CUDA
    int rc = k_cuda_comm_join(comm, device, id, len, 2, rank);
    if (rc) {
        snprintf(err, errlen, "cannot join the pair communicator as rank %d: %s", rank,
                 bt_strerror(rc));
        return rc;
    }
    return 0;
#else
    (void)device, (void)id, (void)len, (void)rank;
    snprintf(err, errlen, "this baton-worker was built without CUDA, and GPU transfers between "
             "hosts run over NCCL");
    return BT_EINVAL;
#endif
}

void bk_comm_pair_close(void *comm, int abort)
{
#ifdef BATON_CUDA
    if (abort)
        k_cuda_comm_abort(comm);
    else
        k_cuda_comm_destroy(comm);
#else
    (void)comm, (void)abort;
#endif
}

int bk_comm_pair_p2p(void *comm, int send, void *buf, size_t n, int peer_rank, void *stream,
                     char *err, size_t errlen)
{
#ifdef BATON_CUDA
    int rc = k_cuda_comm_p2p(comm, send, buf, n, peer_rank, stream);
    if (rc == 0)
        return 0;
    snprintf(err, errlen, "nccl%s of %zu bytes: %s", send ? "Send" : "Recv", n, bt_strerror(rc));
    return rc;
#else
    (void)comm, (void)send, (void)buf, (void)n, (void)peer_rank, (void)stream;
    snprintf(err, errlen, "this baton-worker was built without CUDA");
    return BT_EINVAL;
#endif
}

int bk_comm_pair_ready(void *comm)
{
#ifdef BATON_CUDA
    return k_cuda_comm_ready(comm);
#else
    (void)comm;
    return BT_EINVAL;
#endif
}

int bk_comm_pair_failed(void *comm)
{
#ifdef BATON_CUDA
    return k_cuda_comm_failed(comm);
#else
    (void)comm;
    return 1;
#endif
}
