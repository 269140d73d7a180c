#!/usr/bin/env bash
# What a test run leaves behind: POSIX shm segments of baton (/dev/shm/baton-*:
# workers' pools, /baton-<batond pid>-<run>-<worker>) and files or folders
# /tmp/baton* (test folders, socket folders).  `make test` and `make
# asan-test` take a snapshot before the suites and check after them:
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
# user's, an earlier run's) out of it.  Not counted either: what another
# user owns; a segment whose batond (the PID in its name) is alive; a /tmp
# entry that a running process has open, works in, or names on its command
# line or in its environment.  And what may be another run's: from the
# snapshot to the check a watcher started by `snapshot` notes every few
# seconds the baton test processes (batond, baton-worker, the runners and
# test programs) that are not descendants of the shell that took the
# snapshot.  When it saw any, another checkout's tests ran beside this
# run, and a /tmp entry, which names no process, could be theirs: it is
# listed, not counted.  A segment is still counted when its batond was
# seen among this run's, and left out when it was seen among the others'.
# BATON_LEFTOVERS_WATCH=0 starts no watcher: nothing is then taken for
# another run's (tests/integration/run.sh checks this script that way).
set -u
mode=${1:-}
file=${2:-}
usage() { echo "usage: leftovers.sh snapshot|check FILE [RC]" >&2; exit 2; }
[ -n "$mode" ] && [ -n "$file" ] || usage

list() {
  local f
  for f in /dev/shm/baton-* /tmp/baton*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    echo "$f"
  done | sort
}

# The processes of baton's tests: the daemons, the runners, the test
# programs.  Not the workers: a worker outliving its batond for a moment
# belongs to nobody, and another run always shows its batond or runner.
BATON_PROCS='(^|/)(batond|batond-pollfail)( |$)|tests/(run-unit\.sh|integration/|cudaemu/)|/tests/test_[a-z_]+( |$)|/cudaemu/test_'

# watch ROOT: until ROOT exits or FILE.stop appears, every 2 s, appends to
# FILE.procs "ours|theirs PID COMMAND" for each baton test process not
# seen before, ours when ROOT is among its ancestors.
watch() {
  local root=$1 seen=" " line pid ppid rest cmd
  declare -A parent
  while kill -0 "$root" 2>/dev/null && [ ! -e "$file.stop" ]; do
    parent=()
    for s in /proc/[0-9]*/stat; do
      read -r line <"$s" 2>/dev/null || continue
      pid=${line%% *}; rest=${line##*) }
      read -r _ ppid _ <<<"$rest"
      parent[$pid]=$ppid
    done
    for pid in "${!parent[@]}"; do
      case $seen in *" $pid "*) continue ;; esac
      cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
      [[ $cmd =~ $BATON_PROCS ]] || continue
      seen+="$pid "
      local p=$pid who=theirs
      while [ -n "$p" ] && [ "$p" != 0 ]; do
        [ "$p" = "$root" ] && { who=ours; break; }
        p=${parent[$p]:-}
      done
      echo "$who $pid $(readlink "/proc/$pid/cwd" 2>/dev/null): ${cmd:0:200}" >>"$file.procs"
    done
    sleep 2
  done
}

if [ "$mode" = snapshot ]; then
  list >"$file"
  rm -f "$file.procs" "$file.stop"
  : >"$file.procs"
  rm -f "$file.watcher"
  if [ "${BATON_LEFTOVERS_WATCH:-1}" != 0 ]; then
    # The caller's shell runs the suites: what descends from it is this run.
    watch "$PPID" </dev/null >/dev/null 2>&1 &
    echo $! >"$file.watcher"
  fi
  exit 0
fi
[ "$mode" = check ] || usage
suites_rc=${3:-0}
[ -f "$file" ] || { echo "leftovers: no snapshot $file" >&2; exit 2; }

# The watcher ends at its next look (within 2 s).
if [ -f "$file.watcher" ]; then
  w=$(cat "$file.watcher")
  touch "$file.stop"
  for _ in $(seq 50); do kill -0 "$w" 2>/dev/null || break; sleep 0.1; done
fi
others=$(grep '^theirs ' "$file.procs" 2>/dev/null)
# The batond PIDs seen, for the segments (their names start with it).
batonds() { grep "^$1 " "$file.procs" 2>/dev/null | grep -E ': [^ ]*batond(-pollfail)? ' | awk '{print $2}'; }
our_batonds=" $(batonds ours | tr '\n' ' ') "
their_batonds=" $(batonds theirs | tr '\n' ' ') "

# What running processes hold: working folders, open files, command lines
# and environments.
held=$(for p in /proc/[0-9]*; do
         readlink "$p/cwd" "$p"/fd/* 2>/dev/null
         { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null; echo
         { tr '\0' ' ' <"$p/environ"; } 2>/dev/null; echo
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
left=(); kept=(); maybe=()
while IFS= read -r f; do
  [ -n "$f" ] || continue
  [ "$(stat -c %u "$f" 2>/dev/null)" = "$me" ] || continue
  in_use "$f" && continue
  if [[ $f == /dev/shm/* ]]; then
    pid=${f#/dev/shm/baton-}; pid=${pid%%-*}
    case $our_batonds in *" $pid "*) left+=("$f"); continue ;; esac
    case $their_batonds in *" $pid "*) continue ;; esac
  fi
  if [ -n "$others" ]; then maybe+=("$f")
  elif [ "$suites_rc" -ne 0 ] && [[ $f == /tmp/* ]]; then kept+=("$f")
  else left+=("$f"); fi
done < <(comm -13 "$file" <(list))
rm -f "$file.procs" "$file.stop" "$file.watcher"

for f in "${kept[@]}"; do
  echo "leftovers: $f (kept by the failed run; not counted again)"
done
if [ ${#maybe[@]} -gt 0 ]; then
  echo "leftovers: baton tests of another checkout ran beside this run, e.g."
  head -n 3 <<<"$others" | sed 's/^theirs /  pid /'
  echo "leftovers: so these may be theirs (not counted):"
  printf '  %s\n' "${maybe[@]}"
fi
if [ ${#left[@]} -eq 0 ]; then
  else_=; [ ${#kept[@]} -gt 0 ] || [ ${#maybe[@]} -gt 0 ] && else_=" else"
  echo "leftovers: this run left nothing$else_ in /dev/shm or /tmp"
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
