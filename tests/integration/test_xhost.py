#!/usr/bin/python3
"""Cross-host transfers: real batond and three CPU workers on this machine,
declared on two hosts (`host:`) and pulling each other's tensors over
`peer_listen: tcp://127.0.0.1:*` sockets (tests/integration/configs/xhost.yaml).

Run by tests/integration/run.sh; `test_xhost.py NAME...` runs some tests only.
The closing line is "xhost: N passed, N failed".
"""
import hashlib
import os
import re
import signal
import struct
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evidence  # noqa: E402
import test_e2e as e2e  # noqa: E402  (Daemon, Client, helpers, generated protobuf)
from test_e2e import pb, I32, X, as_i32, i32  # noqa: E402

CONFIG = os.path.join(e2e.ROOT, "tests/integration/configs/xhost.yaml")
WORKERS = ("cpu0", "cpu1", "cpu2")
MIB = 1 << 20


def one_host(text):
    """The same deployment with every worker on one host."""
    return re.sub(r", host: host-[ab]", "", text)


def pool_used(d):
    return [d.metric("baton_pool_bytes_used", 'worker="%s"' % w) for w in WORKERS]


def wait_pool_empty(d, timeout=20.0):
    deadline = time.time() + timeout
    used = None
    while time.time() < deadline:
        used = pool_used(d)
        if used == [0.0, 0.0, 0.0]:
            return
        time.sleep(0.2)
    raise AssertionError("pool bytes still in use: %s" % used)


def wait_responses(c, rids, timeout):
    """The responses of every request of RIDS, in whatever order they end."""
    got = {}
    deadline = time.time() + timeout
    while len(got) < len(rids) and time.time() < deadline:
        m = c.recv(max(0.1, deadline - time.time()))
        if m is not None and m.HasField("response") and m.response.request_id in rids:
            got[m.response.request_id] = m.response
    missing = [r for r in rids if r not in got]
    assert not missing, "no response for %s within %.0fs" % (missing, timeout)
    return got


def run_graphs(d):
    """Outputs of every graph, comparable across deployments."""
    c = d.client()
    out = {}
    try:
        for g, inputs in (("hop", X(7, 8, 9)), ("fanin", X(1, 2, 3)), ("stream", X(4, 5, 6, 7)),
                          ("count", X(0)), ("local_b", X(3))):
            chunks, r = c.infer(g, inputs, stream=True, timeout=60)
            assert r.status.code == pb.OK, (g, r.status)
            # How a stream is cut into dispatches (hence how many timings a
            # node has), and the order parallel nodes end in, depend on
            # timing; the values and which workers ran do not.
            out[g] = ([as_i32(t) for t in r.outputs], sum((as_i32(ch.value) for ch in chunks), []),
                      sorted(set(t.worker for t in r.timings)))
    finally:
        c.close()
    return out


def test_same_outputs_as_one_host(d, c):
    xhost = run_graphs(d)
    with open(CONFIG) as f:
        ref = e2e.Daemon(one_host(f.read()))
    try:
        local = run_graphs(ref)
    finally:
        ref.stop()
    assert xhost == local, (xhost, local)
    assert xhost["fanin"][0] == [[2, 4, 6]]
    wait_pool_empty(d)


def test_large_tensor_crosses_intact(d, c):
    n = 64 * MIB // 4
    data = os.urandom(64 * MIB)
    want = hashlib.sha256(data).hexdigest()
    t0 = time.time()
    _, r = c.infer("hop", {"x": (I32, [n], data)}, timeout=60)
    assert r.status.code == pb.OK, r.status
    assert [t.worker for t in r.timings] == ["cpu0", "cpu1"]
    got = r.outputs[0].data
    assert len(got) == len(data), len(got)
    assert hashlib.sha256(got).hexdigest() == want, "the 64 MiB tensor changed on the way"
    print("  64 MiB hop (client -> cpu0 -> socket -> cpu1 -> client): %.2fs" % (time.time() - t0))
    wait_pool_empty(d)


def test_many_at_once(d, c):
    """Several dispatches' pulls in flight together, small ones beside large."""
    sizes = [1, 3 * MIB // 4, 5, 2 * MIB, 17, MIB // 4 + 3] * 3
    rids = {}
    for k, n in enumerate(sizes):
        vals = [(k * 7919 + i) & 0x7fffffff for i in range(min(n, 64))] + [k] * max(0, n - 64)
        rids[c.request("hop", {"x": (I32, [n], i32(*vals))})] = vals
    got = wait_responses(c, rids, 60)
    for rid, vals in rids.items():
        r = got[rid]
        assert r.status.code == pb.OK, r.status
        assert as_i32(r.outputs[0]) == vals
    wait_pool_empty(d)


def test_producer_killed(d, c):
    """SIGKILL of cpu0 (host-a) while its tensors are being pulled: only
    requests that need it fail, UNAVAILABLE; host-b's own requests in flight
    finish; after the restart cross-host requests succeed again."""
    pid = d.worker_pid("cpu0")
    assert pid, "no cpu0 worker process"
    n = 4 * MIB // 4
    data = i32(*range(n))
    big = {"x": (I32, [n], data)}
    local = [c.request("slow_b", X(i)) for i in range(8)]
    hop = [c.request("hop", big) for _ in range(24)]
    codes = {}
    # Kill once the first cross-host request is through: the rest are
    # being put, run or pulled.
    while True:
        m = c.recv(30)
        assert m is not None, "no answer before the kill"
        if m.HasField("response"):
            codes[m.response.request_id] = (m.response.status.code, m.response.status.message)
            if m.response.request_id in hop:
                break
    os.kill(pid, signal.SIGKILL)
    pending = (set(hop) | set(local)) - set(codes)
    deadline = time.time() + 30
    while pending and time.time() < deadline:
        m = c.recv(max(0.1, deadline - time.time()))
        assert m is not None, "requests not ended after the producer died"
        if m.HasField("response") and m.response.request_id in pending:
            pending.discard(m.response.request_id)
            codes[m.response.request_id] = (m.response.status.code, m.response.status.message)
    assert not pending, "no answer for %s" % sorted(pending)
    for rid in local:
        assert codes[rid][0] == pb.OK, codes[rid]
    failed = [codes[rid] for rid in hop if codes[rid][0] != pb.OK]
    for code, msg in failed:
        assert code == pb.UNAVAILABLE, (code, msg)
    print("  %d of %d cross-host requests failed UNAVAILABLE, e.g. %s" %
          (len(failed), len(hop), failed[0][1] if failed else "-"))
    e2e.wait_restarted(d, c, "cpu0", pid, timeout=20)
    for _ in range(3):
        _, r = c.infer("hop", big, timeout=30)
        assert r.status.code == pb.OK, r.status
        assert r.outputs[0].data == data
    _, r = c.infer("fanin", X(5, 6))
    assert r.status.code == pb.OK, r.status
    assert as_i32(r.outputs[0]) == [10, 12]
    wait_pool_empty(d)


def staged(d, worker):
    return d.metric("baton_worker_staged_bytes_total", 'worker="%s"' % worker)


def test_loop_pulls_once(d, c):
    """A value from host-a read by all 5 iterations of a loop on host-b is
    pulled once per request (heartbeats carry the count: wait for them)."""
    n = MIB // 4
    vals = list(range(n))
    time.sleep(1.5)
    before = staged(d, "cpu1")
    for _ in range(2):
        chunks, r = c.infer("persist", {"x": (I32, [n], i32(*vals))}, stream=True)
        assert r.status.code == pb.OK, r.status
        assert [as_i32(ch.value) for ch in chunks] == [[0], [1], [2], [3], [4]]
    deadline = time.time() + 5
    while time.time() < deadline:
        moved = staged(d, "cpu1") - before
        if moved >= 2 * MIB:
            break
        time.sleep(0.2)
    time.sleep(1.5)
    moved = staged(d, "cpu1") - before
    assert moved == 2 * MIB, "cpu1 pulled %d bytes for two requests of 1 MiB" % moved
    wait_pool_empty(d)


def test_run_ahead_loop(d, c):
    """Iterations the worker chains itself reuse the pulled value; many at
    once, so that Extends reach dispatches still pulling."""
    n = 3 * MIB // 4
    rids = [c.request("spec", {"x": (I32, [n], i32(*range(n)))}, stream=True) for _ in range(6)]
    chunks = {r: [] for r in rids}
    got = {}
    deadline = time.time() + 60
    while len(got) < len(rids) and time.time() < deadline:
        m = c.recv(max(0.1, deadline - time.time()))
        if m is None:
            continue
        if m.HasField("chunk") and m.chunk.request_id in chunks:
            chunks[m.chunk.request_id].append(as_i32(m.chunk.value))
        elif m.HasField("response") and m.response.request_id in chunks:
            got[m.response.request_id] = m.response
    assert len(got) == len(rids), "no response for some requests"
    for r in rids:
        assert got[r].status.code == pb.OK, got[r].status
        assert chunks[r] == [[0], [1], [2], [3], [4]], chunks[r]
    wait_pool_empty(d)


def test_inspect_shows_kinds(d, c):
    m = pb.ClientMessage()
    m.inspect.SetInParent()
    c.send(m)
    r = c.recv()
    assert r is not None and r.HasField("inspect")
    text = r.inspect.text
    assert "transfers by registered host:" in text, text
    assert re.search(r"hop: x -> b: cpu0 \(host host-a\) -> cpu1 \(host host-b\), socket "
                     r"\(pulled from tcp://127\.0\.0\.1:\d+\)", text), text
    assert "local_b: x -> q: cpu2 (host host-b) -> cpu1 (host host-b), ipc" in text, text


def test_check_config_kinds():
    out = subprocess.run([os.path.join(e2e.BUILD, "batond"), "--check-config", CONFIG],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "hop: a.x -> b [forward]: cpu0 -> cpu1, socket" in out.stdout, out.stdout
    assert "fanin: right.y -> sum [forward]: cpu2 -> cpu1, shm" in out.stdout, out.stdout
    # Without peer_listen on the producer: a warning naming it and the key.
    with open(CONFIG) as f:
        text = f.read().replace('host: host-a, peer_listen: "tcp://127.0.0.1:*"', "host: host-a")
    path = os.path.join(e2e.GEN, "no_listen.yaml")
    with open(path, "w") as f:
        f.write(text)
    out = subprocess.run([os.path.join(e2e.BUILD, "batond"), "--check-config", path],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "worker 'cpu0' (host host-a) feeds worker 'cpu1' (host host-b) but has no " \
           "'peer_listen'" in out.stderr, out.stderr
    # An external worker without host: decided at registration.
    text = text.replace("{name: cpu1, device: cpu, pool_mb: 320, host: host-b,",
                        "{name: cpu1, device: cpu, pool_mb: 320, spawn: external,")
    with open(path, "w") as f:
        f.write(text)
    out = subprocess.run([os.path.join(e2e.BUILD, "batond"), "--check-config", path],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "hop: a.x -> b [forward]: cpu0 -> cpu1, decided at registration" in out.stdout, \
        out.stdout


def test_missing_peer_listen_fails_clearly():
    with open(CONFIG) as f:
        text = f.read().replace('host: host-a, peer_listen: "tcp://127.0.0.1:*"', "host: host-a")
    d = e2e.Daemon(text)
    c = d.client()
    try:
        _, r = c.infer("hop", X(1, 2))
        assert r.status.code == pb.FAILED_PRECONDITION, r.status
        assert "cpu0" in r.status.message and "peer_listen" in r.status.message, r.status
        _, r = c.infer("local_b", X(1, 2))
        assert r.status.code == pb.OK, r.status
    finally:
        c.close()
        d.stop()


def main():
    with open(CONFIG) as f:
        config = f.read()
    only = sys.argv[1:]
    passed = failed = 0
    d = e2e.Daemon(config)
    try:
        for t in (test_same_outputs_as_one_host, test_large_tensor_crosses_intact,
                  test_many_at_once, test_loop_pulls_once, test_run_ahead_loop,
                  test_inspect_shows_kinds,
                  test_producer_killed):
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
    for t in (test_check_config_kinds, test_missing_peer_listen_fails_clearly):
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
    print("xhost: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
