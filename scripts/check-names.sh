#!/usr/bin/env bash
# Checks that every file git tracks has a plain name: letters, digits and
# . _ / + @ - only.  A name with a space, a quote, a backslash or a shell
# metacharacter is almost always a mistake (a command's output redirected
# into a file named after part of the command), and it breaks scripts that
# do not quote.  `make` runs it beside check-includes.sh; it prints each
# offending name and exits 1.
#
#   scripts/check-names.sh [ROOT]      (ROOT defaults to the repository)
#
# Outside a git checkout (a release tarball, a Docker build context without
# .git) there is nothing tracked to check: it passes and says nothing.
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
command -v git >/dev/null 2>&1 || exit 0
git rev-parse --git-dir >/dev/null 2>&1 || exit 0

fail=0
# NUL-separated, so that git quotes nothing and a name with a newline is
# one name; LC_ALL=C makes the ranges bytes, so any non-ASCII byte fails.
while IFS= read -r -d '' name; do
    # Shown with control characters made visible (a newline as \n).
    shown=$(printf '%s' "${name//$'\n'/\\n}" | LC_ALL=C cat -vT)
    echo "$shown: tracked file name outside [A-Za-z0-9._/+@-]" >&2
    fail=1
done < <(git ls-files -z | LC_ALL=C grep -zv '^[A-Za-z0-9._/+@-]*$')
if [ $fail -ne 0 ]; then
    echo "check-names: rename or 'git rm' the files above" >&2
    exit 1
fi
exit 0
