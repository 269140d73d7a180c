#!/usr/bin/env python3
"""Soak test (`make soak MINUTES=N`; not part of `make test`).

Runs real batond and baton-worker processes on the end-to-end deployment
(tests/integration/configs/e2e.yaml: the CPU test backends on two workers)
for N minutes under:
  - CLIENTS clients, each sending one request at a time, mixed: echo, a hop
    across workers, a fan-in, a loop joined, a loop streamed, a stream into a
    consumer, nested loops;
  - faults spread evenly over the run: KILLS workers SIGKILLed (batond
    restarts them), STOPS SIGSTOPped for 3 s and continued, and LINK_CUTS
    cuts of the link to an external worker: ext0 runs in a network namespace
    of its own, joined to the host by a veth pair on whose host side
    batond's worker socket listens, and a cut takes the namespace's side of
    the link down for CUT_SECONDS (longer than an external worker may be
    silent), then up again; the worker, told to restart or finding its
    connection gone, is restarted by this script as its service manager
    would (needs root and `ip netns`; without, the cut says SKIP and ext0
    is left out);
  - a slow reader: streamed requests whose messages it reads a little at a
    time;
  - connection churn: a client that connects, sends, and closes, some of the
    time before its answer came.

It reports, for every request a client waited for: answered exactly once
(by code), lost (no response within the request timeout plus a margin),
answered twice; per window of WINDOW seconds, batond's and the workers' RSS
and the p50 and p99 latency, and both over the whole run; and, after batond
stopped, the /dev/shm segments of the run left behind.  Exits 1 when a
request was lost or answered twice, or a segment was left.  --json writes
the figures to a file.
"""
import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
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
# With the external worker: its echo, and a hop from cpu0 to it.
MIX_EXT = [
    ("echo_ext", lambda: E.X(4, 5, 6), {}),
    ("hop_ext", lambda: E.X(7, 8), {}),
]
CUT_SECONDS = 8.0            # an external worker is lost after 3 s of silence

EXT_CONFIG = {
    "workers:\n": "workers:\n  - {name: ext0, device: cpu, pool_mb: 64, spawn: external}\n",
    "models:\n": "models:\n  - {name: echo_ext, backend: echo, worker: ext0, max_batch: 8}\n",
    "graphs:\n": """graphs:
  - name: echo_ext
    inputs: [x]
    body:
      node: {name: e, model: echo_ext, inputs: [x], outputs: [{name: x, to: client}]}
  - name: hop_ext
    inputs: [x]
    body:
      sequential:
        - node: {name: a, model: echo0, inputs: [x], outputs: [{name: x, to: b}]}
        - node: {name: b, model: echo_ext, inputs: [x], outputs: [{name: x, to: client}]}
""",
}


class LinkedWorker:
    """ext0: a baton-worker in a network namespace of its own, joined to the
    host by a veth pair (10.213.N.1 on the host, .2 inside).  batond's worker
    socket listens on the host side, so every worker connects over tcp, and
    only ext0's connection crosses the link.  A thread restarts ext0 when it
    exits, as systemd's Restart=always would."""

    def __init__(self):
        tag = os.getpid() % 100000
        self.ns = "baton-soak-%d" % tag
        self.host_if, self.ns_if = "bsk%dh" % tag, "bsk%dn" % tag
        net = 1 + tag % 250
        self.host_ip, self.ns_ip = "10.213.%d.1" % net, "10.213.%d.2" % net
        self.run_id = "soakext-%d" % tag
        self.proc = None
        self.starts = 0
        self.made = False

    @staticmethod
    def why_not():
        """None when a namespace can be made here, else why not."""
        if os.geteuid() != 0:
            return "not root"
        if not shutil.which("ip"):
            return "no `ip` command"
        return None

    def ip(self, *args, ns=False):
        cmd = (["ip", "netns", "exec", self.ns, "ip"] if ns else ["ip"]) + list(args)
        subprocess.run(cmd, check=True, capture_output=True)

    def setup(self):
        self.ip("netns", "add", self.ns)
        self.made = True
        self.ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        self.ip("link", "set", self.ns_if, "netns", self.ns)
        self.ip("addr", "add", self.host_ip + "/30", "dev", self.host_if)
        self.ip("link", "set", self.host_if, "up")
        self.ip("addr", "add", self.ns_ip + "/30", "dev", self.ns_if, ns=True)
        self.ip("link", "set", self.ns_if, "up", ns=True)
        self.ip("link", "set", "lo", "up", ns=True)

    def run(self, config, log_path, stop):
        """Keeps ext0 running until STOP is set."""
        with open(log_path, "a") as log:
            while not stop.is_set():
                self.starts += 1
                self.proc = subprocess.Popen(
                    ["ip", "netns", "exec", self.ns, os.path.join(E.BUILD, "baton-worker"),
                     "--config", config, "--name", "ext0", "--run-id", self.run_id],
                    stdout=log, stderr=subprocess.STDOUT)
                while self.proc.poll() is None and not stop.wait(0.2):
                    pass
                if self.proc.poll() is None:
                    self.proc.terminate()
                    try:
                        self.proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        self.proc.kill()
                        self.proc.wait()
                stop.wait(0.5)

    def cut(self, seconds):
        """Takes the namespace's side of the link down for SECONDS: ext0 can
        neither send nor hear, while the host side keeps its address."""
        self.ip("link", "set", self.ns_if, "down", ns=True)
        time.sleep(seconds)
        self.ip("link", "set", self.ns_if, "up", ns=True)

    def pid(self):
        p = self.proc
        return p.pid if p and p.poll() is None else None

    def teardown(self):
        if not self.made:
            return
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


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


def client_loop(d, stats, stop, seed, mix, slow=False):
    rnd = random.Random(seed)
    c = d.client()
    answered = set()
    n = 0
    try:
        while not stop.is_set():
            graph, inputs, kw = rnd.choice(MIX[4:6] if slow else mix)
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


def churn_loop(d, stats, stop, seed, mix):
    """New connection per request; a third of them close before the answer."""
    rnd = random.Random(seed)
    n = 0
    while not stop.is_set():
        c = d.client()
        n += 1
        rid = "churn-%d-%d" % (seed, n)
        graph, inputs, kw = rnd.choice(mix)
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


def fault_plan(kills, stops, cuts, seconds):
    """(time from the start, fault) for each fault, spread evenly: kills and
    stops alternate, the link cuts go in the middle."""
    seq = []
    for i in range(max(kills, stops)):
        seq += (["kill"] if i < kills else []) + (["stop"] if i < stops else [])
    mid = len(seq) // 2
    seq = seq[:mid] + ["cut"] * cuts + seq[mid:]
    step = seconds / (len(seq) + 1)
    return [((i + 1) * step, f) for i, f in enumerate(seq)]


def fault_loop(d, stop, plan, t0, link, log):
    rnd = random.Random(7)
    for at, fault in plan:
        if stop.wait(max(0.0, t0 + at - time.time())):
            return
        if fault == "cut":
            if link is None:
                log.append((time.time(), "SKIP link cut (no network namespace)"))
                continue
            log.append((time.time(), "link cut to ext0 for %.0f s" % CUT_SECONDS))
            link.cut(CUT_SECONDS)
            continue
        name = rnd.choice(["cpu0", "cpu1"])
        pid = None
        for _ in range(50):  # a worker just restarted may not be up yet
            pid = d.worker_pid(name)
            if pid is not None or stop.wait(0.1):
                break
        if pid is None:
            log.append((time.time(), "no pid for %s: %s skipped" % (name, fault)))
            continue
        if fault == "kill":
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


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def shm_segments(prefix):
    try:
        return sorted(f for f in os.listdir("/dev/shm") if f.startswith(prefix))
    except OSError:
        return []


def make_config(link):
    with open(os.path.join(ROOT, "tests/integration/configs/e2e.yaml")) as f:
        config = f.read()
    if link is None:
        return config
    # Every worker connects over tcp to the host side of the link; no keys
    # on a link that exists only for the test.
    port = E.free_port()
    lines = [l for l in config.splitlines(True) if not l.startswith("  workers_endpoint:")]
    config = "".join(lines).replace(
        "daemon:\n", "daemon:\n  workers_endpoint: tcp://%s:%d\n  insecure: true\n"
        % (link.host_ip, port), 1)
    for anchor, text in EXT_CONFIG.items():
        assert anchor in config, anchor
        config = config.replace(anchor, text, 1)
    return config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=float(os.environ.get("MINUTES", "30")))
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--kills", type=int, default=5, help="workers SIGKILLed over the run")
    ap.add_argument("--stops", type=int, default=0, help="workers SIGSTOPped for 3 s")
    ap.add_argument("--link-cuts", type=int, default=1, help="cuts of ext0's link")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    link = None
    why = LinkedWorker.why_not() if a.link_cuts else "no link cut asked"
    if why is None:
        link = LinkedWorker()
        try:
            link.setup()
        except subprocess.CalledProcessError as e:
            why = "cannot make a network namespace: %s" % (e.stderr or b"").decode().strip()
            link.teardown()
            link = None
    if link is None and a.link_cuts:
        print("SKIP: the link cut (%s): ext0 is left out" % why, flush=True)
    d = E.Daemon(make_config(link), wait=False)
    shm_prefixes = ["baton-%d-" % d.proc.pid] + (["baton-%s-" % link.run_id] if link else [])
    stats = Stats()
    stop = threading.Event()
    stop_ext = threading.Event()
    ext_thread = None
    try:
        if link:
            ext_thread = threading.Thread(target=link.run, args=(
                d.config, os.path.join(d.dir, "ext0.log"), stop_ext))
            ext_thread.daemon = True
            ext_thread.start()
        d.wait_ready(timeout=60.0)
    except BaseException:
        stop_ext.set()
        d.stop()
        if link:
            link.teardown()
        raise
    mix = MIX + (MIX_EXT if link else [])
    faults = []
    t_start = time.time()
    plan = fault_plan(a.kills, a.stops, a.link_cuts, a.minutes * 60)
    threads = [threading.Thread(target=client_loop, args=(d, stats, stop, 1000 + i, mix))
               for i in range(a.clients)]
    threads.append(threading.Thread(target=client_loop, args=(d, stats, stop, 1, mix),
                                    kwargs={"slow": True}))
    threads += [threading.Thread(target=churn_loop, args=(d, stats, stop, 2 + i, mix))
                for i in range(2)]
    threads.append(threading.Thread(target=fault_loop, args=(d, stop, plan, t_start, link,
                                                             faults)))
    for t in threads:
        t.daemon = True
        t.start()
    rows = []
    end = t_start + a.minutes * 60
    last = t_start
    try:
        while time.time() < end:
            time.sleep(min(a.window, max(0.1, end - time.time())))
            now = time.time()
            with stats.lock:
                lat = [s for (t, s) in stats.latencies if last <= t < now]
                n_lost, n_twice = len(stats.lost), len(stats.twice)
            workers = [d.worker_pid(n) for n in ("cpu0", "cpu1")] + ([link.pid()] if link else [])
            rows.append((now - t_start, len(lat), pct(lat, 0.5), pct(lat, 0.99),
                         rss_kib(d.proc.pid), sum(rss_kib(p) for p in workers if p), n_lost,
                         n_twice))
            print("t=%5.0fs answered %6d  p50 %6.3fs  p99 %6.3fs  rss batond %6d KiB  "
                  "workers %6d KiB  lost %d  twice %d" % rows[-1], flush=True)
            last = now
            if d.proc.poll() is not None:
                print("batond exited: %s" % d.tail(), flush=True)
                break
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=LOST_AFTER + 5)
        stop_ext.set()
        if ext_thread:
            ext_thread.join(timeout=15)
        d.stop()
        if link:
            link.teardown()
    time.sleep(1)
    left = [f for p in shm_prefixes for f in shm_segments(p)]
    all_lat = [x for (_, x) in stats.latencies]
    print()
    print("| time (s) | answered in window | p50 (s) | p99 (s) | batond RSS (KiB) | workers RSS (KiB) | lost so far | answered twice so far |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print("| %.0f | %d | %.3f | %.3f | %d | %d | %d | %d |" % r)
    print()
    once = sum(stats.codes.values())
    print("requests waited for: %d; answered exactly once: %d, by code: %s"
          % (stats.sent, once, dict(stats.codes)))
    print("lost: %d %s" % (len(stats.lost), stats.lost[:10]))
    print("answered twice: %d %s" % (len(stats.twice), stats.twice[:10]))
    print("latency over the run: p50 %.3f s, p99 %.3f s" % (pct(all_lat, 0.5), pct(all_lat, 0.99)))
    if rows:
        print("RSS: batond %d -> %d KiB, workers %d -> %d KiB (first and last window)"
              % (rows[0][4], rows[-1][4], rows[0][5], rows[-1][5]))
    for t, f in faults:
        print("fault at %5.0f s: %s" % (t - t_start, f))
    if link:
        print("ext0 started %d times (the first, then after each restart)" % link.starts)
    print("/dev/shm segments left by the run: %d %s" % (len(left), left))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"minutes": a.minutes, "sent": stats.sent, "answered_once": once,
                       "codes": dict(stats.codes), "lost": len(stats.lost),
                       "twice": len(stats.twice), "p50_s": pct(all_lat, 0.5),
                       "p99_s": pct(all_lat, 0.99),
                       "rss_batond_kib": [rows[0][4], rows[-1][4]] if rows else None,
                       "rss_workers_kib": [rows[0][5], rows[-1][5]] if rows else None,
                       "faults": [[round(t - t_start, 1), f] for t, f in faults],
                       "ext_starts": link.starts if link else None,
                       "shm_left": left, "windows": rows}, f, indent=1)
    bad = stats.lost or stats.twice or left or not rows or d.proc.returncode not in (0, None)
    if bad:
        E.evidence.failed("soak")  # the daemon's folder and batond.log stay
    print("soak: %s" % ("FAIL" if bad else "ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
