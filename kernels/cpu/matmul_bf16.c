/* Matrix products with bf16 weights on oneDNN (kernels.h, k_matmul_bf16).
 *
 * Whisper's encoder multiplies 1500 audio positions per window by every
 * matrix of its layers: 60 of its 87 GFLOP a window.  OpenBLAS runs them in
 * f32 at about 180 GFLOP/s on the 2-core machine this project is tested on
 * (a Xeon with AMX); oneDNN runs the same product with bf16 operands on the
 * AMX tiles at 300 to 600, and with AVX-512 BF16 on CPUs without AMX at
 * about twice f32.  OpenBLAS 0.3.21 as Debian builds it has no bf16 product,
 * and a hand-written AMX kernel would repeat what oneDNN already tunes.
 *
 * oneDNN has no product of f32 activations with bf16 weights: the
 * activations are first rounded to bf16 by a oneDNN reorder (to nearest
 * even, as k_cast), and the sums are kept in f32.  Primitives are created
 * per call; oneDNN's primitive cache makes a repeated shape a lookup.
 *
 * oneDNN runs on OpenMP's threads (Debian builds it so).  On them, which
 * spin beside OpenBLAS's threads and the kernels' pool, the ops after each
 * product ran slower.  So each thread of the kernels' pool takes a block
 * of rows and runs oneDNN on itself alone (one OpenMP thread). */
#include <dnnl.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/threads.h"
#include "kernels/kernels.h"

/* Rows a thread takes at a time: whole AMX tiles of 16 rows, and enough
 * that a thread's block is worth a oneDNN call. */
#define ROW_GRAIN 64

void omp_set_num_threads(int n);

static struct {
    pthread_once_t once;
    dnnl_engine_t engine; /* NULL: oneDNN could not start */
    bool native;          /* its bf16 product runs on AMX or AVX-512 BF16 */
} g = {PTHREAD_ONCE_INIT, NULL, false};

static void mm_desc(dnnl_memory_desc_t *a, dnnl_memory_desc_t *w, dnnl_memory_desc_t *y,
                    dnnl_memory_desc_t *af, int64_t m, int64_t n, int64_t k)
{
    dnnl_dims_t da = {m, k}, dw = {k, n}, dy = {m, n};
    /* Weights [N, K] row-major are the {K, N} matrix in order "ba". */
    dnnl_memory_desc_init_by_tag(a, 2, da, dnnl_bf16, dnnl_ab);
    dnnl_memory_desc_init_by_tag(w, 2, dw, dnnl_bf16, dnnl_ba);
    dnnl_memory_desc_init_by_tag(y, 2, dy, dnnl_f32, dnnl_ab);
    if (af)
        dnnl_memory_desc_init_by_tag(af, 2, da, dnnl_f32, dnnl_ab);
}

static void start(void)
{
    dnnl_engine_t e;
    if (dnnl_engine_create(&e, dnnl_cpu, 0) != dnnl_success)
        return;
    /* What oneDNN would run a Whisper-sized product on: its implementation
     * names the instructions ("brg:avx512_core_amx_bf16"); an emulated or
     * reference one would be slower than sgemm. */
    dnnl_memory_desc_t a, w, y;
    mm_desc(&a, &w, &y, NULL, 1500, 512, 512);
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    const char *impl = NULL;
    if (dnnl_matmul_desc_init(&md, &a, &w, NULL, &y) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &md, NULL, e, NULL) == dnnl_success) {
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
            impl)
            g.native = strstr(impl, "amx") || strstr(impl, "bf16");
        dnnl_primitive_desc_destroy(pd);
    }
    g.engine = e;
}

int k_matmul_bf16_native(void)
{
    pthread_once(&g.once, start);
    return g.native && k_cpu_isa() >= K_ISA_VNNI;
}

/* Creates the primitive of descriptor OP_DESC (or a reorder from SRC to
 * DST when OP_DESC is NULL) and runs it with ARGS. */
static int run(const void *op_desc, const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dst,
               dnnl_stream_t st, int n_args, const dnnl_exec_arg_t *args)
{
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    dnnl_status_t s = op_desc ? dnnl_primitive_desc_create(&pd, op_desc, NULL, g.engine, NULL)
                              : dnnl_reorder_primitive_desc_create(&pd, src, g.engine, dst,
                                                                   g.engine, NULL);
    if (s == dnnl_success)
        s = dnnl_primitive_create(&p, pd);
    if (s == dnnl_success)
        s = dnnl_primitive_execute(p, st, n_args, args);
    if (s == dnnl_success)
        s = dnnl_stream_wait(st);
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
    return s == dnnl_success ? 0 : s == dnnl_out_of_memory ? -ENOMEM : -EIO;
}

/* Rows [R0, R1) of Y on the calling thread, oneDNN on one thread. */
static int rows(float *y, const float *a, const uint16_t *w, int r0, int r1, int n, int k)
{
    int m = r1 - r0;
    omp_set_num_threads(1);
    dnnl_memory_desc_t ad, wd, yd, afd;
    mm_desc(&ad, &wd, &yd, &afd, m, n, k);
    uint16_t *ab = malloc((size_t)m * (size_t)k * sizeof(uint16_t));
    dnnl_stream_t st = NULL;
    dnnl_memory_t mem[4] = {NULL, NULL, NULL, NULL}; /* a f32, a bf16, w, y */
    int rc = ab ? 0 : -ENOMEM;
    if (!rc && (dnnl_stream_create(&st, g.engine, dnnl_stream_default_flags) ||
                dnnl_memory_create(&mem[0], &afd, g.engine, (void *)(a + (size_t)r0 * k)) ||
                dnnl_memory_create(&mem[1], &ad, g.engine, ab) ||
                dnnl_memory_create(&mem[2], &wd, g.engine, (void *)w) ||
                dnnl_memory_create(&mem[3], &yd, g.engine, y + (size_t)r0 * n)))
        rc = -ENOMEM;
    if (!rc) {
        dnnl_exec_arg_t cast[2] = {{DNNL_ARG_FROM, mem[0]}, {DNNL_ARG_TO, mem[1]}};
        rc = run(NULL, &afd, &ad, st, 2, cast);
    }
    if (!rc) {
        dnnl_matmul_desc_t md;
        dnnl_exec_arg_t args[3] = {
            {DNNL_ARG_SRC, mem[1]}, {DNNL_ARG_WEIGHTS, mem[2]}, {DNNL_ARG_DST, mem[3]}};
        rc = dnnl_matmul_desc_init(&md, &ad, &wd, NULL, &yd) ? -EINVAL
                                                             : run(&md, NULL, NULL, st, 3, args);
    }
    for (int i = 0; i < 4; i++)
        dnnl_memory_destroy(mem[i]);
    dnnl_stream_destroy(st);
    free(ab);
    return rc;
}

typedef struct bf16_job {
    float *y;
    const float *a;
    const uint16_t *w;
    int m, n, k;
    int rc;                  /* the first thread's error, 0 while none */
} bf16_job;

static void bf16_rows(void *arg, int ith, int nth)
{
    bf16_job *j = arg;
    int lo, hi;
    kth_split(j->m, ROW_GRAIN, ith, nth, &lo, &hi);
    int rc = lo < hi ? rows(j->y, j->a, j->w, lo, hi, j->n, j->k) : 0, none = 0;
    if (rc)
        __atomic_compare_exchange_n(&j->rc, &none, rc, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

int k_matmul_bf16(kth_pool *pool, float *y, const float *a, const uint16_t *w, int m, int n, int k)
{
    if (m <= 0)
        return 0;
    pthread_once(&g.once, start);
    if (!g.engine || n <= 0 || k <= 0)
        return -EINVAL;
    if (m < 2 * ROW_GRAIN || !pool || kth_acquire(pool) != 0)
        return rows(y, a, w, 0, m, n, k);
    bf16_job j = {y, a, w, m, n, k, 0};
    kth_run(pool, bf16_rows, &j);
    kth_release(pool);
    return j.rc;
}

