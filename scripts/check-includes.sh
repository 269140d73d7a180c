#!/usr/bin/env bash
# Checks that every #include "..." in the sources follows the layering of
# docs/architecture.md: a component includes its own headers and those of
# the components below it, never one above it or beside it.  `make` runs it
# before building; it prints each offending line and exits 1.
#
#   scripts/check-includes.sh [ROOT]      (ROOT defaults to the repository)
#
# Paths are matched by prefix: "kernels" allows every header under
# kernels/, "backends/catalog.h" only that one file.  Headers of the public
# API (include/baton/, named "baton/...") and the generated protocol
# ("proto/...") sit at the bottom and may be included by anyone.
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2

# component: what its files may include besides the bottom layer
rules='
common:   common
kernels:  kernels common
backends: backends kernels common
config:   config backends/catalog.h kernels/sched.h common
runtime:  runtime config common
daemon:   daemon runtime config common
worker:   worker backends/builtin.h config common
client:   client common/curve.h common/ipcfile.h
cudaemu:  cudaemu
'

# Inside these components the files are layered too, lowest first: a file
# includes the headers of the files before it, its own, and the header that
# carries the component's name (its public types), never one after it.
order_daemon='zap deadlines clients replicas metrics textlimit door openai gateway pairs workers identity spawner tpgroups roster supervisor tensors dispatch outbound frontend conductor main_batond'
order_runtime='core speculation registry progress runtime'
order_worker='pool join segment device peers plugin xfer events copier store wire item inputs ctx executor runahead tp pull nccl report load accept tensorio worker main_worker'

allowed_for() {
    awk -v c="$1" -F': *' '$1 == c { print $2 }' <<<"$rules"
}

fail=0
for comp in $(awk -F: 'NF > 1 { print $1 }' <<<"$rules"); do
    [ -d "$comp" ] || continue
    allow="$(allowed_for "$comp") baton proto"
    while IFS= read -r hit; do
        [ -n "$hit" ] || continue
        file=${hit%%:*}
        rest=${hit#*:}
        line=${rest%%:*}
        inc=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' <<<"${rest#*:}")
        [ -n "$inc" ] || continue
        # Headers beside the file (no folder) are its own component's.
        case $inc in */*) ;; *) continue ;; esac
        ok=0
        for a in $allow; do
            case $inc in "$a"|"$a"/*) ok=1; break ;; esac
        done
        # Within backends/, one backend's folder does not reach into
        # another's; only the files directly in backends/ (the catalog and
        # the table of built-ins) name them all.
        why="$comp/ may include only: $allow"
        if [ $ok -eq 1 ] && [ "$comp" = backends ]; then
            own=$(cut -d/ -f2 <<<"$file")
            case $file in backends/*/*)
                case $inc in
                    backends/"$own"/*) ;;
                    backends/*/*) ok=0; why="it is another backend's header" ;;
                esac ;;
            esac
        fi
        # Within a layered component: only files below this one.
        order_var="order_$comp"
        order=${!order_var:-}
        if [ $ok -eq 1 ] && [ -n "$order" ] && [ "${inc%%/*}" = "$comp" ]; then
            me=$(basename "$file"); me=${me%.*}
            it=$(basename "$inc"); it=${it%.*}
            rank() { local i=0 x; for x in $order; do [ "$x" = "$1" ] && { echo $i; return; }; i=$((i + 1)); done; echo -1; }
            rme=$(rank "$me"); rit=$(rank "$it")
            if [ "$it" != "$me" ] && [ "$it" != "$comp" ]; then
                if [ "$rme" -lt 0 ] || [ "$rit" -lt 0 ]; then
                    ok=0; why="$comp/ is layered file by file: add the new file to order_$comp in $0"
                elif [ "$rit" -gt "$rme" ]; then
                    ok=0; why="$it is above $me in $comp/ (order: $order)"
                fi
            fi
        fi
        if [ $ok -eq 0 ]; then
            echo "$file:$line: includes \"$inc\": $why" >&2
            fail=1
        fi
    done < <(grep -rn --include='*.c' --include='*.cc' --include='*.h' --include='*.cu' --include='*.cuh' \
                 -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$comp" 2>/dev/null)
done
if [ $fail -ne 0 ]; then
    echo "check-includes: the layering of docs/architecture.md is broken (see above)" >&2
    exit 1
fi
exit 0
