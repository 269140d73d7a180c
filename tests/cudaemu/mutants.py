#!/usr/bin/env python3
"""Mutation check of the CUDA emulator: plants one known bug at a time in a
copy of the CUDA sources and checks that the emulated GPU checks catch it.

Each mutant is a bug of the kind the emulator exists to find: a missing
__syncthreads, a half-warp shuffle mask, an early return before a barrier,
a missing shared-memory opt-in, a transposed cuBLAS call, a wrong attention
scale, a shared-memory index one past the end, a missing cross-stream event
wait, an allocation zeroed on the wrong stream.  For each, the script
rebuilds the emulated flavour in a scratch copy of the repository and runs
tests/gpu/check_kernels and tests/gpu/check_exec under seeds 1..3 until one
fails (a failed check, a CUDA error, or a problem the emulator reported).

usage: tests/cudaemu/mutants.py [--keep] [NAME...]   (make emu-mutants)
Prints a table and exits 1 if any mutant survives.  Takes a few minutes.
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (name, file, text to replace (must occur exactly once), replacement)
MUTANTS = [
    ("block sum: no barrier after the warp sums", "kernels/cuda/kcuda.cuh",
     "        sh[warp] = v;\n    __syncthreads();\n    v = (int)threadIdx.x < (int)(blockDim.x >> 5) ? sh[threadIdx.x] : 0.0f;",
     "        sh[warp] = v;\n    v = (int)threadIdx.x < (int)(blockDim.x >> 5) ? sh[threadIdx.x] : 0.0f;"),
    ("argmax: no barrier before thread 0 merges", "kernels/cuda/norm.cu",
     "        si[warp] = bi;\n    }\n    __syncthreads();\n",
     "        si[warp] = bi;\n    }\n"),
    ("warp sum: half-warp mask", "kernels/cuda/kcuda.cuh",
     "        v += __shfl_xor_sync(0xffffffffu, v, o);",
     "        v += __shfl_xor_sync(0x0000ffffu, v, o);"),
    ("rmsnorm: early return before the block sum", "kernels/cuda/norm.cu",
     "        ss += xr[i] * xr[i];\n    ss = k_block_sum(ss, sh);",
     "        ss += xr[i] * xr[i];\n    if (threadIdx.x >= 128)\n        return;\n    ss = k_block_sum(ss, sh);"),
    ("decode attention: no shared-memory opt-in", "kernels/cuda/attention.cu",
     "        K_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel,",
     "        if (0) K_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel,"),
    ("matmul: cuBLAS operands transposed", "kernels/cuda/blas.cu",
     "cublasSgemmStridedBatched(blas[dev], CUBLAS_OP_T, CUBLAS_OP_N,",
     "cublasSgemmStridedBatched(blas[dev], CUBLAS_OP_N, CUBLAS_OP_T,"),
    ("prefill attention: wrong scale", "kernels/cuda/attention.cu",
     "float scale = 1.0f / sqrtf((float)hd), m = -INFINITY, l = 0;",
     "float scale = 1.0f / sqrtf((float)hd + 1.0f), m = -INFINITY, l = 0;"),
    ("prefill attention: shared index one past the end", "kernels/cuda/attention.cu",
     "        s[tid] = p;\n",
     "        s[tid + 1 < PRE_THREADS ? tid : tid + 1] = p;\n"),
    ("executor: cross-stream event waits dropped", "kernels/exec.c",
     "            if (d->queue_wait(dv, x->q[st], x->ev[s->wait_op[w]]))",
     "            if (0 && d->queue_wait(dv, x->q[st], x->ev[s->wait_op[w]]))"),
    ("device alloc: zeroed on the legacy stream, unsynced", "kernels/cuda/device.cu",
     "    if (e == cudaSuccess)\n        e = cudaStreamSynchronize(cudaStreamLegacy);\n",
     ""),
    ("sampler: NaN may win", "kernels/cuda/sample.cu",
     "            if (bi < 0 || k_logit_better(x[i], i, bv, bi)) {",
     "            if (bi < 0 || x[i] > bv || (x[i] == bv && i < bi)) {"),
]

CHECKS = ["check_kernels", "check_exec"]
SEEDS = ["1", "2", "3"]


def sh(cmd, cwd, env=None, timeout=900):
    return subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def copy_tree(dst):
    """The working tree without build outputs."""
    def ignore(d, names):
        return [n for n in names if d == ROOT and n in ("build", ".git", "models", ".cache")]
    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)


def build(work):
    r = sh(["make", "--no-print-directory", "-j2", "EMU=1", "BUILD=build/emu",
            "build/emu/gpu/check_kernels", "build/emu/gpu/check_exec"], work)
    return r.returncode == 0, r.stdout


def caught(work):
    """(True, how) when some check under some seed fails."""
    for seed in SEEDS:
        for c in CHECKS:
            env = dict(os.environ, CUDAEMU_SEED=seed)
            try:
                r = sh(["build/emu/gpu/" + c], work, env=env, timeout=600)
            except subprocess.TimeoutExpired:
                return True, "%s seed %s: timed out" % (c, seed)
            out = r.stdout
            if r.returncode != 0 or "cudaemu: problem" in out:
                why = next((l for l in out.splitlines() if "cudaemu: problem" in l), None) or \
                    next((l for l in out.splitlines() if l.startswith("FAIL")), None) or \
                    "exit %d" % r.returncode
                return True, "%s seed %s: %s" % (c, seed, why[:150])
    return False, "every check passed under seeds " + ",".join(SEEDS)


def main():
    args = [a for a in sys.argv[1:] if a != "--keep"]
    chosen = [m for m in MUTANTS if not args or any(a in m[0] for a in args)]
    work = tempfile.mkdtemp(prefix="baton-mutants-")
    try:
        copy_tree(work + "/src")
        work += "/src"
        ok, log = build(work)
        if not ok:
            print(log[-3000:])
            sys.exit("the unmutated emulated build failed")
        base_ok, base_why = caught(work)
        if base_ok:
            sys.exit("the unmutated checks already fail: " + base_why)
        survived = 0
        print("%-52s %s" % ("mutant", "result"))
        for name, path, old, new in chosen:
            full = os.path.join(work, path)
            text = open(full).read()
            if text.count(old) != 1:
                print("%-52s NOT APPLIED (the text to replace occurs %d times)"
                      % (name, text.count(old)))
                survived += 1
                continue
            open(full, "w").write(text.replace(old, new))
            ok, log = build(work)
            if not ok:
                verdict = "caught by the compiler"
                hit = True
            else:
                hit, verdict = caught(work)
            open(full, "w").write(text)
            survived += not hit
            print("%-52s %s %s" % (name, "caught  " if hit else "SURVIVED", verdict))
        print("%d mutants, %d caught, %d survived" % (len(chosen), len(chosen) - survived,
                                                       survived))
        sys.exit(1 if survived else 0)
    finally:
        if "--keep" not in sys.argv:
            shutil.rmtree(os.path.dirname(work) if work.endswith("/src") else work,
                          ignore_errors=True)


if __name__ == "__main__":
    main()
