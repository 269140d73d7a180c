/* CUDA kernel of k_attn_decode (kernels/cpu/attention.c): one query per
 * sequence over a batch of sequences of different lengths, each with its own
 * KV cache.  Two launches: append the step's K/V rows to the caches, then
 * one block per (sequence, query head) computes the scores of its context
 * into shared memory (one thread per key), softmaxes them with block
 * reductions, and accumulates P.V with threads over the head dimension (so
 * V rows are read coalesced).  A flash-style tiled kernel would cut the
 * shared memory bound on context length; at the contexts of this project
 * (a few thousand tokens, 4 bytes each) the scores fit, and this one is
 * simple to check against the reference. */
#include <limits.h>

#include "kernels/cuda/kcuda.cuh"

#define ATT_THREADS 128

/* Where row B's cache starts: from an array of pointers, or at some
 * strides from one base (one allocation for the batch, as an executable's
 * cache handle is; no pointer array to keep on the device): B strides, or
 * SLOTS[B] when the step's rows are not the caches' order. */
typedef struct kv_at {
    float *const *ptrs;   /* device array of BATCH pointers, or NULL */
    float *base;
    size_t stride;        /* floats between sequences */
    const int32_t *slots; /* device array: row b's cache; NULL: cache b */
    int n_cache;          /* caches at BASE (with SLOTS) */
} kv_at;

__device__ __forceinline__ float *seq_cache(kv_at c, int b)
{
    return c.ptrs ? c.ptrs[b] : c.base + (size_t)(c.slots ? c.slots[b] : b) * c.stride;
}

/* A length the cache cannot take (LEN + 1 > CAP), or a row whose slot names
 * no cache, is bad data: the kernels then write no cache row, output zeros,
 * and raise FLAG (when given) for the executor to fail the run.  A negative
 * length is an unused row. */
__device__ __forceinline__ bool len_ok(int len, int cap, kv_at c, int b, int32_t *flag)
{
    if (len < 0)
        return false;
    if (len >= cap || (c.slots && (c.slots[b] < 0 || c.slots[b] >= c.n_cache))) {
        if (flag)
            atomicExch(flag, ERANGE);
        return false;
    }
    return true;
}

/* Caches are [N_KV][CAP][HD] per sequence (kernels.h): element I of the
 * step's row [N_KV][HD] goes to head I / HD, position LEN. */
__global__ static void append_kernel(const float *k, const float *v, kv_at kc, kv_at vc,
                                     const int32_t *lens, int n_kv, int hd, int cap,
                                     int32_t *flag)
{
    int b = blockIdx.x, row = n_kv * hd;
    if (!len_ok(lens[b], cap, kc, b, flag))
        return;
    float *kd = seq_cache(kc, b), *vd = seq_cache(vc, b);
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        size_t at = ((size_t)(i / hd) * cap + (size_t)lens[b]) * hd + (size_t)(i % hd);
        kd[at] = k[(size_t)b * row + i];
        vd[at] = v[(size_t)b * row + i];
    }
}

/* The decode kernel's static shared memory (red[] below), which counts
 * with its dynamic scores against the per-block limits. */
#define DEC_RED 32
#define DEC_STATIC_SMEM (DEC_RED * sizeof(float))

/* O[HD] = softmax(QH . K[j] / sqrt(HD), j < CTX) . V[j] for one query
 * head, keys and values HD floats apart, by the whole block of ATT_THREADS:
 * the CTX scores in S (one thread per key), then [HD] the query; RED the
 * reductions.  The decode kernel and the batch-invariant prefill both call
 * it, so a query gives the same bits in either; its products are explicit
 * fused multiply-adds, so that no compiler choice of contraction can make
 * the two differ. */
__device__ static void attend_all(float *o, const float *qh, const float *kb, const float *vb,
                                  int ctx, int hd, float *s, float *red)
{
    float *qs = s + ctx;
    for (int i = threadIdx.x; i < hd; i += blockDim.x)
        qs[i] = qh[i];
    __syncthreads();
    float scale = rsqrtf((float)hd), m = -INFINITY;
    for (int j = threadIdx.x; j < ctx; j += blockDim.x) {
        const float *kj = kb + (size_t)j * hd;
        float d = 0;
        for (int i = 0; i < hd; i++)
            d = fmaf(qs[i], kj[i], d);
        s[j] = d * scale;
        m = fmaxf(m, s[j]);
    }
    m = k_block_max(m, red);
    float sum = 0;
    for (int j = threadIdx.x; j < ctx; j += blockDim.x) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    float inv = 1.0f / k_block_sum(sum, red); /* also orders the s[] writes before reads */
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float acc = 0;
        for (int j = 0; j < ctx; j++)
            acc = fmaf(s[j], vb[(size_t)j * hd + i], acc);
        o[i] = acc * inv;
    }
}

__global__ static void decode_kernel(float *out, const float *q, kv_at kc, kv_at vc,
                                     const int32_t *lens, int n_head, int n_kv, int hd, int cap)
{
    extern __shared__ float s[]; /* [ctx] scores, then [hd] the query */
    __shared__ float red[DEC_RED];
    int b = blockIdx.x / n_head, h = blockIdx.x % n_head;
    float *o = out + ((size_t)b * n_head + h) * hd;
    if (!len_ok(lens[b], cap, kc, b, NULL)) {
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            o[i] = 0;
        return;
    }
    const float *kb = seq_cache(kc, b) + (size_t)(h / (n_head / n_kv)) * cap * hd;
    const float *vb = seq_cache(vc, b) + (size_t)(h / (n_head / n_kv)) * cap * hd;
    attend_all(o, q + ((size_t)b * n_head + h) * hd, kb, vb, lens[b] + 1, hd, s, red);
}

/* Lets a block of KERNEL (the decode kernel, or the batch-invariant
 * prefill: both hold a context's scores) have SHMEM bytes of dynamic shared
 * memory: 0, or -EINVAL when the device has not that much. */
static int attend_all_smem(bool prefill, size_t shmem);

static int decode_launch(float *out, const float *q, const float *k, const float *v, kv_at kc,
                         kv_at vc, const int32_t *lens, int batch, int n_head, int n_kv, int hd,
                         int max_ctx, int32_t *flag, void *stream)
{
    if (batch < 0 || n_kv <= 0 || n_head <= 0 || n_head % n_kv || hd <= 0 || max_ctx <= 0 ||
        (long long)batch * n_head > INT_MAX)
        return -EINVAL;
    if (!batch)
        return 0;
    size_t shmem = ((size_t)max_ctx + hd) * sizeof(float);
    int rc = attend_all_smem(false, shmem);
    if (rc)
        return rc; /* context too long for this kernel */
    append_kernel<<<batch, ATT_THREADS, 0, K_STREAM(stream)>>>(k, v, kc, vc, lens, n_kv, hd,
                                                               max_ctx, flag);
    K_CUDA_LAUNCHED();
    decode_kernel<<<batch * n_head, ATT_THREADS, shmem, K_STREAM(stream)>>>(
        out, q, kc, vc, lens, n_head, n_kv, hd, max_ctx);
    K_CUDA_LAUNCHED();
    return 0;
}

extern "C" int k_cuda_attn_decode(float *out, const float *q, const float *k, const float *v,
                                  float *const *kc, float *const *vc, const int32_t *lens,
                                  int batch, int n_head, int n_kv, int hd, int max_ctx,
                                  void *stream)
{
    kv_at kca = {kc, NULL, 0, NULL, 0}, vca = {vc, NULL, 0, NULL, 0};
    return decode_launch(out, q, k, v, kca, vca, lens, batch, n_head, n_kv, hd, max_ctx, NULL,
                         stream);
}

extern "C" int k_cuda_attn_decode_strided(float *out, const float *q, const float *k,
                                          const float *v, float *kc, float *vc, size_t stride,
                                          const int32_t *lens, const int32_t *slots, int n_cache,
                                          int batch, int n_head, int n_kv, int hd, int cap,
                                          int32_t *flag, void *stream)
{
    kv_at kca = {NULL, kc, stride, slots, n_cache}, vca = {NULL, vc, stride, slots, n_cache};
    return decode_launch(out, q, k, v, kca, vca, lens, batch, n_head, n_kv, hd, cap, flag, stream);
}

/* CUDA kernel of k_attn_prefill: N_TOK new tokens of one sequence.  Two
 * launches again: copy the tokens' K/V rows into the caches at POS0, then
 * one block per (token, query head) walks its context in tiles of
 * PRE_THREADS keys with an online softmax (flash attention's running max M,
 * running sum L, and an accumulator over the head dimension rescaled by
 * exp(m_old - m_new) whenever the max grows).  Only one tile of scores is
 * ever held in shared memory, so unlike the decode kernel the context length
 * has no shared-memory bound.  Within a tile the work is split as in the
 * decode kernel: one thread per key for the scores, threads over the head
 * dimension for P.V so that V rows are read coalesced. */

#define PRE_THREADS 128 /* threads per block, and keys per tile */
#define PRE_MAX_HD 256
#define PRE_ACC (PRE_MAX_HD / PRE_THREADS) /* accumulators per thread */

/* The first position: POS0, or POS[0] read on the device (a captured graph
 * cannot bake in a host value that changes per run). */
__device__ __forceinline__ int first_pos(int pos0, const int32_t *pos)
{
    return pos ? pos[0] : pos0;
}

/* The N floats of K and V (N_TOK rows of [N_KV][HD]) to KC and VC
 * ([N_KV][CAP][HD]) from position POS0. */
__global__ static void prefill_append_kernel(const float *k, const float *v, float *kc, float *vc,
                                             size_t n, int pos0, const int32_t *pos, int n_tok,
                                             int cap, int n_kv, int hd, int32_t *flag)
{
    int p0 = first_pos(pos0, pos);
    if (p0 < 0 || p0 > cap - n_tok) {
        if (flag && blockIdx.x == 0 && threadIdx.x == 0)
            atomicExch(flag, ERANGE);
        return;
    }
    size_t stride = (size_t)gridDim.x * blockDim.x, row = (size_t)n_kv * hd;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        size_t t = i / row, g = i % row / hd, d = i % hd;
        size_t at = (g * cap + (size_t)p0 + t) * hd + d;
        kc[at] = k[i];
        vc[at] = v[i];
    }
}

/* OUT[HD] = softmax(QH . K[j] / sqrt(HD), j < CTX) . V[j] for one query
 * head, keys and values ROW floats apart, computed by the whole block in
 * tiles of PRE_THREADS keys with an online softmax; S, QS and RED are the
 * block's shared memory (a tile, the query, the reductions). */
__device__ static void attend_tiles(float *o, const float *qh, const float *kb, const float *vb,
                                    size_t row, int ctx, int hd, float *s, float *qs, float *red)
{
    int tid = (int)threadIdx.x;
    for (int i = tid; i < hd; i += PRE_THREADS)
        qs[i] = qh[i];
    __syncthreads();
    /* 1/sqrtf rather than rsqrtf: the same scale as the reference. */
    float scale = 1.0f / sqrtf((float)hd), m = -INFINITY, l = 0;
    float acc[PRE_ACC];
#pragma unroll
    for (int a = 0; a < PRE_ACC; a++)
        acc[a] = 0;
    for (int j0 = 0; j0 < ctx; j0 += PRE_THREADS) {
        int n = min(PRE_THREADS, ctx - j0); /* at least 1, since j0 < ctx */
        /* A key past the context scores -inf, so its weight below is 0. */
        float d = -INFINITY;
        if (tid < n) {
            const float *kj = kb + (size_t)(j0 + tid) * row;
            d = 0;
            for (int i = 0; i < hd; i++)
                d += qs[i] * kj[i];
            d *= scale;
        }
        /* The tile holds at least one real key, so the new max is finite;
         * on the first tile alpha = exp(-inf) = 0 scales the zero
         * accumulators, and later it rescales them to the new max. */
        float mn = fmaxf(m, k_block_max(d, red));
        float alpha = expf(m - mn), p = expf(d - mn);
        s[tid] = p;
        l = l * alpha + k_block_sum(p, red); /* also orders the s[] writes before reads */
        m = mn;
#pragma unroll
        for (int a = 0; a < PRE_ACC; a++) {
            int i = tid + a * PRE_THREADS;
            if (i < hd) {
                const float *vi = vb + (size_t)j0 * row + i;
                float sum = 0;
                for (int j = 0; j < n; j++)
                    sum += s[j] * vi[(size_t)j * row];
                acc[a] = acc[a] * alpha + sum;
            }
        }
        __syncthreads(); /* every read of s[] done before the next tile writes it */
    }
    float inv = 1.0f / l;
#pragma unroll
    for (int a = 0; a < PRE_ACC; a++) {
        int i = tid + a * PRE_THREADS;
        if (i < hd)
            o[i] = acc[a] * inv;
    }
}

__global__ static void prefill_kernel(float *out, const float *q, const float *kc,
                                      const float *vc, int pos0, const int32_t *pos, int cap,
                                      int n_tok, int n_head, int n_kv, int hd)
{
    pos0 = first_pos(pos0, pos);
    if (pos0 < 0 || pos0 > cap - n_tok) {
        /* Bad data (flagged by the append): zeros, not reads past the cache. */
        int t = n_tok - 1 - (int)blockIdx.x / n_head, h = (int)blockIdx.x % n_head;
        for (int i = (int)threadIdx.x; i < hd; i += PRE_THREADS)
            out[((size_t)t * n_head + h) * hd + i] = 0;
        return;
    }
    __shared__ float s[PRE_THREADS]; /* one tile's softmax weights */
    __shared__ float qs[PRE_MAX_HD];
    __shared__ float red[32];
    int bid = (int)blockIdx.x;
    /* Block 0 takes the last token: the blocks with the longest contexts are
     * scheduled first, so the grid does not end on a tail of long blocks. */
    int t = n_tok - 1 - bid / n_head, h = bid % n_head;
    const float *kb = kc + (size_t)(h / (n_head / n_kv)) * cap * hd;
    const float *vb = vc + (size_t)(h / (n_head / n_kv)) * cap * hd;
    attend_tiles(out + ((size_t)t * n_head + h) * hd, q + ((size_t)t * n_head + h) * hd, kb, vb,
                 (size_t)hd, pos0 + t + 1, hd, s, qs, red);
}

/* The batch-invariant prefill: one block per (token, query head), each
 * query attended by attend_all over its context as a decode step at its
 * position would, so a token gives the same bits in a prefill of any
 * chunking and in a decode step.  Block 0 takes the last token, as in
 * prefill_kernel. */
__global__ static void prefill_inv_kernel(float *out, const float *q, const float *kc,
                                          const float *vc, int pos0, const int32_t *pos, int cap,
                                          int n_tok, int n_head, int n_kv, int hd)
{
    extern __shared__ float s[]; /* [ctx] scores, then [hd] the query */
    __shared__ float red[DEC_RED];
    int t = n_tok - 1 - (int)blockIdx.x / n_head, h = (int)blockIdx.x % n_head;
    float *o = out + ((size_t)t * n_head + h) * hd;
    pos0 = first_pos(pos0, pos);
    if (pos0 < 0 || pos0 > cap - n_tok) {
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            o[i] = 0;
        return;
    }
    const float *kb = kc + (size_t)(h / (n_head / n_kv)) * cap * hd;
    const float *vb = vc + (size_t)(h / (n_head / n_kv)) * cap * hd;
    attend_all(o, q + ((size_t)t * n_head + h) * hd, kb, vb, pos0 + t + 1, hd, s, red);
}

static int attend_all_smem(bool prefill, size_t shmem)
{
    /* Static and dynamic shared memory share the limits: 48 KiB without
     * the opt-in, the device's opt-in maximum with it. */
    if (shmem + DEC_STATIC_SMEM <= 48 * 1024)
        return 0;
    int dev, maxopt;
    K_CUDA_CHECK(cudaGetDevice(&dev));
    K_CUDA_CHECK(cudaDeviceGetAttribute(&maxopt, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (shmem + DEC_STATIC_SMEM > (size_t)maxopt)
        return -EINVAL;
    if (prefill)
        K_CUDA_CHECK(cudaFuncSetAttribute(prefill_inv_kernel,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem));
    else
        K_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shmem));
    return 0;
}

static int prefill_launch(float *out, const float *q, const float *k, const float *v, float *kc,
                          float *vc, int pos0, const int32_t *pos, int cap, int32_t *flag,
                          int n_tok, int n_head, int n_kv, int hd, bool inv, void *stream)
{
    if (n_kv <= 0 || n_head <= 0 || n_head % n_kv || hd <= 0 || hd > PRE_MAX_HD || pos0 < 0 ||
        n_tok < 0 || cap < 0)
        return -EINVAL;
    /* The grid is one-dimensional and positions are ints in the kernel. */
    if ((long long)n_tok * n_head > INT_MAX || pos0 > INT_MAX - n_tok)
        return -EINVAL;
    if (!n_tok)
        return 0;
    size_t row = (size_t)n_kv * hd, n = (size_t)n_tok * row;
    prefill_append_kernel<<<k_grid(n, ATT_THREADS), ATT_THREADS, 0, K_STREAM(stream)>>>(
        k, v, kc, vc, n, pos0, pos, n_tok, cap, n_kv, hd, flag);
    K_CUDA_LAUNCHED();
    if (inv) {
        /* The scores of the longest context the cache holds. */
        size_t shmem = ((size_t)cap + hd) * sizeof(float);
        int rc = attend_all_smem(true, shmem);
        if (rc)
            return rc;
        prefill_inv_kernel<<<n_tok * n_head, ATT_THREADS, shmem, K_STREAM(stream)>>>(
            out, q, kc, vc, pos0, pos, cap, n_tok, n_head, n_kv, hd);
    } else {
        prefill_kernel<<<n_tok * n_head, PRE_THREADS, 0, K_STREAM(stream)>>>(
            out, q, kc, vc, pos0, pos, cap, n_tok, n_head, n_kv, hd);
    }
    K_CUDA_LAUNCHED();
    return 0;
}

extern "C" int k_cuda_attn_prefill(float *out, const float *q, const float *k, const float *v,
                                   float *kc, float *vc, int cap, int pos0, int n_tok, int n_head,
                                   int n_kv, int hd, void *stream)
{
    if (pos0 > cap - n_tok)
        return -EINVAL;
    return prefill_launch(out, q, k, v, kc, vc, pos0, NULL, cap, NULL, n_tok, n_head, n_kv, hd,
                          false, stream);
}

extern "C" int k_cuda_attn_prefill_at(float *out, const float *q, const float *k, const float *v,
                                      float *kc, float *vc, const int32_t *pos, int cap,
                                      int32_t *flag, int n_tok, int n_head, int n_kv, int hd,
                                      int invariant, void *stream)
{
    return prefill_launch(out, q, k, v, kc, vc, 0, pos, cap, flag, n_tok, n_head, n_kv, hd,
                          invariant != 0, stream);
}

/* k_attn_full: one block per (sequence, query, head), over all S keys of
 * its sequence (rows N_HEAD * HD floats apart, as a matrix product writes
 * them). */
__global__ static void full_kernel(float *out, const float *q, const float *k, const float *v,
                                   int t, int s_len, int n_head, int hd)
{
    __shared__ float s[PRE_THREADS];
    __shared__ float qs[PRE_MAX_HD];
    __shared__ float red[32];
    int bid = (int)blockIdx.x, h = bid % n_head, i = bid / n_head % t, b = bid / n_head / t;
    size_t row = (size_t)n_head * hd;
    size_t qo = ((size_t)b * t + i) * row + (size_t)h * hd, ko = (size_t)b * s_len * row + (size_t)h * hd;
    attend_tiles(out + qo, q + qo, k + ko, v + ko, row, s_len, hd, s, qs, red);
}

extern "C" int k_cuda_attn_full(float *out, const float *q, const float *k, const float *v, int nb,
                                int t, int s, int n_head, int hd, void *stream)
{
    if (nb < 0 || t < 0 || s <= 0 || n_head <= 0 || hd <= 0 || hd > PRE_MAX_HD ||
        (long long)nb * t * n_head > INT_MAX)
        return -EINVAL;
    if (!nb || !t)
        return 0;
    full_kernel<<<nb * t * n_head, PRE_THREADS, 0, K_STREAM(stream)>>>(out, q, k, v, t, s, n_head,
                                                                       hd);
    K_CUDA_LAUNCHED();
    return 0;
}
