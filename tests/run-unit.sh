#!/usr/bin/env bash
# Runs each CMocka test binary given and prints one closing line with the
# tests passed, failed and skipped (CMocka's own counts, added up); a
# program that dies before its summary counts as one failure.  Exits
# non-zero on any failure.  With TEST_COUNTS set, also appends
# "unit PASS FAIL SKIP" to that file (tests/summary.sh adds those up).
#
# Each program runs under a time limit (tests/limits.sh): 300 s, 900 s for
# those that run the default model or Whisper, times $BATON_TEST_TIMEOUT_SCALE.  One
# that runs out of time is stopped with every process it started and
# counted as one failure.
set -u
. "$(dirname "$0")/limits.sh"
pass=0; fail=0; skip=0; failed=()
out=$(mktemp)
trap 'rm -f "$out"' EXIT
count() { sed -n "s/^\[  $1 *\] \([0-9]*\) test(s).*/\1/p" "$out" | tail -1; }
limit_for() {
  case $1 in
    test_hf|test_transformer|test_whisper_engine) echo 900 ;;
    *) echo 300 ;;
  esac
}
for t in "$@"; do
  name=$(basename "$t")
  run_limited "$name" "$(limit_for "$name")" "$out" -- "$t"; rc=$limited_rc
  p=$(count PASSED); f=$(count FAILED); s=$(count SKIPPED)
  pass=$((pass + ${p:-0})); skip=$((skip + ${s:-0}))
  if [ "$rc" -eq 124 ]; then
    echo "FAIL $name: timed out after $limited_s s"
    fail=$((fail + 1))
    failed+=("$name")
  elif [ "$rc" -ne 0 ]; then
    # A crash prints no summary: count the program as one failure.
    fail=$((fail + ${f:-1}))
    failed+=("$name")
  fi
done
echo "unit tests: ${pass} passed, ${fail} failed, ${skip} skipped${failed:+ (failing programs: ${failed[*]})}"
[ -n "${TEST_COUNTS:-}" ] && echo "unit $pass $fail $skip" >> "$TEST_COUNTS"
[ "$fail" -eq 0 ]
