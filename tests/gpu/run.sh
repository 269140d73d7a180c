#!/usr/bin/env bash
# Builds and runs the CUDA kernel checks and timings (check_kernels.c): every
# kernel of kernels/cuda/ against its C reference, then timed against a
# device-to-device copy and cuBLAS.  On a machine without a GPU the program
# prints "no CUDA device: skipped" and this script exits 0.
# Output: a table on stdout, JSON in $OUT/gpu_kernels.json when OUT is set,
# else $BUILD/gpu/gpu_kernels.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "no nvcc: CUDA kernels not built; skipped"
  exit 0
fi
make --no-print-directory BUILD="$BUILD" CUDA=1 gpu-check
BUILD="$BUILD" "$BUILD/gpu/check_kernels"
