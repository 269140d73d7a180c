# Time limits for the test runners (tests/run-unit.sh,
# tests/integration/run.sh, tests/cudaemu/run.sh), which source this file.
#
# run_limited NAME SECONDS LOG [--quiet] [--evidence PREFIX] -- CMD...
#   runs CMD through tests/run-limited.py: in a process group of its own,
#   its output into LOG and (without --quiet) onto the terminal as it
#   comes, stopped with every process it started once it has run longer
#   than SECONDS scaled by test_limit.  Sets limited_rc (CMD's exit status,
#   124 when it ran out of time) and limited_s (the limit applied).
#   Without /usr/bin/python3 it falls back to coreutils' timeout, which
#   stops CMD's process group only and shows the output when CMD ends.
#
# test_limit SECONDS prints SECONDS times $BATON_TEST_TIMEOUT_SCALE
# (default 1; raise it on a slow or loaded machine), times 3 more in a
# sanitizer build ($BATON_TEST_SAN=1, set by `make asan-test`).

test_limit() {
  awk -v b="$1" -v s="${BATON_TEST_TIMEOUT_SCALE:-1}" -v san="${BATON_TEST_SAN:-0}" 'BEGIN {
    if (s + 0 <= 0) s = 1
    n = b * s * (san == 1 ? 3 : 1)
    printf "%d\n", n < 1 ? 1 : n + 0.5 }'
}

_limits_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

run_limited() {
  local name=$1 log=$3 opts=()
  limited_s=$(test_limit "$2"); shift 3
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  if [ -x /usr/bin/python3 ]; then
    /usr/bin/python3 "$_limits_dir/run-limited.py" --limit "$limited_s" --name "$name" \
      --output "$log" "${opts[@]}" -- "$@"
    limited_rc=$?
  else
    timeout -k 10 "$limited_s" "$@" </dev/null >"$log" 2>&1
    limited_rc=$?
    [ "$limited_rc" -eq 137 ] && limited_rc=124
    [[ " ${opts[*]} " == *" --quiet "* ]] || cat "$log"
    [ "$limited_rc" -eq 124 ] && echo "TIMEOUT $name: stopped after $limited_s s, its time limit"
  fi
}
