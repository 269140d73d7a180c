#!/usr/bin/python3
"""baton across hosts: each host a network namespace with its own address.

Four namespaces joined by a bridge (tests/integration/netns.py): `c` runs
batond, `w1` and `w2` each run one CPU worker that batond does not spawn
(`spawn: external`, as `baton-worker@NAME` would on another machine), and
`cl` is where this script's clients connect from.  Every socket is TCP on
the namespaces' own addresses, under CURVE with keys made by `batonctl
keygen`.  The workers declare their hosts (`host:`), since namespaces share
the machine's hostname.

Checked:
  - a graph whose edges cross hosts gives the same outputs as the same
    graph with both workers on one host (the single-host run is part of
    this script);
  - a 64 MiB tensor crosses hosts intact;
  - a client without an authorized key gets no answer and is counted in
    baton_auth_refused_total, one with the key is served;
  - a worker whose link is cut is declared lost within the heartbeat
    timeout, its requests end UNAVAILABLE, and when the link comes back
    it registers again (its service manager restarts it when batond tells
    it to) and serves;
  - a SIGKILLed remote worker, started again by hand, rejoins.

Needs root for `ip netns`; prints SKIP and exits 77 where it cannot make
namespaces.  The daemon's and workers' logs are kept, with the keys and
configs, when a check fails (tests/integration/evidence.py).  The closing
line is "multihost: N passed, N failed".
"""
import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evidence  # noqa: E402
import netns  # noqa: E402

ok, why = netns.available()
if not ok:
    print("SKIP multihost: %s" % why)
    sys.exit(77)

import zmq  # noqa: E402
from test_e2e import BUILD, I32, X, as_i32, i32, pb, Client  # noqa: E402

HEARTBEAT_LOSS_S = 3.0   # an external worker silent this long is lost

CONFIG = """\
version: 1
daemon:
  listen: tcp://{c}:7001
  workers_endpoint: tcp://{c}:7002
  http_listen: {c}:7003
  curve:
    secret_key: {keys}/batond.key
    public_key: {keys}/batond.pub
    client_keys: {keys}/clients.txt
    worker_keys: {keys}/workers.txt
  max_inflight: 64
  request_timeout_ms: 20000
  drain_timeout_ms: 2000
  max_message_bytes: 100663296
  log_level: info
workers:
  - {{name: cpu0, device: cpu, pool_mb: 200, spawn: external, host: {h1}, key: {keys}/w1.key,
     peer_listen: "tcp://{w1}:7010"}}
  - {{name: cpu1, device: cpu, pool_mb: 200, spawn: external, host: {h2}, key: {keys}/w2.key,
     peer_listen: "tcp://{w2}:7010"}}
models:
  - {{name: echo0, backend: echo, worker: cpu0, max_batch: 8}}
  - {{name: echo1, backend: echo, worker: cpu1, max_batch: 8}}
  - {{name: add1, backend: add, worker: cpu1}}
  - {{name: chunks0, backend: chunks, worker: cpu0, options: {{n: 4}}}}
graphs:
  - name: hop
    inputs: [x]
    body:
      sequential:
        - node: {{name: a, model: echo0, inputs: [x], outputs: [{{name: x, to: b}}]}}
        - node: {{name: b, model: echo1, inputs: [x], outputs: [{{name: x, to: client}}]}}
  - name: fanin
    inputs: [x]
    body:
      sequential:
        - parallel:
            - node: {{name: left, model: echo0, inputs: [x], outputs: [{{name: x, to: sum}}]}}
            - node: {{name: right, model: echo1, inputs: [x], outputs: [{{name: y, to: sum}}]}}
        - node: {{name: sum, model: add1, inputs: [x, y], outputs: [{{name: out, to: client}}]}}
  - name: stream
    inputs: [x]
    body:
      sequential:
        - node: {{name: spread, model: chunks0, inputs: [x], outputs: [{{name: part, to: gather, stream: true}}]}}
        - node: {{name: gather, model: echo1, consumes_stream: true, inputs: [part],
                 outputs: [{{name: part, to: client, new_token: true}}]}}
"""


class Skip(Exception):
    pass


def keygen(keys, name):
    subprocess.run([os.path.join(BUILD, "batonctl"), "keygen", "--out", keys, name],
                   check=True, capture_output=True)
    with open(os.path.join(keys, name + ".pub")) as f:
        return f.read().strip()


def curve_client(ctx, endpoint, server_pub, keys, name):
    """A Client whose socket speaks CURVE with key pair NAME (or a fresh
    one).  A refused one's sends time out (its connection is torn down):
    its health() is None, it does not block."""
    if name:
        with open(os.path.join(keys, name + ".pub")) as f:
            pub = f.read().strip().encode()
        with open(os.path.join(keys, name + ".key")) as f:
            sec = f.read().strip().encode()
    else:
        pub, sec = zmq.curve_keypair()
    return Client(ctx, endpoint, curve=(server_pub.encode(), pub, sec))


class Worker:
    """One external worker in its namespace; SUPERVISE restarts it when it
    exits, one second later, as systemd's Restart=always RestartSec=1."""

    def __init__(self, hosts, ns, config, name, log, supervise=False):
        self.hosts, self.ns, self.config, self.name, self.log = hosts, ns, config, name, log
        self.supervise = supervise
        self.proc = None
        self.stopped = False
        self.starts = 0
        self.lock = threading.Lock()
        self.start()
        if supervise:
            threading.Thread(target=self._watch, daemon=True).start()

    def start(self):
        with self.lock:
            self.starts += 1
            self.proc = self.hosts.popen(self.ns, [
                os.path.join(BUILD, "baton-worker"), "--config", self.config, "--name", self.name,
                "--run-id", "mh%d-%s-%d" % (os.getpid(), self.name, self.starts)],
                stdout=self.log, stderr=subprocess.STDOUT)

    def _watch(self):
        while not self.stopped:
            p = self.proc
            if p.poll() is not None:
                time.sleep(1.0)
                if not self.stopped:
                    self.start()
            time.sleep(0.1)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        self.stopped = True
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Cluster:
    def __init__(self, hosts, text, tmp):
        self.hosts, self.tmp = hosts, tmp
        self.config = os.path.join(tmp, "baton.yaml")
        with open(self.config, "w") as f:
            f.write(text)
        self.log = open(os.path.join(tmp, "batond.log"), "w")
        self.wlog = open(os.path.join(tmp, "workers.log"), "w")
        self.batond = hosts.popen("c", [os.path.join(BUILD, "batond"), "--config", self.config],
                                  stdout=self.log, stderr=subprocess.STDOUT)
        self.workers = {}

    def stop(self):
        for w in self.workers.values():
            w.stop()
        if self.batond.poll() is None:
            self.batond.terminate()
            try:
                self.batond.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.batond.kill()


def wait_ready(c, want=True, timeout=30.0):
    deadline = time.time() + timeout
    h = None
    while time.time() < deadline:
        h = c.health(timeout=1.0)
        if h is not None and h.ready == want:
            return h
        time.sleep(0.05)
    raise AssertionError("health never became ready=%s: %s" % (want, h))


def metric(addr, name, labels):
    text = urllib.request.urlopen("http://%s:7003/metrics" % addr, timeout=5).read().decode()
    m = re.search(r"^%s\{%s\} (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else None


def run_graphs(c):
    """The outputs of every graph for fixed inputs, as plain values."""
    out = {}
    _, r = c.infer("hop", X(1, 2, 3))
    assert r.status.code == pb.OK, r.status
    out["hop"] = as_i32(r.outputs[0])
    _, r = c.infer("fanin", X(5, 6, 7, 8))
    assert r.status.code == pb.OK, r.status
    out["fanin"] = as_i32(r.outputs[0])
    chunks, r = c.infer("stream", X(*range(8)), stream=True)
    assert r.status.code == pb.OK, r.status
    # How the streamed parts are cut into the consumer's dispatches (so how
    # many chunks reach the client) depends on timing; the values in order
    # do not.
    out["stream"] = sum((as_i32(ch.value) for ch in chunks), [])
    return out


def single_host_outputs(tmp):
    """The same graphs with batond spawning both workers on this host over
    ipc://: the outputs the multi-host run must match."""
    text = CONFIG.format(c="127.0.0.1", w1="127.0.0.1", w2="127.0.0.1", h1="here", h2="here",
                         keys=tmp)
    text = re.sub(r"  listen: .*\n", "  listen: ipc://%s/one.sock\n" % tmp, text)
    text = re.sub(r"  workers_endpoint: .*\n", "  workers_endpoint: ipc://%s/onew.sock\n" % tmp,
                  text)
    text = re.sub(r"  http_listen: .*\n", "", text)
    text = re.sub(r"  curve:\n(    .*\n)+", "", text)
    text = re.sub(r", spawn: external, host: here, key: [^,]*,\n\s*peer_listen: \"[^\"]*\"", "",
                  text)
    path = os.path.join(tmp, "one.yaml")
    with open(path, "w") as f:
        f.write(text)
    log = open(os.path.join(tmp, "one.log"), "w")
    p = subprocess.Popen([os.path.join(BUILD, "batond"), "--config", path], stdout=log,
                         stderr=subprocess.STDOUT)
    ctx = zmq.Context()
    c = Client(ctx, "ipc://%s/one.sock" % tmp)
    try:
        wait_ready(c)
        return run_graphs(c)
    finally:
        c.close()
        ctx.term()
        p.terminate()
        p.wait(timeout=15)
        log.close()


def main():
    tmp = evidence.new_dir()
    os.chmod(tmp, 0o755)
    keys = os.path.join(tmp, "keys")
    os.mkdir(keys)
    server_pub = keygen(keys, "batond")
    with open(os.path.join(keys, "clients.txt"), "w") as f:
        f.write("# authorized clients\n%s\n" % keygen(keys, "client"))
    keygen(keys, "stranger")
    with open(os.path.join(keys, "workers.txt"), "w") as f:
        f.write("%s\n%s\n" % (keygen(keys, "w1"), keygen(keys, "w2")))
    # Before any namespace: the reference outputs, on one host.
    reference = single_host_outputs(tmp)

    passed = failed = 0
    with netns.Hosts(["c", "w1", "w2", "cl"]) as hosts:
        text = CONFIG.format(c=hosts.addr("c"), w1=hosts.addr("w1"), w2=hosts.addr("w2"),
                             h1="host-w1", h2="host-w2", keys=keys)
        cl = Cluster(hosts, text, tmp)
        cl.workers["cpu0"] = Worker(hosts, "w1", cl.config, "cpu0", cl.wlog, supervise=True)
        cl.workers["cpu1"] = Worker(hosts, "w2", cl.config, "cpu1", cl.wlog)
        # From here on this thread, and the ZeroMQ threads it starts, live
        # on host `cl`.
        netns.enter(hosts, "cl")
        ctx = zmq.Context()
        endpoint = "tcp://%s:7001" % hosts.addr("c")
        c = curve_client(ctx, endpoint, server_pub, keys, "client")

        def check(name, fn):
            nonlocal passed, failed
            try:
                fn()
                passed += 1
                print("ok   %s" % name, flush=True)
                evidence.passed()
            except Exception:
                failed += 1
                print("FAIL %s\n%s" % (name, traceback.format_exc()), flush=True)
                cl.log.flush()
                cl.wlog.flush()
                evidence.failed(name)

        def same_results():
            wait_ready(c)
            got = run_graphs(c)
            assert got == reference, (got, reference)
            r = subprocess.run([os.path.join(BUILD, "batond"), "--check-config", cl.config],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "cross-host" in r.stdout, r.stdout

        def big_tensor():
            n = 64 << 20
            data = os.urandom(n)
            staged = 'worker="cpu1"'
            before = metric(hosts.addr("c"), "baton_worker_staged_bytes_total", staged) or 0
            _, r = c.infer("hop", {"x": (pb.U8, [n], data)}, timeout=120)
            assert r.status.code == pb.OK, r.status
            got = r.outputs[0].data
            assert len(got) == n and hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
            # cpu1 pulled the 64 MiB from cpu0 over the peer socket (pulled
            # bytes count as staged), not through shared memory.
            deadline = time.time() + 10
            while time.time() < deadline:
                after = metric(hosts.addr("c"), "baton_worker_staged_bytes_total", staged) or 0
                if after >= before + n:
                    break
                time.sleep(0.5)
            assert after >= before + n, (before, after)

        def keys_checked():
            before = metric(hosts.addr("c"), "baton_auth_refused_total", 'socket="client"') or 0
            for who in ("stranger", None):
                s = curve_client(ctx, endpoint, server_pub, keys, who)
                assert s.health(timeout=2.0) is None, "a client with key %s was served" % who
                s.close()
            plain = Client(ctx, endpoint)
            assert plain.health(timeout=2.0) is None, "a client without CURVE was served"
            plain.close()
            after = metric(hosts.addr("c"), "baton_auth_refused_total", 'socket="client"')
            assert after is not None and after >= before + 2, (before, after)
            assert c.health(timeout=5.0) is not None

        def link_cut():
            wait_ready(c)
            hosts.link("w1", up=False)
            t0 = time.time()
            h = wait_ready(c, want=False, timeout=HEARTBEAT_LOSS_S + 5)
            lost_after = time.time() - t0
            assert lost_after < HEARTBEAT_LOSS_S + 2, lost_after
            _, r = c.infer("hop", X(1))
            assert r.status.code == pb.UNAVAILABLE, r.status
            hosts.link("w1", up=True)
            wait_ready(c, timeout=30)
            _, r = c.infer("hop", X(4, 5))
            assert r.status.code == pb.OK, r.status
            assert as_i32(r.outputs[0]) == [4, 5]
            assert h is not None

        def killed_worker_rejoins():
            wait_ready(c)
            w = cl.workers["cpu1"]
            w.kill()
            wait_ready(c, want=False, timeout=HEARTBEAT_LOSS_S + 5)
            _, r = c.infer("hop", X(2))
            assert r.status.code == pb.UNAVAILABLE, r.status
            w.start()  # by hand, as systemd would
            wait_ready(c, timeout=30)
            assert run_graphs(c) == reference

        try:
            check("cross-host graphs match the single-host run", same_results)
            check("a 64 MiB tensor crosses hosts", big_tensor)
            check("only authorized client keys are served", keys_checked)
            check("a cut link: lost, UNAVAILABLE, back when restored", link_cut)
            check("a SIGKILLed remote worker started by hand rejoins", killed_worker_rejoins)
        finally:
            c.close()
            ctx.destroy(linger=0)
            cl.stop()
    evidence.release(tmp)
    print("multihost: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
