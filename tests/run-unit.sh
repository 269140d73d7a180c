#!/usr/bin/env bash
# Runs each CMocka test binary given and prints one closing line,
# "N passed, N failed", counting binaries; exits non-zero on any failure.
set -u
pass=0; fail=0; failed=()
for t in "$@"; do
  if "$t"; then pass=$((pass + 1)); else fail=$((fail + 1)); failed+=("$(basename "$t")"); fi
done
echo "unit test programs: ${pass} passed, ${fail} failed${failed:+ (${failed[*]})}"
[ "$fail" -eq 0 ]
