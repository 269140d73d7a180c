#!/usr/bin/env python3
"""Soak test (`make soak MINUTES=N`; not part of `make test`).

Runs real batond and baton-worker processes on the end-to-end deployment
(tests/integration/configs/e2e.yaml: the CPU test backends on two workers)
for N minutes under:
  - CLIENTS clients, each sending one request at a time, mixed: echo, a hop
    across workers, a fan-in, a loop joined, a loop streamed, a stream into a
    consumer, nested loops;
  - faults: every FAULT_EVERY seconds a worker is SIGKILLed (batond restarts
    it) or SIGSTOPped for a few seconds and then continued;
  - a slow reader: streamed requests whose messages it reads a little at a
    time;
  - connection churn: a client that connects, sends, and closes, some of the
    time before its answer came.

It reports, for every request a client waited for: answered (by code),
lost (no response within the request timeout plus a margin), answered
twice; per window of WINDOW seconds, batond's and the workers' RSS and the
p99 latency; and, after batond stopped, the /dev/shm segments it left.
Exits 1 when a request was lost or answered twice, or a segment was left.
"""
import argparse
import collections
import os
import random
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests/integration"))
import test_e2e as E  # noqa: E402

pb = E.pb
REQUEST_TIMEOUT_MS = 20000   # daemon.request_timeout_ms in e2e.yaml
LOST_AFTER = REQUEST_TIMEOUT_MS / 1000.0 + 10.0

MIX = [
    ("echo", lambda: {"x": (E.I32, [2, 3], E.i32(1, 2, 3, 4, 5, 6))}, {}),
    ("hop", lambda: E.X(7, 8, 9), {}),
    ("fanin", lambda: E.X(1, 2, 3), {}),
    ("count", lambda: E.X(0), {}),
    ("count", lambda: E.X(0), {"stream": True}),
    ("stream", lambda: E.X(5), {"stream": True}),
    ("nested", lambda: E.X(0), {}),
]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.codes = collections.Counter()
        self.lost = []
        self.twice = []
        self.latencies = []   # (end time, seconds) of answered requests
        self.sent = 0

    def answered(self, code, t0):
        with self.lock:
            self.codes[pb.Code.Name(code)] += 1
            self.latencies.append((time.time(), time.time() - t0))


def wait_answer(c, rid, answered, stats, timeout):
    """Reads C until RID's response; counts any response seen twice."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = c.recv(max(0.01, min(1.0, deadline - time.time())))
        if m is None:
            continue
        if m.HasField("response"):
            r = m.response
            if r.request_id in answered:
                with stats.lock:
                    stats.twice.append(r.request_id)
            answered.add(r.request_id)
            if r.request_id == rid:
                return r
    return None


def client_loop(d, stats, stop, seed, slow=False):
    rnd = random.Random(seed)
    c = d.client()
    answered = set()
    n = 0
    try:
        while not stop.is_set():
            graph, inputs, kw = rnd.choice(MIX[4:6] if slow else MIX)
            n += 1
            rid = "soak-%d-%d" % (seed, n)
            t0 = time.time()
            c.request(graph, inputs(), rid=rid, **kw)
            with stats.lock:
                stats.sent += 1
            if slow:
                time.sleep(rnd.uniform(0.5, 2.0))  # the reader is late
            r = wait_answer(c, rid, answered, stats, LOST_AFTER)
            if r is None:
                with stats.lock:
                    stats.lost.append(rid)
            else:
                stats.answered(r.status.code, t0)
    finally:
        c.close()


def churn_loop(d, stats, stop, seed):
    """New connection per request; a third of them close before the answer."""
    rnd = random.Random(seed)
    n = 0
    while not stop.is_set():
        c = d.client()
        n += 1
        rid = "churn-%d-%d" % (seed, n)
        graph, inputs, kw = rnd.choice(MIX)
        t0 = time.time()
        c.request(graph, inputs(), rid=rid, **kw)
        if rnd.random() < 0.33:
            c.close()
            time.sleep(0.05)
            continue
        with stats.lock:
            stats.sent += 1
        r = wait_answer(c, rid, set(), stats, LOST_AFTER)
        if r is None:
            with stats.lock:
                stats.lost.append(rid)
        else:
            stats.answered(r.status.code, t0)
        c.close()


def fault_loop(d, stop, every, log):
    rnd = random.Random(7)
    k = 0
    while not stop.wait(every):
        k += 1
        name = rnd.choice(["cpu0", "cpu1"])
        pid = d.worker_pid(name)
        if pid is None:
            log.append((time.time(), "no pid for %s (restarting)" % name))
            continue
        if k % 2:
            os.kill(pid, signal.SIGKILL)
            log.append((time.time(), "SIGKILL %s (pid %d)" % (name, pid)))
        else:
            os.kill(pid, signal.SIGSTOP)
            log.append((time.time(), "SIGSTOP %s (pid %d) for 3 s" % (name, pid)))
            time.sleep(3)
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def p99(xs):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def shm_segments(prefix):
    try:
        return sorted(f for f in os.listdir("/dev/shm") if f.startswith(prefix))
    except OSError:
        return []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=float(os.environ.get("MINUTES", "10")))
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--fault-every", type=float, default=20.0)
    a = ap.parse_args()
    with open(os.path.join(ROOT, "tests/integration/configs/e2e.yaml")) as f:
        config = f.read()
    d = E.Daemon(config)
    shm_prefix = "baton-%d-" % d.proc.pid
    stats = Stats()
    stop = threading.Event()
    faults = []
    threads = [threading.Thread(target=client_loop, args=(d, stats, stop, 1000 + i))
               for i in range(a.clients)]
    threads.append(threading.Thread(target=client_loop, args=(d, stats, stop, 1), kwargs={"slow": True}))
    threads += [threading.Thread(target=churn_loop, args=(d, stats, stop, 2 + i)) for i in range(2)]
    threads.append(threading.Thread(target=fault_loop, args=(d, stop, a.fault_every, faults)))
    for t in threads:
        t.daemon = True
        t.start()
    rows = []
    t_start = time.time()
    end = t_start + a.minutes * 60
    last = t_start
    try:
        while time.time() < end:
            time.sleep(min(a.window, max(0.1, end - time.time())))
            now = time.time()
            with stats.lock:
                lat = [s for (t, s) in stats.latencies if last <= t < now]
                n_lost, n_twice = len(stats.lost), len(stats.twice)
            workers = [d.worker_pid(n) for n in ("cpu0", "cpu1")]
            rows.append((now - t_start, len(lat), p99(lat), rss_kib(d.proc.pid),
                         sum(rss_kib(p) for p in workers if p), n_lost, n_twice))
            print("t=%5.0fs answered %5d  p99 %6.3fs  rss batond %6d KiB  workers %6d KiB  "
                  "lost %d  twice %d" % rows[-1], flush=True)
            last = now
            if d.proc.poll() is not None:
                print("batond exited: %s" % d.tail(), flush=True)
                break
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=LOST_AFTER + 5)
        d.stop()
    time.sleep(1)
    left = shm_segments(shm_prefix)
    print()
    print("| time (s) | answered in window | p99 latency (s) | batond RSS (KiB) | workers RSS (KiB) | lost so far | answered twice so far |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print("| %.0f | %d | %.3f | %d | %d | %d | %d |" % r)
    print()
    print("requests waited for: %d; answers by code: %s" % (stats.sent, dict(stats.codes)))
    print("lost: %d %s" % (len(stats.lost), stats.lost[:10]))
    print("answered twice: %d %s" % (len(stats.twice), stats.twice[:10]))
    print("faults: %d (%s)" % (len(faults), ", ".join(sorted(set(f[1].split(" (")[0] for f in faults)))))
    print("/dev/shm segments left by batond %d: %d %s" % (d.proc.pid, len(left), left))
    bad = stats.lost or stats.twice or left
    if bad:
        E.evidence.failed("soak")  # the daemon's folder and batond.log stay
    print("soak: %s" % ("FAIL" if bad else "ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
