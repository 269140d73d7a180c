#!/usr/bin/python3
"""End-to-end tests: real batond and baton-worker processes, real sockets.

Run by tests/integration/run.sh (`make test`).  Uses Debian's python3 with
python3-zmq and python3-protobuf (scripts/install-deps.sh installs them);
the protobuf module is generated from proto/baton.proto with protoc.

Every test talks to the daemon the way an outside client does: a ZeroMQ
DEALER sending serialized ClientMessages.  Its sends and receives are
bounded (SEND_TIMEOUT_MS, the call's timeout): a client the daemon refuses
gets no answer, it does not hang.  Each daemon runs in a folder of
evidence.new_dir(), kept with its batond.log when a check fails
(tests/integration/evidence.py).  The closing line is
"e2e: N passed, N failed".
"""
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import json
import urllib.error
import urllib.request

import zmq

import evidence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
GEN = evidence.scratch_dir("pb")
subprocess.check_call(["protoc", "--python_out=" + GEN, "-I" + ROOT, "proto/baton.proto"], cwd=ROOT)
sys.path.insert(0, os.path.join(GEN, "proto"))
import baton_pb2 as pb  # noqa: E402

I32 = pb.I32
TIMEOUT = 15.0
# The longest a send may wait for room (a client with no connection: one
# the daemon refused, whose pipe ZeroMQ tore down, never gets any).
SEND_TIMEOUT_MS = 10000


class SendTimeout(AssertionError):
    """A send found no connection to the daemon in time."""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def i32(*vals):
    return struct.pack("<%di" % len(vals), *vals)


def as_i32(t):
    return list(struct.unpack("<%di" % (len(t.data) // 4), t.data))


class Daemon:
    def __init__(self, config_text, extra_env=None, wait=True, own_group=False):
        self.dir = evidence.new_dir()
        self.port = free_port()
        text = config_text.replace("/tmp/baton-e2e", self.dir)
        text = text.replace("127.0.0.1:19464", "127.0.0.1:%d" % self.port)
        self.config = os.path.join(self.dir, "baton.yaml")
        with open(self.config, "w") as f:
            f.write(text)
        self.endpoint = "ipc://%s/baton.sock" % self.dir
        self.log = open(os.path.join(self.dir, "batond.log"), "w")
        env = dict(os.environ)
        env.update(extra_env or {})
        # own_group: batond leads a process group, as a shell's foreground
        # job does, so a test can signal the group as a terminal would.
        self.proc = subprocess.Popen([os.path.join(BUILD, "batond"), "--config", self.config],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=own_group)
        self.ctx = zmq.Context.instance()
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout=30.0):
        c = self.client()
        deadline = time.time() + timeout
        while time.time() < deadline:
            h = c.health(timeout=1.0)
            if h is not None and h.ready:
                break
            if self.proc.poll() is not None:
                raise RuntimeError("batond exited: %s" % self.tail())
            time.sleep(0.05)
        else:
            raise RuntimeError("batond not ready: %s" % self.tail())
        c.close()

    def tail(self):
        self.log.flush()
        with open(os.path.join(self.dir, "batond.log")) as f:
            return f.read()[-3000:]

    def client(self):
        return Client(self.ctx, self.endpoint)

    def worker_pid(self, name):
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid), "-f", "--", "--name %s " % name],
                             capture_output=True, text=True).stdout.split()
        return int(out[0]) if out else None

    def metrics(self):
        return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port,
                                      timeout=5).read().decode()

    def metric(self, name, labels):
        pat = re.compile(r"^%s\{%s\} (\S+)$" % (re.escape(name), re.escape(labels)), re.M)
        m = pat.search(self.metrics())
        return float(m.group(1)) if m else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        evidence.release(self.dir)  # removed once the check passes, else kept


class Client:
    """A DEALER to batond.  CURVE: (server public key, own public key, own
    secret key), Z85 bytes.  Nothing it does blocks for ever: sends wait
    SEND_TIMEOUT_MS at most (or the call's timeout), receives are polled
    with a timeout, and closing drops what was not sent (LINGER 0)."""

    def __init__(self, ctx, endpoint, curve=None):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
        self.sock.setsockopt(zmq.RCVTIMEO, int(TIMEOUT * 1000))
        if curve:
            self.sock.curve_serverkey, self.sock.curve_publickey, \
                self.sock.curve_secretkey = curve
        self.endpoint = endpoint
        self.sock.connect(endpoint)
        self.n = 0

    def close(self):
        self.sock.close()

    def send(self, msg, timeout=None):
        """Sends MSG; raises SendTimeout when there is no room for it within
        TIMEOUT seconds (default SEND_TIMEOUT_MS)."""
        ms = SEND_TIMEOUT_MS if timeout is None else int(timeout * 1000)
        try:
            if self.sock.poll(ms, zmq.POLLOUT):
                self.sock.send(msg.SerializeToString(), zmq.NOBLOCK)
                return
        except zmq.Again:
            pass
        raise SendTimeout("no connection to %s to send on within %d ms" % (self.endpoint, ms))

    def recv(self, timeout=TIMEOUT):
        if not self.sock.poll(int(timeout * 1000)):
            return None
        m = pb.ServerMessage()
        m.ParseFromString(self.sock.recv())
        return m

    def request(self, graph, inputs, rid=None, stream=False, timeout_ms=0, max_iters=None,
                seed=None, messages=None, messages_input=None, stop=(), max_tokens=0,
                text_output="", raw_inputs=()):
        self.n += 1
        rid = rid or "r%d-%d" % (os.getpid(), self.n)
        m = pb.ClientMessage()
        q = m.infer
        q.request_id = rid
        q.graph = graph
        q.stream = stream
        q.timeout_ms = timeout_ms
        for name, (dtype, dims, data) in inputs.items():
            t = q.inputs.add()
            t.name = name
            t.dtype = dtype
            t.dims.extend(dims)
            t.data = data
        for k, v in (max_iters or {}).items():
            q.max_iters[k] = v
        if seed is not None:
            q.sampling.seed = seed
        for role, content in messages or []:
            t = q.messages.add()
            t.role = role
            t.content = content
        if messages_input:
            q.messages_input = messages_input
        q.stop.extend(stop)
        q.max_tokens = max_tokens
        q.text_output = text_output
        q.raw_inputs.extend(raw_inputs)
        self.send(m)
        return rid

    def wait(self, rid, timeout=TIMEOUT):
        """Chunks and the response of RID (other requests' messages are kept)."""
        chunks = []
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = self.recv(max(0.01, deadline - time.time()))
            if m is None:
                break
            if m.HasField("chunk") and m.chunk.request_id == rid:
                chunks.append(m.chunk)
            elif m.HasField("response") and m.response.request_id == rid:
                return chunks, m.response
        raise AssertionError("no response for %s within %.0fs" % (rid, timeout))

    def infer(self, graph, inputs, timeout=TIMEOUT, **kw):
        rid = self.request(graph, inputs, **kw)
        return self.wait(rid, timeout)

    def health(self, timeout=TIMEOUT):
        """The daemon's Health, or None when it gives none within TIMEOUT
        seconds (or the send finds no connection in that time)."""
        m = pb.ClientMessage()
        m.health.SetInParent()
        try:
            self.send(m, timeout)
        except SendTimeout:
            return None
        r = self.recv(timeout)
        return r.health if r is not None and r.HasField("health") else None


def X(*vals):
    return {"x": (I32, [len(vals)], i32(*vals))}


# ---- tests ----------------------------------------------------------------

def test_echo(d, c):
    chunks, r = c.infer("echo", {"x": (I32, [2, 3], i32(1, 2, 3, 4, 5, 6))})
    assert r.status.code == pb.OK, r.status
    assert len(r.outputs) == 1 and r.outputs[0].name == "x"
    assert list(r.outputs[0].dims) == [2, 3] and as_i32(r.outputs[0]) == [1, 2, 3, 4, 5, 6]
    assert len(r.timings) == 1 and r.timings[0].node == "e" and r.timings[0].worker == "cpu0"


def test_hop_across_workers(d, c):
    _, r = c.infer("hop", X(7, 8, 9))
    assert r.status.code == pb.OK, r.status
    assert as_i32(r.outputs[0]) == [7, 8, 9]
    assert [t.worker for t in r.timings] == ["cpu0", "cpu1"]


def test_large_tensor_fetched(d, c):
    n = 100000  # 400 KB: over the 64 KiB inline limit, so it is fetched
    vals = list(range(n))
    _, r = c.infer("hop", {"x": (I32, [n], i32(*vals))})
    assert r.status.code == pb.OK, r.status
    assert as_i32(r.outputs[0]) == vals


def test_fanin_two_workers(d, c):
    _, r = c.infer("fanin", X(1, 2, 3))
    assert r.status.code == pb.OK, r.status
    assert as_i32(r.outputs[0]) == [2, 4, 6]


def test_loop_streams_tokens(d, c):
    chunks, r = c.infer("count", X(0), stream=True)
    assert r.status.code == pb.OK, r.status
    assert [k.seq for k in chunks] == [0, 1, 2, 3, 4]
    assert [as_i32(k.value)[0] for k in chunks] == [0, 1, 2, 3, 4]
    outs = {o.name: o for o in r.outputs}
    assert as_i32(outs["state"]) == [0, 1, 2, 3, 4]  # accumulate, in iteration order
    assert "it" not in outs  # streamed, so not repeated in the response


def test_loop_without_stream_joins(d, c):
    _, r = c.infer("count", X(0))
    assert r.status.code == pb.OK, r.status
    outs = {o.name: o for o in r.outputs}
    assert as_i32(outs["it"]) == [0, 1, 2, 3, 4]


def test_request_max_iters(d, c):
    _, r = c.infer("count", X(0), max_iters={"count_loop": 3})
    assert r.status.code == pb.OK, r.status
    assert as_i32({o.name: o for o in r.outputs}["it"]) == [0, 1, 2]
    # How the loop ended: by the request's cap here, by the counter's finish
    # signal (after 5) without one.  Test backends count no tokens: no usage.
    assert dict(r.loop_ends) == {"count_loop": pb.LOOP_END_MAX_ITERS}, r.loop_ends
    assert not r.HasField("usage"), r.usage
    _, r = c.infer("count", X(0))
    assert r.status.code == pb.OK, r.status
    assert dict(r.loop_ends) == {"count_loop": pb.LOOP_END_FINISH}, r.loop_ends


def test_stream_into_consumer(d, c):
    chunks, r = c.infer("stream", X(5), stream=True)
    assert r.status.code == pb.OK, r.status
    assert [k.seq for k in chunks] == list(range(len(chunks)))
    vals = sum((as_i32(k.value) for k in chunks), [])
    assert vals == [0, 1, 2, 3], vals


def test_nested_loops(d, c):
    _, r = c.infer("nested", X(1))
    assert r.status.code == pb.OK, r.status
    assert as_i32({o.name: o for o in r.outputs}["it"]) == [0, 1, 2, 3] * 3
    assert dict(r.loop_ends) == {"outer": pb.LOOP_END_MAX_ITERS,
                                 "inner": pb.LOOP_END_MAX_ITERS}, r.loop_ends


def test_node_failure(d, c):
    _, r = c.infer("broken", X(1))
    assert r.status.code == pb.INTERNAL, r.status
    assert "boom" in r.status.message and "injected failure" in r.status.message, r.status


def test_deadline(d, c):
    t0 = time.time()
    _, r = c.infer("slow", X(1), timeout_ms=50)
    assert r.status.code == pb.DEADLINE_EXCEEDED, r.status
    # Reported, not asserted: timing bounds flake on a loaded machine.
    print("  deadline answered after %.2fs" % (time.time() - t0))


def test_cancel(d, c):
    rid = c.request("slow", X(1))
    time.sleep(0.05)
    m = pb.ClientMessage()
    m.cancel.request_id = rid
    c.send(m)
    # The cancel's own answer comes first: it found the request.
    a = c.recv()
    assert a is not None and a.HasField("cancel"), a
    assert a.cancel.request_id == rid and a.cancel.status.code == pb.OK, a.cancel
    _, r = c.wait(rid)
    assert r.status.code == pb.CANCELLED, r.status
    # Once it has ended, its id is unknown.
    c.send(m)
    a = c.recv()
    assert a is not None and a.HasField("cancel"), a
    assert a.cancel.status.code == pb.NOT_FOUND and rid in a.cancel.status.message, a.cancel


def test_deferred_turns(d, c):
    """count_gate has one place, which a request's loop holds from its first
    iteration to its finish (four iterations, a 50 ms nap in each).  Four
    requests at once take turns: the worker holds a loop's first iteration
    back (the backend defers it) until the place is free, and each ends OK
    with its own iterations.  One whose deadline passes while it waits ends
    DEADLINE_EXCEEDED; nothing is left in the pools, and the place is free
    again after."""
    rids = [c.request("gated", X(k)) for k in range(4)]
    late = c.request("gated", X(9), timeout_ms=100)
    got = {}
    deadline = time.time() + TIMEOUT
    while len(got) < 5 and time.time() < deadline:
        m = c.recv(max(0.01, deadline - time.time()))
        if m is None:
            break
        if m.HasField("response"):
            got[m.response.request_id] = m.response
    assert set(got) == set(rids + [late]), sorted(got)
    for rid in rids:
        r = got[rid]
        assert r.status.code == pb.OK, (rid, r.status)
        assert as_i32({o.name: o for o in r.outputs}["it"]) == [0, 1, 2, 3], r.outputs
        assert dict(r.loop_ends) == {"gate_loop": pb.LOOP_END_FINISH}, r.loop_ends
    assert got[late].status.code == pb.DEADLINE_EXCEEDED, got[late].status
    wait_pool_empty(d)
    _, r = c.infer("gated", X(0))
    assert r.status.code == pb.OK, r.status


def test_duplicate_id(d, c):
    rid = c.request("slow", X(1), rid="dup-1")
    c.request("slow", X(1), rid="dup-1")
    m = c.recv()
    assert m.HasField("response") and m.response.request_id == "dup-1"
    assert m.response.status.code == pb.ALREADY_EXISTS, m.response.status
    _, r = c.wait(rid)
    assert r.status.code == pb.OK  # the first one is unaffected


def test_admission(d, c):
    rids = [c.request("slow", X(i)) for i in range(70)]
    codes = {}
    for _ in rids:
        m = c.recv()
        assert m is not None and m.HasField("response")
        codes[m.response.request_id] = m.response.status.code
    exhausted = sum(1 for v in codes.values() if v == pb.RESOURCE_EXHAUSTED)
    assert exhausted >= 6, codes
    assert all(v in (pb.OK, pb.RESOURCE_EXHAUSTED) for v in codes.values()), codes


def bad_cases():
    """(what, frame bytes or ClientMessage, expected code)."""
    def req(**kw):
        m = pb.ClientMessage()
        q = m.infer
        q.request_id = kw.pop("rid", "bad")
        q.graph = kw.pop("graph", "echo")
        for t in kw.pop("inputs", [("x", I32, [1], i32(1))]):
            x = q.inputs.add()
            x.name, x.dtype = t[0], t[1]
            x.dims.extend(t[2])
            x.data = t[3]
        for k, v in kw.pop("max_iters", {}).items():
            q.max_iters[k] = v
        return m
    INV, NF = pb.INVALID_ARGUMENT, pb.NOT_FOUND
    cases = [
        ("garbage bytes", b"\xff\xfe\xfd\x00garbage", INV),
        ("truncated protobuf", req().SerializeToString()[:-3], INV),
        ("empty ClientMessage", pb.ClientMessage(), INV),
        ("zero-length frame", b"", INV),
        ("wrong wire type", b"\x0d\x01\x02\x03\x04", INV),
        ("unknown graph", req(graph="nope"), NF),
        ("empty graph name", req(graph=""), NF),
        ("empty request_id", req(rid=""), INV),
        ("request_id over 256 bytes", req(rid="r" * 300), INV),
        ("missing input", req(inputs=[]), INV),
        ("undeclared input", req(inputs=[("x", I32, [1], i32(1)), ("zz", I32, [1], i32(1))]), INV),
        ("duplicate input", req(inputs=[("x", I32, [1], i32(1)), ("x", I32, [1], i32(2))]), INV),
        ("dtype unspecified", req(inputs=[("x", 0, [1], i32(1))]), INV),
        ("dtype out of enum", req(inputs=[("x", 99, [1], i32(1))]), INV),
        ("negative dim", req(inputs=[("x", I32, [-1], i32(1))]), INV),
        ("dims overflow", req(inputs=[("x", I32, [2**40, 2**40], b"")]), INV),
        ("too few bytes", req(inputs=[("x", I32, [4], i32(1))]), INV),
        ("too many bytes", req(inputs=[("x", I32, [1], i32(1, 2))]), INV),
        ("bytes for empty dims", req(inputs=[("x", I32, [0], i32(1))]), INV),
        ("too many dims", req(inputs=[("x", I32, [1] * 9, i32(1))]), INV),
        ("f16 odd bytes", req(inputs=[("x", pb.F16, [2], b"\x00\x01\x02")]), INV),
        ("max_iters unknown loop", req(graph="count", max_iters={"nope": 3}), INV),
        ("max_iters on a node", req(graph="count", max_iters={"tick": 3}), INV),
        ("max_iters zero", req(graph="count", max_iters={"count_loop": 0}), INV),
        ("oversized frame", b"\x0a" + b"\x00" * (1 << 20), pb.RESOURCE_EXHAUSTED),
        ("unicode graph name", req(graph="\u00e9cho"), NF),
        ("nul in request_id", req(rid="a\x00b"), INV),
        ("huge dims count", req(inputs=[("x", I32, [1] * 64, i32(1))]), INV),
        ("input with empty name", req(inputs=[("", I32, [1], i32(1))]), INV),
        ("bool with wrong size", req(inputs=[("x", pb.BOOL, [3], b"\x01")]), INV),
        ("i64 misaligned", req(inputs=[("x", pb.I64, [1], b"\x00" * 4)]), INV),
    ]
    return cases


def test_hostile_inputs(d, c):
    for what, msg, code in bad_cases():
        frame = msg if isinstance(msg, bytes) else msg.SerializeToString()
        c.sock.send(frame)
        r = c.recv(5)
        assert r is not None and r.HasField("response"), what
        if code is not None:
            assert r.response.status.code == code, (what, r.response.status)
            assert r.response.status.message, what
    # A multi-frame message is read to its last frame.
    c.sock.send_multipart([b"", X(3)["x"][2]])
    r = c.recv(5)
    assert r is not None and r.response.status.code == pb.INVALID_ARGUMENT
    # A cancel for an unknown id is answered NOT_FOUND, and nothing else.
    m = pb.ClientMessage()
    m.cancel.request_id = "never-seen"
    c.send(m)
    r = c.recv(5)
    assert r is not None and r.HasField("cancel"), r
    assert r.cancel.request_id == "never-seen" and r.cancel.status.code == pb.NOT_FOUND, r
    assert "no request 'never-seen' is in flight" in r.cancel.status.message, r
    assert c.recv(0.2) is None
    # Still serving.
    _, r = c.infer("echo", X(42))
    assert r.status.code == pb.OK and as_i32(r.outputs[0]) == [42]
    assert c.health().ready


def varint(n):
    out = b""
    while True:
        b = n & 0x7f
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def ld(number, data):
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(data)) + data


def infer_frame(rid=b"w1", graph=b"echo", name=b"x", tensor_extra=b"", extra=b""):
    """An InferRequest frame with raw bytes where protobuf's Python runtime
    would refuse to write them."""
    t = ld(1, name) + b"\x10" + bytes([I32]) + ld(3, b"\x01") + ld(4, i32(5)) + tensor_extra
    q = ld(1, rid) + ld(2, graph) + ld(3, t) + extra
    return ld(1, q)


def test_strict_door(d, c):
    """What protobuf-c lets through is refused at the door, with a reply the
    client's own protobuf runtime can read (recv parses every reply)."""
    def ask(frame):
        c.sock.send(frame)
        r = c.recv(5)
        assert r is not None and r.HasField("response"), frame
        return r.response
    # A field numbered 0 (the overlong varint 80 00) in a tensor: refused
    # at the door, not passed on to a worker that cannot parse it.
    r = ask(infer_frame(rid=b"w-tag0", tensor_extra=b"\x80\x00\x00"))
    assert r.request_id == "w-tag0" and r.status.code == pb.INVALID_ARGUMENT, r
    assert "numbered 0" in r.status.message and "infer.inputs[0]" in r.status.message, r
    # Another unknown field is dropped at the door: the request runs.
    r = ask(infer_frame(rid=b"w-unknown", tensor_extra=b"\x98\x06\x07"))
    assert r.request_id == "w-unknown" and r.status.code == pb.OK, r
    assert as_i32(r.outputs[0]) == [5], r
    # Invalid UTF-8 anywhere: refused, and never echoed.
    for rid, graph, name, where, code_rid in (
            (b"w-g", b"ech\xc3", b"x", "infer.graph is not valid UTF-8", "w-g"),
            (b"w-n", b"echo", b"x\xff", "infer.inputs[0].name is not valid UTF-8", "w-n"),
            (b"w\xed\xa0\x80", b"echo", b"x", "infer.request_id is not valid UTF-8", "")):
        r = ask(infer_frame(rid=rid, graph=graph, name=name))
        assert r.status.code == pb.INVALID_ARGUMENT and r.status.message == where, r
        assert r.request_id == code_rid, r
    r = ask(infer_frame(rid=b"w-stop", extra=ld(10, b"\xc3\x28")))
    assert r.status.code == pb.INVALID_ARGUMENT and "infer.stop[0]" in r.status.message, r
    # Ids with a NUL: two different ids, both refused, neither cut to "a".
    for rid in (b"a\x00b", b"a\x00c"):
        r = ask(infer_frame(rid=rid))
        assert r.status.code == pb.INVALID_ARGUMENT, r
        assert r.status.message == "infer.request_id holds a NUL byte", r
        assert r.request_id == "", r
    r = ask(infer_frame(rid=b"w-nul-input", name=b"x\x00y"))
    assert r.status.code == pb.INVALID_ARGUMENT and r.request_id == "w-nul-input", r
    # A cancel whose id holds a NUL gets a CancelResponse that says so.
    c.sock.send(ld(2, ld(1, b"a\x00b")))
    r = c.recv(5)
    assert r is not None and r.HasField("cancel"), r
    assert r.cancel.status.code == pb.INVALID_ARGUMENT and r.cancel.request_id == "", r
    # A long name of two-byte characters, cut by the message buffer, is cut
    # between characters.
    for pad in ("", "a"):
        r = ask(infer_frame(rid=b"w-long", graph=(pad + "\u00e9" * 400).encode()))
        assert r.status.code == pb.NOT_FOUND and r.status.message.startswith("no graph named"), r
    m = pb.ClientMessage()
    m.cancel.request_id = "b" + "\u00e9" * 200
    c.send(m)
    r = c.recv(5)
    assert r is not None and r.cancel.status.code == pb.NOT_FOUND, r
    # Still serving.
    _, r = c.infer("echo", X(42))
    assert r.status.code == pb.OK and as_i32(r.outputs[0]) == [42]


def worker_messages(d, worker, direction, zmq=False):
    name = "baton_worker_zmq_messages_total" if zmq else "baton_worker_messages_total"
    v = d.metric(name, 'worker="%s",direction="%s"' % (worker, direction))
    assert v is not None, name
    return v


def test_messages_batched(d, c):
    """One-node requests one after another: each request's Put and Dispatch
    leave the conductor as one ZeroMQ message, and its Release and
    SessionClose ride with a later one; the worker answers a Put whose id
    the conductor chose only when it fails.  Counts messages, not time: at
    worst (a slow machine, the closing messages going at the tick) there
    are two ZeroMQ messages a request for four protocol messages."""
    n = 40
    keys = [("to_worker", False), ("to_worker", True), ("from_worker", False)]
    before = {k: worker_messages(d, "cpu0", *k) for k in keys}
    t0 = time.time()
    for i in range(n):
        _, r = c.infer("echo", X(i, -i))
        assert r.status.code == pb.OK, r.status
        assert as_i32(r.outputs[0]) == [i, -i]
    heartbeats = int(time.time() - t0) + 2
    after = {k: worker_messages(d, "cpu0", *k) for k in keys}
    sent = after[("to_worker", False)] - before[("to_worker", False)]
    zsent = after[("to_worker", True)] - before[("to_worker", True)]
    got = after[("from_worker", False)] - before[("from_worker", False)]
    assert sent >= 2 * n, sent  # a Put and a Dispatch each, at least
    assert 2 * zsent <= sent, (zsent, sent)
    # A Done each, and the heartbeats of the time it took; no Placed.
    assert n <= got <= n + heartbeats, (got, n, heartbeats)


def test_quick_models_inline(d, c):
    """The echo models' batches take microseconds, under the workers'
    default inline_us (50 us): after a few on a lane, each worker's I/O
    thread runs them itself, which the heartbeats report.  Hop requests
    (echo on cpu0, then echo on cpu1) go on until both counters moved;
    what is asserted is that they did, and that every answer is right."""
    name = "baton_worker_inline_batches_total"
    workers = ("cpu0", "cpu1")
    before = {w: d.metric(name, 'worker="%s"' % w) for w in workers}
    assert None not in before.values(), before
    moved = {}
    for i in range(400):
        _, r = c.infer("hop", X(i))
        assert r.status.code == pb.OK and as_i32(r.outputs[0]) == [i], r.status
        if i % 20 == 19:
            deadline = time.time() + 3  # a heartbeat a second carries the counter
            while time.time() < deadline:
                moved = {w: d.metric(name, 'worker="%s"' % w) - before[w] for w in workers}
                if all(v > 0 for v in moved.values()):
                    return
                time.sleep(0.2)
    assert False, "the I/O threads ran no batch: %s" % moved


def test_stats_and_metrics(d, c):
    m = pb.ClientMessage()
    m.stats.SetInParent()
    c.send(m)
    r = c.recv()
    assert "baton_requests_total" in r.stats.text
    text = d.metrics()
    assert 'baton_requests_total{graph="echo",code="OK"}' in text
    assert "baton_request_duration_seconds_bucket" in text
    assert 'baton_pool_bytes_used{worker="cpu0"}' in text
    m = pb.ClientMessage()
    m.inspect.graph = "hop"
    c.send(m)
    r = c.recv()
    assert "transfers:" in r.inspect.text and "cpu0 -> cpu1" in r.inspect.text


def test_load_many_sockets(d, c):
    n_sockets, per = 8, 250
    errors = []

    def run(k):
        cl = d.client()
        try:
            pending = {}
            for i in range(per):
                g = ("echo", "hop", "count", "fanin")[i % 4]
                pending[cl.request(g, X(i), rid="L%d-%d" % (k, i))] = g
                if len(pending) >= 8 or i == per - 1:  # 8 sockets x 8 = max_inflight
                    while pending:
                        m = cl.recv()
                        if m is None:
                            errors.append("socket %d: timeout with %d pending" % (k, len(pending)))
                            return
                        if m.HasField("response"):
                            if m.response.request_id not in pending:
                                errors.append("unexpected or second response %s" % m.response.request_id)
                            elif m.response.status.code != pb.OK:
                                errors.append("%s: %s" % (m.response.request_id, m.response.status))
                            pending.pop(m.response.request_id, None)
        finally:
            cl.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n_sockets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    wait_pool_empty(d)


def wait_pool_empty(d, timeout=5.0, workers=("cpu0", "cpu1")):
    deadline = time.time() + timeout
    while time.time() < deadline:
        used = [d.metric("baton_pool_bytes_used", 'worker="%s"' % w) for w in workers]
        if all(u == 0.0 for u in used):
            return
        time.sleep(0.2)
    raise AssertionError("pool bytes still in use: %s" % used)


def wait_all_unavailable(c, rids, timeout):
    """Every request of RIDS ends UNAVAILABLE (their worker died), each
    within TIMEOUT seconds of the last."""
    seen = 0
    while seen < len(rids):
        m = c.recv(timeout)
        assert m is not None, "requests not ended after the worker died"
        if m.HasField("response"):
            assert m.response.status.code == pb.UNAVAILABLE, m.response.status
            seen += 1


def wait_restarted(d, c, worker, old_pid, timeout=10.0):
    """The pid of WORKER's new incarnation once the daemon is ready again."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        h = c.health(1)
        pid = d.worker_pid(worker)
        if h and h.ready and pid not in (None, old_pid):
            return pid
        time.sleep(0.05)
    raise AssertionError("worker %s did not come back" % worker)


def test_worker_killed_under_load(d, c):
    pid = d.worker_pid("cpu0")
    assert pid, "no cpu0 worker process"
    rids = [c.request("slow", X(i)) for i in range(10)]
    time.sleep(0.1)
    t0 = time.time()
    os.kill(pid, signal.SIGKILL)
    wait_all_unavailable(c, rids, 5)
    # Reported, not asserted: a timing bound would flake on a loaded machine.
    print("  requests ended %.2fs after the kill" % (time.time() - t0))
    wait_restarted(d, c, "cpu0", pid)
    _, r = c.infer("hop", X(5))
    assert r.status.code == pb.OK, r.status
    assert d.metric("baton_worker_restarts_total", 'worker="cpu0"') >= 1
    wait_pool_empty(d)


def test_metrics_listener_cannot_stall(d, c):
    """Idle or slow scrapers must not block the conductor's only thread."""
    idle = []
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", d.port))
        idle.append(s)
    t0 = time.time()
    for i in range(20):
        _, r = c.infer("echo", X(i))
        assert r.status.code == pb.OK
    # A blocked loop would never answer (the scrapers send nothing), so
    # infer's own timeout catches a stall; the time is only reported.
    print("  20 requests beside 20 idle scrapers: %.2fs" % (time.time() - t0))
    # A request line split over two segments is still understood.
    s = socket.create_connection(("127.0.0.1", d.port))
    s.sendall(b"GET /met")
    time.sleep(0.1)
    s.sendall(b"rics HTTP/1.0\r\n\r\n")
    s.settimeout(5)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    assert re.match(rb"HTTP/1\.[01] 200 ", data) and b"baton_requests_total" in data, data[:200]
    s.close()
    s = socket.create_connection(("127.0.0.1", d.port))
    s.sendall(b"GET /metricsXYZ HTTP/1.0\r\n\r\n")
    s.settimeout(5)
    assert re.match(rb"HTTP/1\.[01] 404 ", s.recv(100))
    s.close()
    for s in idle:
        s.close()


def http_get(port, path, method="GET"):
    """(status, body) of METHOD PATH on the daemon's HTTP port."""
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_http_health(d, c):
    """/health is 200 only when ready: 503 while a worker is missing and
    while draining.  Unknown paths and methods get JSON errors."""

    st, body = http_get(d.port, "/health")
    assert st == 200 and json.loads(body)["status"] == "ready", (st, body)
    st, body = http_get(d.port, "/nope")
    assert st == 404 and "error" in json.loads(body), (st, body)
    st, body = http_get(d.port, "/metrics", "POST")
    assert st == 405 and "error" in json.loads(body), (st, body)
    # A worker that never comes (spawn: external): not ready, and why.
    with open(os.path.join(ROOT, "tests/integration/configs/e2e.yaml")) as f:
        config = f.read().replace("{name: cpu1, device: cpu, pool_mb: 64}",
                                  "{name: cpu1, device: cpu, pool_mb: 64, spawn: external}")
    d2 = Daemon(config, wait=False)
    try:
        deadline = time.time() + 10
        st = None
        while time.time() < deadline:
            try:
                st, body = http_get(d2.port, "/health")
                break
            except OSError:
                time.sleep(0.05)              # not listening yet
        assert st == 503, (st, body)
        h = json.loads(body)
        assert h["status"] == "not ready" and "cpu1" in h["detail"], h
    finally:
        d2.stop()
    # Draining: a request holds the daemon in its drain; /health says 503.
    d3 = Daemon(open(os.path.join(ROOT, "tests/integration/configs/e2e.yaml")).read())
    c3 = d3.client()
    try:
        rid = c3.request("slow", X(1))
        time.sleep(0.05)
        d3.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 3
        seen = None
        while time.time() < deadline and seen != 503:
            try:
                seen, _ = http_get(d3.port, "/health")
            except OSError:
                break                         # already stopped: the drain was missed
        assert seen == 503, seen
        m = c3.recv(10)
        assert m is not None and m.HasField("response") and m.response.request_id == rid
    finally:
        c3.close()
        d3.stop()


def test_terminal_ctrl_c_drains(d, c):
    """Ctrl-C in a terminal signals the whole foreground process group: the
    conductor must drain (the request in flight ends OK) and the workers
    must not take the signal themselves (which would end it UNAVAILABLE)."""
    with open(os.path.join(ROOT, "tests/integration/configs/e2e.yaml")) as f:
        d2 = Daemon(f.read(), own_group=True)
    c2 = d2.client()
    try:
        rid = c2.request("slow", X(1))
        time.sleep(0.1)
        os.killpg(d2.proc.pid, signal.SIGINT)
        m = c2.recv(10)
        while m is not None and not m.HasField("response"):
            m = c2.recv(10)
        assert m is not None and m.response.request_id == rid, m
        assert m.response.status.code == pb.OK, m.response.status
        assert d2.proc.wait(timeout=15) == 0, d2.tail()
        # No worker died of the signal (that would be logged as a lost worker).
        assert "lost" not in d2.tail() and "signal" not in d2.tail(), d2.tail()
    finally:
        c2.close()
        d2.stop()


def test_second_batond_refused(d, c):
    """A second batond on the same config must refuse to start, not take
    the first one's sockets (after which the first would serve nobody)."""
    r = subprocess.run([os.path.join(BUILD, "batond"), "--config", d.config],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0, r
    assert "another process serves it" in r.stdout + r.stderr, r.stdout + r.stderr
    _, resp = c.infer("echo", X(3))
    assert resp.status.code == pb.OK, resp.status


def test_seed_drawn_and_reported(d, c):
    """A request without a seed (or with 0) runs with one the daemon draws,
    different each time, and the response reports it; a client's seed is
    kept and reported as sent."""
    seeds = []
    for kw in ({}, {}, {"seed": 0}):
        _, r = c.infer("echo", X(1), **kw)
        assert r.status.code == pb.OK, r.status
        seeds.append(r.seed)
    assert all(seeds) and len(set(seeds)) == 3, seeds
    _, r = c.infer("echo", X(1), seed=12345)
    assert r.seed == 12345, r.seed


def test_metrics_text_is_valid(d, c):
    """/metrics passes promtool's check (every family has HELP and TYPE,
    its lines together, histograms and summaries complete), and streamed
    tokens are counted: 5 per streamed request of the count graph, one time
    to first token and four inter-token gaps each."""
    before = d.metric("baton_tokens_generated_total", 'graph="count"') or 0
    ttft0 = d.metric("baton_time_to_first_token_seconds_count", 'graph="count"') or 0
    itl0 = d.metric("baton_inter_token_latency_seconds_count", 'graph="count"') or 0
    for _ in range(2):
        _, r = c.infer("count", X(0), stream=True)
        assert r.status.code == pb.OK, r.status
    assert d.metric("baton_tokens_generated_total", 'graph="count"') == before + 10
    assert d.metric("baton_time_to_first_token_seconds_count", 'graph="count"') == ttft0 + 2
    assert d.metric("baton_inter_token_latency_seconds_count", 'graph="count"') == itl0 + 8
    assert d.metric("baton_node_queue_seconds_count", 'graph="count",node="tick"') >= 10
    text = d.metrics()
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (Debian package prometheus; scripts/install-deps.sh)"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    # Every sample belongs to the family announced last (lines grouped).
    family = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            family = line.split()[2]
        elif line and not line.startswith("#"):
            name = re.match(r"[a-z_]+", line).group(0)
            assert family and (name == family or
                               re.fullmatch(re.escape(family) + r"_(bucket|sum|count)", name)), \
                (family, line)


TESTS = [test_echo, test_hop_across_workers, test_large_tensor_fetched, test_fanin_two_workers,
         test_loop_streams_tokens, test_loop_without_stream_joins, test_request_max_iters,
         test_stream_into_consumer, test_nested_loops, test_node_failure, test_deadline,
         test_cancel, test_deferred_turns, test_duplicate_id, test_hostile_inputs, test_strict_door, test_admission,
         test_stats_and_metrics, test_metrics_listener_cannot_stall, test_http_health,
         test_terminal_ctrl_c_drains, test_second_batond_refused, test_seed_drawn_and_reported,
         test_metrics_text_is_valid, test_load_many_sockets, test_messages_batched,
         test_quick_models_inline,
         test_worker_killed_under_load]


def test_sigterm_drain(config):
    d = Daemon(config)
    c = d.client()
    try:
        rids = [c.request("slow", X(i)) for i in range(5)]
        time.sleep(0.05)
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        late = c.request("echo", X(1))
        codes = {}
        while len(codes) < 6:
            m = c.recv(10)
            assert m is not None, "drain lost a response"
            if m.HasField("response"):
                codes[m.response.request_id] = m.response.status.code
        assert codes[late] == pb.UNAVAILABLE, codes
        assert all(codes[r] == pb.OK for r in rids), codes
        assert d.proc.wait(timeout=10) == 0
        left = [f for f in os.listdir("/dev/shm") if f.startswith("baton-%d-" % d.proc.pid)]
        assert not left, left
    finally:
        c.close()
        d.stop()


def test_external_worker(config):
    """A `spawn: external` worker is started by someone else and connects in."""
    text = config.replace("  - {name: cpu1, device: cpu, pool_mb: 64}",
                          "  - {name: cpu1, device: cpu, pool_mb: 64, spawn: external}")
    assert text != config
    d = Daemon(text, wait=False)
    # The worker's output, kept with batond.log as evidence.
    wlog = open(os.path.join(d.dir, "cpu1.log"), "w")
    worker = subprocess.Popen([os.path.join(BUILD, "baton-worker"), "--config", d.config,
                               "--name", "cpu1", "--run-id", "ext%d" % os.getpid()],
                              stdout=wlog, stderr=subprocess.STDOUT)
    try:
        d.wait_ready()
        c = d.client()
        _, r = c.infer("hop", X(4, 5))
        assert r.status.code == pb.OK, r.status
        assert [t.worker for t in r.timings] == ["cpu0", "cpu1"]
        # batond does not restart it; it notices the missed heartbeats.
        worker.kill()
        worker.wait()
        deadline = time.time() + 8
        while time.time() < deadline:
            h = c.health(1)
            if h is not None and not h.ready:
                break
            time.sleep(0.1)
        assert h is not None and not h.ready, "external worker loss not noticed"
        _, r = c.infer("hop", X(1))
        assert r.status.code == pb.UNAVAILABLE, r.status
        left = [f for f in os.listdir("/dev/shm") if f.startswith("baton-ext%d-" % os.getpid())]
        assert not left, left  # the conductor unlinked the dead worker's pool
        # A stalled (not dead) external worker is lost, then told to restart
        # when it speaks again; a new one registers and serves.
        worker = subprocess.Popen([os.path.join(BUILD, "baton-worker"), "--config", d.config,
                                   "--name", "cpu1", "--run-id", "ext%d" % os.getpid()],
                                  stdout=wlog, stderr=subprocess.STDOUT)
        d.wait_ready()
        worker.send_signal(signal.SIGSTOP)
        deadline = time.time() + 8
        while time.time() < deadline:
            h = c.health(1)
            if h is not None and not h.ready:
                break
            time.sleep(0.1)
        worker.send_signal(signal.SIGCONT)
        assert worker.wait(timeout=10) == 0  # it obeyed the Shutdown
        worker = subprocess.Popen([os.path.join(BUILD, "baton-worker"), "--config", d.config,
                                   "--name", "cpu1", "--run-id", "ext%d" % os.getpid()],
                                  stdout=wlog, stderr=subprocess.STDOUT)
        d.wait_ready()
        _, r = c.infer("hop", X(6))
        assert r.status.code == pb.OK, r.status
        c.close()
    finally:
        if worker.poll() is None:
            worker.kill()
        wlog.close()
        d.stop()


def test_sd_notify(config):
    """READY=1 once loaded, WATCHDOG=1 from the loop, STOPPING=1 on SIGTERM."""
    path = os.path.join(evidence.scratch_dir("notify"), "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(5)
    d = Daemon(config, extra_env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    got = []
    try:
        deadline = time.time() + 5
        while time.time() < deadline and not ({"READY=1", "WATCHDOG=1"} <= set(got)):
            got += s.recv(4096).decode().split("\n")
        assert "READY=1" in got and "WATCHDOG=1" in got, got
        d.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 5
        while time.time() < deadline and "STOPPING=1" not in got:
            got += s.recv(4096).decode().split("\n")
        assert "STOPPING=1" in got, got
        assert d.proc.wait(timeout=10) == 0
    finally:
        d.stop()
        s.close()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def test_sighup_reload(config):
    """SIGHUP applies new limits without a restart."""
    d = Daemon(config)
    c = d.client()
    try:
        with open(d.config) as f:
            text = f.read()
        with open(d.config, "w") as f:
            f.write(text.replace("max_inflight: 64", "max_inflight: 1"))
        d.proc.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        a = c.request("slow", X(1))
        b = c.request("slow", X(2))
        codes = {}
        while len(codes) < 2:
            m = c.recv(10)
            assert m is not None
            if m.HasField("response"):
                codes[m.response.request_id] = m.response.status.code
        assert codes == {a: pb.OK, b: pb.RESOURCE_EXHAUSTED}, codes
    finally:
        c.close()
        d.stop()


TRANSFORMER_CONFIG = """
version: 1
daemon:
  listen: ipc:///tmp/baton-e2e/baton.sock
  workers_endpoint: ipc:///tmp/baton-e2e/workers.sock
  request_timeout_ms: 60000
  log_level: info
devices:
  slowcpu: {memory_bandwidth_gbps: 1, memory_efficiency: 0.5, tflops: 0.01,
            comm_bandwidth_gbps: 1, comm_efficiency: 0.5, sync_overhead_us: 20}
workers:
  - {name: cpu0, device: cpu, pool_mb: 64, threads: 1}
  - {name: cpu1, device: cpu, pool_mb: 64, threads: 1, profile: slowcpu, streams: {compute: 2, comm: 1}}
models:
  - name: llm
    backend: transformer
    worker: cpu0
    max_batch: 4
    # f32 activations and cache: the answers are compared with the f32
    # reference token for token (the unit tests check the 8-bit default).
    options: {path: MODEL, max_seq: 128, prefill_chunk: 16, activations: f32, kv_dtype: f32}
  - name: llm_slow
    backend: transformer
    worker: cpu1
    max_batch: 2
    # The default f16 cache, so that the hand-off of a prefill's cache
    # (F32 on the wire) is widened and rounded on the way.
    options: {path: MODEL, max_seq: 64, activations: f32}
graphs:
  - name: gen
    inputs: [prompt]
    body:
      sequential:
        - node:
            name: prefill
            model: llm
            mode: prefill
            inputs: [prompt]
            outputs: [{name: token, to: decode}, {name: token, to: client, new_token: true}]
        - loop:
            name: decode_loop
            max_iters: 23
            body:
              node:
                name: decode
                model: llm
                mode: decode
                async: true
                inputs: [token]
                outputs: [{name: token, to: decode}, {name: token, to: client, new_token: true}]
  - name: chat
    inputs: [prompt]
    body:
      sequential:
        - node:
            name: prefill
            model: llm
            mode: prefill
            inputs: [prompt]
            outputs: [{name: token, to: decode}, {name: text, to: client, new_token: true}]
        - loop:
            name: decode_loop
            max_iters: 23
            body:
              node:
                name: decode
                model: llm
                mode: decode
                async: true
                inputs: [token]
                outputs: [{name: token, to: decode}, {name: text, to: client, new_token: true}]
  - name: gen_slow
    inputs: [prompt]
    body:
      sequential:
        - node:
            name: prefill
            model: llm_slow
            mode: prefill
            inputs: [prompt]
            outputs: [{name: token, to: decode}, {name: token, to: client}]
        - loop:
            name: decode_loop
            max_iters: 23
            body:
              node:
                name: decode
                model: llm_slow
                mode: decode
                inputs: [token]
                outputs: [{name: token, to: decode}, {name: token, to: client, new_token: true}]
  # Disaggregated: the prefill on cpu0 hands its KV cache to the decode
  # loop on cpu1.
  - name: gen_split
    inputs: [prompt]
    body:
      sequential:
        - node:
            name: prefill
            model: llm
            mode: prefill
            inputs: [prompt]
            outputs: [{name: token, to: decode}, {name: kv, to: decode, persist: true},
                      {name: token, to: client, new_token: true}]
        - loop:
            name: decode_loop
            max_iters: 23
            body:
              node:
                name: decode
                model: llm_slow
                mode: decode
                inputs: [token, kv]
                outputs: [{name: token, to: decode}, {name: token, to: client, new_token: true}]
"""

# Prompt 1 of tests/unit/data/smollm2_reference.txt (a ChatML question
# about the capital of France) and the reference's greedy answer up to EOS.
CHAT_PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28,
               7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282,
               4649, 47, 2, 198, 1, 520, 9531, 198]
CHAT_ANSWER = [504, 3575, 282, 4649, 314, 7042, 30, 2]
ONCE_PROMPT = [6403, 1980, 253, 655, 28]
# Prompt 2 ("Once upon a time,"): 24 tokens, the prefill's and 23 decode
# steps (decode_loop's max_iters).
ONCE_ANSWER = [260, 2240, 282, 23324, 27108, 436, 253, 15114, 39228, 28, 351, 25854, 41658, 284,
               14055, 9018, 30, 1249, 347, 260, 929, 3514, 411, 28]


def inspect(c, graph):
    m = pb.ClientMessage()
    m.inspect.graph = graph
    c.send(m)
    r = c.recv()
    assert r is not None and r.HasField("inspect"), r
    return r.inspect.text


class Skip(Exception):
    """A test that cannot run here: counted as skipped, never as passed."""


def need_model(model):
    """Skips the calling test when MODEL is absent, except in CI
    (BATON_CI=1, where .ci/run fetches the model): there it fails."""
    if os.path.exists(model):
        return
    if os.environ.get("BATON_CI") == "1":
        raise AssertionError("%s is absent, and with BATON_CI=1 the model tests must run" % model)
    raise Skip(model_absent(model))


def model_absent(model):
    """Why MODEL is not there, for a SKIP line."""
    if os.environ.get("BATON_OFFLINE") == "1":
        return "%s is absent (BATON_OFFLINE=1: scripts/fetch-model.sh did not fetch it)" % model
    return "%s is absent (scripts/fetch-model.sh)" % model


def test_transformer_serves(config):
    """The transformer backend on the real model: greedy answers equal the
    independent reference, two requests decode in one batch, a bad token id
    is refused at its node, and the load report (schedule decision and
    prediction, with the YAML devices: profile) is logged and in inspect."""
    model = os.path.join(ROOT, "models/smollm2-135m-instruct-q4_1.gguf")
    need_model(model)
    d = Daemon(TRANSFORMER_CONFIG.replace("MODEL", model))
    c = d.client()
    try:
        def prompt(ids):
            return {"prompt": (I32, [len(ids)], i32(*ids))}
        chunks, r = c.infer("gen", prompt(CHAT_PROMPT), stream=True, timeout=60)
        assert r.status.code == pb.OK, r.status
        streamed = [as_i32(ch.value)[0] for ch in chunks]
        assert streamed == CHAT_ANSWER, streamed
        # Usage as the model counted it: the prompt, and every token of the
        # answer (the prefill's and one per decode step, EOS included); the
        # loop ended on the model's end of turn.
        assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == \
            (len(CHAT_PROMPT), len(CHAT_ANSWER), len(CHAT_PROMPT) + len(CHAT_ANSWER)), r.usage
        assert dict(r.loop_ends) == {"decode_loop": pb.LOOP_END_FINISH}, r.loop_ends
        # Two requests at once: their decode steps share executions.
        a = c.request("gen", prompt(CHAT_PROMPT))
        b = c.request("gen", prompt(ONCE_PROMPT))
        got = {}
        deadline = time.time() + 60
        while len(got) < 2 and time.time() < deadline:
            m = c.recv(60)
            if m is not None and m.HasField("response"):
                got[m.response.request_id] = m.response
        assert got[a].status.code == pb.OK and got[b].status.code == pb.OK, got
        assert as_i32(got[a].outputs[0]) == CHAT_ANSWER, as_i32(got[a].outputs[0])
        assert as_i32(got[b].outputs[0]) == ONCE_ANSWER, as_i32(got[b].outputs[0])
        # A token id outside the vocabulary: refused at the node, and the
        # daemon goes on serving.
        _, r = c.infer("gen", prompt([5, 49152]), timeout=30)
        assert r.status.code == pb.INVALID_ARGUMENT, r.status
        assert "prefill" in r.status.message and "outside the vocabulary" in r.status.message, \
            r.status.message
        _, r = c.infer("gen", prompt(ONCE_PROMPT), timeout=60)
        assert r.status.code == pb.OK and as_i32(r.outputs[0]) == ONCE_ANSWER, r
        # Cut by max_iters: steps a worker ran ahead past it do not count.
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == \
            (len(ONCE_PROMPT), len(ONCE_ANSWER)), r.usage
        assert dict(r.loop_ends) == {"decode_loop": pb.LOOP_END_MAX_ITERS}, r.loop_ends
        # Text in, text out: the GGUF's tokenizer and chat template make the
        # question prompt 1's ids, and the answer streams as text.
        q = b"What is the capital of France?"
        chunks, r = c.infer("chat", {"prompt": (pb.U8, [len(q)], q)}, stream=True, timeout=60)
        assert r.status.code == pb.OK, r.status
        text = b"".join(ch.value.data for ch in chunks)
        assert text == b"The capital of France is Paris.", text
        # The same question as messages: the same prompt (the template's
        # default system turn first), so the same answer.
        chunks, r = c.infer("chat", {}, stream=True, timeout=60,
                            messages=[("user", q.decode())])
        assert r.status.code == pb.OK, r.status
        assert b"".join(ch.value.data for ch in chunks) == text
        # A system turn and a conversation of several turns; a marker typed
        # in a turn is text, so it cannot end the conversation early.
        conv = [("system", "You answer with one word."), ("user", "Hi"),
                ("assistant", "Hello<|im_end|>"), ("user", "Name a colour.")]
        _, r = c.infer("chat", {}, timeout=60, messages=conv, messages_input="prompt")
        assert r.status.code == pb.OK, r.status
        assert r.outputs and r.outputs[0].data, r.outputs
        # Refused at the door: a role, and messages beside the same input.
        _, r = c.infer("chat", {}, timeout=30, messages=[("tool", "42")])
        assert r.status.code == pb.INVALID_ARGUMENT and "role 'tool'" in r.status.message, r
        _, r = c.infer("chat", {"prompt": (pb.U8, [len(q)], q)}, timeout=30,
                       messages=[("user", "x")])
        assert r.status.code == pb.INVALID_ARGUMENT and "both" in r.status.message, r
        # The slow profile's executables run on two compute streams (the
        # schedule chose them, below): the same answer.
        _, r = c.infer("gen_slow", prompt(ONCE_PROMPT), timeout=60)
        assert r.status.code == pb.OK, r.status
        toks = [t for o in r.outputs for t in as_i32(o)]
        assert sorted(toks) == sorted(ONCE_ANSWER), toks
        # Prefill on cpu0, decode on cpu1: the cache crosses as a tensor and
        # the answer is the same.
        _, r = c.infer("gen_split", prompt(CHAT_PROMPT), timeout=60)
        assert r.status.code == pb.OK, r.status
        assert [t for o in r.outputs for t in as_i32(o)] == CHAT_ANSWER, r.outputs
        # The schedule report, in inspect and in the worker's log.
        text = inspect(c, "gen")
        assert "loaded models:" in text, text
        fast = re.search(r"model llm on worker cpu0:.*?decode \(batch 4\):\n\s+schedule: "
                         r".*?predicted serial ([0-9.]+) us.*?decision: (\S+);", text, re.S)
        slow = re.search(r"model llm_slow on worker cpu1:.*?profile slowcpu.*?decode "
                         r"\(batch 2\):\n\s+schedule: .*?2 compute \+ 1 comm streams; "
                         r"predicted serial ([0-9.]+) us", text, re.S)
        assert fast and slow, text
        # The slow profile has a small fraction of the default's bandwidth
        # and flops: its prediction must be far longer.
        assert float(slow.group(1)) > 20 * float(fast.group(1)), (fast.group(1), slow.group(1))
        assert re.search(r"model llm_slow on worker cpu1:.*?decode \(batch 2\):\n.*?decision: "
                         r"multi-stream", text, re.S), text
        assert "arena:" in text and "peak-live bound" in text, text
        assert re.search(r"model llm:\s+schedule: .*decision: serial", d.tail()), d.tail()
    finally:
        c.close()
        d.stop()


def test_chat_text_limits(config):
    """The default chat graph (config/examples/chat-cpu.yaml) on the real
    model: the text stream has no empty last chunk; a stop string that spans
    tokens, or is the very start, ends the text before it and the request
    OK with finish_reason STOP; max_tokens ends it after that many tokens
    with LENGTH; the usage counts up to the token that ended it, streamed
    or not; raw text skips the chat template; bad limits are refused at the
    door; nothing is left held.  The answer itself is the model's greedy
    one on this build (a sanitizer build's kernels may round differently),
    so the limits are checked against what they must make of it."""
    model = os.path.join(ROOT, "models/smollm2-135m-instruct-q4_1.gguf")
    need_model(model)
    with open(os.path.join(ROOT, "config/examples/chat-cpu.yaml")) as f:
        text = f.read()
    text = text.replace("/tmp/baton/", "/tmp/baton-e2e/").replace("127.0.0.1:8000",
                                                                  "127.0.0.1:19464")
    text = text.replace("path: models/smollm2-135m-instruct-q4_1.gguf", "path: " + model)
    d = Daemon(text)
    c = d.client()
    q = b"Name the capital of France in one word."
    prompt = {"prompt": (pb.U8, [len(q)], q)}
    try:
        # The greedy answer, whole: its pieces (the end-of-turn token's empty
        # text is not sent) and its tokens.  The limits below are checked
        # against what they must make of it, as the conductor defines them.
        chunks, r = c.infer("chat", prompt, stream=True, timeout=60)
        assert r.status.code == pb.OK, r.status
        pieces = [ch.value.data for ch in chunks]
        assert len(pieces) >= 4 and all(pieces), chunks
        assert [ch.seq for ch in chunks] == list(range(len(pieces)))
        assert r.finish_reason == pb.FINISH_REASON_UNSPECIFIED, r.finish_reason
        ended = dict(r.loop_ends).get("decode_loop")
        assert r.usage.completion_tokens == len(pieces) + (ended == pb.LOOP_END_FINISH), \
            (r.usage, r.loop_ends)  # the end of turn counts, though it has no text
        whole = b"".join(pieces)

        def expect(stop=(), max_tokens=0):
            """(text, finish, completion tokens) that STOP and MAX_TOKENS make of
            the answer: the text before the first stop string, or the first
            MAX_TOKENS pieces."""
            text = b""
            for k, piece in enumerate(pieces, 1):
                text += piece
                hits = [text.find(x.encode()) for x in stop if x.encode() in text]
                if hits:
                    return text[:min(hits)], pb.FINISH_REASON_STOP, k
                if k == max_tokens:
                    return text, pb.FINISH_REASON_LENGTH, k
            return text, pb.FINISH_REASON_UNSPECIFIED, r.usage.completion_tokens

        def run(stream, **kw):
            chunks, got = c.infer("chat", prompt, stream=stream, timeout=60, **kw)
            assert got.status.code == pb.OK, got.status
            assert all(ch.value.data for ch in chunks), chunks
            assert [ch.seq for ch in chunks] == list(range(len(chunks)))
            text = b"".join(ch.value.data for ch in chunks) if stream else \
                {o.name: o for o in got.outputs}["text"].data
            return text, got.finish_reason, got.usage.completion_tokens

        text = [p.decode() for p in pieces]  # whole characters per piece
        cases = [
            # A stop string across three tokens: the end of one, the next
            # whole, the start of the one after.
            {"stop": [text[1][-1] + text[2] + text[3][:1], "zqxj never"]},
            # One that is the very start: no text at all.
            {"stop": [text[0] + text[1][:1]]},
            # max_tokens, named output or not.
            {"max_tokens": 3, "text_output": "text"},
            {"max_tokens": 1},
            # The stop string wins in the token that reaches max_tokens.
            {"stop": [text[3]], "max_tokens": 4},
        ]
        for kw in cases:
            want = expect(kw.get("stop", ()), kw.get("max_tokens", 0))
            assert want[1] != pb.FINISH_REASON_UNSPECIFIED, (kw, want)
            for stream in (True, False):
                got = run(stream, **kw)
                assert got == want, (kw, stream, got, want, whole)
        assert expect([text[0] + text[1][:1]])[0] == b""
        # Raw text: the question without the chat template (and its system
        # prompt) is a few tokens, and the model goes on from it.
        _, r = c.infer("chat", prompt, timeout=60, raw_inputs=["prompt"], max_tokens=4)
        assert r.status.code == pb.OK, r.status
        assert r.usage.prompt_tokens < 14, r.usage
        # Refused at the door, each with its field named; the daemon serves on.
        for kw, what in (({"stop": ["x"] * 17}, "stop has 17 strings"),
                         ({"stop": [""]}, "stop[0] is 0 bytes"),
                         ({"stop": ["y" * 257]}, "stop[0] is 257 bytes"),
                         ({"max_tokens": 2, "text_output": "token"},
                          "text_output: graph 'chat' has no text stream named 'token'"),
                         ({"text_output": "text"}, "text_output is 'text' but"),
                         ({"raw_inputs": ["nope"]}, "raw_inputs[0]: graph 'chat' has no input")):
            _, r = c.infer("chat", prompt, timeout=30, **kw)
            assert r.status.code == pb.INVALID_ARGUMENT and what in r.status.message, (kw, r)
        # A stop string that is not UTF-8 (sent as raw bytes: protobuf's
        # Python runtime would refuse to encode it).
        ir = pb.InferRequest(request_id="bad-utf8", graph="chat")
        ir.inputs.add(name="prompt", dtype=pb.U8, dims=[len(q)], data=q)
        body = ir.SerializeToString() + b"\x52\x02\xc3\x28"  # field 10 (stop): c3 28
        assert len(body) < 128
        c.sock.send(b"\x0a" + bytes([len(body)]) + body)  # ClientMessage.infer
        _, r = c.wait("bad-utf8")
        assert r.status.code == pb.INVALID_ARGUMENT and "stop[0] is not valid UTF-8" in \
            r.status.message, r
        _, r = c.infer("chat", prompt, timeout=60, max_tokens=1)
        assert r.status.code == pb.OK and r.outputs[0].data == pieces[0], r
        # Nothing of the ended requests is left in the conductor.
        deadline = time.time() + 5
        while d.metric("baton_tensors_held", "") not in (0, None) and time.time() < deadline:
            time.sleep(0.1)
        held = re.search(r"^baton_tensors_held (\d+)$", d.metrics(), re.M)
        assert held and held.group(1) == "0", d.metrics()
    finally:
        c.close()
        d.stop()


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def wait_metric(d, name, pred, timeout=30.0):
    """Polls /metrics until PRED holds for NAME's value (an event, awaited up
    to TIMEOUT; what is asserted is the value, never the time)."""
    deadline = time.time() + timeout
    v = None
    while time.time() < deadline:
        m = re.search(r"^%s (\S+)$" % re.escape(name), d.metrics(), re.M)
        v = float(m.group(1)) if m else None
        if v is not None and pred(v):
            return v
        time.sleep(0.1)
    return v


BOUNDS = """  client_max_inflight: 16
  client_max_reply_bytes: 1048576
  client_stall_timeout_ms: 3000
"""


def test_client_that_never_reads(config):
    """A client sends thousands of requests with 16 KiB answers and reads
    none, beside a client that reads: batond's memory stays bounded, the
    reader gets every answer, and the non-reader is dropped and counted."""
    # Under AddressSanitizer freed memory waits in a quarantine (256 MiB by
    # default) and counts in the RSS; a small one keeps the bound about
    # batond's own memory.  Other builds ignore the variable.
    asan = os.environ.get("ASAN_OPTIONS", "")
    d = Daemon(config.replace("  log_level: warning\n", "  log_level: warning\n" + BOUNDS),
               extra_env={"ASAN_OPTIONS": (asan + ":" if asan else "") + "quarantine_size_mb=4"})
    c = d.client()
    hog = d.ctx.socket(zmq.DEALER)
    hog.setsockopt(zmq.LINGER, 0)
    hog.setsockopt(zmq.RCVHWM, 1)
    hog.setsockopt(zmq.RCVBUF, 4096)
    # A send that finds no pipe (the daemon dropped the connection) gives
    # up rather than block the test for ever.
    hog.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    hog.connect(d.endpoint)
    try:
        big = {"x": (I32, [4096], i32(*range(4096)))}  # 16 KiB each way
        for _ in range(20):
            _, r = c.infer("echo", big)
            assert r.status.code == pb.OK
        base = rss_kib(d.proc.pid)
        results = {"ok": 0, "other": [], "sent": 0}
        stop = threading.Event()

        def reader():
            cl = d.client()
            try:
                while not stop.is_set() or results["sent"] < 200:
                    _, r = cl.infer("echo", X(results["sent"]), timeout=30)
                    results["sent"] += 1
                    if r.status.code == pb.OK and as_i32(r.outputs[0]) == [results["sent"] - 1]:
                        results["ok"] += 1
                    else:
                        results["other"].append(r.status)
            finally:
                cl.close()

        t = threading.Thread(target=reader)
        t.start()
        peak = base
        n_hog = 6000
        try:
            for i in range(n_hog):
                m = pb.ClientMessage()
                q = m.infer
                q.request_id = "hog-%d" % i
                q.graph = "echo"
                q.inputs.add(name="x", dtype=I32, dims=[4096], data=big["x"][2])
                try:
                    hog.send(m.SerializeToString())
                except zmq.Again:
                    break  # dropped and not reconnected within the timeout
                if i % 200 == 0:
                    peak = max(peak, rss_kib(d.proc.pid))
        finally:
            stop.set()
        t.join()
        peak = max(peak, rss_kib(d.proc.pid))
        # 6000 unread answers of 16 KiB are 94 MiB; what batond may hold is
        # two client_max_reply_bytes of backlog and 64 replies in ZeroMQ's
        # pipe, so the bound leaves room for the allocator's slack only.
        assert (peak - base) < 48 * 1024, (base, peak)
        assert results["ok"] == results["sent"] and results["sent"] >= 200, results
        assert not results["other"], results["other"][:3]
        dropped = wait_metric(d, "baton_clients_dropped_total", lambda v: v >= 1)
        assert dropped is not None and dropped >= 1, d.metrics()
        held = wait_metric(d, "baton_tensors_held", lambda v: v == 0)
        assert held == 0, d.metrics()
        text = d.metrics()
        assert re.search(r'^baton_requests_rejected_total\{code="RESOURCE_EXHAUSTED"\} [1-9]',
                         text, re.M), text
        # Still serving, the reader as before.
        _, r = c.infer("echo", X(7))
        assert r.status.code == pb.OK and as_i32(r.outputs[0]) == [7]
    finally:
        hog.close()
        c.close()
        d.stop()


def test_fair_admission(config):
    """A connection with a request in flight keeps its share of max_inflight
    (64) against one that asks for every slot: the greedy one gets 32, and
    the first still gets in."""
    d = Daemon(config)
    c = d.client()
    hog = d.client()
    try:
        first = c.request("slower", X(0))
        assert wait_metric(d, "baton_inflight_requests", lambda v: v >= 1) >= 1
        for i in range(64):
            hog.request("slower", X(i), rid="hog-%d" % i)
        refused = []
        while len(refused) < 32:
            m = hog.recv(10)
            assert m is not None and m.HasField("response"), "hog: %d refusals" % len(refused)
            refused.append(m.response)
        assert all(r.status.code == pb.RESOURCE_EXHAUSTED and "share" in r.status.message
                   for r in refused), refused[:2]
        assert hog.recv(0.2) is None  # its 32 others run
        # The first connection is under its share: it gets in at once.
        for i in range(10):
            _, r = c.infer("echo", X(i))
            assert r.status.code == pb.OK and as_i32(r.outputs[0]) == [i], r
        _, r = c.wait(first, timeout=30)
        assert r.status.code == pb.OK, r
        ok = 0
        while ok < 32:
            m = hog.recv(30)
            assert m is not None and m.response.status.code == pb.OK, m
            ok += 1
    finally:
        hog.close()
        c.close()
        d.stop()


def test_timeout_clamped(config):
    """A timeout_ms above max_request_timeout_ms is clamped to it."""
    d = Daemon(config.replace("  log_level: warning\n",
                              "  log_level: warning\n  max_request_timeout_ms: 100\n"))
    c = d.client()
    try:
        _, r = c.infer("slow", X(1), timeout_ms=2**32 - 1)
        assert r.status.code == pb.DEADLINE_EXCEEDED, r
        _, r = c.infer("echo", X(2), timeout_ms=2**32 - 1)
        assert r.status.code == pb.OK, r
    finally:
        c.close()
        d.stop()


EARLY_PUT_CONFIG = """
version: 1
daemon:
  listen: ipc:///tmp/baton-e2e/baton.sock
  workers_endpoint: ipc:///tmp/baton-e2e/workers.sock
  metrics_listen: 127.0.0.1:19464
  max_message_bytes: 4194304
  log_level: warning
workers:
  - {name: cpu0, device: cpu, pool_mb: 1}
  - {name: cpu1, device: cpu, pool_mb: 64}
models:
  - {name: add0, backend: add, worker: cpu0}
  - {name: echo1, backend: echo, worker: cpu1}
graphs:
  # x is read only on cpu0: it goes out as an early Put and runs at once.
  # y is read on both workers: it waits for cpu0's Placed.
  - name: two
    inputs: [x, y]
    body:
      parallel:
        - node: {name: a, model: add0, inputs: [x, y], outputs: [{name: out, to: client}]}
        - node: {name: b, model: echo1, inputs: [y], outputs: [{name: y, to: client}]}
"""


def test_early_put_fails(config):
    """An early Put refused (RESOURCE_EXHAUSTED: a 2 MiB input for a 1 MiB
    pool) while the request's other input is still being placed ends the
    request with that error, and leaves nothing in the conductor's tensor
    table: its entry once stayed until the worker was lost."""
    del config
    d = Daemon(EARLY_PUT_CONFIG)
    c = d.client()
    try:
        n = 512 * 1024
        big = (I32, [n], struct.pack("<%di" % n, *([1] * n)))
        for i in range(3):
            _, r = c.infer("two", {"x": big, "y": (I32, [1], i32(i))})
            assert r.status.code == pb.RESOURCE_EXHAUSTED, r.status
        left = wait_metric(d, "baton_tensor_table_entries", lambda v: v == 0)
        assert left == 0, d.metrics()
        # Still serving, and a request that fits leaves nothing either.
        _, r = c.infer("two", {"x": (I32, [2], i32(1, 2)), "y": (I32, [2], i32(10, 20))})
        assert r.status.code == pb.OK, r.status
        assert as_i32([o for o in r.outputs if o.name == "out"][0]) == [11, 22], r.outputs
        assert wait_metric(d, "baton_tensor_table_entries", lambda v: v == 0) == 0, d.metrics()
    finally:
        c.close()
        d.stop()


FETCH_GONE_CONFIG = """
version: 1
daemon:
  listen: ipc:///tmp/baton-e2e/baton.sock
  workers_endpoint: ipc:///tmp/baton-e2e/workers.sock
  metrics_listen: 127.0.0.1:19464
  log_level: warning
workers:
  - {name: fake0, device: cpu, spawn: external}
models:
  - {name: echo0, backend: echo, worker: fake0}
graphs:
  - name: echo
    inputs: [x]
    body:
      node: {name: e, model: echo0, inputs: [x], outputs: [{name: x, to: client}]}
"""


def fake_worker(endpoint, stop, fetches):
    """A worker played in Python: it registers, loads, and answers each
    Dispatch with an output of 100 000 bytes it does not send inline, then
    each Fetch of it with NOT_FOUND, as a worker does for a tensor already
    released.  Puts are placed.  FETCHES counts the Fetches."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.ROUTING_ID, b"fake0")
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    s.connect(endpoint)

    def send(**kw):
        m = pb.WorkerMessage(**kw)
        s.send(m.SerializeToString())

    send(registration=pb.Register(
        protocol_version=pb.PROTOCOL_VERSION_CURRENT, worker="fake0", device="cpu",
        pools=[pb.PoolHandle(pool=0, kind=pb.POOL_KIND_SHM, shm_name="", pool_bytes=1 << 20,
                             cuda_device=-1)],
        pool_bytes=1 << 20, pid=os.getpid(), hostname=socket.gethostname()))
    next_id = 100
    last_beat = 0.0
    try:
        while not stop.is_set():
            if time.time() - last_beat > 0.2:
                send(heartbeat=pb.Heartbeat(pool_free_bytes=1 << 20, largest_free_bytes=1 << 20))
                last_beat = time.time()
            if not s.poll(50):
                continue
            frames = s.recv_multipart()
            for f in frames:
                cm = pb.ConductorMessage()
                cm.ParseFromString(f)
                kind = cm.WhichOneof("msg")
                if kind == "load":
                    send(loaded=pb.Loaded(model=cm.load.model, status=pb.Status(code=pb.OK)))
                elif kind == "put":
                    p = cm.put
                    next_id += 1
                    ref = pb.TensorRef(owner=0, id=p.tensor_id or next_id,
                                       nbytes=len(p.value.data), dtype=p.value.dtype,
                                       dims=list(p.value.dims))
                    if not p.tensor_id:  # an early Put is answered only on failure
                        send(placed=pb.Placed(request_key=p.request_key, put_id=p.put_id,
                                              ref=ref, status=pb.Status(code=pb.OK)))
                elif kind == "dispatch":
                    d = cm.dispatch
                    next_id += 1
                    out = pb.TensorRef(owner=0, id=next_id, nbytes=100000, dtype=pb.U8,
                                       dims=[100000])
                    send(done=pb.Done(request_key=d.request_key, node=d.node, graph=d.graph,
                                      iteration=list(d.iteration), dispatch_id=d.dispatch_id,
                                      status=pb.Status(code=pb.OK), batch_size=1,
                                      outputs=[pb.NamedRef(name=o.name, ref=out)
                                               for o in d.outputs]))
                elif kind == "fetch":
                    fetches.append(cm.fetch.tensor_id)
                    send(fetched=pb.Fetched(
                        tensor_id=cm.fetch.tensor_id,
                        status=pb.Status(code=pb.NOT_FOUND,
                                         message="tensor %d is not held by worker fake0"
                                         % cm.fetch.tensor_id)))
    finally:
        s.close()


def test_fetch_gone(config):
    """A Fetch the worker answers NOT_FOUND (the tensor is gone) ends the
    request with NOT_FOUND and the worker's reason, never OK with an empty
    tensor; the daemon goes on serving."""
    del config
    d = Daemon(FETCH_GONE_CONFIG, wait=False)
    stop = threading.Event()
    fetches = []
    t = threading.Thread(target=fake_worker,
                         args=("ipc://%s/workers.sock" % d.dir, stop, fetches), daemon=True)
    t.start()
    try:
        d.wait_ready()
        c = d.client()
        for i in range(2):
            _, r = c.infer("echo", X(i))
            assert r.status.code == pb.NOT_FOUND, r
            assert "not held by worker fake0" in r.status.message, r.status
            assert not r.outputs, r.outputs
        assert len(fetches) == 2, fetches
        h = c.health(5)
        assert h is not None and h.ready, h
        c.close()
    finally:
        stop.set()
        t.join(5)
        d.stop()


def main():
    with open(os.path.join(ROOT, "tests/integration/configs/e2e.yaml")) as f:
        config = f.read()
    only = sys.argv[1:]
    passed = failed = skipped = 0
    d = Daemon(config)
    try:
        for t in TESTS:
            if only and t.__name__ not in only:
                continue
            c = d.client()
            try:
                t(d, c)
                passed += 1
                print("ok   %s" % t.__name__, flush=True)
                evidence.passed()
            except Exception:
                failed += 1
                print("FAIL %s\n%s" % (t.__name__, traceback.format_exc()), flush=True)
                evidence.failed(t.__name__)
            finally:
                c.close()
    finally:
        d.stop()
    for t in (test_sigterm_drain, test_sd_notify, test_sighup_reload, test_external_worker,
              test_transformer_serves, test_chat_text_limits, test_client_that_never_reads,
              test_fair_admission, test_timeout_clamped, test_early_put_fails,
              test_fetch_gone):
        if only and t.__name__ not in only:
            continue
        try:
            t(config)
            passed += 1
            print("ok   %s" % t.__name__, flush=True)
            evidence.passed()
        except Skip as e:
            skipped += 1
            print("SKIP %s: %s" % (t.__name__, e), flush=True)
            evidence.passed()
        except Exception:
            failed += 1
            print("FAIL %s\n%s" % (t.__name__, traceback.format_exc()), flush=True)
            evidence.failed(t.__name__)
    print("e2e: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
