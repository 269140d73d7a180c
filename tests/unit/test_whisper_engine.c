/* Whisper's encoder and decoder (backends/whisper/wengine.c, wmodel.c,
 * wdecode.c) on Whisper base against faster-whisper: for each clip of
 * tests/unit/data/whisper-ids.tsv (written by scripts/gen-whisper-ids.py
 * with faster-whisper and CTranslate2 in float32), the audio is decoded,
 * its log-mel windows computed, encoded, and decoded greedily with
 * faster-whisper's rules; the ids must equal faster-whisper's, with f32
 * activations.  With 8-bit products (the CPU's fast path) the ids may
 * differ only where the f32 logits were at a near tie, by the rule of the
 * transformer's tests.  With timestamps (tests/unit/data/whisper-segments.tsv,
 * same script), every window's ids, where each window starts, and the
 * segments' times and texts equal faster-whisper's, on a clip long enough
 * that a window ends inside speech.  And slots: two sequences stepped
 * together give the ids each gives alone.
 *
 * WHISPER_TEST_DEVICE=cuda:0 runs the engine on that device (the CUDA
 * emulator in make test), f32 only. */
#include <math.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "tests/unit/skip.h"

#include "backends/text_encode.h"
#include "backends/whisper/audio.h"
#include "backends/whisper/mel.h"
#include "backends/whisper/wdecode.h"
#include "kernels/kernels.h"
#include "backends/whisper/wengine.h"
#include "backends/whisper/wtok.h"
#include "common/mapfile.h"
#include "kernels/exec.h"

#define DIR "models/whisper-base"
#define MODEL DIR "/model.bin"
#define IDS "tests/unit/data/whisper-ids.tsv"
#define SEGMENTS "tests/unit/data/whisper-segments.tsv"
#define SCORES "tests/unit/data/whisper-scores.tsv"
#define PROMPTS "tests/unit/data/whisper-prompt.tsv"
/* The backend's longest prompt: start of previous text, 223 ids of it, and
 * 4 of the start of transcript. */
#define MAX_PROMPT 228
#define SAMPLES "models/samples"

typedef struct want {
    char clip[64];
    int seek;
    int32_t ids[448];
    int n;
} want;

static want wants[64];
static int n_wants;

/* Space-separated ids of TEXT into IDS (at most MAX); how many. */
static int ids_of(char *text, int32_t *ids, int max)
{
    int n = 0;
    for (char *t = strtok(text, " \n"); t; t = strtok(NULL, " \n")) {
        assert_true(n < max);
        ids[n++] = (int32_t)atoi(t);
    }
    return n;
}

static void read_wants(void)
{
    FILE *f = fopen(IDS, "r");
    assert_non_null(f);
    char line[8192];
    n_wants = 0;
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#')
            continue;
        want *w = &wants[n_wants];
        char *clip = strtok(line, "\t"), *seek = strtok(NULL, "\t"), *ids = strtok(NULL, "\t");
        assert_non_null(ids);
        snprintf(w->clip, sizeof(w->clip), "%s", clip);
        w->seek = atoi(seek);
        w->n = ids_of(ids, w->ids, 448);
        assert_true(++n_wants < 64);
    }
    fclose(f);
}

static const kx_device *device(void)
{
    const char *d = getenv("WHISPER_TEST_DEVICE");
    if (!d || !strcmp(d, "cpu"))
        return NULL;
#ifdef BATON_CUDA
    return kx_device_cuda(atoi(d + 5));
#else
    fail_msg("WHISPER_TEST_DEVICE=%s in a build without CUDA", d);
    return NULL;
#endif
}

typedef struct fixture {
    weng *eng;
    wtok *tok;
    wdec_rules rules;
    wmel *mel;
    const wm_shape *s;
    double sum_logprob;  /* the last greedy_after's: its tokens' log probabilities, the end of
                            text's included */
    double no_speech;    /* and the probability of no speech at its start of transcript */
} fixture;

static void setup(fixture *fx, int act_q8, int slots)
{
    char err[512];
    weng_opts o = {device(), 2, act_q8, slots, MAX_PROMPT};
    int rc = weng_create(MODEL, &o, &fx->eng, err, sizeof(err));
    if (rc)
        fail_msg("weng_create: %s: %s", bt_strerror(rc), err);
    fx->s = weng_shape(fx->eng);
    assert_int_equal(fx->s->d_model, 512);
    assert_int_equal(fx->s->enc_layers, 6);
    assert_int_equal(fx->s->n_audio, 1500);
    rc = wtok_create(DIR "/tokenizer.json", fx->s->vocab, &fx->tok, err, sizeof(err));
    if (rc)
        fail_msg("wtok_create: %s", err);
    rc = wdec_rules_load(DIR "/config.json", wtok_specials(fx->tok), fx->s->vocab, &fx->rules, err,
                         sizeof(err));
    if (rc)
        fail_msg("wdec_rules_load: %s", err);
    assert_int_equal(wmel_create(fx->s->n_mels, &fx->mel), 0);
}

static void teardown(fixture *fx)
{
    weng_destroy(fx->eng);
    wtok_destroy(fx->tok);
    wdec_rules_free(&fx->rules);
    wmel_destroy(fx->mel);
}

/* The samples of clip NAME: a file of SAMPLES, or "FILE*N", the file N
 * times with one second of silence between (as scripts/gen-whisper-ids.py
 * makes it). */
static float *clip_audio(const char *name, size_t *n)
{
    char path[256];
    int times = 1;
    const char *star = strchr(name, '*');
    if (star)
        times = atoi(star + 1);
    snprintf(path, sizeof(path), SAMPLES "/%.*s", star ? (int)(star - name) : 63, name);
    void *data;
    size_t size;
    char err[256];
    if (bt_mapfile_map(path, path, &data, &size, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    float *pcm = NULL;
    size_t len = 0;
    int rc = waudio_decode(data, size, 0, &pcm, &len, NULL, err, sizeof(err));
    bt_mapfile_unmap(data, size);
    if (rc)
        fail_msg("%s: %s", path, err);
    size_t gap = WMEL_SAMPLE_RATE, all = len * (size_t)times + gap * (size_t)(times - 1);
    float *out = calloc(all, sizeof(float));
    assert_non_null(out);
    for (int i = 0; i < times; i++)
        memcpy(out + (size_t)i * (len + gap), pcm, len * sizeof(float));
    free(pcm);
    *n = all;
    return out;
}

/* The window of the clip's features at frame SEEK, time-major and padded
 * with zeros to n_frames, as faster-whisper cuts it (the features' last
 * frame left out); the clip's frames in *CONTENT (may be NULL). */
static float *window_of(fixture *fx, const char *clip, int seek, int *content)
{
    size_t n = 0;
    float *pcm = clip_audio(clip, &n);
    size_t frames = wmel_frames(n), M = (size_t)fx->s->n_mels, F = (size_t)fx->s->n_frames;
    float *feat = malloc(frames * M * sizeof(float)), *w = calloc(F * M, sizeof(float));
    assert_non_null(feat);
    assert_non_null(w);
    assert_int_equal(wmel_compute(fx->mel, pcm, n, feat), 0);
    size_t frames_in = frames - 1;
    for (size_t t = 0; t < F && (size_t)seek + t < frames_in; t++)
        for (size_t m = 0; m < M; m++)
            w[t * M + m] = feat[m * frames + (size_t)seek + t];
    if (content)
        *content = (int)frames_in;
    free(feat);
    free(pcm);
    return w;
}

static float *window(fixture *fx, const char *clip, int seek)
{
    return window_of(fx, clip, seek, NULL);
}

/* The prompt for English transcription, with or without TIMESTAMPS. */
static int prompt_ts(fixture *fx, int32_t *p, bool timestamps)
{
    const wtok_special *sp = wtok_specials(fx->tok);
    p[0] = sp->sot;
    p[1] = wtok_lang_id(fx->tok, "en");
    p[2] = sp->transcribe;
    p[3] = sp->no_timestamps;
    return timestamps ? 3 : 4;
}

static int prompt(fixture *fx, int32_t *p)
{
    return prompt_ts(fx, p, false);
}

/* Greedy ids of window WIN of the last encode after the NP ids of prompt
 * P, in slot SLOT (the slots below it left out of every step), with or
 * without TIMESTAMPS; with KEEP non-NULL, the filtered logits of step i
 * are kept at KEEP + i * vocab. */
static int greedy_after(fixture *fx, int slot, int win, const int32_t *p, int np, int32_t *out,
                        int max, float *keep, bool timestamps)
{
    int n = 0;
    float *lg = malloc((size_t)fx->s->vocab * sizeof(float) * (size_t)(slot + 2));
    assert_non_null(lg);
    float *row = lg + (size_t)slot * fx->s->vocab, *sot_row = row + fx->s->vocab;
    int sot = 0;
    while (p[sot] != wtok_specials(fx->tok)->sot)
        sot++;
    assert_int_equal(
        weng_prompt(fx->eng, slot, weng_audio(fx->eng, win), p, np, sot, row, sot_row), 0);
    fx->no_speech = wdec_no_speech_prob(&fx->rules, sot_row);
    fx->sum_logprob = 0;
    int32_t lens[8], toks[8];
    for (;;) {
        wdec_filter(&fx->rules, row, out, n, timestamps);
        if (keep)
            memcpy(keep + (size_t)n * fx->s->vocab, row, (size_t)fx->s->vocab * sizeof(float));
        int32_t t = wdec_pick(&fx->rules, row, 0, 0, 0);
        fx->sum_logprob += wdec_logprob(&fx->rules, row, t);
        if (t == wtok_specials(fx->tok)->eot || n == max)
            break;
        out[n++] = t;
        for (int b = 0; b <= slot; b++)
            lens[b] = b == slot ? np + n - 1 : -1, toks[b] = b == slot ? t : 0;
        assert_int_equal(weng_step(fx->eng, toks, lens, slot + 1, lg), 0);
    }
    free(lg);
    return n;
}

static int greedy_ts(fixture *fx, int slot, int win, int32_t *out, int max, float *keep,
                     bool timestamps)
{
    int32_t p[8];
    int np = prompt_ts(fx, p, timestamps);
    return greedy_after(fx, slot, win, p, np, out, max, keep, timestamps);
}

static int greedy(fixture *fx, int slot, int win, int32_t *out, int max, float *keep)
{
    return greedy_ts(fx, slot, win, out, max, keep, false);
}

#define MAX_NEW 224 /* faster-whisper's limit: half the decoder's positions */
#define GAP_MAX 0.5f /* a near tie, as in the transformer's tests (tests/llamacpp) */

static void need_files(void)
{
    if (access(MODEL, R_OK) != 0)
        skip_without_model(MODEL);
    if (access(SAMPLES "/jfk.wav", R_OK) != 0)
        skip_without_model(SAMPLES "/jfk.wav");
}

/* How far below the best logit of ROW token T is. */
static float gap(const float *row, int n, int32_t t)
{
    float best = -INFINITY;
    for (int i = 0; i < n; i++)
        best = row[i] > best ? row[i] : best;
    return best - row[t];
}

/* The near-tie rule: the 8-bit ids GOT (N) and the f32 ids BASE (NB) may
 * part only at a step where the f32 logits (KEEP, one row of V per step)
 * had the 8-bit choice within GAP_MAX of their best, or, for a timestamp
 * the 8-bit side was made to take, had their timestamps together within
 * GAP_MAX of their best text token (the timestamp rule's own tie). */
static void check_near_tie(const fixture *fx, const int32_t *got, int n, const int32_t *base,
                           int nb, const float *keep, size_t V, const char *what)
{
    int at = 0;
    while (at < n && at < nb && got[at] == base[at])
        at++;
    if (at == n && at == nb)
        return;
    int32_t t = at < n ? got[at] : wtok_specials(fx->tok)->eot;
    const float *row = keep + (size_t)at * V;
    float g = gap(row, (int)V, t);
    int32_t tb = wtok_specials(fx->tok)->timestamp_begin;
    if (!(g < GAP_MAX) && t >= tb) {
        /* With timestamps a timestamp is forced when all of them together
         * outweigh the best text token: the 8-bit logits may tip that
         * comparison, a tie of its own, where the f32 logits chose text. */
        float text = -INFINITY;
        for (int32_t i = 0; i < tb; i++)
            text = row[i] > text ? row[i] : text;
        double margin = text - k_logsumexp_ref(row + tb, (int)V - tb);
        print_message("%s: 8-bit and f32 part at token %d: a timestamp %g below f32's best, "
                      "whose timestamps together were %g below its best text\n", what, at,
                      (double)g, margin);
        if (margin >= 0 && margin < GAP_MAX)
            return;
    }
    print_message("%s: 8-bit and f32 part at token %d (gap %g)\n", what, at, (double)g);
    if (!(g < GAP_MAX))
        fail_msg("%s: the 8-bit engine took %d at token %d, %g below f32's best", what, t, at,
                 (double)g);
}

/* Every window of the reference: f32 ids equal faster-whisper's.  With
 * ACT_Q8 the 8-bit engine's ids are compared with the f32 engine's: the
 * first difference must come at a step where the f32 logits had the 8-bit
 * choice within GAP_MAX of their best. */
static void check_clips(int act_q8)
{
    need_files();
    read_wants();
    fixture fx, ref;
    setup(&fx, act_q8, 1);
    if (act_q8)
        setup(&ref, 0, 1);
    size_t V = (size_t)fx.s->vocab;
    float *keep = act_q8 ? malloc((MAX_NEW + 1) * V * sizeof(float)) : NULL;
    int exact = 0;
    for (int i = 0; i < n_wants; i++) {
        want *w = &wants[i];
        float *win = window(&fx, w->clip, w->seek);
        assert_int_equal(weng_encode(fx.eng, win, 1), 0);
        int32_t got[448], base[448];
        int n = greedy(&fx, 0, 0, got, MAX_NEW, NULL), nb = 0;
        if (act_q8) {
            assert_int_equal(weng_encode(ref.eng, win, 1), 0);
            nb = greedy(&ref, 0, 0, base, MAX_NEW, keep);
            char what[300];
            snprintf(what, sizeof(what), "%.64s@%d", w->clip, w->seek);
            check_near_tie(&fx, got, n, base, nb, keep, V, what);
        }
        char *text = NULL;
        size_t len;
        assert_int_equal(wtok_decode(fx.tok, got, (size_t)n, &text, &len), 0);
        print_message("%s@%d: %d ids: %s\n", w->clip, w->seek, n, text);
        free(text);
        int same = 0;
        while (same < n && same < w->n && got[same] == w->ids[same])
            same++;
        if (same == n && n == w->n) {
            exact++;
        } else if (!act_q8) {
            fail_msg("%s@%d: ids differ from faster-whisper's at %d (got %d, want %d)", w->clip,
                     w->seek, same, same < n ? got[same] : -1, same < w->n ? w->ids[same] : -1);
        } else {
            print_message("%s@%d: 8-bit ids differ from faster-whisper's at token %d\n", w->clip,
                          w->seek, same);
        }
        free(win);
    }
    print_message("%d of %d windows equal faster-whisper's f32 ids\n", exact, n_wants);
    free(keep);
    teardown(&fx);
    if (act_q8)
        teardown(&ref);
}

static void test_ids_f32(void **state)
{
    (void)state;
    check_clips(0);
}

static void test_ids_q8(void **state)
{
    (void)state;
    if (device())
        skip_because("8-bit products are the CPU's (WHISPER_TEST_DEVICE is a GPU)");
    check_clips(1);
}

/* One line of whisper-segments.tsv. */
typedef struct seg_line {
    bool window;           /* a window's ids, else a segment */
    char clip[64];
    int k_or_seek;         /* the window's index, or the segment's seek */
    double start, end;
    char text[512];
    int32_t ids[448];
    int n;
} seg_line;

static int read_segment_lines(seg_line *l, int max)
{
    FILE *f = fopen(SEGMENTS, "r");
    assert_non_null(f);
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#')
            continue;
        line[strcspn(line, "\n")] = 0;
        assert_true(n < max);
        seg_line *x = &l[n++];
        memset(x, 0, sizeof(*x));
        char *kind = strtok(line, "\t"), *clip = strtok(NULL, "\t"), *k = strtok(NULL, "\t");
        assert_non_null(k);
        x->window = !strcmp(kind, "window");
        snprintf(x->clip, sizeof(x->clip), "%s", clip);
        x->k_or_seek = atoi(k);
        if (x->window) {
            x->n = ids_of(strtok(NULL, ""), x->ids, (int)(sizeof(x->ids) / sizeof(x->ids[0])));
        } else {
            x->start = atof(strtok(NULL, "\t"));
            x->end = atof(strtok(NULL, "\t"));
            char *text = strtok(NULL, "");
            snprintf(x->text, sizeof(x->text), "%s", text ? text : "");
        }
    }
    fclose(f);
    return n;
}

/* A prompt (previous text) as faster-whisper takes it
 * (tests/unit/data/whisper-prompt.tsv, scripts/gen-whisper-ids.py): the
 * transformer backend's byte-level BPE, built from Whisper's
 * tokenizer.json (bk_text_encoder_open), encodes " " and each prompt
 * stripped into faster-whisper's ids (bk_text_encode_prompt, as the
 * backend does), of which a long prompt keeps faster-whisper's last 223;
 * and the JFK clip's first window, decoded after faster-whisper's
 * whole prompt (start of previous text, the text, then start of
 * transcript...), gives faster-whisper's ids, with and without
 * timestamps. */
static void test_prompt_f32(void **state)
{
    (void)state;
    need_files();
    fixture fx;
    setup(&fx, 0, 1);
    char err[512];
    bk_text_encoder *enc = NULL;
    if (bk_text_encoder_open(DIR, fx.s->vocab, &enc, err, sizeof(err)))
        fail_msg("the tokenizer: %s", err);
    FILE *f = fopen(PROMPTS, "r");
    assert_non_null(f);
    float *win = window(&fx, "jfk.wav", 0);
    assert_int_equal(weng_encode(fx.eng, win, 1), 0);
    char line[8192];
    int encodes = 0, windows = 0;
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#')
            continue;
        char *kind = strtok(line, "\t"), *js = strtok(NULL, "\t");
        assert_non_null(js);
        json_error_t je;
        json_t *str = json_loads(js, JSON_DECODE_ANY, &je);
        assert_true(json_is_string(str));
        const char *text = json_string_value(str);
        size_t len = json_string_length(str);
        int32_t ref[448], got[448];
        if (!strcmp(kind, "encode")) {
            int n = ids_of(strtok(NULL, "\t"), ref, 448);
            int m = bk_text_encode_prompt(enc, text, len, got, 448);
            assert_int_equal(m, n);
            assert_memory_equal(got, ref, (size_t)n * sizeof(int32_t));
            encodes++;
        } else {
            bool ts = atoi(strtok(NULL, "\t")) != 0;
            int32_t p[448];
            char *pids = strtok(NULL, "\t"), *rest = strtok(NULL, "\t");
            int np = ids_of(pids, p, 448), n = ids_of(rest, ref, 448);
            int m = greedy_after(&fx, 0, 0, p, np, got, MAX_NEW, NULL, ts);
            print_message("prompt %.30s%s, timestamps %d: %d prompt ids, %d ids\n", js,
                          strlen(js) > 30 ? "..." : "", ts, np, m);
            assert_int_equal(m, n);
            assert_memory_equal(got, ref, (size_t)n * sizeof(int32_t));
            windows++;
        }
        json_decref(str);
    }
    fclose(f);
    assert_int_equal(encodes, 4);
    assert_int_equal(windows, 6);
    /* The backend keeps the last 223: those of faster-whisper's prompt. */
    f = fopen(PROMPTS, "r");
    assert_non_null(f);
    int longs = 0;
    while (fgets(line, sizeof(line), f)) {
        char *kind = strtok(line, "\t"), *js = strtok(NULL, "\t");
        json_error_t je;
        json_t *str = js && !strcmp(kind, "window") ? json_loads(js, JSON_DECODE_ANY, &je) : NULL;
        if (!str)
            continue;
        bool ts = atoi(strtok(NULL, "\t")) != 0;
        int32_t p[448], got[223];
        int np = ids_of(strtok(NULL, "\t"), p, 448);
        int m = bk_text_encode_prompt(enc, json_string_value(str), json_string_length(str), got,
                                      223);
        /* p: start of previous text, the text, then 3 (4 without
         * timestamps) ids of the start of transcript. */
        assert_int_equal(m, np - 1 - (ts ? 3 : 4));
        assert_memory_equal(got, p + 1, (size_t)m * sizeof(int32_t));
        longs += m == 223;
        json_decref(str);
    }
    fclose(f);
    assert_int_equal(longs, 2);
    free(win);
    bk_text_encoder_close(enc);
    teardown(&fx);
}

/* The prompted windows of test_prompt_f32 on the 8-bit engine: its ids
 * may part from the f32 engine's only at a near tie. */
static void test_prompt_q8(void **state)
{
    (void)state;
    need_files();
    fixture fx, ref;
    setup(&fx, 1, 1);
    setup(&ref, 0, 1);
    size_t V = (size_t)fx.s->vocab;
    float *keep = malloc((MAX_NEW + 1) * V * sizeof(float));
    assert_non_null(keep);
    float *win = window(&fx, "jfk.wav", 0);
    assert_int_equal(weng_encode(fx.eng, win, 1), 0);
    assert_int_equal(weng_encode(ref.eng, win, 1), 0);
    FILE *f = fopen(PROMPTS, "r");
    assert_non_null(f);
    char line[8192];
    int windows = 0;
    while (fgets(line, sizeof(line), f)) {
        char *kind = strtok(line, "\t"), *js = strtok(NULL, "\t");
        if (!js || strcmp(kind, "window") != 0)
            continue;
        bool ts = atoi(strtok(NULL, "\t")) != 0;
        int32_t p[448], got[448], base[448];
        int np = ids_of(strtok(NULL, "\t"), p, 448);
        int n = greedy_after(&fx, 0, 0, p, np, got, MAX_NEW, NULL, ts);
        int nb = greedy_after(&ref, 0, 0, p, np, base, MAX_NEW, keep, ts);
        char what[300];
        snprintf(what, sizeof(what), "prompt %.30s, timestamps %d", js, ts);
        check_near_tie(&fx, got, n, base, nb, keep, V, what);
        windows++;
    }
    fclose(f);
    assert_int_equal(windows, 6);
    free(win);
    free(keep);
    teardown(&ref);
    teardown(&fx);
}

/* Decoding with timestamps, window after window as the backend seeks:
 * every window's ids, the frames the windows start at, and the segments
 * (times, texts, which are left out) equal faster-whisper's. */
static void test_segments_f32(void **state)
{
    (void)state;
    need_files();
    static seg_line want_l[64];
    int n_lines = read_segment_lines(want_l, 64);
    fixture fx;
    setup(&fx, 0, 1);
    int line = 0, clips = 0, seeks_back = 0;
    while (line < n_lines) {
        const char *clip = want_l[line].clip;
        int seek = 0, content = 0, k = 0;
        clips++;
        for (;;) {
            float *win = window_of(&fx, clip, seek, &content);
            if (seek >= content) {
                free(win);
                break;
            }
            assert_int_equal(weng_encode(fx.eng, win, 1), 0);
            free(win);
            int32_t got[448];
            int n = greedy_ts(&fx, 0, 0, got, MAX_NEW, NULL, true);
            seg_line *w = &want_l[line++];
            assert_true(w->window && !strcmp(w->clip, clip) && w->k_or_seek == k);
            int same = 0;
            while (same < n && same < w->n && got[same] == w->ids[same])
                same++;
            if (same != n || n != w->n)
                fail_msg("%s window %d (frame %d): ids differ from faster-whisper's at %d (got "
                         "%d, want %d)", clip, k, seek, same, same < n ? got[same] : -1,
                         same < w->n ? w->ids[same] : -1);
            /* The segments come after all of the clip's windows. */
            int size = content - seek < fx.s->n_frames ? content - seek : fx.s->n_frames, next;
            wdec_segment seg[MAX_NEW + 1];
            int ns = wdec_split(&fx.rules, got, n, seek, size, true, seg, &next);
            static struct {
                int seek;
                double start, end;
                char *text;
            } mine[64];
            static int n_mine;
            if (k == 0)
                n_mine = 0;
            for (int i = 0; i < ns; i++) {
                char *text;
                size_t len;
                assert_int_equal(wtok_decode(fx.tok, got + seg[i].first, (size_t)seg[i].count,
                                             &text, &len), 0);
                if (!wdec_segment_shown(&seg[i], text, len)) {
                    free(text);
                    continue;
                }
                mine[n_mine].seek = seek, mine[n_mine].start = seg[i].start;
                mine[n_mine].end = seg[i].end, mine[n_mine].text = text;
                n_mine++;
            }
            assert_true(next > seek || next >= content);
            seeks_back += next < seek + size;
            print_message("%s window %d at frame %d: %d ids, %d segments, next at %d\n", clip, k,
                          seek, n, ns, next);
            seek = next, k++;
            if (seek >= content) {
                for (int i = 0; i < n_mine; i++) {
                    seg_line *e = &want_l[line++];
                    assert_false(e->window);
                    assert_string_equal(e->clip, clip);
                    assert_int_equal(mine[i].seek, e->k_or_seek);
                    assert_true(fabs(mine[i].start - e->start) < 0.005);
                    assert_true(fabs(mine[i].end - e->end) < 0.005);
                    assert_string_equal(mine[i].text, e->text);
                    free(mine[i].text);
                }
                /* No segment of faster-whisper's is missing. */
                assert_true(line >= n_lines || want_l[line].window);
                break;
            }
        }
    }
    assert_int_equal(clips, 2);
    /* The long clip's first window ends inside speech. */
    assert_true(seeks_back >= 1);
    teardown(&fx);
}

/* The numbers faster-whisper judges a window by (its temperature fallback,
 * its skipping of silent windows, and verbose_json's segments), for every
 * window of tests/unit/data/whisper-scores.tsv, with and without
 * timestamps: the average log probability of the window's tokens (their
 * sum, the end of text's included, over their count + 1, from the filtered
 * logits), the compression ratio of its text, and the probability of no
 * speech at its start of transcript. */
static void test_scores_f32(void **state)
{
    (void)state;
    need_files();
    FILE *f = fopen(SCORES, "r");
    assert_non_null(f);
    fixture fx;
    setup(&fx, 0, 1);
    char line[512];
    int lines = 0, failing = 0;
    while (fgets(line, sizeof(line), f)) {
        char clip[64];
        int ts, seek;
        double avg, cr, ns;
        if (line[0] == '#')
            continue;
        assert_int_equal(sscanf(line, "scores\t%63s\t%d\t%d\t%lf\t%lf\t%lf", clip, &ts, &seek,
                                &avg, &cr, &ns), 6);
        float *win = window(&fx, clip, seek);
        assert_int_equal(weng_encode(fx.eng, win, 1), 0);
        free(win);
        int32_t got[448];
        int n = greedy_ts(&fx, 0, 0, got, MAX_NEW, NULL, ts);
        char *text = NULL;
        size_t len = 0;
        assert_int_equal(wtok_decode(fx.tok, got, (size_t)n, &text, &len), 0);
        double my_avg = fx.sum_logprob / (n + 1), my_cr = wdec_compression_ratio(text, len);
        print_message("%s ts %d @%d: avg_logprob %.6f (%.6f), compression %.6f (%.6f), "
                      "no_speech %.6f (%.6f)\n", clip, ts, seek, my_avg, avg, my_cr, cr,
                      fx.no_speech, ns);
        free(text);
        assert_true(fabs(my_avg - avg) < 5e-4);
        assert_true(fabs(my_cr - cr) < 1e-6);
        assert_true(fabs(fx.no_speech - ns) < 1e-3);
        failing += my_cr > 2.4; /* faster-whisper's threshold */
        lines++;
    }
    fclose(f);
    assert_int_equal(lines, 6);
    /* A window that would fall back is among them. */
    assert_true(failing >= 1);
    teardown(&fx);
}

/* Two windows encoded in one run and decoded in slots 0 and 1 stepped
 * together give the ids each gives alone, in slot 0 with one window. */
static void test_slots(void **state)
{
    (void)state;
    need_files();
    fixture fx;
    setup(&fx, 0, 2);
    size_t one = (size_t)fx.s->n_frames * fx.s->n_mels;
    float *a = window(&fx, "jfk.wav", 0), *b = window(&fx, "jfk.wav", 250);
    float *both = malloc(2 * one * sizeof(float));
    assert_non_null(both);
    memcpy(both, a, one * sizeof(float));
    memcpy(both + one, b, one * sizeof(float));
    int32_t alone[2][MAX_NEW], together[2][MAX_NEW];
    int na[2], nt[2] = {0, 0};
    for (int w = 0; w < 2; w++) {
        assert_int_equal(weng_encode(fx.eng, w ? b : a, 1), 0);
        na[w] = greedy(&fx, 0, 0, alone[w], MAX_NEW, NULL);
    }
    /* Both windows in one encoder run, both slots in every step. */
    assert_int_equal(weng_encode(fx.eng, both, 2), 0);
    int32_t p[8], lens[2], toks[2];
    int np = prompt(&fx, p);
    size_t V = (size_t)fx.s->vocab;
    float *lg = malloc(2 * V * sizeof(float));
    assert_non_null(lg);
    assert_int_equal(weng_prompt(fx.eng, 0, weng_audio(fx.eng, 0), p, np, 0, lg, NULL), 0);
    assert_int_equal(weng_prompt(fx.eng, 1, weng_audio(fx.eng, 1), p, np, 0, lg + V, NULL), 0);
    bool done[2] = {false, false};
    const int32_t eot = wtok_specials(fx.tok)->eot;
    while (!done[0] || !done[1]) {
        for (int w = 0; w < 2; w++) {
            lens[w] = -1, toks[w] = 0;
            if (done[w])
                continue;
            wdec_filter(&fx.rules, lg + w * V, together[w], nt[w], false);
            int32_t t = wdec_pick(&fx.rules, lg + w * V, 0, 0, 0);
            if (t == eot || nt[w] == MAX_NEW) {
                done[w] = true;
                continue;
            }
            together[w][nt[w]++] = t;
            lens[w] = np + nt[w] - 1, toks[w] = t;
        }
        if (!done[0] || !done[1])
            assert_int_equal(weng_step(fx.eng, toks, lens, 2, lg), 0);
    }
    for (int w = 0; w < 2; w++) {
        assert_int_equal(nt[w], na[w]);
        assert_memory_equal(together[w], alone[w], (size_t)na[w] * sizeof(int32_t));
    }
    assert_true(na[0] > 10 && na[1] > 5);
    assert_true(na[0] != na[1] || memcmp(alone[0], alone[1], (size_t)na[0] * 4) != 0);
    free(a), free(b), free(both), free(lg);
    teardown(&fx);
}

/* Bad calls are refused, not run. */
static void test_bad_calls(void **state)
{
    (void)state;
    need_files();
    fixture fx;
    setup(&fx, 0, 1);
    int32_t t[2] = {1, 2}, lens[2] = {0, 0};
    float *w = window(&fx, "jfk.wav", 0);
    assert_null(weng_audio(fx.eng, 0));                                 /* nothing encoded */
    assert_int_equal(weng_encode(fx.eng, w, 2), BT_EINVAL);             /* one slot */
    assert_int_equal(weng_encode(fx.eng, w, 1), 0);
    const float *a = weng_audio(fx.eng, 0);
    assert_non_null(a);
    assert_null(weng_audio(fx.eng, 1));                                 /* no window 1 */
    assert_int_equal(weng_prompt(fx.eng, 1, a, t, 1, 0, NULL, NULL), BT_EINVAL); /* no slot 1 */
    assert_int_equal(weng_prompt(fx.eng, 0, NULL, t, 1, 0, NULL, NULL), BT_EINVAL);
    assert_int_equal(weng_prompt(fx.eng, 0, a, t, MAX_PROMPT + 1, 0, NULL, NULL), BT_EINVAL);
    assert_int_equal(weng_prompt(fx.eng, 0, a, t, 1, 1, NULL, NULL), BT_EINVAL); /* SOT past */
    assert_int_equal(weng_step(fx.eng, t, lens, 2, NULL), BT_EINVAL);
    lens[0] = weng_ctx(fx.eng);
    assert_int_equal(weng_step(fx.eng, t, lens, 1, NULL), BT_ERANGE); /* cache full */
    free(w);
    teardown(&fx);
    /* A file that is no Whisper model. */
    char err[512];
    weng *e = NULL;
    weng_opts o = {NULL, 1, 0, 1, 8};
    assert_int_equal(weng_create(DIR "/config.json", &o, &e, err, sizeof(err)), BT_EFORMAT);
    assert_null(e);
    assert_non_null(strstr(err, "config.json"));
    o.slots = 0;
    assert_int_equal(weng_create(MODEL, &o, &e, err, sizeof(err)), BT_EINVAL);
}

int main(void)
{
    /* WHISPER_TEST_FILTER runs the tests whose names match (the emulated
     * GPU runs one: it is slow). */
    const char *filter = getenv("WHISPER_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids_f32),
        cmocka_unit_test(test_ids_q8),
        cmocka_unit_test(test_segments_f32),
        cmocka_unit_test(test_prompt_f32),
        cmocka_unit_test(test_prompt_q8),
        cmocka_unit_test(test_scores_f32),
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_bad_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
