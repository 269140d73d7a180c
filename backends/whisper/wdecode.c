/* Whisper's token rules (backends/whisper/wdecode.h), after CTranslate2's
 * SuppressTokens, SuppressTokensBegin and ApplyTimestampRules, which
 * faster-whisper's decoding runs, and faster-whisper's cutting of a
 * window into segments. */
#include "backends/whisper/wdecode.h"

#include <assert.h>
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

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
    /* faster-whisper's max_initial_timestamp: 1 s. */
    r->max_initial = 50;
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

static void disable(float *logits, int32_t from, int32_t to)
{
    for (int32_t i = from; i < to; i++)
        logits[i] = -INFINITY;
}

/* Whisper's timestamp rules, in the order and form of CTranslate2's
 * ApplyTimestampRules (which differs from OpenAI's reference in small
 * ways: the probability test is skipped right after a pair). */
static void timestamp_rules(const wdec_rules *r, float *logits, const int32_t *sampled, int n)
{
    const int32_t tb = r->sp.timestamp_begin, end = r->vocab, eot = r->sp.eot;
    logits[r->sp.no_timestamps] = -INFINITY;
    bool check = false;
    if (n == 0) {
        /* A window starts with a timestamp, and not a late one. */
        disable(logits, 0, tb);
        disable(logits, tb + r->max_initial + 1, end);
    } else if (sampled[n - 1] >= tb) {
        int32_t last = sampled[n - 1], before = n >= 2 ? sampled[n - 2] : last;
        if (before >= tb) {
            /* A pair closed a segment: text follows. */
            disable(logits, tb, end);
        } else {
            /* A segment's end: another timestamp (the next one's start,
             * not earlier) or the end of text. */
            disable(logits, 0, eot);
            disable(logits, tb, last);
            check = true;
        }
    } else {
        check = true;
        /* Inside a segment: its end comes after its start. */
        for (int k = n - 1; k >= 0; k--)
            if (sampled[k] >= tb) {
                disable(logits, tb, sampled[k] + 1);
                break;
            }
    }
    /* When the timestamps together outweigh every text token, one of them
     * comes next.  Comparing log-sum-exp with the largest logit equals
     * CTranslate2's comparison of log-probabilities (the same shift). */
    if (check) {
        float best = -INFINITY;
        for (int32_t i = 0; i < tb; i++)
            best = logits[i] > best ? logits[i] : best;
        /* The reference sum, whose choices the tests hold to faster-whisper's. */
        if (k_logsumexp_ref(logits + tb, end - tb) > (double)best)
            disable(logits, 0, tb);
    }
}

void wdec_filter(const wdec_rules *r, float *logits, const int32_t *sampled, int n,
                 bool timestamps)
{
    for (size_t i = 0; i < r->n_suppress; i++)
        logits[r->suppress[i]] = -INFINITY;
    if (n == 0)
        for (size_t i = 0; i < r->n_begin; i++)
            logits[r->suppress_begin[i]] = -INFINITY;
    if (timestamps && r->sp.timestamp_begin > 0 && r->sp.timestamp_begin < r->vocab)
        timestamp_rules(r, logits, sampled, n);
}

int wdec_split(const wdec_rules *r, const int32_t *toks, int n, int seek, int size, bool final,
               wdec_segment *out, int *next_seek)
{
    const int32_t tb = r->sp.timestamp_begin;
    const double offset = seek * WDEC_FRAME_S;
    int k = 0, last = 0;
    for (int i = 1; i < n; i++) {
        if (toks[i] < tb || toks[i - 1] < tb)
            continue;
        /* Two timestamps in a row: the segment before them ends. */
        out[k++] = (wdec_segment){last, i - last, offset + (toks[last] - tb) * WDEC_TS_S,
                                  offset + (toks[i - 1] - tb) * WDEC_TS_S};
        last = i;
    }
    if (!final)
        return k;
    bool single_end = n >= 2 && toks[n - 2] < tb && toks[n - 1] >= tb;
    int next = seek + size;
    if (k && single_end) {
        /* One timestamp at the end: no speech after it. */
        out[k++] = (wdec_segment){last, n - last, offset + (toks[last] - tb) * WDEC_TS_S,
                                  offset + (toks[n - 1] - tb) * WDEC_TS_S};
    } else if (k) {
        /* The unfinished tail is decoded again, from the last timestamp. */
        next = seek + (toks[last - 1] - tb) * WDEC_TS_FRAMES;
    } else {
        double duration = size * WDEC_FRAME_S;
        for (int i = n - 1; i >= 0; i--)
            if (toks[i] >= tb) {
                if (toks[i] != tb)
                    duration = (toks[i] - tb) * WDEC_TS_S;
                break;
            }
        out[k++] = (wdec_segment){0, n, offset, offset + duration};
    }
    if (next_seek)
        *next_seek = next;
    return k;
}

bool wdec_segment_shown(const wdec_segment *s, const char *text, size_t len)
{
    /* The times differ by whole frames (of 10 ms) or not at all. */
    if (fabs(s->end - s->start) < WDEC_FRAME_S / 2)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!isspace((unsigned char)text[i]))
            return true;
    return false;
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

double wdec_logprob(const wdec_rules *r, const float *logits, int32_t token)
{
    assert(token >= 0 && token < r->vocab);
    return (double)logits[token] - k_logsumexp(logits, r->vocab);
}

double wdec_no_speech_prob(const wdec_rules *r, const float *logits)
{
    if (r->sp.no_speech < 0 || r->sp.no_speech >= r->vocab)
        return 0;
    return exp(wdec_logprob(r, logits, r->sp.no_speech));
}

double wdec_compression_ratio(const char *text, size_t len)
{
    /* Python's str.strip() of the text first, for ASCII whitespace. */
    while (len && isspace((unsigned char)*text))
        text++, len--;
    while (len && isspace((unsigned char)text[len - 1]))
        len--;
    if (!len)
        return 0;
    /* zlib.compress's level (6) and framing, whose header and checksum
     * count in the ratio as they do there. */
    uLongf cap = compressBound((uLong)len);
    Bytef stack[4096], *buf = cap <= sizeof(stack) ? stack : malloc(cap);
    if (!buf)
        return -1;
    int rc = compress2(buf, &cap, (const Bytef *)text, (uLong)len, Z_DEFAULT_COMPRESSION);
    if (buf != stack)
        free(buf);
    return rc == Z_OK && cap ? (double)len / (double)cap : -1;
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
        double lse = k_logsumexp_ref(logits + first, n);
        *prob = (float)exp((double)logits[best] - lse);
    }
    return best;
}
