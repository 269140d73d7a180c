"""A small Python client for batond (docs/protocol.md).

    from baton_client import Client
    with Client("ipc:///run/baton/baton.sock") as c:
        r = c.infer("chat", {"prompt": "Hello"})
        print(r.status, r.text())
        for ev in c.stream("chat", {"prompt": "Hello"}):
            if ev.is_chunk:
                print(ev.text, end="", flush=True)

Requirements: pyzmq and protobuf (numpy optional). On Debian they are the
packages python3-zmq and python3-protobuf, which only the system interpreter
sees: run scripts that use this module with /usr/bin/python3. A `python3`
found first on PATH (pyenv, a virtualenv) may not see them; install
`pyzmq protobuf` there instead if you want to use it.

The protobuf module baton_pb2 is generated from proto/baton.proto at build
time (`make` writes build/gen/python/baton_pb2.py). It is looked for in
$BATON_PROTO_PATH, then in the repository's build/gen/python, then on
sys.path.

Nothing waits for ever by default: a send waits CONNECT_TIMEOUT_MS for a
connection (then ConnectError), a probe five seconds, and a call that sets
no bound of its own (recv() without timeout_ms, infer() and stream()
without timeout_ms or wait_ms) the client's WAIT_MS, 11 minutes unless
the constructor says otherwise (then Timeout).  That is longer than the
daemon lets any request run (max_request_timeout_ms, 10 minutes by
default), so the bound only ends waits for a daemon that died or restarted
and lost the request: a client of a daemon whose max_request_timeout_ms is
longer passes a longer WAIT_MS, or None to wait for ever.

Tensors: inputs may be numpy arrays (float32, float16, int32, int64, uint8,
bool), str (sent as a U8 tensor of UTF-8 bytes), bytes (U8), or a Tensor.
Outputs are numpy arrays when numpy can be imported, else Tensor objects
(raw little-endian bytes plus dtype and dims); bfloat16 outputs become
float32 arrays.
"""

import itertools
import os
import sys
import time
import uuid
from collections import namedtuple


def _load_pb():
    here = os.path.dirname(os.path.abspath(__file__))
    paths = []
    if os.environ.get("BATON_PROTO_PATH"):
        paths.append(os.environ["BATON_PROTO_PATH"])
    paths.append(os.path.join(here, "..", "..", "build", "gen", "python"))
    for p in paths:
        if os.path.exists(os.path.join(p, "baton_pb2.py")):
            sys.path.insert(0, os.path.abspath(p))
            break
    try:
        import google.protobuf  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "the protobuf package is missing for %s: install Debian's python3-protobuf "
            "(for /usr/bin/python3) or `pip install protobuf`" % sys.executable) from e
    try:
        import baton_pb2
    except ImportError as e:
        if getattr(e, "name", None) != "baton_pb2":
            raise ImportError("baton_pb2 does not load with %s's protobuf: %s"
                              % (sys.executable, e)) from e
        raise ImportError(
            "baton_pb2 not found: run `make` (it writes build/gen/python/baton_pb2.py) "
            "or set BATON_PROTO_PATH to the folder that holds it") from e
    return baton_pb2


pb = _load_pb()
try:
    import zmq  # noqa: E402  (after the path set-up, so that a missing pb2 is reported first)
except ImportError as _e:
    raise ImportError("the zmq package is missing for %s: install Debian's python3-zmq "
                      "(for /usr/bin/python3) or `pip install pyzmq`" % sys.executable) from _e

try:
    import numpy as np
except ImportError:  # numpy is optional: outputs then stay raw Tensors
    np = None

DEFAULT_ENDPOINT = "ipc:///run/baton/baton.sock"
# The longest wait for an answer when a call sets no bound (see above): a
# minute more than the daemon's default max_request_timeout_ms.
DEFAULT_WAIT_MS = 11 * 60 * 1000

# dtype name -> (proto enum value, bytes per element, numpy dtype name or None)
_DTYPES = {
    "f32": (pb.F32, 4, "<f4"),
    "f16": (pb.F16, 2, "<f2"),
    "bf16": (pb.BF16, 2, None),
    "i32": (pb.I32, 4, "<i4"),
    "i64": (pb.I64, 8, "<i8"),
    "u8": (pb.U8, 1, "u1"),
    "bool": (pb.BOOL, 1, "?"),
}
_DTYPE_BY_ENUM = {v[0]: k for k, v in _DTYPES.items()}
_NUMPY_TO_DTYPE = {"float32": "f32", "float16": "f16", "int32": "i32", "int64": "i64",
                   "uint8": "u8", "bool": "bool"}


class BatonError(Exception):
    """Base class of this module's errors."""


class ConnectError(BatonError):
    """No connection to the daemon came up in time."""


class Timeout(BatonError):
    """No answer arrived in time."""


class ProtocolError(BatonError):
    """The daemon sent a frame that is not a valid ServerMessage."""


class StatusError(BatonError):
    """A response whose status is not OK (raised by Response.raise_for_status)."""

    def __init__(self, response):
        super().__init__("%s: %s" % (response.status, response.message))
        self.response = response


Timing = namedtuple("Timing", "node iteration worker queue_us exec_us")
Health = namedtuple("Health", "live ready workers_ready message")
# The answer to a cancel: found is true when a request of that id was in
# flight and is being ended (its own Response follows); status is "OK",
# "NOT_FOUND" (nothing of that id in flight) or "FAILED_PRECONDITION" (in
# flight on several other connections: ambiguous).
CancelResult = namedtuple("CancelResult", "request_id found status message")


def code_name(code):
    """The proto name of a status code number ("OK", "NOT_FOUND"...)."""
    try:
        return pb.Code.Name(code)
    except ValueError:
        return "UNKNOWN"


class Tensor:
    """A tensor as it travels: dtype name, dims, raw little-endian bytes."""

    def __init__(self, name, dtype, dims, data, modality=""):
        self.name, self.dtype, self.dims = name, dtype, tuple(dims)
        self.data, self.modality = bytes(data), modality

    @property
    def numel(self):
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def is_text(self):
        return self.dtype == "u8" and self.modality == "text"

    def text(self):
        """The bytes decoded as UTF-8 (undecodable bytes replaced)."""
        return self.data.decode("utf-8", errors="replace")

    def numpy(self):
        """The tensor as a numpy array (bf16 widened to float32)."""
        if np is None:
            raise ImportError("numpy is not available")
        if self.dtype == "bf16":
            bits = np.frombuffer(self.data, dtype="<u2").astype("<u4") << 16
            return bits.view("<f4").reshape(self.dims)
        return np.frombuffer(self.data, dtype=_DTYPES[self.dtype][2]).reshape(self.dims)

    def value(self):
        """numpy array when numpy is importable, else this Tensor."""
        return self.numpy() if np is not None else self

    def __repr__(self):
        return "Tensor(%r, %s%s, %d bytes%s)" % (
            self.name, self.dtype, list(self.dims), len(self.data),
            ", text" if self.is_text else "")

    @classmethod
    def _from_pb(cls, t):
        if t.dtype not in _DTYPE_BY_ENUM:
            raise ProtocolError("tensor %r has unknown dtype %d" % (t.name, t.dtype))
        dt = _DTYPE_BY_ENUM[t.dtype]
        out = cls(t.name, dt, t.dims, t.data, t.modality)
        if any(d < 0 for d in t.dims) or out.numel * _DTYPES[dt][1] != len(t.data):
            raise ProtocolError("tensor %r: %d bytes do not match dims %s"
                                % (t.name, len(t.data), list(t.dims)))
        return out


def _to_tensor(name, v):
    """Converts an input value to a Tensor (see the module docstring)."""
    if isinstance(v, Tensor):
        return Tensor(name, v.dtype, v.dims, v.data)
    if isinstance(v, str):
        v = v.encode("utf-8")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return Tensor(name, "u8", [len(v)], bytes(v))
    if np is not None and isinstance(v, (np.ndarray, np.generic)):
        a = np.asarray(v)
        dt = _NUMPY_TO_DTYPE.get(a.dtype.name)
        if dt is None:
            raise ValueError("input %r: numpy dtype %s is not sent as such; convert it "
                             "(e.g. .astype(np.float32))" % (name, a.dtype))
        a = np.ascontiguousarray(a, dtype=_DTYPES[dt][2])
        return Tensor(name, dt, a.shape, a.tobytes())
    raise TypeError("input %r: expected a numpy array, str, bytes or Tensor, got %s"
                    % (name, type(v).__name__))


class Chunk:
    """A streamed value of a request (an InferChunk)."""

    is_chunk = True

    def __init__(self, m):
        self.request_id, self.seq = m.request_id, m.seq
        if not m.HasField("value"):
            raise ProtocolError("chunk without a value")
        self.tensor = Tensor._from_pb(m.value)
        self.name, self.modality = self.tensor.name, self.tensor.modality

    @property
    def value(self):
        return self.tensor.value()

    @property
    def text(self):
        """The chunk's bytes as text ("" unless its modality is text). A piece
        may end inside a character: join the .tensor.data of all chunks before
        decoding when that matters."""
        return self.tensor.text() if self.tensor.is_text else ""

    def __repr__(self):
        return "Chunk(%s #%d %r)" % (self.request_id, self.seq, self.tensor)


class Response:
    """The terminal answer of a request (an InferResponse)."""

    is_chunk = False

    def __init__(self, m):
        self.request_id = m.request_id
        self.code = m.status.code
        self.status = code_name(self.code)
        self.message = m.status.message
        self.tensors = {}
        for t in m.outputs:
            self.tensors[t.name] = Tensor._from_pb(t)
        self.outputs = {k: t.value() for k, t in self.tensors.items()}
        self.timings = [Timing(t.node, t.iteration, t.worker, t.queue_us, t.exec_us)
                        for t in m.timings]
        self.total_us = m.total_us
        self.seed = m.seed
        # Tokens as the model counted them ({} when no node counted any), and
        # how each loop ended: "finish" (end of turn) or "max_iters".
        self.usage = ({"prompt_tokens": m.usage.prompt_tokens,
                       "completion_tokens": m.usage.completion_tokens,
                       "total_tokens": m.usage.total_tokens,
                       "cached_tokens": m.usage.cached_tokens} if m.HasField("usage") else {})
        self.loop_ends = {k: {pb.LOOP_END_FINISH: "finish", pb.LOOP_END_MAX_ITERS: "max_iters"}
                          .get(v, "unknown") for k, v in m.loop_ends.items()}
        # What ended the text early: "stop" (a stop string), "length"
        # (max_tokens), or None (the graph ran to its end; see loop_ends).
        self.finish_reason = {pb.FINISH_REASON_STOP: "stop",
                              pb.FINISH_REASON_LENGTH: "length"}.get(m.finish_reason)
        self.chunks = []  # filled by Client.infer(stream=True)

    @property
    def ok(self):
        return self.code == pb.OK

    def raise_for_status(self):
        if not self.ok:
            raise StatusError(self)
        return self

    def text(self, name=None):
        """The text of output NAME, or of the first text output; when no
        output holds it (a stream), the streamed chunks of NAME, or of the
        first text stream, joined."""
        if name is not None and name in self.tensors:
            return self.tensors[name].text()
        if name is None:
            for t in self.tensors.values():
                if t.is_text:
                    return t.text()
        chunks = [c for c in self.chunks if c.tensor.is_text]
        if name is None and chunks:
            name = chunks[0].tensor.name
        data = b"".join(c.tensor.data for c in chunks if c.tensor.name == name)
        return data.decode("utf-8", errors="replace")

    def __repr__(self):
        return "Response(%s %s%s, outputs=%s, %d us)" % (
            self.request_id, self.status, ": " + self.message if self.message else "",
            list(self.tensors), self.total_us)


_PROBES = ("health", "stats", "inspect")


class Client:
    """One DEALER connection to batond. Not thread-safe: use one per thread."""

    def __init__(self, endpoint=None, server_key=None, connect_timeout_ms=5000,
                 client_key=None, wait_ms=DEFAULT_WAIT_MS):
        """ENDPOINT: ipc:// or tcp:// (default $BATON_ENDPOINT, else the daemon's
        default). SERVER_KEY: the daemon's CURVE public key, needed for tcp://:
        its 40 Z85 characters, or the path of its .pub file. CLIENT_KEY: this
        client's key pair, which the daemon's client_keys must authorize: the
        path of a secret key file (NAME.key from `batonctl keygen`; the public
        half is derived from it), or a (public, secret) tuple of Z85 keys;
        None makes a fresh pair (a daemon with curve refuses it). A send waits
        CONNECT_TIMEOUT_MS for the connection, then raises ConnectError.
        WAIT_MS: the longest a call waits for an answer when it sets no
        bound of its own (default DEFAULT_WAIT_MS, 11 minutes; None: for
        ever), then it raises Timeout."""
        self.endpoint = endpoint or os.environ.get("BATON_ENDPOINT") or DEFAULT_ENDPOINT
        self.wait_ms = wait_ms
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        try:
            self._setup(server_key, connect_timeout_ms, client_key)
        except Exception:
            self.close()
            raise
        self._pending = []  # events that arrived while waiting for something else
        self._stale = dict.fromkeys(_PROBES, 0)  # probe answers owed to calls that gave up
        self._ids = itertools.count(1)
        self._id_prefix = uuid.uuid4().hex[:16]

    @staticmethod
    def _z85(key):
        return key.encode() if isinstance(key, str) else bytes(key)

    @staticmethod
    def _read_key_file(path, secret):
        """The one Z85 key of a key file. A secret key file readable by group
        or others is refused, as batond and batonctl refuse it."""
        if secret and os.stat(path).st_mode & 0o077:
            raise ValueError("%s holds a secret key but is readable by group or others; "
                             "chmod 600 it" % path)
        with open(path, "rb") as f:
            key = f.read().strip()
        if len(key) != 40:
            raise ValueError("%s does not hold a 40-character Z85 key" % path)
        return key

    def _curve_keys(self, server_key, client_key):
        server = self._z85(server_key)
        if len(server) != 40:
            if server.endswith(b".key"):
                raise ValueError("server_key: give the daemon's public key or .pub file, not "
                                 "its .key (secret) file")
            server = self._read_key_file(server_key, False)
        if client_key is None:
            pub, sec = zmq.curve_keypair()
        elif isinstance(client_key, (tuple, list)):
            pub, sec = (self._z85(k) for k in client_key)
            if len(pub) != 40 or len(sec) != 40:
                raise ValueError("client_key: (public, secret) must be two 40-character Z85 keys")
        else:
            sec = self._read_key_file(client_key, True)
            pub = zmq.curve_public(sec)
        return server, pub, sec

    def _setup(self, server_key, connect_timeout_ms, client_key=None):
        # IMMEDIATE: a send to an absent daemon (or one that refused this
        # client's keys) fails after SNDTIMEO instead of queueing forever;
        # RCVHWM 0: a slow reader never makes the daemon's ROUTER drop a
        # chunk.  Receives follow a poll with its own deadline; RCVTIMEO
        # only bounds one that would not.  LINGER: close() waits a second
        # at most.
        self._sock.setsockopt(zmq.IMMEDIATE, 1)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._sock.setsockopt(zmq.SNDTIMEO, connect_timeout_ms)
        self._sock.setsockopt(zmq.RCVTIMEO, connect_timeout_ms)
        self._sock.setsockopt(zmq.LINGER, 1000)
        if client_key is not None and not server_key:
            raise ValueError("client_key needs server_key (the daemon's public key)")
        if server_key:
            server, pub, sec = self._curve_keys(server_key, client_key)
            self._sock.curve_serverkey = server
            self._sock.curve_publickey, self._sock.curve_secretkey = pub, sec
        try:
            self._sock.connect(self.endpoint)
        except zmq.ZMQError as e:
            raise ConnectError("cannot connect to %s: %s" % (self.endpoint, e)) from None

    def close(self):
        """Closes the socket; frames not yet sent get up to a second to leave."""
        self._sock.close()
        self._ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- sending -------------------------------------------------------------

    def _send(self, msg):
        try:
            self._sock.send(msg.SerializeToString())
        except zmq.Again:
            raise ConnectError("cannot connect to %s" % self.endpoint) from None

    def send(self, graph, inputs=None, stream=False, timeout_ms=0, sampling=None,
             max_iters=None, request_id=None, messages=None, messages_input=None,
             stop=None, max_tokens=None, text_output=None, raw_inputs=None):
        """Sends an InferRequest and returns its request_id at once; answers
        come from recv(). SAMPLING: a dict with temperature, top_k, top_p, seed.
        MAX_ITERS: a dict loop name -> cap. MESSAGES: a conversation, a list of
        {"role": "system" | "user" | "assistant", "content": str} (or (role,
        content) pairs), given to graph input MESSAGES_INPUT (default: the
        graph's only input) instead of a tensor. STOP: a str or a list of up
        to 16: the text stream ends before the first one (Response
        .finish_reason "stop"); MAX_TOKENS: it ends after that many tokens
        ("length"); TEXT_OUTPUT: the text stream they apply to (default: the
        graph's only one). RAW_INPUTS: names of graph inputs whose text the
        model takes as it is, without its chat template."""
        msg = pb.ClientMessage()
        req = msg.infer
        req.request_id = request_id or "%s-%d" % (self._id_prefix, next(self._ids))
        req.graph = graph
        req.stream = bool(stream)
        req.timeout_ms = int(timeout_ms or 0)
        for name, v in (inputs or {}).items():
            t = _to_tensor(name, v)
            req.inputs.add(name=name, dtype=_DTYPES[t.dtype][0], dims=t.dims, data=t.data)
        if sampling:
            for k, v in dict(sampling).items():
                setattr(req.sampling, k, v)
        for loop, n in (max_iters or {}).items():
            req.max_iters[loop] = int(n)
        for m in messages or []:
            role, content = (m["role"], m["content"]) if isinstance(m, dict) else m
            req.messages.add(role=role, content=content)
        if messages_input:
            req.messages_input = messages_input
        req.stop.extend([stop] if isinstance(stop, str) else list(stop or []))
        req.max_tokens = int(max_tokens or 0)
        if text_output:
            req.text_output = text_output
        req.raw_inputs.extend(raw_inputs or [])
        self._send(msg)
        return req.request_id

    def cancel(self, request_id, timeout_ms=5000):
        """Asks the daemon to end REQUEST_ID (of this connection, else the one
        other connection's request of that id) and returns its answer, a
        CancelResult; the request's own Response (CANCELLED unless it had
        already ended) follows. TIMEOUT_MS None: do not wait (returns None).
        Raises Timeout."""
        msg = pb.ClientMessage()
        msg.cancel.request_id = request_id
        self._send(msg)
        if timeout_ms is None:
            return None
        deadline = self._deadline(timeout_ms)
        while True:
            kind, obj = self._recv_one(deadline)
            if kind == "cancel" and obj.request_id == request_id:
                return obj
            if kind in _PROBES:
                if self._stale[kind]:
                    self._stale[kind] -= 1
                continue
            if kind != "cancel":
                self._pending.append(obj)

    # ---- receiving -----------------------------------------------------------

    def _recv_one(self, deadline):
        """The next decoded frame as (kind, object), waiting until DEADLINE
        (time.monotonic() value, None: forever)."""
        while True:
            left = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            if not self._sock.poll(left, zmq.POLLIN):
                raise Timeout("no answer from %s in time" % self.endpoint)
            frames = self._sock.recv_multipart()
            if len(frames) != 1:
                raise ProtocolError("a frame in %d parts" % len(frames))
            try:
                m = pb.ServerMessage.FromString(frames[0])
            except Exception as e:  # the protobuf runtime's DecodeError varies by version
                raise ProtocolError("undecodable frame: %s" % e) from None
            kind = m.WhichOneof("msg")
            if kind == "chunk":
                return kind, Chunk(m.chunk)
            if kind == "response":
                return kind, Response(m.response)
            if kind == "health":
                h = m.health
                return kind, Health(h.live, h.ready, list(h.workers_ready), h.message)
            if kind in ("stats", "inspect"):
                return kind, getattr(m, kind).text
            if kind == "cancel":
                st = m.cancel.status
                return kind, CancelResult(m.cancel.request_id, st.code == pb.OK,
                                          code_name(st.code), st.message)
            raise ProtocolError("a ServerMessage with nothing set")

    @staticmethod
    def _deadline(timeout_ms):
        return None if timeout_ms is None or timeout_ms < 0 else \
            time.monotonic() + timeout_ms / 1000.0

    def recv(self, timeout_ms=None):
        """The next Chunk or Response of any request in flight, within
        TIMEOUT_MS (None: the client's wait_ms). Raises Timeout,
        ProtocolError."""
        if self._pending:
            return self._pending.pop(0)
        deadline = self._deadline(self.wait_ms if timeout_ms is None else timeout_ms)
        while True:
            kind, obj = self._recv_one(deadline)
            if kind in _PROBES:
                if self._stale[kind]:
                    self._stale[kind] -= 1
                continue
            if kind == "cancel":
                continue  # the answer to a cancel that did not wait for it
            return obj

    def _wait_for(self, request_id, deadline):
        """The next event of REQUEST_ID; other requests' events are kept.
        A refusal without an id answers it too: the daemon could not read
        the frame (one over max_message_bytes), so it could not name the
        request, and the caller waits on the one it sent last."""
        def ours(ev):
            return ev.request_id == request_id or (not ev.request_id and not ev.is_chunk)
        for i, ev in enumerate(self._pending):
            if ours(ev):
                return self._pending.pop(i)
        while True:
            kind, obj = self._recv_one(deadline)
            if kind in _PROBES:
                if self._stale[kind]:
                    self._stale[kind] -= 1
                continue
            if kind == "cancel":
                continue  # the answer to a cancel that did not wait for it
            if ours(obj):
                return obj
            self._pending.append(obj)

    def stream(self, graph, inputs=None, timeout_ms=0, sampling=None, max_iters=None,
               request_id=None, wait_ms=None, messages=None, messages_input=None, **limits):
        """Runs GRAPH with stream set and yields its Chunks as they arrive,
        then its Response (always last). WAIT_MS bounds the whole wait
        (default: TIMEOUT_MS + 2 s when a timeout is set, else the client's
        wait_ms: the daemon's deadline ends every request before). Leaving
        the loop early cancels
        the request. LIMITS: stop, max_tokens, text_output, raw_inputs, as for
        send()."""
        rid = self.send(graph, inputs, True, timeout_ms, sampling, max_iters, request_id,
                        messages, messages_input, **limits)
        if wait_ms is None:
            wait_ms = timeout_ms + 2000 if timeout_ms else self.wait_ms
        deadline = self._deadline(wait_ms)
        done = False
        try:
            while not done:
                ev = self._wait_for(rid, deadline)
                done = not ev.is_chunk
                yield ev
        finally:
            if not done:
                self._drop(rid)

    def _drop(self, rid):
        """Cancels RID and discards its remaining events (best effort)."""
        try:
            self.cancel(rid, timeout_ms=None)
            deadline = self._deadline(5000)
            while self._wait_for(rid, deadline).is_chunk:
                pass
        except BatonError:
            pass

    def infer(self, graph, inputs=None, stream=False, timeout_ms=0, sampling=None,
              max_iters=None, request_id=None, wait_ms=None, messages=None,
              messages_input=None, **limits):
        """Runs GRAPH once and returns its Response (chunks, if STREAM, in
        .chunks). Check .ok or call .raise_for_status(). WAIT_MS as for
        stream(); past it, Timeout. LIMITS: stop, max_tokens, text_output,
        raw_inputs, as for send()."""
        rid = self.send(graph, inputs, stream, timeout_ms, sampling, max_iters, request_id,
                        messages, messages_input, **limits)
        if wait_ms is None:
            wait_ms = timeout_ms + 2000 if timeout_ms else self.wait_ms
        deadline = self._deadline(wait_ms)
        chunks = []
        try:
            while True:
                ev = self._wait_for(rid, deadline)
                if not ev.is_chunk:
                    ev.chunks = chunks
                    return ev
                chunks.append(ev)
        except Timeout:
            self._drop(rid)
            raise

    # ---- probes ---------------------------------------------------------------

    def _probe(self, kind, msg, timeout_ms):
        self._send(msg)
        deadline = self._deadline(timeout_ms)
        try:
            while True:
                k, obj = self._recv_one(deadline)
                if k == kind:
                    if self._stale[k]:  # the answer to an earlier call that gave up
                        self._stale[k] -= 1
                        continue
                    return obj
                if k in _PROBES:
                    if self._stale[k]:
                        self._stale[k] -= 1
                    continue
                if k != "cancel":
                    self._pending.append(obj)
        except Timeout:
            self._stale[kind] += 1
            raise

    def health(self, timeout_ms=5000):
        """Health(live, ready, workers_ready, message)."""
        msg = pb.ClientMessage()
        msg.health.SetInParent()
        return self._probe("health", msg, timeout_ms)

    def stats(self, timeout_ms=5000):
        """The metrics text (Prometheus text format)."""
        msg = pb.ClientMessage()
        msg.stats.SetInParent()
        return self._probe("stats", msg, timeout_ms)

    def inspect(self, graph="", timeout_ms=5000):
        """Graph, partition and schedule of GRAPH ("" : every graph), as text."""
        msg = pb.ClientMessage()
        msg.inspect.graph = graph or ""
        msg.inspect.SetInParent()
        return self._probe("inspect", msg, timeout_ms)
