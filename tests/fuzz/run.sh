#!/usr/bin/env bash
# Runs the libFuzzer targets built by `make fuzz-build` (see tests/README.md).
#
#   run.sh replay BUILD NAME...            each target once over every file of
#                                          tests/fuzz/corpus/NAME/, no fuzzing
#   run.sh fuzz BUILD NAME... -- SECONDS   each target SECONDS of fuzzing, from
#                                          its seeds and what earlier runs kept
#
# Fuzzing grows BUILD/corpus/NAME (never the committed corpus) and writes a
# crashing input to BUILD/crashes/NAME/.  Either mode exits non-zero when a
# target crashed, leaked or timed out, after running the others; the last
# line counts the targets.  Runs from the repository's root, where
# fuzz_tokenizer finds the default model.
set -u
cd "$(dirname "$0")/../.."
mode=$1; build=$2; shift 2
names=(); seconds=60
while [ $# -gt 0 ]; do
  if [ "$1" = -- ]; then seconds=$2; shift 2; continue; fi
  names+=("$1"); shift
done
pass=0; fail=0; failed=()
for name in "${names[@]}"; do
  bin=$build/fuzz/$name
  seeds=tests/fuzz/corpus/$name
  opts=(-timeout=25 -rss_limit_mb=2048)
  [ -f "tests/fuzz/dict/$name.dict" ] && opts+=("-dict=tests/fuzz/dict/$name.dict")
  if [ "$mode" = replay ]; then
    mapfile -t files < <(find "$seeds" -type f | sort)
    if [ "${#files[@]}" -eq 0 ]; then
      echo "fuzz replay: $name has no corpus in $seeds" >&2; ok=1
    else
      "$bin" "${opts[@]}" "${files[@]}" >"$build/fuzz/$name.replay.log" 2>&1; ok=$?
      [ $ok -ne 0 ] && cat "$build/fuzz/$name.replay.log" >&2
      echo "fuzz replay: $name: ${#files[@]} inputs, exit $ok"
    fi
  else
    mkdir -p "$build/corpus/$name" "$build/crashes/$name"
    echo "fuzz: $name for ${seconds}s"
    "$bin" "${opts[@]}" -max_total_time="$seconds" -print_final_stats=1 \
      -artifact_prefix="$build/crashes/$name/" "$build/corpus/$name" "$seeds" \
      >"$build/fuzz/$name.log" 2>&1; ok=$?
    grep -E '^stat::number_of_executed_units|^stat::new_units_added|^#[0-9]+ +DONE' \
      "$build/fuzz/$name.log"
    if [ $ok -ne 0 ]; then
      tail -n 60 "$build/fuzz/$name.log" >&2
      echo "fuzz: $name failed (exit $ok); inputs in $build/crashes/$name/, log $build/fuzz/$name.log" >&2
    fi
  fi
  if [ $ok -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); failed+=("$name"); fi
done
echo "fuzz $mode: ${pass} targets passed, ${fail} failed${failed:+ (${failed[*]})}"
[ "$fail" -eq 0 ]
