/* Whisper's log-mel features (backends/whisper/mel.c) against faster-whisper's
 * feature extractor: tests/unit/data/whisper_mel_reference.bin holds fixed
 * signals and the features faster-whisper computed for them
 * (scripts/gen-whisper-mel-reference.py), and whisper-mel-es.bin those of
 * a spoken clip, es-weather.flac, read from its file on both sides
 * (scripts/gen-whisper-ids.py); every value must be within 1e-5 (5e-5 for
 * the clip).  Also the filterbank's shape, the frame count, and the
 * refusals. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backends/whisper/audio.h"
#include "backends/whisper/mel.h"

#define REFERENCE "tests/unit/data/whisper_mel_reference.bin"
#define CLIP "tests/unit/data/es-weather.flac"
#define CLIP_REFERENCE "tests/unit/data/whisper-mel-es.bin"
/* faster-whisper's promise is 1e-4; 2.5e-6 was measured, so a drift of
 * the arithmetic shows long before that. */
#define TOLERANCE 1e-5
/* Speech reaches larger values, and FFTW's plan (which may differ from one
 * CPU to another) moves its last bits: 9.3e-6 was measured on the clip. */
#define CLIP_TOLERANCE 5e-5

/* The whole reference file, and a cursor over it. */
static uint8_t *ref;
static size_t ref_len, ref_off;

static uint32_t take_u32(void)
{
    assert_true(ref_len - ref_off >= 4);
    uint32_t v;
    memcpy(&v, ref + ref_off, 4);
    ref_off += 4;
    return v;
}

/* N floats at the cursor, copied out (the file does not align them). */
static float *take_floats(size_t n)
{
    assert_true((ref_len - ref_off) / 4 >= n);
    float *p = malloc(n * sizeof(*p) + 1);
    assert_non_null(p);
    memcpy(p, ref + ref_off, n * sizeof(*p));
    ref_off += n * sizeof(*p);
    return p;
}

/* The bytes of file PATH, malloc'd, in *LEN; NULL when it cannot be read. */
static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s (run from the repository root)\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(*len + 1);
    size_t got = p ? fread(p, 1, *len, f) : 0;
    fclose(f);
    if (got != *len) {
        free(p);
        return NULL;
    }
    return p;
}

static int setup(void **state)
{
    (void)state;
    return (ref = slurp(REFERENCE, &ref_len)) ? 0 : -1;
}

/* The largest difference between GOT and WANT (BANDS x FRAMES), printed
 * and failed over TOL. */
static void compare(const char *name, const float *got, const float *want, uint32_t bands,
                    uint32_t frames, size_t samples, double tol)
{
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < (size_t)bands * frames; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d > worst) {
            worst = d;
            at = i;
        }
    }
    print_message("%s: %zu samples, %u frames, largest difference %.2e (band %zu, frame %zu)\n",
                  name, samples, frames, worst, at / frames, at % frames);
    if (worst > tol)
        fail_msg("%s: band %zu frame %zu: %.6f, faster-whisper %.6f", name, at / frames,
                 at % frames, got[at], want[at]);
}

static int teardown(void **state)
{
    (void)state;
    free(ref);
    return 0;
}

static void test_against_faster_whisper(void **state)
{
    (void)state;
    wmel *m;
    assert_int_equal(wmel_create(80, &m), 0);
    ref_off = 0;
    assert_memory_equal(ref, "WMELREF1", 8);
    ref_off = 8;
    uint32_t cases = take_u32();
    assert_int_equal(cases, 4);
    for (uint32_t c = 0; c < cases; c++) {
        uint32_t name_len = take_u32();
        assert_true(name_len < 64 && ref_len - ref_off >= name_len);
        char name[64];
        memcpy(name, ref + ref_off, name_len);
        name[name_len] = '\0';
        ref_off += name_len;
        uint32_t n = take_u32();
        float *pcm = take_floats(n);
        uint32_t bands = take_u32(), frames = take_u32();
        assert_int_equal(bands, 80);
        assert_int_equal(frames, wmel_frames(n));
        float *want = take_floats((size_t)bands * frames);
        float *got = malloc((size_t)bands * frames * sizeof(*got));
        assert_non_null(got);
        assert_int_equal(wmel_compute(m, pcm, n, got), 0);
        compare(name, got, want, bands, frames, n, TOLERANCE);
        free(got);
        free(want);
        free(pcm);
    }
    assert_int_equal(ref_off, ref_len);
    wmel_destroy(m);
}

/* Speech, from a FLAC file as the backend reads it (libsndfile; 16-bit
 * samples at 16 kHz, so no resampling): faster-whisper's features of the
 * same file. */
static void test_speech_clip(void **state)
{
    (void)state;
    size_t len, clip_len, n;
    uint8_t *want = slurp(CLIP_REFERENCE, &len), *clip = slurp(CLIP, &clip_len);
    assert_non_null(want);
    assert_non_null(clip);
    assert_true(len >= 16);
    assert_memory_equal(want, "WMELCLP1", 8);
    uint32_t bands, frames;
    memcpy(&bands, want + 8, 4);
    memcpy(&frames, want + 12, 4);
    assert_int_equal(bands, 80);
    assert_int_equal(len, 16 + (size_t)bands * frames * 4);
    float *pcm = NULL, *feats = malloc((size_t)bands * frames * sizeof(float));
    float *ref_feats = malloc((size_t)bands * frames * sizeof(float));
    assert_non_null(feats);
    assert_non_null(ref_feats);
    memcpy(ref_feats, want + 16, (size_t)bands * frames * sizeof(float));
    char err[256];
    assert_int_equal(waudio_decode(clip, clip_len, 0, &pcm, &n, NULL, err, sizeof(err)), 0);
    assert_int_equal(frames, wmel_frames(n));
    wmel *m;
    assert_int_equal(wmel_create(80, &m), 0);
    assert_int_equal(wmel_compute(m, pcm, n, feats), 0);
    compare(CLIP, feats, ref_feats, bands, frames, n, CLIP_TOLERANCE);
    wmel_destroy(m);
    free(pcm);
    free(feats);
    free(ref_feats);
    free(clip);
    free(want);
}

/* The filterbank: 80 triangles, each non-negative and non-zero, peaks
 * rising with the band, nothing above 8 kHz; Slaney's normalisation gives
 * each triangle an area of about 1 (in Hz, times its 2/width scale: the
 * sum of weights times the bin width, 40 Hz, is about 1). */
static void test_filters(void **state)
{
    (void)state;
    wmel *m;
    assert_int_equal(wmel_create(80, &m), 0);
    assert_int_equal(wmel_n_mels(m), 80);
    const float *w = wmel_filters(m);
    int last_peak = -1;
    for (int b = 0; b < 80; b++) {
        const float *row = w + (size_t)b * WMEL_BINS;
        int peak = 0;
        double sum = 0;
        for (int k = 0; k < WMEL_BINS; k++) {
            assert_true(row[k] >= 0);
            sum += row[k];
            if (row[k] > row[peak])
                peak = k;
        }
        assert_true(sum > 0);
        assert_true(peak >= last_peak);
        last_peak = peak;
        /* Wide bands hold several bins, and their area is near 1. */
        if (b >= 40)
            assert_true(fabs(sum * 40.0 - 1.0) < 0.2);
    }
    assert_int_equal(wmel_frames(480000), 3001);
    assert_int_equal(wmel_frames(479999), 3000);
    assert_int_equal(wmel_frames(1), 1);
    wmel_destroy(m);
}

static void test_refusals(void **state)
{
    (void)state;
    wmel *m = (wmel *)1;
    assert_int_equal(wmel_create(0, &m), BT_EINVAL);
    assert_null(m);
    assert_int_equal(wmel_create(257, &m), BT_EINVAL);
    assert_int_equal(wmel_create(128, &m), 0);
    float x = 0, out[128];
    assert_int_equal(wmel_compute(m, &x, 0, out), BT_EINVAL);
    /* One sample of silence: every value is the clamp, (-10 + 4) / 4. */
    assert_int_equal(wmel_compute(m, &x, 1, out), 0);
    for (int i = 0; i < 128; i++)
        assert_float_equal(out[i], -1.5f, 1e-6);
    wmel_destroy(m);
    wmel_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_faster_whisper),
        cmocka_unit_test(test_speech_clip),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
