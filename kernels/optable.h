/* Op tables: the kernels of kernels/kernels.h behind the kx_op_fn interface
 * of executable graphs (kernels/exec.h), one table per device.
 *
 * Each entry reads its shapes from the graph's values (at the run's actual
 * extent where the outermost dim is dynamic) and its parameters from the
 * op's attributes, as listed in kernels/ops.h, and checks what the world can
 * get wrong at run time (a position past the KV cache, a token id outside
 * the vocabulary) rather than trusting it: an op returns a negative errno
 * and the run fails with BT_EOP instead of writing out of bounds. */
#ifndef BATON_KERNELS_OPTABLE_H
#define BATON_KERNELS_OPTABLE_H

#include "kernels/exec.h"

/* How the CPU table runs, pointed at by kx_op_table.user (which must then
 * outlive the executables); a NULL user means one thread and f32
 * activations. */
typedef struct kt_cpu_opts {
    struct kth_pool *pool;  /* threads the heavy ops share (kernels/cpu/threads.h),
                               or NULL: each op on its stream's thread; not owned */
    int act_q8;             /* quantized products quantize their activations to
                               8 bits (k_qmatmul_mt); 0: f32 activations */
    int invariant;          /* batch invariance: every row of a product and every
                               query of attention computed the same way whatever
                               the rows beside it (k_attn_*_inv_mt, no sgemm of
                               widened weights); 0: the fastest path per shape */
} kt_cpu_opts;

/* Fills T with the CPU kernels: the OpenBLAS matmul, the integer and AVX2
 * quantized products where the CPU has them, the plain references for the
 * rest.  T's user is NULL: set it to a kt_cpu_opts to use threads or 8-bit
 * activations. */
void kt_cpu_ops(kx_op_table *t);

/* Checks, before compiling, that every op of G has operands the CPU table
 * accepts (counts, dtypes, shapes, attributes).  Returns 0, or BT_EINVAL
 * with a message naming the op in ERR. */
int kt_cpu_check(const kg_graph *g, char *err, size_t errlen);

/* How the CUDA table runs, pointed at by kx_op_table.user (which must then
 * outlive the executables); a NULL user means one rank and the fastest
 * kernels per shape. */
typedef struct kt_cuda_opts {
    void *comm;             /* the group's communicator for ALLREDUCE over ranks
                               (k_cuda_comm_init_rank); NULL on one rank; not owned */
    int invariant;          /* batch invariance: f32 products a row at a time in one
                               fixed order (k_cuda_matmul_rows, not cuBLAS) and each
                               prefill query attended as a decode step would be; the
                               quantized products and the decode kernel are per row
                               already.  0: the fastest path per shape */
} kt_cuda_opts;

/* Fills T with the CUDA launchers (for an executable on kx_device_cuda);
 * -ENOSYS, T empty, in a build without CUDA.  Every op launches on the
 * stream the executor hands it (kx_op_ctx.queue) and never synchronizes,
 * so a run can be captured as a CUDA graph; positions and lengths are read
 * on the device, where a bad one raises the run's flag (kx_op_ctx.flag). */
int kt_cuda_ops(kx_op_table *t);
int kt_cuda_check(const kg_graph *g, char *err, size_t errlen);

#endif
