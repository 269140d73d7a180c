#!/usr/bin/env python3
"""
gen-whisper-ids.py -- writes tests/unit/data/whisper-ids.tsv: the token ids
that faster-whisper (CTranslate2) decodes from audio clips with Whisper
base, which tests/unit/test_whisper_engine.c compares baton's decoder
against; and tests/unit/data/whisper-segments.tsv, the same with
timestamps; and tests/unit/data/whisper-prompt.tsv, the same with a
prompt (initial_prompt: previous text); and
tests/unit/data/whisper-scores.tsv, the numbers by which faster-whisper
judges each window (average log probability, compression ratio,
probability of no speech); and tests/unit/data/whisper-condition.tsv,
windows decoded after the text of those before them
(condition_on_previous_text); and tests/unit/data/whisper-languages.tsv,
a Spanish clip (tests/unit/data/es-weather.flac) with its language
detected, transcribed and translated.

Settings, those of the comparison: compute_type float32, beam 1,
temperature 0 with no fallback, language en, task transcribe, without
timestamps, without conditioning on previous text, no VAD.  One line per
30-second window: the clip's file name, the window's first frame (its
"seek"), the ids (space-separated, without the prompt and the end of text)
and the text.

With timestamps (whisper-segments.tsv) the settings are the same but for
timestamps on and no skipping of windows judged silent
(no_speech_threshold None).  Its clips are jfk.wav and "jfk.wav*3": the
JFK clip three times with one second of silence between (35 s), so that a
window ends inside speech and the next one seeks back.  Lines:
"window CLIP K IDS" for the K-th window decoded (every id the decoder
chose, timestamps included), and "segment CLIP SEEK START END TEXT" for
each segment faster-whisper yields.

With a prompt (whisper-prompt.tsv), the JFK clip's first window is decoded
with initial_prompt, without and with timestamps.  Lines: "encode PROMPT
IDS", all the ids faster-whisper encodes PROMPT into (those of " " + the
prompt stripped, its Tokenizer.encode), and "window PROMPT TIMESTAMPS
PROMPT_IDS IDS": the whole prompt handed to the decoder and the ids it
chose.  PROMPT is written as a JSON string.

INDEPENDENCE: the ids come from faster-whisper and CTranslate2 as
published on PyPI; no code of baton is used.

How to run (from the repository root, after scripts/fetch-model.sh
whisper-base and scripts/fetch-model.sh jfk):

    /usr/bin/python3 -m venv /tmp/fwvenv
    /tmp/fwvenv/bin/pip install faster-whisper==1.2.1
    /tmp/fwvenv/bin/python scripts/gen-whisper-ids.py CLIP...

The Spanish clip, when absent, is made here: Debian's espeak-ng (voice es,
130 words a minute) says SPANISH, which faster-whisper's decode_audio
(PyAV) resamples to 16 kHz, stored as 16-bit FLAC, so that baton and
faster-whisper read the same samples.  Lines of whisper-languages.tsv:
"detect CLIP CODE PROBABILITY" (faster-whisper's detect_language),
"transcribe CLIP IDS TEXT" (the language detected) and "translate CLIP
IDS TEXT" (language es, task translate), without timestamps.  And
tests/unit/data/whisper-mel-es.bin, faster-whisper's log-mel features of
that clip as decode_audio reads it: the 8 bytes "WMELCLP1", a u32 band
count, a u32 frame count and the features (f32, band by band), all
little-endian.

Versions used for the checked-in file: Python 3.11.2, faster-whisper
1.2.1, ctranslate2 4.8.5, espeak-ng 1.51.
"""
import json
import os
import sys

from faster_whisper import WhisperModel
from faster_whisper.transcribe import get_suppressed_tokens
from faster_whisper.tokenizer import Tokenizer

MODEL = "models/whisper-base"
OUT = "tests/unit/data/whisper-ids.tsv"
SEGMENTS = "tests/unit/data/whisper-segments.tsv"
PROMPTS = "tests/unit/data/whisper-prompt.tsv"
SCORES = "tests/unit/data/whisper-scores.tsv"
CONDITION = "tests/unit/data/whisper-condition.tsv"
LANGUAGES = "tests/unit/data/whisper-languages.tsv"
SPANISH_CLIP = "tests/unit/data/es-weather.flac"
SPANISH = "Hoy hace muy buen tiempo, así que vamos al parque."
SPANISH_MEL = "tests/unit/data/whisper-mel-es.bin"
# Prompts: plain, with spaces, digits, punctuation and letters beyond ASCII
# to strip and pre-tokenize, and empty (faster-whisper still encodes " ").
# The last is longer than the 223 tokens a prompt keeps.
PROMPT_TEXTS = ["The following is a speech by President Kennedy.",
                "  JFK\u2019s   inaugural address, 1961:\tcaf\u00e9 \u65e5\u672c  \n", "",
                " ".join("Speech %d of the inaugural addresses, read aloud in Washington on "
                         "January 20th." % i for i in range(1, 21))]


def audio_of(name):
    """The samples of clip NAME: a file of models/samples, or FILE*N, the
    file N times with one second of silence between."""
    import numpy as np
    from faster_whisper.audio import decode_audio
    path, _, times = name.partition("*")
    a = decode_audio(os.path.join("models/samples", path), sampling_rate=16000)
    parts = []
    for i in range(int(times or 1)):
        if i:
            parts.append(np.zeros(16000, dtype=np.float32))
        parts.append(a)
    return np.concatenate(parts)


class Recorder:
    """Stands in for the CTranslate2 model and keeps every sequence that
    generate returns (one per window)."""

    def __init__(self, model):
        self.model = model
        self.sequences = []
        self.prompts = []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def generate(self, *args, **kwargs):
        results = self.model.generate(*args, **kwargs)
        self.sequences.append(list(results[0].sequences_ids[0]))
        self.prompts.append(list(args[1][0]))
        return results


def write_segments(model, clips):
    rec = Recorder(model.model)
    model.model = rec
    with open(SEGMENTS, "w") as out:
        out.write("# window CLIP K IDS | segment CLIP SEEK START END TEXT "
                  "(scripts/gen-whisper-ids.py)\n")
        for clip in clips:
            rec.sequences = []
            segments, _ = model.transcribe(
                audio_of(clip), beam_size=1, temperature=0.0, language="en",
                task="transcribe", without_timestamps=False,
                condition_on_previous_text=False, vad_filter=False,
                no_speech_threshold=None)
            segments = list(segments)
            for k, ids in enumerate(rec.sequences):
                out.write("window\t%s\t%d\t%s\n" % (clip, k, " ".join(str(t) for t in ids)))
            for s in segments:
                out.write("segment\t%s\t%d\t%.2f\t%.2f\t%s\n" % (clip, s.seek, s.start,
                                                                  s.end, s.text))
    model.model = rec.model
    print("wrote", SEGMENTS)


def write_prompts(model):
    rec = Recorder(model.model)
    model.model = rec
    tok = Tokenizer(model.hf_tokenizer, True, task="transcribe", language="en")
    with open(PROMPTS, "w") as out:
        out.write("# encode PROMPT IDS | window PROMPT TIMESTAMPS PROMPT_IDS IDS "
                  "(scripts/gen-whisper-ids.py)\n")
        for text in PROMPT_TEXTS:
            ids = tok.encode(" " + text.strip())
            out.write("encode\t%s\t%s\n" % (json.dumps(text), " ".join(str(t) for t in ids)))
        for text in PROMPT_TEXTS[:2] + PROMPT_TEXTS[3:]:
            for ts in (0, 1):
                rec.sequences, rec.prompts = [], []
                segments, _ = model.transcribe(
                    audio_of("jfk.wav"), beam_size=1, temperature=0.0, language="en",
                    task="transcribe", without_timestamps=not ts, initial_prompt=text,
                    condition_on_previous_text=False, vad_filter=False,
                    no_speech_threshold=None)
                list(segments)
                out.write("window\t%s\t%d\t%s\t%s\n" % (
                    json.dumps(text), ts, " ".join(str(t) for t in rec.prompts[0]),
                    " ".join(str(t) for t in rec.sequences[0])))
    model.model = rec.model
    print("wrote", PROMPTS)


def write_scores(model):
    """The numbers faster-whisper judges a window by: for each window of
    the clips, with and without timestamps, its segments' avg_logprob,
    compression_ratio and no_speech_prob (one window's segments share
    them).  Temperature 0 without fallback, no skipping of silent windows,
    so that every window is decoded as the other files decode it."""
    with open(SCORES, "w") as out:
        out.write("# scores CLIP TIMESTAMPS SEEK AVG_LOGPROB COMPRESSION_RATIO NO_SPEECH_PROB "
                  "(scripts/gen-whisper-ids.py)\n")
        for clip in ["jfk.wav", "jfk.wav*3"]:
            for ts in (0, 1):
                segments, _ = model.transcribe(
                    audio_of(clip), beam_size=1, temperature=0.0, language="en",
                    task="transcribe", without_timestamps=not ts,
                    condition_on_previous_text=False, vad_filter=False,
                    no_speech_threshold=None)
                seen = set()
                for s in segments:
                    if s.seek in seen:
                        continue
                    seen.add(s.seek)
                    out.write("scores\t%s\t%d\t%d\t%.9g\t%.9g\t%.9g\n" % (
                        clip, ts, s.seek, s.avg_logprob, s.compression_ratio, s.no_speech_prob))
    print("wrote", SCORES)


def write_condition(model):
    """Conditioning on previous text (faster-whisper's default): the JFK
    clip three times over, each window after the text of those before it,
    with and without timestamps, and with an initial prompt.  Lines:
    "window CLIP TIMESTAMPS PROMPT K PROMPT_IDS IDS" for the K-th window
    decoded (the whole prompt handed to the decoder, and the ids it chose),
    and "segment CLIP TIMESTAMPS PROMPT SEEK START END TEXT".  PROMPT is a
    JSON string ("" for none)."""
    rec = Recorder(model.model)
    model.model = rec
    with open(CONDITION, "w") as out:
        out.write("# window CLIP TIMESTAMPS PROMPT K PROMPT_IDS IDS | segment CLIP TIMESTAMPS "
                  "PROMPT SEEK START END TEXT (scripts/gen-whisper-ids.py)\n")
        for ts in (0, 1):
            for text in ("", PROMPT_TEXTS[0]):
                rec.sequences, rec.prompts = [], []
                segments, _ = model.transcribe(
                    audio_of("jfk.wav*3"), beam_size=1, temperature=0.0, language="en",
                    task="transcribe", without_timestamps=not ts,
                    initial_prompt=text or None, condition_on_previous_text=True,
                    vad_filter=False, no_speech_threshold=None)
                segments = list(segments)
                for k, (pr, ids) in enumerate(zip(rec.prompts, rec.sequences)):
                    out.write("window\tjfk.wav*3\t%d\t%s\t%d\t%s\t%s\n" % (
                        ts, json.dumps(text), k, " ".join(str(t) for t in pr),
                        " ".join(str(t) for t in ids)))
                for s in segments:
                    out.write("segment\tjfk.wav*3\t%d\t%s\t%d\t%.2f\t%.2f\t%s\n" % (
                        ts, json.dumps(text), s.seek, s.start, s.end, s.text))
    model.model = rec.model
    print("wrote", CONDITION)


def make_spanish_clip():
    import subprocess
    import tempfile
    import av
    import numpy as np
    from faster_whisper.audio import decode_audio
    with tempfile.TemporaryDirectory() as d:
        wav = os.path.join(d, "es.wav")
        subprocess.run(["espeak-ng", "-v", "es", "-s", "130", "-w", wav, SPANISH], check=True)
        a = decode_audio(wav, sampling_rate=16000)
    s16 = np.clip(np.round(a * 32768), -32768, 32767).astype(np.int16)
    out = av.open(SPANISH_CLIP, "w")
    st = out.add_stream("flac", rate=16000, layout="mono")
    st.format = "s16"
    frame = av.AudioFrame.from_ndarray(s16.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = 16000
    for packet in list(st.encode(frame)) + list(st.encode(None)):
        out.mux(packet)
    out.close()
    print("wrote", SPANISH_CLIP)


def write_languages(model):
    from faster_whisper.audio import decode_audio
    if not os.path.exists(SPANISH_CLIP):
        make_spanish_clip()
    import struct
    import numpy as np
    a = decode_audio(SPANISH_CLIP, sampling_rate=16000)
    feats = model.feature_extractor(a).astype(np.float32)
    with open(SPANISH_MEL, "wb") as out:
        out.write(b"WMELCLP1" + struct.pack("<II", *feats.shape))
        out.write(np.ascontiguousarray(feats).tobytes())
    print("wrote", SPANISH_MEL, feats.shape)
    name = os.path.basename(SPANISH_CLIP)
    with open(LANGUAGES, "w") as out:
        out.write("# detect CLIP CODE PROBABILITY | transcribe CLIP IDS TEXT | translate CLIP "
                  "IDS TEXT (scripts/gen-whisper-ids.py)\n")
        code, prob, _ = model.detect_language(a)
        out.write("detect\t%s\t%s\t%.6f\n" % (name, code, prob))
        for task, lang in (("transcribe", None), ("translate", "es")):
            segments, info = model.transcribe(
                a, beam_size=1, temperature=0.0, language=lang, task=task,
                without_timestamps=True, condition_on_previous_text=False, vad_filter=False)
            for s in segments:
                out.write("%s\t%s\t%s\t%s\n" % (task, name, " ".join(str(t) for t in s.tokens),
                                                s.text))
    print("wrote", LANGUAGES)


def main():
    clips = sys.argv[1:]
    if not clips:
        sys.exit(__doc__)
    model = WhisperModel(MODEL, device="cpu", compute_type="float32", cpu_threads=2)
    # The decoder in baton suppresses config.json's suppress_ids plus the
    # special tokens; check that this is the set faster-whisper passes.
    tok = Tokenizer(model.hf_tokenizer, True, task="transcribe", language="en")
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    ours = set(cfg["suppress_ids"]) | {tok.transcribe, tok.translate, tok.sot, tok.sot_prev,
                                       tok.sot_lm, tok.no_speech}
    theirs = set(get_suppressed_tokens(tok, [-1]))
    assert ours == theirs, (sorted(ours ^ theirs))
    with open(OUT, "w") as out:
        out.write("# clip\tseek\tids\ttext (scripts/gen-whisper-ids.py)\n")
        for clip in clips:
            segments, _ = model.transcribe(
                clip, beam_size=1, temperature=0.0, language="en", task="transcribe",
                without_timestamps=True, condition_on_previous_text=False, vad_filter=False)
            for s in segments:
                out.write("%s\t%d\t%s\t%s\n" % (os.path.basename(clip), s.seek,
                                              " ".join(str(t) for t in s.tokens), s.text))
    print("wrote", OUT)
    write_segments(model, ["jfk.wav", "jfk.wav*3"])
    write_prompts(model)
    write_scores(model)
    write_condition(model)
    write_languages(model)


if __name__ == "__main__":
    main()
