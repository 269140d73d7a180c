#!/usr/bin/env bash
# Runs test suites one after another for `make test` and `make asan-test`:
# each one is built, then run, also when one before it failed; then the
# totals are printed (tests/summary.sh).  Exits non-zero when a suite
# failed or did not run.
#
#   [LEFTOVERS_SNAPSHOT=FILE] tests/run-suites.sh COUNTS MAKE-COMMAND... -- SUITE...
#
# COUNTS is the file each runner appends "SUITE PASS FAIL SKIP" to
# ($TEST_COUNTS); it is emptied first.  MAKE-COMMAND is the make command
# line the suites' targets are made with (with BUILD= and SAN= for
# asan-test).  SUITE is unit, integration, cudaemu or cudaemu-slow:
#
#   suite        built by                   run by
#   unit         all unit-build             unit (tests/run-unit.sh)
#   integration  integration-build          integration (tests/integration/run.sh)
#   cudaemu      emu                        emu-test (tests/cudaemu/run.sh)
#   cudaemu-slow emu                        emu-slow-test (tests/cudaemu/run.sh slow)
#
# A suite whose build failed, or whose runner ended without reporting its
# counts, gets the line "SUITE notrun REASON" in COUNTS, which summary.sh
# shows as "SUITE: not run (REASON)".  With LEFTOVERS_SNAPSHOT (a file of
# tests/leftovers.sh snapshot), what the suites left in /dev/shm and /tmp
# is checked last, as the suite "leftovers".
set -u
counts=$1; shift
mk=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do mk+=("$1"); shift; done
[ $# -gt 0 ] && shift
: >"$counts"
export TEST_COUNTS=$counts
rc=0
for suite in "$@"; do
  case $suite in
    unit) build=(all unit-build); run=unit ;;
    integration) build=(integration-build); run=integration ;;
    cudaemu) build=(emu); run=emu-test ;;
    cudaemu-slow) build=(emu); run=emu-slow-test ;;
    *) echo "run-suites: unknown suite '$suite'" >&2; exit 2 ;;
  esac
  "${mk[@]}" "${build[@]}"; r=$?
  if [ "$r" -ne 0 ]; then
    echo "$suite notrun its build failed (make ${build[*]}: exit $r)" >>"$counts"
    rc=1
    continue
  fi
  "${mk[@]}" "$run"; r=$?
  [ "$r" -eq 0 ] || rc=1
  grep -q "^$suite [0-9]" "$counts" ||
    echo "$suite notrun its runner ended (exit $r) before reporting counts" >>"$counts"
done
# What the suites left behind (tests/leftovers.sh), against the snapshot
# taken before them, when the caller took one.
if [ -n "${LEFTOVERS_SNAPSHOT:-}" ]; then
  bash "$(dirname "$0")/leftovers.sh" check "$LEFTOVERS_SNAPSHOT" "$rc" || rc=1
  set -- "$@" leftovers
fi
bash "$(dirname "$0")/summary.sh" "$counts" "$@" || rc=1
exit "$rc"
