#!/usr/bin/python3
"""bench_whisper_wer.py -- word error rate of baton's Whisper against
faster-whisper's, on clips of known sentences spoken by Debian's espeak-ng,
side by side in one run, on the same weights (Whisper base) and the same
number of threads.

The clips: 24 sentences, each by one of several espeak-ng voices (American,
British, Scottish, Caribbean English, male and female variants) at one of
several speeds, written at 22.05 kHz (espeak-ng's rate) and converted here
to 8, 44.1 and 48 kHz, some in stereo; and one clip over 60 s, the
sentences one after another.  Each system gets the same WAV files (baton
decodes them with libsndfile and resamples with libsoxr; faster-whisper
with PyAV).  Settings of both: beam 1, temperature 0 without fallback,
language en, no conditioning on previous text, no skipping of windows
judged silent (no_speech_threshold None on both); once with timestamps
(both systems' default: windows end at the last whole segment) and once
without.

Token ids: then each clip as faster-whisper's decode_audio reads it (16 kHz
samples), given to both as those samples, so that both decode the same
floats: baton with `activations: f32`, faster-whisper with float32, without
timestamps.  The ids of every window must be equal; the table says for how
many clips they are, and where the first difference is otherwise.

WER: word-level edit distance over the words of the reference, after
lower-casing, dropping punctuation and spelling numbers as espeak-ng read
them (the sentences hold none).  Reported for the short clips together and
for the long one, and the seconds each system took for all of it.

    /usr/bin/python3 tests/bench/bench_whisper_wer.py [--json FILE] [--ids-only]

Needs espeak-ng (scripts/install-deps.sh) and faster-whisper (installed
into a venv as bench_whisper.py does).  Writes
build/bench/bench_whisper_wer.json (or --json).  Exits 1 when a request
fails or the ids differ; never for a time or a WER.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
import wave

with warnings.catch_warnings():
    # audioop (deprecated in 3.11, gone in 3.13) is Debian 12's Python's
    # own resampler: enough to write the clips at other rates.
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_whisper as bw  # noqa: E402

bc = bw.bc

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call the front desk before you leave the hotel.",
    "She sells fresh bread at the market every morning.",
    "The weather will be cold and windy tomorrow afternoon.",
    "Our train leaves the station at half past seven.",
    "He forgot his umbrella on the bus again.",
    "The children played football in the park until sunset.",
    "Turn left at the second traffic light and keep going.",
    "I would like a cup of tea with milk and no sugar.",
    "The museum is closed on Mondays and public holidays.",
    "Water boils at a lower temperature on high mountains.",
    "My sister is learning to play the violin this year.",
    "The library has thousands of books about history.",
    "Remember to switch off the lights when you go out.",
    "A small boat sailed slowly across the quiet lake.",
    "The doctor told him to drink more water and rest.",
    "We planted tomatoes and beans in the garden last spring.",
    "The meeting has been moved to Thursday morning.",
    "Every student must hand in the report by Friday.",
    "The old bridge was repaired after the heavy storm.",
    "Could you tell me where the nearest pharmacy is?",
    "The cat slept all day in a warm patch of sunlight.",
    "They opened a new restaurant near the river last month.",
    "Bright stars filled the sky above the silent desert.",
]
# (voice, words per minute, rate written, channels)
STYLES = [
    ("en-us", 160, 22050, 1), ("en-gb", 140, 44100, 1), ("en-gb-scotland", 175, 8000, 1),
    ("en-029", 150, 48000, 2), ("en-us+f3", 130, 22050, 2), ("en-gb-x-rp+m3", 185, 44100, 1),
]


def normalize(text):
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def edits(ref, hyp):
    """Word-level Levenshtein distance."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i]
        for j, h in enumerate(hyp, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h)))
        prev = cur
    return prev[-1]


def wer(pairs):
    """Errors over reference words, for (reference, hypothesis) pairs."""
    errs = words = 0
    for ref, hyp in pairs:
        r = normalize(ref)
        errs += edits(r, normalize(hyp))
        words += len(r)
    return errs / max(words, 1)


def speak(text, voice, wpm, path):
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", path, text], check=True,
                   capture_output=True)


def convert(src, dst, rate, channels):
    """SRC (16-bit mono WAV) at RATE and CHANNELS into DST, by audioop."""
    with wave.open(src) as w:
        r0, pcm = w.getframerate(), w.readframes(w.getnframes())
    if rate != r0:
        pcm, _ = audioop.ratecv(pcm, 2, 1, r0, rate, None)
    if channels == 2:
        pcm = audioop.tostereo(pcm, 2, 1.0, 0.8)
    with wave.open(dst, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)


def make_clips(tmp):
    clips = []
    for k, text in enumerate(SENTENCES):
        voice, wpm, rate, ch = STYLES[k % len(STYLES)]
        raw = os.path.join(tmp, "s%02d-raw.wav" % k)
        speak(text, voice, wpm, raw)
        path = os.path.join(tmp, "s%02d.wav" % k)
        convert(raw, path, rate, ch)
        clips.append({"name": "s%02d" % k, "path": path, "text": text, "voice": voice,
                      "wpm": wpm, "rate": rate, "channels": ch})
    long_text = " ".join(SENTENCES)
    raw = os.path.join(tmp, "long-raw.wav")
    speak(long_text, "en-us", 150, raw)
    path = os.path.join(tmp, "long.wav")
    convert(raw, path, 32000, 1)
    with wave.open(path) as w:
        seconds = w.getnframes() / w.getframerate()
    return clips, {"name": "long", "path": path, "text": long_text, "seconds": seconds,
                   "rate": 32000}


FW_SCRIPT = r'''
import json, sys, time
from faster_whisper import WhisperModel
model = WhisperModel(sys.argv[1], device="cpu", compute_type=sys.argv[2], cpu_threads=2)
KW = dict(beam_size=1, temperature=0.0, language="en", without_timestamps=sys.argv[3] == "0",
          condition_on_previous_text=False, vad_filter=False, no_speech_threshold=None)
out = {}
t0 = time.perf_counter()
for path in sys.argv[4:]:
    segs, _ = model.transcribe(path, **KW)
    out[path] = "".join(s.text for s in segs)
out["seconds"] = time.perf_counter() - t0
print(json.dumps(out))
'''


# The ids: each clip's samples as decode_audio gives them, written beside it
# (PATH.f32) for baton, and the ids of each window.
FW_IDS_SCRIPT = r'''
import json, sys
import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.audio import decode_audio
model = WhisperModel(sys.argv[1], device="cpu", compute_type="float32", cpu_threads=2)
out = {}
for path in sys.argv[2:]:
    a = decode_audio(path, sampling_rate=16000).astype(np.float32)
    a.tofile(path + ".f32")
    segs, _ = model.transcribe(a, beam_size=1, temperature=0.0, language="en",
                               without_timestamps=True, condition_on_previous_text=False,
                               vad_filter=False, no_speech_threshold=None)
    out[path] = [list(s.tokens) for s in segs]
print(json.dumps(out))
'''


def fw_ids(py, paths):
    r = subprocess.run([py, "-c", FW_IDS_SCRIPT, bw.MODEL] + paths, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError("faster-whisper: %s" % r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def baton_ids(paths, tmp):
    """baton f32's ids of each window of each clip's samples (PATH.f32)."""
    srv = bw.Baton("f32", tmp)
    out = {}
    opts = json.dumps({"language": "en", "timestamps": False,
                       "no_speech_threshold": None}).encode()
    try:
        with bc.Client(srv.endpoint) as c:
            for path in paths:
                with open(path + ".f32", "rb") as f:
                    data = f.read()
                pcm = bc.Tensor("audio", "f32", [len(data) // 4], data)
                r = c.infer("transcribe", {"audio": pcm, "options": bc.Tensor(
                    "options", "u8", [len(opts)], opts)})
                if not r.ok:
                    raise RuntimeError("baton %s: %s %s" % (path, r.status, r.message))
                lines = r.text("segments").splitlines()
                out[path] = [json.loads(ln)["tokens"] for ln in lines if ln.strip()]
    finally:
        srv.stop()
    return out


def first_difference(a, b):
    """Where window lists A and B first differ: (window, index), or None."""
    for w in range(max(len(a), len(b))):
        x = a[w] if w < len(a) else []
        y = b[w] if w < len(b) else []
        if x != y:
            k = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]),
                     min(len(x), len(y)))
            return w, k
    return None


def run_fw(py, compute, timestamps, paths):
    r = subprocess.run([py, "-c", FW_SCRIPT, bw.MODEL, compute, "1" if timestamps else "0"] +
                       paths, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("faster-whisper: %s" % r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_baton(activations, timestamps, paths, tmp):
    srv = bw.Baton(activations, tmp)
    out = {}
    opts = json.dumps({"language": "en", "timestamps": timestamps,
                       "no_speech_threshold": None}).encode()
    try:
        with bc.Client(srv.endpoint) as c:
            t0 = time.perf_counter()
            for path in paths:
                data = open(path, "rb").read()
                r = c.infer("transcribe", {"audio": data, "options": bc.Tensor(
                    "options", "u8", [len(opts)], opts)})
                if not r.ok:
                    raise RuntimeError("baton %s: %s %s" % (path, r.status, r.message))
                out[path] = r.text("text")
            out["seconds"] = time.perf_counter() - t0
    finally:
        srv.stop()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(bw.BUILD, "bench", "bench_whisper_wer.json"))
    ap.add_argument("--ids-only", action="store_true",
                    help="only the token ids, not the word error rates")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(bw.MODEL, "model.bin")):
        sys.exit("bench_whisper_wer: run scripts/fetch-model.sh whisper-base smollm2 first")
    if subprocess.run(["sh", "-c", "command -v espeak-ng"], capture_output=True).returncode:
        sys.exit("bench_whisper_wer: espeak-ng is missing (scripts/install-deps.sh)")
    py = bw.ensure_venv()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-whisper-wer-") as tmp:
        clips, long = make_clips(tmp)
        paths = [c["path"] for c in clips] + [long["path"]]
        want, got = fw_ids(py, paths), baton_ids(paths, tmp)
        for ts in () if a.ids_only else (True, False):
            mode = "" if ts else ", no ts"
            for act in ("q8", "f32"):
                results["baton " + act + mode] = run_baton(act, ts, paths, tmp)
            for compute in ("int8", "float32"):
                results["faster-whisper " + compute + mode] = run_fw(py, compute, ts, paths)
    print("%d clips of %d voices and speeds at 8, 22.05, 44.1 and 48 kHz, and one of %.0f s "
          "at 32 kHz" % (len(clips), len(STYLES), long["seconds"]))
    if results:
        print("(\"no ts\": without timestamps)")
        print("%-30s %10s %12s %10s" % ("", "WER short", "WER long", "seconds"))
    table = {}
    for name, r in results.items():
        short = wer([(c["text"], r[c["path"]]) for c in clips])
        lw = wer([(long["text"], r[long["path"]])])
        table[name] = {"wer_short": short, "wer_long": lw, "seconds": r["seconds"],
                       "texts": {os.path.basename(p): r[p] for p in paths}}
        print("%-30s %9.1f%% %11.1f%% %10.1f" % (name, 100 * short, 100 * lw, r["seconds"]))
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"clips": [{k: v for k, v in c.items() if k != "path"} for c in clips],
                   "long": {k: v for k, v in long.items() if k != "path"}, "results": table},
                  f, indent=1)
    same = 0
    ids = {}
    print("token ids, baton f32 against faster-whisper float32, the same 16 kHz samples:")
    for p in paths:
        d = first_difference(want[p], got[p])
        same += d is None
        ids[os.path.basename(p)] = {"windows": len(want[p]), "first_difference": d}
        if d is not None:
            w, k = d
            print("  %s: window %d differs at token %d: %s against faster-whisper's %s"
                  % (os.path.basename(p), w, k, got[p][w][k:k + 3] if w < len(got[p]) else [],
                     want[p][w][k:k + 3] if w < len(want[p]) else []))
    print("ids equal for %d of %d clips (%d windows)" % (same, len(paths),
                                                          sum(len(want[p]) for p in paths)))
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json) as f:
        doc = json.load(f)
    doc["ids"] = {"equal": same, "clips": len(paths), "per_clip": ids}
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1)
    print("wrote", a.json)
    return 1 if same != len(paths) else 0


if __name__ == "__main__":
    sys.exit(main())
