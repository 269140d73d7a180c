#!/usr/bin/env bash
# Adds up the "SUITE PASS FAIL SKIP" lines the test runners appended to the
# file given (tests/run-unit.sh, tests/integration/run.sh,
# tests/cudaemu/run.sh) and prints the totals, one line per suite and one
# for all.  A suite that wrote no line did not run to its end.
set -u
f=$1
[ -s "$f" ] || { echo "tests: no suite reported counts"; exit 0; }
awk '{ p += $2; f += $3; s += $4; printf "  %-12s %5d passed, %4d failed, %4d skipped\n", $1, $2, $3, $4 }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$f"
