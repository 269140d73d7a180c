"""Speech to text end to end: a real batond serving
config/examples/voice.yaml (the whisper backend on one CPU worker), driven
through the Python client (client/python/baton_client.py):

  - the JFK clip as a WAV file's bytes gives faster-whisper's text (the
    text of tests/unit/data/whisper-ids.tsv), streamed token by token,
    with the language given and with it detected;
  - the same audio as F32 samples, three times over (33 s): two windows,
    the second starting where the first ended;
  - four requests at once (their windows and steps batched) each give the
    text alone gives;
  - bad input (not audio, bad options, too few samples, a wrong dtype) ends
    INVALID_ARGUMENT with a message, and the daemon serves on; afterwards
    no tensor is left in the worker's pool.

Exit status: 0 when every check passed, 1 on a failure, 77 when the model
or the clip is absent (the caller reports SKIP; scripts/fetch-model.sh
whisper-base jfk).  On a failure the daemon's folder is kept with its
batond.log (tests/integration/evidence.py)."""
import array
import json
import os
import re
import subprocess
import sys
import threading
import time
import wave

import evidence
import limits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import baton_client as bc  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
MODEL = os.path.join(ROOT, "models/whisper-base/model.bin")
JFK = os.path.join(ROOT, "models/samples/jfk.wav")

failures = []


def check(cond, what):
    print("%s %s" % ("ok  " if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)


def expected_text():
    with open(os.path.join(ROOT, "tests/unit/data/whisper-ids.tsv")) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if cols[0] == "jfk.wav":
                return cols[3]
    raise RuntimeError("whisper-ids.tsv has no line for jfk.wav")


class Server:
    def __init__(self):
        self.dir = evidence.new_dir()
        with open(os.path.join(ROOT, "config/examples/voice.yaml")) as f:
            text = f.read()
        text = text.replace("/tmp/baton", self.dir)
        text = text.replace("models/whisper-base", os.path.join(ROOT, "models/whisper-base"))
        text = re.sub(r"(?m)^  log_level: .*$", "  log_level: warning", text)
        text = re.sub(r"(?m)^  http_listen: .*\n", "", text)
        text, n = re.subn(r"max_batch: \d+", "max_batch: 4", text)
        assert n == 1, "voice.yaml no longer sets the whisper model's max_batch"
        self.config = os.path.join(self.dir, "baton.yaml")
        with open(self.config, "w") as f:
            f.write(text)
        self.log = open(os.path.join(self.dir, "batond.log"), "w")
        self.proc = subprocess.Popen([os.path.join(BUILD, "batond"), "--config", self.config],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.endpoint = "ipc://%s/baton.sock" % self.dir
        deadline = time.time() + limits.test_limit(60)
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with bc.Client(self.endpoint, connect_timeout_ms=1000) as c:
                    if c.health().ready:
                        return
            except Exception:
                pass
            time.sleep(0.2)
        raise RuntimeError("batond not ready:\n" + self.tail())

    def tail(self):
        self.log.flush()
        with open(os.path.join(self.dir, "batond.log")) as f:
            return f.read()[-3000:]

    def client(self):
        return bc.Client(self.endpoint, wait_ms=int(limits.test_limit(300) * 1000))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=limits.test_limit(30))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        evidence.release(self.dir)


def options(**kw):
    return bc.Tensor("options", "u8", [len(json.dumps(kw))], json.dumps(kw).encode())


def samples(path):
    """The clip's 16-bit samples as floats in -1..1 (what libsndfile gives)."""
    with wave.open(path) as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
        pcm = array.array("h", w.readframes(w.getnframes()))
    return array.array("f", (s / 32768.0 for s in pcm))


def transcribe(c, audio, opts, stream=True):
    if isinstance(audio, array.array):
        audio = bc.Tensor("audio", "f32", [len(audio)], audio.tobytes())
    return c.infer("transcribe", {"audio": audio, "options": opts}, stream=stream)


def main():
    if not os.path.exists(MODEL) or not os.path.exists(JFK):
        if os.environ.get("BATON_CI") == "1":
            print("FAIL %s or %s is absent, and with BATON_CI=1 the model tests must run"
                  % (MODEL, JFK))
            return 1
        print("SKIP: %s or %s is absent (scripts/fetch-model.sh whisper-base jfk)" % (MODEL, JFK))
        return 77
    want = expected_text()
    wav = open(JFK, "rb").read()
    srv = Server()
    try:
        with srv.client() as c:
            r = transcribe(c, wav, options(language="en"))
            check(r.ok, "jfk.wav transcribed: %s %s" % (r.status, r.message))
            check(r.text() == want, "the text is faster-whisper's: %r" % r.text())
            check(len(r.chunks) > 10, "the text streamed in %d chunks" % len(r.chunks))
            check(r.usage.get("completion_tokens") == 25 and r.usage.get("prompt_tokens") == 4,
                  "usage counts the prompt and the 25 tokens: %r" % r.usage)
            check(r.loop_ends.get("windows") == "finish", "one window: %r" % r.loop_ends)

            r = transcribe(c, wav, bc.Tensor("options", "u8", [0], b""))
            check(r.ok and r.text() == want, "language detected: %r" % r.text())

            pcm = samples(JFK)
            long = pcm + pcm + pcm
            r = transcribe(c, long, options(language="en"))
            t = r.text()
            check(r.ok, "33 s of samples: %s %s" % (r.status, r.message))
            n = t.count("ask not what your country can do for you")
            check(n >= 2, "two windows, the sentence %d times: %r" % (n, t))
            runs = [x for x in r.timings if x.node == "encode"]
            check(len(runs) == 2, "the encoder ran for 2 windows: %d" % len(runs))

            # Bad input: a clear error each, and the daemon serves on.
            for audio, opts, what, words in [
                    (b"not audio at all" * 10, options(), "not audio", "WAV, FLAC, OGG or MP3"),
                    (wav, bc.Tensor("options", "u8", [3], b"{x:"), "bad JSON", "options"),
                    (wav, options(language="xx"), "unknown language", "language 'xx'"),
                    (wav, options(task="summarize"), "unknown task", "task"),
                    (wav, options(beam=5), "unknown option", "unknown key 'beam'"),
                    (array.array("f", [0.0] * 10), options(), "ten samples", "frame"),
                    (bc.Tensor("audio", "i32", [4], bytes(16)), options(), "I32 audio",
                     "U8")]:
                r = transcribe(c, audio, opts, stream=False)
                check(r.status == "INVALID_ARGUMENT" and words in r.message,
                      "%s: %s %s" % (what, r.status, r.message))
            check(c.health().ready, "ready after the bad requests")

        # Four at once: batched windows and steps, each the text alone gives.
        results = [None] * 4

        def one(k):
            with srv.client() as c:
                results[k] = transcribe(c, wav, options(language="en"), stream=False)
        threads = [threading.Thread(target=one, args=(k,)) for k in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        check(all(r is not None and r.ok and r.text() == want for r in results),
              "four at once: %r" % [(r.status, r.text()) if r else None for r in results])

        # Releases reach the worker after the responses, and its report of
        # the pool after that: wait for the count to come down.
        deadline = time.time() + limits.test_limit(20)
        with srv.client() as c:
            while True:
                used = [ln for ln in c.stats().splitlines()
                        if ln.startswith("baton_pool_bytes_used")]
                if (used and all(ln.split()[-1] == "0" for ln in used)) or time.time() > deadline:
                    break
                time.sleep(0.2)
            check(used and all(ln.split()[-1] == "0" for ln in used),
                  "no tensor left in the pool: %r" % used)
    finally:
        if failures:
            srv.log.flush()
            evidence.failed("%d failed" % len(failures))
        srv.stop()
    print("whisper: %d failed" % len(failures))
    if not failures:
        evidence.passed()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
