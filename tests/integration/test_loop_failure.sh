#!/usr/bin/env bash
# A conductor whose event loop fails must exit non-zero, so that systemd's
# Restart=on-failure (and any other supervisor) starts it again, and must
# leave nothing behind: no worker process, no worker pool segment in
# /dev/shm, no ipc socket file.  It runs build/tests/batond-pollfail,
# batond with a zmq_poll that fails on demand (tests/integration/pollfail.c),
# on a one-worker deployment: once a few polls into the start, and once
# after the worker has registered (its pool made).
set -u
BUILD=${BUILD:-build}
exe=$BUILD/tests/batond-pollfail
CTL=$BUILD/batonctl
. tests/integration/lib_daemon.sh
scratch loopfail
echo_deployment "$tmp/baton.yaml" "ipc://$tmp/baton.sock" "ipc://$tmp/workers.sock"

# nothing_left PID WHAT: no pool segment of batond PID's run (its segments
# are /baton-PID-...), no socket file in $tmp.
nothing_left() {
  local segs socks
  segs=$(ls /dev/shm 2>/dev/null | grep "^baton-$1-")
  socks=$(ls "$tmp"/*.sock 2>/dev/null)
  [ -z "$segs" ] && pass "$2: no pool segment left" || fail "$2: left in /dev/shm: $segs"
  [ -z "$socks" ] && pass "$2: no socket file left" || fail "$2: left: $socks"
}

# ---- 1. the loop fails a few polls into the start -----------------------------
# The worker lives next to batond, not next to this test build of it.
BATON_WORKER=$BUILD/baton-worker BATON_TEST_POLL_FAIL_AFTER=5 \
  "$exe" --config "$tmp/baton.yaml" >"$tmp/log" 2>&1 &
pid=$!
wait "$pid"; rc=$?
if [ $rc -eq 1 ] && grep -q "the event loop failed" "$tmp/log"; then
  pass "batond exits 1 when its event loop fails"
else
  fail "batond with a failing event loop exited $rc (want 1); its log:"; cat "$tmp/log"
fi
nothing_left "$pid" "a loop failed at start"
pid=

# ---- 2. the loop fails once the worker is up (its pool made) ------------------
BATON_WORKER=$BUILD/baton-worker BATON_TEST_POLL_FAIL_FILE=$tmp/fail-now \
  "$exe" --config "$tmp/baton.yaml" >"$tmp/log" 2>&1 &
pid=$!
ready=no
for _ in $(seq 600); do
  if "$CTL" --endpoint "ipc://$tmp/baton.sock" --timeout-ms 1000 health >/dev/null 2>&1; then
    ready=yes; break
  fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if [ $ready = yes ]; then
  pass "batond-pollfail serves until told to fail"
  wpid=$(pgrep -P "$pid" | head -n 1)
  segs=$(ls /dev/shm 2>/dev/null | grep "^baton-$pid-")
  # Without the segment there the check below would prove nothing.
  [ -n "$segs" ] && pass "the worker's pool is there: $segs" || fail "no pool segment of batond $pid in /dev/shm"
  touch "$tmp/fail-now"
  wait "$pid"; rc=$?
  if [ $rc -eq 1 ] && grep -q "the event loop failed" "$tmp/log"; then
    pass "batond exits 1 when its event loop fails after the start"
  else
    fail "batond exited $rc after its loop failed (want 1); its log:"; cat "$tmp/log"
  fi
  if [ -n "$wpid" ] && kill -0 "$wpid" 2>/dev/null; then
    fail "worker $wpid outlives batond"; kill -KILL "$wpid"
  else
    pass "no worker outlives batond"
  fi
  nothing_left "$pid" "a loop failed after the start"
else
  fail "batond-pollfail did not become ready; its log:"; cat "$tmp/log"
fi
pid=

if [ $fails -eq 0 ]; then echo "test_loop_failure: passed"; exit 0; fi
echo "test_loop_failure: $fails failed"
exit 1
