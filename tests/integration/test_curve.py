#!/usr/bin/python3
"""CURVE end to end: real batond and baton-worker processes on tcp://
endpoints with keys made by `batonctl keygen`.

One daemon serves `listen: tcp://127.0.0.1:P1` and `workers_endpoint:
tcp://127.0.0.1:P2` with daemon.curve set; it spawns cpu0 itself (a key pair
through a pipe) and waits for ext0, a `spawn: external` worker this script
starts with its `key:`.  Checked: the spawned worker registers over CURVE;
an external worker with an unauthorized key is refused and counted under
socket="worker", the authorized one registers; a peer holding an authorized
worker key that registers as ext0 or as cpu0 is refused and counted, and
ext0 serves on; a client with an authorized
key is served (Python client and batonctl), one with an unknown key, one
with a fresh key and a keyless (NULL mechanism) one get no answer and the
refusals are counted under socket="client"; a refused client's sends time
out instead of blocking (the test client's); SIGHUP re-reads client_keys; a
killed spawned worker comes back with a new key pair; no key appears in the
logs or in --check-config.  Then the config rules
(insecure, a non-loopback tcp endpoint without keys) and the mode of ipc://
socket files.

Run by tests/integration/run.sh; `test_curve.py NAME...` runs some tests
only.  The daemons' folders are kept with their logs when a check fails
(tests/integration/evidence.py).  The closing line is "curve: N passed, N
failed, N skipped".
"""
import os
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
import traceback
import urllib.request

import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
BATOND = os.path.join(BUILD, "batond")
WORKER = os.path.join(BUILD, "baton-worker")
CTL = os.path.join(BUILD, "batonctl")
os.environ.setdefault("BATON_PROTO_PATH", os.path.join(BUILD, "gen", "python"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import baton_client as bc  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evidence  # noqa: E402
import test_e2e as e2e  # noqa: E402  (the test client, for the refused-client check)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def i32(*vals):
    return bc.Tensor("x", "i32", [len(vals)], struct.pack("<%di" % len(vals), *vals))


CONFIG = """version: 1
daemon:
  listen: tcp://127.0.0.1:{p_client}
  workers_endpoint: tcp://127.0.0.1:{p_workers}
  http_listen: 127.0.0.1:{p_http}
  request_timeout_ms: 10000
  log_level: info
  curve:
    secret_key: {dir}/server.key
    client_keys: {dir}/clients.txt
    worker_keys: {dir}/workers.txt
workers:
  - {{name: cpu0, device: cpu, pool_mb: 32}}
  - {{name: ext0, device: cpu, pool_mb: 32, spawn: external, key: {dir}/{ext_key}.key}}
models:
  - {{name: echo0, backend: echo, worker: cpu0}}
  - {{name: echo1, backend: echo, worker: ext0}}
graphs:
  - name: echo
    inputs: [x]
    body:
      node: {{name: e, model: echo0, inputs: [x], outputs: [{{name: x, to: client}}]}}
  - name: echo_ext
    inputs: [x]
    body:
      node: {{name: e, model: echo1, inputs: [x], outputs: [{{name: x, to: client}}]}}
"""


def keygen(d, name):
    out = subprocess.run([CTL, "keygen", "--out", d, name], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    pub = out.stdout.strip()
    assert len(pub) == 40, out.stdout
    return pub


def read(path):
    with open(path) as f:
        return f.read().strip()


class Setup:
    """The keys, the config and the running daemon, shared by the tests."""

    def __init__(self):
        self.dir = evidence.new_dir()
        self.keys = {n: keygen(self.dir, n) for n in
                     ("server", "alice", "mallory", "ext", "rogue", "forger")}
        with open(os.path.join(self.dir, "clients.txt"), "w") as f:
            f.write("# clients batond serves\n%s\n" % self.keys["alice"])
        with open(os.path.join(self.dir, "workers.txt"), "w") as f:
            # ext0's key carries its name; the forger's key is authorized but
            # speaks for no worker in particular.
            f.write("# external workers\n%s ext0\n%s\n" % (self.keys["ext"],
                                                          self.keys["forger"]))
        self.p_client, self.p_workers, self.p_http = free_port(), free_port(), free_port()
        self.endpoint = "tcp://127.0.0.1:%d" % self.p_client
        self.config = self.write_config("baton.yaml", "ext")
        # The same deployment, but ext0's key is one batond does not know.
        self.rogue_config = self.write_config("rogue.yaml", "rogue")
        self.log_path = os.path.join(self.dir, "batond.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([BATOND, "--config", self.config], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.workers = []

    def write_config(self, name, ext_key):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(CONFIG.format(dir=self.dir, p_client=self.p_client, p_workers=self.p_workers,
                                  p_http=self.p_http, ext_key=ext_key))
        return path

    def start_worker(self, config, log_name):
        log = open(os.path.join(self.dir, log_name), "w")
        p = subprocess.Popen([WORKER, "--config", config, "--name", "ext0", "--run-id",
                              "curve-%d" % os.getpid()], stdout=log, stderr=subprocess.STDOUT)
        self.workers.append((p, log))
        return p

    def client(self, client_key, timeout_ms=2000):
        return bc.Client(self.endpoint, server_key=os.path.join(self.dir, "server.pub"),
                         client_key=client_key, connect_timeout_ms=timeout_ms)

    def key(self, name):
        return os.path.join(self.dir, name + ".key")

    def metrics(self):
        return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.p_http,
                                      timeout=5).read().decode()

    def refused(self, sock):
        m = re.search(r'^baton_auth_refused_total\{socket="%s"\} (\d+)$' % sock, self.metrics(),
                      re.M)
        assert m, "no baton_auth_refused_total{socket=%s} in /metrics" % sock
        return int(m.group(1))

    def health(self):
        try:
            with self.client(self.key("alice")) as c:
                return c.health(timeout_ms=1000)
        except bc.BatonError:
            return None

    def wait_for(self, what, cond, timeout=20.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("batond exited: %s" % self.tail())
            if cond():
                return
            time.sleep(0.1)
        raise AssertionError("timed out waiting for %s\n%s" % (what, self.tail()))

    def tail(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def stop(self):
        """Stops everything; returns what did not exit cleanly (a sanitizer's
        report makes a process exit 1), with its log."""
        problems = []
        for p, log in self.workers:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            log.close()
            if p.returncode != 0 and p.returncode != -signal.SIGTERM:
                with open(log.name) as f:
                    problems.append("worker exited %d:\n%s" % (p.returncode, f.read()[-3000:]))
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.returncode != 0:
            problems.append("batond exited %d:\n%s" % (self.proc.returncode, self.tail()))
        self.log.close()
        evidence.release(self.dir)
        return problems


def served(s, client_key, graph="echo"):
    """Whether a client with CLIENT_KEY gets an answer; False when it gets
    none in time (what a refused peer sees: the handshake never completes)."""
    try:
        with s.client(client_key, timeout_ms=1500) as c:
            r = c.infer(graph, {"x": i32(4, 5, 6)}, timeout_ms=3000, wait_ms=4000)
            assert r.ok, r
            return True
    except (bc.ConnectError, bc.Timeout):
        return False


# ---- tests on the shared daemon, in order ---------------------------------------

def test_spawned_worker_registers(s):
    s.wait_for("cpu0 to register over CURVE",
               lambda: "worker cpu0 loaded model echo0" in s.tail())
    h = s.health()
    assert h is not None and "cpu0" in h.workers_ready, h


def test_external_worker_unauthorized_refused(s):
    before = s.refused("worker")
    p = s.start_worker(s.rogue_config, "rogue.log")
    s.wait_for("the rogue worker's refusal", lambda: s.refused("worker") > before)
    time.sleep(0.5)
    assert "external worker ext0 registered" not in s.tail(), s.tail()
    p.terminate()
    p.wait(timeout=10)


def test_external_worker_registers(s):
    s.start_worker(s.config, "ext.log")
    s.wait_for("ext0 to register", lambda: bool((s.health() or None) and s.health().ready))
    assert served(s, s.key("alice"), "echo_ext")


def registrations_refused(s, reason):
    m = re.search(r'^baton_worker_registrations_refused_total\{reason="%s"\} (\d+)$' % reason,
                  s.metrics(), re.M)
    assert m, "no baton_worker_registrations_refused_total{reason=%s} in /metrics" % reason
    return int(m.group(1))


def test_forged_registration_refused(s):
    """A peer holding an authorized worker key, connected with the routing
    id "ext0" (which the ROUTER's handover would once have given it),
    registers as ext0 with its own key, as ext0 offering ext0's key to its
    peers, and as the spawned cpu0: each is refused, counted and told to
    shut down, and the real ext0 keeps serving, never lost."""
    before = {r: registrations_refused(s, r) for r in ("not_its_key", "claimed_key")}
    ctx = zmq.Context.instance()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.SNDTIMEO, e2e.SEND_TIMEOUT_MS)
    d.setsockopt(zmq.ROUTING_ID, b"ext0")
    d.curve_secretkey = read(s.key("forger")).encode()
    d.curve_publickey = s.keys["forger"].encode()
    d.curve_serverkey = s.keys["server"].encode()
    d.connect("tcp://127.0.0.1:%d" % s.p_workers)
    pb = e2e.pb
    try:
        for name, offered in (("ext0", s.keys["forger"]), ("ext0", s.keys["ext"]),
                              ("cpu0", s.keys["forger"])):
            reg = pb.Register(protocol_version=pb.PROTOCOL_VERSION_CURRENT, worker=name,
                              device="cpu", pool_bytes=1 << 20, pid=os.getpid(),
                              hostname=socket.gethostname(), curve_public_key=offered)
            d.send(pb.WorkerMessage(registration=reg).SerializeToString())
            assert d.poll(10000), "no answer to the forged registration as %s" % name
            shut = [m for m in (pb.ConductorMessage.FromString(f) for f in d.recv_multipart())
                    if m.WhichOneof("msg") == "shutdown"]
            assert shut and "registration refused" in shut[0].shutdown.reason, shut
            # What it would send as that worker is heard by nobody.
            d.send(pb.WorkerMessage(heartbeat=pb.Heartbeat()).SerializeToString())
    finally:
        d.close()
    after = {r: registrations_refused(s, r) for r in ("not_its_key", "claimed_key")}
    assert after["not_its_key"] == before["not_its_key"] + 2, (before, after)
    assert after["claimed_key"] == before["claimed_key"] + 1, (before, after)
    log = s.tail()
    assert "refused a registration as worker ext0" in log, log
    assert "worker ext0 lost" not in log and "worker cpu0 lost" not in log, log
    assert served(s, s.key("alice"), "echo_ext")
    assert served(s, s.key("alice"), "echo")
    assert s.health().ready


def test_authorized_client_served(s):
    with s.client(s.key("alice")) as c:
        r = c.infer("echo", {"x": i32(1, 2, 3)}, timeout_ms=5000)
        assert r.ok, r
        assert struct.unpack("<3i", r.tensors["x"].data) == (1, 2, 3)
    # The key pair as a (public, secret) tuple works the same.
    pub, sec = s.keys["alice"], read(s.key("alice"))
    with bc.Client(s.endpoint, server_key=s.keys["server"], client_key=(pub, sec)) as c:
        assert c.health(timeout_ms=3000).live


def test_unknown_key_refused_and_counted(s):
    before = s.refused("client")
    assert not served(s, s.key("mallory"))
    s.wait_for("the client refusal to be counted", lambda: s.refused("client") > before, 5)


def test_fresh_key_refused(s):
    before = s.refused("client")
    assert not served(s, None)
    s.wait_for("the client refusal to be counted", lambda: s.refused("client") > before, 5)


def test_keyless_client_refused(s):
    """A client without CURVE fails the handshake before ZAP is asked; it
    is still refused, and counted in baton_auth_refused_total."""
    before = s.refused("client")
    ctx = zmq.Context()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.SNDTIMEO, 2000)
    d.setsockopt(zmq.RCVTIMEO, 2000)
    d.connect(s.endpoint)
    m = bc.pb.ClientMessage()
    m.health.SetInParent()
    try:
        d.send(m.SerializeToString())
        got = d.poll(2000)
    except zmq.Again:  # the refused connection left nowhere to send
        got = False
    d.close()
    ctx.term()
    assert not got, "a NULL-mechanism client got an answer"
    s.wait_for("the keyless refusal to be counted", lambda: s.refused("client") > before, 5)


def test_refused_client_never_blocks(s):
    """When the daemon refuses a CURVE client, ZeroMQ tears the client's
    connection down and drops its pipe: a send has nowhere to go, and one
    without a timeout blocks for ever.  The tests' client (test_e2e.Client)
    must give up instead: health() is None, a send raises SendTimeout."""
    before = s.refused("client")
    ctx = zmq.Context()
    pub, sec = zmq.curve_keypair()
    c = e2e.Client(ctx, s.endpoint, curve=(s.keys["server"].encode(), pub, sec))
    try:
        s.wait_for("the client refusal to be counted", lambda: s.refused("client") > before, 5)
        # The client's side learns of it too: its pipe goes (a poll lets the
        # socket act on that); a libzmq that kept it would just not answer.
        deadline = time.time() + 10
        while c.sock.poll(0, zmq.POLLOUT) and time.time() < deadline:
            time.sleep(0.05)
        torn_down = not c.sock.poll(0, zmq.POLLOUT)
        assert c.health(timeout=1.0) is None, "a refused client was served"
        if torn_down:
            m = bc.pb.ClientMessage()
            m.health.SetInParent()
            try:
                c.send(m, timeout=0.5)
                raise AssertionError("a send with no connection went through")
            except e2e.SendTimeout:
                pass
        else:
            print("  (this libzmq kept the refused connection's pipe: nothing to time out)")
    finally:
        c.close()
        ctx.destroy(linger=0)


def test_batonctl_with_keys(s):
    base = [CTL, "--endpoint", s.endpoint, "--timeout-ms", "3000"]
    for server_key in (os.path.join(s.dir, "server.pub"), s.keys["server"]):
        out = subprocess.run(base + ["--server-key", server_key, "--client-key", s.key("alice"),
                                     "infer", "echo", "--input", "x=i32:7,8"],
                             capture_output=True, text=True)
        assert out.returncode == 0 and "[7, 8]" in out.stdout, out
    out = subprocess.run(base + ["--server-key", os.path.join(s.dir, "server.pub"), "health"],
                         capture_output=True, text=True)
    assert out.returncode == 3, out
    out = subprocess.run(base + ["--server-key", s.key("server"), "health"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "not a .key" in out.stderr, out
    env = dict(os.environ, BATON_SERVER_KEY=s.keys["server"], BATON_CLIENT_KEY=s.key("alice"))
    out = subprocess.run(base + ["health"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out


def test_sighup_rereads_client_keys(s):
    assert not served(s, s.key("mallory"))
    with open(os.path.join(s.dir, "clients.txt"), "a") as f:
        f.write("%s\n" % s.keys["mallory"])
    s.proc.send_signal(signal.SIGHUP)
    s.wait_for("the reload", lambda: "reloaded" in s.tail(), 5)
    assert served(s, s.key("mallory"))


def test_gateway_uses_curve(s):
    body = urllib.request.urlopen("http://127.0.0.1:%d/health" % s.p_http, timeout=5).read()
    assert b'"ready"' in body, body


def test_spawned_worker_restarts(s):
    """A killed spawned worker comes back with a fresh key pair (the lost
    one's key is forgotten) and registers again over CURVE."""
    out = subprocess.run(["pgrep", "-P", str(s.proc.pid), "-f", "--", "--name cpu0 "],
                         capture_output=True, text=True).stdout.split()
    assert out, "no cpu0 child of batond"
    os.kill(int(out[0]), signal.SIGKILL)
    s.wait_for("cpu0 to be lost", lambda: "worker cpu0 lost" in s.tail(), 10)
    s.wait_for("cpu0 to come back", lambda: s.tail().count("worker cpu0 loaded model") >= 2, 20)
    s.wait_for("readiness", lambda: bool(s.health() and s.health().ready), 10)
    assert served(s, s.key("alice"))


def test_no_key_in_logs(s):
    out = subprocess.run([BATOND, "--check-config", s.config], capture_output=True, text=True)
    assert out.returncode == 0, out
    assert ("curve: server public key %s..." % s.keys["server"][:8]) in out.stdout, out.stdout
    texts = [out.stdout + out.stderr, s.tail()]
    for name in ("ext.log", "rogue.log"):
        with open(os.path.join(s.dir, name)) as f:
            texts.append(f.read())
    for name, pub in s.keys.items():
        for key in (pub, read(s.key(name))):
            for t in texts:
                assert key not in t, "a key of %s appears in a log" % name


SHARED = [test_spawned_worker_registers, test_external_worker_unauthorized_refused,
          test_external_worker_registers, test_forged_registration_refused,
          test_authorized_client_served,
          test_unknown_key_refused_and_counted, test_fresh_key_refused,
          test_keyless_client_refused, test_refused_client_never_blocks, test_batonctl_with_keys, test_sighup_rereads_client_keys,
          test_gateway_uses_curve, test_spawned_worker_restarts, test_no_key_in_logs]


# ---- tests of their own ---------------------------------------------------------

MINIMAL = """version: 1
daemon:
{daemon}
workers:
  - {{name: cpu0, device: cpu, pool_mb: 16}}
models:
  - {{name: echo0, backend: echo, worker: cpu0}}
graphs:
  - name: echo
    inputs: [x]
    body:
      node: {{name: e, model: echo0, inputs: [x], outputs: [{{name: x, to: client}}]}}
"""


def check_config(d, daemon_lines):
    path = os.path.join(d, "c.yaml")
    with open(path, "w") as f:
        f.write(MINIMAL.format(daemon=daemon_lines))
    return subprocess.run([BATOND, "--check-config", path], capture_output=True, text=True)


def test_config_rules():
    d = evidence.new_dir("cfg")
    try:
        out = check_config(d, "  listen: tcp://0.0.0.0:%d" % free_port())
        assert out.returncode == 1 and "daemon.curve is not set" in out.stderr, out
        out = check_config(d, "  listen: tcp://0.0.0.0:%d\n  insecure: true" % free_port())
        assert out.returncode == 0 and "warning" in out.stderr and \
            "insecure: listen" in out.stderr, out
        out = check_config(d, "  listen: tcp://127.0.0.1:%d" % free_port())
        assert out.returncode == 0 and "loopback TCP endpoint without CURVE" in out.stderr, out
        keygen(d, "srv")
        os.chmod(os.path.join(d, "srv.key"), 0o640)
        out = check_config(d, "  listen: tcp://0.0.0.0:1\n  curve: {secret_key: %s/srv.key}" % d)
        assert out.returncode == 1 and "readable by group or others" in out.stderr, out
    finally:
        evidence.release(d)


def run_ipc_daemon(d, extra):
    cfg = os.path.join(d, "ipc.yaml")
    with open(cfg, "w") as f:
        f.write(MINIMAL.format(daemon="  listen: ipc://%s/baton.sock\n"
                                      "  workers_endpoint: ipc://%s/workers.sock\n%s"
                                      % (d, d, extra)))
    log = open(os.path.join(d, "batond.log"), "w")
    return subprocess.Popen([BATOND, "--config", cfg], stdout=log, stderr=subprocess.STDOUT), log


def stop(p, log):
    """Stops batond P; asserts that it exited 0 (a drain, no sanitizer report)."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    log.close()
    with open(log.name) as f:
        assert p.returncode == 0, "batond exited %d:\n%s" % (p.returncode, f.read()[-3000:])


def test_ipc_socket_mode():
    """The socket files get ipc_mode (0660 unless set); ipc:// clients need no
    key, also when daemon.curve is set (the NULL mechanism stays allowed)."""
    for extra, mode in (("", 0o660), ("  ipc_mode: 0600\n  curve: {secret_key: %s/srv.key}\n",
                                      0o600)):
        d = evidence.new_dir("ipc")
        if "%s" in extra:
            keygen(d, "srv")
            extra = extra % d
        p, log = run_ipc_daemon(d, extra)
        try:
            sock = os.path.join(d, "baton.sock")
            deadline = time.time() + 10
            while time.time() < deadline and not (os.path.exists(sock) and
                                                  os.path.exists(os.path.join(d, "workers.sock"))):
                time.sleep(0.05)
            time.sleep(0.2)
            for name in ("baton.sock", "workers.sock"):
                got = stat.S_IMODE(os.stat(os.path.join(d, name)).st_mode)
                assert got == mode, "%s: mode %o, expected %o" % (name, got, mode)
            # Served over the ipc socket without CURVE (NULL mechanism).
            with bc.Client("ipc://" + sock) as c:
                assert c.health(timeout_ms=5000).live
        finally:
            stop(p, log)
            evidence.release(d)


def test_ipc_group_missing():
    d = evidence.new_dir("ipc")
    p, log = run_ipc_daemon(d, "  ipc_group: no-such-group-baton\n")
    try:
        rc = p.wait(timeout=15)
        with open(os.path.join(d, "batond.log")) as f:
            text = f.read()
        assert rc == 1 and "ipc_group 'no-such-group-baton'" in text, (rc, text)
        assert "AddressSanitizer" not in text and "runtime error" not in text, text
    finally:
        log.close()
        evidence.release(d)


OWN = [test_config_rules, test_ipc_socket_mode, test_ipc_group_missing]


def main():
    only = sys.argv[1:]
    passed = failed = skipped = 0
    if not zmq.has("curve"):
        print("SKIP curve: this libzmq has no CURVE")
        return 77
    shared = [t for t in SHARED if not only or t.__name__ in only]
    if shared:
        s = Setup()
        try:
            # The shared tests build on each other (workers register, then
            # clients): a selection still runs the ones before it.
            last = max(SHARED.index(t) for t in shared)
            for t in SHARED[:last + 1]:
                try:
                    t(s)
                    passed += 1
                    print("ok   %s" % t.__name__, flush=True)
                    evidence.passed()
                except Exception:
                    failed += 1
                    print("FAIL %s\n%s" % (t.__name__, traceback.format_exc()), flush=True)
                    evidence.failed(t.__name__)
        finally:
            for p in s.stop():
                failed += 1
                print("FAIL the shared daemon's processes: %s" % p, flush=True)
                evidence.failed("the shared daemon's processes")
    for t in OWN:
        if only and t.__name__ not in only:
            continue
        try:
            t()
            passed += 1
            print("ok   %s" % t.__name__, flush=True)
            evidence.passed()
        except Exception:
            failed += 1
            print("FAIL %s\n%s" % (t.__name__, traceback.format_exc()), flush=True)
            evidence.failed(t.__name__)
    print("curve: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
