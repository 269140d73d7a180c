#!/usr/bin/env bash
# The systemd side of `make install`, checked offline (no systemd needs to
# run): the units, the sysusers.d file and /etc/baton/baton.yaml land where
# systemd and the units look for them; `systemd-analyze verify` accepts the
# installed units with their ExecStart= programs resolved inside the
# DESTDIR; `systemd-analyze security --offline=yes` rates each under 4.0;
# `systemd-sysusers --root` makes the user and group the units run as;
# `batond --check-config` accepts the installed config, and says exactly
# what it says of its model path; the README's walkthrough names only files
# that the install makes.
#
#   BUILD=build bash tests/integration/test_systemd.sh
#
# Exit status 0 (pass), 1 (fail), or 77 with a line saying SKIP when
# systemd-analyze is missing.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
. tests/integration/lib_install.sh

if ! command -v systemd-analyze >/dev/null; then
  echo "SKIP test_systemd.sh: systemd-analyze is not installed"
  exit 77
fi

tmp=$(mktemp -d /tmp/baton-systemd-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
if ! make_install "$root" PREFIX=/usr/local >"$tmp/install.log" 2>&1; then
  cat "$tmp/install.log"; echo "FAIL: make install DESTDIR=$root PREFIX=/usr/local"; exit 1
fi
pass "make install DESTDIR=... PREFIX=/usr/local"
units=$root/usr/local/lib/systemd/system

# ---- files ------------------------------------------------------------------
for f in usr/local/lib/systemd/system/batond.service usr/local/lib/systemd/system/baton-worker@.service \
         usr/local/lib/sysusers.d/baton.conf etc/baton/baton.yaml; do
  [ -f "$root/$f" ] && pass "/$f" || fail "/$f is not installed"
done
cmp -s "$root/etc/baton/baton.yaml" config/examples/chat-cpu-system.yaml &&
  pass "/etc/baton/baton.yaml is config/examples/chat-cpu-system.yaml" ||
  fail "/etc/baton/baton.yaml is not config/examples/chat-cpu-system.yaml"
if out=$(same_as_chat_cpu config/examples/chat-cpu-system.yaml); then
  pass "chat-cpu-system.yaml is chat-cpu.yaml but for paths and address"
else
  fail "chat-cpu-system.yaml departs from chat-cpu.yaml:"; echo "$out"
fi
grep -q '^  http_listen: 127\.0\.0\.1:8000$' "$root/etc/baton/baton.yaml" &&
  pass "the installed config serves HTTP on 127.0.0.1:8000" || fail "http_listen of /etc/baton/baton.yaml"
# A second install keeps the administrator's config.
echo "# edited by the administrator" >"$root/etc/baton/baton.yaml"
if make_install "$root" PREFIX=/usr/local >"$tmp/install2.log" 2>&1 &&
   [ "$(cat "$root/etc/baton/baton.yaml")" = "# edited by the administrator" ]; then
  pass "a second make install keeps an existing /etc/baton/baton.yaml"
else
  fail "a second make install replaced /etc/baton/baton.yaml (or failed)"; cat "$tmp/install2.log"
fi
cp config/examples/chat-cpu-system.yaml "$root/etc/baton/baton.yaml"

# PREFIX=/usr: units under /usr/lib, every /usr/local path made /usr.
if make_install "$tmp/usr-root" PREFIX=/usr >"$tmp/install3.log" 2>&1 &&
   grep -qx 'ExecStart=/usr/bin/batond --config /etc/baton/baton.yaml' "$tmp/usr-root/usr/lib/systemd/system/batond.service" &&
   grep -q '^ExecStart=/usr/bin/baton-worker ' "$tmp/usr-root/usr/lib/systemd/system/baton-worker@.service" &&
   [ -f "$tmp/usr-root/usr/lib/sysusers.d/baton.conf" ] &&
   ! cat "$tmp/usr-root/usr/lib/systemd/system/"* | grep -v '^#' | grep -q /usr/local; then
  pass "PREFIX=/usr: units in /usr/lib/systemd/system run /usr/bin/..."
else
  fail "PREFIX=/usr install of the units"; cat "$tmp/install3.log"
fi
rm -rf "$tmp/usr-root"

# ---- the user ---------------------------------------------------------------
for u in batond.service baton-worker@.service; do
  if grep -qx 'User=baton' "$units/$u" && grep -qx 'Group=baton' "$units/$u"; then pass "$u runs as baton:baton"
  else fail "$u: User=/Group= are not baton"; fi
done
if command -v systemd-sysusers >/dev/null; then
  # systemd-sysusers --root reads ROOT/usr/local/lib/sysusers.d like the
  # real one reads /usr/local/lib/sysusers.d.
  if systemd-sysusers --root="$root" >"$tmp/sysusers.log" 2>&1 &&
     grep -q '^baton:x:[0-9]*:[0-9]*:[^:]*:/var/lib/baton:/usr/sbin/nologin$' "$root/etc/passwd" &&
     grep -q '^baton:x:[0-9]*:' "$root/etc/group"; then
    pass "systemd-sysusers makes the user and group baton (home /var/lib/baton, no login)"
  else
    fail "systemd-sysusers --root with the installed baton.conf:"; cat "$tmp/sysusers.log"
    cat "$root/etc/passwd" "$root/etc/group" 2>/dev/null
  fi
else
  echo "note: systemd-sysusers is not installed; the sysusers.d file was not run"
fi

# ---- systemd-analyze verify -------------------------------------------------
# --root resolves every path inside the DESTDIR: ExecStart= must find the
# installed programs there.  The tree gets what a system has anyway: the
# targets the units are ordered against (systemd's own unit folder) and
# /bin/kill (ExecReload=).
sysunits=$(systemd-analyze unit-paths 2>/dev/null | grep -E '^(/usr)?/lib/systemd/system$' | head -n 1)
mkdir -p "$root/usr/lib/systemd" "$root/bin"
cp -a "${sysunits:-/lib/systemd/system}" "$root/usr/lib/systemd/system"
cp /bin/kill "$root/bin/kill"
if out=$(systemd-analyze verify --man=no --root="$root" batond.service baton-worker@cpu1.service 2>&1) &&
   [ -z "$out" ]; then
  pass "systemd-analyze verify --root: both units, no message"
else
  fail "systemd-analyze verify --root:"; echo "$out"
fi
# ... and it does look for the programs: without batond it must complain.
mv "$root/usr/local/bin/batond" "$root/usr/local/bin/batond.away"
if out=$(systemd-analyze verify --man=no --root="$root" batond.service 2>&1); [ -n "$out" ] &&
   grep -q 'batond' <<<"$out"; then
  pass "systemd-analyze verify notices a missing ExecStart= program"
else
  fail "systemd-analyze verify did not notice that batond is missing: $out"
fi
mv "$root/usr/local/bin/batond.away" "$root/usr/local/bin/batond"

# ---- systemd-analyze security ---------------------------------------------
# --threshold=40 fails (exit 1) above 4.0; the scores are printed too.
out=$(systemd-analyze security --offline=yes --root="$root" --threshold=40 \
        batond.service baton-worker@cpu1.service 2>&1); rc=$?
scores=$(sed -n 's/.*Overall exposure level for \([^:]*\): \([0-9.]*\).*/\1 \2/p' <<<"$out")
if [ $rc -eq 0 ] && [ "$(wc -l <<<"$scores")" -eq 2 ] &&
   awk '$2 > 4.0 {bad = 1} END {exit bad}' <<<"$scores"; then
  pass "systemd-analyze security --offline=yes: $(tr '\n' ' ' <<<"$scores")(at most 4.0)"
else
  fail "systemd-analyze security (exit $rc): $(tr '\n' ' ' <<<"$scores")"; echo "$out" | grep -v '^✓'
fi

# ---- the installed config ----------------------------------------------------
# As installed: valid; its model file is absent on a machine that has not
# put it in /var/lib/baton/models, which --check-config reports as a warning
# naming the file (and batond --config would then fail to load it).
conf=$root/etc/baton/baton.yaml
model=/var/lib/baton/models/smollm2-135m-instruct-q4_1.gguf
out=$("$BUILD/batond" --check-config "$conf" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q 'configuration OK' <<<"$out"; then pass "batond --check-config /etc/baton/baton.yaml"
else fail "batond --check-config /etc/baton/baton.yaml: exit $rc"; echo "$out"; fi
if [ -e "$model" ]; then
  grep -q warning <<<"$out" && { fail "warnings with $model present:"; echo "$out"; } || pass "no warning ($model exists)"
elif grep -q "warning: model 'llm': option 'path', the file '$model' does not exist" <<<"$out" &&
     [ "$(grep -c warning <<<"$out")" -eq 1 ]; then
  pass "its one warning: the absent $model"
else
  fail "expected exactly one warning, about $model:"; echo "$out"
fi
# With the model where it is in this checkout and the sockets in a folder
# of its own, the same deployment has nothing to warn about.
if [ -f models/smollm2-135m-instruct-q4_1.gguf ]; then
  sed -e "s#/var/lib/baton/models/#$(pwd)/models/#" -e "s#ipc:///run/baton/#ipc://$tmp/run/#" \
    "$conf" >"$tmp/real.yaml"
  out=$("$BUILD/batond" --check-config "$tmp/real.yaml" 2>&1); rc=$?
  if [ $rc -eq 0 ] && grep -q 'configuration OK' <<<"$out" && ! grep -q warning <<<"$out"; then
    pass "with a real model file and socket folder: valid, no warning"
  else
    fail "check-config with the real model: exit $rc"; echo "$out"
  fi
else
  echo "note: models/ has no model (scripts/fetch-model.sh): checked with its warning only"
fi

# ---- the README walkthrough ---------------------------------------------------
# Every installed path the walkthrough names exists in the install.
walk=$(sed -n '/^## Running it as a service/,/^## /p' README.md)
if [ -z "$walk" ]; then
  fail "README.md has no section '## Running it as a service'"
else
  for f in $(grep -oE '(/usr/local|/etc/baton)/[A-Za-z0-9_@./-]*[A-Za-z0-9_@-]' <<<"$walk" | sort -u); do
    [ -e "$root$f" ] && pass "README names $f: installed" || fail "README names $f, which make install does not install"
  done
  for cmd in 'systemd-sysusers' 'systemctl daemon-reload' 'systemctl enable --now batond' \
             'curl http://127.0.0.1:8000/health' 'install -d /var/lib/baton/models'; do
    grep -qF -- "$cmd" <<<"$walk" && pass "README: $cmd" || fail "README walkthrough lacks '$cmd'"
  done
fi

if [ $fails -eq 0 ]; then echo "test_systemd: passed"; exit 0; fi
echo "test_systemd: $fails failed"
exit 1
