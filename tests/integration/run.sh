#!/usr/bin/env bash
# Integration tests that run the real programs.  For this issue: batond
# --check-config over every example (must pass) and every file under
# tests/integration/bad/ (must fail with the error its first line expects,
# "# expect: LINE: text", printed as FILE:LINE:COL: ... text).
set -u
BUILD=${BUILD:-build}
BATOND=$BUILD/batond
. tests/limits.sh
pass=0; fail=0; skip=0
ok()   { pass=$((pass + 1)); }
bad()  { fail=$((fail + 1)); echo "FAIL: $*"; }
# Runs a test script (NAME, then the command) under its time limit
# (script_limit, scaled by $BATON_TEST_TIMEOUT_SCALE; tests/limits.sh), its
# output shown as it comes: exit 0 is a pass, and each line of its output
# starting with SKIP (a part it could not run) is counted as a skip too;
# exit 77 is a skip of the whole script; anything else a failure.  A script
# that counts its own checks writes "PASS FAIL SKIP" to
# $BATON_TEST_COUNTS_OUT, and those are counted instead.  A script past its
# limit is stopped with every process it started and fails.  Its folders
# go under $BATON_TEST_LOGDIR (/tmp/baton-test-integration-NAME-XXXXXX),
# kept on a failure with the tails of the logs in them.  A script that
# skips for a missing model under BATON_CI=1 fails instead (each script
# checks that itself).
script_log=$(mktemp)
script_counts=$(mktemp)
trap 'rm -f "$script_log" "$script_counts"' EXIT
# Seconds each script may run: several times what it takes on a loaded
# 2-core machine.
script_limit() {
  case $1 in
    test_e2e.py) echo 600 ;;
    # Installs the openai package from PyPI the first time (pip has 600 s).
    test_openai.py) echo 1200 ;;
    test_whisper.py) echo 900 ;;
    test_docker.sh) echo 1200 ;;
    *) echo 300 ;;
  esac
}
run_script() {
  local name=$1 rc n p f s; shift
  : >"$script_counts"
  run_limited "$name" "$(script_limit "$name")" "$script_log" \
    --evidence "baton-test-integration-${name%.*}-" -- \
    env BATON_TEST_COUNTS_OUT="$script_counts" "$@"
  rc=$limited_rc
  n=$(grep -c '^SKIP' "$script_log")
  if [ "$rc" -eq 124 ]; then
    bad "$name: timed out after $limited_s s"; skip=$((skip + n))
  elif [ -s "$script_counts" ] && read -r p f s <"$script_counts"; then
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    [ "$rc" -eq 0 ] || [ "$f" -gt 0 ] || bad "$name: exit $rc with no failed check"
  elif [ "$rc" -eq 0 ]; then ok; skip=$((skip + n))
  elif [ "$rc" -eq 77 ]; then skip=$((skip + 1))
  else bad "$name (exit $rc, see above)"; skip=$((skip + n)); fi
}

# An example with GPU workers passes only where this build's worker serves
# CUDA (a build with nvcc, or the emulated one); elsewhere it must be
# refused for exactly that reason.
cuda_worker=no
grep -qw cuda <<<"$("${BATON_WORKER:-$BUILD/baton-worker}" --devices 2>/dev/null)" && cuda_worker=yes
for f in config/examples/*.yaml; do
  out=$("$BATOND" --check-config "$f" 2>&1); rc=$?
  if [ $cuda_worker = no ] && grep -Eq "^[^#]*device: *['\"]?cuda:" "$f"; then
    if [ $rc -eq 1 ] && grep -q "needs a baton-worker built with CUDA" <<<"$out"; then ok
    else bad "$f: rc=$rc, expected a refusal of its GPU workers"; echo "$out"; fi
  elif [ $rc -eq 0 ] && grep -q "configuration OK" <<<"$out"; then ok
  else bad "$f: rc=$rc"; echo "$out"; fi
done

for f in tests/integration/bad/*.yaml; do
  want=$(sed -n '1s/^# expect: //p' "$f")
  line=${want%%:*}; text=${want#*: }
  out=$("$BATOND" --check-config "$f" 2>&1); rc=$?
  if [ $rc -ne 1 ]; then bad "$f: exit $rc, expected 1"; echo "$out"; continue; fi
  if grep -F "$f:$line:" <<<"$out" | grep -qF "$text"; then ok
  else bad "$f: no error at line $line containing '$text'"; echo "$out"; fi
done

# Usage errors exit 2; a missing file is an error naming it.
"$BATOND" >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "no arguments should exit 2"
out=$("$BATOND" --check-config /nonexistent/baton.yaml 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -q "/nonexistent/baton.yaml" <<<"$out"; then ok; else bad "missing file: rc=$rc: $out"; fi

# The include check fails on a header from a layer above (and passes on
# the repository itself, which `make` already ran).
tmp=$(mktemp -d)
mkdir -p "$tmp/daemon" "$tmp/backends/a"
printf '#include "worker/pool.h"\n' > "$tmp/daemon/metrics.c"
printf '#include "daemon/frontend.h"\n#include "daemon/zap.h"\n' > "$tmp/daemon/supervisor.c"
printf '#include "backends/b/y.h"\n' > "$tmp/backends/a/y.c"
mkdir -p "$tmp/worker"
printf '#include "worker/executor.h"\n#include "worker/device.h"\n' > "$tmp/worker/store.c"
out=$(bash scripts/check-includes.sh "$tmp" 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -q 'daemon/metrics.c:1: includes "worker/pool.h"' <<<"$out" &&
   grep -q 'daemon/supervisor.c:1: includes "daemon/frontend.h": frontend is above supervisor' <<<"$out" &&
   ! grep -q 'supervisor.c:2' <<<"$out" &&
   grep -q 'worker/store.c:1: includes "worker/executor.h": executor is above store' <<<"$out" &&
   ! grep -q 'worker/store.c:2' <<<"$out" &&
   grep -q "another backend's header" <<<"$out"; then ok; else bad "check-includes: rc=$rc: $out"; fi
rm -rf "$tmp"
if bash scripts/check-includes.sh; then ok; else bad "check-includes on the repository"; fi

# No file of a layered component calls a function of a file above it, on
# the objects this build made (a prototype written by hand cannot get
# round that), and a call planted upwards is caught.
if bash scripts/check-calls.sh "$BUILD/obj" runtime daemon worker; then ok
else bad "check-calls on the build"; fi
tmp=$(mktemp -d)
mkdir -p "$tmp/src/worker" "$tmp/obj/worker"
printf 'void wk_executor_run(void);\nvoid wk_store_get(void) { wk_executor_run(); }\n' \
    > "$tmp/src/worker/store.c"
printf 'void wk_store_get(void);\nvoid wk_executor_run(void) { wk_store_get(); }\n' \
    > "$tmp/src/worker/executor.c"
if cc -c -o "$tmp/obj/worker/store.o" "$tmp/src/worker/store.c" &&
   cc -c -o "$tmp/obj/worker/executor.o" "$tmp/src/worker/executor.c"; then
  out=$(SRCDIR="$tmp/src" bash scripts/check-calls.sh "$tmp/obj" worker 2>&1); rc=$?
  if [ $rc -eq 1 ] &&
     grep -q 'worker/store.c calls wk_executor_run of worker/executor.c, which is not below it' <<<"$out" &&
     ! grep -q 'worker/executor.c calls' <<<"$out"; then ok; else bad "check-calls: rc=$rc: $out"; fi
else bad "check-calls: the planted objects did not compile"; fi
rm -rf "$tmp"

# The name check fails on a tracked file whose name has a character outside
# [A-Za-z0-9._/+@-] and names it (not the good one beside it, nor an
# untracked bad one); it passes quietly outside a git checkout, and on the
# repository itself.
tmp=$(mktemp -d)
mkdir -p "$tmp/repo/sub" "$tmp/tarball"
: > "$tmp/repo/sub/good-name_1.0+x@y.c"
: > "$tmp/repo/tracked bad|name"
if git -C "$tmp/repo" init -q && git -C "$tmp/repo" add -A; then
  : > "$tmp/repo/untracked bad name"
  out=$(bash scripts/check-names.sh "$tmp/repo" 2>&1); rc=$?
  if [ $rc -eq 1 ] && grep -qF 'tracked bad|name: tracked file name outside' <<<"$out" &&
     ! grep -q 'good-name' <<<"$out" && ! grep -q 'untracked' <<<"$out"; then ok
  else bad "check-names on a bad name: rc=$rc: $out"; fi
else
  bad "check-names: cannot make a git repository in $tmp"
fi
: > "$tmp/tarball/bad name"
out=$(bash scripts/check-names.sh "$tmp/tarball" 2>&1); rc=$?
if [ $rc -eq 0 ] && [ -z "$out" ]; then ok; else bad "check-names outside git: rc=$rc: $out"; fi
rm -rf "$tmp"
if bash scripts/check-names.sh; then ok; else bad "check-names on the repository"; fi

# The client library, shared: it exports its API only, and a program
# linked against it runs.  The worker links none of the client code (batond
# does: its HTTP gateway is a client of its conductor).
exports=$(nm -D --defined-only "$BUILD/libbatonclient.so.0" | awk '{print $3}' | grep -v '^baton_client_')
if [ -z "$exports" ] && nm -D --defined-only "$BUILD/libbatonclient.so.0" | grep -q ' baton_client_create$'; then ok
else bad "libbatonclient.so exports more than baton_client_*: $exports"; fi
tmp=$(mktemp -d)
printf '#include <stdio.h>\n#include "baton/client.h"\nint main(void) { baton_client *c;\n  int rc = baton_client_create("ipc:///nonexistent/x.sock", &c);\n  if (rc == 0) baton_client_destroy(c);\n  puts(baton_client_strerror(BATON_CLIENT_ETIMEDOUT)); return 0; }\n' > "$tmp/t.c"
# A sanitizer build's library needs its runtime in the program too.
san=; nm -D "$BUILD/libbatonclient.so.0" | grep -q ' U __asan_' && san=-fsanitize=address,undefined
if cc $san -Iinclude -o "$tmp/t" "$tmp/t.c" -L"$BUILD" -lbatonclient 2>"$tmp/err" &&
   out=$(LD_LIBRARY_PATH="$BUILD" "$tmp/t") && [ -n "$out" ]; then ok
else bad "a program linked against libbatonclient.so: $(cat "$tmp/err") $out"; fi
rm -rf "$tmp"
if nm "$BUILD/baton-worker" | grep -q ' baton_client_'; then bad "baton-worker links client code"; else ok; fi

# CI runs the tests twice (between them `make slow-test`), the second time
# under ASan and UBSan, with the model tests required (BATON_CI=1).
if grep -q '^export BATON_CI=1$' .ci/run &&
   grep -A100 '^make test$' .ci/run | grep -q '^make asan-test$'; then ok
else bad ".ci/run must export BATON_CI=1 and run make test, then make asan-test"; fi

# The leftovers check of `make test` (tests/leftovers.sh): what appears in
# /tmp and /dev/shm after the snapshot is named and fails; a /tmp folder
# after failed suites is listed as kept, not failed again; nothing new
# passes.  (Without TEST_COUNTS: these runs are not the real check; without
# its watcher, so that other test runs on the machine do not change the
# answers.)
tmp=$(mktemp -d)
snap=$tmp/snapshot
TEST_COUNTS= BATON_LEFTOVERS_WATCH=0 bash tests/leftovers.sh snapshot "$snap"
made=$(mktemp -d /tmp/baton-leftovers-selftest-XXXXXX)
seg=/dev/shm/baton-999999999-selftest$$-cpu0
: > "$seg"
out=$(TEST_COUNTS= BATON_LEFTOVERS_WATCH=0 bash tests/leftovers.sh check "$snap" 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -qF "  $made/" <<<"$out" && grep -qF "  $seg" <<<"$out"; then ok
else bad "leftovers.sh names what a run left: rc=$rc: $out"; fi
out=$(TEST_COUNTS= BATON_LEFTOVERS_WATCH=0 bash tests/leftovers.sh check "$snap" 1 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -qF "$made (kept by the failed run" <<<"$out" && grep -qF "  $seg" <<<"$out"; then ok
else bad "leftovers.sh after failed suites: rc=$rc: $out"; fi
rm -rf "$made" "$seg"
out=$(TEST_COUNTS= BATON_LEFTOVERS_WATCH=0 bash tests/leftovers.sh check "$snap" 2>&1); rc=$?
# Another run on this machine may leave something meanwhile: only what
# this check made must be gone from the answer.
if ! grep -qF -e "$made" -e "$seg" <<<"$out"; then ok; else bad "leftovers.sh after the cleanup: $out"; fi
rm -rf "$tmp"

# Every integration script is run (here or by test_batonctl.sh) and listed
# in tests/README.md.
for f in tests/integration/test_*; do
  n=${f##*/}
  grep -qF "$n" tests/integration/run.sh tests/integration/test_batonctl.sh &&
    grep -qF "\`$n\`" tests/README.md && ok || bad "$n: not run by run.sh or not listed in tests/README.md"
done


# The time limits themselves (tests/run-limited.py): a planted script that
# hangs is stopped with the processes it started, and reported.
run_script test_limits.sh env BUILD="$BUILD" bash tests/integration/test_limits.sh

# batonctl and the Python client (its checks counted one by one).
run_script test_batonctl.sh env BUILD="$BUILD" bash tests/integration/test_batonctl.sh

# End to end: real batond and baton-worker processes over real sockets.
run_script test_e2e.py env BUILD="$BUILD" /usr/bin/python3 tests/integration/test_e2e.py

# Replicas: a model on two workers, requests pinned and spread, a replica
# killed under load and back, a replica that never registers.
run_script test_replicas.py env BUILD="$BUILD" /usr/bin/python3 tests/integration/test_replicas.py

# Replicas: a model on two workers, requests pinned and spread, a replica
# killed under load and back, a replica that never registers.
run_script test_replicas.py env BUILD="$BUILD" /usr/bin/python3 tests/integration/test_replicas.py

# CURVE on tcp:// endpoints, the ZAP handler and its counter, keygen,
# client and worker keys, the config rules and ipc socket modes.
run_script test_curve.py env BUILD="$BUILD" /usr/bin/python3 tests/integration/test_curve.py
# Cross-host transfers: three CPU workers declared on two hosts, pulling
# each other's tensors over loopback peer sockets.
run_script test_xhost.py env BUILD="$BUILD" /usr/bin/python3 tests/integration/test_xhost.py
# Hosts made of network namespaces (needs root, else SKIP): batond, two
# external CPU workers and the clients each on their own address, CURVE on
# every socket, tensors pulled between hosts, a cut link, a killed worker.
run_script test_multihost.py env BUILD="$BUILD" /usr/bin/python3 tests/integration/test_multihost.py

# A failed event loop makes batond exit non-zero, leaving nothing behind.
run_script test_loop_failure.sh env BUILD="$BUILD" bash tests/integration/test_loop_failure.sh
# SIGTERM and SIGINT leave no pool segment, socket file or socket folder;
# a stale socket file is replaced, a running batond's socket is not taken.
run_script test_stop_cleanup.sh env BUILD="$BUILD" bash tests/integration/test_stop_cleanup.sh
# `make run` (scripts/run.sh) of test-loop.yaml, offline: no model fetched.
run_script test_run.sh env BUILD="$BUILD" bash tests/integration/test_run.sh

# The OpenAI-compatible HTTP API with the default model, through the openai
# package, curl and raw sockets; exit 77 when the model is absent.
run_script test_openai.py env BUILD="$BUILD" /usr/bin/python3 tests/integration/test_openai.py

# Speech to text: config/examples/voice.yaml's whisper model on the JFK
# clip, long audio, concurrent requests, bad input; exit 77 without them.
run_script test_whisper.py env BUILD="$BUILD" /usr/bin/python3 tests/integration/test_whisper.py

# make install, libbatonclient through pkg-config, the systemd units and
# the Docker images' build steps, each against a temporary DESTDIR
# (docs/operations.md); exit 77 is a skip, with the reason printed.
for t in test_install.sh test_systemd.sh test_docker.sh; do
  run_script "$t" env BUILD="$BUILD" bash "tests/integration/$t"
done

echo "integration: ${pass} passed, ${fail} failed, ${skip} skipped"
[ -n "${TEST_COUNTS:-}" ] && echo "integration $pass $fail $skip" >> "$TEST_COUNTS"
[ "$fail" -eq 0 ]
