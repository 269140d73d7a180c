#!/usr/bin/env bash
# What a test run leaves behind: POSIX shm segments of baton (/dev/shm/baton-*:
# workers' pools, /baton-<run>-<worker>) and files or folders /tmp/baton*
# (test folders, socket folders).  `make test` and `make asan-test` take a
# snapshot before the suites and check after them:
#
#   tests/leftovers.sh snapshot FILE       what is there now, into FILE
#   tests/leftovers.sh check FILE [RC]     what is there now and was not then
#
# The check counts as one test: it passes when nothing new is left, and
# fails naming each leftover.  It appends "leftovers PASS FAIL SKIP" to
# $TEST_COUNTS when set (tests/summary.sh).  RC is the suites' exit status:
# when they failed, a /tmp folder may be the evidence a failed test kept on
# purpose, so folders are listed but not counted again; segments still are.
#
# Comparing with the snapshot keeps what was there before the run (another
# user's, an earlier run's) out of it.  Not counted either, because they
# belong to something still running beside this run: a segment whose
# batond (the PID in its name) is alive, and a /tmp entry that a running
# process has open, works in or names on its command line, or that another
# user owns.  Another test run on the same machine that leaves something
# behind while this one runs is counted here too.
set -u
mode=${1:-}
file=${2:-}
[ -n "$mode" ] && [ -n "$file" ] || { echo "usage: leftovers.sh snapshot|check FILE [RC]" >&2; exit 2; }

list() {
  local f
  for f in /dev/shm/baton-* /tmp/baton*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    echo "$f"
  done | sort
}

if [ "$mode" = snapshot ]; then
  list > "$file"
  exit 0
fi
[ "$mode" = check ] || { echo "usage: leftovers.sh snapshot|check FILE [RC]" >&2; exit 2; }
suites_rc=${3:-0}
[ -f "$file" ] || { echo "leftovers: no snapshot $file" >&2; exit 2; }

# What running processes hold: working folders, open files, command lines.
held=$(for p in /proc/[0-9]*; do
         readlink "$p/cwd" "$p"/fd/* 2>/dev/null
         { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null; echo
       done)
in_use() {
  case $1 in
    /dev/shm/baton-*)
      local pid=${1#/dev/shm/baton-}; pid=${pid%%-*}
      [[ $pid =~ ^[0-9]+$ ]] && [ -d "/proc/$pid" ] ;;
    *) grep -qF -- "$1" <<<"$held" ;;
  esac
}

me=$(id -u)
left=(); kept=()
while IFS= read -r f; do
  [ -n "$f" ] || continue
  [ "$(stat -c %u "$f" 2>/dev/null)" = "$me" ] || continue
  in_use "$f" && continue
  if [ "$suites_rc" -ne 0 ] && [[ $f == /tmp/* ]]; then kept+=("$f"); else left+=("$f"); fi
done < <(comm -13 "$file" <(list))

for f in "${kept[@]}"; do
  echo "leftovers: $f (kept by the failed run; not counted again)"
done
if [ ${#left[@]} -eq 0 ]; then
  echo "leftovers: this run left nothing${kept:+ else} in /dev/shm or /tmp"
  pass=1; fail=0
else
  echo "FAIL leftovers: this run left ${#left[@]} thing(s) behind:"
  for f in "${left[@]}"; do
    if [ -d "$f" ]; then echo "  $f/ (holding $(find "$f" -mindepth 1 | wc -l))"; else echo "  $f"; fi
  done
  pass=0; fail=1
fi
[ -n "${TEST_COUNTS:-}" ] && echo "leftovers $pass $fail 0" >> "$TEST_COUNTS"
[ "$fail" -eq 0 ]
