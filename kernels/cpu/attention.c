/* KOP_ATTN_PREFILL and KOP_ATTN_DECODE: causal grouped-query attention over
 * a KV cache, and KOP_ATTN: attention without mask or cache; the
 * references of the CUDA kernels.  Both go through one
 * function (attend_one) so that a decode step and the last row of a prefill
 * compute the same thing in the same order, which the unit tests rely on.
 *
 * Scores of one query live in a scratch array on the stack for short
 * contexts and on the heap beyond, rather than a fixed maximum context. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

/* OUT[HD] = softmax(Q . K[j] * scale, j < CTX) . V[j]; K, V rows are ROW
 * floats apart (HD: one KV head's rows are contiguous). */
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

/* N_TOK rows of SRC ([N_TOK][N_KV][HD]) into cache C ([N_KV][CAP][HD]) at
 * position POS. */
static void put_rows(float *c, int cap, int pos, const float *src, int n_tok, int n_kv, int hd)
{
    for (int t = 0; t < n_tok; t++)
        for (int g = 0; g < n_kv; g++)
            memcpy(c + ((size_t)g * cap + (size_t)pos + t) * hd,
                   src + ((size_t)t * n_kv + g) * hd, (size_t)hd * sizeof(float));
}

int k_attn_prefill(float *out, const float *q, const float *k, const float *v, float *kc,
                   float *vc, int cap, int pos0, int n_tok, int n_head, int n_kv, int hd)
{
    put_rows(kc, cap, pos0, k, n_tok, n_kv, hd);
    put_rows(vc, cap, pos0, v, n_tok, n_kv, hd);
    int group = n_head / n_kv;
    float buf[1024];
    float *s = scratch(buf, 1024, (size_t)pos0 + n_tok);
    if (!s)
        return -ENOMEM; /* the caches are written; the caller fails the run */
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            size_t qo = ((size_t)t * n_head + h) * hd;
            size_t ko = (size_t)(h / group) * (size_t)cap * hd;
            attend_one(out + qo, q + qo, kc + ko, vc + ko, pos0 + t + 1, (size_t)hd, hd, s);
        }
    if (s != buf)
        free(s);
    return 0;
}

int k_attn_decode(float *out, const float *q, const float *k, const float *v, float *const *kc,
                  float *const *vc, int cap, const int32_t *lens, int batch, int n_head,
                  int n_kv, int hd)
{
    size_t row = (size_t)n_kv * hd;
    int group = n_head / n_kv;
    for (int b = 0; b < batch; b++) {
        put_rows(kc[b], cap, lens[b], k + b * row, 1, n_kv, hd);
        put_rows(vc[b], cap, lens[b], v + b * row, 1, n_kv, hd);
        float buf[1024];
        float *s = scratch(buf, 1024, (size_t)lens[b] + 1);
        if (!s)
            return -ENOMEM;
        for (int h = 0; h < n_head; h++) {
            size_t qo = ((size_t)b * n_head + h) * hd;
            size_t ko = (size_t)(h / group) * (size_t)cap * hd;
            attend_one(out + qo, q + qo, kc[b] + ko, vc[b] + ko, lens[b] + 1, (size_t)hd, hd, s);
        }
        if (s != buf)
            free(s);
    }
    return 0;
}

int k_attn_full_ref(float *out, const float *q, const float *k, const float *v, int nb, int t,
                    int s, int n_head, int hd)
{
    size_t row = (size_t)n_head * hd;
    float buf[1024];
    float *sc = scratch(buf, 1024, (size_t)s);
    if (!sc)
        return -ENOMEM;
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < t; i++)
            for (int h = 0; h < n_head; h++) {
                size_t qo = ((size_t)b * t + i) * row + (size_t)h * hd;
                size_t ko = (size_t)b * s * row + (size_t)h * hd;
                attend_one(out + qo, q + qo, k + ko, v + ko, s, row, hd, sc);
            }
    if (sc != buf)
        free(sc);
    return 0;
}
