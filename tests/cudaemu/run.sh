#!/usr/bin/env bash
# Runs the CUDA code of baton on the CPU, through the CUDA emulator
# (cudaemu/, docs/cuda-emulator.md), from the emulated build in $BUILD
# (default build/emu; `make emu` builds it).
#
#   tests/cudaemu/run.sh [fast|slow|all]
#
# "fast" (the default; `make emu-test`, part of `make test`) runs all but
# the parts that take minutes on the emulator: the transformer's
# whole-model tests, and the chat and transcribe graphs on GPU workers.  "slow" (`make
# emu-slow-test`, part of `make slow-test`) runs only those; "all" both.
# The closing counts go to $TEST_COUNTS as the suite "cudaemu" (fast, all)
# or "cudaemu-slow".  The parts:
#   - the emulator's own tests (tests/cudaemu/test_emu.cu);
#   - tests/gpu/check_kernels (every CUDA kernel against its C reference),
#     tests/gpu/check_ops (every op of the executables on every device
#     flavour against the reference) and tests/gpu/check_exec (executables
#     on the CUDA device against the CPU device, CUDA-graph capture and
#     replay, two streams, weights shared by borrowing) under each
#     seed of $CUDAEMU_SEEDS (default "1 2 3"): the seed orders warps,
#     blocks and streams, so an order-dependent bug shows under some seed.
#   - the transformer backend's tests on cuda:0 (tests/unit/test_transformer.c);
#   - GPU workers end to end (tests/cudaemu/test_gpu_worker.py): real batond
#     and baton-worker processes of the emulated build, CUDA IPC between
#     workers, CPU<->GPU edges, the chat graph on cuda:0 against the CPU
#     (also split over two workers, and tensor parallel over two), a tp: 2
#     group's forming and restart, SIGKILL of a GPU worker, GPU tensors
#     between two emulated hosts over NCCL (`host:`), and
#     --check-config.
# A check passes when it exits 0 and the emulator reported no problem (the
# emulator's tests provoke problems on purpose: for them, the exit status).
# Prints one line per program and a closing "cudaemu: N passed, N failed,
# N skipped" (programs passed and failed; skipped parts, each a SKIP line);
# exits non-zero on any failure.  The GPU worker test's own lines show as
# they come; the other programs' output only when they fail.
#
# Each program runs under a time limit (its third argument to run, several
# times what it takes on a loaded 2-core machine, times
# $BATON_TEST_TIMEOUT_SCALE, and 3 more under ASan; tests/limits.sh): past
# it, it is stopped with every process it started and fails.  Its folders
# go under $BATON_TEST_LOGDIR (/tmp/baton-test-cudaemu-NAME-XXXXXX), kept
# on a failure with the tails of the logs in them.
set -u
cd "$(dirname "$0")/../.."
. tests/limits.sh
BUILD=${BUILD:-build/emu}
part=${1:-fast}
case $part in
  fast) suite=cudaemu ;;
  slow) suite=cudaemu-slow ;;
  all) suite=cudaemu ;;
  *) echo "usage: tests/cudaemu/run.sh [fast|slow|all]" >&2; exit 2 ;;
esac
SEEDS=${CUDAEMU_SEEDS:-"1 2 3"}
# The transformer's tests on cuda:0 that take a minute or more each.
TF_SLOW="test_prefill_and_greedy_match_reference test_sampling_reproducible test_tensor_parallel_matches_reference test_prefix_cache_exact test_batch_invariant test_same_ids_under_load"
# Four emulated GPUs: the multi-process all-reduce checks run 2 and 3 ranks.
export CUDAEMU_DEVICES=${CUDAEMU_DEVICES:-4}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
pass=0; fail=0; skip=0

# run NAME CLEAN SECONDS [--stream] CMD...: CLEAN "clean" fails the
# program on an emulator problem in its output, "any" leaves that to it;
# --stream shows its output as it comes.
run() {
  local name=$1 clean=$2 limit=$3 quiet=--quiet; shift 3
  [ "$1" = --stream ] && { quiet=; shift; }
  run_limited "$name" "$limit" "$log" $quiet \
    --evidence "baton-test-cudaemu-$(tr -c 'A-Za-z0-9_\n' - <<<"$name" | cut -c1-32)-" -- "$@"
  if [ "$limited_rc" -eq 0 ] && { [ "$clean" = any ] || ! grep -q "cudaemu: problem" "$log"; }; then
    pass=$((pass + 1)); echo "ok   $name ($(grep -Eo '^[0-9]+ checks, [0-9]+ failed|[0-9]+ test\(s\) run|[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$log" | tail -1))"
    # Parts of a program that could not run: each SKIP line is a skip.
    [ -z "$quiet" ] || grep -E '^SKIP' "$log" || true
    skip=$((skip + $(grep -cE '^SKIP' "$log")))
  else
    fail=$((fail + 1))
    if [ "$limited_rc" -eq 124 ]; then echo "FAIL $name: timed out after $limited_s s"
    else echo "FAIL $name (exit $limited_rc)"; fi
    [ -z "$quiet" ] || tail -40 "$log" | sed 's/^/    /'
  fi
}

if [ "$part" != slow ]; then
  run "emulator tests" any 300 "$BUILD/cudaemu/test_emu"
  for s in $SEEDS; do
    run "check_kernels, seed $s" clean 300 env CUDAEMU_SEED="$s" "$BUILD/gpu/check_kernels"
    run "check_ops, seed $s" clean 300 env CUDAEMU_SEED="$s" CHECK_OPS_SEED="$s" "$BUILD/gpu/check_ops"
    run "check_exec, seed $s" clean 300 env CUDAEMU_SEED="$s" "$BUILD/gpu/check_exec"
  done
fi
# The transformer backend on an emulated GPU (TF_TEST_DEVICE=cuda:0), against
# the same independent reference as on the CPU, its sampling on the device
# against the CPU's, its FFN split over two emulated GPUs (tp 2, NCCL
# between two processes) against the reference, the prefix cache's exact
# tokens, and batch invariance (a prompt's logits in any chunking, and
# beside fifteen other requests).  The emulator is slow on a whole model,
# so seven of its tests run: the load report in the fast part, the six of
# $TF_SLOW in the slow part (CUDAEMU_TF_TESTS names others; "*" runs them
# all).
case $part in
  fast) TF_TESTS=${CUDAEMU_TF_TESTS:-test_describe} ;;
  slow) TF_TESTS=${CUDAEMU_TF_TESTS:-$TF_SLOW} ;;
  all) TF_TESTS=${CUDAEMU_TF_TESTS:-"$TF_SLOW test_describe"} ;;
esac
if [ -f models/smollm2-135m-instruct-q4_1.gguf ]; then
  for t in $TF_TESTS; do
    run "transformer on cuda:0, $t" clean 1200 env TF_TEST_DEVICE=cuda:0 TF_TEST_FILTER="$t" \
      "$BUILD/tests/test_transformer"
  done
elif [ "${BATON_CI:-}" = 1 ]; then
  fail=$((fail + 1))
  echo "FAIL transformer on cuda:0: models/smollm2-135m-instruct-q4_1.gguf is absent, and with BATON_CI=1 the model tests must run"
else
  skip=$((skip + 1))
  if [ "${BATON_OFFLINE:-}" = 1 ]; then
    echo "SKIP transformer on cuda:0: models/smollm2-135m-instruct-q4_1.gguf is absent (BATON_OFFLINE=1: scripts/fetch-model.sh did not fetch it)"
  else
    echo "SKIP transformer on cuda:0: models/smollm2-135m-instruct-q4_1.gguf is absent (scripts/fetch-model.sh)"
  fi
fi
# Whisper's encoder and decoder on an emulated GPU: the JFK clip's greedy
# ids against faster-whisper's, as on the CPU (WHISPER_TEST_FILTER picks the
# test; the emulator takes about a minute over one 30-second window).
if [ "$part" != slow ]; then
  if [ "${BATON_TEST_SAN:-}" = 1 ]; then
    # Under ASan the emulated encoder takes 6 to 7 minutes, which CI's
    # time cannot spare: `make test` runs this test without the
    # sanitizers, and test_whisper_engine runs the engine under them.
    skip=$((skip + 1))
    echo "SKIP whisper on cuda:0 under ASan: minutes on the emulator; make test runs it"
  elif [ -f models/whisper-base/model.bin ] && [ -f models/samples/jfk.wav ]; then
    run "whisper on cuda:0, test_ids_f32" clean 1200 env WHISPER_TEST_DEVICE=cuda:0 \
      WHISPER_TEST_FILTER=test_ids_f32 "$BUILD/tests/test_whisper_engine"
  elif [ "${BATON_CI:-}" = 1 ]; then
    fail=$((fail + 1))
    echo "FAIL whisper on cuda:0: models/whisper-base or models/samples/jfk.wav is absent, and with BATON_CI=1 the model tests must run"
  else
    skip=$((skip + 1))
    echo "SKIP whisper on cuda:0: models/whisper-base or models/samples/jfk.wav is absent (scripts/fetch-model.sh whisper-base jfk)"
  fi
fi
# GPU workers end to end; the test fails itself on an emulator problem in
# the daemon's log (the workers' stderr).
# CUDAEMU_GPU_WORKER_TESTS names the tests to run; by default the fast part
# runs all but the chat graph's test (minutes), the slow part that one.
case $part in
  fast) gw=${CUDAEMU_GPU_WORKER_TESTS:---fast} ;;
  slow) gw=${CUDAEMU_GPU_WORKER_TESTS:---slow} ;;
  all) gw=${CUDAEMU_GPU_WORKER_TESTS:-} ;;
esac
# shellcheck disable=SC2086
run "GPU workers end to end" any 3600 --stream env BUILD="$BUILD" /usr/bin/python3 tests/cudaemu/test_gpu_worker.py $gw
# The GPU check a GPU machine runs (scripts/gpu-check.sh), dry: the same pack
# and the same steps from this build, a tiny model, on the emulator.  Its
# steps fail on an emulator problem themselves.
if [ "$part" != slow ]; then
  run "scripts/gpu-check.sh --emulated" any 1800 env BUILD="$BUILD" OUT="$BUILD/gpu-check-emulated" \
    bash scripts/gpu-check.sh --emulated
fi
echo "$suite: ${pass} passed, ${fail} failed, ${skip} skipped"
[ -n "${TEST_COUNTS:-}" ] && echo "$suite $pass $fail $skip" >> "$TEST_COUNTS"
[ "$fail" -eq 0 ]
