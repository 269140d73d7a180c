#!/usr/bin/python3
"""Replicas: one model on several workers, each with a full copy.

Real batond and baton-worker processes (tests/integration/configs/
replicas.yaml): every node of a request's replicated model runs on one
replica, a decode loop included; requests spread over the replicas; a
replica killed with SIGKILL ends its own requests UNAVAILABLE while the
other's finish, new requests go on being served, and the restarted replica
takes requests again; a replica that never registers leaves the daemon
ready on the others.  With the default model (configs/replicas-llm.yaml,
SKIP without it): a conversation's second turn goes to the replica that
cached its first (cache-aware routing), reads its prefix from the cache
(usage.cached_tokens natively and prompt_tokens_details.cached_tokens over
HTTP) and answers what a copy without a prefix cache answers; the metrics
count it.  The closing line is "replicas: N passed, N failed, N skipped".
"""
import json
import os
import signal
import sys
import time
import traceback
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evidence  # noqa: E402
from test_e2e import (ROOT, X, Daemon, Skip, inspect, need_model, pb,  # noqa: E402
                      wait_pool_empty, wait_restarted)


def workers_of(response):
    """Node name -> the set of workers that ran it, from the timings."""
    out = {}
    for t in response.timings:
        out.setdefault(t.node, set()).add(t.worker)
    return out


def collect(c, rids, timeout=20.0, arrived=None):
    """The responses of RIDS (by id), each within TIMEOUT of the last; the
    time each came in ARRIVED (by id) when given."""
    got = {}
    while len(got) < len(rids):
        m = c.recv(timeout)
        assert m is not None, "no response for %s" % sorted(set(rids) - set(got))
        if m.HasField("response"):
            got[m.response.request_id] = m.response
            if arrived is not None:
                arrived[m.response.request_id] = time.time()
    return got


def test_sticky_and_spread(d, c):
    """Eight decode loops at once: each runs its start node and all its
    iterations on one replica, the joined states on `fixed`, and both
    replicas take some."""
    rids = [c.request("decode", X(i)) for i in range(8)]
    used = set()
    for rid, r in collect(c, rids).items():
        assert r.status.code == pb.OK, (rid, r.status)
        w = workers_of(r)
        assert len(w["start"] | w["step"]) == 1, (rid, w)
        assert w["last"] == {"fixed"}, (rid, w)
        used |= w["step"]
    assert used == {"r0", "r1"}, used
    text = inspect(c, "")
    assert "node step: model tick, mode '', on r0 or r1 (one replica per request)" in text, text
    assert "tick: backend counter, max_batch 8, on r0 r1 (2 replicas, routing least_loaded)" \
        in text, text
    assert "replicas:\n  tick: routing least_loaded, max_batch 8\n" in text, text
    assert "    r0: ready, 0 pinned, picked " in text, text


def test_replica_killed(d, c):
    """SIGKILL of r0 under load: its requests end UNAVAILABLE naming it, r1's
    finish OK, nothing is lost, new requests are served, and r0 rejoins."""
    pid = d.worker_pid("r0")
    assert pid, "no r0 worker process"
    rids = [c.request("slow", X(i)) for i in range(10)]
    time.sleep(0.15)
    t0 = time.time()
    os.kill(pid, signal.SIGKILL)
    arrived = {}
    got = collect(c, rids, arrived=arrived)
    ended = 0.0
    on = {"r0": 0, "r1": 0}
    for rid, r in got.items():
        if r.status.code == pb.OK:
            assert workers_of(r)["n"] == {"r1"}, (rid, workers_of(r))
            on["r1"] += 1
        else:
            assert r.status.code == pb.UNAVAILABLE, (rid, r.status)
            assert "worker 'r0' was lost" in r.status.message, r.status
            on["r0"] += 1
            ended = max(ended, arrived[rid] - t0)
    assert on["r0"] >= 1 and on["r1"] >= 1, on
    # Reported, not asserted: a timing bound would flake on a loaded machine.
    print("  %d requests on r0 ended UNAVAILABLE within %.3fs of the kill, %d on r1 OK"
          % (on["r0"], ended, on["r1"]))
    # Served while r0 is away or coming back.
    _, r = c.infer("slow", X(7))
    assert r.status.code == pb.OK, r.status
    wait_restarted(d, c, "r0", pid)
    # Back: least loaded sends an idle replica its share again.
    seen = set()
    for _ in range(4):
        rids = [c.request("decode", X(i)) for i in range(4)]
        for r in collect(c, rids).values():
            assert r.status.code == pb.OK, r.status
            seen |= workers_of(r)["step"]
        if seen == {"r0", "r1"}:
            break
    assert seen == {"r0", "r1"}, seen
    assert d.metric("baton_worker_restarts_total", 'worker="r0"') >= 1
    wait_pool_empty(d, workers=("r0", "r1", "fixed"))


def test_ready_without_one_replica(config):
    """A replica that never registers (an external worker nobody starts):
    the daemon is ready on the other, serves from it, and inspect says
    which one is missing."""
    text = config.replace("  - {name: r0, device: cpu, pool_mb: 64}",
                          "  - {name: r0, device: cpu, pool_mb: 64, spawn: external}")
    assert text != config
    d = Daemon(text)
    c = d.client()
    try:
        for i in range(3):
            _, r = c.infer("decode", X(i))
            assert r.status.code == pb.OK, r.status
            assert workers_of(r)["step"] == {"r1"}, workers_of(r)
        assert "    r0: not ready, 0 pinned" in inspect(c, ""), inspect(c, "")
    finally:
        c.close()
        d.stop()


def chat(c, graph, conv):
    """CONV's answer on GRAPH: (text, response)."""
    chunks, r = c.infer(graph, {}, stream=True, timeout=120, messages=conv,
                        messages_input="prompt")
    assert r.status.code == pb.OK, r.status
    return b"".join(ch.value.data for ch in chunks).decode(), r


def test_prefix_cache_routed():
    """Two turns of a conversation on two replicas of the default model."""
    need_model(os.path.join(ROOT, "models/smollm2-135m-instruct-q4_1.gguf"))
    with open(os.path.join(ROOT, "tests/integration/configs/replicas-llm.yaml")) as f:
        d = Daemon(f.read().replace("models/", os.path.join(ROOT, "models/")))
    c = d.client()
    try:
        conv = [("system", "You are a helpful assistant who answers in short sentences. " * 3),
                ("user", "Name three colours of the rainbow.")]
        a1, r1 = chat(c, "chat", conv)
        w1 = workers_of(r1)["decode"]
        assert r1.usage.cached_tokens == 0, r1.usage
        conv += [("assistant", a1), ("user", "And two more?")]
        a2, r2 = chat(c, "chat", conv)
        # The replica that holds the first turn's KV took the second, which
        # read that prefix instead of computing it.
        assert workers_of(r2)["prefill"] == w1, (workers_of(r2), w1)
        assert r2.usage.cached_tokens > r1.usage.prompt_tokens // 2, (r1.usage, r2.usage)
        assert r2.usage.cached_tokens < r2.usage.prompt_tokens, r2.usage
        plain, rp = chat(c, "chat_plain", conv)
        assert a2 == plain, (a2, plain)
        assert rp.usage.cached_tokens == 0 and rp.usage.prompt_tokens == r2.usage.prompt_tokens
        print("  turn 2: %d of %d prompt tokens cached on %s" %
              (r2.usage.cached_tokens, r2.usage.prompt_tokens, sorted(w1)[0]))
        # Over HTTP, as OpenAI and vLLM report it.
        body = json.dumps({"model": "smollm2", "max_tokens": 8, "temperature": 0,
                           "messages": [{"role": k, "content": v} for k, v in conv]}).encode()
        req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % d.port,
                                     body, {"Content-Type": "application/json"})
        u = json.load(urllib.request.urlopen(req, timeout=120))["usage"]
        assert u["prompt_tokens_details"]["cached_tokens"] > 0, u
        assert d.metric("baton_prefix_cache_hits_total",
                        'worker="%s",model="llm"' % sorted(w1)[0]) >= 1
        assert d.metric("baton_route_picks_total",
                        'model="llm",worker="%s",reason="cache"' % sorted(w1)[0]) >= 1
        text = inspect(c, "")
        assert "prefix cache: on, blocks of 16 tokens" in text, text
        assert "llm: routing cache_aware, max_batch 4\n" in text, text
    finally:
        c.close()
        d.stop()


TESTS = [test_sticky_and_spread, test_replica_killed]


def main():
    with open(os.path.join(ROOT, "tests/integration/configs/replicas.yaml")) as f:
        config = f.read()
    passed = failed = skipped = 0
    d = Daemon(config)
    runs = [(t, lambda t=t: t(d, c)) for t in TESTS]
    runs.append((test_ready_without_one_replica, lambda: test_ready_without_one_replica(config)))
    runs.append((test_prefix_cache_routed, test_prefix_cache_routed))
    try:
        for t, run in runs:
            c = d.client()
            try:
                run()
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
            finally:
                c.close()
    finally:
        d.stop()
    print("replicas: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
