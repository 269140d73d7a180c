#!/usr/bin/python3
"""GPU workers end to end, on the CUDA emulator.

Real batond and baton-worker processes of the emulated build (build/emu:
the worker's CUDA calls go to cudaemu, which runs them on the CPU), real
sockets, a real client.  Run by tests/cudaemu/run.sh: the chat graph's
tests by `make slow-test`, the others by `make test`.

What it shows:
  - two cuda:0 workers hand a 4 KiB and a 64 MiB tensor by CUDA IPC: the
    consumer reads the producer's pool in place (its staged-bytes counter
    stays 0 and its pool holds only its own output);
  - an edge between two GPUs, and edges between a CPU and a GPU worker, are
    staged by exactly one copy of the value;
  - loops and streams whose tensors live in device memory;
  - Whisper's transcribe graph on a cuda:0 worker gives the CPU worker's
    f32 tokens (timestamps included) and text for the JFK clip;
  - the chat graph on a cuda:0 worker gives the CPU worker's greedy ids,
    alone and batched, ids and text; so does it split over two GPU workers
    (prefill on one, decode on the other) and tensor parallel over two;
  - a tp: 2 model's group: rank 0 makes its id and rank 1 loads with it,
    rank 1 runs every step rank 0 runs, and when one rank dies both are
    restarted; a rank whose load fails stops the rank waiting for it in the
    group's forming, and the group waits for that worker to register
    again; a rank waiting for a group that never forms leaves the wait when
    batond stops, and exits by itself;
  - a Hugging Face folder of f16 weights on a GPU worker and tensor parallel
    over two gives the CPU worker's greedy ids (the GPU widens the weights);
  - GPU workers registered under different host names (`host:` in the deployment)
    hand tensors over NCCL, on a communicator per pair that the conductor
    relays: the same results as on one host, a 16 MiB tensor intact, pools
    empty afterwards, and a killed producer fails only its request;
  - SIGKILL of a GPU worker under load: its requests end UNAVAILABLE, it
    comes back, and the surviving worker closed its IPC mapping of the dead
    one's memory;
  - no worker opens a peer's CUDA pool on a request's path: those of its
    own GPU, of another GPU, and a CPU worker's reads of GPU pools are all
    opened when the peer comes up (baton_worker_ipc_opens_total);
  - batond --check-config refuses cuda:N when the worker binary cannot
    serve it, at the worker's line;
  - a kernel fault that leaves the CUDA context unusable ends the worker,
    which is restarted.

Timings printed by the emulator mean nothing and none is asserted.  A
failed test's daemon folder (its batond.log, the workers' output) is kept
and named (tests/integration/evidence.py).  The closing line is "gpu
worker: N passed, N failed".
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
os.environ.setdefault("BUILD", "build/emu")
sys.path.insert(0, os.path.join(ROOT, "tests/integration"))
import evidence  # noqa: E402
import test_e2e as E  # noqa: E402  (the daemon and client helpers)

pb = E.pb
MODEL = os.path.join(ROOT, "models/smollm2-135m-instruct-q4_1.gguf")


def problems(d):
    """What the emulator reported in the daemon's log (the workers' stderr
    goes there): a race, a fault, a barrier not reached."""
    with open(os.path.join(d.dir, "batond.log")) as f:
        return [line for line in f if "cudaemu: problem" in line]


def staged(d, worker):
    return d.metric("baton_worker_staged_bytes_total", 'worker="%s"' % worker)


def settled(d, worker, value=None, timeout=5.0):
    """The worker's staged-bytes counter once a heartbeat (every second)
    has reported it unchanged twice, or has reached VALUE."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        v = staged(d, worker)
        if value is not None and v == value:
            return v
        if value is None and v is not None and v == last:
            return v
        last = v
        time.sleep(1.1)
    return staged(d, worker)


def pattern(n_bytes):
    """An I32 vector of N_BYTES whose every element differs from its
    neighbours, so that a misplaced or stale byte shows."""
    n = n_bytes // 4
    return struct.pack("<%di" % n, *((i * 2654435761) & 0x7fffffff for i in range(n)))


def own_inode(pid):
    """The inode of process PID's own emulated device memory: the one memfd
    it keeps open (IPC mappings of peers' memory keep no descriptor)."""
    fds = "/proc/%d/fd" % pid
    for fd in os.listdir(fds):
        try:
            if os.readlink(os.path.join(fds, fd)).startswith("/memfd:cudaemu-device"):
                return str(os.stat(os.path.join(fds, fd)).st_ino)
        except OSError:
            pass
    raise AssertionError("process %d has no emulated device memory" % pid)


def memfd_inodes(pid):
    """Inodes of the emulated device memory mapped by process PID."""
    out = set()
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            if "memfd:cudaemu-device" in line:
                out.add(line.split()[4])
    return out


def ipc_opens(d, worker, when):
    """baton_worker_ipc_opens_total of WORKER: peers' CUDA pools it opened
    ahead (when a Peers message came) or on a request's path."""
    return d.metric("baton_worker_ipc_opens_total", 'worker="%s",when="%s"' % (worker, when))


def wait_pools_empty(d, workers, timeout=5.0):
    deadline = time.time() + timeout
    used = None
    while time.time() < deadline:
        used = [d.metric("baton_pool_bytes_used", 'worker="%s"' % w) for w in workers]
        if all(u == 0.0 for u in used):
            return
        time.sleep(0.2)
    raise AssertionError("pool bytes still in use: %s" % used)


# ---- tests on the GPU deployment ------------------------------------------------

def test_ipc_in_place(d, c):
    before = staged(d, "gpu1")
    assert before == 0, before
    for size in (4096, 64 << 20):
        data = pattern(size)
        _, r = c.infer("ipc", {"x": (pb.I32, [size // 4], data)}, timeout=120)
        assert r.status.code == pb.OK, r.status
        out = r.outputs[0]
        assert out.name == "y" and list(out.dims) == [size // 4], out
        assert out.data == data, "%d bytes: the consumer read other bytes" % size
    # gpu1's backend read gpu0's memory where it lies: the worker copied
    # nothing to assemble the input.
    assert settled(d, "gpu1") == 0, staged(d, "gpu1")
    # And it opened gpu0's pool when gpu0 came up, never on a request's
    # path (the heartbeat that settled the counter above carried these).
    assert ipc_opens(d, "gpu1", "request") == 0, d.metrics()
    assert ipc_opens(d, "gpu1", "ahead") >= 1, d.metrics()
    # Every tensor of the requests was released on both sides.
    wait_pools_empty(d, ("gpu0", "gpu1"))


def test_across_gpus(d, c):
    before = settled(d, "gpu2")
    data = pattern(4096)
    _, r = c.infer("xgpu", {"x": (pb.I32, [1024], data)}, timeout=60)
    assert r.status.code == pb.OK, r.status
    assert r.outputs[0].data == data
    # cuda:0 -> cuda:1 is one device-to-device copy of the value.
    assert settled(d, "gpu2", before + 4096) == before + 4096, staged(d, "gpu2")
    # gpu2 opened gpu0's pool, on another GPU, when gpu0 came up: the
    # graphs name gpu0 among the peers whose tensors come to gpu2.  It has
    # no reason to open gpu1's (nothing of gpu1 reaches it).
    assert ipc_opens(d, "gpu2", "request") == 0, d.metrics()
    assert ipc_opens(d, "gpu2", "ahead") == 1, d.metrics()


def test_mixed_cpu_gpu(d, c):
    g0, c0 = settled(d, "gpu0"), settled(d, "cpu0")
    vals = list(range(-500, 524))
    _, r = c.infer("mixed", {"x": (pb.I32, [1024], struct.pack("<1024i", *vals))}, timeout=60)
    assert r.status.code == pb.OK, r.status
    assert E.as_i32(r.outputs[0]) == [2 * v for v in vals]
    # gpu0 copied x twice from cpu0's shm pool (the graph input its node
    # `dev` reads, and host.x); cpu0 copied y once out of gpu0's pool.
    assert settled(d, "gpu0", g0 + 8192) == g0 + 8192, staged(d, "gpu0")
    assert settled(d, "cpu0", c0 + 4096) == c0 + 4096, staged(d, "cpu0")
    # cpu0 opened gpu0's pool ahead too (and gpu1's: gpu1's chunks pass
    # into cpu0 in the stream graph), not on this request.
    assert ipc_opens(d, "cpu0", "request") == 0, d.metrics()
    assert ipc_opens(d, "cpu0", "ahead") == 2, d.metrics()


def test_loop_and_streams(d, c):
    chunks, r = c.infer("count", E.X(7), stream=True, timeout=60)
    assert r.status.code == pb.OK, r.status
    assert [E.as_i32(ch.value) for ch in chunks] == [[0], [1], [2], [3]]
    chunks, r = c.infer("stream", E.X(7), stream=True, timeout=60)
    assert r.status.code == pb.OK, r.status
    assert [v for ch in chunks for v in E.as_i32(ch.value)] == [0, 1, 2]


def test_loop_reads_staged_once(d, c):
    g0 = settled(d, "gpu0")
    vals = list(range(1024))
    chunks, r = c.infer("persist", {"x": (pb.I32, [1024], struct.pack("<1024i", *vals))},
                        stream=True, timeout=60)
    assert r.status.code == pb.OK, r.status
    assert [E.as_i32(ch.value) for ch in chunks] == [[0], [1], [2], [3]]
    # Four iterations read x from cpu0's pool, and the first one s too; both
    # are the one tensor cpu0's echo forwarded by reference.  One copy
    # serves them all (a copy per read would be five).
    assert settled(d, "gpu0", g0 + 4096) == g0 + 4096, staged(d, "gpu0") - g0


def test_gpu_worker_killed(d, c):
    pid0, pid1 = d.worker_pid("gpu0"), d.worker_pid("gpu1")
    assert pid0 and pid1
    dead = {own_inode(pid0)}
    # gpu1 opened gpu0's pool when it learnt of its peers.
    assert dead <= memfd_inodes(pid1), (dead, memfd_inodes(pid1))
    rids = [c.request("slow", E.X(i)) for i in range(6)]
    time.sleep(0.2)
    os.kill(pid0, signal.SIGKILL)
    E.wait_all_unavailable(c, rids, 20)
    new = E.wait_restarted(d, c, "gpu0", pid0, timeout=30)
    # The survivor closed its mapping of the dead worker's memory, and
    # opened the new incarnation's.
    deadline = time.time() + 10
    while time.time() < deadline and dead & memfd_inodes(pid1):
        time.sleep(0.1)
    assert not dead & memfd_inodes(pid1), "gpu1 still maps the dead worker's memory"
    _, r = c.infer("ipc", E.X(5, 6), timeout=60)
    assert r.status.code == pb.OK and E.as_i32(r.outputs[0]) == [5, 6], r
    assert own_inode(new) in memfd_inodes(pid1)
    assert d.metric("baton_worker_restarts_total", 'worker="gpu0"') >= 1


def heard_again(d, workers, timeout=10.0):
    """Waits until each of WORKERS sent two more messages: with no request
    running, heartbeats (one a second), so the counters they carry are
    those of everything done before the call."""
    label = 'worker="%s",direction="from_worker"'
    start = {w: d.metric("baton_worker_messages_total", label % w) for w in workers}
    deadline = time.time() + timeout
    while time.time() < deadline:
        now = {w: d.metric("baton_worker_messages_total", label % w) for w in workers}
        if all(now[w] >= start[w] + 2 for w in workers):
            return
        time.sleep(0.2)
    raise AssertionError("no heartbeat from %s in %.0f s" % (workers, timeout))


def test_no_ipc_open_on_requests(d, c):
    """Every graph once more, after a worker came back as a new incarnation:
    no worker opened a peer's CUDA pool on a request's path, whether the
    pool was on its GPU, on another GPU, or read by a CPU worker."""
    data = pattern(4096)
    for graph in ("ipc", "xgpu", "mixed"):
        _, r = c.infer(graph, {"x": (pb.I32, [1024], data)}, timeout=60)
        assert r.status.code == pb.OK, (graph, r.status)
    for graph in ("count", "stream", "persist"):
        _, r = c.infer(graph, E.X(7), stream=True, timeout=60)
        assert r.status.code == pb.OK, (graph, r.status)
    workers = ("gpu0", "gpu1", "gpu2", "cpu0")
    heard_again(d, workers)
    on_request = {w: ipc_opens(d, w, "request") for w in workers}
    assert on_request == dict.fromkeys(workers, 0), on_request
    # What was opened ahead: gpu1 and gpu2 gpu0's pool, cpu0 gpu0's and
    # gpu1's; gpu0's three again after its restart (test_gpu_worker_killed),
    # when that ran before.
    ahead = sum(ipc_opens(d, w, "ahead") for w in workers)
    assert ahead >= 4, d.metrics()


GPU_TESTS = [test_ipc_in_place, test_across_gpus, test_mixed_cpu_gpu, test_loop_and_streams,
             test_loop_reads_staged_once, test_gpu_worker_killed, test_no_ipc_open_on_requests]


# ---- tests with a daemon of their own -------------------------------------------

def test_check_config():
    cfg = os.path.join(HERE, "configs/gpu.yaml")
    batond = os.path.join(E.BUILD, "batond")
    r = subprocess.run([batond, "--check-config", cfg, "--quiet"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    with tempfile.TemporaryDirectory() as tmp:
        fake = os.path.join(tmp, "cpu-only-worker")
        with open(fake, "w") as f:
            f.write("#!/bin/sh\necho cpu\n")
        os.chmod(fake, 0o755)
        env = dict(os.environ, BATON_WORKER=fake)
        r = subprocess.run([batond, "--check-config", cfg, "--quiet"], capture_output=True,
                           text=True, env=env)
        assert r.returncode == 1, r
        assert "gpu.yaml:16:5: error: worker gpu0: device cuda:0 needs a baton-worker built " \
               "with CUDA" in r.stderr, r.stderr
        assert "worker cpu0" not in r.stderr, r.stderr
        # Serving refuses it too, before any worker starts.
        r = subprocess.run([batond, "--config", cfg], capture_output=True, text=True, env=env,
                           timeout=30)
        assert r.returncode == 1 and "needs a baton-worker built with CUDA" in r.stderr, r


def daemon_yaml(timeout_ms):
    """The daemon: section of a deployment (E.Daemon rewrites the
    endpoints and the metrics port)."""
    return """
version: 1
daemon:
  listen: ipc:///tmp/baton-e2e/baton.sock
  workers_endpoint: ipc:///tmp/baton-e2e/workers.sock
  metrics_listen: 127.0.0.1:19464
  request_timeout_ms: %d
  log_level: warning
""" % timeout_ms


FAULT_CONFIG = daemon_yaml(30000) + """workers:
  - {name: gpu0, device: 'cuda:0', pool_mb: 16}
models:
  - {name: echo_g0, backend: echo, worker: gpu0}
  - {name: broken, backend: fail, worker: gpu0, options: {device_fault: true}}
graphs:
  - name: echo
    inputs: [x]
    body:
      node: {name: e, model: echo_g0, inputs: [x], outputs: [{name: x, to: client}]}
  - name: fault
    inputs: [x]
    body:
      node: {name: f, model: broken, inputs: [x], outputs: [{name: x, to: client}]}
"""


def test_device_lost():
    """A kernel that faults leaves the CUDA context unusable: the worker
    exits, its request ends UNAVAILABLE, and it is restarted and serves."""
    d = E.Daemon(FAULT_CONFIG)
    c = d.client()
    try:
        pid = d.worker_pid("gpu0")
        _, r = c.infer("echo", E.X(3), timeout=30)
        assert r.status.code == pb.OK, r.status
        _, r = c.infer("fault", E.X(1), timeout=30)
        assert r.status.code == pb.UNAVAILABLE, r.status
        E.wait_restarted(d, c, "gpu0", pid, timeout=30)
        _, r = c.infer("echo", E.X(4, 5), timeout=30)
        assert r.status.code == pb.OK and E.as_i32(r.outputs[0]) == [4, 5], r
        assert d.metric("baton_worker_restarts_total", 'worker="gpu0"') >= 1
        log = d.tail()
        assert "context is unusable" in log and "exiting so that the worker is restarted" in \
            log, log
        # The one problem the emulator saw is the planted launch.
        found = problems(d)
        assert found and all("pointer argument" in line for line in found), found
    finally:
        c.close()
        d.stop()


TP_CONFIG = daemon_yaml(30000) + """workers:
  - {name: gpu0, device: 'cuda:0', pool_mb: 16}
  - {name: gpu1, device: 'cuda:1', pool_mb: 16}
models:
  - {name: echo_tp, backend: echo, workers: [gpu0, gpu1], tp: 2, max_batch: 8}
  - {name: slow_tp, backend: sleep, workers: [gpu0, gpu1], tp: 2, max_batch: 8,
     options: {ms: 300}}
graphs:
  - name: echo
    inputs: [x]
    body:
      node: {name: e, model: echo_tp, inputs: [x], outputs: [{name: x, to: client}]}
  - name: slow
    inputs: [x]
    body:
      node: {name: s, model: slow_tp, inputs: [x], outputs: [{name: x, to: client}]}
"""


def wait_metric(d, name, labels, pred, timeout=10.0):
    """The value of metric NAME{LABELS} once PRED holds for it (heartbeats
    carry the workers' counters, once a second)."""
    deadline = time.time() + timeout
    v = None
    while time.time() < deadline:
        v = d.metric(name, labels)
        if v is not None and pred(v):
            return v
        time.sleep(0.2)
    raise AssertionError("%s{%s} = %s" % (name, labels, v))


def test_tp_group():
    """A model with tp: 2 over two GPU workers: rank 0 makes the group's id
    and the conductor hands it to rank 1's Load; rank 0 alone answers, and
    rank 1 runs each of its steps.  When one rank dies the group restarts
    whole: the other rank is taken down too, its requests end UNAVAILABLE,
    and both come back and serve."""
    d = E.Daemon(TP_CONFIG)
    c = d.client()
    try:
        _, r = c.infer("echo", E.X(1, 2, 3), timeout=30)
        assert r.status.code == pb.OK and E.as_i32(r.outputs[0]) == [1, 2, 3], r
        wait_metric(d, "baton_worker_tp_steps_total", 'worker="gpu1"', lambda v: v >= 1)
        rids = {c.request("echo", E.X(i)): i for i in range(20)}
        for _ in rids:
            m = c.recv(30)
            while m is not None and not m.HasField("response"):
                m = c.recv(30)
            assert m is not None, "a request of the group got no answer"
            assert m.response.status.code == pb.OK, m.response.status
            assert E.as_i32(m.response.outputs[0]) == [rids[m.response.request_id]]
        # Batches of up to 8 on the leader: as many steps on the follower.
        steps = wait_metric(d, "baton_worker_tp_steps_total", 'worker="gpu1"', lambda v: v >= 3)
        assert steps <= 21, steps
        assert d.metric("baton_worker_tp_steps_total", 'worker="gpu0"') == 0
        # The follower dies with requests in flight on the leader.
        pid0, pid1 = d.worker_pid("gpu0"), d.worker_pid("gpu1")
        rids = [c.request("slow", E.X(i)) for i in range(4)]
        time.sleep(0.1)
        os.kill(pid1, signal.SIGKILL)
        E.wait_all_unavailable(c, rids, 20)
        E.wait_restarted(d, c, "gpu1", pid1, timeout=30)
        assert d.worker_pid("gpu0") not in (None, pid0), "the leader was not restarted"
        assert d.metric("baton_worker_restarts_total", 'worker="gpu0"') >= 1
        _, r = c.infer("echo", E.X(7), timeout=30)
        assert r.status.code == pb.OK and E.as_i32(r.outputs[0]) == [7], r
        assert "of its tensor-parallel group (model echo_tp) was lost" in d.tail() or \
            "of its tensor-parallel group (model slow_tp) was lost" in d.tail(), d.tail()
    finally:
        c.close()
        found = problems(d)
        d.stop()
    assert not found, "the emulator reported problems:\n" + "".join(found[:20])


GROUP_CONFIG = daemon_yaml(30000).replace("log_level: warning", "log_level: info") + """workers:
  - {name: gpu0, device: 'cuda:0', pool_mb: 16}
  - {name: gpu1, device: 'cuda:1', pool_mb: 16%s}
models:
  - {name: group_tp, backend: group, workers: [gpu0, gpu1], tp: 2%s}
graphs:
  - name: echo
    inputs: [x]
    body:
      node: {name: e, model: group_tp, inputs: [x], outputs: [{name: x, to: client}]}
"""


def wait_log(d, text, timeout=30.0):
    """The daemon's log once TEXT is in it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if text in d.tail():
            return
        time.sleep(0.1)
    raise AssertionError("%r not in the log:\n%s" % (text, d.tail()))


def stop_and_read(d):
    """Stops batond (SIGTERM, as systemd does) and returns how long that
    took and its log, read before the log's folder goes."""
    t0 = time.time()
    d.proc.send_signal(signal.SIGTERM)
    try:
        d.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    took = time.time() - t0
    with open(os.path.join(d.dir, "batond.log")) as f:
        log = f.read()
    return took, log


def stopped_cleanly(took, log, found):
    """batond stopped at once, and gpu0 exited by itself, nothing killed,
    nothing the emulator saw amiss."""
    assert "killed by signal" not in log, log[-3000:]
    assert "worker gpu0 stopped (exited with status 0)" in log, log[-3000:]
    assert took < 10, "batond took %.1f s to stop" % took
    assert not found, "the emulator reported problems:\n" + "".join(found[:20])


def test_tp_rank_load_fails():
    """A rank whose load fails does not leave its group waiting for it:
    rank 1 (gpu1) fails its load (fail_rank: 1), and rank 0 (gpu0), which
    waits in the group's forming, is stopped at once and comes back without
    a Load until gpu1 registers again; health says why the daemon is not
    ready, a request is refused, and at the end batond stops without
    killing anything.  Before, gpu0 waited in NCCL's init until batond
    killed it at its stop."""
    d = E.Daemon(GROUP_CONFIG % ("", ", options: {fail_rank: 1}"), wait=False)
    c = d.client()
    try:
        wait_log(d, "its tensor-parallel group is held until worker gpu1 registers again")
        wait_log(d, "worker gpu0 lost: its tensor-parallel group (model group_tp) cannot form")
        # Its next incarnation registers, and is given nothing to load.
        deadline = time.time() + 30
        while d.tail().count("worker gpu0 registered") < 2 and time.time() < deadline:
            time.sleep(0.1)
        assert d.tail().count("worker gpu0 registered") == 2, d.tail()
        h = c.health(10)
        assert h is not None and not h.ready, h
        assert "model group_tp: rank 1 (worker gpu1) failed to load: group: rank 1 fails" in \
            h.message, h.message
        _, r = c.infer("echo", E.X(1), timeout=30)
        assert r.status.code == pb.UNAVAILABLE, r
        # Held: the new gpu0 got no Load (it waits for nothing), and gpu1,
        # not taken down, did not fail again.
        time.sleep(1)
        log = d.tail()
        assert log.count("cannot load model group_tp") == 1, log
        assert log.count("worker gpu0 lost") == 1 and "worker gpu1 lost" not in log, log
    finally:
        c.close()
        found = problems(d)
        took, log = stop_and_read(d)
        d.stop()
    stopped_cleanly(took, log, found)


def test_tp_wait_ends_at_stop():
    """A rank waiting for a group that never forms (gpu1 is an external
    worker nobody starts) leaves that wait when it is told to stop: batond
    stops at once and gpu0 exits by itself.  Before, its load could not be
    interrupted, and batond killed it after its grace period."""
    d = E.Daemon(GROUP_CONFIG % (", spawn: external", ""), wait=False)
    try:
        wait_log(d, "worker gpu0 registered")
        time.sleep(2)  # its load is in the group's forming by now
        assert "worker gpu0 loaded" not in d.tail(), d.tail()
    finally:
        found = problems(d)
        took, log = stop_and_read(d)
        d.stop()
    stopped_cleanly(took, log, found)


def test_tp_step_deadline():
    """A group stuck in a step ends at its deadline: rank 1 stops in its
    second step, alive and sending heartbeats but never reaching the step's
    all-reduce, in which rank 0 waits.  Past tp_step_timeout_ms (2 s) the
    ranks abort the group's communicator and exit, the request ends
    UNAVAILABLE, the group is made again and serves.  Before, heartbeats
    kept both ranks alive, and the request waited for its own deadline,
    and every later one with it."""
    d = E.Daemon(GROUP_CONFIG % ("", ", tp_step_timeout_ms: 2000, "
                                 "options: {hang_rank: 1, hang_at: 2}"), wait=False)
    c = d.client()
    try:
        d.wait_ready()
        _, r = c.infer("echo", E.X(1, 2), timeout=30)
        assert r.status.code == pb.OK and E.as_i32(r.outputs[0]) == [1, 2], r
        pid0, pid1 = d.worker_pid("gpu0"), d.worker_pid("gpu1")
        t0 = time.time()
        _, r = c.infer("echo", E.X(3), timeout=25)
        took = time.time() - t0
        assert r.status.code == pb.UNAVAILABLE, r
        assert took < 15, "the stuck step ended after %.1f s" % took
        wait_log(d, "a step of tensor-parallel model group_tp has run for")
        E.wait_restarted(d, c, "gpu0", pid0, timeout=30)
        assert d.worker_pid("gpu1") not in (None, pid1), "rank 1 was not made again"
        _, r = c.infer("echo", E.X(4), timeout=30)
        assert r.status.code == pb.OK and E.as_i32(r.outputs[0]) == [4], r
    finally:
        c.close()
        found = problems(d)
        d.stop()
    assert not found, "the emulator reported problems:\n" + "".join(found[:20])


XHOST_CONFIG = daemon_yaml(60000).replace("log_level: warning", "log_level: info") + """  max_message_bytes: 100000000
workers:
  - {name: gpu0, device: 'cuda:0', pool_mb: 96, host: host-a}
  - {name: gpu1, device: 'cuda:1', pool_mb: 96, spawn: external, host: host-b}
  - {name: gpu2, device: 'cuda:1', pool_mb: 96, host: host-a}
models:
  - {name: echo_g0, backend: echo, worker: gpu0}
  - {name: add_g0, backend: add, worker: gpu0}
  - {name: add_g1, backend: add, worker: gpu1}
  - {name: add_g2, backend: add, worker: gpu2}
  - {name: slow_g0, backend: sleep, worker: gpu0, options: {ms: 1500}}
graphs:
"""
# Two copies of x made on gpu0 meet on the consumer (y = 2x), and y comes
# back to gpu0: across hosts (gpu1, host-b) both directions of the pair run
# over NCCL; on gpu2 (host-a, like gpu0) the same graph reads by CUDA IPC.
for _name, _model in (("xhost", "add_g1"), ("samehost", "add_g2")):
    XHOST_CONFIG += """  - name: %s
    inputs: [x]
    body:
      sequential:
        - parallel:
            - node: {name: p1, model: echo_g0, inputs: [x], outputs: [{name: x, to: twice}]}
            - node: {name: p2, model: echo_g0, inputs: [x], outputs: [{name: x2, to: twice}]}
        - node: {name: twice, model: %s, inputs: [x, x2], outputs: [{name: y, to: back}]}
        - node: {name: back, model: add_g0, inputs: [y], outputs: [{name: z, to: client}]}
""" % (_name, _model)
XHOST_CONFIG += """  - name: slow
    inputs: [x]
    body:
      sequential:
        - node: {name: s, model: slow_g0, inputs: [x], outputs: [{name: x, to: c}]}
        - node: {name: c, model: add_g1, inputs: [x], outputs: [{name: y, to: client}]}
"""


def test_nccl_between_hosts():
    """Two emulated GPU workers registered under different host names
    (`host:` in the deployment): the conductor marks the parts between them NCCL,
    the producer ncclSends and the consumer ncclRecvs on their pair's
    communicator (made at registration, relayed by the conductor).  The
    result equals the same graph on one host (CUDA IPC), for a 4 KiB and a
    16 MiB tensor; every pool returns to empty.  A producer killed under a
    request fails it UNAVAILABLE; once restarted it forms a new
    communicator with the consumer and requests succeed again.  A send
    whose receiver is lost before it receives ends (the communicator is
    aborted) and frees its tensor."""
    d = E.Daemon(XHOST_CONFIG, wait=False)
    wlog = open(os.path.join(d.dir, "gpu1.log"), "w")
    worker = subprocess.Popen([os.path.join(ROOT, E.BUILD, "baton-worker"), "--config", d.config,
                               "--name", "gpu1", "--run-id", "xh%d" % os.getpid()],
                              stdout=wlog, stderr=subprocess.STDOUT)
    c = d.client()
    found = []
    try:
        d.wait_ready(timeout=120)

        def run(graph, data, want_ok=True, timeout=60):
            """The graph's z; retried while the pair's communicator is
            still forming (the node then fails UNAVAILABLE)."""
            deadline = time.time() + timeout
            while True:
                _, r = c.infer(graph, {"x": (pb.I32, [len(data) // 4], data)}, timeout=120)
                if r.status.code == pb.OK or time.time() > deadline:
                    break
                assert r.status.code == pb.UNAVAILABLE, r.status
                time.sleep(0.5)
            assert r.status.code == pb.OK, (graph, r.status)
            return r.outputs[0].data

        for size in (4096, 16 << 20):
            n = size // 4
            data = struct.pack("<%di" % n, *((i * 2654435761) % 1000003 for i in range(n)))
            want = struct.pack("<%di" % n, *(2 * ((i * 2654435761) % 1000003) for i in range(n)))
            before = staged(d, "gpu1") or 0
            got = run("xhost", data)
            assert got == want, "%d bytes: the cross-host result differs" % size
            assert run("samehost", data) == got, "%d bytes: cross-host != same host" % size
            # gpu1 received both copies of x over NCCL (counted as staged).
            settled(d, "gpu1", before + 2 * size)
            assert staged(d, "gpu1") >= before + 2 * size, (staged(d, "gpu1"), before)
        wait_pools_empty(d, ("gpu0", "gpu1", "gpu2"))
        # The bytes crossed over NCCL: gpu1 never mapped gpu0's memory (no
        # CUDA IPC between hosts), and its log shows the pair's
        # communicator; gpu2, on gpu0's host, did map it.
        pid0 = d.worker_pid("gpu0")
        assert own_inode(pid0) not in memfd_inodes(worker.pid)
        assert own_inode(pid0) in memfd_inodes(d.worker_pid("gpu2"))
        wlog.flush()
        with open(os.path.join(d.dir, "gpu1.log")) as f:
            text = f.read()
        assert "communicator 1 with worker 0 formed (rank 1)" in text, text[-3000:]
        # The producer dies under a request: it ends UNAVAILABLE, the
        # conductor restarts the producer, and a new communicator of the
        # pair carries the next requests.
        rid = c.request("slow", {"x": (pb.I32, [3], struct.pack("<3i", 1, 2, 3))})
        time.sleep(0.5)
        os.kill(pid0, signal.SIGKILL)
        E.wait_all_unavailable(c, [rid], 30)
        E.wait_restarted(d, c, "gpu0", pid0, timeout=60)
        data = struct.pack("<4i", 5, 6, 7, 8)
        assert run("xhost", data) == struct.pack("<4i", 10, 12, 14, 16)
        _, r = c.infer("slow", {"x": (pb.I32, [4], data)}, timeout=60)
        assert r.status.code == pb.OK and r.outputs[0].data == data, r.status
        wait_pools_empty(d, ("gpu0", "gpu1", "gpu2"))
        assert worker.poll() is None, "the consumer exited"
        # The consumer stops before it takes its Dispatch, so the producer's
        # send waits for a receive that never comes; the consumer is then
        # killed.  Once the conductor has lost it, the producer aborts the
        # pair's communicator: the send ends, its tensor is freed (the pool
        # empties), and a new consumer forms a new communicator.
        # (Larger than what a send can hand over before the receiver takes
        # it: the emulator's mailbox holds 256 KiB, real NCCL's buffers
        # less.)
        big = pattern(1 << 20)
        rid = c.request("slow", {"x": (pb.I32, [len(big) // 4], big)})
        worker.send_signal(signal.SIGSTOP)
        time.sleep(3)
        worker.kill()
        worker.wait()
        E.wait_all_unavailable(c, [rid], 30)
        wait_pools_empty(d, ("gpu0",), timeout=15)
        d.log.flush()
        with open(os.path.join(d.dir, "batond.log")) as f:
            log = f.read()
        assert "with worker 1 failed: the peer is down" in log, log[-3000:]
        worker = subprocess.Popen([os.path.join(ROOT, E.BUILD, "baton-worker"), "--config",
                                   d.config, "--name", "gpu1", "--run-id",
                                   "xh%d" % os.getpid()],
                                  stdout=wlog, stderr=subprocess.STDOUT)
        d.wait_ready(timeout=60)
        assert run("xhost", data) == struct.pack("<4i", 10, 12, 14, 16)
        wait_pools_empty(d, ("gpu0", "gpu1", "gpu2"))
    finally:
        c.close()
        if worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        wlog.close()
        found = problems(d)
        with open(os.path.join(d.dir, "gpu1.log")) as f:
            found += [line for line in f if "cudaemu: problem" in line]
        d.stop()
    assert not found, "the emulator reported problems:\n" + "".join(found[:20])


CHAT_CONFIG = daemon_yaml(600000) + """workers:
  - {name: cpu0, device: cpu, pool_mb: 64}
  - {name: gpu0, device: 'cuda:0', pool_mb: 64}
  - {name: gpu1, device: 'cuda:0', pool_mb: 64}
  - {name: gpu2, device: 'cuda:1', pool_mb: 64}
  - {name: gpu3, device: 'cuda:2', pool_mb: 64}
models:
  # The CPU's f32 path, which the GPU kernels (f32 activations and cache)
  # must equal token for token.
  - {name: llm_cpu, backend: transformer, worker: cpu0, max_batch: 2,
     options: {path: MODEL, max_seq: 96, prefill_chunk: 32, activations: f32, kv_dtype: f32}}
  - {name: llm_gpu, backend: transformer, worker: gpu0, max_batch: 2,
     options: {path: MODEL, max_seq: 96, prefill_chunk: 32}}
  - {name: llm_gpu_b, backend: transformer, worker: gpu1, max_batch: 2,
     options: {path: MODEL, max_seq: 96, prefill_chunk: 32}}
  # Tensor parallel: half the FFN on each of two GPUs, an all-reduce over
  # NCCL per layer.
  - {name: llm_tp, backend: transformer, workers: [gpu2, gpu3], tp: 2, max_batch: 2,
     options: {path: MODEL, max_seq: 96, prefill_chunk: 32}}
graphs:
  # Disaggregated: prefill on gpu0, the decode loop on gpu1; the KV cache
  # crosses as a tensor, by CUDA IPC.
  - name: chat_split
    inputs: [prompt]
    body:
      sequential:
        - node: {name: prefill, model: llm_gpu, mode: prefill, inputs: [prompt],
                 outputs: [{name: token, to: decode}, {name: kv, to: decode, persist: true},
                           {name: token, to: client, new_token: true}]}
        - loop:
            name: decode_loop
            max_iters: 2
            body:
              node: {name: decode, model: llm_gpu_b, mode: decode, inputs: [token, kv],
                     outputs: [{name: token, to: decode},
                               {name: token, to: client, new_token: true}]}
"""


def chat_graph(model, max_iters, run_ahead):
    """The graph chat_MODEL: a prefill of llm_MODEL, then a decode loop of
    it (run ahead when RUN_AHEAD), streaming each token."""
    return """
  - name: chat_%(d)s
    inputs: [prompt]
    body:
      sequential:
        - node: {name: prefill, model: llm_%(d)s, mode: prefill, inputs: [prompt],
                 outputs: [{name: token, to: decode}, {name: token, to: client, new_token: true}]}
        - loop:
            name: decode_loop
            max_iters: %(n)d
            body:
              node: {name: decode, model: llm_%(d)s, mode: decode, async: %(a)s, inputs: [token],
                     outputs: [{name: token, to: decode},
                               {name: token, to: client, new_token: true}]}
""" % {"d": model, "n": max_iters, "a": "true" if run_ahead else "false"}


for dev in ("cpu", "gpu", "tp"):
    CHAT_CONFIG += chat_graph(dev, 2, True)

PROMPTS = [b"What is the capital of France?", b"Write a haiku about rain."]


def test_chat_cuda_equals_cpu():
    """The chat graph on a GPU worker against the CPU worker, alone and
    batched; and split, its prefill on one GPU worker and its decode loop
    on another (disaggregated serving)."""
    if not os.path.exists(MODEL):
        if os.environ.get("BATON_CI") == "1":
            raise AssertionError("%s is absent, and with BATON_CI=1 the model tests must run"
                                 % MODEL)
        print("SKIP test_chat_cuda_equals_cpu: %s" % E.model_absent(MODEL))
        return "skip"
    d = E.Daemon(CHAT_CONFIG.replace("MODEL", MODEL), wait=False)
    c = d.client()
    try:
        def ids(r):
            assert r.status.code == pb.OK, r.status
            return [t for o in r.outputs for t in E.as_i32(o)]

        def prompt(p):
            return {"prompt": (pb.U8, [len(p)], p)}

        def both_at_once(graph, prompts=PROMPTS):
            """The prompts in flight together: each gives the CPU's ids."""
            rids = {c.request(graph, prompt(p)): p for p in prompts}
            got = {}
            deadline = time.time() + 600
            while len(got) < len(rids) and time.time() < deadline:
                m = c.recv(600)
                if m is not None and m.HasField("response"):
                    got[m.response.request_id] = m.response
            for rid, p in rids.items():
                assert rid in got, (graph, p, "no answer")
                assert ids(got[rid]) == want[p], (graph, p, ids(got[rid]), want[p])

        # Five workers load the model at once on the emulator.
        d.wait_ready(timeout=300)
        want = {}
        for p in PROMPTS:
            _, r = c.infer("chat_cpu", prompt(p), timeout=300)
            want[p] = ids(r)
            assert len(want[p]) >= 2, want[p]
        # Alone on the GPU worker, then the two at once (their decode steps
        # share executions: a batch of 2 on the device).
        for p in PROMPTS:
            _, r = c.infer("chat_gpu", prompt(p), timeout=600)
            assert ids(r) == want[p], (p, ids(r), want[p])
        both_at_once("chat_gpu")
        # Disaggregated: the same ids, and gpu1 read the cache (and every
        # token) where gpu0 wrote it: it staged nothing.
        p = PROMPTS[0]
        _, r = c.infer("chat_split", prompt(p), timeout=600)
        assert ids(r) == want[p], (p, ids(r), want[p])
        assert settled(d, "gpu1") == 0, staged(d, "gpu1")
        # Four requests at once on the split deployment: the prefill
        # worker's I/O thread places inputs and sends results while its
        # lane and the decode worker run; none of them may go silent.
        both_at_once("chat_split", PROMPTS * 2)
        # Tensor parallel over gpu2 and gpu3, its decode loop run ahead
        # (async), the two prompts at once (a batch of 2, which rank 1 runs
        # too): the same ids.  Rank 0's I/O thread must go on sending the
        # steps rank 1 waits for while its lane waits in an all-reduce.
        # When they end, both ranks closed their sessions.
        both_at_once("chat_tp")
        assert wait_metric(d, "baton_worker_tp_steps_total", 'worker="gpu3"',
                           lambda v: v >= 3) >= 3
        for w in ("gpu2", "gpu3"):
            wait_metric(d, "baton_worker_sessions", 'worker="%s"' % w, lambda v: v == 0)
    finally:
        c.close()
        found = problems(d)
        d.stop()
    assert not found, "the emulator reported problems:\n" + "".join(found[:20])


WHISPER = os.path.join(ROOT, "models/whisper-base")
JFK = os.path.join(ROOT, "models/samples/jfk.wav")
# Whisper on a GPU worker and on a CPU worker in f32, each serving
# voice.yaml's transcribe graph (features, then windows of encode and a
# decode loop).
WHISPER_CONFIG = daemon_yaml(600000) + """workers:
  - {name: cpu0, device: cpu, pool_mb: 256}
  - {name: gpu0, device: 'cuda:0', pool_mb: 256}
models:
  - {name: whisper_cpu, backend: whisper, worker: cpu0, max_batch: 1,
     options: {path: WHISPER, activations: f32}}
  - {name: whisper_gpu, backend: whisper, worker: gpu0, max_batch: 1,
     options: {path: WHISPER}}
graphs:
"""
for dev in ("cpu", "gpu"):
    WHISPER_CONFIG += """
  - name: transcribe_%(d)s
    inputs: [audio, options]
    body:
      sequential:
        - node: {name: features, model: whisper_%(d)s, mode: features, inputs: [audio, options],
                 outputs: [{name: mel, to: encode, persist: true}, {name: seek, to: encode}]}
        - loop:
            name: windows
            max_iters: 4
            body:
              sequential:
                - node: {name: encode, model: whisper_%(d)s, mode: encode, inputs: [mel, seek],
                         outputs: [{name: states, to: decode, persist: true},
                                   {name: token, to: decode}]}
                - loop:
                    name: decode_loop
                    max_iters: 224
                    body:
                      node: {name: decode, model: whisper_%(d)s, mode: decode,
                             inputs: [states, token],
                             outputs: [{name: token, to: decode},
                                       {name: text, to: client, modality: text},
                                       {name: segments, to: client, modality: text},
                                       {name: seek}]}
                    outputs: [{name: seek, to: encode}]
                    accumulate: []
""" % {"d": dev}


HF_CONFIG = daemon_yaml(120000) + """workers:
  - {name: cpu0, device: cpu, pool_mb: 64}
  - {name: gpu0, device: 'cuda:0', pool_mb: 64}
  - {name: gpu1, device: 'cuda:1', pool_mb: 64}
  - {name: gpu2, device: 'cuda:2', pool_mb: 64}
models:
  - {name: llm_cpu, backend: transformer, worker: cpu0,
     options: {path: HF, max_seq: 64, activations: f32, kv_dtype: f32}}
  - {name: llm_gpu, backend: transformer, worker: gpu0, max_batch: 2, options: {path: HF, max_seq: 64}}
  - {name: llm_tp, backend: transformer, workers: [gpu1, gpu2], tp: 2, options: {path: HF, max_seq: 64}}
graphs:
"""
for dev in ("cpu", "gpu", "tp"):
    HF_CONFIG += chat_graph(dev, 9, False)


def test_hf_f16_on_gpu():
    """A Hugging Face folder of f16 weights (tests/gpu/make_hf_model.py, a
    tiny Llama) on a GPU worker and tensor parallel over two: the GPU's
    products take f32, so the worker widens each f16 matrix as it uploads it
    (a rank its shard, cut in f16 first); greedy ids equal the CPU's."""
    folder = tempfile.mkdtemp(prefix="baton-hf-f16-")
    try:
        subprocess.check_call([sys.executable, os.path.join(ROOT, "tests/gpu/make_hf_model.py"),
                               folder, "--size", "tiny"], stdout=subprocess.DEVNULL)
        d = E.Daemon(HF_CONFIG.replace("HF", folder), wait=False)
        c = d.client()
        try:
            d.wait_ready(timeout=120)
            for ids in ([168, 488, 80, 205, 336, 27, 40], [423, 277, 51, 190, 301, 32, 468, 262]):
                x = {"prompt": (pb.I32, [len(ids)], struct.pack("<%di" % len(ids), *ids))}
                got = {}
                for g in ("chat_cpu", "chat_gpu", "chat_tp"):
                    chunks, r = c.infer(g, x, stream=True, timeout=120)
                    assert r.status.code == pb.OK, (g, r.status)
                    got[g] = [t for ch in chunks for t in E.as_i32(ch.value)]
                assert len(got["chat_cpu"]) == 10, got
                assert got["chat_gpu"] == got["chat_cpu"] == got["chat_tp"], got
        finally:
            c.close()
            found = problems(d)
            d.stop()
        assert not found, "the emulator reported problems:\n" + "".join(found[:20])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_whisper_cuda_equals_cpu():
    """Whisper's encoder and decoder on a GPU worker: the JFK clip's
    segments, every token of them (timestamps included) and their text,
    equal the CPU worker's in f32."""
    if not os.path.exists(os.path.join(WHISPER, "model.bin")) or not os.path.exists(JFK):
        if os.environ.get("BATON_CI") == "1":
            raise AssertionError("%s or %s is absent, and with BATON_CI=1 the model tests must "
                                 "run" % (WHISPER, JFK))
        print("SKIP test_whisper_cuda_equals_cpu: %s" % E.model_absent(WHISPER))
        return "skip"
    d = E.Daemon(WHISPER_CONFIG.replace("WHISPER", WHISPER), wait=False)
    c = d.client()
    try:
        d.wait_ready(timeout=300)
        wav = open(JFK, "rb").read()
        opts = b'{"language": "en"}'
        got = {}
        for dev in ("cpu", "gpu"):
            _, r = c.infer("transcribe_" + dev, {"audio": (pb.U8, [len(wav)], wav),
                                                 "options": (pb.U8, [len(opts)], opts)},
                           timeout=900)
            assert r.status.code == pb.OK, (dev, r.status)
            out = {o.name: o.data for o in r.outputs}
            segs = [json.loads(ln) for ln in out["segments"].decode().splitlines()]
            got[dev] = (out["text"].decode(), [t for x in segs for t in x["tokens"]])
        assert got["gpu"] == got["cpu"], got
        assert "ask what you can do for your country" in got["cpu"][0], got
        assert len(got["cpu"][1]) >= 20, got
    finally:
        c.close()
        found = problems(d)
        d.stop()
    assert not found, "the emulator reported problems:\n" + "".join(found[:20])


# The tests that take minutes on the emulator: run by `make slow-test`, not
# by `make test` (tests/cudaemu/run.sh slow).
SLOW_TESTS = ("test_chat_cuda_equals_cpu", "test_whisper_cuda_equals_cpu")


def main():
    """Arguments: test names to run (default all), or --fast (all but
    SLOW_TESTS) or --slow (SLOW_TESTS)."""
    args = sys.argv[1:]
    own_daemon = (test_check_config, test_device_lost, test_tp_group, test_tp_rank_load_fails,
                  test_tp_wait_ends_at_stop, test_tp_step_deadline, test_nccl_between_hosts,
                  test_hf_f16_on_gpu, test_chat_cuda_equals_cpu, test_whisper_cuda_equals_cpu)
    everything = [t.__name__ for t in GPU_TESTS + list(own_daemon)]
    if args == ["--fast"]:
        only = [n for n in everything if n not in SLOW_TESTS]
    elif args == ["--slow"]:
        only = list(SLOW_TESTS)
    else:
        unknown = [a for a in args if a not in everything]
        if unknown:
            print("test_gpu_worker: unknown test %s; the tests: %s"
                  % (", ".join(unknown), " ".join(everything)), file=sys.stderr)
            return 2
        only = args
    passed = failed = skipped = 0

    def run(t, *args):
        nonlocal passed, failed, skipped
        try:
            if t(*args) == "skip":
                skipped += 1
            else:
                passed += 1
                print("ok   %s" % t.__name__, flush=True)
            evidence.passed()
        except Exception:
            failed += 1
            print("FAIL %s\n%s" % (t.__name__, traceback.format_exc()), flush=True)
            if args:
                args[0].log.flush()
            evidence.failed(t.__name__)

    wanted = [t for t in GPU_TESTS if not only or t.__name__ in only]
    if wanted:
        with open(os.path.join(HERE, "configs/gpu.yaml")) as f:
            d = E.Daemon(f.read(), wait=False)
        try:
            d.wait_ready()
            for t in wanted:
                c = d.client()
                try:
                    run(t, d, c)
                finally:
                    c.close()
        finally:
            found = problems(d)
            d.stop()
        if found:
            failed += 1
            print("FAIL the emulator reported problems:\n%s" % "".join(found[:20]), flush=True)
            evidence.failed("the emulator reported problems")
    for t in own_daemon:
        if not only or t.__name__ in only:
            run(t)
    print("gpu worker: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
