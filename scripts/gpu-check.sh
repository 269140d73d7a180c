#!/usr/bin/env bash
# The GPU check: baton's CUDA code on a real GPU in one prepared command,
# made to fit a short loan of a GPU machine that has the CUDA toolkit,
# NCCL, PyTorch and transformers but none of the Debian libraries baton
# links and no network.  tests/gpu/README.md says what it checks and holds
# the results of each run on a GPU.
#
#   scripts/gpu-check.sh [--pack]   here: build with nvcc (CUDA=1, build/cuda)
#                                   and pack what the GPU machine needs into
#                                   gpu-pack/ (ignored by git, at most 64 MiB)
#   scripts/gpu-check.sh --device   there, from the repository's root with
#                                   gpu-pack/ beside it: run every step, write
#                                   $OUT/gpu-check.json and $OUT/gpu-check.log
#   scripts/gpu-check.sh --emulated here: the same pack and the same steps
#                                   from the emulated build (build/emu) on the
#                                   CUDA emulator, with a tiny model; part of
#                                   `make test`, so that the script cannot rot
#
# The pack (gpu-pack/pack.tar.xz): batond, baton-worker, check_kernels,
# check_ops and check_exec; the shared libraries ldd finds for them but
# glibc's, CUDA's and NCCL's, which the GPU machine has (gpu_check.py finds
# them in the CUDA toolkit and in the nvidia-* Python packages there); the
# Python client with its generated protobuf module; and wheels of pyzmq
# and protobuf for the GPU machine's Python (3.12), which has neither.  The
# steps themselves are tests/gpu/gpu_check.py, which travels with the
# repository.  BUDGET (seconds, default 480) bounds the device run: a step
# that would start past it is skipped, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:---pack}
PACK_DIR=${PACK_DIR:-gpu-pack}
LIMIT=$((64 << 20))
# Temporary folders, removed however the script ends.
cleanup=()
trap 'rm -rf "${cleanup[@]}"' EXIT

# pack BUILD DEST WHEELS: the programs of BUILD and what they need, as
# DEST/pack.tar.xz and DEST/manifest.json.
pack() {
  local build=$1 dest=$2 wheels=$3 stage
  stage=$(mktemp -d)
  cleanup+=("$stage")
  mkdir -p "$stage/bin" "$stage/lib" "$stage/py" "$dest"
  for p in batond baton-worker; do cp "$build/$p" "$stage/bin/"; done
  for p in check_kernels check_ops check_exec; do cp "$build/gpu/$p" "$stage/bin/"; done
  # Every library the programs resolve here, but glibc's (the loader's own
  # family), the C++ runtime's (a GPU machine's is newer, and its own tools
  # need that one) and CUDA's and NCCL's (the GPU machine's own must be
  # used).
  if ldd "$stage"/bin/* | grep -q "not found"; then
    echo "gpu-check: a library of the programs is not found here:" >&2
    ldd "$stage"/bin/* | grep "not found" >&2
    return 1
  fi
  ldd "$stage"/bin/* | awk '/=> \// {print $1, $3}' | sort -u | while read -r name path; do
    case $name in
      ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libutil.so*) ;;
      libstdc++.so*|libgcc_s.so*) ;;
      libcuda.so*|libcudart.so*|libcublas*|libnccl*|libnvidia*|libnvrtc*|libnvJitLink*|libcufft*) ;;
      *) cp -L "$path" "$stage/lib/$name" ;;
    esac
  done
  cp client/python/baton_client.py "$build/gen/python/baton_pb2.py" "$stage/py/"
  mkdir -p "$stage/whl"
  if [ "$wheels" = yes ]; then
    # The GPU machine's Python is 3.12 and cannot reach an index: the
    # client's two packages travel as wheels.  protobuf 4.21 in pure Python
    # reads the module Debian's protoc 3.21 generates.
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      -d "$stage/whl" pyzmq==26.2.0
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation py --abi none --platform any -d "$stage/whl" protobuf==4.21.12
  fi
  python3 - "$stage" "$build" >"$stage/manifest.json" <<'EOF'
import json, os, subprocess, sys
stage, build = sys.argv[1], sys.argv[2]
files = {}
for sub in ("bin", "lib", "py", "whl"):
    for f in sorted(os.listdir(os.path.join(stage, sub))):
        files["%s/%s" % (sub, f)] = os.path.getsize(os.path.join(stage, sub, f))
def git(*a):
    try:
        return subprocess.check_output(["git"] + list(a), text=True).strip()
    except Exception:
        return "unknown"
# The newest glibc symbol version anything packed needs: the GPU machine's
# glibc must be at least that.
need = "GLIBC_2.2.5"
def key(v):
    return [int(x) for x in v.split("_")[1].split(".")]
for sub in ("bin", "lib"):
    for f in sorted(os.listdir(os.path.join(stage, sub))):
        out = subprocess.run(["objdump", "-T", os.path.join(stage, sub, f)],
                             capture_output=True, text=True).stdout
        for tok in out.replace("(", " ").replace(")", " ").split():
            if tok.startswith("GLIBC_2.") and key(tok) > key(need):
                need = tok
print(json.dumps({"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain")),
                  "build": build, "glibc_needed": need, "files": files}, indent=1))
EOF
  cp "$stage/manifest.json" "$dest/manifest.json"
  tar -C "$stage" -cJf "$dest/pack.tar.xz" .
  local size
  size=$(stat -c %s "$dest/pack.tar.xz")
  echo "packed $dest/pack.tar.xz: $((size >> 20)) MiB ($size bytes)"
  if [ "$size" -gt "$LIMIT" ]; then
    echo "gpu-check: the pack is over 64 MiB, more than one call to the GPU machine carries" >&2
    return 1
  fi
}

# unpack DEST: the pack into DEST.
unpack() {
  rm -rf "$1"
  mkdir -p "$1"
  tar -C "$1" -xJf "$PACK_DIR/pack.tar.xz"
}

case $mode in
  --pack)
    if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
      echo "gpu-check: no nvcc here (nor /usr/local/cuda/bin/nvcc): the CUDA build cannot be made" >&2
      exit 2
    fi
    make --no-print-directory CUDA=1 BUILD=build/cuda -j"$(nproc)" \
      build/cuda/batond build/cuda/baton-worker gpu-check build/cuda/gen/python/baton_pb2.py
    pack build/cuda "$PACK_DIR" yes
    echo "on the GPU machine: bash scripts/gpu-check.sh --device   (carry $PACK_DIR)"
    ;;
  --device)
    [ -f "$PACK_DIR/pack.tar.xz" ] || { echo "gpu-check: no $PACK_DIR/pack.tar.xz: run scripts/gpu-check.sh --pack first" >&2; exit 2; }
    OUT=${OUT:-$PWD/gpu-check-out}
    mkdir -p "$OUT"
    dest=/tmp/baton-gpu-pack
    unpack "$dest"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/baton-gpu-site "$dest"/whl/*.whl
    export PYTHONPATH=/tmp/baton-gpu-site${PYTHONPATH:+:$PYTHONPATH}
    export PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python
    exec python3 tests/gpu/gpu_check.py --pack "$dest" --out "$OUT" --budget "${BUDGET:-480}"
    ;;
  --emulated)
    BUILD=${BUILD:-build/emu}
    make --no-print-directory EMU=1 BUILD="$BUILD" emu-programs "$BUILD/gen/python/baton_pb2.py"
    OUT=${OUT:-$BUILD/gpu-check-emulated}
    work=/tmp/baton-gpu-check-emu-$$
    rm -rf "$work"
    mkdir -m 700 "$work"
    cleanup+=("$work")
    PACK_DIR=$work/pack
    pack "$BUILD" "$PACK_DIR" no
    unpack "$work/unpacked"
    # The system's Python: Debian's python3-zmq and python3-protobuf.
    /usr/bin/python3 tests/gpu/gpu_check.py --emulated --pack "$work/unpacked" --out "$OUT" \
      --budget "${BUDGET:-1200}"
    ;;
  *)
    echo "usage: scripts/gpu-check.sh [--pack | --device | --emulated]" >&2
    exit 2
    ;;
esac
