#!/usr/bin/env bash
# `make run`'s script (scripts/run.sh) on a deployment without a model (a
# copy of config/examples/test-loop.yaml with its sockets in a folder of its
# own), with BATON_OFFLINE=1: it must not go for the default model (which
# that deployment does not use), must say which endpoint it serves, and
# must serve there until Ctrl-C (SIGINT), which leaves no socket behind.
set -u
BUILD=${BUILD:-build}
CTL=$BUILD/batonctl
. tests/integration/lib_daemon.sh
scratch run

sed "s#/tmp/baton-test/#$tmp/sock/#" config/examples/test-loop.yaml > "$tmp/test-loop.yaml"
ep=ipc://$tmp/sock/baton.sock
grep -q "listen: $ep" "$tmp/test-loop.yaml" || { echo "FAIL: test-loop.yaml no longer listens in /tmp/baton-test/"; exit 1; }

# scripts/run.sh execs batond: its pid is batond's.
BATON_OFFLINE=1 BATON_CONFIG=$tmp/test-loop.yaml BUILD=$BUILD bash scripts/run.sh >"$tmp/log" 2>&1 &
pid=$!
ready=no
for _ in $(seq 600); do
  "$CTL" --endpoint "$ep" --timeout-ms 1000 health >/dev/null 2>&1 && { ready=yes; break; }
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
[ $ready = yes ] && pass "make run serves test-loop.yaml with BATON_OFFLINE=1" ||
  { fail "make run of test-loop.yaml did not serve:"; cat "$tmp/log"; }
if grep -q "fetch-model" "$tmp/log"; then
  fail "make run of test-loop.yaml went for the default model:"; cat "$tmp/log"
else
  pass "make run of test-loop.yaml leaves the default model alone"
fi
grep -qF "Serving $tmp/test-loop.yaml on $ep" "$tmp/log" && pass "it names its endpoint" ||
  { fail "make run did not name $ep:"; cat "$tmp/log"; }
grep -qF "$CTL --endpoint $ep infer count --input NAME=SPEC" "$tmp/log" &&
  pass "it suggests a request for its first graph" || { fail "no suggestion for graph count:"; cat "$tmp/log"; }
if [ $ready = yes ]; then
  kill -INT "$pid"
  wait "$pid"; rc=$?
  [ $rc -eq 0 ] && [ ! -e "$tmp/sock" ] && pass "Ctrl-C stops it, its sockets gone" ||
    fail "after SIGINT: exit $rc, left: $(ls -R "$tmp/sock" 2>&1)"
fi
pid=

if [ $fails -eq 0 ]; then echo "test_run: passed"; exit 0; fi
echo "test_run: $fails failed"
exit 1
