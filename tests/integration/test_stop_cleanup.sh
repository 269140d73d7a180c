#!/usr/bin/env bash
# batond leaves nothing behind when it stops, and starts over what another
# left behind, without taking the socket of one that runs:
#   1. SIGTERM and SIGINT: exit 0, no worker pool segment in /dev/shm (the
#      run's are /baton-PID-...), no ipc socket file, and the socket folder
#      it made is gone; batonctl then says at once that there is no socket;
#   2. a socket file nobody listens on (a batond killed): batonctl says so
#      once its connect timeout is over, and a batond on that config
#      removes it, binds and serves;
#   3. a second batond on the config of one that runs refuses to start,
#      saying why, and the first one keeps its sockets and serves on.
set -u
BUILD=${BUILD:-build}
BATOND=$BUILD/batond
CTL=$BUILD/batonctl
. tests/integration/lib_daemon.sh
scratch stop

# The sockets live two levels below $tmp, in folders batond makes.
run=$tmp/run/sockets
ep=ipc://$run/baton.sock
echo_deployment "$tmp/baton.yaml" "$ep" "ipc://$run/workers.sock" "drain_timeout_ms: 2000"

# start LOG: a batond on the config in the background; its pid in $pid.
start() {
  "$BATOND" --config "$tmp/baton.yaml" >"$1" 2>&1 &
  pid=$!
  pids+=("$pid")
}
# ready PID: waits until batond PID answers health ready (or exits).
ready() {
  for _ in $(seq 600); do
    "$CTL" --endpoint "$ep" --timeout-ms 1000 health >/dev/null 2>&1 && return 0
    kill -0 "$1" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
segments() { ls /dev/shm 2>/dev/null | grep "^baton-$1-"; }

# ---- 1. a clean stop by SIGTERM and by SIGINT ------------------------------
for sig in TERM INT; do
  start "$tmp/log"
  if ! ready "$pid"; then fail "SIG$sig: batond did not become ready:"; cat "$tmp/log"; continue; fi
  [ -n "$(segments "$pid")" ] && pass "SIG$sig: the worker's pool is in /dev/shm" ||
    fail "SIG$sig: no pool segment of batond $pid in /dev/shm"
  kill -"$sig" "$pid"
  wait "$pid"; rc=$?
  [ $rc -eq 0 ] && pass "SIG$sig: batond exits 0" || { fail "SIG$sig: batond exited $rc:"; cat "$tmp/log"; }
  left=$(segments "$pid")
  [ -z "$left" ] && pass "SIG$sig: no pool segment left" || fail "SIG$sig: left in /dev/shm: $left"
  [ ! -e "$run/baton.sock" ] && [ ! -e "$run/workers.sock" ] && pass "SIG$sig: no socket file left" ||
    fail "SIG$sig: socket files left: $(ls "$run")"
  [ ! -e "$tmp/run" ] && pass "SIG$sig: the socket folders batond made are gone" ||
    fail "SIG$sig: left: $(find "$tmp/run")"
  out=$("$CTL" --endpoint "$ep" health 2>&1); rc=$?
  if [ $rc -eq 3 ] && grep -qF "cannot connect to $ep: there is no socket file (is batond running?)" <<<"$out"
  then pass "SIG$sig: batonctl health afterwards: $out"
  else fail "SIG$sig: batonctl health afterwards: exit $rc: $out"; fi
done

# ---- 2. a socket file nobody listens on --------------------------------------
mkdir -p "$run"
if python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.close()' "$run/baton.sock" &&
   [ -S "$run/baton.sock" ]; then
  out=$("$CTL" --endpoint "$ep" --timeout-ms 500 health 2>&1); rc=$?
  if [ $rc -eq 3 ] && grep -qF "nobody listens on its socket file (is batond running?)" <<<"$out"
  then pass "batonctl on a stale socket file: $out"
  else fail "batonctl on a stale socket file: exit $rc: $out"; fi
  start "$tmp/log"
  first=$pid
  if ready "$first"; then
    pass "batond starts over a stale socket file"
    grep -q "removed $run/baton.sock, a socket file nobody listened on" "$tmp/log" &&
      pass "and says it removed it" || { fail "no word of the stale file in its log:"; cat "$tmp/log"; }

    # ---- 3. a second batond on the same config -------------------------------
    start "$tmp/log2"
    wait "$pid"; rc=$?
    if [ $rc -eq 1 ] && grep -q "cannot bind ipc://$run/workers.sock: another process serves it (is another batond running on this config?)" "$tmp/log2"
    then pass "a second batond on the config refuses to start"
    else fail "a second batond exited $rc:"; cat "$tmp/log2"; fi
    left=$(segments "$pid")
    [ -z "$left" ] && pass "the refused batond leaves no pool segment" || fail "the refused batond left: $left"
    if [ -S "$run/baton.sock" ] && [ -S "$run/workers.sock" ] &&
       "$CTL" --endpoint "$ep" health >/dev/null 2>&1; then
      pass "the first batond keeps its sockets and serves"
    else
      fail "the first batond lost its sockets: $(ls -l "$run" 2>&1)"
    fi
    kill -TERM "$first"
    wait "$first"; rc=$?
    [ $rc -eq 0 ] && [ ! -e "$run/baton.sock" ] && [ -z "$(segments "$first")" ] &&
      pass "the first batond stops clean" || fail "the first batond: exit $rc, left: $(ls "$run" 2>&1) $(segments "$first")"
  else
    fail "batond did not start over a stale socket file:"; cat "$tmp/log"
  fi
else
  fail "cannot make a stale socket file at $run/baton.sock"
fi

if [ $fails -eq 0 ]; then echo "test_stop_cleanup: passed"; exit 0; fi
echo "test_stop_cleanup: $fails failed"
exit 1
