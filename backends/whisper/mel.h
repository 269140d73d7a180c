/* Whisper's log-mel features: 16 kHz mono PCM in, N_MELS x frames out, as
 * Whisper and faster-whisper's feature extractor compute them:
 *
 *   1. 160 zero samples appended (faster-whisper's default padding);
 *   2. frames of 400 samples every 160 (hop), the signal reflect-padded by
 *      200 at both ends (centred frames), each frame times a periodic Hann
 *      window;
 *   3. the power spectrum |rfft|^2 of each frame (201 bins), the last
 *      frame dropped;
 *   4. a mel filterbank of N_MELS triangles, Slaney's scale and area
 *      normalisation (librosa's defaults), over 0..8 kHz;
 *   5. log10 of each value, clamped below at 1e-10, then raised to at least
 *      the whole spectrogram's maximum minus 8, then (x + 4) / 4.
 *
 * So N samples give (N + 160) / 160 frames (integer division): 3001 for
 * 30 s, of which Whisper's encoder takes the first 3000.  The FFT is FFTW's, in double precision; the filterbank is
 * computed here because it is a formula, not a transform.
 *
 * A wmel holds the filterbank and the FFT plan; wmel_compute may run on
 * several threads at once on one wmel (each call has its own buffers). */
#ifndef BATON_BACKENDS_WHISPER_MEL_H
#define BATON_BACKENDS_WHISPER_MEL_H

#include <stddef.h>

#include "common/status.h"

#define WMEL_SAMPLE_RATE 16000  /* Hz */
#define WMEL_N_FFT 400          /* samples per frame (25 ms) */
#define WMEL_HOP 160            /* samples between frames (10 ms) */
#define WMEL_BINS (WMEL_N_FFT / 2 + 1)

typedef struct wmel wmel;  /* opaque */

/* A feature extractor of N_MELS bands (80 for Whisper base; 128 for
 * large-v3).  BT_EINVAL for N_MELS outside 1..256, BT_ENOMEM. */
int wmel_create(int n_mels, wmel **out);
void wmel_destroy(wmel *m);  /* NULL is a no-op */

int wmel_n_mels(const wmel *m);
/* The filterbank, N_MELS rows of WMEL_BINS weights; owned by M. */
const float *wmel_filters(const wmel *m);

/* Frames for N samples: (N + WMEL_HOP) / WMEL_HOP. */
size_t wmel_frames(size_t n_samples);

/* The features of the N samples at PCM (16 kHz, mono, nominally in
 * -1..1) into OUT, N_MELS rows of wmel_frames(N) values (row-major: band
 * by band).  BT_EINVAL for N = 0, BT_ENOMEM. */
int wmel_compute(const wmel *m, const float *pcm, size_t n, float *out);

#endif
