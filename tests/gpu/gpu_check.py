#!/usr/bin/env python3
"""The GPU check: every step of scripts/gpu-check.sh that runs baton's
programs, from a pack that script made.

    gpu_check.py --pack DIR --out DIR [--emulated] [--budget SECONDS]

Steps, in this order (a step that would start after the budget is spent is
recorded as skipped, saying so):

  env          the GPU, its driver and the libraries the programs resolve;
  kernels      check_kernels (every CUDA kernel against its C reference,
               then timed against a device-to-device copy), check_ops and
               check_exec (executables and CUDA-graph replay against the
               CPU device);
  ipc          batond with two GPU workers on cuda:0 and one CPU worker: a
               4 KiB and a 64 MiB tensor handed over by CUDA IPC, exact, the
               consumer staging nothing and opening no pool on a request's
               path; a CPU -> GPU -> CPU graph, exact;
  transformer  a Hugging Face folder made here (make_hf_model.py: SmolLM2-
               135M's shapes, seeded random f16 weights); greedy ids of the
               GPU worker, alone and split (prefill on one GPU worker, the
               decode loop on the other) equal the CPU worker's (f32
               activations); the GPU's decode executable is a CUDA graph;
  speed        decode tokens/s of that model through batond at batch 1 and
               16 (128 tokens each), and Hugging Face transformers on the
               same folder and GPU (hf_decode.py);
  sanitizer    compute-sanitizer memcheck, racecheck and synccheck on
               check_kernels, and memcheck on the GPU workers of the ipc
               step.

Writes OUT/gpu-check.json (every step: status pass, fail or skip, its
seconds, what it found) and OUT/gpu-check.log (every program's output).
With --emulated the same steps run on the CUDA emulator with a tiny model:
what needs a real GPU (compute-sanitizer, torch) is skipped, saying so, and
the speed step runs at a small size only to show that it works: the
emulator's timings mean nothing and are marked so.  Exit status: 0 when no
step failed, 1 otherwise.  Standard library only (the client's pyzmq and
protobuf come from the pack or the system).
"""
import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

T0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
LOG = None
BUDGET = 480.0  # seconds for the whole run (--budget)


def left(limit):
    """LIMIT seconds, or what is left of the budget when that is less (at
    least 5): no wait outlasts the budget by more than a moment."""
    return max(5.0, min(limit, BUDGET - (time.time() - T0)))


def log(*a):
    line = " ".join(str(x) for x in a)
    print(line, flush=True)
    if LOG:
        LOG.write(line + "\n")
        LOG.flush()


class Ctx:
    """What every step needs: the pack, the output folder, the mode."""

    def __init__(self, args):
        self.pack = os.path.abspath(args.pack)
        self.out = os.path.abspath(args.out)
        self.emulated = args.emulated
        self.bin = os.path.join(self.pack, "bin")
        self.work = tempfile.mkdtemp(prefix="baton-gpu-check-")
        self.env = dict(os.environ)
        self.env["LD_LIBRARY_PATH"] = ":".join(
            [os.path.join(self.pack, "lib")] + cuda_lib_dirs() +
            [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p])
        self.env["BATON_WORKER"] = os.path.join(self.bin, "baton-worker")
        if self.emulated:
            self.env.setdefault("CUDAEMU_DEVICES", "2")
        self.model = os.path.join(self.work, "model")
        self.need_glibc = None  # from the pack's manifest
        self.size = "tiny" if self.emulated else "smollm2-135m"

    def prog(self, name):
        return os.path.join(self.bin, name)


def cuda_lib_dirs():
    """Folders that may hold the CUDA and NCCL libraries on a GPU machine:
    the toolkit's, and those of the nvidia-* Python packages."""
    dirs = []
    for d in ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]:
        if os.path.isdir(d):
            dirs.append(d)
    for pat in ["/usr/local/lib/python3*/dist-packages/nvidia/*/lib",
                "/usr/lib/python3/dist-packages/nvidia/*/lib",
                "/opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib",
                os.path.join(sys.prefix, "lib/python3*/site-packages/nvidia/*/lib")]:
        dirs += sorted(glob.glob(pat))
    seen, out = set(), []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def run(ctx, argv, timeout, env=None, name=None):
    """Runs ARGV, its output into the log; (exit status or "timeout",
    output text)."""
    name = name or os.path.basename(argv[0])
    log("$ " + " ".join(argv))
    t = time.time()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         env=env or ctx.env, cwd=ctx.work, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=left(timeout))
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rc = "timeout"
    text = out.decode("utf-8", "replace")
    LOG.write(text)
    LOG.write("[%s: exit %s after %.1f s]\n" % (name, rc, time.time() - t))
    LOG.flush()
    return rc, text


# ---- batond and the client ---------------------------------------------------------------

def client_module(ctx):
    sys.path.insert(0, os.path.join(ctx.pack, "py"))
    os.environ["BATON_PROTO_PATH"] = os.path.join(ctx.pack, "py")
    import baton_client
    return baton_client


DAEMON = """version: 1
daemon:
  listen: ipc://%(dir)s/baton.sock
  workers_endpoint: ipc://%(dir)s/workers.sock
  max_inflight: 64
  request_timeout_ms: 600000
  drain_timeout_ms: 3000
  max_message_bytes: 200000000
  log_level: info
"""


class Daemon:
    """batond on CONFIG (a deployment without its daemon: section)."""

    def __init__(self, ctx, name, body, env=None):
        self.ctx, self.name = ctx, name
        # The client first: a client that cannot be imported must not leave
        # a batond and its workers behind.
        self.bc = client_module(ctx)
        self.client = None
        self.dir = tempfile.mkdtemp(prefix=name + "-", dir=ctx.work)
        self.config = os.path.join(self.dir, "baton.yaml")
        with open(self.config, "w") as f:
            f.write(DAEMON % {"dir": self.dir} + body)
        self.logf = open(os.path.join(self.dir, "batond.log"), "w")
        self.proc = subprocess.Popen([ctx.prog("batond"), "--config", self.config],
                                     stdout=self.logf, stderr=subprocess.STDOUT,
                                     env=env or ctx.env, cwd=self.dir, start_new_session=True)
        self.endpoint = "ipc://%s/baton.sock" % self.dir

    def wait_ready(self, timeout):
        deadline = time.time() + left(timeout)
        last = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("batond exited (%s): %s" % (self.proc.returncode, self.tail()))
            # A model that failed to load keeps its worker LOADING for ever,
            # and a worker that cannot start is restarted for ever: say why
            # now rather than at the deadline.
            lines = self.tail(400).splitlines()
            failed = [l for l in lines if "cannot load model" in l]
            lost = [l for l in lines if " lost: exited" in l]
            if failed or len(lost) >= 2:
                errors = [l for l in lines if " error: " in l]
                raise RuntimeError("; ".join((failed or errors or lost)[:3]))
            try:
                if self.client is None:
                    self.client = self.bc.Client(self.endpoint)
                h = self.client.health(timeout_ms=2000)
                last = h
                if getattr(h, "ready", False):
                    return
            except self.bc.BatonError as e:
                last = e
                if self.client is not None:
                    self.client.close()
                    self.client = None
            time.sleep(0.5)
        raise RuntimeError("batond not ready after %d s (%s): %s" % (timeout, last, self.tail()))

    def tail(self, n=40):
        self.logf.flush()
        with open(os.path.join(self.dir, "batond.log"), errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def metric(self, name, labels):
        text = self.client.stats()
        text = text if isinstance(text, str) else getattr(text, "text", str(text))
        m = re.search(r"^%s\{%s\} ([0-9.e+-]+)$" % (re.escape(name), re.escape(labels)), text,
                      re.M)
        return float(m.group(1)) if m else None

    def heard_again(self, workers, timeout=15):
        """Two more messages from each worker with no request running:
        heartbeats, which carry the counters read after."""
        lab = 'worker="%s",direction="from_worker"'
        start = {w: self.metric("baton_worker_messages_total", lab % w) for w in workers}
        deadline = time.time() + timeout
        while time.time() < deadline:
            now = {w: self.metric("baton_worker_messages_total", lab % w) for w in workers}
            if all(now[w] is not None and start[w] is not None and now[w] >= start[w] + 2
                   for w in workers):
                return
            time.sleep(0.3)
        raise RuntimeError("no heartbeat from %s in %d s" % (workers, timeout))

    def stop(self):
        """Stops batond; raises when the emulator reported a problem in its
        log (the workers' stderr), unless an exception is on its way."""
        if self.client is not None:
            self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.logf.close()
        with open(os.path.join(self.dir, "batond.log"), errors="replace") as f:
            text = f.read()
        LOG.write("---- %s batond.log\n" % self.name)
        LOG.write(text[-200000:])
        LOG.flush()
        problems = [l for l in text.splitlines() if "cudaemu: problem" in l]
        if problems and sys.exc_info()[0] is None:
            raise AssertionError("the emulator reported problems: %s" % problems[:5])


# ---- steps --------------------------------------------------------------------------------

def step_env(ctx, res):
    info = {"mode": "emulated (cudaemu, on the CPU)" if ctx.emulated else "device"}
    if not ctx.emulated:
        # The machine's tools with the machine's libraries, not the pack's.
        rc, text = run(ctx, ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                             "clocks.max.sm,clocks.max.mem", "--format=csv,noheader"], 30,
                       dict(os.environ)) if shutil.which("nvidia-smi") else ("absent", "")
        info["nvidia_smi"] = text.strip() if rc == 0 else "nvidia-smi: %s" % rc
        rc, text = run(ctx, ["nvcc", "--version"], 30, dict(os.environ)) \
            if shutil.which("nvcc") else (1, "")
        info["nvcc"] = text.strip().splitlines()[-1] if rc == 0 and text.strip() else "absent"
    info["ld_library_path"] = ctx.env["LD_LIBRARY_PATH"]
    missing = {}
    # The pack's libraries were built against this machine's glibc or an
    # older one.
    have = os.confstr("CS_GNU_LIBC_VERSION") or "glibc ?"
    info["glibc"] = have
    if ctx.need_glibc:
        want = [int(x) for x in ctx.need_glibc.split("_")[1].split(".")]
        got = [int(x) for x in re.findall(r"\d+", have)[:2]] or [0]
        if got < want:
            missing["glibc"] = ["%s needed, %s here" % (ctx.need_glibc, have)]
    for p in sorted(os.listdir(ctx.bin)):
        rc, text = run(ctx, ["ldd", ctx.prog(p)], 30)
        nf = [l.split()[0] for l in text.splitlines() if "not found" in l]
        if nf:
            missing[p] = nf
    info["unresolved_libraries"] = missing
    # cuBLAS is opened with dlopen on first use (kernels/cuda/blas.cu), so
    # ldd does not list it: look for it on the path the programs get.
    if not ctx.emulated:
        found = [p for d in ctx.env["LD_LIBRARY_PATH"].split(":")
                 for p in sorted(glob.glob(os.path.join(d, "libcublas.so*")))]
        info["cublas"] = found[:4]
        if not found:
            missing["dlopen"] = ["libcublas.so"]
    res["info"] = info
    if missing:
        res["status"] = "fail"
        res["why"] = "libraries not found: %s" % missing


def step_kernels(ctx, res):
    found = {}
    failed = []
    for prog, args, limit in (("check_kernels", [], 300), ("check_ops", [], 300),
                              ("check_exec", [], 300)):
        env = dict(ctx.env, OUT=ctx.out, BUILD=ctx.work)
        rc, text = run(ctx, [ctx.prog(prog)] + args, limit * (4 if ctx.emulated else 1), env)
        counts = re.findall(r"^(\d+) checks, (\d+) failed", text, re.M)
        found[prog] = {"exit": rc, "checks": counts[-1] if counts else None,
                       "failed_lines": [l for l in text.splitlines() if l.startswith("FAIL")][:20]}
        if ctx.emulated and "cudaemu: problem" in text:
            found[prog]["emulator_problems"] = True
            failed.append(prog)
        elif rc != 0:
            failed.append(prog)
    for j in ("gpu_kernels.json", "gpu_exec.json"):
        p = os.path.join(ctx.out, j)
        if os.path.exists(p):
            with open(p) as f:
                found[j] = json.load(f)
    res["info"] = found
    if failed:
        res["status"] = "fail"
        res["why"] = "failed: %s" % ", ".join(failed)


def pattern(n):
    """N random bytes, seeded by N."""
    return random.Random(n).randbytes(n)


IPC_BODY = """workers:
  - {name: gpu0, device: 'cuda:0', pool_mb: 200}
  - {name: gpu1, device: 'cuda:0', pool_mb: 200}
  - {name: cpu0, device: cpu, pool_mb: 200}
models:
  - {name: echo_g0, backend: echo, worker: gpu0}
  - {name: add_g1, backend: add, worker: gpu1}
  - {name: echo_c0, backend: echo, worker: cpu0}
  - {name: add_c0, backend: add, worker: cpu0}
  - {name: add_g0, backend: add, worker: gpu0}
graphs:
  # gpu1 reads gpu0's tensor where it lies, by CUDA IPC.
  - name: ipc
    inputs: [x]
    body:
      sequential:
        - node: {name: produce, model: echo_g0, inputs: [x], outputs: [{name: x, to: consume}]}
        - node: {name: consume, model: add_g1, inputs: [x], outputs: [{name: y, to: client}]}
  # CPU -> GPU -> CPU: y = 2x on the GPU, read back by the CPU worker.
  - name: mixed
    inputs: [x]
    body:
      sequential:
        - parallel:
            - node: {name: host, model: echo_c0, inputs: [x], outputs: [{name: x, to: twice}]}
            - node: {name: dev, model: echo_g0, inputs: [x], outputs: [{name: x2, to: twice}]}
        - node: {name: twice, model: add_g0, inputs: [x, x2], outputs: [{name: y, to: back}]}
        - node: {name: back, model: add_c0, inputs: [y], outputs: [{name: z, to: client}]}
"""


def ipc_run(ctx, res, env=None, sizes=(4096, 64 << 20)):
    d = Daemon(ctx, "ipc", IPC_BODY, env)
    info = res.setdefault("info", {})
    try:
        d.wait_ready(300 if env else 120)
        c, bc = d.client, d.bc
        for size in sizes:
            data = pattern(size)
            x = bc.Tensor("x", "i32", [size // 4], data)
            t = time.time()
            r = c.infer("ipc", {"x": x}, timeout_ms=300000)
            took = time.time() - t
            raw = r.tensors["y"].data if "y" in r.tensors else b""
            info["ipc_%d" % size] = {"status": r.status, "exact": raw == data,
                                     "seconds": round(took, 3)}
            if not r.ok or raw != data:
                raise AssertionError("%d bytes by IPC: status %s %s, %s" %
                                     (size, r.status, r.message,
                                      "exact" if raw == data else "other bytes came back"))
        vals = list(range(-500, 524))
        x = bc.Tensor("x", "i32", [1024], struct.pack("<1024i", *vals))
        r = c.infer("mixed", {"x": x}, timeout_ms=120000)
        raw = r.tensors["z"].data if "z" in r.tensors else b""
        got = list(struct.unpack("<1024i", raw)) if len(raw) == 4096 else None
        info["mixed"] = {"status": r.status, "exact": got == [2 * v for v in vals]}
        if got != [2 * v for v in vals]:
            raise AssertionError("CPU -> GPU -> CPU gave other values")
        d.heard_again(("gpu0", "gpu1", "cpu0"))
        staged = d.metric("baton_worker_staged_bytes_total", 'worker="gpu1"')
        opens = {w: d.metric("baton_worker_ipc_opens_total", 'worker="%s",when="request"' % w)
                 for w in ("gpu0", "gpu1", "cpu0")}
        info["gpu1_staged_bytes"] = staged
        info["ipc_opens_on_request"] = opens
        if staged != 0:
            raise AssertionError("gpu1 staged %s bytes: the hand-off was copied" % staged)
        if any(v != 0 for v in opens.values()):
            raise AssertionError("a pool was opened on a request's path: %s" % opens)
    finally:
        d.stop()


def step_ipc(ctx, res):
    ipc_run(ctx, res)


def prompts(vocab):
    r = random.Random(7)
    return [[r.randrange(3, vocab) for _ in range(n)] for n in (7, 19)]


def chat_body(ctx, max_batch, tokens_cap):
    m = ctx.model
    seq = 256
    body = """workers:
  - {name: cpu0, device: cpu, pool_mb: 256}
  - {name: gpu0, device: 'cuda:0', pool_mb: 256}
  - {name: gpu1, device: 'cuda:0', pool_mb: 256}
models:
  - {name: llm_cpu, backend: transformer, worker: cpu0, max_batch: 2,
     options: {path: %(m)s, max_seq: %(seq)d, prefill_chunk: 32, activations: f32, kv_dtype: f32}}
  - {name: llm_gpu, backend: transformer, worker: gpu0, max_batch: %(mb)d,
     options: {path: %(m)s, max_seq: %(seq)d, prefill_chunk: 32}}
  - {name: llm_gpu_b, backend: transformer, worker: gpu1, max_batch: 2,
     options: {path: %(m)s, max_seq: %(seq)d, prefill_chunk: 32}}
graphs:
  - name: chat_split
    inputs: [prompt]
    body:
      sequential:
        - node: {name: prefill, model: llm_gpu, mode: prefill, inputs: [prompt],
                 outputs: [{name: token, to: decode}, {name: kv, to: decode, persist: true},
                           {name: token, to: client, new_token: true}]}
        - loop:
            name: decode_loop
            max_iters: %(cap)d
            body:
              node: {name: decode, model: llm_gpu_b, mode: decode, inputs: [token, kv],
                     outputs: [{name: token, to: decode},
                               {name: token, to: client, new_token: true}]}
""" % {"m": m, "seq": seq, "mb": max_batch, "cap": tokens_cap}
    for dev in ("cpu", "gpu"):
        body += """  - name: chat_%(d)s
    inputs: [prompt]
    body:
      sequential:
        - node: {name: prefill, model: llm_%(d)s, mode: prefill, inputs: [prompt],
                 outputs: [{name: token, to: decode}, {name: token, to: client, new_token: true}]}
        - loop:
            name: decode_loop
            max_iters: %(cap)d
            body:
              node: {name: decode, model: llm_%(d)s, mode: decode, async: true, inputs: [token],
                     outputs: [{name: token, to: decode},
                               {name: token, to: client, new_token: true}]}
""" % {"d": dev, "cap": tokens_cap}
    return body


def make_model(ctx):
    if os.path.exists(os.path.join(ctx.model, "model.safetensors")):
        return
    rc, text = run(ctx, [sys.executable, os.path.join(HERE, "make_hf_model.py"),
                         ctx.model, "--size", ctx.size], 600, env=dict(os.environ))
    if rc != 0:
        raise RuntimeError("make_hf_model.py failed: %s" % text[-2000:])


def generate(c, bc, graph, prompts_, n):
    """Greedy ids of each prompt (token id lists) on GRAPH, N tokens each
    (the prefill's and N - 1 decode steps), all sent at once and streamed:
    (a list of id lists, seconds from the first send to the last answer)."""
    t = time.time()
    rids = [c.send(graph, {"prompt": bc.Tensor("prompt", "i32", [len(p)],
                                               struct.pack("<%di" % len(p), *p))},
                   stream=True, max_iters={"decode_loop": n - 1}, timeout_ms=600000)
            for p in prompts_]
    ids = {r: [] for r in rids}
    done = {}
    while len(done) < len(rids):
        ev = c.recv(int(left(600) * 1000))
        if ev.request_id not in ids:
            continue
        if ev.is_chunk:
            raw = ev.tensor.data
            ids[ev.request_id] += list(struct.unpack("<%di" % (len(raw) // 4), raw))
        else:
            done[ev.request_id] = ev
    took = time.time() - t
    for r in rids:
        if not done[r].ok:
            raise AssertionError("%s: status %s: %s" % (graph, done[r].status, done[r].message))
    return [ids[r] for r in rids], took


def step_transformer(ctx, res):
    make_model(ctx)
    with open(os.path.join(ctx.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    n = 12 if ctx.emulated else 32
    d = Daemon(ctx, "transformer", chat_body(ctx, 2, 256))
    info = res.setdefault("info", {"tokens": n})
    try:
        d.wait_ready(600 if ctx.emulated else 300)
        c, bc = d.client, d.bc
        ps = prompts(vocab)
        want = {}
        for i, p in enumerate(ps):
            got = {g: generate(c, bc, g, [p], n)[0][0]
                   for g in ("chat_cpu", "chat_gpu", "chat_split")}
            want[i] = got["chat_cpu"]
            info["prompt_%d" % i] = got
            if len(want[i]) != n:
                raise AssertionError("prompt %d: %d ids on the CPU, not %d" %
                                     (i, len(want[i]), n))
            for g in ("chat_gpu", "chat_split"):
                if got[g] != got["chat_cpu"]:
                    k = next((j for j, (a, b) in enumerate(zip(got[g], got["chat_cpu"]))
                              if a != b), min(len(got[g]), len(got["chat_cpu"])))
                    raise AssertionError("prompt %d on %s: ids differ from the CPU's from "
                                         "token %d: %s against %s" % (i, g, k, got[g],
                                                                      got["chat_cpu"]))
        # Both prompts at once on the GPU worker: decode steps of a batch of 2.
        both, _ = generate(c, bc, "chat_gpu", ps, n)
        for i, got in enumerate(both):
            if got != want[i]:
                raise AssertionError("prompt %d beside the other on the GPU: %s against %s" %
                                     (i, got, want[i]))
        text = c.inspect()
        text = text if isinstance(text, str) else str(text)
        info["decode_cuda_graph"] = "replayed as a CUDA graph" in text
        if not info["decode_cuda_graph"]:
            raise AssertionError("the GPU worker's decode is not replayed as a CUDA graph")
    finally:
        d.stop()


def step_speed(ctx, res):
    make_model(ctx)
    with open(os.path.join(ctx.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    tokens, batches, plen = (4, (1, 2), 8) if ctx.emulated else (128, (1, 16), 16)
    info = res.setdefault("info", {})
    info["note"] = ("emulated: not a timing, only a run of the step" if ctx.emulated else
                    "decode tokens/s: requests of %d prompt tokens, %d generated each, "
                    "prefill included, greedy" % (plen, tokens))
    r_ = random.Random(11)
    prompt_ids = [[r_.randrange(3, vocab) for _ in range(plen)] for _ in range(max(batches))]
    d = Daemon(ctx, "speed", chat_body(ctx, max(batches), 1024))
    baton = {}
    try:
        d.wait_ready(600 if ctx.emulated else 300)
        c, bc = d.client, d.bc

        for b in batches:
            # Warm-up: the CUDA graphs of these batch sizes are captured.
            generate(c, bc, "chat_gpu", prompt_ids[:b], min(tokens, 8))
            ids, took = generate(c, bc, "chat_gpu", prompt_ids[:b], tokens)
            gen = sum(len(i) for i in ids)
            baton["batch_%d" % b] = {"tokens": gen, "seconds": round(took, 4),
                                     "tokens_per_s": round(gen / took, 1)}
            if b == batches[0]:
                first = ids[0]
    finally:
        d.stop()
    info["baton"] = baton
    # Hugging Face transformers on the same folder, same GPU.
    hf = {}
    try:
        import importlib.util
        have_torch = importlib.util.find_spec("torch") is not None and \
            importlib.util.find_spec("transformers") is not None
    except Exception:
        have_torch = False
    if ctx.emulated or not have_torch:
        info["hf"] = "skipped: %s" % ("emulated run" if ctx.emulated else
                                      "torch or transformers not installed")
    else:
        # torch and transformers with the machine's own libraries and
        # packages: not the pack's, nor the client's protobuf.
        env = dict(os.environ)
        env.pop("LD_LIBRARY_PATH", None)
        env.pop("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", None)
        env["PYTHONPATH"] = ":".join(p for p in env.get("PYTHONPATH", "").split(":")
                                     if p and "baton-gpu-site" not in p)
        path = os.path.join(ctx.work, "prompts.json")
        with open(path, "w") as f:
            json.dump(prompt_ids, f)
        rc, text = run(ctx, [sys.executable, os.path.join(HERE, "hf_decode.py"),
                             ctx.model, path, str(tokens)] + [str(b) for b in batches], 600, env)
        m = re.search(r"^RESULT (.*)$", text, re.M)
        hf = json.loads(m.group(1)) if m else {"error": "exit %s: %s" % (rc, text[-1500:])}
        info["hf"] = hf
        for b in batches:
            k = "batch_%d" % b
            if k in hf and isinstance(hf[k], dict) and hf[k].get("tokens_per_s"):
                baton[k]["vs_hf"] = round(baton[k]["tokens_per_s"] / hf[k]["tokens_per_s"], 2)
        # The same greedy ids as transformers'?  Reported, not checked: two
        # implementations may round a near tie apart.
        theirs = hf.get("first_prompt_ids")
        if theirs:
            info["first_prompt_same_ids_as_hf"] = next(
                (j for j, (x, y) in enumerate(zip(first, theirs)) if x != y), "all")
    if not ctx.emulated and "error" in hf:
        res["status"] = "fail"
        res["why"] = "hf_decode.py: %s" % hf["error"][:300]


def sanitizer_wrapper(ctx, tool):
    """A baton-worker that runs the real one under compute-sanitizer."""
    path = os.path.join(ctx.work, "worker-under-%s" % tool)
    logs = os.path.join(ctx.work, "san-%s" % tool)
    os.makedirs(logs, exist_ok=True)
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexec compute-sanitizer --tool %s --error-exitcode 99 "
                "--log-file %s/worker-%%p.log %s \"$@\"\n" % (tool, logs, ctx.prog("baton-worker")))
    os.chmod(path, 0o755)
    return path, logs


def step_sanitizer(ctx, res):
    if ctx.emulated or not shutil.which("compute-sanitizer"):
        res["status"] = "skip"
        res["why"] = ("emulated run: compute-sanitizer needs a GPU (the emulator checks "
                      "memory and races itself)" if ctx.emulated else
                      "compute-sanitizer not found")
        return
    info = res.setdefault("info", {})
    failed = []
    for tool in ("memcheck", "racecheck", "synccheck"):
        if left(60) < 60:
            info[tool] = "skipped: out of time"
            continue
        rc, text = run(ctx, ["compute-sanitizer", "--tool", tool, "--error-exitcode", "99",
                             ctx.prog("check_kernels"), "--no-timing"], 150,
                       name="compute-sanitizer %s" % tool)
        summary = re.findall(r"^=+ (ERROR SUMMARY: .*|RACECHECK SUMMARY: .*)$", text, re.M)
        info["check_kernels_" + tool] = {"exit": rc, "summary": summary[-3:]}
        if rc == "timeout":
            info["check_kernels_" + tool]["note"] = "did not finish in 150 s"
        elif rc != 0:
            failed.append("check_kernels under " + tool)
    if left(60) >= 60:
        wrapper, logs = sanitizer_wrapper(ctx, "memcheck")
        sub = {}
        try:
            ipc_run(ctx, {"info": sub}, dict(ctx.env, BATON_WORKER=wrapper),
                    sizes=(4096, 1 << 20))
            errs = []
            for p in glob.glob(os.path.join(logs, "*.log")):
                with open(p, errors="replace") as f:
                    t = f.read()
                LOG.write("---- %s\n%s" % (p, t))
                errs += re.findall(r"ERROR SUMMARY: (\d+) error", t)
            sub["error_summaries"] = errs
            if any(int(e) for e in errs):
                failed.append("GPU workers under memcheck")
        except Exception as e:
            sub["error"] = str(e)[:500]
            failed.append("GPU workers under memcheck: %s" % str(e)[:200])
        info["workers_memcheck"] = sub
    if failed:
        res["status"] = "fail"
        res["why"] = "; ".join(failed)


STEPS = [("env", step_env, 60), ("kernels", step_kernels, 120), ("ipc", step_ipc, 60),
         ("transformer", step_transformer, 120), ("speed", step_speed, 120),
         ("sanitizer", step_sanitizer, 60)]


def main():
    global LOG, BUDGET
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--emulated", action="store_true")
    ap.add_argument("--budget", type=float, default=480.0,
                    help="seconds in all; a step is skipped when fewer than it needs are left")
    ap.add_argument("--only", default="", help="comma-separated step names")
    args = ap.parse_args()
    BUDGET = args.budget
    os.makedirs(args.out, exist_ok=True)
    LOG = open(os.path.join(args.out, "gpu-check.log"), "w")
    ctx = Ctx(args)
    result = {"mode": "emulated" if ctx.emulated else "device", "steps": []}
    man = os.path.join(ctx.pack, "manifest.json")
    if os.path.exists(man):
        with open(man) as f:
            result["pack"] = json.load(f)
        ctx.need_glibc = result["pack"].get("glibc_needed")
    only = [s for s in args.only.split(",") if s]
    for name, fn, need in STEPS:
        if only and name not in only:
            continue
        res = {"name": name, "status": "pass"}
        if time.time() - T0 > args.budget - need:
            # On the emulator there is time for every step: running out of
            # it there is a failure of the check itself.
            res.update(status="fail" if ctx.emulated else "skip",
                       why="out of time: %.0f s of the %.0f s budget used" %
                       (time.time() - T0, args.budget))
        else:
            log("== %s" % name)
            t = time.time()
            try:
                fn(ctx, res)
            except Exception as e:  # a step's failure is recorded; the others still run
                import traceback
                LOG.write(traceback.format_exc())
                res["status"] = "fail"
                res["why"] = "%s: %s" % (type(e).__name__, str(e)[:1500])
            res["seconds"] = round(time.time() - t, 1)
        log("%-4s %s%s" % ({"pass": "ok", "fail": "FAIL", "skip": "SKIP"}[res["status"]], name,
                           (": " + res["why"]) if res.get("why") else ""))
        result["steps"].append(res)
        with open(os.path.join(args.out, "gpu-check.json"), "w") as f:
            json.dump(result, f, indent=1)
    shutil.rmtree(ctx.work, ignore_errors=True)
    counts = {k: sum(1 for s in result["steps"] if s["status"] == k)
              for k in ("pass", "fail", "skip")}
    result["seconds"] = round(time.time() - T0, 1)
    with open(os.path.join(args.out, "gpu-check.json"), "w") as f:
        json.dump(result, f, indent=1)
    log("gpu check (%s): %d passed, %d failed, %d skipped in %.0f s" %
        (result["mode"], counts["pass"], counts["fail"], counts["skip"], result["seconds"]))
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
