/* Audio files to what Whisper hears: the bytes of a WAV, FLAC, OGG
 * (Vorbis, Opus) or MP3 file, at any sample rate and channel count, decoded
 * by libsndfile, the channels averaged into one, and resampled to 16 kHz by
 * libsoxr (its high-quality preset), as f32 samples.  Integer PCM becomes
 * -1..1 by libsndfile's normalisation (a 16-bit sample divided by 32768),
 * so a 16 kHz mono 16-bit WAV gives exactly the samples that faster-whisper
 * reads from it.
 *
 * The file is read from memory (an upload, a tensor), never from a path. */
#ifndef BATON_BACKENDS_WHISPER_AUDIO_H
#define BATON_BACKENDS_WHISPER_AUDIO_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define WAUDIO_RATE 16000  /* Hz: what waudio_decode gives */

/* What the file was, for logs and errors. */
typedef struct waudio_info {
    int rate;          /* Hz, as stored */
    int channels;
    int64_t frames;    /* frames decoded, at RATE */
    char format[64];   /* libsndfile's name: "WAV (Microsoft)", "MPEG-1/2 Audio"... */
} waudio_info;

/* Decodes the LEN bytes at DATA into *OUT (malloc'd, the caller frees; 16
 * kHz mono f32) and *N_OUT samples.  MAX_SAMPLES (at 16 kHz; 0: no limit)
 * bounds the result: longer audio is refused, not cut.  INFO may be NULL.
 * Errors, each with a message in ERR[ERRLEN]:
 *   BT_EINVAL   empty input, not audio libsndfile can read, no samples,
 *               or a rate or channel count out of range;
 *   BT_ERANGE   longer than MAX_SAMPLES;
 *   BT_EIO      a decoding or resampling failure inside the file;
 *   BT_ENOMEM. */
int waudio_decode(const void *data, size_t len, size_t max_samples, float **out, size_t *n_out,
                  waudio_info *info, char *err, size_t errlen);

#endif
