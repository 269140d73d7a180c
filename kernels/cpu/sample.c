/* KOP_SAMPLE: temperature, top-k and top-p sampling with the counter-based
 * Philox RNG of philox.h.  The rule is spelled out in kernels.h; the CUDA
 * sampler follows it step by step (same candidate order, same serial sums)
 * so that one (seed, counter) gives the same token on both devices.
 *
 * Candidates are chosen by a partial selection (repeated scans for small k,
 * a full sort otherwise): for the k of 1..64 that serving uses, k scans of
 * the vocabulary beat an O(n log n) sort of 49152 logits. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/order.h"
#include "kernels/cpu/philox.h"
#include "kernels/kernels.h"

typedef struct cand {
    float logit;
    int32_t idx;
} cand;

/* Descending logit, then ascending index: a total order, so qsort's lack of
 * stability does not matter. */
static int cand_cmp(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    if (a->idx == b->idx)
        return 0;
    return k_logit_better(a->logit, a->idx, b->logit, b->idx) ? -1 : 1;
}


/* The K best of X[N] in order into C.  0, or -ENOMEM. */
static int select_top(cand *c, const float *x, int n, int k)
{
    if (k <= 64) {
        for (int s = 0; s < k; s++) {
            int best = -1;
            for (int i = 0; i < n; i++) {
                /* Strictly worse than the previous pick in the total order. */
                if (s > 0 && !k_logit_better(c[s - 1].logit, c[s - 1].idx, x[i], i))
                    continue;
                if (best < 0 || k_logit_better(x[i], i, x[best], best))
                    best = i;
            }
            c[s].logit = x[best];
            c[s].idx = best;
        }
        return 0;
    }
    cand *all = malloc((size_t)n * sizeof(*all));
    if (!all)
        return -ENOMEM;
    for (int i = 0; i < n; i++) {
        all[i].logit = x[i];
        all[i].idx = i;
    }
    qsort(all, (size_t)n, sizeof(*all), cand_cmp);
    for (int i = 0; i < k; i++)
        c[i] = all[i];
    free(all);
    return 0;
}

/* The token of one row into *OUT: 0, or -ENOMEM with *OUT untouched. */
static int sample_row(int32_t *out, const float *x, int n, float temp, int top_k, float top_p,
                      uint64_t seed, uint64_t counter)
{
    if (temp <= 0) {
        int32_t best = 0;
        for (int i = 1; i < n; i++)
            if (k_logit_better(x[i], i, x[best], best))
                best = i;
        *out = best;
        return 0;
    }
    int k = top_k <= 0 || top_k > n ? n : top_k;
    cand cbuf[64] = {{0}}; /* select_top fills K >= 1 of them; zeroed for the compiler */
    cand *c = k <= 64 ? cbuf : malloc((size_t)k * sizeof(*c));
    float *p = NULL;
    int rc = -ENOMEM;
    if (!c || (rc = select_top(c, x, n, k)) != 0)
        goto err;
    if (c[0].logit != c[0].logit) {
        /* Every logit is NaN: the order's first, index 0. */
        *out = c[0].idx;
        if (c != cbuf)
            free(c);
        return 0;
    }
    /* Probabilities, unnormalized: exp((l - lmax) / T), summed in order. */
    float total = 0;
    rc = -ENOMEM;
    if (!(p = malloc((size_t)k * sizeof(float))))
        goto err;
    for (int i = 0; i < k; i++) {
        p[i] = K_CAND_WEIGHT(c[i].logit, c[0].logit, temp);
        total += p[i];
    }
    int keep = k;
    if (top_p < 1.0f) {
        float run = 0;
        for (int i = 0; i < k; i++) {
            run += p[i];
            if (run >= top_p * total) {
                keep = i + 1;
                break;
            }
        }
    }
    float mass = 0;
    for (int i = 0; i < keep; i++)
        mass += p[i];
    float u = k_philox_uniform(seed, counter) * mass;
    int32_t tok = c[keep - 1].idx;
    float run = 0;
    for (int i = 0; i < keep; i++) {
        run += p[i];
        if (run > u) {
            tok = c[i].idx;
            break;
        }
    }
    free(p);
    if (c != cbuf)
        free(c);
    *out = tok;
    return 0;
err:
    if (c != cbuf)
        free(c);
    return rc;
}

int k_sample(int32_t *out, const float *logits, int rows, int n, float temperature, int top_k,
             float top_p, uint64_t seed, uint64_t counter)
{
    for (int r = 0; r < rows; r++) {
        int rc = sample_row(&out[r], logits + (size_t)r * n, n, temperature, top_k, top_p, seed,
                            counter + (uint64_t)r);
        if (rc)
            return rc;
    }
    return 0;
}
