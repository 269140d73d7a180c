/* Whisper's token rules (backends/whisper/wdecode.h), after CTranslate2's
 * SuppressTokens and SuppressTokensBegin, which faster-whisper's decoding
 * runs. */
#include "backends/whisper/wdecode.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/kernels.h"

/* The integer array KEY of ROOT into *OUT (malloc'd), *N of them, plus
 * the N_EXTRA ids of EXTRA.  Ids outside the vocabulary are refused. */
static int id_array(json_t *root, const char *key, int32_t vocab, const int32_t *extra,
                    size_t n_extra, int32_t **out, size_t *n, const char *path, char *err,
                    size_t errlen)
{
    json_t *a = json_object_get(root, key);
    if (!json_is_array(a)) {
        snprintf(err, errlen, "%s: \"%s\" is missing or not an array", path, key);
        return BT_EFORMAT;
    }
    size_t len = json_array_size(a);
    int32_t *ids = malloc((len + n_extra + 1) * sizeof(*ids));
    if (!ids)
        return BT_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        json_t *v = json_array_get(a, i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= vocab) {
            snprintf(err, errlen, "%s: \"%s\"[%zu] is not a token id below %d", path, key, i,
                     (int)vocab);
            free(ids);
            return BT_EFORMAT;
        }
        ids[k++] = (int32_t)id;
    }
    for (size_t i = 0; i < n_extra; i++)
        if (extra[i] >= 0)
            ids[k++] = extra[i];
    *out = ids, *n = k;
    return 0;
}

int wdec_rules_load(const char *path, const wtok_special *sp, int32_t vocab, wdec_rules *r,
                    char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        snprintf(err, errlen, "%s:%d: %s", path, je.line, je.text);
        return BT_EFORMAT;
    }
    r->vocab = vocab;
    r->sp = *sp;
    /* The special tokens that never follow a prompt, as faster-whisper
     * adds them to the suppressed ids. */
    int32_t specials[6] = {sp->transcribe, sp->translate, sp->sot,
                           sp->sot_prev,   sp->sot_lm,    sp->no_speech};
    int rc = id_array(root, "suppress_ids", vocab, specials, 6, &r->suppress, &r->n_suppress, path,
                      err, errlen);
    if (!rc)
        rc = id_array(root, "suppress_ids_begin", vocab, NULL, 0, &r->suppress_begin, &r->n_begin,
                      path, err, errlen);
    json_decref(root);
    if (rc) {
        if (rc == BT_ENOMEM)
            snprintf(err, errlen, "%s: out of memory", path);
        wdec_rules_free(r);
    }
    return rc;
}

void wdec_rules_free(wdec_rules *r)
{
    free(r->suppress);
    free(r->suppress_begin);
    r->suppress = r->suppress_begin = NULL;
    r->n_suppress = r->n_begin = 0;
}

void wdec_filter(const wdec_rules *r, float *logits, int n)
{
    for (size_t i = 0; i < r->n_suppress; i++)
        logits[r->suppress[i]] = -INFINITY;
    if (n == 0)
        for (size_t i = 0; i < r->n_begin; i++)
            logits[r->suppress_begin[i]] = -INFINITY;
}

int32_t wdec_pick(const wdec_rules *r, const float *logits, float temperature, uint64_t seed,
                  uint64_t counter)
{
    int32_t tok = 0;
    if (temperature <= 0 ||
        k_sample(&tok, logits, 1, r->vocab, temperature, 0, 1.0f, seed, counter) != 0)
        k_argmax(&tok, logits, 1, r->vocab);
    return tok;
}

/* log(sum(exp(x))) over N values. */
static double logsumexp(const float *x, int32_t n)
{
    float m = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    if (m == -INFINITY)
        return -INFINITY;
    double s = 0;
    for (int32_t i = 0; i < n; i++)
        s += exp((double)x[i] - m);
    return m + log(s);
}

int32_t wdec_language(const wdec_rules *r, const float *logits, float *prob)
{
    int32_t first = r->sp.lang_first, n = r->sp.lang_count, best = first;
    if (first < 0 || n <= 0)
        return -1;
    for (int32_t i = first + 1; i < first + n; i++)
        if (logits[i] > logits[best])
            best = i;
    if (prob) {
        double lse = logsumexp(logits + first, n);
        *prob = (float)exp((double)logits[best] - lse);
    }
    return best;
}
