"""Speech to text end to end: a real batond serving
config/examples/voice.yaml (the whisper backend on one CPU worker, SmolLM2
on another), driven through the Python client
(client/python/baton_client.py):

  - the JFK clip as a WAV file's bytes gives faster-whisper's segments
    (times and texts of tests/unit/data/whisper-segments.tsv), streamed a
    segment at a time, with the language given and with it detected;
    without timestamps, faster-whisper's text of whisper-ids.tsv, streamed
    token by token; sampled at temperature 0.9 twice with one seed, one
    text;
  - the same audio as F32 samples, three times over with a second of
    silence between (35 s): the first window ends inside speech, and the
    second starts at its last timestamp, as faster-whisper's does;
  - each segment carries the numbers its window is judged by (avg_logprob,
    compression_ratio, no_speech_prob: faster-whisper's, whisper-scores.tsv);
    a list of temperatures decodes the 35 s clip's first window again (it
    compresses too well), a window at a time, the same twice with one seed;
    ten seconds of silence are skipped or kept as faster-whisper decides;
  - conditioned on previous text, each window of the 35 s clip is decoded
    after faster-whisper's prompt and gives its segments
    (whisper-condition.tsv), as the HTTP API does by default;
  - a Spanish clip (FLAC, tests/unit/data/es-weather.flac): its language
    detected, transcribed and translated into English with faster-whisper's
    ids (whisper-languages.tsv); audio over the model's max_audio_s, a file
    and samples, refused naming the option;
  - batonctl transcribe prints the text, and with --graph voice_chat
    --system the transcript and the answer;
  - seven requests at once on four decoding slots (their windows and steps
    batched) each give the text alone gives;
  - bad input (not audio, bad options, too few samples, a wrong dtype) ends
    INVALID_ARGUMENT with a message, and the daemon serves on;
  - the OpenAI-compatible endpoints POST /v1/audio/transcriptions and
    /v1/audio/translations through curl -F (every response_format, with
    the segments' times in verbose_json, srt and vtt; the stream of
    transcript.text.delta events), an MP3 upload (written here by
    libsndfile, when it writes MP3), the `openai` package (when
    test_openai.py's venv is there; else SKIP), whisper-base in /v1/models,
    the language detected in verbose_json, and the 400/404/413 answers to
    bad uploads and to audio over max_audio_s;
  - the voice chat (graph voice_chat): the transcript streams as
    `transcript`, then the answer as `answer`; the answer is the one the
    chat graph gives for the transcript as its prompt, and after a system
    prompt and an earlier turn (messages into the optional input
    `context`) the one it gives for those turns and the transcript;
    without stream both come as outputs of those names; over HTTP the
    same, the earlier messages of a chat completion included;
  - afterwards no tensor is left in the workers' pools.

Exit status: 0 when every check passed, 1 on a failure, 77 when a model or
the clip is absent (the caller reports SKIP; scripts/fetch-model.sh
whisper-base smollm2 jfk).  On a failure the daemon's folder is kept with its
batond.log (tests/integration/evidence.py)."""
import array
import base64
import ctypes
import ctypes.util
import io
import json
import socket
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
BUILD = os.environ.get("BUILD", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
# The generated protobuf module of the build under test (an ASan build has
# its own; a fresh clone may have no plain build beside it).
os.environ.setdefault("BATON_PROTO_PATH", os.path.join(BUILD, "gen", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import baton_client as bc  # noqa: E402
MODEL = os.path.join(ROOT, "models/whisper-base/model.bin")
LLM = os.path.join(ROOT, "models/smollm2-135m-instruct-q4_1.gguf")
README = os.path.join(ROOT, "README.md")
JFK = os.path.join(ROOT, "models/samples/jfk.wav")
# A Spanish sentence said by espeak-ng, at 16 kHz (scripts/gen-whisper-ids.py).
SPANISH = os.path.join(ROOT, "tests/unit/data/es-weather.flac")
# The model's limit on audio length in this test's config, in seconds.
MAX_AUDIO_S = 60

failures = []


def check(cond, what):
    print("%s %s" % ("ok  " if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)


def expected_text():
    """faster-whisper's text of the JFK clip without timestamps."""
    with open(os.path.join(ROOT, "tests/unit/data/whisper-ids.tsv")) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if cols[0] == "jfk.wav":
                return cols[3]
    raise RuntimeError("whisper-ids.tsv has no line for jfk.wav")


def expected_segments(clip):
    """faster-whisper's segments of CLIP with timestamps: (seek, start, end,
    text) each."""
    segs = []
    with open(os.path.join(ROOT, "tests/unit/data/whisper-segments.tsv")) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if cols[0] == "segment" and cols[1] == clip:
                segs.append((int(cols[2]), float(cols[3]), float(cols[4]), cols[5]))
    if not segs:
        raise RuntimeError("whisper-segments.tsv has no segment of %s" % clip)
    return segs


def expected_prompted():
    """faster-whisper's first window of the JFK clip after a prompt:
    (prompt, timestamps, prompt ids, ids) each (whisper-prompt.tsv)."""
    out = []
    with open(os.path.join(ROOT, "tests/unit/data/whisper-prompt.tsv")) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if cols[0] == "window":
                out.append((json.loads(cols[1]), cols[2] == "1",
                            [int(x) for x in cols[3].split()], [int(x) for x in cols[4].split()]))
    if len(out) < 4:
        raise RuntimeError("whisper-prompt.tsv has %d windows, not 4" % len(out))
    return out


def expected_scores(clip, ts):
    """faster-whisper's judgement of CLIP's windows (whisper-scores.tsv):
    {seek: (avg_logprob, compression_ratio, no_speech_prob)}."""
    out = {}
    with open(os.path.join(ROOT, "tests/unit/data/whisper-scores.tsv")) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if cols[0] == "scores" and cols[1] == clip and cols[2] == str(int(ts)):
                out[int(cols[3])] = tuple(float(x) for x in cols[4:7])
    if not out:
        raise RuntimeError("whisper-scores.tsv has no window of %s" % clip)
    return out


def scores_match(lines, want):
    """Whether every segment (JSON lines) carries its window's numbers as
    faster-whisper judged it (f32: within 5e-4)."""
    return bool(lines) and all(
        x["seek"] in want and
        abs(x["avg_logprob"] - want[x["seek"]][0]) < 5e-4 and
        abs(x["compression_ratio"] - want[x["seek"]][1]) < 1e-6 and
        abs(x["no_speech_prob"] - want[x["seek"]][2]) < 1e-3 for x in lines)


def json_lines(data):
    return [json.loads(ln) for ln in data.decode().splitlines() if ln]


def expected_condition(ts, prompt):
    """faster-whisper's windows of the JFK clip three times over, each
    conditioned on the text before it (whisper-condition.tsv): ([prompt
    ids of each window], [(seek, start, end, text) of each segment])."""
    prompts, segs = [], []
    with open(os.path.join(ROOT, "tests/unit/data/whisper-condition.tsv")) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if line.startswith("#") or cols[2] != str(int(ts)) or json.loads(cols[3]) != prompt:
                continue
            if cols[0] == "window":
                prompts.append([int(x) for x in cols[5].split()])
            else:
                segs.append((int(cols[4]), float(cols[5]), float(cols[6]), cols[7]))
    if not prompts or not segs:
        raise RuntimeError("whisper-condition.tsv has no windows for %r" % ((ts, prompt),))
    return prompts, segs


def check_condition(c, pcm):
    """Conditioning on previous text: each window of the JFK clip three
    times over after the text of the windows before it (and first the
    options' prompt), with and without timestamps, gives faster-whisper's
    segments after faster-whisper's prompts (their lengths in usage)."""
    gap = array.array("f", [0.0] * 16000)
    long = pcm + gap + pcm + gap + pcm
    text = [x for x in expected_prompted() if not x[1]][0][0]
    for ts in (False, True):
        for prompt in ("", text):
            prompts, want = expected_condition(ts, prompt)
            kw = dict(language="en", timestamps=ts, condition_on_previous_text=True,
                      no_speech_threshold=None)
            if prompt:
                kw["prompt"] = prompt
            r = transcribe(c, long, options(**kw))
            got = segments_of(b"".join(ch.tensor.data for ch in r.chunks
                                       if ch.tensor.name == "segments"))
            check(r.ok and same_segments(got, want) and
                  r.usage.get("prompt_tokens") == sum(len(p) for p in prompts),
                  "35 s conditioned on previous text, timestamps %s, prompt %r: faster-whisper's "
                  "segments after its %d prompt tokens: %r %r" % (
                      ts, prompt[:20], sum(len(p) for p in prompts), r.usage, got))


def check_judged(c, pcm):
    """The windows judged as faster-whisper judges them: a temperature list
    decodes a window again when it fails (the first window of the JFK clip
    three times over compresses too well: 2.48 > 2.4); silence is skipped
    only when it is probably no speech and not confidently decoded."""
    gap = array.array("f", [0.0] * 16000)
    long = pcm + gap + pcm + gap + pcm
    temps = [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    got = []
    for _ in range(2):
        r = c.infer("transcribe", {"audio": bc.Tensor("audio", "f32", [len(long)], long.tobytes()),
                                   "options": options(language="en", temperature=temps)},
                    sampling={"seed": 5}, stream=True)
        lines = json_lines(b"".join(ch.tensor.data for ch in r.chunks
                                    if ch.tensor.name == "segments"))
        texts = [ch for ch in r.chunks if ch.tensor.name == "text" and ch.tensor.data]
        got.append((r.ok, r.text(), [(x["seek"], x["temperature"]) for x in lines],
                    r.usage.get("prompt_tokens"), len(texts)))
    ok, text, seeks, prompt_tokens, chunks = got[0]
    # Window 0 at least twice (3 prompt tokens an attempt), then window 1
    # or more; the text a window at a time, each window's after its verdict.
    check(ok and "country" in text and prompt_tokens >= 3 * 3 and seeks and
          all(t in temps for _, t in seeks) and chunks <= len(set(s for s, _ in seeks)),
          "35 s, temperatures %r: window 0 decoded again (%r prompt tokens), segments %r, "
          "text in %d chunks: %r" % (temps, prompt_tokens, seeks, chunks, text))
    check(got[0] == got[1], "the fallback with one seed, twice: %r" % got)
    r = transcribe(c, long, options(language="en", temperature=0))
    lines = json_lines(b"".join(ch.tensor.data for ch in r.chunks if ch.tensor.name == "segments"))
    check(r.ok and scores_match(lines, expected_scores("jfk.wav*3", True)) and
          all(x["temperature"] == 0 for x in lines),
          "35 s at temperature 0 alone: no fallback, faster-whisper's numbers: %r" % lines)

    # Ten seconds of silence: Whisper says " you".  With timestamps the
    # window is probably no speech (0.76) and improbable (-1.05): skipped,
    # as faster-whisper skips it.  Without, its log probability (-0.86)
    # passes, and it is kept, as there.  With no_speech_threshold null,
    # nothing is skipped.
    zeros = array.array("f", [0.0] * 160000)
    for opts, want, what in [
            (options(language="en"), "", "skipped"),
            (options(language="en", timestamps=False), " you", "kept: probable enough"),
            (options(language="en", no_speech_threshold=None), " you", "kept: no threshold")]:
        r = transcribe(c, zeros, opts, stream=False)
        lines = json_lines(r.tensors["segments"].data) if "segments" in r.tensors else []
        check(r.ok and r.text("text") == want and len(lines) == (1 if want else 0) and
              all(x["no_speech_prob"] > 0.6 for x in lines),
              "10 s of silence, %s: %r %r" % (what, r.text("text"), lines))


def plain_ids():
    """faster-whisper's ids of the JFK clip without timestamps."""
    with open(os.path.join(ROOT, "tests/unit/data/whisper-ids.tsv")) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if cols[0] == "jfk.wav":
                return [int(x) for x in cols[2].split()]
    raise RuntimeError("whisper-ids.tsv has no line for jfk.wav")


def segment_tokens(data):
    """Every token of the backend's segments (JSON lines), in order."""
    return [t for ln in data.decode().splitlines() for t in json.loads(ln)["tokens"]]


def check_prompts(c, wav, want_plain):
    """A prompt (previous text): faster-whisper's ids after it, the prompt's
    tokens in usage; a prompt that is no string is refused."""
    for text, ts, pids, ids in expected_prompted():
        r = transcribe(c, wav, options(language="en", prompt=text, timestamps=ts))
        what = "prompt %r, timestamps %s" % (text[:24], ts)
        check(r.ok and r.usage.get("prompt_tokens") == len(pids) and
              r.usage.get("completion_tokens") == len(ids),
              "%s: %d prompt and %d tokens, as faster-whisper: %r %s" % (
                  what, len(pids), len(ids), r.usage, r.message))
        if ts:
            got = segment_tokens(b"".join(ch.tensor.data for ch in r.chunks
                                          if ch.tensor.name == "segments"))
            check(got == ids, "%s: the segments' tokens are faster-whisper's: %r" % (what, got))
        elif ids == plain_ids():
            check(r.text() == want_plain, "%s: faster-whisper's text: %r" % (what, r.text()))
    r = transcribe(c, wav, options(language="en", prompt=5))
    check(not r.ok and r.status == "INVALID_ARGUMENT" and "prompt is a string" in r.message,
          "a prompt that is no string: %s %s" % (r.status, r.message))


def segments_of(data):
    """The backend's segments (JSON lines) as (seek, start, end, text)."""
    out = []
    for ln in data.decode().splitlines():
        s = json.loads(ln)
        out.append((s["seek"], s["start"], s["end"], s["text"]))
    return out


def same_segments(got, want):
    return len(got) == len(want) and all(
        g[0] == w[0] and abs(g[1] - w[1]) < 0.005 and abs(g[2] - w[2]) < 0.005 and g[3] == w[3]
        for g, w in zip(got, want))


class Server:
    def __init__(self):
        self.dir = evidence.new_dir()
        with open(os.path.join(ROOT, "config/examples/voice.yaml")) as f:
            text = f.read()
        text = text.replace("/tmp/baton", self.dir)
        text = text.replace("models/whisper-base", os.path.join(ROOT, "models/whisper-base"))
        text = text.replace("models/smollm2", os.path.join(ROOT, "models/smollm2"))
        text = re.sub(r"(?m)^  log_level: .*$", "  log_level: warning", text)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        text, n = re.subn(r"(?m)^  http_listen: .*$", "  http_listen: 127.0.0.1:%d" % self.port,
                          text)
        assert n == 1, "voice.yaml no longer has http_listen"
        # A small upload limit, so that 413 is cheap to reach.
        text, n = re.subn(r"(?m)^  max_message_bytes: .*$", "  max_message_bytes: 4194304", text)
        assert n == 1, "voice.yaml no longer sets max_message_bytes"
        text, n = re.subn(r"(name: whisper\n(?:    .*\n)*?    max_batch: )\d+", r"\g<1>4", text)
        assert n == 1, "voice.yaml no longer sets the whisper model's max_batch"
        # f32 activations: this test compares ids with faster-whisper's
        # float32 ones, which only f32 promises to equal.  The 8-bit path
        # may part from them at a near tie, where the CPU's bf16 products
        # (AMX or AVX-512, whose sums run in different orders) decide;
        # test_whisper_engine checks it by that rule, prompts included.
        # The backend's code is the same in both modes.
        # A shorter limit on audio length, so that audio over it is cheap
        # to send.
        text, n = re.subn(r"max_audio_s: 600}", "max_audio_s: %d, activations: f32}"
                          % MAX_AUDIO_S, text)
        assert n == 1, "voice.yaml's whisper options changed"
        # Batch invariant LLM: the voice chat's answer is compared with the
        # chat graph's answer to the same turns, which reads the first's
        # prefix from the prefix cache; only then is that the same bits.
        text, n = re.subn(r"(smollm2-135m-instruct-q4_1.gguf, max_seq: 2048,)",
                          r"\1 batch_invariant: true,", text)
        assert n == 1, "voice.yaml's llm options changed"
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


def to_mp3(wav, out):
    """WAV file WAV as an MP3 file OUT, by libsndfile (ctypes); False when
    this libsndfile writes no MP3 (before 1.1)."""
    lib = ctypes.util.find_library("sndfile")
    if not lib:
        return False
    sf = ctypes.CDLL(lib)

    class Info(ctypes.Structure):
        _fields_ = [("frames", ctypes.c_int64), ("samplerate", ctypes.c_int),
                    ("channels", ctypes.c_int), ("format", ctypes.c_int),
                    ("sections", ctypes.c_int), ("seekable", ctypes.c_int)]
    sf.sf_open.restype = ctypes.c_void_p
    sf.sf_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(Info)]
    sf.sf_writef_short.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    sf.sf_close.argtypes = [ctypes.c_void_p]
    with wave.open(wav) as w:
        frames = w.readframes(w.getnframes())
    info = Info(0, 16000, 1, 0x230000 | 0x0082, 0, 0)  # SF_FORMAT_MPEG | MPEG_LAYER_III
    f = sf.sf_open(out.encode(), 0x20, ctypes.byref(info))  # SFM_WRITE
    if not f:
        return False
    buf = ctypes.create_string_buffer(frames)
    sf.sf_writef_short(f, buf, len(frames) // 2)
    sf.sf_close(f)
    return os.path.getsize(out) > 0


def curl(srv, path, *fields):
    """POST a form to the gateway with curl -F: (status, body)."""
    args = ["curl", "-s", "-N", "-w", "\n%{http_code}", "http://127.0.0.1:%d%s" % (srv.port, path)]
    for f in fields:
        args += ["-F", f]
    out = subprocess.run(args, capture_output=True, timeout=limits.test_limit(300)).stdout
    body, _, code = out.rpartition(b"\n")
    return int(code or 0), body.decode("utf-8", "replace")


def expected_languages():
    """faster-whisper's reading of the Spanish clip: {kind: (ids, text)}
    for transcribe and translate, and detect: (code, probability)."""
    rows = {}
    with open(os.path.join(ROOT, "tests/unit/data/whisper-languages.tsv")) as f:
        for line in f:
            if not line.startswith("#"):
                kind, _, a, b = line.rstrip("\n").split("\t")
                rows[kind] = (a, b) if kind == "detect" else ([int(x) for x in a.split()], b)
    return rows


def check_languages(c):
    """The Spanish clip (FLAC): its language detected, transcribed and
    translated, each as faster-whisper float32 reads it."""
    want = expected_languages()
    es = open(SPANISH, "rb").read()
    r = transcribe(c, es, options(timestamps=False), stream=False)
    lines = json_lines(r.tensors["segments"].data) if r.ok else []
    ids, text = want["transcribe"]
    check(r.ok and r.text("text") == text and [x["tokens"] for x in lines] == [ids] and
          lines[0]["language"] == want["detect"][0],
          "Spanish, the language detected (%s): faster-whisper's ids and text: %s %r"
          % (want["detect"][0], r.status, lines if r.ok else r.message))
    r = transcribe(c, es, options(language="es", task="translate", timestamps=False),
                   stream=False)
    lines = json_lines(r.tensors["segments"].data) if r.ok else []
    ids, text = want["translate"]
    check(r.ok and r.text("text") == text and [x["tokens"] for x in lines] == [ids],
          "Spanish translated into English: faster-whisper's ids and text: %s %r"
          % (r.status, lines if r.ok else r.message))
    # Over the model's limit on audio length: a file (8-bit WAV at 8 kHz)
    # and samples, each refused naming the option.
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(8000)
        w.writeframes(b"\x80" * (8000 * (MAX_AUDIO_S + 1)))
    for audio, what in ((buf.getvalue(), "a WAV file"),
                        (array.array("f", [0.0] * (16000 * (MAX_AUDIO_S + 1))), "samples")):
        r = transcribe(c, audio, options(language="en"), stream=False)
        check(r.status == "INVALID_ARGUMENT" and "max_audio_s" in r.message,
              "%s over max_audio_s: %s %s" % (what, r.status, r.message))
    return buf.getvalue()


def check_cli(srv, want):
    """batonctl transcribe against the daemon: the text as it streams, and
    a voice chat with a system prompt (the C client sends the file)."""
    ctl = [os.path.join(BUILD, "batonctl"), "--endpoint", srv.endpoint, "transcribe", JFK]
    r = subprocess.run(ctl + ["--language", "en"], capture_output=True, text=True,
                       timeout=limits.test_limit(300))
    check(r.returncode == 0 and r.stdout.strip() == want.strip(),
          "batonctl transcribe: the text (%d %r %s)" % (r.returncode, r.stdout, r.stderr[-300:]))
    r = subprocess.run(ctl + ["--graph", "voice_chat", "--system", TURNS[0]["content"]],
                       capture_output=True, text=True, timeout=limits.test_limit(300))
    lines = r.stdout.splitlines()
    check(r.returncode == 0 and len(lines) == 2 and lines[0] == "transcript: " + want and
          lines[1].startswith("answer: ") and len(lines[1]) > 10,
          "batonctl transcribe --graph voice_chat --system: the transcript, then the answer "
          "(%d %r %s)" % (r.returncode, r.stdout, r.stderr[-300:]))


def check_http(srv, want, want_segs, too_long):
    t = "/v1/audio/transcriptions"
    f = "file=@" + JFK
    # whisper-base is listed.
    code, body = curl(srv, "/v1/models")
    check(code == 200 and "whisper-base" in [m["id"] for m in json.loads(body)["data"]],
          "GET /v1/models lists whisper-base: %d %s" % (code, body[:300]))
    # A FLAC upload whose language the model detects, and its translation.
    code, body = curl(srv, t, "file=@" + SPANISH, "model=whisper-base",
                      "response_format=verbose_json")
    v = json.loads(body) if code == 200 else {}
    check(v.get("language") == expected_languages()["detect"][0] and
          all("language" not in s for s in v["segments"]),
          "verbose_json says the language detected: %d %s" % (code, body[:300]))
    code, body = curl(srv, "/v1/audio/translations", "file=@" + SPANISH, "model=whisper-base")
    check(code == 200 and "park" in json.loads(body)["text"],
          "POST /v1/audio/translations of the Spanish clip: %d %s" % (code, body[:300]))
    path = os.path.join(evidence.new_dir(), "long.wav")
    with open(path, "wb") as lf:
        lf.write(too_long)
    code, body = curl(srv, t, "file=@" + path, "model=whisper-base")
    e = json.loads(body).get("error", {}) if code == 400 else {}
    check(e.get("param") == "file" and "max_audio_s" in e.get("message", ""),
          "audio over max_audio_s: 400 naming the file: %d %s" % (code, body[:300]))
    code, body = curl(srv, t, f, "model=whisper-base", "language=en")
    check(code == 200 and json.loads(body)["text"] == want, "POST %s: %d %s" % (t, code, body))
    code, body = curl(srv, t, f, "model=whisper-base", "response_format=text")
    check(code == 200 and body == want.strip() + "\n", "response_format text: %r" % body)
    code, body = curl(srv, t, f, "model=whisper-base", "response_format=verbose_json")
    v = json.loads(body) if code == 200 else {}
    segs = [(x["seek"], x["start"], x["end"], x["text"]) for x in v.get("segments", [])]
    check(v.get("text") == want and abs(v.get("duration", 0) - 11.0) < 0.01 and
          same_segments(segs, want_segs) and [x["id"] for x in v["segments"]] == [0, 1] and
          v["segments"][0]["tokens"][0] == 50364 and
          scores_match(v["segments"], expected_scores("jfk.wav", True)),
          "verbose_json, with each segment's avg_logprob, compression_ratio and "
          "no_speech_prob: %s" % body)
    # A prompt (previous text): faster-whisper's tokens after it; one that
    # is not UTF-8, or too long, is a 400 naming it.
    text, _, _, ids = [x for x in expected_prompted() if x[1]][0]
    code, body = curl(srv, t, f, "model=whisper-base", "language=en",
                      "response_format=verbose_json", "prompt=" + text)
    v = json.loads(body) if code == 200 else {}
    check([x for s in v.get("segments", []) for x in s["tokens"]] == ids,
          "verbose_json after a prompt: faster-whisper's tokens: %d %s" % (code, body[:300]))
    bad = os.path.join(evidence.new_dir(), "prompt.bin")
    with open(bad, "wb") as pf:
        pf.write(b"caf\xe9")
    for field, why in (("prompt=<" + bad, "not valid UTF-8"), ("prompt=" + "x" * 2001, "at most")):
        code, body = curl(srv, t, f, "model=whisper-base", field)
        e = json.loads(body).get("error", {}) if code == 400 else {}
        check(e.get("param") == "prompt" and why in e.get("message", ""),
              "a prompt %s: %d %s" % (why, code, body[:200]))
    def clock(x):
        return ("00:00:%06.3f" % x).replace(".", ",")
    cues = "".join("%d\n%s --> %s\n%s\n\n" % (k + 1, clock(x[1]), clock(x[2]), x[3].strip())
                   for k, x in enumerate(want_segs))
    code, body = curl(srv, t, f, "model=whisper-base", "response_format=srt")
    check(code == 200 and body == cues, "srt: %r" % body)
    code, body = curl(srv, t, f, "model=whisper-base", "response_format=vtt")
    check(code == 200 and body.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:07.600\n") and
          "\n00:00:07.600 --> 00:00:10.600\nask what" in body, "vtt: %r" % body)
    code, body = curl(srv, t, f, "model=whisper-base", "stream=true")
    events = [json.loads(ln[6:]) for ln in body.splitlines() if ln.startswith("data: ")]
    deltas = "".join(e.get("delta", "") for e in events if e["type"] == "transcript.text.delta")
    check(code == 200 and len(events) == len(want_segs) + 1 and deltas == want and
          events[-1]["type"] == "transcript.text.done" and events[-1]["text"] == want,
          "stream: %d events" % len(events))
    # Temperature 0 (or none) falls back through higher temperatures, as
    # OpenAI's API says; the 35 s clip's first window fails at 0 (it
    # compresses too well) and is decoded again.  A stream does not fall
    # back: it sends each segment as it is decoded.
    long = os.path.join(evidence.new_dir(), "jfk3.wav")
    with wave.open(JFK) as w:
        one = w.readframes(w.getnframes())
    with wave.open(long, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes(one + bytes(32000) + one + bytes(32000) + one)
    code, body = curl(srv, t, "file=@" + long, "model=whisper-base", "language=en",
                      "response_format=verbose_json")
    v = json.loads(body) if code == 200 else {}
    first = [x for x in v.get("segments", []) if x["seek"] == 0]
    check(code == 200 and "country" in v.get("text", "") and first and
          v["usage"]["input_tokens"] >= 9,
          "35 s by HTTP at temperature 0: window 0 decoded again (%s input tokens), its "
          "segments at temperature %s" % (v.get("usage", {}).get("input_tokens"),
                                          [x["temperature"] for x in first]))
    # Windows are conditioned on the text before them, as OpenAI's and
    # faster-whisper's defaults.
    code, body = curl(srv, t, "file=@" + long, "model=whisper-base", "language=en",
                      "stream=true")
    events = [json.loads(ln[6:]) for ln in body.splitlines() if ln.startswith("data: ")]
    prompts, segs3 = expected_condition(True, "")
    want3 = "".join(x[3] for x in segs3)
    check(code == 200 and events and events[-1].get("text") == want3 and
          events[-1]["usage"]["input_tokens"] == sum(len(p) for p in prompts),
          "35 s streamed: no fallback, faster-whisper's text at temperature 0, conditioned on "
          "previous text: %r" % (events[-1] if events else body[:300]))
    code, body = curl(srv, "/v1/audio/translations", f, "model=whisper-base")
    check(code == 200 and json.loads(body)["text"].strip(), "translations: %d %s" % (code, body))
    mp3 = os.path.join(srv.dir, "jfk.mp3")
    if to_mp3(JFK, mp3):
        code, body = curl(srv, t, "file=@" + mp3, "model=whisper-base", "language=en")
        text = json.loads(body).get("text", "") if code == 200 else ""
        check("ask not what your country can do for you" in text, "an MP3 upload: %d %s" % (code, body))
    else:
        print("SKIP an MP3 upload: this libsndfile writes no MP3 (it needs 1.1 or later)")
    junk = os.path.join(srv.dir, "junk.bin")
    with open(junk, "wb") as fh:
        fh.write(b"not audio " * 500000)  # 5 MB, over the 4 MiB limit
    near = os.path.join(srv.dir, "near.bin")
    with open(near, "wb") as fh:
        fh.write(b"x" * (4194304 - 20000))
    empty = os.path.join(srv.dir, "empty.wav")
    open(empty, "wb").close()
    for fields, want_code, words, what in [
            (("file=@" + JFK, "model=nope"), 404, "does not exist", "an unknown model"),
            (("file=@" + README, "model=whisper-base"), 400, "WAV, FLAC, OGG or MP3", "not audio"),
            (("file=@" + empty, "model=whisper-base"), 400, "the file is empty", "an empty file"),
            (("model=whisper-base",), 400, "no file", "no file"),
            (("file=@" + JFK, "model=whisper-base", "response_format=xml"), 400,
             "response_format", "a bad response_format"),
            (("file=@" + JFK, "model=whisper-base", "bogus=1"), 400, "unknown form field",
             "an unknown field"),
            (("file=@" + junk, "model=whisper-base"), 413, "max_message_bytes", "over the limit"),
            # Under max_message_bytes but without room for the rest of the
            # request: refused here, never sent to be dropped unanswered.
            (("file=@" + near, "model=whisper-base"), 413, "less 64 KiB", "near the limit")]:
        code, body = curl(srv, t, *fields)
        err = json.loads(body).get("error", {}) if body.startswith("{") else {}
        check(code == want_code and words in err.get("message", ""),
              "%s: %d %s" % (what, code, body[:200]))
    out = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "-H",
                          "Content-Type: application/json", "-d", '{"model": "whisper-base"}',
                          "http://127.0.0.1:%d%s" % (srv.port, t)], capture_output=True).stdout
    check(out.endswith(b"400") and b"not a form" in out, "a JSON body: %r" % out[:200])
    script = r"""
import json, sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key="none")
r = c.audio.transcriptions.create(model="whisper-base", file=open(sys.argv[2], "rb"), language="en")
s = c.audio.transcriptions.create(model="whisper-base", file=open(sys.argv[2], "rb"), stream=True)
p = c.audio.transcriptions.create(model="whisper-base", file=open(sys.argv[2], "rb"), language="en",
                                  prompt="The following is a speech by President Kennedy.",
                                  response_format="verbose_json")
ev = [e.type for e in s]
try:
    c.audio.transcriptions.create(model="whisper-base", file=("x.wav", b"junk" * 100))
    bad = "accepted"
except openai.BadRequestError as e:
    bad = "400"
print(json.dumps({"text": r.text, "events": ev, "bad": bad,
                  "prompted": [t for x in p.segments for t in x.tokens]}))
"""
    got = openai_script(srv, script, "the openai package")
    prompted = [x[3] for x in expected_prompted()
                if x[0] == "The following is a speech by President Kennedy." and x[1]][0]
    if got is not None:
        check(got.get("text") == want and got.get("events", [""])[-1] == "transcript.text.done"
              and got.get("bad") == "400" and got.get("prompted") == prompted,
              "the openai package (a prompt: faster-whisper's tokens): %s" % got)


def joined(chunks, name):
    return b"".join(c.tensor.data for c in chunks if c.tensor.name == name).decode()


def check_voice_chat(srv, wav, want):
    with srv.client() as c:
        r = c.infer("voice_chat", {"audio": wav, "options": options(language="en")}, stream=True)
        check(r.ok, "voice_chat: %s %s" % (r.status, r.message))
        names = [ch.tensor.name for ch in r.chunks]
        heard, answer = joined(r.chunks, "transcript"), joined(r.chunks, "answer")
        check(heard == want, "voice_chat: the transcript streams as 'transcript': %r" % heard)
        check(answer.strip() and set(names) == {"transcript", "answer"} and
              names.index("answer") > len(names) - 1 - names[::-1].index("transcript"),
              "voice_chat: then the answer as 'answer': %r" % answer)
        check(r.loop_ends.get("answer_loop") in ("finish", "max_iters"),
              "voice_chat: the answer's loop ended: %r" % r.loop_ends)
        # The LLM's answer is the chat graph's for the transcript as the
        # prompt (both greedy, one at a time).
        chat = c.infer("chat", {"prompt": want})
        check(chat.ok and chat.text() == answer,
              "voice_chat: the chat graph answers the transcript alike: %r" % chat.text())
        r2 = c.infer("voice_chat", {"audio": wav, "options": options(language="en")},
                     stream=False)
        check(r2.ok and r2.text("transcript") == want and r2.text("answer") == answer,
              "voice_chat without stream: outputs transcript and answer: %r" %
              sorted(r2.tensors))
        # The transcription's own temperature (options) over the request's:
        # greedy words, whatever the answer samples at.
        r3 = c.infer("voice_chat", {"audio": wav, "options": options(language="en",
                                                                      temperature=0)},
                     sampling={"temperature": 1.5, "seed": 3}, max_iters={"answer_loop": 4})
        check(r3.ok and r3.text("transcript") == want,
              "options temperature 0, request temperature 1.5: the greedy transcript (%s %r)"
              % (r3.status, r3.text("transcript") if r3.ok else r3.message))
        r3 = transcribe(c, wav, options(temperature=3), stream=False)
        check(r3.status == "INVALID_ARGUMENT" and "temperature" in r3.message,
              "options temperature 3: %s %s" % (r3.status, r3.message))
        # A system prompt and earlier turns, as messages into the optional
        # input `context`: the LLM reads them, then the transcript as the
        # user's last turn, as the chat graph reads the same turns.
        r4 = c.infer("voice_chat", {"audio": wav, "options": options(language="en")},
                     messages=TURNS, messages_input="context")
        chat4 = c.infer("chat", messages=TURNS + [{"role": "user", "content": want}])
        check(r4.ok and chat4.ok and r4.text("transcript") == want and
              r4.text("answer") == chat4.text() and r4.text("answer") != answer,
              "voice_chat after a system prompt and two turns: the chat graph's answer to "
              "them and the transcript (%s %r / %r)" % (r4.status, r4.text("answer") if r4.ok
                                                        else r4.message, chat4.text()))
        check(r4.usage.get("prompt_tokens", 0) > r2.usage.get("prompt_tokens", 0) + 10,
              "the earlier turns count in usage: %r against %r" % (r4.usage, r2.usage))
        r5 = c.infer("voice_chat", {"audio": wav, "options": options(language="en"),
                                    "context": "You answer in French."}, stream=False)
        check(r5.status == "INVALID_ARGUMENT" and "want the request's messages" in r5.message,
              "context as text rather than messages: %s %s" % (r5.status, r5.message))
    return answer


# A conversation before a spoken question: a system prompt and a turn.
TURNS = [{"role": "system", "content": "You are a history teacher. Answer in one sentence."},
         {"role": "user", "content": "Who was the 35th president of the United States?"},
         {"role": "assistant", "content": "John F. Kennedy."}]


def post_json(srv, body, path="/v1/chat/completions"):
    """POST BODY (a dict) as JSON to the gateway with curl: (status, body)."""
    args = ["curl", "-s", "-N", "-w", "\n%{http_code}", "-H", "Content-Type: application/json",
            "--data-binary", "@-", "http://127.0.0.1:%d%s" % (srv.port, path)]
    out = subprocess.run(args, input=json.dumps(body).encode(), capture_output=True,
                         timeout=limits.test_limit(300)).stdout
    body, _, code = out.rpartition(b"\n")
    return int(code or 0), body.decode("utf-8", "replace")


def check_voice_http(srv, wav, want, answer):
    """voice-chat over POST /v1/chat/completions: an input_audio part in,
    the answer as the message and the transcript beside it."""
    b64 = base64.b64encode(wav).decode()
    audio = {"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}}
    msgs = [{"role": "user", "content": [audio]}]
    code, body = post_json(srv, {"model": "voice-chat", "messages": msgs, "temperature": 0})
    r = json.loads(body) if code == 200 else {}
    content = r.get("choices", [{}])[0].get("message", {}).get("content")
    check(code == 200 and r.get("transcript") == want and content == answer,
          "voice-chat: the answer, and the transcript beside it (%d %s)" % (code, body[:300]))
    code, body = post_json(srv, {"model": "voice-chat", "messages": msgs, "temperature": 0,
                                 "stream": True, "stream_options": {"include_usage": True}})
    events = [ln[6:] for ln in body.splitlines() if ln.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    heard = "".join(c.get("transcript", "") for c in chunks)
    said = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    kinds = ["t" if "transcript" in c else "a" for c in chunks if "transcript" in c or c["choices"]]
    check(code == 200 and heard == want and said == answer and events[-1] == "[DONE]" and
          "".join(kinds).startswith("t") and "t" not in "".join(kinds).lstrip("t") and
          chunks[-1].get("usage", {}).get("completion_tokens", 0) > 0,
          "voice-chat streamed: the transcript's pieces, then the answer's (%d, %d events)"
          % (code, len(events)))
    code, body = post_json(srv, {"model": "voice-chat", "messages": msgs, "temperature": 0,
                                 "max_tokens": 3})
    r = json.loads(body) if code == 200 else {}
    check(code == 200 and r["choices"][0]["finish_reason"] == "length" and
          r.get("transcript") == want,
          "voice-chat: max_tokens cuts the answer, not the transcript (%d %s)" % (code, body[:300]))
    # A system prompt and earlier turns before the spoken question: the
    # answer is smollm2's to those turns and the transcript.
    code, body = post_json(srv, {"model": "voice-chat", "messages": TURNS + msgs,
                                 "temperature": 0})
    code2, body2 = post_json(srv, {"model": "smollm2", "temperature": 0, "messages":
                                   TURNS + [{"role": "user", "content": want}]})
    r = json.loads(body) if code == 200 else {}
    r2 = json.loads(body2) if code2 == 200 else {}
    content = r.get("choices", [{}])[0].get("message", {}).get("content")
    check(code == 200 and r.get("transcript") == want and content and content != answer and
          content == r2.get("choices", [{}])[0].get("message", {}).get("content") and
          r["usage"]["prompt_tokens"] > r2["usage"]["prompt_tokens"],
          "voice-chat after a system prompt and a turn: smollm2's answer to them and the "
          "transcript, usage counting both models (%d %s / %d %s)" % (code, body[:300], code2,
                                                                       body2[:300]))
    for b, words, what in [
            ({"model": "voice-chat", "messages": [{"role": "user", "content": "hi"}]},
             "one input_audio part", "a text message to voice-chat"),
            ({"model": "voice-chat", "messages": msgs + [{"role": "user", "content": "Why?"}]},
             "the last message is the user's", "audio in an earlier turn"),
            ({"model": "voice-chat", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Be brief."}, audio]}]},
             "belongs in a system message", "text beside the audio"),
            ({"model": "smollm2", "messages": msgs}, "takes text", "audio to a text model"),
            ({"model": "voice-chat", "messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": "!!", "format": "wav"}}]}]},
             "not valid base64", "bad base64"),
            ({"model": "voice-chat", "messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": b64, "format": "aiff"}}]}]},
             "'format'", "an unknown format"),
            ({"model": "voice-chat", "messages": [{"role": "user", "content": [audio, audio]}]},
             "only one input_audio", "two audio parts"),
            ({"model": "voice-chat", "messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {
                    "data": base64.b64encode(b"x" * (4194304 - 20000)).decode(),
                    "format": "wav"}}]}]}, "less 64 KiB", "audio near the limit"),
            ({"model": "voice-chat", "messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {
                    "data": base64.b64encode(b"not audio" * 100).decode(), "format": "wav"}}]}]},
             "WAV, FLAC, OGG or MP3", "not audio")]:
        want_code = 413 if "limit" in what else 400
        for stream in (False, True):
            code, body = post_json(srv, dict(b, stream=stream))
            err = json.loads(body).get("error", {}) if body.startswith("{") else {}
            check(code == want_code and words in err.get("message", "") and
                  err.get("param") == "messages",
                  "voice-chat, %s, stream=%s: %d (%d %s)" % (what, stream, want_code, code,
                                                             body[:200]))
    script = r"""
import json, sys, base64, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key="none")
b64 = base64.b64encode(open(sys.argv[2], "rb").read()).decode()
r = c.chat.completions.create(model="voice-chat", temperature=0, messages=[{"role": "user",
    "content": [{"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}}]}])
print(json.dumps({"answer": r.choices[0].message.content,
                  "transcript": (r.model_extra or {}).get("transcript")}))
"""
    got = openai_script(srv, script, "voice-chat through the openai package")
    if got is not None:
        check(got.get("answer") == answer and got.get("transcript") == want,
              "voice-chat through the openai package: %s" % got)


def openai_script(srv, script, what):
    """Runs SCRIPT with the openai package (test_openai.py's venv), given the
    gateway's base URL and the JFK clip: its last line of output as JSON,
    {} when it failed, or None (after a SKIP line for WHAT) without the venv."""
    venv_py = os.path.join(os.path.expanduser(os.environ.get("BATON_TEST_CACHE",
                                                             "~/.cache/baton-test")),
                           "openai-venv", "bin", "python")
    if not os.path.exists(venv_py):
        print("SKIP %s: no venv (tests/integration/test_openai.py makes it)" % what)
        return None
    r = subprocess.run([venv_py, "-c", script, "http://127.0.0.1:%d/v1" % srv.port, JFK],
                       capture_output=True, text=True, timeout=limits.test_limit(300))
    if r.returncode != 0:
        print(r.stderr[-1000:])
        return {}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    missing = [p for p in (MODEL, LLM, JFK) if not os.path.exists(p)]
    if missing:
        if os.environ.get("BATON_CI") == "1":
            print("FAIL %s absent, and with BATON_CI=1 the model tests must run"
                  % " and ".join(missing))
            return 1
        print("SKIP: %s absent (scripts/fetch-model.sh whisper-base smollm2 jfk)"
              % " and ".join(missing))
        return 77
    want_plain = expected_text()
    want_segs = expected_segments("jfk.wav")
    want = "".join(x[3] for x in want_segs)
    wav = open(JFK, "rb").read()
    srv = Server()
    try:
        with srv.client() as c:
            r = transcribe(c, wav, options(language="en"))
            check(r.ok, "jfk.wav transcribed: %s %s" % (r.status, r.message))
            check(r.text() == want, "the text is faster-whisper's: %r" % r.text())
            segs = segments_of(b"".join(ch.tensor.data for ch in r.chunks
                                        if ch.tensor.name == "segments"))
            check(same_segments(segs, want_segs),
                  "the segments are faster-whisper's: %r" % segs)
            lines = json_lines(b"".join(ch.tensor.data for ch in r.chunks
                                        if ch.tensor.name == "segments"))
            check(scores_match(lines, expected_scores("jfk.wav", True)),
                  "each segment carries its window's avg_logprob, compression_ratio and "
                  "no_speech_prob, faster-whisper's: %r" % lines)
            check(len([ch for ch in r.chunks if ch.tensor.name == "text"]) == len(want_segs),
                  "the text streamed a segment at a time: %d chunks" % len(r.chunks))
            check(r.usage.get("completion_tokens") == 28 and r.usage.get("prompt_tokens") == 3,
                  "usage counts the prompt and the 28 tokens (4 timestamps): %r" % r.usage)
            check(r.loop_ends.get("windows") == "finish", "windows ended: %r" % r.loop_ends)

            r = transcribe(c, wav, options(language="en", timestamps=False))
            check(r.ok and r.text() == want_plain,
                  "without timestamps, faster-whisper's text: %r" % r.text())
            lines = json_lines(b"".join(ch.tensor.data for ch in r.chunks
                                        if ch.tensor.name == "segments"))
            check(len(r.chunks) > 10 and len(lines) == 1 and lines[0]["text"] == want_plain and
                  (lines[0]["start"], lines[0]["end"]) == (0, 11.0) and
                  scores_match(lines, expected_scores("jfk.wav", False)),
                  "without timestamps the text streamed in %d chunks, the window one segment "
                  "at its end: %r" % (len(r.chunks), lines))
            check(r.usage.get("completion_tokens") == 25 and r.usage.get("prompt_tokens") == 4,
                  "usage without timestamps: the prompt and 25 tokens: %r" % r.usage)
            check_prompts(c, wav, want_plain)
            r2 = transcribe(c, wav, options(language="en"), stream=False)
            check(r2.ok and r2.text("text") == want and
                  same_segments(segments_of(r2.tensors["segments"].data), want_segs),
                  "without stream: outputs text and segments: %r" % sorted(r2.tensors))

            r = transcribe(c, wav, bc.Tensor("options", "u8", [0], b""))
            check(r.ok and r.text() == want, "language detected: %r" % r.text())

            # Sampling: one seed gives one text, whatever runs around it.
            texts = []
            for _ in range(2):
                r = c.infer("transcribe", {"audio": wav, "options": options(language="en")},
                            sampling={"temperature": 0.9, "seed": 11})
                texts.append(r.text() if r.ok else "(%s %s)" % (r.status, r.message))
            check(texts[0] == texts[1] and "country" in texts[0],
                  "sampling at temperature 0.9, seed 11, twice: %r" % texts)

            pcm = samples(JFK)
            gap = array.array("f", [0.0] * 16000)
            r = transcribe(c, pcm + gap + pcm + gap + pcm, options(language="en"))
            check(r.ok, "35 s of samples: %s %s" % (r.status, r.message))
            segs = segments_of(b"".join(ch.tensor.data for ch in r.chunks
                                        if ch.tensor.name == "segments"))
            check(same_segments(segs, expected_segments("jfk.wav*3")),
                  "35 s: faster-whisper's segments, the last from the window that seeked back: %r"
                  % segs)
            runs = [x for x in r.timings if x.node == "encode"]
            check(len(runs) == 3, "the encoder ran for 2 windows and the empty one that ends "
                  "the loop: %d" % len(runs))
            check_judged(c, pcm)
            check_condition(c, pcm)
            too_long = check_languages(c)
            r = transcribe(c, pcm + pcm + pcm, options(language="en", timestamps=False))
            n = r.text().count("ask not what your country can do for you")
            runs = [x for x in r.timings if x.node == "encode"]
            check(r.ok and n >= 2 and len(runs) == 2,
                  "33 s without timestamps: 2 windows, the second where the first ended (%d "
                  "runs): %r" % (len(runs), r.text()))
            # A prompt goes to the first window only (faster-whisper's
            # initial_prompt without conditioning on previous text).
            text, _, pids, _ = [x for x in expected_prompted() if not x[1]][0]
            r2 = transcribe(c, pcm + pcm + pcm, options(language="en", timestamps=False,
                                                         prompt=text))
            check(r2.ok and r2.usage.get("prompt_tokens") == len(pids) + 4,
                  "33 s with a prompt: %d prompt tokens in the first window, 4 in the second: "
                  "%r" % (len(pids), r2.usage))

            # Bad input: a clear error each, and the daemon serves on.
            for audio, opts, what, words in [
                    (b"not audio at all" * 10, options(), "not audio", "WAV, FLAC, OGG or MP3"),
                    (wav, bc.Tensor("options", "u8", [3], b"{x:"), "bad JSON", "options"),
                    (wav, options(language="xx"), "unknown language", "language 'xx'"),
                    (wav, options(task="summarize"), "unknown task", "task"),
                    (wav, options(beam=5), "unknown option", "unknown key 'beam'"),
                    (wav, options(timestamps="yes"), "timestamps not a boolean",
                     "timestamps is true or false"),
                    (wav, options(condition_on_previous_text=1), "condition not a boolean",
                     "condition_on_previous_text is true or false"),
                    (wav, options(temperature=[0, 0.5, 3]), "a temperature of 3 in a list",
                     "temperature is a number from 0 to 2, or a list"),
                    (wav, options(temperature=[0.1] * 9), "nine temperatures", "1 to 8"),
                    (wav, options(temperature=[]), "no temperature", "1 to 8"),
                    (wav, options(no_speech_threshold=1.5), "no_speech_threshold 1.5",
                     "no_speech_threshold is a probability from 0 to 1, or null"),
                    (wav, options(log_prob_threshold="low"), "log_prob_threshold a string",
                     "log_prob_threshold is a number, or null"),
                    (array.array("f", [0.0] * 10), options(), "ten samples", "frame"),
                    (bc.Tensor("audio", "i32", [4], bytes(16)), options(), "I32 audio",
                     "U8")]:
                r = transcribe(c, audio, opts, stream=False)
                check(r.status == "INVALID_ARGUMENT" and words in r.message,
                      "%s: %s %s" % (what, r.status, r.message))
            check(c.health().ready, "ready after the bad requests")

        answer = check_voice_chat(srv, wav, want)
        check_cli(srv, want)
        check_http(srv, want, want_segs, too_long)
        check_voice_http(srv, wav, want, answer)

        # Seven at once, on four decoding slots (max_batch 4): batched
        # windows and steps, the three windows that find no slot wait for
        # one (they were refused before), and each gives the text alone
        # gives.
        results = [None] * 7

        def one(k):
            with srv.client() as c:
                results[k] = transcribe(c, wav, options(language="en"), stream=False)
        threads = [threading.Thread(target=one, args=(k,)) for k in range(len(results))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        check(all(r is not None and r.ok and r.text() == want for r in results),
              "seven at once on four slots: %r"
              % [(r.status, r.message, r.text()) if r else None for r in results])

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
