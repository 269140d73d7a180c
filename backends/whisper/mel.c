/* Whisper's log-mel features (mel.h).
 *
 * FFTW's planner is not thread-safe, its execution on new arrays is: the
 * plan is made once, under a process-wide mutex, in wmel_create (this file
 * is the only one in baton that plans with FFTW; another would have to
 * take the same mutex, or FFTW's own thread-safe planner), and each
 * wmel_compute runs it with fftw_execute_dft_r2c on buffers of its own,
 * allocated with fftw_malloc so that they have the alignment the plan was
 * made for. */
#include "backends/whisper/mel.h"

#include <fftw3.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct wmel {
    int n_mels;
    float *filters;       /* n_mels x WMEL_BINS; owned */
    double window[WMEL_N_FFT];  /* periodic Hann */
    fftw_plan plan;       /* WMEL_N_FFT real -> WMEL_BINS complex; owned */
};

static pthread_mutex_t planner_lock = PTHREAD_MUTEX_INITIALIZER;

/* Slaney's mel scale (librosa's default, htk=False): linear below 1 kHz
 * at 200/3 Hz per mel, logarithmic above with 27 mels per factor 6.4. */
static double mel_to_hz(double mel)
{
    const double f_sp = 200.0 / 3, min_log_hz = 1000.0, min_log_mel = min_log_hz / f_sp;
    const double logstep = log(6.4) / 27.0;
    if (mel >= min_log_mel)
        return min_log_hz * exp(logstep * (mel - min_log_mel));
    return f_sp * mel;
}

static double hz_to_mel(double hz)
{
    const double f_sp = 200.0 / 3, min_log_hz = 1000.0, min_log_mel = min_log_hz / f_sp;
    const double logstep = log(6.4) / 27.0;
    if (hz >= min_log_hz)
        return min_log_mel + log(hz / min_log_hz) / logstep;
    return hz / f_sp;
}

/* N_MELS triangles between N_MELS + 2 points evenly spaced in mels from 0
 * to the Nyquist frequency, each scaled by 2 / its width in Hz (Slaney's
 * area normalisation), as librosa.filters.mel(sr, n_fft, n_mels). */
static void make_filters(float *w, int n_mels)
{
    double pts[256 + 2];
    const double max_mel = hz_to_mel(WMEL_SAMPLE_RATE / 2.0);
    for (int i = 0; i < n_mels + 2; i++)
        pts[i] = mel_to_hz(max_mel * i / (n_mels + 1));
    for (int m = 0; m < n_mels; m++) {
        double lo = pts[m], mid = pts[m + 1], hi = pts[m + 2];
        double enorm = 2.0 / (hi - lo);
        for (int k = 0; k < WMEL_BINS; k++) {
            double f = (double)k * WMEL_SAMPLE_RATE / WMEL_N_FFT;
            double up = (f - lo) / (mid - lo), down = (hi - f) / (hi - mid);
            double t = up < down ? up : down;
            w[(size_t)m * WMEL_BINS + k] = (float)((t > 0 ? t : 0) * enorm);
        }
    }
}

int wmel_create(int n_mels, wmel **out)
{
    *out = NULL;
    if (n_mels < 1 || n_mels > 256)
        return BT_EINVAL;
    int rc = BT_ENOMEM;
    double *in = NULL;
    fftw_complex *spec = NULL;
    wmel *m = calloc(1, sizeof(*m));
    if (!m)
        goto err;
    m->n_mels = n_mels;
    if (!(m->filters = malloc((size_t)n_mels * WMEL_BINS * sizeof(*m->filters))))
        goto err;
    make_filters(m->filters, n_mels);
    for (int i = 0; i < WMEL_N_FFT; i++)
        m->window[i] = 0.5 - 0.5 * cos(2.0 * M_PI * i / WMEL_N_FFT);
    in = fftw_malloc(WMEL_N_FFT * sizeof(*in));
    spec = fftw_malloc(WMEL_BINS * sizeof(*spec));
    if (!in || !spec)
        goto err;
    pthread_mutex_lock(&planner_lock);
    m->plan = fftw_plan_dft_r2c_1d(WMEL_N_FFT, in, spec, FFTW_ESTIMATE);
    pthread_mutex_unlock(&planner_lock);
    if (!m->plan)
        goto err;
    fftw_free(spec);
    fftw_free(in);
    *out = m;
    return 0;
err:
    fftw_free(spec);
    fftw_free(in);
    wmel_destroy(m);
    return rc;
}

void wmel_destroy(wmel *m)
{
    if (!m)
        return;
    if (m->plan) {
        pthread_mutex_lock(&planner_lock);
        fftw_destroy_plan(m->plan);
        pthread_mutex_unlock(&planner_lock);
    }
    free(m->filters);
    free(m);
}

int wmel_n_mels(const wmel *m) { return m->n_mels; }
const float *wmel_filters(const wmel *m) { return m->filters; }

size_t wmel_frames(size_t n_samples)
{
    return (n_samples + WMEL_HOP) / WMEL_HOP;
}

/* Sample I of the padded signal (N samples then WMEL_HOP zeros, length
 * LEN), reflected at both ends without repeating the edge sample, as
 * numpy's pad mode "reflect": the mirror has period 2 * (LEN - 1). */
static float padded_at(const float *pcm, size_t n, size_t len, long i)
{
    long period = 2 * ((long)len - 1);
    i %= period;
    if (i < 0)
        i += period;
    if (i >= (long)len)
        i = period - i;
    return (size_t)i < n ? pcm[i] : 0.0f;
}

int wmel_compute(const wmel *m, const float *pcm, size_t n, float *out)
{
    if (!n)
        return BT_EINVAL;
    const size_t len = n + WMEL_HOP, frames = wmel_frames(n);
    int rc = BT_ENOMEM;
    double *in = fftw_malloc(WMEL_N_FFT * sizeof(*in));
    fftw_complex *spec = fftw_malloc(WMEL_BINS * sizeof(*spec));
    float *power = malloc(WMEL_BINS * sizeof(*power));
    if (!in || !spec || !power)
        goto err;
    float top = -INFINITY;
    for (size_t t = 0; t < frames; t++) {
        long start = (long)(t * WMEL_HOP) - WMEL_N_FFT / 2;
        for (int i = 0; i < WMEL_N_FFT; i++)
            in[i] = (double)padded_at(pcm, n, len, start + i) * m->window[i];
        fftw_execute_dft_r2c(m->plan, in, spec);
        /* faster-whisper casts the spectrum to complex64 before taking
         * the power; the float here matches that rounding. */
        for (int k = 0; k < WMEL_BINS; k++) {
            float re = (float)spec[k][0], im = (float)spec[k][1];
            power[k] = re * re + im * im;
        }
        for (int b = 0; b < m->n_mels; b++) {
            const float *w = m->filters + (size_t)b * WMEL_BINS;
            float acc = 0;
            for (int k = 0; k < WMEL_BINS; k++)
                acc += w[k] * power[k];
            float v = log10f(acc > 1e-10f ? acc : 1e-10f);
            out[(size_t)b * frames + t] = v;
            if (v > top)
                top = v;
        }
    }
    for (size_t i = 0; i < (size_t)m->n_mels * frames; i++) {
        float v = out[i] > top - 8.0f ? out[i] : top - 8.0f;
        out[i] = (v + 4.0f) / 4.0f;
    }
    rc = 0;
err:
    free(power);
    fftw_free(spec);
    fftw_free(in);
    return rc;
}
