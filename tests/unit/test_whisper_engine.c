/* Whisper's encoder and decoder (backends/whisper/wengine.c, wmodel.c,
 * wdecode.c) on Whisper base against faster-whisper: for each clip of
 * tests/unit/data/whisper-ids.tsv (written by scripts/gen-whisper-ids.py
 * with faster-whisper and CTranslate2 in float32), the audio is decoded,
 * its log-mel windows computed, encoded, and decoded greedily with
 * faster-whisper's rules; the ids must equal faster-whisper's, with f32
 * activations.  With 8-bit products (the CPU's fast path) the ids may
 * differ only where the f32 logits were at a near tie, by the rule of the
 * transformer's tests.  And slots: two sequences stepped together give the
 * ids each gives alone.
 *
 * WHISPER_TEST_DEVICE=cuda:0 runs the engine on that device (the CUDA
 * emulator in make test), f32 only. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/skip.h"

#include "backends/whisper/audio.h"
#include "backends/whisper/mel.h"
#include "backends/whisper/wdecode.h"
#include "backends/whisper/wengine.h"
#include "backends/whisper/wtok.h"
#include "common/mapfile.h"
#include "kernels/exec.h"

#define DIR "models/whisper-base"
#define MODEL DIR "/model.bin"
#define IDS "tests/unit/data/whisper-ids.tsv"
#define SAMPLES "models/samples"

typedef struct want {
    char clip[64];
    int seek;
    int32_t ids[448];
    int n;
} want;

static want wants[64];
static int n_wants;

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
        w->n = 0;
        for (char *p = strtok(ids, " "); p; p = strtok(NULL, " "))
            w->ids[w->n++] = (int32_t)atoi(p);
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
} fixture;

static void setup(fixture *fx, int act_q8, int slots)
{
    char err[512];
    weng_opts o = {device(), 2, act_q8, slots, 64};
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

/* The window of the clip's features at frame SEEK, time-major and padded
 * with zeros to n_frames, as faster-whisper cuts it (the features' last
 * frame left out). */
static float *window(fixture *fx, const char *clip, int seek)
{
    char path[256];
    snprintf(path, sizeof(path), SAMPLES "/%.63s", clip);
    void *data;
    size_t size;
    char err[256];
    if (bt_mapfile_map(path, path, &data, &size, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    float *pcm = NULL;
    size_t n = 0;
    int rc = waudio_decode(data, size, 0, &pcm, &n, NULL, err, sizeof(err));
    bt_mapfile_unmap(data, size);
    if (rc)
        fail_msg("%s: %s", path, err);
    size_t frames = wmel_frames(n), M = (size_t)fx->s->n_mels, F = (size_t)fx->s->n_frames;
    float *feat = malloc(frames * M * sizeof(float)), *w = calloc(F * M, sizeof(float));
    assert_non_null(feat);
    assert_non_null(w);
    assert_int_equal(wmel_compute(fx->mel, pcm, n, feat), 0);
    size_t content = frames - 1;
    for (size_t t = 0; t < F && (size_t)seek + t < content; t++)
        for (size_t m = 0; m < M; m++)
            w[t * M + m] = feat[m * frames + (size_t)seek + t];
    free(feat);
    free(pcm);
    return w;
}

/* The prompt for English transcription without timestamps. */
static int prompt(fixture *fx, int32_t *p)
{
    const wtok_special *sp = wtok_specials(fx->tok);
    p[0] = sp->sot;
    p[1] = wtok_lang_id(fx->tok, "en");
    p[2] = sp->transcribe;
    p[3] = sp->no_timestamps;
    return 4;
}

/* Greedy ids of window W (already encoded as window WIN) in slot SLOT;
 * with F32_LOGITS non-NULL, the logits of each step are kept there. */
static int greedy(fixture *fx, int slot, int win, int32_t *out, int max, float **keep)
{
    int32_t p[8];
    int np = prompt(fx, p), n = 0;
    float *lg = malloc((size_t)fx->s->vocab * sizeof(float) * (size_t)(slot + 1));
    assert_non_null(lg);
    float *row = lg + (size_t)slot * fx->s->vocab;
    assert_int_equal(weng_prompt(fx->eng, slot, win, p, np, row), 0);
    int32_t lens[8], toks[8];
    for (;;) {
        if (keep)
            memcpy(keep[n], row, (size_t)fx->s->vocab * sizeof(float));
        wdec_filter(&fx->rules, row, out, n, false);
        int32_t t = wdec_pick(&fx->rules, row, 0, 0, 0);
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

static void check_clips(int act_q8)
{
    if (access(MODEL, R_OK) != 0)
        skip_without_model(MODEL);
    if (access(SAMPLES "/jfk.wav", R_OK) != 0)
        skip_without_model(SAMPLES "/jfk.wav");
    read_wants();
    fixture fx;
    setup(&fx, act_q8, 1);
    int exact = 0;
    for (int i = 0; i < n_wants; i++) {
        want *w = &wants[i];
        float *win = window(&fx, w->clip, w->seek);
        assert_int_equal(weng_encode(fx.eng, win, 1), 0);
        int32_t got[448];
        int n = greedy(&fx, 0, 0, got, 224, NULL);
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
    print_message("%d of %d windows exact\n", exact, n_wants);
    teardown(&fx);
}

static void test_ids_f32(void **state)
{
    (void)state;
    check_clips(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids_f32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
