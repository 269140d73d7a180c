#!/usr/bin/python3
"""bench_voice.py -- a spoken question answered in one request (the graph
voice_chat of config/examples/voice.yaml: Whisper base on one worker,
SmolLM2 on another) against the same done as two requests, a
transcription followed by a chat of its text (voice.yaml's graphs
transcribe and chat), side by side in one run.

Measured from the end of the upload of the JFK clip (models/samples/jfk.wav,
11 s) to the first token of the answer, the median of --runs runs of each
(after one warm-up), the two ways taking turns:
  - over HTTP: POST /v1/chat/completions to the model voice-chat with the
    clip as an input_audio part, streamed; against POST
    /v1/audio/transcriptions (whole), then POST /v1/chat/completions to
    smollm2 with its text, streamed;
  - natively (ZeroMQ, client/python): the graph voice_chat, streamed;
    against the graph transcribe, then the graph chat with its text.
Each also reports when the transcript was complete, and the gap from
there to the first answer token (what chaining in one graph can save: the
transcription itself is the same work either way, and its time varies
from run to run more than the gap does).  Both ways are greedy, so the
answers must be equal: the run checks that they are.

    /usr/bin/python3 tests/bench/bench_voice.py [--runs N] [--json FILE]

Writes build/bench/bench_voice.json (or --json).  Exits 1 when a request
fails or the two ways answer differently; never for a time.
"""
import argparse
import base64
import http.client
import json
import os
import re
import socket
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_whisper as bw  # noqa: E402

bc = bw.bc
BUILD = bw.BUILD
JFK = os.path.join(ROOT, "models/samples/jfk.wav")
NEEDS = [os.path.join(ROOT, p) for p in ("models/whisper-base/model.bin",
                                         "models/smollm2-135m-instruct-q4_1.gguf",
                                         "models/samples/jfk.wav")]


class Server:
    def __init__(self, tmp):
        self.dir = tempfile.mkdtemp(prefix="baton-bench-voice-", dir=tmp)
        with open(os.path.join(ROOT, "config/examples/voice.yaml")) as f:
            text = f.read()
        text = text.replace("/tmp/baton", self.dir)
        text = text.replace("models/", os.path.join(ROOT, "models") + "/")
        text = re.sub(r"(?m)^  log_level: .*$", "  log_level: warning", text)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        text = re.sub(r"(?m)^  http_listen: .*$", "  http_listen: 127.0.0.1:%d" % self.port, text)
        self.proc, self.log, self.endpoint = bw.start_batond(self.dir, text)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def post(port, path, body, ctype):
    """Sends a POST; returns (connection, the time its body was sent)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", path, body=body, headers={"Content-Type": ctype})
    return conn, time.perf_counter()


def sse_until_answer(resp, t0):
    """Reads a chat stream: (seconds to the transcript's end or None,
    seconds to the first answer token, the whole answer)."""
    heard_at = first = None
    answer = ""
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            raise RuntimeError("stream error: %s" % ev)
        if "transcript" in ev:
            heard_at = time.perf_counter() - t0
        for ch in ev.get("choices", []):
            piece = ch.get("delta", {}).get("content")
            if piece:
                if first is None:
                    first = time.perf_counter() - t0
                answer += piece
    return heard_at, first, answer


def chat_stream(port, model, content, t0=None):
    """A greedy chat completion of one user message, streamed: (seconds to
    the transcript's end or None, to the first answer token, the answer),
    from T0 or else from the end of this request's upload."""
    body = json.dumps({"model": model, "temperature": 0, "stream": True,
                       "messages": [{"role": "user", "content": content}]})
    conn, sent = post(port, "/v1/chat/completions", body, "application/json")
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError("%s: %d %s" % (model, resp.status, resp.read()[:300]))
    out = sse_until_answer(resp, sent if t0 is None else t0)
    conn.close()
    return out


def http_one(port, wav_b64):
    heard, first, answer = chat_stream(port, "voice-chat", [
        {"type": "input_audio", "input_audio": {"data": wav_b64, "format": "wav"}}])
    return {"transcript_s": heard, "first_token_s": first, "answer": answer}


def http_two(port, wav):
    boundary = "bench-voice-boundary"
    form = (("--%s\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-base\r\n"
             "--%s\r\nContent-Disposition: form-data; name=\"language\"\r\n\r\nen\r\n"
             "--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"jfk.wav\"\r\n"
             "Content-Type: audio/wav\r\n\r\n") % (boundary, boundary, boundary)).encode() + \
        wav + ("\r\n--%s--\r\n" % boundary).encode()
    conn, t0 = post(port, "/v1/audio/transcriptions", form,
                    "multipart/form-data; boundary=" + boundary)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError("transcription: %d %s" % (resp.status, data[:300]))
    heard = time.perf_counter() - t0
    _, first, answer = chat_stream(port, "smollm2", json.loads(data)["text"], t0)
    return {"transcript_s": heard, "first_token_s": first, "answer": answer}


def native_stream(c, graph, inputs, t0, heard_name, answer_name):
    """Streams GRAPH: (seconds to the last chunk of HEARD_NAME, seconds to
    the first chunk of ANSWER_NAME, the text of each); a name may be None."""
    rid = c.send(graph, inputs, stream=True)
    heard_at = first = None
    texts = {heard_name: b"", answer_name: b""}
    while True:
        ev = c.recv()
        if ev.request_id != rid:
            continue
        if ev.is_chunk:
            name = ev.tensor.name
            if name in texts:
                texts[name] += ev.tensor.data
            if name == heard_name:
                heard_at = time.perf_counter() - t0
            if name == answer_name and first is None and ev.tensor.data:
                first = time.perf_counter() - t0
            continue
        if not ev.ok:
            raise RuntimeError("%s: %s %s" % (graph, ev.status, ev.message))
        return heard_at, first, texts[heard_name].decode(), texts[answer_name].decode()


def native_one(c, wav, opts):
    t0 = time.perf_counter()
    heard, first, _, answer = native_stream(c, "voice_chat", {"audio": wav, "options": opts}, t0,
                                            "transcript", "answer")
    return {"transcript_s": heard, "first_token_s": first, "answer": answer}


def native_two(c, wav, opts):
    t0 = time.perf_counter()
    heard, _, text, _ = native_stream(c, "transcribe", {"audio": wav, "options": opts}, t0,
                                      "text", None)
    _, first, _, answer = native_stream(c, "chat", {"prompt": text}, t0, None, "text")
    return {"transcript_s": heard, "first_token_s": first, "answer": answer}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", default=os.path.join(BUILD, "bench", "bench_voice.json"))
    a = ap.parse_args()
    missing = [p for p in NEEDS if not os.path.exists(p)]
    if missing:
        sys.exit("bench_voice: run scripts/fetch-model.sh whisper-base smollm2 jfk first "
                 "(missing %s)" % ", ".join(missing))
    wav = open(JFK, "rb").read()
    wav_b64 = base64.b64encode(wav).decode()
    opts = bc.Tensor("options", "u8", [17], b'{"language":"en"}')
    ways = {
        "HTTP, one request (voice-chat)": lambda s, c: http_one(s.port, wav_b64),
        "HTTP, transcription then chat": lambda s, c: http_two(s.port, wav),
        "native, one request (voice_chat)": lambda s, c: native_one(c, wav, opts),
        "native, transcribe then chat": lambda s, c: native_two(c, wav, opts),
    }
    runs = {k: [] for k in ways}
    with tempfile.TemporaryDirectory(prefix="bench-voice-") as tmp:
        srv = Server(tmp)
        try:
            with bc.Client(srv.endpoint) as c:
                for k, f in ways.items():
                    f(srv, c)  # warm-up
                for _ in range(a.runs):
                    for k, f in ways.items():
                        runs[k].append(f(srv, c))
        finally:
            srv.stop()
    answers = {r["answer"] for rs in runs.values() for r in rs}
    print("%-34s %16s %20s %18s" % ("", "transcript done", "first answer token",
                                     "gap between them"))
    out = {}
    for k, rs in runs.items():
        t = statistics.median(r["transcript_s"] for r in rs)
        f = statistics.median(r["first_token_s"] for r in rs)
        g = statistics.median(r["first_token_s"] - r["transcript_s"] for r in rs)
        out[k] = {"transcript_s": t, "first_token_s": f, "gap_s": g, "runs": rs}
        print("%-34s %15.3fs %19.3fs %17.3fs" % (k, t, f, g))
    for kind, one, two in (("HTTP", "HTTP, one request (voice-chat)",
                            "HTTP, transcription then chat"),
                           ("native", "native, one request (voice_chat)",
                            "native, transcribe then chat")):
        print("%s: one request / two, time to the first answer token: %.2f; the gap: %.2f" % (
            kind, out[one]["first_token_s"] / out[two]["first_token_s"],
            out[one]["gap_s"] / out[two]["gap_s"]))
    same = len(answers) == 1
    print("answers equal across every run and way: %s" % ("yes" if same else "NO: %r" % answers))
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"runs": a.runs, "clip": "jfk.wav (11 s)", "answers_equal": same,
                   "results": out}, f, indent=1)
    print("wrote", a.json)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
