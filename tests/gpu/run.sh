#!/usr/bin/env bash
# Builds and runs the CUDA checks and timings on a machine with a GPU (the
# same checks run on the CUDA emulator in `make test`: tests/cudaemu/run.sh):
# check_kernels.c (every kernel of kernels/cuda/ against its C reference,
# then timed against a device-to-device copy and cuBLAS), check_ops.c (every
# op of the executables on the CPU and CUDA op tables) and check_exec.c (executables on the
# CUDA device against the CPU device, CUDA-graph replay, decode-step times
# and the scheduler's predictions).  On a machine without a GPU the program
# prints "no CUDA device: skipped" and this script exits 0.
# Output: tables on stdout, JSON in $OUT/gpu_kernels.json and
# $OUT/gpu_exec.json when OUT is set, else under $BUILD/gpu/.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "no nvcc: CUDA kernels not built; skipped"
  exit 0
fi
make --no-print-directory BUILD="$BUILD" CUDA=1 gpu-check
rc=0
BUILD="$BUILD" "$BUILD/gpu/check_kernels" || rc=$?
BUILD="$BUILD" "$BUILD/gpu/check_ops" || rc=$?
BUILD="$BUILD" "$BUILD/gpu/check_exec" || rc=$?
exit $rc
