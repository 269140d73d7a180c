#!/usr/bin/env bash
# Prints the totals of the test suites from the file given: the lines
# "SUITE PASS FAIL SKIP" the runners appended (tests/run-unit.sh,
# tests/integration/run.sh, tests/cudaemu/run.sh) and the lines
# "SUITE notrun REASON" tests/run-suites.sh wrote for a suite that did not
# run.  One line per suite, then one for all:
#
#     unit           294 passed,    0 failed,    1 skipped
#     integration     28 passed,    1 failed,    3 skipped
#     cudaemu: not run (its build failed (make emu))
#   tests: 322 passed, 1 failed, 4 skipped; not run: cudaemu
#
#   tests/summary.sh COUNTS [SUITE...]
#
# Each SUITE named that has no line at all is shown "not run (not
# reached)".  Exits 1 when a test failed or a suite did not run.
set -u
f=$1; shift
[ -e "$f" ] || : >"$f" 2>/dev/null
awk -v want="$*" '
  $2 == "notrun" { why = $0; sub(/^[^ ]+ notrun /, "", why); notrun[$1] = why; order[n++] = $1; next }
  NF == 4 { pass[$1] += $2; fail[$1] += $3; skip[$1] += $4; ran[$1] = 1; order[n++] = $1 }
  END {
    k = split(want, w, " ")
    for (i = 1; i <= k; i++) if (!(w[i] in ran) && !(w[i] in notrun)) { notrun[w[i]] = "not reached"; order[n++] = w[i] }
    for (i = 0; i < n; i++) {
      s = order[i]
      if (s in shown) continue
      shown[s] = 1
      if (s in ran) {
        printf "  %-12s %5d passed, %4d failed, %4d skipped\n", s, pass[s], fail[s], skip[s]
        p += pass[s]; f += fail[s]; sk += skip[s]
      } else {
        printf "  %s: not run (%s)\n", s, notrun[s]
        missing = missing (missing == "" ? "" : ", ") s
      }
    }
    if (n == 0) { print "tests: no suite reported counts"; exit 1 }
    printf "tests: %d passed, %d failed, %d skipped%s\n", p, f, sk, missing == "" ? "" : "; not run: " missing
    exit (f > 0 || missing != "") ? 1 : 0
  }' "$f"
