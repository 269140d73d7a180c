/* Audio files to 16 kHz mono (backends/whisper/audio.c).  The files are
 * written here, in memory, by libsndfile itself: WAV, FLAC, OGG Vorbis and
 * MP3 at several rates and channel counts, each holding a 1 kHz tone.
 * After decoding, the length is the duration at 16 kHz and the tone is
 * where it was (most of the energy at 1 kHz, measured by a Goertzel
 * filter); a 16 kHz 16-bit WAV gives its samples exactly.  Then the
 * refusals: empty, not audio, too long. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sndfile.h>

#include "tests/unit/skip.h"

#include "backends/whisper/audio.h"

/* A growable in-memory file that libsndfile writes to. */
typedef struct wfile {
    uint8_t *p;
    sf_count_t len, pos, cap;
} wfile;

static sf_count_t w_len(void *u) { return ((wfile *)u)->len; }
static sf_count_t w_tell(void *u) { return ((wfile *)u)->pos; }

static sf_count_t w_seek(sf_count_t off, int whence, void *u)
{
    wfile *f = u;
    sf_count_t to = (whence == SEEK_CUR ? f->pos : whence == SEEK_END ? f->len : 0) + off;
    if (to < 0)
        return -1;
    f->pos = to;
    return to;
}

static sf_count_t w_read(void *buf, sf_count_t n, void *u)
{
    wfile *f = u;
    if (n > f->len - f->pos)
        n = f->len - f->pos;
    if (n <= 0)
        return 0;
    memcpy(buf, f->p + f->pos, (size_t)n);
    f->pos += n;
    return n;
}

static sf_count_t w_write(const void *buf, sf_count_t n, void *u)
{
    wfile *f = u;
    if (f->pos + n > f->cap) {
        f->cap = (f->pos + n) * 2;
        f->p = realloc(f->p, (size_t)f->cap);
        assert_non_null(f->p);
    }
    if (f->pos > f->len)
        memset(f->p + f->len, 0, (size_t)(f->pos - f->len));
    memcpy(f->p + f->pos, buf, (size_t)n);
    f->pos += n;
    if (f->pos > f->len)
        f->len = f->pos;
    return n;
}

/* A file of FORMAT, RATE and CHANNELS holding SECONDS of a 1 kHz tone of
 * amplitude 0.5 in every channel; *LEN its bytes.  NULL when this
 * libsndfile cannot write the format. */
static uint8_t *make_file(int format, int rate, int channels, double seconds, size_t *len)
{
    wfile f = {0};
    SF_VIRTUAL_IO io = {w_len, w_seek, w_read, w_write, w_tell};
    SF_INFO info = {.samplerate = rate, .channels = channels, .format = format};
    SNDFILE *sf = sf_open_virtual(&io, SFM_WRITE, &info, &f);
    if (!sf) {
        free(f.p);
        return NULL;
    }
    sf_count_t n = (sf_count_t)(seconds * rate);
    float *buf = malloc((size_t)n * (size_t)channels * sizeof(*buf));
    assert_non_null(buf);
    for (sf_count_t i = 0; i < n; i++)
        for (int c = 0; c < channels; c++)
            buf[i * channels + c] = 0.5f * (float)sin(2 * M_PI * 1000.0 * (double)i / rate);
    assert_int_equal(sf_writef_float(sf, buf, n), n);
    sf_close(sf);
    free(buf);
    *len = (size_t)f.len;
    return f.p;
}

/* The share of X's energy at FREQ Hz (16 kHz samples), by a Goertzel
 * filter over a window of whole periods in the middle. */
static double tone_share(const float *x, size_t n, double freq)
{
    size_t start = n / 4, len = n / 2;
    len -= len % 16;  /* 1 kHz at 16 kHz: 16 samples a period */
    double w = 2 * M_PI * freq / WAUDIO_RATE, coeff = 2 * cos(w), s1 = 0, s2 = 0, energy = 0;
    for (size_t i = start; i < start + len; i++) {
        double s0 = x[i] + coeff * s1 - s2;
        s2 = s1;
        s1 = s0;
        energy += (double)x[i] * x[i];
    }
    double power = s1 * s1 + s2 * s2 - coeff * s1 * s2;
    return energy > 0 ? 2.0 * power / ((double)len * energy) : 0;
}

/* FORMAT must be writable unless OPTIONAL (MP3 needs a libsndfile of 1.1
 * or later built with LAME; Debian 12's is). */
static void check_tone(int format, int rate, int channels, const char *name, int optional)
{
    size_t len;
    uint8_t *file = make_file(format, rate, channels, 1.0, &len);
    if (!file && optional)
        skip_because("this libsndfile cannot write %s", name);
    if (!file)
        fail_msg("libsndfile cannot write %s", name);
    float *pcm;
    size_t n;
    waudio_info info;
    char err[256];
    int rc = waudio_decode(file, len, 0, &pcm, &n, &info, err, sizeof(err));
    if (rc)
        fail_msg("%s: %s", name, err);
    assert_int_equal(info.rate, rate);
    assert_int_equal(info.channels, channels);
    /* Lossy coders pad a little (an MP3 frame is 1152 samples). */
    double want = 16000.0;
    double slack = (format & SF_FORMAT_TYPEMASK) == SF_FORMAT_MPEG ? 1200.0 : 2.0;
    double share = tone_share(pcm, n, 1000.0);
    print_message("%s, %d Hz, %d ch (%s): %zu samples, %.4f of the energy at 1 kHz\n", name,
                  rate, channels, info.format, n, share);
    if (fabs((double)n - want) > slack)
        fail_msg("%s: %zu samples, expected %.0f", name, n, want);
    assert_true(share > 0.99);
    free(pcm);
    free(file);
}

static void test_formats(void **state)
{
    (void)state;
    check_tone(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 44100, 2, "WAV 16-bit", 0);
    check_tone(SF_FORMAT_WAV | SF_FORMAT_FLOAT, 8000, 1, "WAV float", 0);
    check_tone(SF_FORMAT_WAV | SF_FORMAT_PCM_24, 96000, 6, "WAV 24-bit", 0);
    check_tone(SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 48000, 1, "FLAC", 0);
    check_tone(SF_FORMAT_OGG | SF_FORMAT_VORBIS, 22050, 2, "OGG Vorbis", 0);
}

static void test_mp3(void **state)
{
    (void)state;
    check_tone(SF_FORMAT_MPEG | SF_FORMAT_MPEG_LAYER_III, 44100, 1, "MP3", 1);
}

/* 16 kHz, mono, 16-bit: no resampling, each sample is the integer / 32768,
 * as faster-whisper reads it. */
static void test_exact_16k(void **state)
{
    (void)state;
    wfile f = {0};
    SF_VIRTUAL_IO io = {w_len, w_seek, w_read, w_write, w_tell};
    SF_INFO si = {.samplerate = 16000, .channels = 1, .format = SF_FORMAT_WAV | SF_FORMAT_PCM_16};
    SNDFILE *sf = sf_open_virtual(&io, SFM_WRITE, &si, &f);
    assert_non_null(sf);
    short s[1000];
    for (int i = 0; i < 1000; i++)
        s[i] = (short)((i * 7919) % 65536 - 32768);
    assert_int_equal(sf_write_short(sf, s, 1000), 1000);
    sf_close(sf);
    float *pcm;
    size_t n;
    char err[256];
    assert_int_equal(waudio_decode(f.p, (size_t)f.len, 0, &pcm, &n, NULL, err, sizeof(err)), 0);
    assert_int_equal(n, 1000);
    for (int i = 0; i < 1000; i++)
        assert_true(pcm[i] == (float)s[i] / 32768.0f);
    free(pcm);
    /* A limit of exactly its length passes; one sample less is refused. */
    assert_int_equal(waudio_decode(f.p, (size_t)f.len, 1000, &pcm, &n, NULL, err, sizeof(err)), 0);
    free(pcm);
    assert_int_equal(waudio_decode(f.p, (size_t)f.len, 999, &pcm, &n, NULL, err, sizeof(err)),
                     BT_ERANGE);
    assert_null(pcm);
    free(f.p);
}

static void test_refusals(void **state)
{
    (void)state;
    float *pcm = (float *)1;
    size_t n = 7;
    char err[256];
    assert_int_equal(waudio_decode("", 0, 0, &pcm, &n, NULL, err, sizeof(err)), BT_EINVAL);
    assert_string_equal(err, "the file is empty");
    assert_null(pcm);
    assert_int_equal(n, 0);
    const char text[] = "this is a text file, not audio at all; it goes on for a while.";
    assert_int_equal(waudio_decode(text, sizeof(text), 0, &pcm, &n, NULL, err, sizeof(err)),
                     BT_EINVAL);
    assert_non_null(strstr(err, "not audio"));
    /* 2 s at 44.1 kHz against a limit of 1 s: refused, saying the limit,
     * both when the header tells (WAV) and while resampling. */
    size_t len;
    uint8_t *file = make_file(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 44100, 1, 2.0, &len);
    assert_non_null(file);
    int rc = waudio_decode(file, len, 16000, &pcm, &n, NULL, err, sizeof(err));
    assert_int_equal(rc, BT_ERANGE);
    assert_non_null(strstr(err, "longer than the limit of 1.0 s"));
    /* A WAV cut in the middle of its data decodes what is there. */
    waudio_info info;
    rc = waudio_decode(file, len / 2, 0, &pcm, &n, &info, err, sizeof(err));
    if (rc == 0) {
        assert_true(n > 10000 && n < 32000);
        free(pcm);
    } else {
        assert_true(err[0] != '\0');
    }
    /* A header alone, no samples. */
    uint8_t *empty = make_file(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16000, 1, 0.0, &len);
    assert_non_null(empty);
    assert_int_equal(waudio_decode(empty, len, 0, &pcm, &n, NULL, err, sizeof(err)), BT_EINVAL);
    assert_non_null(strstr(err, "holds no samples"));
    free(empty);
    free(file);
}

/* The limit while resampling: 2 s at 44.1 kHz are 32000 samples at 16
 * kHz.  A limit of 31999 passes the header's check (which allows one
 * sample of rounding) and is caught by the resampler's output; a limit of
 * 32000 passes, the last samples coming at the flush. */
static void test_limit_while_resampling(void **state)
{
    (void)state;
    size_t len;
    uint8_t *file = make_file(SF_FORMAT_WAV | SF_FORMAT_PCM_16, 44100, 1, 2.0, &len);
    assert_non_null(file);
    float *pcm;
    size_t n;
    char err[256];
    int rc = waudio_decode(file, len, 31999, &pcm, &n, NULL, err, sizeof(err));
    assert_int_equal(rc, BT_ERANGE);
    assert_non_null(strstr(err, "longer than the limit of 2.0 s"));
    assert_null(pcm);
    rc = waudio_decode(file, len, 32000, &pcm, &n, NULL, err, sizeof(err));
    if (rc)
        fail_msg("%s", err);
    assert_int_equal(n, 32000);
    free(pcm);
    free(file);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_mp3),
        cmocka_unit_test(test_exact_16k),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_limit_while_resampling),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
