#!/usr/bin/env bash
# The test runners' time limits and evidence (tests/run-limited.py,
# tests/limits.sh, tests/integration/evidence.py), on planted scripts:
#   - a shell script that hangs, with children in its process group, in a
#     session of their own and orphaned: stopped at its limit, reported
#     TIMEOUT with exit 124, its output and the tail of its daemon log
#     shown, its folder kept, and none of its processes left;
#   - a Python test blocked in a ZeroMQ send that has no timeout (what a
#     refused client did): SIGTERM ends the send, its own cleanup shows its
#     kept folder and log, and the process it left in a session of its own
#     is stopped;
#   - a script that passes but leaves a process running: named and stopped,
#     its status kept, its folder removed;
#   - a script that fails: its folder kept, the tails of the logs it did
#     not show itself printed, the others not;
#   - a script's own exit 124 is not taken for the limit;
#   - test_limit's scaling by $BATON_TEST_TIMEOUT_SCALE and in a sanitizer
#     build.
# Prints "limits: N passed, N failed" and exits non-zero on a failure.
set -u
cd "$(dirname "$0")/../.."
. tests/limits.sh
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d /tmp/baton-test-limits-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# The planted scripts' folders go into $tmp, not /tmp.
export BATON_TEST_TMPDIR=$tmp
limited() {  # NAME LIMIT OUT CMD...: run-limited with a short grace
  local name=$1 limit=$2 out=$3; shift 3
  /usr/bin/python3 tests/run-limited.py --limit "$limit" --grace 3 --name "$name" \
    --output "$out.log" --evidence "planted-$name-" -- "$@" >"$out" 2>&1
}
# PIDS lists processes that must all be gone.
all_gone() {
  local pid
  for pid in $(cat "$1"); do
    if kill -0 "$pid" 2>/dev/null; then echo "process $pid ($(cat /proc/$pid/comm 2>/dev/null)) survived"; return 1; fi
  done
}
# Starts "sleep N" so that its pid lands in $PIDS: as it is (in the
# process group), in a session of its own, or orphaned.
cat >"$tmp/lib.sh" <<'EOF'
sleeper() { sh -c 'echo $$ >>"$PIDS"; exec sleep 1000' & }
own_session() { setsid sh -c 'echo $$ >>"$PIDS"; exec sleep 1001' & }
orphan() { ( sh -c 'echo $$ >>"$PIDS"; exec sleep 1002' & ) ; }
wait_pids() { while [ "$(wc -l <"$PIDS")" -lt "$1" ]; do sleep 0.05; done; }
EOF

# ---- a shell script that hangs -----------------------------------------------
cat >"$tmp/hang.sh" <<'EOF'
. "$(dirname "$0")/lib.sh"
echo "planted: started"
mkdir -p "$BATON_TEST_LOGDIR/daemon"
seq -f "daemon line %g" 1 100 >"$BATON_TEST_LOGDIR/daemon/batond.log"
sleeper; own_session; orphan; wait_pids 3
sleep 1003
EOF
: >"$tmp/hang.pids"
PIDS=$tmp/hang.pids limited hang 2 "$tmp/hang.out" bash "$tmp/hang.sh"; rc=$?
out=$(cat "$tmp/hang.out")
kept=$(ls -d "$tmp"/planted-hang-* 2>/dev/null)
if [ $rc -eq 124 ] && grep -q "^planted: started" <<<"$out" &&
   grep -q "^TIMEOUT hang: still running after 2 s" <<<"$out" &&
   [ -n "$kept" ] && grep -qF "evidence kept in $kept" <<<"$out" &&
   grep -q "^    daemon line 100$" <<<"$out" && grep -q "^    daemon line 41$" <<<"$out" &&
   ! grep -q "^    daemon line 40$" <<<"$out" && [ "$(wc -l <"$tmp/hang.pids")" -eq 3 ] &&
   all_gone "$tmp/hang.pids"
then ok; else bad "a hanging script: exit $rc, folder '$kept', output:"; echo "$out"; fi

# ---- a Python test blocked in a send with no timeout ---------------------------
cat >"$tmp/blocked.py" <<'EOF'
import os, subprocess, sys
sys.path.insert(0, "tests/integration")
import evidence
import zmq
d = evidence.new_dir("planted")
with open(os.path.join(d, "batond.log"), "w") as f:
    f.write("the planted daemon's last words\n")
p = subprocess.Popen(["sleep", "1004"], start_new_session=True)
with open(os.environ["PIDS"], "w") as f:
    f.write("%d\n" % p.pid)
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.IMMEDIATE, 1)  # no peer: no pipe, nowhere to send
s.connect("ipc://%s/nobody.sock" % d)
print("planted: sending", flush=True)
try:
    s.send(b"x")  # blocks for ever, as a refused client's send did
finally:
    print("planted: the send was interrupted", flush=True)
    s.close(linger=0)
    ctx.term()
EOF
: >"$tmp/blocked.pids"
PIDS=$tmp/blocked.pids limited blocked 2 "$tmp/blocked.out" /usr/bin/python3 "$tmp/blocked.py"; rc=$?
out=$(cat "$tmp/blocked.out")
kept=$(ls -d "$tmp"/planted-blocked-*/planted-* 2>/dev/null)
if [ $rc -eq 124 ] && grep -q "^planted: sending" <<<"$out" &&
   grep -q "^TIMEOUT blocked:" <<<"$out" && grep -q "^planted: the send was interrupted" <<<"$out" &&
   [ -n "$kept" ] && grep -qF "evidence kept: $kept (the script ended by SIGTERM)" <<<"$out" &&
   [ "$(grep -c "the planted daemon's last words" <<<"$out")" -eq 1 ] &&
   [ -s "$tmp/blocked.pids" ] && all_gone "$tmp/blocked.pids"
then ok; else bad "a Python test blocked in a send: exit $rc, folder '$kept', output:"; echo "$out"; fi

# ---- a script that passes but leaves a process running --------------------------
printf '. "$(dirname "$0")/lib.sh"\nown_session; wait_pids 1\necho "planted: done"\n' >"$tmp/leave.sh"
: >"$tmp/leave.pids"
PIDS=$tmp/leave.pids limited leave 60 "$tmp/leave.out" bash "$tmp/leave.sh"; rc=$?
out=$(cat "$tmp/leave.out")
if [ $rc -eq 0 ] && grep -q "^NOTE leave left 1 process(es) running: [0-9]* (sleep)" <<<"$out" &&
   all_gone "$tmp/leave.pids" && ! ls -d "$tmp"/planted-leave-* >/dev/null 2>&1
then ok; else bad "a script that leaves a process: exit $rc, output:"; echo "$out"; fi

# ---- a script that fails --------------------------------------------------------
cat >"$tmp/fail.sh" <<'EOF'
mkdir "$BATON_TEST_LOGDIR/shown" "$BATON_TEST_LOGDIR/unshown"
echo "shown's log" >"$BATON_TEST_LOGDIR/shown/batond.log"
echo "unshown's log" >"$BATON_TEST_LOGDIR/unshown/batond.log"
echo "evidence kept: $BATON_TEST_LOGDIR/shown"
exit 1
EOF
limited fail 60 "$tmp/fail.out" bash "$tmp/fail.sh"; rc=$?
out=$(cat "$tmp/fail.out")
kept=$(ls -d "$tmp"/planted-fail-* 2>/dev/null)
if [ $rc -eq 1 ] && [ -n "$kept" ] && grep -qF "evidence kept in $kept" <<<"$out" &&
   grep -qF -- "--- last 60 lines of $kept/unshown/batond.log" <<<"$out" &&
   grep -q "^    unshown's log$" <<<"$out" && ! grep -q "/shown/batond.log\|    shown's log" <<<"$out"
then ok; else bad "a failing script: exit $rc, folder '$kept', output:"; echo "$out"; fi

# ---- exit 124 of the script's own, and the scaling -------------------------------
limited own124 60 "$tmp/own.out" bash -c 'exit 124'; rc=$?
if [ $rc -eq 1 ] && ! grep -q TIMEOUT "$tmp/own.out"; then ok
else bad "a script's own exit 124: run-limited exited $rc"; cat "$tmp/own.out"; fi
# Each case sets both variables: `make asan-test` exports BATON_TEST_SAN=1
# and a loaded machine may export a scale.
got="$(BATON_TEST_TIMEOUT_SCALE=2.5 BATON_TEST_SAN=0 test_limit 10) $(BATON_TEST_TIMEOUT_SCALE=1 BATON_TEST_SAN=1 test_limit 10)"
got="$got $(BATON_TEST_TIMEOUT_SCALE=2 BATON_TEST_SAN=1 test_limit 10) $(BATON_TEST_TIMEOUT_SCALE=x BATON_TEST_SAN=0 test_limit 10)"
if [ "$got" = "25 30 60 10" ]; then ok; else bad "test_limit: got '$got', expected '25 30 60 10'"; fi

echo "limits: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
