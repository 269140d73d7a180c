/* The `whisper` backend (backends/whisper/whisper.h): Whisper speech
 * recognition as three node modes, which a graph chains into nested loops
 * (config/examples/voice.yaml):
 *
 *   features  audio (a file's bytes as U8, or F32 PCM at 16 kHz) and
 *             options (U8 JSON, may be empty) in; the log-mel features of
 *             the whole audio (F32 [frames, n_mels], time-major), the
 *             first window's frame (`seek`, I32 [1] = 0) and, when the node
 *             has it, the audio's length (`duration`, F32 [1], seconds)
 *             out.
 *   encode    one 30-second window: the features and the window's first
 *             frame in; the window's audio states (F32 [n_audio, d_model])
 *             and the decoder's prompt (`token`, I32: start of transcript,
 *             language, task, and no timestamps when decoding without them)
 *             out.  The items of one call share one encoder run (max_batch
 *             windows).  A window that starts past the audio's end gives
 *             empty states and ends the window loop; without timestamps,
 *             the window that reaches the end ends it too.
 *   decode    one token: iteration 0 takes the prompt and the states (which
 *             fill the request's decoding slot: its cross-attention K and V
 *             and its first self-attention rows), later iterations the token
 *             before; the items of one call at iterations past 0 share one
 *             decoder step.  Out: `token` (I32 [1]), `text` (U8, UTF-8),
 *             `segments` (U8, JSON lines, when the node has it) and `seek`
 *             (I32 [1], the frame the next window starts at); the end of
 *             text raises the finish signal.
 *
 * Decoding with timestamps (the default, as faster-whisper's), the text of
 * a window comes a segment at a time, when the timestamp that closes the
 * segment is decoded: the window's unfinished last segment is decoded again
 * by the next window, which starts at its first timestamp, so nothing of it
 * may be sent before.  Segments of zero length or blank text are left out,
 * as faster-whisper leaves them out.  Without timestamps the text streams a
 * token at a time (whole UTF-8 characters), and each window is one
 * segment.  At a window's end `segments` carries one JSON line for each of
 * its segments: {"id", "seek", "start", "end", "text", "tokens",
 * "temperature", "avg_logprob", "compression_ratio", "no_speech_prob",
 * "language"}, times in seconds of the whole audio, avg_logprob,
 * compression_ratio and no_speech_prob the numbers the window was judged
 * by, language the code of the one asked for or detected ("en").
 *
 * Judging a window, as faster-whisper does: one whose text compresses too
 * well (it repeats itself) or whose tokens are improbable fails, and is
 * decoded again at the next temperature of the options' list while there
 * is one (the best failed attempt is kept when none is left); one that is
 * probably silence and not confidently decoded is skipped.  A window that
 * may be decoded again or skipped holds its text back until its end.
 *
 * The options JSON: {"language": "en" (default: detected from the first
 * step, as Whisper does), "prompt": "text" (previous text for the first
 * window, as faster-whisper's initial_prompt), "task": "transcribe" |
 * "translate", "temperature": 0 or [0, 0.2, ...] (default: the request's;
 * a list falls back), "timestamps": true|false (default true),
 * "condition_on_previous_text": true|false (default false: each window
 * after the tokens of the segments before it, as faster-whisper's option),
 * "compression_ratio_threshold": 2.4, "log_prob_threshold": -1.0,
 * "no_speech_threshold": 0.6 (faster-whisper's defaults; null: none)}.  A
 * temperature of its own lets a graph that chains Whisper into an LLM (a
 * voice chat) transcribe greedily while the request's temperature samples
 * the answer.
 *
 * Decoding slots (the KV caches, in the engine; max_batch of them): a
 * window takes one at its first decode step and gives it back at its last,
 * so a request holds none while its next window is encoded, nor while an
 * LLM after it answers (a window cut short by a loop cap, which this step
 * cannot see, keeps its slot for the next window or the request's end).
 * A window that finds every slot taken is deferred (baton_ctx.defer): it
 * waits in the worker's queue until a slot is given back, rather than
 * being refused. */
#include "backends/whisper/whisper.h"

#include <assert.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/catalog.h"
#include "backends/device.h"
#include "backends/text_encode.h"
#include "backends/whisper/audio.h"
#include "backends/whisper/mel.h"
#include "backends/whisper/wdecode.h"
#include "backends/whisper/wengine.h"
#include "backends/whisper/wtok.h"
#include "common/status.h"
#include "common/utf8.h"
#include "common/vec.h"
#include "kernels/exec.h"

#define WH_NAME "whisper"
#define WH_PREV_MAX 223 /* most tokens of previous text: half the decoder's positions less
                           one, as faster-whisper */
/* Most prompt tokens: start of previous text and the text, then start of
 * transcript, language, task, no timestamps. */
#define WH_PROMPT (1 + WH_PREV_MAX + 4)
#define WH_MAX_NEW 224  /* tokens per window: half the decoder's positions, as faster-whisper */
#define WH_TEMPS 8      /* most temperatures of a fallback list */
#define WH_RESET_TEMP 0.5f /* faster-whisper's prompt_reset_on_temperature */

/* An attempt at a window that failed faster-whisper's checks, kept in case
 * every temperature fails: the best of them is then the window's. */
typedef struct wh_attempt {
    int32_t toks[WH_MAX_NEW];
    int n;                       /* tokens; -1: none kept */
    double avg_logprob, compression;
} wh_attempt;

typedef struct wh_session {
    int slot;                    /* decoding slot, -1: none */
    int32_t lang;                /* language token, -1: detect at the first window */
    int32_t task;                /* <|transcribe|> or <|translate|> */
    float temps[WH_TEMPS];       /* options' temperatures: the first, then those a window
                                    falls back through */
    int n_temps;                 /* 0: the request's temperature, no fallback */
    float cr_threshold;          /* a window whose text compresses better fails (NAN: none) */
    float lp_threshold;          /* one whose average log probability is lower fails, and
                                    is skipped when it is probably silence (NAN: none) */
    float ns_threshold;          /* probability of no speech over which a window whose
                                    log probability fails is skipped (NAN: none) */
    bool timestamps;             /* decode with timestamps (segments, seeking) */
    int content;                 /* feature frames of the audio */
    int seek;                    /* the current window's first frame */
    int n_prompt;                /* tokens of the prompt in the slot */
    int n_sampled;               /* this window's tokens after the prompt */
    int attempt;                 /* the window's attempt: an index of temps */
    double sum_logprob;          /* log probabilities of the attempt's tokens, its end of
                                    text's included */
    double no_speech;            /* probability of no speech at the window's start */
    bool hold;                   /* the window's text waits for its end: it may be
                                    decoded again, or skipped as silent */
    wh_attempt best;             /* the best failed attempt of the window so far */
    int32_t toks[WH_MAX_NEW];    /* all of them (the timestamp rules read them) */
    int n_closed;                /* this window's segments sent so far */
    int n_segments;              /* segments sent in all windows (their ids) */
    char carry[8];               /* UTF-8 bytes held back: an unfinished character */
    int n_carry;
    uint64_t counter;            /* RNG counter of sampling */
    int32_t prev[WH_PREV_MAX];   /* the next window's previous text: the options' prompt
                                    (encoded) until a window is decoded, then, when
                                    conditioning, the last tokens of the windows' segments */
    int n_prev;                  /* its tokens; 0: none */
    bool condition;              /* condition each window on the text before it */
} wh_session;

struct baton_model {
    weng *eng;                   /* owned */
    wtok *tok;                   /* owned; ids to text */
    bk_text_encoder *enc;        /* owned; text to ids (a request's prompt); NULL: none */
    char enc_why[256];           /* why ENC is NULL */
    wdec_rules rules;            /* owned */
    wmel *mel;                   /* owned */
    const wm_shape *s;           /* the engine's */
    int slots;
    wh_session **owner;          /* owned; slots of them, NULL: free */
    size_t max_samples;          /* audio limit, at 16 kHz */
    float *logits;               /* owned; slots x vocab, host */
    float *sot_logits;           /* owned; vocab, host: a prompt's at its start of transcript */
    float *win;                  /* owned; slots windows of n_frames x n_mels, host */
    char device[32];
    char *report;                /* owned */
};

/* ---- loading ---------------------------------------------------------------- */

static int opt_get(const baton_load_params *p, const char *name, bt_opt_value *v, char *err,
                   size_t errlen)
{
    const bt_backend_desc *b = bt_backend_find(WH_NAME);
    const bt_opt_desc *d = bt_backend_option(b, name);
    assert(d); /* the options read here are declared */
    return bt_opt_parse(b, d, baton_load_option(p, name), v, err, errlen);
}

static void model_unload(baton_model *m)
{
    if (!m)
        return;
    weng_destroy(m->eng);
    wtok_destroy(m->tok);
    bk_text_encoder_close(m->enc);
    wdec_rules_free(&m->rules);
    wmel_destroy(m->mel);
    free(m->owner);
    free(m->logits);
    free(m->sot_logits);
    free(m->win);
    free(m->report);
    free(m);
}

static baton_status model_load(const baton_load_params *p, baton_model **out, char *err,
                               size_t errlen)
{
    *out = NULL;
    bt_opt_value path, act, threads, max_audio;
    if (opt_get(p, "path", &path, err, errlen) || opt_get(p, "activations", &act, err, errlen) ||
        opt_get(p, "threads", &threads, err, errlen) ||
        opt_get(p, "max_audio_s", &max_audio, err, errlen))
        return BATON_STATUS_INVALID_ARGUMENT;
    if (!path.set || !*path.s) {
        snprintf(err, errlen, "option path is required (a folder with model.bin, config.json "
                              "and tokenizer.json)");
        return BATON_STATUS_INVALID_ARGUMENT;
    }
    const kx_device *dev;
    int ordinal;
    baton_status dst = bk_device_open(p->device, "whisper", &dev, &ordinal, err, errlen);
    if (dst != BATON_STATUS_OK)
        return dst;
    if (p->tp_size > 1) {
        snprintf(err, errlen, "whisper does not shard over ranks (tp %u)", p->tp_size);
        return BATON_STATUS_INVALID_ARGUMENT;
    }
    baton_model *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return BATON_STATUS_RESOURCE_EXHAUSTED;
    }
    snprintf(m->device, sizeof(m->device), "%s", p->device ? p->device : "cpu");
    m->slots = p->max_batch ? (int)p->max_batch : 1;
    m->max_samples = (size_t)max_audio.i * WMEL_SAMPLE_RATE;
    char file[1024], why[512];
    weng_opts o = {dev, threads.i > 0 ? (int)threads.i : p->threads ? (int)p->threads : 1,
                   strcmp(act.s, "q8") == 0, m->slots, WH_PROMPT};
    baton_status st = BATON_STATUS_FAILED_PRECONDITION;
    snprintf(file, sizeof(file), "%s/model.bin", path.s);
    int rc = weng_create(file, &o, &m->eng, why, sizeof(why));
    if (rc) {
        snprintf(err, errlen, "%s", why);
        if (rc == BT_ENOMEM)
            st = BATON_STATUS_RESOURCE_EXHAUSTED;
        goto err;
    }
    m->s = weng_shape(m->eng);
    snprintf(file, sizeof(file), "%s/tokenizer.json", path.s);
    if (wtok_create(file, m->s->vocab, &m->tok, why, sizeof(why))) {
        snprintf(err, errlen, "%s", why);
        goto err;
    }
    /* The prompt's text is encoded by the transformer backend's byte-level
     * BPE, built from the same tokenizer.json. */
    /* Without it the model serves requests without a prompt (its report
     * says why). */
    (void)bk_text_encoder_open(path.s, m->s->vocab, &m->enc, m->enc_why, sizeof(m->enc_why));
    snprintf(file, sizeof(file), "%s/config.json", path.s);
    if (wdec_rules_load(file, wtok_specials(m->tok), m->s->vocab, &m->rules, why, sizeof(why))) {
        snprintf(err, errlen, "%s", why);
        goto err;
    }
    if (wmel_create(m->s->n_mels, &m->mel)) {
        snprintf(err, errlen, "cannot make a filterbank of %d mel bands", m->s->n_mels);
        goto err;
    }
    m->owner = calloc((size_t)m->slots, sizeof(*m->owner));
    m->logits = malloc((size_t)m->slots * m->s->vocab * sizeof(float));
    m->sot_logits = malloc((size_t)m->s->vocab * sizeof(float));
    m->win = malloc((size_t)m->slots * m->s->n_frames * m->s->n_mels * sizeof(float));
    char report[1024];
    snprintf(report, sizeof(report),
             "whisper on %s: d_model %d, %d+%d layers, %d mel bands, vocabulary %d; %s "
             "products for the audio, %s for the tokens; %d decoding slots; %.1f MiB of "
             "weights%s%s",
             m->device, m->s->d_model, m->s->enc_layers, m->s->dec_layers, m->s->n_mels,
             m->s->vocab, m->s->audio == KD_BF16 ? "bf16" : "f32",
             m->s->weight == KD_Q8_0 ? "8-bit" : "f32", m->slots,
             (double)weng_weight_bytes(m->eng) / (1024.0 * 1024.0),
             m->enc ? "" : "; prompts refused: ", m->enc ? "" : m->enc_why);
    m->report = strdup(report);
    if (!m->owner || !m->logits || !m->sot_logits || !m->win || !m->report) {
        snprintf(err, errlen, "out of memory");
        st = BATON_STATUS_RESOURCE_EXHAUSTED;
        goto err;
    }
    *out = m;
    return BATON_STATUS_OK;
err:
    model_unload(m);
    return st;
}

static uint64_t model_bytes(const baton_model *m)
{
    return weng_weight_bytes(m->eng);
}

static int model_describe(const baton_model *m, char *buf, size_t len)
{
    return snprintf(buf, len, "%s", m->report);
}

static baton_status session_open(baton_model *m, uint64_t key, baton_session **out, char *err,
                                 size_t errlen)
{
    (void)key;
    wh_session *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory opening a session");
        return BATON_STATUS_RESOURCE_EXHAUSTED;
    }
    s->slot = -1;
    s->lang = -1;
    s->task = wtok_specials(m->tok)->transcribe;
    s->timestamps = true;
    /* faster-whisper's defaults. */
    s->cr_threshold = 2.4f;
    s->lp_threshold = -1.0f;
    s->ns_threshold = 0.6f;
    *out = (baton_session *)s;
    return BATON_STATUS_OK;
}

/* Gives S's decoding slot back (its window is decoded, or its request ended). */
static void release_slot(baton_model *m, wh_session *s)
{
    if (s->slot < 0)
        return;
    m->owner[s->slot] = NULL;
    s->slot = -1;
}

static void session_close(baton_model *m, baton_session *bs)
{
    wh_session *s = (wh_session *)bs;
    if (!s)
        return;
    release_slot(m, s);
    free(s);
}

/* ---- items ------------------------------------------------------------------ */

static void failf(baton_ctx *ctx, baton_item *it, baton_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void failf(baton_ctx *ctx, baton_item *it, baton_status code, const char *fmt, ...)
{
    /* The worker names the node in front of the message. */
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ctx->fail(ctx, it, code, msg);
}

static const baton_input *input(const baton_item *it, const char *name)
{
    for (uint32_t i = 0; i < it->n_inputs; i++)
        if (strcmp(it->inputs[i].name, name) == 0)
            return &it->inputs[i];
    return NULL;
}

static const baton_input *need(baton_ctx *ctx, baton_item *it, const char *name)
{
    const baton_input *in = input(it, name);
    if (!in)
        failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT, "input '%s' is missing (mode %s)", name,
              it->mode);
    return in;
}

static uint64_t elems(const baton_tensor *t)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->dims[d];
    return n;
}

/* Sets output NAME of IT (when the node has it) to a new tensor of DT and
 * DIMS holding BYTES of host memory SRC.  0, or -1 after failing IT. */
static int put(baton_ctx *ctx, baton_item *it, const char *name, baton_dtype dt, uint32_t ndim,
               const int64_t *dims, const void *src, uint64_t bytes)
{
    for (uint32_t o = 0; o < it->n_outputs; o++) {
        if (strcmp(it->outputs[o].name, name) != 0)
            continue;
        baton_tensor *t = ctx->alloc(ctx, it, dt, ndim, dims);
        if (!t || (bytes && ctx->write(ctx, it, t, 0, src, bytes) != 0) ||
            ctx->set_output(ctx, it, o, t) != 0) {
            failf(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "the worker's pool is full");
            return -1;
        }
        return 0;
    }
    return 0;
}

static int put_i32(baton_ctx *ctx, baton_item *it, const char *name, int32_t v)
{
    int64_t one = 1;
    return put(ctx, it, name, BATON_DTYPE_I32, 1, &one, &v, sizeof(v));
}

/* Checks that every output of IT is one MODE makes. */
static int outputs_known(baton_ctx *ctx, baton_item *it, const char *const *names)
{
    for (uint32_t o = 0; o < it->n_outputs; o++) {
        bool ok = false;
        for (const char *const *n = names; *n && !ok; n++)
            ok = strcmp(it->outputs[o].name, *n) == 0;
        if (!ok) {
            char list[128] = "";
            for (const char *const *n = names; *n; n++)
                snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
                         n == names ? "" : ", ", *n);
            failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT,
                  "unknown output '%s' (mode %s makes %s)", it->outputs[o].name, it->mode, list);
            return -1;
        }
    }
    return 0;
}

/* The options JSON of input `options` (absent or empty: the defaults)
 * into S.  0, or -1 after failing IT. */
static int read_options(baton_model *m, baton_ctx *ctx, baton_item *it, wh_session *s)
{
    const baton_input *in = input(it, "options");
    if (!in || !in->tensor.nbytes)
        return 0;
    if (in->tensor.dtype != BATON_DTYPE_U8 || in->tensor.nbytes > 4096) {
        failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT,
              "input 'options' is JSON text (U8, at most 4096 bytes)");
        return -1;
    }
    char text[4097];
    if (ctx->read(ctx, it, &in->tensor, 0, text, in->tensor.nbytes) != 0)
        return -1;
    json_error_t je;
    json_t *o = json_loadb(text, in->tensor.nbytes, 0, &je);
    if (!json_is_object(o)) {
        failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT, "input 'options': %s",
              o ? "not a JSON object" : je.text);
        json_decref(o);
        return -1;
    }
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(o, key, v)
    {
        const char *str = json_string_value(v);
        if (!strcmp(key, "language")) {
            int32_t id = str && *str && strcmp(str, "auto") ? wtok_lang_id(m->tok, str) : -1;
            if (!str || (id < 0 && *str && strcmp(str, "auto"))) {
                failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT,
                      "input 'options': language %s%s%s is not one of Whisper's (a code such as "
                      "\"en\", or \"auto\")", str ? "'" : "", str ? str : "(not a string)",
                      str ? "'" : "");
                rc = -1;
                break;
            }
            s->lang = id;
        } else if (!strcmp(key, "task")) {
            const wtok_special *sp = wtok_specials(m->tok);
            if (str && !strcmp(str, "transcribe")) {
                s->task = sp->transcribe;
            } else if (str && !strcmp(str, "translate")) {
                s->task = sp->translate;
            } else {
                failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT,
                      "input 'options': task is \"transcribe\" or \"translate\"");
                rc = -1;
                break;
            }
        } else if (!strcmp(key, "temperature")) {
            /* A number, or the list of temperatures to fall back through. */
            size_t n = json_is_array(v) ? json_array_size(v) : 1;
            bool ok = json_is_number(v) || (n >= 1 && n <= WH_TEMPS);
            for (size_t i = 0; ok && i < n; i++) {
                json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
                double t = json_number_value(e);
                ok = json_is_number(e) && t >= 0 && t <= 2;
                s->temps[i] = (float)t;
            }
            if (!ok) {
                failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT,
                      "input 'options': temperature is a number from 0 to 2, or a list of 1 to "
                      "%d of them (the temperatures to fall back through)", WH_TEMPS);
                rc = -1;
                break;
            }
            s->n_temps = (int)n;
        } else if (!strcmp(key, "compression_ratio_threshold") ||
                   !strcmp(key, "log_prob_threshold") || !strcmp(key, "no_speech_threshold")) {
            double x = json_number_value(v);
            bool ns = key[0] == 'n';
            bool bad = !json_is_number(v) || !isfinite(x) || (ns && !(x >= 0 && x <= 1));
            if (!json_is_null(v) && bad) {
                failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT,
                      "input 'options': %s is %s, or null (none)", key,
                      ns ? "a probability from 0 to 1" : "a number");
                rc = -1;
                break;
            }
            float f = json_is_null(v) ? NAN : (float)x;
            if (key[0] == 'c')
                s->cr_threshold = f;
            else if (ns)
                s->ns_threshold = f;
            else
                s->lp_threshold = f;
        } else if (!strcmp(key, "prompt")) {
            int n = !str        ? BT_EINVAL
                    : !m->enc   ? BT_EUNSUPPORTED
                                : bk_text_encode_prompt(m->enc, str, json_string_length(v),
                                                        s->prev, WH_PREV_MAX);
            if (n < 0) {
                failf(ctx, it,
                      n == BT_ENOMEM    ? BATON_STATUS_RESOURCE_EXHAUSTED
                      : n == BT_EUNSUPPORTED  ? BATON_STATUS_FAILED_PRECONDITION
                                        : BATON_STATUS_INVALID_ARGUMENT,
                      "input 'options': prompt %s%s", !str ? "is a string"
                      : n == BT_EUNSUPPORTED ? "cannot be encoded: " : "failed: ",
                      !str ? "" : n == BT_EUNSUPPORTED ? m->enc_why : bt_strerror(n));
                rc = -1;
                break;
            }
            s->n_prev = n;
        } else if (!strcmp(key, "condition_on_previous_text") || !strcmp(key, "timestamps")) {
            if (!json_is_boolean(v)) {
                failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT,
                      "input 'options': %s is true or false", key);
                rc = -1;
                break;
            }
            *(key[0] == 'c' ? &s->condition : &s->timestamps) = json_is_true(v);
        } else {
            failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT,
                  "input 'options': unknown key '%s' (language, prompt, task, temperature, "
                  "timestamps, condition_on_previous_text, compression_ratio_threshold, "
                  "log_prob_threshold, no_speech_threshold)",
                  key);
            rc = -1;
            break;
        }
    }
    json_decref(o);
    return rc;
}

/* Mode features: audio to the whole log-mel spectrogram. */
static void features_one(baton_model *m, baton_ctx *ctx, baton_item *it)
{
    static const char *const outs[] = {"mel", "seek", "duration", NULL};
    wh_session *s = (wh_session *)it->session;
    const baton_input *in = need(ctx, it, "audio");
    if (!in || outputs_known(ctx, it, outs) || read_options(m, ctx, it, s))
        return;
    const baton_tensor *t = &in->tensor;
    float *pcm = NULL, *feat = NULL, *mel = NULL;
    size_t n = 0;
    char why[384];
    if (t->dtype == BATON_DTYPE_U8) {
        void *bytes = malloc(t->nbytes ? t->nbytes : 1);
        if (!bytes || ctx->read(ctx, it, t, 0, bytes, t->nbytes) != 0) {
            free(bytes);
            if (!bytes)
                failf(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        int rc = waudio_decode(bytes, t->nbytes, m->max_samples, &pcm, &n, NULL, why, sizeof(why));
        free(bytes);
        if (rc) {
            failf(ctx, it,
                  rc == BT_ENOMEM ? BATON_STATUS_RESOURCE_EXHAUSTED : BATON_STATUS_INVALID_ARGUMENT,
                  "input 'audio': %s%s", why,
                  rc == BT_ERANGE ? " (option max_audio_s of the model)" : "");
            return;
        }
    } else if (t->dtype == BATON_DTYPE_F32 && (t->ndim == 1 || (t->ndim == 2 && t->dims[0] == 1))) {
        n = (size_t)elems(t);
        if (!n || (m->max_samples && n > m->max_samples)) {
            failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT,
                  "input 'audio': %zu samples at 16 kHz; the model takes 1 to %zu (option "
                  "max_audio_s)", n, m->max_samples);
            return;
        }
        if (!(pcm = malloc(n * sizeof(float))) || ctx->read(ctx, it, t, 0, pcm, n * 4) != 0) {
            if (!pcm)
                failf(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            free(pcm);
            return;
        }
    } else {
        failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT,
              "input 'audio' is a file's bytes (U8) or samples at 16 kHz (F32 [n]), not %s of %u "
              "dims", t->dtype == BATON_DTYPE_F32 ? "F32" : "this type", t->ndim);
        return;
    }
    size_t frames = wmel_frames(n), M = (size_t)m->s->n_mels;
    /* faster-whisper's windows leave the features' last frame out. */
    size_t content = frames - 1;
    feat = malloc(frames * M * sizeof(float));
    mel = malloc((content ? content : 1) * M * sizeof(float));
    if (!feat || !mel || wmel_compute(m->mel, pcm, n, feat) != 0) {
        failf(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory computing features");
        goto out;
    }
    if (!content) {
        failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT,
              "input 'audio': %zu samples is less than one 10 ms frame", n);
        goto out;
    }
    for (size_t f = 0; f < content; f++)
        for (size_t b = 0; b < M; b++)
            mel[f * M + b] = feat[b * frames + f];
    s->content = (int)content;
    int64_t dims[2] = {(int64_t)content, (int64_t)M};
    float seconds = (float)n / WMEL_SAMPLE_RATE;
    int64_t one = 1;
    if (put(ctx, it, "mel", BATON_DTYPE_F32, 2, dims, mel, content * M * sizeof(float)) == 0 &&
        put_i32(ctx, it, "seek", 0) == 0)
        put(ctx, it, "duration", BATON_DTYPE_F32, 1, &one, &seconds, sizeof(seconds));
out:
    free(pcm);
    free(feat);
    free(mel);
}

/* Reads an I32 [1] input NAME into *V.  0, or -1 after failing IT. */
static int read_i32(baton_ctx *ctx, baton_item *it, const char *name, int32_t *v)
{
    const baton_input *in = need(ctx, it, name);
    if (!in)
        return -1;
    if (in->tensor.dtype != BATON_DTYPE_I32 || elems(&in->tensor) != 1) {
        failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT, "input '%s' is one I32", name);
        return -1;
    }
    return ctx->read(ctx, it, &in->tensor, 0, v, 4);
}

/* The prompt of S into P (WH_PROMPT ids): start of transcript, then
 * language, task and (without timestamps) no timestamps, or the start
 * alone when the language is to be detected.  The previous text (s->prev:
 * the options' prompt, then, when conditioning on previous text, the
 * windows' tokens) goes before them, after start of previous text. */
static int prompt_of(const baton_model *m, const wh_session *s, int32_t *p)
{
    const wtok_special *sp = wtok_specials(m->tok);
    int n = 0;
    if (s->lang < 0) {
        p[0] = sp->sot;
        return 1;
    }
    if (s->n_prev) {
        p[n++] = sp->sot_prev;
        memcpy(p + n, s->prev, (size_t)s->n_prev * sizeof(*p));
        n += s->n_prev;
    }
    p[n++] = sp->sot, p[n++] = s->lang, p[n++] = s->task;
    if (!s->timestamps)
        p[n++] = sp->no_timestamps;
    return n;
}

/* Mode encode: the items' windows in one encoder run. */
static void encode_batch(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    static const char *const outs[] = {"states", "token", NULL};
    size_t F = (size_t)m->s->n_frames, M = (size_t)m->s->n_mels;
    int row[n ? n : 1], rows = 0;
    for (size_t i = 0; i < n; i++) {
        baton_item *it = items[i];
        wh_session *s = (wh_session *)it->session;
        row[i] = -1;
        int32_t seek;
        const baton_input *mel = need(ctx, it, "mel");
        if (!mel || outputs_known(ctx, it, outs) || read_i32(ctx, it, "seek", &seek))
            continue;
        int64_t frames = mel->tensor.ndim == 2 ? mel->tensor.dims[0] : -1;
        if (mel->tensor.dtype != BATON_DTYPE_F32 || frames < 1 ||
            mel->tensor.dims[1] != (int64_t)M) {
            failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT,
                  "input 'mel' is F32 [frames, %zu] (mode features makes it)", M);
            continue;
        }
        s->content = (int)frames;
        if (seek < 0 || seek >= frames) {
            /* Past the end: no more windows.  Empty states tell decode. */
            int64_t dims[2] = {0, m->s->d_model};
            int32_t p[WH_PROMPT];
            int64_t np = prompt_of(m, s, p);
            if (put(ctx, it, "states", BATON_DTYPE_F32, 2, dims, NULL, 0) == 0 &&
                put(ctx, it, "token", BATON_DTYPE_I32, 1, &np, p, (uint64_t)np * 4) == 0)
                ctx->finish(ctx, it);
            continue;
        }
        s->seek = seek;
        size_t take = (size_t)(frames - seek) < F ? (size_t)(frames - seek) : F;
        float *w = m->win + (size_t)rows * F * M;
        memset(w, 0, F * M * sizeof(float));
        if (ctx->read(ctx, it, &mel->tensor, (uint64_t)seek * M * 4, w, take * M * 4) != 0)
            continue;
        row[i] = rows++;
    }
    if (!rows)
        return;
    int rc = weng_encode(m->eng, m->win, rows);
    for (size_t i = 0; i < n; i++) {
        baton_item *it = items[i];
        wh_session *s = (wh_session *)it->session;
        if (row[i] < 0)
            continue;
        if (rc) {
            failf(ctx, it, rc == BT_ENOMEM ? BATON_STATUS_RESOURCE_EXHAUSTED : BATON_STATUS_INTERNAL,
                  "the encoder failed: %s", bt_strerror(rc));
            continue;
        }
        int64_t dims[2] = {m->s->n_audio, m->s->d_model};
        baton_tensor *t = ctx->alloc(ctx, it, BATON_DTYPE_F32, 2, dims);
        uint32_t o = 0;
        while (o < it->n_outputs && strcmp(it->outputs[o].name, "states") != 0)
            o++;
        if (o < it->n_outputs &&
            (!t || weng_copy(m->eng, t->data, weng_audio(m->eng, row[i]), t->nbytes) != 0 ||
             ctx->set_output(ctx, it, o, t) != 0)) {
            failf(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "the worker's pool is full");
            continue;
        }
        int32_t p[WH_PROMPT];
        int64_t np = prompt_of(m, s, p);
        if (put(ctx, it, "token", BATON_DTYPE_I32, 1, &np, p, (uint64_t)np * 4) != 0)
            continue;
        /* Without timestamps a window always moves on by its whole length:
         * the one that reaches the end is the last.  With them, where the
         * next one starts is known once this one is decoded. */
        if (!s->timestamps && (size_t)s->seek + F >= (size_t)s->content)
            ctx->finish(ctx, it);
    }
}

/* Takes a free decoding slot for S.  0, or -1 after deferring IT (every
 * slot is taken: it runs again once one is given back). */
static int acquire_slot(baton_model *m, baton_ctx *ctx, baton_item *it, wh_session *s)
{
    if (s->slot >= 0)
        return 0;
    for (int k = 0; k < m->slots; k++)
        if (!m->owner[k]) {
            m->owner[k] = s;
            s->slot = k;
            return 0;
        }
    ctx->defer(ctx, it);
    return -1;
}

/* The UTF-8 bytes token T adds to S's text, up to the last whole
 * character (the rest is held back), into BUF (room for 64 bytes); END
 * flushes what was held back.  Returns the length. */
static size_t text_of(const baton_model *m, wh_session *s, int32_t t, bool end, char *buf)
{
    memcpy(buf, s->carry, (size_t)s->n_carry);
    size_t all = (size_t)s->n_carry, len = 0;
    const char *piece = t < wtok_specials(m->tok)->eot ? wtok_piece(m->tok, t, &len) : NULL;
    if (piece && len <= 48) {
        memcpy(buf + all, piece, len);
        all += len;
    }
    size_t done = end ? all : bt_utf8_cut(buf, all);
    /* A sequence that can never complete is sent as it is. */
    if (all - done >= sizeof(s->carry))
        done = all;
    s->n_carry = (int)(all - done);
    memcpy(s->carry, buf + done, (size_t)s->n_carry);
    return done;
}

/* Seconds rounded to 10 ms, as a JSON number that prints short. */
static json_t *seconds_json(double x)
{
    return json_real(round(x * 100.0) / 100.0);
}

/* What a decode step sends: its text and its segments' JSON lines (each
 * NUL-terminated, bt_bytes_add's; owned). */
typedef struct wh_out {
    char *text, *lines;
    size_t len, cap, lines_len, lines_cap;
} wh_out;

/* How a window's attempt is judged, as faster-whisper judges it. */
typedef struct wh_verdict {
    double avg_logprob;          /* the tokens' log probabilities over their count + 1 */
    double compression;          /* wdec_compression_ratio of the text */
    float temperature;
} wh_verdict;

/* The temperature of S's current attempt. */
static float temp_of(const wh_session *s, const baton_item *it)
{
    return s->n_temps ? s->temps[s->attempt] : it->sampling.temperature;
}

/* Appends the N tokens IDS of a segment to S's previous text, of which the
 * last WH_PREV_MAX are kept (faster-whisper's all_tokens, sliced). */
static void context_add(wh_session *s, const int32_t *ids, int n)
{
    if (n >= WH_PREV_MAX) {
        memcpy(s->prev, ids + n - WH_PREV_MAX, WH_PREV_MAX * sizeof(*ids));
        s->n_prev = WH_PREV_MAX;
        return;
    }
    int keep = s->n_prev + n > WH_PREV_MAX ? WH_PREV_MAX - n : s->n_prev;
    memmove(s->prev, s->prev + s->n_prev - keep, (size_t)keep * sizeof(*ids));
    memcpy(s->prev + keep, ids, (size_t)n * sizeof(*ids));
    s->n_prev = keep + n;
}

/* Appends the text and the JSON line of segment SEG of S's window, whose
 * tokens are IDS and text T (TL bytes), to O: the text only with TEXT, the
 * line only with LINE.  0 or BT_ENOMEM. */
static int segment_out(const baton_model *m, wh_session *s, const wdec_segment *seg,
                       const int32_t *ids, const char *t, size_t tl, const wh_verdict *v,
                       bool text, bool line, wh_out *o)
{
    if (text && bt_bytes_add(&o->text, &o->len, &o->cap, t, tl))
        return BT_ENOMEM;
    if (!line)
        return 0;
    if (s->condition)
        context_add(s, ids, seg->count);
    json_t *tokens = json_array();
    for (int i = 0; tokens && i < seg->count; i++)
        if (json_array_append_new(tokens, json_integer(ids[i])))
            json_decref(tokens), tokens = NULL;
    const char *lang = wtok_lang_code(m->tok, s->lang);
    json_t *js =
        tokens ? json_pack("{s:i, s:i, s:o, s:o, s:s%, s:o, s:f, s:f, s:f, s:f, s:s}", "id",
                           s->n_segments, "seek", s->seek, "start", seconds_json(seg->start),
                           "end", seconds_json(seg->end), "text", t, tl, "tokens", tokens,
                           "temperature", (double)v->temperature, "avg_logprob", v->avg_logprob,
                           "compression_ratio", v->compression, "no_speech_prob", s->no_speech,
                           "language", lang ? lang : "")
               : NULL;
    char *dump = js ? json_dumps(js, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    int rc = !dump || bt_bytes_add(&o->lines, &o->lines_len, &o->lines_cap, dump, strlen(dump)) ||
                     bt_bytes_add(&o->lines, &o->lines_len, &o->lines_cap, "\n", 1)
                 ? BT_ENOMEM
                 : 0;
    s->n_segments++;
    free(dump);
    json_decref(js);
    return rc;
}

/* The segments of S's window that its last token closed, decoded with
 * timestamps: their texts appended to O unless the window is held.  At the
 * window's END (verdict V), the texts not yet sent and every segment's
 * JSON line, and *NEXT the frame the next window starts at.  0 or
 * BT_ENOMEM. */
static int segments_of(baton_model *m, wh_session *s, const wh_verdict *v, bool end, int size,
                       wh_out *o, int *next)
{
    if (s->hold && !end)
        return 0;
    wdec_segment seg[WH_MAX_NEW + 1];
    int n = wdec_split(&m->rules, s->toks, s->n_sampled, s->seek, size, end, seg, next);
    int rc = 0;
    for (int k = end ? 0 : s->n_closed; k < n && !rc; k++) {
        char *t = NULL;
        size_t tl = 0;
        const int32_t *ids = s->toks + seg[k].first;
        if (wtok_decode(m->tok, ids, (size_t)seg[k].count, &t, &tl) != 0)
            rc = BT_ENOMEM;
        else if (wdec_segment_shown(&seg[k], t, tl))
            rc = segment_out(m, s, &seg[k], ids, t, tl, v, k >= s->n_closed, end, o);
        free(t);
    }
    s->n_closed = n;
    return rc;
}

/* The end of a window decoded without timestamps: the window is one
 * segment (its text too when it was held).  0 or BT_ENOMEM. */
static int window_segment(baton_model *m, wh_session *s, const wh_verdict *v, int size, wh_out *o)
{
    char *t = NULL;
    size_t tl = 0;
    if (wtok_decode(m->tok, s->toks, (size_t)s->n_sampled, &t, &tl) != 0)
        return BT_ENOMEM;
    wdec_segment seg = {0, s->n_sampled, s->seek * WDEC_FRAME_S, (s->seek + size) * WDEC_FRAME_S};
    int rc = wdec_segment_shown(&seg, t, tl)
                 ? segment_out(m, s, &seg, s->toks, t, tl, v, s->hold, true, o)
                 : 0;
    free(t);
    return rc;
}

/* Whether attempt A of a window is better than B (both failed): one whose
 * text passes the compression check first, then the more probable, as
 * faster-whisper picks when every temperature fails. */
static bool attempt_better(const wh_session *s, const wh_attempt *a, const wh_attempt *b)
{
    bool pa = isnan(s->cr_threshold) || a->compression <= s->cr_threshold;
    bool pb = isnan(s->cr_threshold) || b->compression <= s->cr_threshold;
    return pa != pb ? pa : a->avg_logprob > b->avg_logprob;
}

static void window_start(baton_model *m, baton_ctx *ctx, baton_item *it, const float *states);

/* The end of S's window (its tokens in s->toks): judged as faster-whisper
 * judges it.  A window that fails the checks while temperatures are left
 * is decoded again at the next one (returns 1: IT's outputs are set by
 * that attempt); when none is left, its best attempt is kept.  A window
 * judged silent is skipped: nothing of it is sent.  Else its text (if it
 * was held) and its segments' lines go to O, and *NEXT is where the next
 * window starts.  0, 1, or BT_ENOMEM. */
static int window_end(baton_model *m, baton_ctx *ctx, baton_item *it, int size, wh_out *o,
                      int *next)
{
    wh_session *s = (wh_session *)it->session;
    wh_verdict v = {s->sum_logprob / (s->n_sampled + 1), 0, temp_of(s, it)};
    char *t = NULL;
    size_t tl = 0;
    if (wtok_decode(m->tok, s->toks, (size_t)s->n_sampled, &t, &tl) != 0 ||
        (v.compression = wdec_compression_ratio(t, tl)) < 0) {
        free(t);
        return BT_ENOMEM;
    }
    free(t);
    bool lp_low = !isnan(s->lp_threshold) && v.avg_logprob < s->lp_threshold;
    bool silent = !isnan(s->ns_threshold) && s->no_speech > s->ns_threshold;
    bool failed = (!isnan(s->cr_threshold) && v.compression > s->cr_threshold) || lp_low;
    if (failed && !(silent && lp_low) && s->n_temps > 1) {
        wh_attempt cur = {.n = s->n_sampled, .avg_logprob = v.avg_logprob,
                          .compression = v.compression};
        if (s->best.n < 0 || attempt_better(s, &cur, &s->best)) {
            memcpy(s->best.toks, s->toks, (size_t)s->n_sampled * sizeof(int32_t));
            s->best.n = s->n_sampled, s->best.avg_logprob = v.avg_logprob;
            s->best.compression = v.compression;
        }
        if (s->attempt + 1 < s->n_temps) {
            const baton_input *st = need(ctx, it, "states");
            if (!st)
                return 1;
            s->attempt++;
            window_start(m, ctx, it, st->tensor.data);
            return 1;
        }
        /* Every temperature failed: the best attempt is the window's.  Its
         * temperature stays the last one, as faster-whisper reports it,
         * which also starts the previous text again. */
        memcpy(s->toks, s->best.toks, (size_t)s->best.n * sizeof(int32_t));
        s->n_sampled = s->best.n;
        v.avg_logprob = s->best.avg_logprob, v.compression = s->best.compression;
    }
    /* Skipped as silence: probably no speech, and not confidently decoded.
     * Its text is no previous text. */
    if (silent && !(!isnan(s->lp_threshold) && v.avg_logprob > s->lp_threshold)) {
        *next = s->seek + size;
        return 0;
    }
    int rc = s->timestamps ? segments_of(m, s, &v, true, size, o, next)
                           : window_segment(m, s, &v, size, o);
    /* The segments went to the previous text when conditioning; it starts
     * again after a window decoded above WH_RESET_TEMP (a sampled window
     * would lead the next astray), and without conditioning the options'
     * prompt was the first window's only. */
    if (!s->condition || v.temperature > WH_RESET_TEMP)
        s->n_prev = 0;
    return rc;
}

/* Chooses IT's next token from its logits ROW and sets its outputs. */
static void choose(baton_model *m, baton_ctx *ctx, baton_item *it, float *row)
{
    wh_session *s = (wh_session *)it->session;
    const wtok_special *sp = wtok_specials(m->tok);
    wdec_filter(&m->rules, row, s->toks, s->n_sampled, s->timestamps);
    float temp = temp_of(s, it);
    int32_t t = wdec_pick(&m->rules, row, temp, it->sampling.seed, s->counter++);
    /* CTranslate2 scores a sequence by the filtered logits' log softmax. */
    s->sum_logprob += wdec_logprob(&m->rules, row, t);
    /* A window ends at the end of text, or with its WH_MAX_NEW-th token
     * (kept, as CTranslate2's max_length keeps it): this step, not the
     * loop's max_iters, must end it, so that its last segments are cut and
     * sent and the next window starts where they end. */
    bool eot = t == sp->eot;
    bool end = eot || s->n_sampled + 1 >= WH_MAX_NEW ||
               s->n_prompt + s->n_sampled + 1 >= weng_ctx(m->eng);
    wh_out o = {0};
    int rc = 0;
    if (!s->timestamps && !s->hold) {
        char piece[64];
        size_t n = text_of(m, s, t, end, piece);
        rc = bt_bytes_add(&o.text, &o.len, &o.cap, piece, n);
    }
    if (!eot) {
        s->toks[s->n_sampled++] = t;
        ctx->count_tokens(ctx, it, 0, 1);
    }
    int F = m->s->n_frames, size = s->content - s->seek < F ? s->content - s->seek : F;
    int next = s->seek + size;
    if (!rc && end)
        rc = window_end(m, ctx, it, size, &o, &next);
    else if (!rc && s->timestamps)
        rc = segments_of(m, s, NULL, false, size, &o, &next);
    if (rc == 1)
        goto out; /* decoded again: that attempt set the outputs */
    if (rc) {
        failf(ctx, it, BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory for the text");
        goto out;
    }
    int64_t n = (int64_t)o.len, nl = (int64_t)o.lines_len;
    if (put_i32(ctx, it, "token", t) ||
        put(ctx, it, "text", BATON_DTYPE_U8, 1, &n, o.text, o.len) ||
        put(ctx, it, "segments", BATON_DTYPE_U8, 1, &nl, o.lines, o.lines_len) ||
        put_i32(ctx, it, "seek", next))
        goto out;
    if (end) {
        ctx->finish(ctx, it);
        release_slot(m, s);
    }
out:
    free(o.text);
    free(o.lines);
}

/* Runs S's window prompt against STATES (the slot is S's), after finding
 * the language when it was not given, and chooses the attempt's first
 * token. */
static void window_start(baton_model *m, baton_ctx *ctx, baton_item *it, const float *states)
{
    wh_session *s = (wh_session *)it->session;
    float *row = m->logits + (size_t)s->slot * m->s->vocab;
    int32_t p[WH_PROMPT], sot_id = wtok_specials(m->tok)->sot;
    int rc = 0;
    if (s->lang < 0) {
        /* Whisper's language detection: the most probable language token
         * after the start of transcript. */
        if (!(rc = weng_prompt(m->eng, s->slot, states, &sot_id, 1, 0, row, NULL)))
            s->lang = wdec_language(&m->rules, row, NULL);
    }
    int np = prompt_of(m, s, p), sot = 0;
    while (p[sot] != sot_id)
        sot++;
    if (!rc)
        rc = weng_prompt(m->eng, s->slot, states, p, np, sot, row, m->sot_logits);
    if (rc) {
        failf(ctx, it, rc == BT_ENOMEM ? BATON_STATUS_RESOURCE_EXHAUSTED : BATON_STATUS_INTERNAL,
              "the decoder's prompt failed: %s", bt_strerror(rc));
        return;
    }
    s->no_speech = wdec_no_speech_prob(&m->rules, m->sot_logits);
    bool can_fail = !isnan(s->cr_threshold) || !isnan(s->lp_threshold);
    /* Text waits for the window's end only when the window may be decoded
     * again or skipped: else it streams as it is decoded. */
    s->hold = (s->n_temps > 1 && can_fail) ||
              (!isnan(s->ns_threshold) && s->no_speech > s->ns_threshold);
    s->n_prompt = np;
    s->n_sampled = 0;
    s->n_carry = 0;
    s->n_closed = 0;
    s->sum_logprob = 0;
    ctx->count_tokens(ctx, it, (uint32_t)np, 0);
    choose(m, ctx, it, row);
}

/* Iteration 0 of decode: the window's first attempt. */
static void decode_first(baton_model *m, baton_ctx *ctx, baton_item *it)
{
    wh_session *s = (wh_session *)it->session;
    const baton_input *st = need(ctx, it, "states"), *tk = need(ctx, it, "token");
    if (!st || !tk)
        return;
    if (st->tensor.dtype != BATON_DTYPE_F32 || st->tensor.ndim != 2 ||
        (st->tensor.dims[0] && (st->tensor.dims[0] != m->s->n_audio ||
                                st->tensor.dims[1] != m->s->d_model))) {
        failf(ctx, it, BATON_STATUS_INVALID_ARGUMENT,
              "input 'states' is F32 [%d, %d] (mode encode makes it)", m->s->n_audio,
              m->s->d_model);
        return;
    }
    if (!st->tensor.dims[0]) {
        /* No window left (the audio ended): nothing to say. */
        int64_t zero = 0;
        if (!put_i32(ctx, it, "token", wtok_specials(m->tok)->eot) &&
            !put(ctx, it, "text", BATON_DTYPE_U8, 1, &zero, NULL, 0) &&
            !put(ctx, it, "segments", BATON_DTYPE_U8, 1, &zero, NULL, 0) &&
            !put_i32(ctx, it, "seek", s->content))
            ctx->finish(ctx, it);
        return;
    }
    if (acquire_slot(m, ctx, it, s))
        return;
    s->attempt = 0;
    s->best.n = -1;
    window_start(m, ctx, it, st->tensor.data);
}

static void decode_batch(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    static const char *const outs[] = {"token", "text", "segments", "seek", NULL};
    int32_t *tokens = calloc((size_t)m->slots * 2, sizeof(int32_t)), *lens = tokens + m->slots;
    bool *step = calloc(n ? n : 1, sizeof(bool));
    if (!tokens || !step) {
        for (size_t i = 0; i < n; i++)
            failf(ctx, items[i], BATON_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (int k = 0; k < m->slots; k++)
        lens[k] = -1;
    int rows = 0;
    for (size_t i = 0; i < n; i++) {
        baton_item *it = items[i];
        wh_session *s = (wh_session *)it->session;
        if (outputs_known(ctx, it, outs))
            continue;
        if (baton_item_iteration(it) == 0) {
            decode_first(m, ctx, it);
            continue;
        }
        int32_t t;
        if (read_i32(ctx, it, "token", &t))
            continue;
        if (s->slot < 0 || !s->n_prompt || (s->n_sampled && t != s->toks[s->n_sampled - 1])) {
            failf(ctx, it, BATON_STATUS_FAILED_PRECONDITION,
                  "token %d is not the one this request's decoder chose last", (int)t);
            continue;
        }
        if (lens[s->slot] >= 0) {
            failf(ctx, it, BATON_STATUS_INTERNAL, "two decode steps of one request in one call");
            continue;
        }
        tokens[s->slot] = t;
        lens[s->slot] = s->n_prompt + s->n_sampled - 1;
        rows = s->slot + 1 > rows ? s->slot + 1 : rows;
        step[i] = true;
    }
    if (!rows)
        goto out;
    int rc = weng_step(m->eng, tokens, lens, rows, m->logits);
    for (size_t i = 0; i < n; i++) {
        if (!step[i])
            continue;
        wh_session *s = (wh_session *)items[i]->session;
        if (rc)
            failf(ctx, items[i],
                  rc == BT_ENOMEM ? BATON_STATUS_RESOURCE_EXHAUSTED : BATON_STATUS_INTERNAL,
                  "the decoder step failed: %s", bt_strerror(rc));
        else
            choose(m, ctx, items[i], m->logits + (size_t)s->slot * m->s->vocab);
    }
out:
    free(tokens);
    free(step);
}

static void execute(baton_model *m, baton_ctx *ctx, baton_item *const *items, size_t n)
{
    const char *mode = n ? items[0]->mode : "";
    if (!strcmp(mode, "features")) {
        for (size_t i = 0; i < n; i++)
            features_one(m, ctx, items[i]);
    } else if (!strcmp(mode, "encode")) {
        encode_batch(m, ctx, items, n);
    } else if (!strcmp(mode, "decode")) {
        decode_batch(m, ctx, items, n);
    } else {
        for (size_t i = 0; i < n; i++)
            failf(ctx, items[i], BATON_STATUS_INVALID_ARGUMENT,
                  "mode '%s' (whisper has features, encode and decode)", mode);
    }
}

static const baton_backend whisper_backend = {
    .abi_version = BATON_BACKEND_ABI_VERSION,
    .name = WH_NAME,
    .model_load = model_load,
    .model_unload = model_unload,
    .model_bytes = model_bytes,
    .session_open = session_open,
    .session_close = session_close,
    .execute = execute,
    .model_describe = model_describe,
};

const baton_backend *bk_whisper_backend(void)
{
    return &whisper_backend;
}
