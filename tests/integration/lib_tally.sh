# shellcheck shell=bash
# The checks' tally of the shell tests (sourced): fail counts and prints a
# failure, pass prints a success; a test exits 0 only when FAILS is still 0.
fails=0
fail() { fails=$((fails + 1)); echo "FAIL: $*"; }
pass() { echo "ok   $*"; }
