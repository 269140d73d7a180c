#!/usr/bin/python3
"""bench_whisper.py -- baton's Whisper against faster-whisper, side by side in
one run, on the same weights (Whisper base, models/whisper-base) and the
same number of threads.

Clips, made from the JFK clip (models/samples/jfk.wav, 11 s) repeated: 10 s,
30 s (one window) and 66 s (three windows).  Settings of both: beam 1,
temperature 0 without fallback, language en, no timestamps, no
conditioning on previous text.

Measured, each the median of --runs runs (after one warm-up):
  - real-time factor (processing seconds per audio second; lower is
    faster) of one request at a time, for the 30 s and the 66 s clip;
  - the same for 8 concurrent 30 s clips, in aggregate;
  - time to the first text of the 10 s clip (baton streams; faster-whisper
    yields a window's segment when the window is decoded);
  - peak resident memory: batond plus its worker, against the process that
    ran faster-whisper (each alone, from /proc's VmHWM and ru_maxrss);
  - whether the texts agree.
baton runs with `activations: q8` (its fast path) and `f32`; faster-whisper
with compute_type int8 (its fastest on a CPU) and float32.  faster-whisper
at 8 concurrent clips is given its best of two layouts of the same 2
threads: one worker of 2 threads, and 2 workers of 1.

faster-whisper is installed from PyPI into a venv of its own,
$BATON_TEST_CACHE/fw-venv (default ~/.cache/baton-test/fw-venv), once.

    /usr/bin/python3 tests/bench/bench_whisper.py [--runs N] [--json FILE]
        [--concurrent N] [--slots S] [--quick]

--concurrent sets how many 30 s clips go at once (default 8); --slots sets
baton's decoding slots (the whisper model's max_batch; default: as many
as the clips), so that --concurrent 16 --slots 8 measures windows that
wait for a slot.  --quick runs baton q8 and faster-whisper int8 only.

Writes build/bench/bench_whisper.json (or --json).  Exits 1 when a request
fails or a text is empty; never for a time.
"""
import argparse
import array
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import wave

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import baton_client as bc  # noqa: E402

BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
MODEL = os.path.join(ROOT, "models/whisper-base")
JFK = os.path.join(ROOT, "models/samples/jfk.wav")
VENV = os.path.join(os.path.expanduser(os.environ.get("BATON_TEST_CACHE", "~/.cache/baton-test")),
                    "fw-venv")
THREADS = 2
CONCURRENT = 8
SLOTS = 8

# Run by the venv's python: faster-whisper on the clips given as raw f32
# files, printing one JSON line per measurement.
FW_SCRIPT = r'''
import json, resource, sys, threading, time
import numpy as np
from faster_whisper import WhisperModel
model_dir, compute, runs, conc, layouts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
clips = {}
for arg in sys.argv[6:]:
    name, path = arg.split("=", 1)
    clips[name] = np.fromfile(path, dtype="<f4")
KW = dict(beam_size=1, temperature=0.0, language="en", without_timestamps=True,
          condition_on_previous_text=False, vad_filter=False)
def run(model, audio, first=None):
    t0 = time.perf_counter()
    segs, _ = model.transcribe(audio, **KW)
    text = ""
    for s in segs:
        if first is not None and not first:
            first.append(time.perf_counter() - t0)
        text += s.text
    return time.perf_counter() - t0, text
out = {}
model = WhisperModel(model_dir, device="cpu", compute_type=compute, cpu_threads=2, num_workers=1)
run(model, clips["c10"])
for name in ("c30", "c66"):
    ts = []
    for _ in range(runs):
        t, text = run(model, clips[name])
        ts.append(t)
    out[name] = {"seconds": sorted(ts)[len(ts) // 2], "text": text}
ttft = []
for _ in range(runs):
    first = []
    run(model, clips["c10"], first)
    ttft.append(first[0])
out["ttft_c10"] = sorted(ttft)[len(ttft) // 2]
best = None
for layout in layouts.split(","):
    workers, threads = [int(x) for x in layout.split("x")]
    m = model if (workers, threads) == (1, 2) else WhisperModel(
        model_dir, device="cpu", compute_type=compute, cpu_threads=threads, num_workers=workers)
    ts = []
    for _ in range(runs):
        texts = [None] * conc
        def one(k):
            texts[k] = run(m, clips["c30"])[1]
        th = [threading.Thread(target=one, args=(k,)) for k in range(conc)]
        t0 = time.perf_counter()
        for x in th: x.start()
        for x in th: x.join()
        ts.append(time.perf_counter() - t0)
    t = sorted(ts)[len(ts) // 2]
    if best is None or t < best[0]:
        best = (t, layout, texts[0])
out["concurrent"] = {"seconds": best[0], "layout": best[1], "text": best[2]}
out["peak_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(out))
'''


def ensure_venv():
    py = os.path.join(VENV, "bin", "python")
    if os.path.exists(py):
        r = subprocess.run([py, "-c", "import faster_whisper"], capture_output=True)
        if r.returncode == 0:
            return py
    subprocess.check_call(["/usr/bin/python3", "-m", "venv", VENV])
    subprocess.check_call([py, "-m", "pip", "install", "-q", "faster-whisper==1.2.1"])
    return py


def read_jfk():
    with wave.open(JFK) as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
        pcm = array.array("h", w.readframes(w.getnframes()))
    return array.array("f", (s / 32768.0 for s in pcm))


def clip(jfk, seconds):
    n = int(seconds * 16000)
    out = array.array("f")
    while len(out) < n:
        out.extend(jfk)
    return out[:n]


def start_batond(folder, text):
    """batond serving the config TEXT (written into FOLDER, whose baton.sock
    is its client endpoint) once it is ready: (process, log file, endpoint)."""
    cfg = os.path.join(folder, "baton.yaml")
    with open(cfg, "w") as f:
        f.write(text)
    log = open(os.path.join(folder, "batond.log"), "w")
    proc = subprocess.Popen([os.path.join(BUILD, "batond"), "--config", cfg], stdout=log,
                            stderr=subprocess.STDOUT)
    endpoint = "ipc://%s/baton.sock" % folder
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with bc.Client(endpoint, connect_timeout_ms=1000) as c:
                if c.health().ready:
                    return proc, log, endpoint
        except Exception:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("batond did not start; see %s/batond.log" % folder)


class Baton:
    def __init__(self, activations, tmp):
        self.dir = tempfile.mkdtemp(prefix="baton-bench-whisper-", dir=tmp)
        with open(os.path.join(ROOT, "config/examples/voice.yaml")) as f:
            text = f.read()
        text = text.replace("/tmp/baton", self.dir)
        text = text.replace("models/whisper-base", MODEL)
        text = re.sub(r"(?m)^  http_listen: .*\n", "", text)
        text = re.sub(r"(?m)^  log_level: .*$", "  log_level: warning", text)
        text = re.sub(r"(name: whisper\n(?:    .*\n)*?    max_batch: )\d+",
                      r"\g<1>%d" % SLOTS, text)
        text = text.replace("models/smollm2", os.path.join(ROOT, "models/smollm2"))
        text = re.sub(r"threads: \d+", "threads: %d" % THREADS, text)
        text = text.replace("max_audio_s: 600}", "max_audio_s: 600, activations: %s}" % activations)
        self.proc, self.log, self.endpoint = start_batond(self.dir, text)

    def peak_rss_kb(self):
        """VmHWM of batond and of Whisper's worker, cpu0 (voice.yaml's
        second worker holds the LLM of its voice chat, idle here)."""
        total = 0
        pids = [self.proc.pid]
        try:
            with open("/proc/%d/task/%d/children" % (self.proc.pid, self.proc.pid)) as f:
                kids = [int(p) for p in f.read().split()]
        except OSError:
            kids = []
        for pid in kids:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if b"\0cpu0\0" in f.read():
                    pids.append(pid)
        for pid in pids:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
        return total

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def transcribe(client, audio, first=None):
    t = bc.Tensor("audio", "f32", [len(audio)], audio.tobytes())
    opts = json.dumps({"language": "en", "timestamps": False}).encode()
    t0 = time.perf_counter()
    rid = client.send("transcribe", {"audio": t, "options": bc.Tensor("options", "u8", [len(opts)],
                                                                         opts)}, stream=True)
    text = b""
    while True:
        ev = client.recv()
        if ev.request_id != rid:
            continue
        if ev.is_chunk:
            # The text only: `segments` streams each window's JSON line too.
            if ev.tensor.name != "text" or not ev.tensor.data:
                continue
            if first is not None and not first:
                first.append(time.perf_counter() - t0)
            text += ev.tensor.data
            continue
        if not ev.ok:
            raise RuntimeError("baton: %s %s" % (ev.status, ev.message))
        return time.perf_counter() - t0, text.decode("utf-8", "replace")


def bench_baton(activations, clips, runs, tmp):
    srv = Baton(activations, tmp)
    out = {}
    try:
        with bc.Client(srv.endpoint) as c:
            transcribe(c, clips["c10"])
            for name in ("c30", "c66"):
                ts = []
                for _ in range(runs):
                    t, text = transcribe(c, clips[name])
                    ts.append(t)
                out[name] = {"seconds": statistics.median(ts), "text": text}
            ttft = []
            for _ in range(runs):
                first = []
                transcribe(c, clips["c10"], first)
                ttft.append(first[0])
            out["ttft_c10"] = statistics.median(ttft)
        ts = []
        for _ in range(runs):
            texts = [None] * CONCURRENT

            def one(k):
                with bc.Client(srv.endpoint) as c:
                    texts[k] = transcribe(c, clips["c30"])[1]
            th = [threading.Thread(target=one, args=(k,)) for k in range(CONCURRENT)]
            t0 = time.perf_counter()
            for x in th:
                x.start()
            for x in th:
                x.join()
            ts.append(time.perf_counter() - t0)
            if any(t is None for t in texts):
                raise RuntimeError("baton: a concurrent request failed")
        out["concurrent"] = {"seconds": statistics.median(ts), "text": texts[0]}
        out["peak_rss_kb"] = srv.peak_rss_kb()
    finally:
        srv.stop()
    return out


def bench_fw(py, compute, clips, runs, tmp):
    args = [py, "-c", FW_SCRIPT, MODEL, compute, str(runs), str(CONCURRENT), "1x2,2x1"]
    for name, audio in clips.items():
        path = os.path.join(tmp, name + ".f32")
        with open(path, "wb") as f:
            f.write(audio.tobytes())
        args.append("%s=%s" % (name, path))
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("faster-whisper failed:\n" + r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default=os.path.join(BUILD, "bench", "bench_whisper.json"))
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--slots", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    global CONCURRENT, SLOTS
    CONCURRENT = a.concurrent
    SLOTS = a.slots or a.concurrent
    if not os.path.exists(os.path.join(MODEL, "model.bin")) or not os.path.exists(JFK):
        sys.exit("bench_whisper: run scripts/fetch-model.sh whisper-base jfk first")
    py = ensure_venv()
    jfk = read_jfk()
    clips = {"c10": clip(jfk, 10), "c30": clip(jfk, 30), "c66": clip(jfk, 66)}
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-whisper-") as tmp:
        for act in ("q8",) if a.quick else ("q8", "f32"):
            results["baton " + act] = bench_baton(act, clips, a.runs, tmp)
        for compute in ("int8",) if a.quick else ("int8", "float32"):
            results["faster-whisper " + compute] = bench_fw(py, compute, clips, a.runs, tmp)
    ref = results["faster-whisper int8"]
    # The texts are compared with faster-whisper float32's (int8's with
    # --quick).
    f32 = results.get("faster-whisper float32", ref)
    many = "RTF %dx30s" % CONCURRENT
    print("baton: %d decoding slots for %d clips at once" % (SLOTS, CONCURRENT))
    print("%-24s %8s %8s %10s %9s %9s  %s" % ("", "RTF 30s", "RTF 66s", many, "TTFT 10s",
                                            "peak MiB", "texts = fw %s's (30 s, 66 s)"
                                            % ("int8" if a.quick else "float32")))
    for name, r in results.items():
        same = [r[c]["text"].strip() == f32[c]["text"].strip() for c in ("c30", "c66")]
        print("%-24s %8.3f %8.3f %10.3f %8.2fs %9.0f  %s" % (
            name, r["c30"]["seconds"] / 30, r["c66"]["seconds"] / 66,
            r["concurrent"]["seconds"] / (30 * CONCURRENT), r["ttft_c10"],
            r["peak_rss_kb"] / 1024, "/".join("yes" if s else "no" for s in same)))
    b = results["baton q8"]
    print("\nbaton q8 / faster-whisper int8 (above 1: baton is slower): RTF 30 s %.2f, 66 s %.2f, "
          "%d at once %.2f, TTFT %.2f, peak memory %.2f" % (
              b["c30"]["seconds"] / ref["c30"]["seconds"], b["c66"]["seconds"] / ref["c66"]["seconds"],
              CONCURRENT,
              b["concurrent"]["seconds"] / ref["concurrent"]["seconds"],
              b["ttft_c10"] / ref["ttft_c10"], b["peak_rss_kb"] / ref["peak_rss_kb"]))
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"threads": THREADS, "concurrent": CONCURRENT, "slots": SLOTS, "runs": a.runs,
                   "results": results}, f, indent=1)
    print("wrote", a.json)
    bad = [n for n, r in results.items() if not r["c30"]["text"].strip()]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
