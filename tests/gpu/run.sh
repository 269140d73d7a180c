#!/usr/bin/env bash
# Builds and runs the CUDA checks and timings on a machine with a GPU (the
# same checks run on the CUDA emulator in `make test`: tests/cudaemu/run.sh):
# check_kernels.c (every kernel of kernels/cuda/ against its C reference,
# then timed against a device-to-device copy and cuBLAS), check_ops.c (every
# op of the executables on the CPU and CUDA op tables) and check_exec.c (executables on the
# CUDA device against the CPU device, CUDA-graph replay, decode-step times
# and the scheduler's predictions).  Without nvcc or without a GPU it prints
# a line starting with SKIP and exits 77: a skip, never a pass.
# Output: tables on stdout, JSON in $OUT/gpu_kernels.json and
# $OUT/gpu_exec.json when OUT is set, else under $BUILD/gpu/.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "SKIP: no nvcc, so the CUDA kernels are not built"
  exit 77
fi
make --no-print-directory BUILD="$BUILD" CUDA=1 gpu-check
# A failure (any status but 0 and 77) wins over a skip (77).
rc=0
for c in check_kernels check_ops check_exec; do
  BUILD="$BUILD" "$BUILD/gpu/$c" && r=0 || r=$?
  if [ $r -ne 0 ] && [ $r -ne 77 ]; then rc=1; elif [ $r -eq 77 ] && [ $rc -eq 0 ]; then rc=77; fi
done
exit $rc
