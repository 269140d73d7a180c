/* CUDA kernel of k_matmul_rows_ref (kernels/cpu/matmul.c): Y[M, N] =
 * A[M, K] W[N, K]^T in f32 with every output computed in one fixed order,
 * whatever M and wherever its row lies among the M: lane l of a warp sums
 * the products of columns l, l + 32, ... with fused multiply-adds, in that
 * order, and the warp's butterfly adds the 32 partial sums.  This is the
 * product of the batch-invariant mode (option batch_invariant): cuBLAS
 * picks its algorithm, and with it the order of each sum, by the shape, so
 * a row multiplied alone and the same row among fifteen others round
 * differently.
 *
 * One warp per output column (a row of W, read once per MR_ROWS rows of
 * A, coalesced: the 32 lanes read 32 consecutive floats), eight warps per
 * block; a warp carries MR_ROWS rows of A at once in registers.  A row's
 * arithmetic does not depend on which of the MR_ROWS it is, nor on how many
 * there are: each accumulator sees the same sequence of fmaf. */
#include "kernels/cuda/kcuda.cuh"

#define MR_ROWS 8  /* rows of A a warp carries at once */
#define MR_WARPS 8 /* warps per block, one output column each */

__global__ static void matmul_rows_kernel(float *y, const float *a, const float *w, int m, int n,
                                          int k)
{
    int col = (int)blockIdx.x * MR_WARPS + (int)(threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (col >= n) /* the whole warp: its shuffles below stay full */
        return;
    const float *wr = w + (size_t)col * k;
    for (int r0 = 0; r0 < m; r0 += MR_ROWS) {
        int nr = min(MR_ROWS, m - r0);
        float acc[MR_ROWS];
#pragma unroll
        for (int r = 0; r < MR_ROWS; r++)
            acc[r] = 0;
        for (int i = lane; i < k; i += 32) {
            float wi = __ldg(wr + i);
#pragma unroll
            for (int r = 0; r < MR_ROWS; r++)
                if (r < nr)
                    acc[r] = fmaf(wi, a[(size_t)(r0 + r) * k + i], acc[r]);
        }
#pragma unroll
        for (int r = 0; r < MR_ROWS; r++) {
            float v = k_warp_sum(acc[r]);
            if (lane == 0 && r < nr)
                y[(size_t)(r0 + r) * n + col] = v;
        }
    }
}

extern "C" int k_cuda_matmul_rows(float *y, const float *a, const float *w, int m, int n, int k,
                                  void *stream)
{
    if (m < 0 || n < 0 || k < 0)
        return -EINVAL;
    if (!m || !n)
        return 0;
    unsigned grid = (unsigned)((n + MR_WARPS - 1) / MR_WARPS);
    matmul_rows_kernel<<<grid, MR_WARPS * 32, 0, K_STREAM(stream)>>>(y, a, w, m, n, k);
    K_CUDA_LAUNCHED();
    return 0;
}
