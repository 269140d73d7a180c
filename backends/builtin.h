/* The backends built into baton-worker, by name.  This is how the worker
 * reaches them: through the same ABI a plugin implements
 * (include/baton/backend.h), never through a backend's own headers. */
#ifndef BATON_BACKENDS_BUILTIN_H
#define BATON_BACKENDS_BUILTIN_H

#include "baton/backend.h"

/* The built-in backend called NAME (transformer, whisper, echo, add,
 * counter, chunks, sleep, fail), or NULL. */
const baton_backend *bk_builtin_find(const char *name);

/* Called first thing in main: when OpenBLAS chose its Prescott (SSE3)
 * kernels on a CPU with AVX2 or AVX-512, runs the program again (ARGV,
 * execv of /proc/self/exe) with OPENBLAS_CORETYPE set to Haswell or
 * SkylakeX.  OpenBLAS 0.3.21 (Debian 12's) does not know the newer Xeons
 * and falls back to Prescott, whose sgemm ran at a quarter of SkylakeX's
 * speed here; the core is chosen when the library loads, so only a new
 * start can change it.  Does nothing when OPENBLAS_CORETYPE is set (the
 * user's choice) or OpenBLAS chose another core; returns when exec fails. */
void bk_blas_check_core(char **argv);
/* The core bk_blas_check_core would ask for: "SkylakeX", "Haswell", or
 * NULL when it would leave OpenBLAS's choice alone. */
const char *bk_blas_better_core(void);

/* Makes the communicator id of a tensor-parallel group that the calling
 * process will be rank 0 of (an NCCL unique id: it names a bootstrap
 * endpoint this process serves, so the process must stay in the group):
 * at most *LEN bytes into ID, *LEN set to its length.  Returns 0, or a
 * negative bt_err with the reason in ERR (a build without CUDA or NCCL). */
#define BK_COMM_ID_MAX 128
int bk_comm_unique_id(void *id, size_t *len, char *err, size_t errlen);
/* Joins the tensor-parallel group of P (its comm_id, tp_rank of tp_size) on
 * GPU DEVICE: *COMM once every rank has joined.  While it waits it polls
 * P->cancelled and P->group_ms (baton/backend.h); on either the half-made
 * communicator is aborted, which ends the wait of every other rank too.
 * Returns 0, or a negative bt_err with the reason in ERR: BT_EIO (the
 * worker is stopping, the group did not form in time, or NCCL failed),
 * BT_EINVAL (a build without CUDA). */
int bk_comm_group_join(void **comm, int device, const baton_load_params *p, char *err,
                       size_t errlen);
void bk_comm_group_close(void *comm);
/* Aborts a group's communicator (ncclCommAbort) from any thread: the
 * collectives of every rank end; COMM is gone.  NULL is a no-op. */
void bk_comm_group_abort(void *comm);
/* Nonzero once a group's communicator failed (a rank aborted it, or NCCL
 * lost a connection): what its collectives produced since is undefined. */
int bk_comm_group_failed(void *comm);

/* The two-rank communicators of cross-host GPU transfers (worker/nccl.c),
 * the same NCCL the groups use, reached here so that the worker links no
 * kernel header.  bk_comm_pair_join starts joining the communicator named
 * by ID (LEN bytes) as RANK of 2 on GPU DEVICE and returns at once;
 * bk_comm_pair_ready is 1 once the peer has joined too, 0 before, a
 * negative bt_err when the join failed.  Builds without CUDA return
 * BT_EINVAL with the reason. */
int bk_comm_pair_join(void **comm, int device, const void *id, size_t len, int rank, char *err,
                      size_t errlen);
int bk_comm_pair_ready(void *comm);
/* Frees COMM: destroyed when nothing is pending on it, else aborted (which
 * never waits for the peer).  NULL is a no-op. */
void bk_comm_pair_close(void *comm, int abort);
/* Queues a send (SEND nonzero) or receive of N bytes at BUF with rank
 * PEER_RANK of COMM (the other one) on STREAM.  0, or a negative bt_err
 * with ERR. */
int bk_comm_pair_p2p(void *comm, int send, void *buf, size_t n, int peer_rank, void *stream,
                     char *err, size_t errlen);
/* Nonzero once COMM has failed asynchronously (its peer aborted). */
int bk_comm_pair_failed(void *comm);

#endif
