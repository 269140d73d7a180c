/* Audio files to 16 kHz mono f32 (audio.h): libsndfile reads the file
 * through a virtual I/O over the caller's bytes, blocks of frames are
 * averaged into one channel, and a streaming libsoxr resampler turns them
 * into 16 kHz, so that memory grows with the output only. */
#include "backends/whisper/audio.h"

#include <sndfile.h>
#include <soxr.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK_FRAMES 4096
#define MAX_CHANNELS 64
#define MIN_RATE 1000    /* Hz */
#define MAX_RATE 768000  /* Hz */

/* The caller's bytes as a read-only file for libsndfile. */
typedef struct memfile {
    const uint8_t *p;
    sf_count_t len;  /* bytes */
    sf_count_t pos;  /* bytes */
} memfile;

static sf_count_t mem_len(void *user) { return ((memfile *)user)->len; }
static sf_count_t mem_tell(void *user) { return ((memfile *)user)->pos; }

static sf_count_t mem_seek(sf_count_t off, int whence, void *user)
{
    memfile *m = user;
    sf_count_t base = whence == SEEK_CUR ? m->pos : whence == SEEK_END ? m->len : 0;
    /* Checked before the sum: a hostile header's offset may be near the
     * limits of the type. */
    if (off > m->len - base || off < -base)
        return -1;
    m->pos = base + off;
    return m->pos;
}

static sf_count_t mem_read(void *buf, sf_count_t n, void *user)
{
    memfile *m = user;
    sf_count_t left = m->len - m->pos;
    if (n > left)
        n = left;
    if (n > 0) {
        memcpy(buf, m->p + m->pos, (size_t)n);
        m->pos += n;
    }
    return n;
}

static sf_count_t mem_write(const void *buf, sf_count_t n, void *user)
{
    (void)buf, (void)n, (void)user;
    return 0;
}

/* The output, grown as samples come. */
typedef struct sink {
    float *p;     /* owned until handed out */
    size_t n;     /* samples */
    size_t cap;   /* samples */
    size_t max;   /* samples; 0: none */
} sink;

/* Room for N more samples; BT_ERANGE past the limit. */
static int sink_reserve(sink *s, size_t n)
{
    if (s->max && s->n + n > s->max)
        return BT_ERANGE;
    if (s->n + n <= s->cap)
        return 0;
    size_t cap = s->cap ? s->cap : 16000;
    while (cap < s->n + n)
        cap *= 2;
    if (s->max && cap > s->max)
        cap = s->max;
    float *p = realloc(s->p, cap * sizeof(*p));
    if (!p)
        return BT_ENOMEM;
    s->p = p;
    s->cap = cap;
    return 0;
}

static int too_long(char *err, size_t errlen, size_t max, const waudio_info *in)
{
    return bt_errorf(err, errlen, BT_ERANGE,
                     "the audio is longer than the limit of %.1f s (%s, %d Hz, %d channels)",
                     (double)max / WAUDIO_RATE, in->format, in->rate, in->channels);
}

/* Pushes N mono samples at IN (NULL and 0: the end) through the resampler
 * into S; without a resampler they are copied. */
static int push(soxr_t rs, const float *in, size_t n, sink *s, char *err, size_t errlen,
                const waudio_info *info)
{
    int rc;
    if (!rs) {
        if ((rc = sink_reserve(s, n)))
            return rc == BT_ERANGE ? too_long(err, errlen, s->max, info) : rc;
        memcpy(s->p + s->n, in, n * sizeof(*in));
        s->n += n;
        return 0;
    }
    /* Until the resampler has taken every input sample (and, at the end,
     * given out everything it holds). */
    for (;;) {
        size_t room = BLOCK_FRAMES;
        if ((rc = sink_reserve(s, room))) {
            if (rc != BT_ERANGE)
                return rc;
            /* At the limit: room for what is left below it, and fail only
             * if the resampler still has more to give. */
            room = s->max - s->n;
            if (!room) {
                /* Full: a probe of one sample says whether any is left. */
                float probe;
                size_t used = 0, made = 0;
                soxr_error_t e = soxr_process(rs, in, n, &used, &probe, 1, &made);
                if (e)
                    return bt_errorf(err, errlen, BT_EIO, "resampling from %d Hz: %s",
                                     info->rate, e);
                if (made)
                    return too_long(err, errlen, s->max, info);
                if (!in || used == n)
                    return 0;
                if (!used)  /* input it will not take: more than fits */
                    return too_long(err, errlen, s->max, info);
                in += used;
                n -= used;
                continue;
            }
            if ((rc = sink_reserve(s, room)))
                return rc;
        }
        size_t used = 0, made = 0;
        soxr_error_t e = soxr_process(rs, in, n, &used, s->p + s->n, room, &made);
        if (e)
            return bt_errorf(err, errlen, BT_EIO, "resampling from %d Hz: %s", info->rate, e);
        s->n += made;
        if (in) {
            in += used;
            n -= used;
            if (!n && made < room)
                return 0;
        } else if (made < room) {
            return 0;  /* flushed */
        }
    }
}

int waudio_decode(const void *data, size_t len, size_t max_samples, float **out, size_t *n_out,
                  waudio_info *info, char *err, size_t errlen)
{
    *out = NULL;
    *n_out = 0;
    if (err && errlen)
        err[0] = '\0';
    waudio_info scratch;
    if (!info)
        info = &scratch;
    memset(info, 0, sizeof(*info));
    if (!len)
        return bt_errorf(err, errlen, BT_EINVAL, "the file is empty");
    int rc;
    SNDFILE *sf = NULL;
    soxr_t rs = NULL;
    float *frames = NULL, *mono = NULL;
    sink s = {.max = max_samples};
    memfile mf = {data, (sf_count_t)len, 0};
    SF_VIRTUAL_IO io = {mem_len, mem_seek, mem_read, mem_write, mem_tell};
    SF_INFO sfi = {0};
    if (!(sf = sf_open_virtual(&io, SFM_READ, &sfi, &mf))) {
        /* sf_strerror(NULL) would say why, but from a process-wide
         * variable that another thread's decode may have set. */
        rc = bt_errorf(err, errlen, BT_EINVAL,
                       "not audio that can be read as WAV, FLAC, OGG or MP3");
        goto err;
    }
    SF_FORMAT_INFO fi = {.format = sfi.format & SF_FORMAT_TYPEMASK};
    if (sf_command(NULL, SFC_GET_FORMAT_INFO, &fi, sizeof(fi)) == 0 && fi.name)
        snprintf(info->format, sizeof(info->format), "%s", fi.name);
    else
        snprintf(info->format, sizeof(info->format), "format 0x%x", (unsigned)sfi.format);
    info->rate = sfi.samplerate;
    info->channels = sfi.channels;
    if (sfi.channels < 1 || sfi.channels > MAX_CHANNELS) {
        rc = bt_errorf(err, errlen, BT_EINVAL, "%s with %d channels (1 to %d are read)",
                       info->format, sfi.channels, MAX_CHANNELS);
        goto err;
    }
    if (sfi.samplerate < MIN_RATE || sfi.samplerate > MAX_RATE) {
        rc = bt_errorf(err, errlen, BT_EINVAL, "%s at %d Hz (%d to %d Hz are read)",
                       info->format, sfi.samplerate, MIN_RATE, MAX_RATE);
        goto err;
    }
    /* A header that announces more than the limit is refused before any
     * decoding (an MP3's count is an estimate, and SF_COUNT_MAX means
     * unknown; the sink checks again). */
    if (max_samples && sfi.frames > 0 && sfi.frames != SF_COUNT_MAX &&
        (double)sfi.frames * WAUDIO_RATE / sfi.samplerate > (double)max_samples + 1) {
        rc = too_long(err, errlen, max_samples, info);
        goto err;
    }
    if (sfi.samplerate != WAUDIO_RATE) {
        soxr_error_t e = NULL;
        soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
        rs = soxr_create(sfi.samplerate, WAUDIO_RATE, 1, &e, NULL, &q, NULL);
        if (!rs) {
            rc = bt_errorf(err, errlen, BT_EIO, "resampler from %d Hz: %s", sfi.samplerate,
                           e ? e : "failed");
            goto err;
        }
    }
    frames = malloc((size_t)BLOCK_FRAMES * (size_t)sfi.channels * sizeof(*frames));
    mono = malloc(BLOCK_FRAMES * sizeof(*mono));
    if (!frames || !mono) {
        rc = bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
        goto err;
    }
    for (;;) {
        sf_count_t got = sf_readf_float(sf, frames, BLOCK_FRAMES);
        if (got <= 0)
            break;
        info->frames += got;
        const int ch = sfi.channels;
        for (sf_count_t i = 0; i < got; i++) {
            float acc = 0;
            for (int c = 0; c < ch; c++)
                acc += frames[i * ch + c];
            mono[i] = acc / (float)ch;
        }
        if ((rc = push(rs, mono, (size_t)got, &s, err, errlen, info)))
            goto err;
    }
    if (sf_error(sf) != SF_ERR_NO_ERROR) {
        rc = bt_errorf(err, errlen, BT_EIO, "%s: decoding failed after %lld frames: %s",
                       info->format, (long long)info->frames, sf_strerror(sf));
        goto err;
    }
    if (rs && (rc = push(rs, NULL, 0, &s, err, errlen, info)))
        goto err;
    if (!s.n) {
        rc = bt_errorf(err, errlen, BT_EINVAL, "%s at %d Hz holds no samples", info->format,
                       info->rate);
        goto err;
    }
    *out = s.p;
    *n_out = s.n;
    s.p = NULL;
    rc = 0;
err:
    if (rc == BT_ENOMEM && err && errlen && !err[0])
        bt_errorf(err, errlen, BT_ENOMEM, "out of memory");
    free(s.p);
    free(mono);
    free(frames);
    soxr_delete(rs);
    if (sf)
        sf_close(sf);
    return rc;
}
