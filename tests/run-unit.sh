#!/usr/bin/env bash
# Runs each CMocka test binary given and prints one closing line with the
# tests passed, failed and skipped (CMocka's own counts, added up); a
# program that dies before its summary counts as one failure.  Exits
# non-zero on any failure.  With TEST_COUNTS set, also appends
# "unit PASS FAIL SKIP" to that file (tests/summary.sh adds those up).
set -u
pass=0; fail=0; skip=0; failed=()
out=$(mktemp)
trap 'rm -f "$out"' EXIT
count() { sed -n "s/^\[  $1 *\] \([0-9]*\) test(s).*/\1/p" "$out" | tail -1; }
for t in "$@"; do
  # Into a file, then shown: a pipe would wait for any stray child process
  # that still holds the test's stdout.
  "$t" >"$out" 2>&1; rc=$?
  cat "$out"
  p=$(count PASSED); f=$(count FAILED); s=$(count SKIPPED)
  pass=$((pass + ${p:-0})); skip=$((skip + ${s:-0}))
  if [ "$rc" -ne 0 ]; then
    # A crash prints no summary: count the program as one failure.
    fail=$((fail + ${f:-1}))
    failed+=("$(basename "$t")")
  fi
done
echo "unit tests: ${pass} passed, ${fail} failed, ${skip} skipped${failed:+ (failing programs: ${failed[*]})}"
[ -n "${TEST_COUNTS:-}" ] && echo "unit $pass $fail $skip" >> "$TEST_COUNTS"
[ "$fail" -eq 0 ]
