/* KOP_ATTN_PREFILL and KOP_ATTN_DECODE: causal grouped-query attention over
 * a KV cache, the references of the CUDA kernels.  Both go through one
 * function (attend_one) so that a decode step and the last row of a prefill
 * compute the same thing in the same order, which the unit tests rely on.
 *
 * Scores of one query live in a scratch array on the stack for short
 * contexts and on the heap beyond, rather than a fixed maximum context. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

/* OUT[HD] = softmax(Q . K[j] * scale, j < CTX) . V[j]; K, V rows are ROW
 * floats apart (N_KV * HD). */
static void attend_one(float *out, const float *q, const float *kc, const float *vc, int ctx,
                       size_t row, int hd, float *s)
{
    float scale = 1.0f / sqrtf((float)hd);
    float m = -INFINITY;
    for (int j = 0; j < ctx; j++) {
        const float *kj = kc + (size_t)j * row;
        float d = 0;
        for (int i = 0; i < hd; i++)
            d += q[i] * kj[i];
        s[j] = d * scale;
        m = s[j] > m ? s[j] : m;
    }
    float sum = 0;
    for (int j = 0; j < ctx; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < hd; i++)
        out[i] = 0;
    for (int j = 0; j < ctx; j++) {
        const float *vj = vc + (size_t)j * row;
        float p = s[j] * inv;
        for (int i = 0; i < hd; i++)
            out[i] += p * vj[i];
    }
}

static float *scratch(float *stackbuf, size_t have, size_t need)
{
    return need <= have ? stackbuf : malloc(need * sizeof(float));
}

void k_attn_prefill(float *out, const float *q, const float *k, const float *v, float *kc,
                    float *vc, int pos0, int n_tok, int n_head, int n_kv, int hd)
{
    size_t row = (size_t)n_kv * hd;
    memcpy(kc + (size_t)pos0 * row, k, (size_t)n_tok * row * sizeof(float));
    memcpy(vc + (size_t)pos0 * row, v, (size_t)n_tok * row * sizeof(float));
    int group = n_head / n_kv;
    float buf[1024];
    float *s = scratch(buf, 1024, (size_t)pos0 + n_tok);
    if (!s)
        abort(); /* out of memory for one score row: nothing sensible to return */
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            size_t qo = ((size_t)t * n_head + h) * hd;
            size_t ko = (size_t)(h / group) * hd;
            attend_one(out + qo, q + qo, kc + ko, vc + ko, pos0 + t + 1, row, hd, s);
        }
    if (s != buf)
        free(s);
}

void k_attn_decode(float *out, const float *q, const float *k, const float *v, float *const *kc,
                   float *const *vc, const int32_t *lens, int batch, int n_head, int n_kv,
                   int hd)
{
    size_t row = (size_t)n_kv * hd;
    int group = n_head / n_kv;
    for (int b = 0; b < batch; b++) {
        memcpy(kc[b] + (size_t)lens[b] * row, k + b * row, row * sizeof(float));
        memcpy(vc[b] + (size_t)lens[b] * row, v + b * row, row * sizeof(float));
        float buf[1024];
        float *s = scratch(buf, 1024, (size_t)lens[b] + 1);
        if (!s)
            abort();
        for (int h = 0; h < n_head; h++) {
            size_t qo = ((size_t)b * n_head + h) * hd;
            size_t ko = (size_t)(h / group) * hd;
            attend_one(out + qo, q + qo, kc[b] + ko, vc[b] + ko, lens[b] + 1, row, hd, s);
        }
        if (s != buf)
            free(s);
    }
}
