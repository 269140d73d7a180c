/* The op tables (kernels/optable.h).  Every op is one function that first
 * checks its operands against kernels/ops.h and then, when HOW has RUN,
 * computes on the CPU or, with CUDA, launches on the op's stream.
 * kt_*_check call the same functions without RUN, so the checks at load and
 * at run cannot drift apart, and an op the GPU lacks in some form (a sampler
 * with per-row parameters, a quantized embedding table) is refused at load
 * rather than at the first request. */
#include "kernels/optable.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/threads.h"
#include "kernels/kernels.h"

/* What an op function is asked to do. */
enum { RUN = 1, CUDA = 2 };

/* ---- operand access ------------------------------------------------------- */

static const kg_value *in_val(const kx_op_ctx *c, int k)
{
    return &c->g->values[c->op->in[k]];
}

static const kg_value *out_val(const kx_op_ctx *c, int k)
{
    return &c->g->values[c->op->out[k]];
}

/* Elements of dim D of V this run (the outermost of a dynamic value is the
 * extent). */
static int64_t dim_now(const kx_op_ctx *c, const kg_value *v, int d)
{
    if (d == 0 && v->dynamic && c->upper)
        return c->extent;
    return v->shape[d];
}

/* The innermost dim; for a one-dim value it is also the outermost one, so
 * the extent applies. */
static int64_t last_dim_now(const kx_op_ctx *c, const kg_value *v)
{
    return v->ndim ? dim_now(c, v, v->ndim - 1) : 1;
}

/* Product of all dims but the last, this run. */
static int64_t rows_now(const kx_op_ctx *c, const kg_value *v)
{
    int64_t r = 1;
    for (int d = 0; d + 1 < v->ndim; d++)
        r *= dim_now(c, v, d);
    return r;
}

static int64_t elems_now(const kx_op_ctx *c, const kg_value *v)
{
    return rows_now(c, v) * last_dim_now(c, v);
}

static bool is_block(kdtype t)
{
    return t == KD_Q8_0 || t == KD_Q4_0 || t == KD_Q4_1;
}

static bool is_float(kdtype t)
{
    return t == KD_F32 || t == KD_F16 || t == KD_BF16;
}

#define NEED(cond)                                                                            \
    do {                                                                                      \
        if (!(cond))                                                                          \
            return -EINVAL;                                                                   \
    } while (0)

static int io(const kx_op_ctx *c, int min_in, int max_in, int n_out)
{
    NEED(c->op->n_in >= min_in && c->op->n_in <= max_in && c->op->n_out == n_out);
    return 0;
}

/* Row BYTES of a [rows, k] matrix of T. */
static size_t row_bytes(kdtype t, int64_t k)
{
    return kdtype_bytes(t, (size_t)k);
}


/* On the GPU: the k_cuda_* launchers exist only in CUDA builds; without them
 * a CUDA table is never made (kt_cuda_ops), so these branches are dead. */
#ifdef BATON_CUDA
#define ON_GPU(how, call)                                                                     \
    do {                                                                                      \
        if ((how) & CUDA)                                                                     \
            return (call);                                                                    \
    } while (0)
#else
#define ON_GPU(how, call)                                                                     \
    do {                                                                                      \
        if ((how) & CUDA)                                                                     \
            return -ENOSYS;                                                                   \
    } while (0)
#endif

/* ---- ops ------------------------------------------------------------------ */

static int op_embed(const kx_op_ctx *c, int how)
{
    int rc = io(c, 2, 2, 1);
    if (rc)
        return rc;
    const kg_value *tab = in_val(c, 0), *ids = in_val(c, 1), *out = out_val(c, 0);
    NEED(tab->ndim == 2 && (is_float(tab->dtype) || is_block(tab->dtype)));
    NEED(ids->dtype == KD_I32 && out->dtype == KD_F32 && last_dim_now(c, out) == tab->shape[1]);
    NEED(!is_block(tab->dtype) || tab->shape[1] % 32 == 0);
    NEED(!(how & CUDA) || tab->dtype == KD_F32);  /* widen a table once at load for the GPU */
    int64_t n = elems_now(c, ids), d = tab->shape[1], vocab = dim_now(c, tab, 0);
    NEED(rows_now(c, out) == n);
    if (!(how & RUN))
        return 0;
    ON_GPU(how, k_cuda_embed(c->out[0], c->in[0], (int)vocab, (int)d, c->in[1], (int)n, c->queue));
    const int32_t *id = c->in[1];
    float *o = c->out[0];
    if (tab->dtype == KD_F32) {
        k_embed(o, c->in[0], (int)vocab, (int)d, id, (int)n);
        return 0;
    }
    size_t rb = row_bytes(tab->dtype, d);
    for (int64_t i = 0; i < n; i++) {
        float *row = o + i * d;
        if (id[i] < 0 || id[i] >= vocab) {
            memset(row, 0, (size_t)d * sizeof(float));
            continue;
        }
        if ((rc = k_widen(row, tab->dtype, (const uint8_t *)c->in[0] + rb * (size_t)id[i], (size_t)d)))
            return rc;
    }
    return 0;
}

/* Up to this many rows, a product with quantized weights and f32
 * activations dequantizes the blocks on the fly (k_qmatmul: one pass over
 * the weights per 8 rows); beyond, the weights are widened to f32 once and
 * sgemm takes them.  The crossover was measured with tests/bench/bench_ops
 * (qmatmul rows).  With 8-bit activations every product takes the integer
 * path, which beats sgemm at any row count. */
#define QMATMUL_MAX_ROWS 16

static const kt_cpu_opts NO_OPTS = {NULL, 0, 0};

static const kt_cpu_opts *cpu_opts(const kx_op_ctx *c)
{
    return c->user ? (const kt_cpu_opts *)c->user : &NO_OPTS;
}

#ifdef BATON_CUDA
static const kt_cuda_opts NO_CUDA_OPTS = {NULL, 0};

static const kt_cuda_opts *cuda_opts(const kx_op_ctx *c)
{
    return c->user ? (const kt_cuda_opts *)c->user : &NO_CUDA_OPTS;
}
#endif

/* Y[M, N] = A[M, K] W[N, K]^T for a W of any weight type, or packed bf16
 * (PACKED). */
static int matmul_any(const kt_cpu_opts *o, float *y, const float *a, const void *w, kdtype wt,
                      bool packed, int64_t m, int64_t n, int64_t k)
{
    if (packed)
        return k_matmul_bf16_packed(o->pool, y, a, w, (int)m, (int)n, (int)k);
    if (wt == KD_F32) {
        /* Invariant: a row at a time, so OpenBLAS takes the same path for
         * every row whatever their number. */
        for (int64_t r = 0; o->invariant && r < m; r++)
            k_matmul(y + r * n, a + r * k, w, 1, 1, (int)n, (int)k, 0, 0, 0);
        if (!o->invariant)
            k_matmul(y, a, w, 1, (int)m, (int)n, (int)k, 0, 0, 0);
        return 0;
    }
    if (wt == KD_BF16 && k_matmul_bf16_native() && !o->invariant)
        return k_matmul_bf16(o->pool, y, a, w, (int)m, (int)n, (int)k);
    /* The quantized product takes each (row, weight row) alone, in block
     * order: the same bits for any number of rows. */
    if (is_block(wt) && (o->act_q8 || o->invariant || m <= QMATMUL_MAX_ROWS))
        return k_qmatmul_mt(o->pool, y, w, wt, a, (int)m, (int)n, (int)k,
                            (o->act_q8 ? K_QMM_Q8 : 0) | (o->invariant ? K_QMM_INVARIANT : 0));
    /* Many rows (prefill): widen the weights once and use sgemm. */
    float *wf = malloc((size_t)n * (size_t)k * sizeof(float));
    if (!wf)
        return -ENOMEM;
    int rc = k_widen(wf, wt, w, (size_t)n * (size_t)k);
    /* Invariant: a row at a time, as for f32 weights. */
    for (int64_t r = 0; !rc && o->invariant && r < m; r++)
        k_matmul(y + r * n, a + r * k, wf, 1, 1, (int)n, (int)k, 0, 0, 0);
    if (!rc && !o->invariant)
        k_matmul(y, a, wf, 1, (int)m, (int)n, (int)k, 0, 0, 0);
    free(wf);
    return rc;
}

static int op_matmul(const kx_op_ctx *c, int how)
{
    int rc = io(c, 2, 2, 1);
    if (rc)
        return rc;
    const kg_value *a = in_val(c, 0), *w = in_val(c, 1), *y = out_val(c, 0);
    NEED(a->dtype == KD_F32 && y->dtype == KD_F32 && w->ndim == 2);
    NEED(is_float(w->dtype) || is_block(w->dtype));
    int64_t m = rows_now(c, a), k = last_dim_now(c, a), n = w->shape[0];
    NEED(w->shape[1] == k && rows_now(c, y) == m && last_dim_now(c, y) == n);
    NEED(!is_block(w->dtype) || k % 32 == 0);
    NEED(!(how & CUDA) || w->dtype == KD_F32 || is_block(w->dtype));
    NEED(c->op->op != KOP_MATMUL_ALLREDUCE || c->op->n_attr == 0 || c->op->attr[0] == 1);
    bool packed = c->op->op == KOP_MATMUL && c->op->n_attr && c->op->attr[0] == K_MM_PACKED;
    NEED(c->op->op != KOP_MATMUL || c->op->n_attr == 0 || c->op->attr[0] == K_MM_PLAIN || packed);
    NEED(!packed || (w->dtype == KD_BF16 && !(how & CUDA)));
    if (!(how & RUN))
        return 0;
#ifdef BATON_CUDA
    if (how & CUDA) {
        /* cuBLAS picks its algorithm by the shape; the invariant mode
         * sums every row in one order, whatever the rows beside it. */
        if (w->dtype == KD_F32 && cuda_opts(c)->invariant)
            return k_cuda_matmul_rows(c->out[0], c->in[0], c->in[1], (int)m, (int)n, (int)k,
                                      c->queue);
        if (w->dtype == KD_F32)
            return k_cuda_matmul(c->out[0], c->in[0], c->in[1], 1, (int)m, (int)n, (int)k, 0, 0,
                                 0, c->queue);
        /* Quantized weights: a mat-vec per row, reading the blocks as they
         * are (no dequantized copy of the weights in device memory). */
        for (int64_t r = 0; r < m && !rc; r++)
            rc = k_cuda_qmatvec((float *)c->out[0] + r * n, c->in[1], w->dtype,
                                (const float *)c->in[0] + r * k, (int)n, (int)k, c->queue);
        return rc;  /* one rank: the all-reduce of a fused op is the identity */
    }
#endif
    ON_GPU(how, -ENOSYS);
    if ((rc = matmul_any(cpu_opts(c), c->out[0], c->in[0], c->in[1], w->dtype, packed, m, n, k)))
        return rc;
    if (c->op->op == KOP_MATMUL_ALLREDUCE)
        return k_allreduce_sum(c->out[0], (size_t)(m * n), c->op->n_attr ? (int)c->op->attr[0] : 1);
    return 0;
}

static int op_qmatvec(const kx_op_ctx *c, int how)
{
    int rc = io(c, 2, 2, 1);
    if (rc)
        return rc;
    const kg_value *w = in_val(c, 0), *x = in_val(c, 1), *y = out_val(c, 0);
    NEED(is_block(w->dtype) && w->ndim == 2 && x->dtype == KD_F32 && y->dtype == KD_F32);
    int64_t m = rows_now(c, x), k = last_dim_now(c, x), n = w->shape[0];
    NEED(w->shape[1] == k && k % 32 == 0 && rows_now(c, y) == m && last_dim_now(c, y) == n);
    if (!(how & RUN))
        return 0;
#ifdef BATON_CUDA
    for (int64_t r = 0; (how & CUDA) && r < m; r++)
        if ((rc = k_cuda_qmatvec((float *)c->out[0] + r * n, c->in[0], w->dtype,
                                 (const float *)c->in[1] + r * k, (int)n, (int)k, c->queue)))
            return rc;
#endif
    ON_GPU(how, 0);
    const kt_cpu_opts *o = cpu_opts(c);
    return k_qmatmul_mt(o->pool, c->out[0], c->in[0], w->dtype, c->in[1], (int)m, (int)n, (int)k,
                        (o->act_q8 ? K_QMM_Q8 : 0) | (o->invariant ? K_QMM_INVARIANT : 0));
}

static int op_elementwise(const kx_op_ctx *c, int how)
{
    bool binary = c->op->op == KOP_ADD || c->op->op == KOP_MUL;
    int rc = io(c, binary ? 2 : 1, binary ? 2 : 1, 1);
    if (rc)
        return rc;
    const kg_value *y = out_val(c, 0);
    int64_t n = elems_now(c, y), nb = n;
    for (int k = 0; k < c->op->n_in; k++)
        NEED(in_val(c, k)->dtype == KD_F32);
    NEED(y->dtype == KD_F32 && elems_now(c, in_val(c, 0)) == n);
    if (binary) {
        /* ADD broadcasts a second operand whose count divides the first's. */
        nb = elems_now(c, in_val(c, 1));
        NEED(nb == n || (c->op->op == KOP_ADD && nb > 0 && n % nb == 0));
    }
    int64_t mode = c->op->op == KOP_GELU && c->op->n_attr ? c->op->attr[0] : K_GELU_TANH;
    NEED(mode == K_GELU_TANH || mode == K_GELU_ERF);
    if (!(how & RUN))
        return 0;
    switch (c->op->op) {
    case KOP_ADD:
        if (nb != n) {
            ON_GPU(how, k_cuda_add_bcast(c->out[0], c->in[0], (size_t)n, c->in[1], (size_t)nb,
                                         c->queue));
            k_add_mt(cpu_opts(c)->pool, c->out[0], c->in[0], (size_t)n, c->in[1], (size_t)nb);
            break;
        }
        ON_GPU(how, k_cuda_add(c->out[0], c->in[0], c->in[1], (size_t)n, c->queue));
        k_add_mt(cpu_opts(c)->pool, c->out[0], c->in[0], (size_t)n, c->in[1], (size_t)n);
        break;
    case KOP_MUL:
        ON_GPU(how, k_cuda_mul(c->out[0], c->in[0], c->in[1], (size_t)n, c->queue));
        k_mul(c->out[0], c->in[0], c->in[1], (size_t)n);
        break;
    case KOP_SILU:
        ON_GPU(how, k_cuda_silu(c->out[0], c->in[0], (size_t)n, c->queue));
        k_silu(c->out[0], c->in[0], (size_t)n);
        break;
    default:
        if (mode == K_GELU_ERF) {
            ON_GPU(how, k_cuda_gelu_erf(c->out[0], c->in[0], (size_t)n, c->queue));
            k_gelu_erf_mt(cpu_opts(c)->pool, c->out[0], c->in[0], (size_t)n);
            break;
        }
        ON_GPU(how, k_cuda_gelu(c->out[0], c->in[0], (size_t)n, c->queue));
        k_gelu(c->out[0], c->in[0], (size_t)n);
        break;
    }
    return 0;
}

static int op_norm(const kx_op_ctx *c, int how)
{
    bool ln = c->op->op == KOP_LAYERNORM;
    int rc = io(c, 2, ln ? 3 : 2, 1);
    if (rc)
        return rc;
    const kg_value *x = in_val(c, 0), *w = in_val(c, 1), *y = out_val(c, 0);
    int64_t d = last_dim_now(c, x), r = rows_now(c, x);
    NEED(x->dtype == KD_F32 && w->dtype == KD_F32 && y->dtype == KD_F32 && c->op->n_attr >= 1);
    NEED(elems_now(c, w) == d && rows_now(c, y) == r && last_dim_now(c, y) == d);
    NEED(c->op->n_in < 3 || (in_val(c, 2)->dtype == KD_F32 && elems_now(c, in_val(c, 2)) == d));
    float eps = (float)kg_attr_to_f(c->op->attr[0]);
    NEED(eps >= 0);
    if (!(how & RUN))
        return 0;
    const float *bias = c->op->n_in > 2 ? c->in[2] : NULL;
    if (ln) {
        ON_GPU(how, k_cuda_layernorm(c->out[0], c->in[0], c->in[1], bias, (int)r, (int)d, eps,
                                     c->queue));
        k_layernorm_mt(cpu_opts(c)->pool, c->out[0], c->in[0], c->in[1], bias, (int)r, (int)d,
                       eps);
    } else {
        ON_GPU(how, k_cuda_rmsnorm(c->out[0], c->in[0], c->in[1], (int)r, (int)d, eps, c->queue));
        k_rmsnorm(c->out[0], c->in[0], c->in[1], (int)r, (int)d, eps);
    }
    return 0;
}

static int op_rope(const kx_op_ctx *c, int how)
{
    int rc = io(c, 2, 2, 1);
    if (rc)
        return rc;
    const kg_value *x = in_val(c, 0), *pos = in_val(c, 1), *y = out_val(c, 0);
    NEED(c->op->n_attr >= 4 && x->dtype == KD_F32 && y->dtype == KD_F32 && pos->dtype == KD_I32);
    int64_t h = c->op->attr[0], hd = c->op->attr[1], mode = c->op->attr[3];
    double theta = kg_attr_to_f(c->op->attr[2]);
    int64_t n = rows_now(c, x);
    NEED(h > 0 && hd > 0 && hd % 2 == 0 && last_dim_now(c, x) == h * hd && theta > 0);
    NEED(mode == K_ROPE_NORMAL || mode == K_ROPE_NEOX);
    NEED(elems_now(c, pos) == n && rows_now(c, y) == n && last_dim_now(c, y) == h * hd);
    if (!(how & RUN))
        return 0;
#ifdef BATON_CUDA
    if (how & CUDA) {
        if (c->out[0] != c->in[0] &&
            (rc = k_cuda_copy(c->out[0], c->in[0], (size_t)(n * h * hd) * sizeof(float), c->queue)))
            return rc;
        return k_cuda_rope(c->out[0], c->in[1], (int)n, (int)h, (int)hd, (float)theta, (int)mode,
                           c->queue);
    }
#endif
    ON_GPU(how, -ENOSYS);
    if (c->out[0] != c->in[0])
        memcpy(c->out[0], c->in[0], (size_t)(n * h * hd) * sizeof(float));
    return k_rope(c->out[0], c->in[1], (int)n, (int)h, (int)hd, (float)theta, (int)mode);
}

/* The checks both attention ops share: attr {H, KV, HD}, q/k/v rows of N,
 * caches [B, KV, C, HD] updated in place (f32; on the CPU also f16 or
 * q8_0). */
static int attn_check(const kx_op_ctx *c, int how, int64_t *h, int64_t *kv, int64_t *hd, int64_t *n)
{
    int rc = io(c, 6, c->op->op == KOP_ATTN_DECODE ? 7 : 6, 3);
    if (rc)
        return rc;
    NEED(c->op->n_attr >= 3);
    *h = c->op->attr[0], *kv = c->op->attr[1], *hd = c->op->attr[2];
    NEED(*h > 0 && *kv > 0 && *h % *kv == 0 && *hd > 0);
    const kg_value *q = in_val(c, 0), *k = in_val(c, 1), *v = in_val(c, 2);
    const kg_value *kc = in_val(c, 3), *vc = in_val(c, 4), *o = out_val(c, 0);
    *n = rows_now(c, q);
    NEED(q->dtype == KD_F32 && k->dtype == KD_F32 && v->dtype == KD_F32 && o->dtype == KD_F32);
    NEED(last_dim_now(c, q) == *h * *hd && last_dim_now(c, k) == *kv * *hd && last_dim_now(c, v) == *kv * *hd);
    NEED(rows_now(c, k) == *n && rows_now(c, v) == *n && rows_now(c, o) == *n &&
         last_dim_now(c, o) == *h * *hd);
    /* The CPU kernels also keep f16 and q8_0 caches (q8_0 in whole blocks
     * per head); the GPU ones f32 only. */
    NEED(kc->dtype == KD_F32 ||
         (!(how & CUDA) && (kc->dtype == KD_F16 || (kc->dtype == KD_Q8_0 && *hd % 32 == 0))));
    NEED(vc->dtype == kc->dtype && kc->ndim == 4 && vc->ndim == 4);
    NEED(kc->shape[1] == *kv && kc->shape[3] == *hd && memcmp(kc->shape, vc->shape, sizeof(kc->shape)) == 0);
    NEED(c->op->out[1] == c->op->in[3] && c->op->out[2] == c->op->in[4]);
    NEED(in_val(c, 5)->dtype == KD_I32);
    return 0;
}

static int op_attn_prefill(const kx_op_ctx *c, int how)
{
    int64_t h, kv, hd, n;
    int rc = attn_check(c, how, &h, &kv, &hd, &n);
    if (rc)
        return rc;
    const kg_value *kcv = in_val(c, 3);
    int64_t b = kcv->shape[0], cap = kcv->shape[2];
    NEED(cap <= INT_MAX && n % b == 0 && elems_now(c, in_val(c, 5)) == n);
    if (!(how & RUN))
        return 0;
    int64_t t = n / b;
    const int32_t *pos = c->in[5];
    size_t cache = (size_t)(cap * kv * hd);
#ifdef BATON_CUDA
    /* On the GPU the positions stay in device memory: the kernel reads and
     * checks them, raising the run's flag instead of returning -ERANGE. */
    for (int64_t s = 0; (how & CUDA) && s < b && t; s++)
        if ((rc = k_cuda_attn_prefill_at(
                 (float *)c->out[0] + s * t * h * hd, (const float *)c->in[0] + s * t * h * hd,
                 (const float *)c->in[1] + s * t * kv * hd, (const float *)c->in[2] + s * t * kv * hd,
                 (float *)c->out[1] + (size_t)s * cache, (float *)c->out[2] + (size_t)s * cache,
                 pos + s * t, (int)cap, c->flag, (int)t, (int)h, (int)kv, (int)hd,
                 cuda_opts(c)->invariant, c->queue)))
            return rc;
#endif
    ON_GPU(how, 0);
    kdtype cdt = kcv->dtype;
    size_t cbytes = kdtype_bytes(cdt, cache);
    for (int64_t s = 0; s < b && t; s++) {
        int64_t p0 = pos[s * t];
        if (p0 < 0 || p0 + t > cap)
            return -ERANGE;  /* the tokens would not fit in the cache */
        if ((rc = (cpu_opts(c)->invariant ? k_attn_prefill_inv_mt : k_attn_prefill_mt)(
                 cpu_opts(c)->pool, (float *)c->out[0] + s * t * h * hd,
                 (const float *)c->in[0] + s * t * h * hd, (const float *)c->in[1] + s * t * kv * hd,
                 (const float *)c->in[2] + s * t * kv * hd, (uint8_t *)c->out[1] + (size_t)s * cbytes,
                 (uint8_t *)c->out[2] + (size_t)s * cbytes, cdt, (int)cap, (int)p0, (int)t, (int)h,
                 (int)kv, (int)hd)))
            return rc;
    }
    return 0;
}

static int op_attn_decode(const kx_op_ctx *c, int how)
{
    int64_t h, kv, hd, n;
    int rc = attn_check(c, how, &h, &kv, &hd, &n);
    if (rc)
        return rc;
    const kg_value *kcv = in_val(c, 3);
    int64_t cap = kcv->shape[2], n_cache = kcv->shape[0];
    bool slotted = c->op->n_in == 7;
    NEED(cap <= INT_MAX && n_cache <= INT_MAX && elems_now(c, in_val(c, 5)) == n);
    /* Without slots row b uses cache b; with them, cache slots[b]. */
    NEED(slotted ? in_val(c, 6)->dtype == KD_I32 && elems_now(c, in_val(c, 6)) == n
                 : n_cache >= n);
    if (!(how & RUN))
        return 0;
    const int32_t *lens = c->in[5], *slots = slotted ? c->in[6] : NULL;
    size_t cache = (size_t)(cap * kv * hd);
    ON_GPU(how, k_cuda_attn_decode_strided(c->out[0], c->in[0], c->in[1], c->in[2], c->out[1],
                                           c->out[2], cache, lens, slots, (int)n_cache, (int)n,
                                           (int)h, (int)kv, (int)hd, (int)cap, c->flag,
                                           c->queue));
    kdtype cdt = kcv->dtype;
    size_t cbytes = kdtype_bytes(cdt, cache);
    void *kcs[64], *vcs[64];
    for (int64_t s0 = 0; s0 < n; s0 += 64) {
        int64_t ns = n - s0 < 64 ? n - s0 : 64;
        for (int64_t s = 0; s < ns; s++) {
            int64_t at = slots ? slots[s0 + s] : s0 + s;
            if (lens[s0 + s] >= cap || (lens[s0 + s] >= 0 && (at < 0 || at >= n_cache)))
                return -ERANGE;  /* no row left in this sequence's cache, or no such cache */
            /* An unused row (a negative length) touches no cache. */
            at = at >= 0 && at < n_cache ? at : 0;
            kcs[s] = (uint8_t *)c->out[1] + (size_t)at * cbytes;
            vcs[s] = (uint8_t *)c->out[2] + (size_t)at * cbytes;
        }
        if ((rc = (cpu_opts(c)->invariant ? k_attn_decode_inv_mt
                                          : k_attn_decode_mt)(cpu_opts(c)->pool,
                                                              (float *)c->out[0] + s0 * h * hd,
                                   (const float *)c->in[0] + s0 * h * hd,
                                   (const float *)c->in[1] + s0 * kv * hd,
                                   (const float *)c->in[2] + s0 * kv * hd, kcs, vcs, cdt,
                                   (int)cap, lens + s0, (int)ns, (int)h, (int)kv, (int)hd)))
            return rc;
    }
    return 0;
}

static int op_rows(const kx_op_ctx *c, int how)
{
    int rc = io(c, 1, 1, 1);
    if (rc)
        return rc;
    const kg_value *x = in_val(c, 0), *y = out_val(c, 0);
    int64_t r = rows_now(c, x), n = last_dim_now(c, x);
    NEED(x->dtype == KD_F32);
    if (c->op->op == KOP_SOFTMAX)
        NEED(y->dtype == KD_F32 && elems_now(c, y) == r * n);
    else
        NEED(y->dtype == KD_I32 && elems_now(c, y) == r);
    if (!(how & RUN))
        return 0;
    if (c->op->op == KOP_SOFTMAX) {
        ON_GPU(how, k_cuda_softmax(c->out[0], c->in[0], (int)r, (int)n, c->queue));
        k_softmax(c->out[0], c->in[0], (int)r, (int)n);
    } else {
        ON_GPU(how, k_cuda_argmax(c->out[0], c->in[0], (int)r, (int)n, c->queue));
        k_argmax(c->out[0], c->in[0], (int)r, (int)n);
    }
    return 0;
}

static int op_sample(const kx_op_ctx *c, int how)
{
    int rc = io(c, 3, 3, 1);
    if (rc)
        return rc;
    const kg_value *x = in_val(c, 0), *p = in_val(c, 1), *g = in_val(c, 2), *y = out_val(c, 0);
    int64_t r = rows_now(c, x), n = last_dim_now(c, x);
    NEED(x->dtype == KD_F32 && p->dtype == KD_F32 && g->dtype == KD_I64 && y->dtype == KD_I32);
    NEED(elems_now(c, p) == 3 * r && elems_now(c, g) == 2 * r && elems_now(c, y) == r);
    if (!(how & RUN))
        return 0;
    /* On the GPU a row may ask for at most K_SAMPLE_MAX_K candidates (a
     * top_k of 0 means all): past that the run fails through its flag. */
    ON_GPU(how, k_cuda_sample_rows(c->out[0], c->in[0], c->in[1], c->in[2], (int)r, (int)n,
                                   c->flag, c->queue));
    const float *pp = c->in[1];
    const int64_t *gg = c->in[2];
    for (int64_t i = 0; i < r; i++)
        if ((rc = k_sample((int32_t *)c->out[0] + i, (const float *)c->in[0] + i * n, 1, (int)n,
                           pp[3 * i], (int)pp[3 * i + 1], pp[3 * i + 2], (uint64_t)gg[2 * i],
                           (uint64_t)gg[2 * i + 1])) != 0)
            return rc;
    return 0;
}

static int op_cast(const kx_op_ctx *c, int how)
{
    int rc = io(c, 1, 1, 1);
    if (rc)
        return rc;
    const kg_value *x = in_val(c, 0), *y = out_val(c, 0);
    NEED(is_float(x->dtype) && is_float(y->dtype) && elems_now(c, x) == elems_now(c, y));
    if (!(how & RUN))
        return 0;
    ON_GPU(how, k_cuda_cast(c->out[0], y->dtype, c->in[0], x->dtype, (size_t)elems_now(c, y), c->queue));
    if (x->dtype == KD_F32 && y->dtype == KD_F16) {
        k_cast_f16_fast(c->out[0], c->in[0], (size_t)elems_now(c, y));
        return 0;
    }
    return k_cast(c->out[0], y->dtype, c->in[0], x->dtype, (size_t)elems_now(c, y));
}

static int op_allreduce(const kx_op_ctx *c, int how)
{
    int rc = io(c, 1, 1, 1);
    if (rc)
        return rc;
    const kg_value *x = in_val(c, 0), *y = out_val(c, 0);
    int ranks = c->op->n_attr ? (int)c->op->attr[0] : 1;
    NEED(x->dtype == KD_F32 && y->dtype == KD_F32 && elems_now(c, x) == elems_now(c, y));
    size_t bytes = (size_t)elems_now(c, y) * sizeof(float);
    if (ranks > 1) {
        /* Over several ranks: NCCL on the GPU, through the communicator
         * the op table carries (kx_op_table.user, one per rank and
         * executable group); the CPU has no collective. */
        NEED(how & CUDA);
        if (!(how & RUN))
            return 0;
#ifdef BATON_CUDA
        NEED(cuda_opts(c)->comm != NULL);
        if (c->out[0] != c->in[0] && (rc = k_cuda_copy(c->out[0], c->in[0], bytes, c->queue)))
            return rc;
        ON_GPU(how, k_cuda_allreduce(c->out[0], bytes / sizeof(float), cuda_opts(c)->comm,
                                     c->queue));
#endif
        return -ENOSYS;
    }
    /* One rank: the sum over ranks is the input itself. */
    if (!(how & RUN) || c->out[0] == c->in[0])
        return 0;
    ON_GPU(how, k_cuda_copy(c->out[0], c->in[0], bytes, c->queue));
    memcpy(c->out[0], c->in[0], bytes);
    return 0;
}

static int op_im2col(const kx_op_ctx *c, int how)
{
    int rc = io(c, 1, 1, 1);
    if (rc)
        return rc;
    const kg_value *x = in_val(c, 0), *y = out_val(c, 0);
    NEED(c->op->n_attr >= 3 && x->dtype == KD_F32 && y->dtype == KD_F32);
    NEED(x->ndim == 3 && y->ndim == 3);
    int64_t k = c->op->attr[0], stride = c->op->attr[1], pad = c->op->attr[2];
    int64_t b = dim_now(c, x, 0), t_in = x->shape[1], ch = x->shape[2];
    NEED(k > 0 && stride > 0 && pad >= 0 && t_in + 2 * pad >= k && ch > 0);
    NEED(k <= 64 && stride <= 64 && pad <= 64 && t_in <= INT_MAX / 2 && ch * k <= INT_MAX);
    int64_t t_out = (t_in + 2 * pad - k) / stride + 1;
    NEED(dim_now(c, y, 0) == b && y->shape[1] == t_out && y->shape[2] == ch * k);
    if (!(how & RUN))
        return 0;
    ON_GPU(how, k_cuda_im2col(c->out[0], c->in[0], (int)b, (int)t_in, (int)ch, (int)k, (int)stride,
                              (int)pad, c->queue));
    k_im2col(c->out[0], c->in[0], (int)b, (int)t_in, (int)ch, (int)k, (int)stride, (int)pad);
    return 0;
}

static int op_attn(const kx_op_ctx *c, int how)
{
    int rc = io(c, 3, 3, 1);
    if (rc)
        return rc;
    const kg_value *q = in_val(c, 0), *k = in_val(c, 1), *v = in_val(c, 2), *o = out_val(c, 0);
    NEED(c->op->n_attr >= 3);
    int64_t h = c->op->attr[0], hd = c->op->attr[1], t = c->op->attr[2];
    bool bf16 = c->op->n_attr > 3 && c->op->attr[3] == K_ATTN_BF16;
    NEED(c->op->n_attr <= 3 || c->op->attr[3] == K_ATTN_F32 || bf16);
    NEED(!bf16 || (k->dtype == KD_F32 && !(how & CUDA)));
    NEED(h > 0 && hd > 0 && t >= 0 && h * hd <= INT_MAX);
    NEED(q->dtype == KD_F32 && o->dtype == KD_F32 && k->dtype == v->dtype);
    /* K and V in f16: the CPU's only. */
    NEED(k->dtype == KD_F32 || (k->dtype == KD_F16 && !(how & CUDA)));
    NEED(k->ndim == 3 && v->ndim == 3 && memcmp(k->shape, v->shape, sizeof(k->shape)) == 0);
    NEED(last_dim_now(c, q) == h * hd && k->shape[2] == h * hd);
    /* T 0: all of q's rows are one sequence's queries. */
    int64_t n = rows_now(c, q), s = k->shape[1];
    if (!t)
        t = n;
    int64_t nb = t ? n / t : 0;
    NEED(t && n % t == 0 && nb <= dim_now(c, k, 0) && nb <= dim_now(c, v, 0) && s > 0);
    NEED(rows_now(c, o) == n && last_dim_now(c, o) == h * hd && n <= INT_MAX && s <= INT_MAX);
    NEED(!(how & CUDA) || hd <= 256);
    if (!(how & RUN))
        return 0;
    ON_GPU(how, k_cuda_attn_full(c->out[0], c->in[0], c->in[1], c->in[2], (int)nb, (int)t, (int)s,
                                 (int)h, (int)hd, c->queue));
    if (bf16)
        return k_attn_full_bf16(cpu_opts(c)->pool, c->out[0], c->in[0], c->in[1], c->in[2],
                                (int)nb, (int)t, (int)s, (int)h, (int)hd);
    if (k->dtype == KD_F16)
        return k_attn_full_kv16(cpu_opts(c)->pool, c->out[0], c->in[0], c->in[1], c->in[2],
                                (int)nb, (int)t, (int)s, (int)h, (int)hd);
    return k_attn_full(cpu_opts(c)->pool, c->out[0], c->in[0], c->in[1], c->in[2], (int)nb, (int)t,
                       (int)s, (int)h, (int)hd);
}

/* ---- the table -------------------------------------------------------------- */

typedef int (*op_impl)(const kx_op_ctx *c, int how);

static op_impl impl_of(kop op)
{
    switch (op) {
    case KOP_EMBED: return op_embed;
    case KOP_MATMUL:
    case KOP_MATMUL_ALLREDUCE: return op_matmul;
    case KOP_QMATVEC: return op_qmatvec;
    case KOP_ADD:
    case KOP_MUL:
    case KOP_SILU:
    case KOP_GELU: return op_elementwise;
    case KOP_RMSNORM:
    case KOP_LAYERNORM: return op_norm;
    case KOP_ROPE: return op_rope;
    case KOP_ATTN_PREFILL: return op_attn_prefill;
    case KOP_ATTN_DECODE: return op_attn_decode;
    case KOP_SOFTMAX:
    case KOP_ARGMAX: return op_rows;
    case KOP_SAMPLE: return op_sample;
    case KOP_CAST: return op_cast;
    case KOP_ALLREDUCE: return op_allreduce;
    case KOP_IM2COL: return op_im2col;
    case KOP_ATTN: return op_attn;
    case KOP_COUNT: break;
    }
    return NULL;
}

static int run_cpu(const kx_op_ctx *c)
{
    return impl_of(c->op->op)(c, RUN);
}

void kt_cpu_ops(kx_op_table *t)
{
    memset(t, 0, sizeof(*t));
    for (int k = 0; k < KOP_COUNT; k++)
        t->fn[k] = impl_of((kop)k) ? run_cpu : NULL;
}

static int check(const kg_graph *g, int how, char *err, size_t errlen)
{
    for (size_t i = 0; i < g->n_ops; i++) {
        const kg_op *o = &g->ops[i];
        op_impl f = o->op < KOP_COUNT ? impl_of(o->op) : NULL;
        /* Checked at the compiled extent: the upper bound of every run. */
        kx_op_ctx c = {g, i, o, {0}, {0}, 0, 0, 0, NULL, NULL, NULL};
        if (!f || f(&c, how)) {
            const char *first = o->n_out ? g->values[o->out[0]].name : "";
            snprintf(err, errlen, "op %zu (%s, writing '%s'): %s", i, kop_name(o->op), first,
                     !f ? "no kernel for this op"
                     : (how & CUDA) && !f(&c, 0)
                         ? "the GPU kernels do not take these operands (kernels/optable.c)"
                         : "operands do not match what the op takes (kernels/ops.h)");
            return BT_EINVAL;
        }
    }
    return 0;
}

int kt_cpu_check(const kg_graph *g, char *err, size_t errlen)
{
    return check(g, 0, err, errlen);
}

int kt_cuda_check(const kg_graph *g, char *err, size_t errlen)
{
    return check(g, CUDA, err, errlen);
}

#ifdef BATON_CUDA
static int run_cuda(const kx_op_ctx *c)
{
    return impl_of(c->op->op)(c, RUN | CUDA);
}

int kt_cuda_ops(kx_op_table *t)
{
    memset(t, 0, sizeof(*t));
    for (int k = 0; k < KOP_COUNT; k++)
        t->fn[k] = impl_of((kop)k) ? run_cuda : NULL;
    return 0;
}
#else
int kt_cuda_ops(kx_op_table *t)
{
    memset(t, 0, sizeof(*t));
    return -ENOSYS;
}
#endif
