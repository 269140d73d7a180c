#!/usr/bin/env bash
# Integration tests that run the real programs.  For this issue: batond
# --check-config over every example (must pass) and every file under
# tests/integration/bad/ (must fail with the error its first line expects,
# "# expect: LINE: text", printed as FILE:LINE:COL: ... text).
set -u
BUILD=${BUILD:-build}
BATOND=$BUILD/batond
pass=0; fail=0
ok()   { pass=$((pass + 1)); }
bad()  { fail=$((fail + 1)); echo "FAIL: $*"; }

for f in config/examples/*.yaml; do
  out=$("$BATOND" --check-config "$f" 2>&1); rc=$?
  if [ $rc -eq 0 ] && grep -q "configuration OK" <<<"$out"; then ok; else bad "$f: rc=$rc"; echo "$out"; fi
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
printf '#include "worker/pool.h"\n' > "$tmp/daemon/x.c"
printf '#include "backends/b/y.h"\n' > "$tmp/backends/a/y.c"
out=$(bash scripts/check-includes.sh "$tmp" 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -q 'daemon/x.c:1: includes "worker/pool.h"' <<<"$out" &&
   grep -q "another backend's header" <<<"$out"; then ok; else bad "check-includes: rc=$rc: $out"; fi
rm -rf "$tmp"
if bash scripts/check-includes.sh; then ok; else bad "check-includes on the repository"; fi

# batonctl and the Python client (adds to pass/fail through ok/bad).
. tests/integration/test_batonctl.sh

# End to end: real batond and baton-worker processes over real sockets.
if BUILD="$BUILD" /usr/bin/python3 tests/integration/test_e2e.py; then ok; else bad "test_e2e.py (see above)"; fi

echo "integration: ${pass} passed, ${fail} failed"
[ "$fail" -eq 0 ]
