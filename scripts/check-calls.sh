#!/usr/bin/env bash
# Checks, on the built objects, that no file of a layered component calls a
# function of a file above it or beside it: for every symbol a file of
# COMPONENT leaves undefined and another file of COMPONENT defines, the
# defining file must come earlier in the component's order (order_COMPONENT
# in scripts/check-includes.sh, the one list of the layers).  The include
# check alone could be got round with a prototype written by hand; the
# objects' symbols cannot.  A call only ever going downwards is also what
# makes the files free of circles: no two of them call each other,
# directly or round a loop.
#
#   [SRCDIR=DIR] scripts/check-calls.sh OBJDIR COMPONENT...
#
# OBJDIR is the build's object folder (build/obj): its COMPONENT/*.o are
# read with nm, those of a source file that exists (a build folder may
# hold objects of files since removed).  SRCDIR (default: the repository)
# holds the sources.  Prints each offending call and exits 1; exits 0
# quietly.
set -u
here=$(cd "$(dirname "$0")" && pwd)
srcdir=${SRCDIR:-$here/..}
objdir=${1:?usage: check-calls.sh OBJDIR COMPONENT...}
shift
fail=0
for comp in "$@"; do
    order=$(sed -n "s/^order_$comp='\(.*\)'$/\1/p" "$here/check-includes.sh")
    if [ -z "$order" ]; then
        echo "check-calls: $comp has no order_$comp in scripts/check-includes.sh" >&2
        exit 2
    fi
    declare -A rank=() def=()
    i=0
    for f in $order; do rank[$f]=$i; i=$((i + 1)); done
    objs=()
    for o in "$objdir/$comp"/*.o; do
        [ -f "$o" ] && [ -f "$srcdir/$comp/$(basename "$o" .o).c" ] && objs+=("$o")
    done
    for o in "${objs[@]}"; do
        f=$(basename "$o" .o)
        while read -r _ _ sym; do
            def[$sym]=$f
        done < <(nm -g --defined-only "$o" 2>/dev/null | awk 'NF == 3 && $2 ~ /[TDBR]/')
    done
    for o in "${objs[@]}"; do
        f=$(basename "$o" .o)
        if [ -z "${rank[$f]+x}" ]; then
            echo "$comp/$f.c: not in order_$comp of scripts/check-includes.sh" >&2
            fail=1
            continue
        fi
        while read -r _ sym; do
            g=${def[$sym]:-}
            [ -n "$g" ] && [ "$g" != "$f" ] || continue
            if [ -z "${rank[$g]+x}" ] || [ "${rank[$g]}" -ge "${rank[$f]}" ]; then
                echo "$comp/$f.c calls $sym of $comp/$g.c, which is not below it" \
                     "(order: $order)" >&2
                fail=1
            fi
        done < <(nm -u "$o" 2>/dev/null)
    done
    unset rank def
done
if [ $fail -ne 0 ]; then
    echo "check-calls: a file calls upwards (see above)" >&2
    exit 1
fi
exit 0
