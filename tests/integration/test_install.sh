#!/usr/bin/env bash
# `make install` and libbatonclient as a program outside the tree uses it:
# installs into a DESTDIR (PREFIX=/usr/local), checks what lands there, then
# compiles a small C program against the installed tree with nothing but
# what pkg-config says (PKG_CONFIG_SYSROOT_DIR and PKG_CONFIG_PATH point into
# the DESTDIR), once with `baton-client` (libbatonclient.so) and once with
# `baton-client-static` (libbatonclient.a), and runs both.  A missing
# library, header or .pc file fails the compile, the link or the run.
#
#   BUILD=build bash tests/integration/test_install.sh
#
# Exit status 0 (pass) or 1 (fail); tests/integration/run.sh runs it.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
. tests/integration/lib_install.sh

tmp=$(mktemp -d /tmp/baton-install-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
if ! make_install "$root" PREFIX=/usr/local >"$tmp/install.log" 2>&1; then
  cat "$tmp/install.log"
  echo "FAIL: make install DESTDIR=$root PREFIX=/usr/local"
  exit 1
fi
pass "make install DESTDIR=... PREFIX=/usr/local"
p=$root/usr/local

# ---- what is installed ------------------------------------------------------
for f in bin/batond bin/baton-worker bin/batonctl; do
  [ -x "$p/$f" ] && pass "$f" || fail "$f is not installed (or not executable)"
done
for f in include/baton/client.h include/baton/version.h include/baton/backend.h \
         lib/libbatonclient.a lib/pkgconfig/baton-client.pc lib/pkgconfig/baton-client-static.pc; do
  [ -f "$p/$f" ] && pass "$f" || fail "$f is not installed"
done
if [ -f "$p/lib/libbatonclient.so.0" ] && [ ! -L "$p/lib/libbatonclient.so.0" ] &&
   [ "$(readlink "$p/lib/libbatonclient.so")" = libbatonclient.so.0 ]; then
  pass "lib/libbatonclient.so.0, and libbatonclient.so -> libbatonclient.so.0"
else
  fail "lib/libbatonclient.so.0 (a file) and the link libbatonclient.so -> libbatonclient.so.0"
fi
soname=$(readelf -d "$p/lib/libbatonclient.so.0" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libbatonclient.so.0 ] && pass "soname $soname" || fail "soname '$soname'"
if nm "$p/lib/libbatonclient.a" 2>/dev/null | grep -q ' T baton_client_create$'; then
  pass "libbatonclient.a defines baton_client_create"
else
  fail "libbatonclient.a does not define baton_client_create"
fi
# The documents, with every relative link of each pointing at an installed
# file (a link to what is not installed names the source tree's file).
for f in README.md docs/architecture.md docs/operations.md docs/protocol.md docs/http-api.md \
         docs/multihost.md docs/cuda-emulator.md config/README.md proto/baton.proto; do
  [ -f "$p/share/baton/$f" ] && pass "share/baton/$f" || fail "share/baton/$f is not installed"
done
dead=$(python3 - "$p/share/baton" <<'EOF'
import os, re, sys
root = sys.argv[1]
link = re.compile(r"\[([^\]]*)\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s]+)\)")
for d, _, files in os.walk(root):
    for f in files:
        if f.endswith(".md"):
            path = os.path.join(d, f)
            for m in link.finditer(open(path, encoding="utf-8").read()):
                if not os.path.exists(os.path.join(d, m.group(2).split("#")[0])):
                    print("%s: %s" % (os.path.relpath(path, root), m.group(0)))
EOF
)
if [ -z "$dead" ]; then pass "every relative link of the installed documents reaches an installed file"
else fail "dead links in the installed documents:"; echo "$dead"; fi
if grep -qF '`tests/README.md` in baton'"'"'s source tree' "$p/share/baton/README.md" &&
   grep -qF '](docs/operations.md)' "$p/share/baton/README.md"; then
  pass "README.md: links to the installed docs kept, to tests/README.md named as a path"
else
  fail "share/baton/README.md: links not as expected"
fi

# No path of the build tree or of the DESTDIR may leak into the .pc files.
if grep -qE "$tmp|$(pwd)" "$p"/lib/pkgconfig/*.pc; then
  fail "a .pc file names the build or DESTDIR path:"; cat "$p"/lib/pkgconfig/*.pc
else
  pass "the .pc files name only PREFIX"
fi

# ---- pkg-config against the installed tree ----------------------------------
export PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_PATH=$p/lib/pkgconfig
version=$(sed -n 's/^#define BATON_VERSION "\(.*\)"/\1/p' include/baton/version.h)
for m in baton-client baton-client-static; do
  v=$(pkg-config --modversion "$m" 2>&1)
  [ "$v" = "$version" ] && pass "pkg-config --modversion $m: $v" || fail "pkg-config --modversion $m: '$v', expected '$version'"
done
cflags=$(pkg-config --cflags baton-client)
libs=$(pkg-config --libs baton-client)
grep -qF -- "-I$p/include" <<<"$cflags" && pass "--cflags: -I$p/include" || fail "--cflags '$cflags' lacks -I$p/include"
grep -qF -- "-L$p/lib" <<<"$libs" && pass "--libs: -L$p/lib" || fail "--libs '$libs' lacks -L$p/lib"
# The archive needs libzmq and protobuf-c on the link line; the shared
# library names them itself.
slibs=$(pkg-config --static --libs baton-client)
if grep -qw -- -lzmq <<<"$slibs" && grep -qw -- -lprotobuf-c <<<"$slibs"; then pass "--static --libs adds -lzmq -lprotobuf-c"
else fail "--static --libs baton-client: '$slibs' lacks -lzmq or -lprotobuf-c"; fi

cat >"$tmp/hello.c" <<'EOF'
/* A client of baton outside its tree: the installed headers and library. */
#include <stdio.h>
#include <baton/client.h>
#include <baton/version.h>

int main(void)
{
    baton_client *c = NULL;
    /* Connecting is asynchronous: no daemon is needed to create one. */
    if (baton_client_create("ipc:///nonexistent/baton-install-test.sock", &c) != 0)
        return 2;
    baton_client_destroy(c);
    printf("baton %s: %s\n", BATON_VERSION, baton_client_strerror(BATON_CLIENT_ETIMEDOUT));
    return 0;
}
EOF
want="baton $version: timed out waiting for the daemon"
# A sanitizer build's library needs the sanitizer runtimes in the program.
san=
nm -D "$p/lib/libbatonclient.so.0" 2>/dev/null | grep -q ' U __asan_' && san="-fsanitize=address,undefined"

# shellcheck disable=SC2046,SC2086
if cc $san -Wall -Wextra -Werror -o "$tmp/hello-shared" "$tmp/hello.c" \
      $(pkg-config --cflags --libs baton-client) 2>"$tmp/cc.err"; then
  pass "cc hello.c \$(pkg-config --cflags --libs baton-client)"
  if readelf -d "$tmp/hello-shared" | grep -q 'NEEDED.*\[libbatonclient\.so\.0\]'; then
    pass "hello-shared needs libbatonclient.so.0"
  else
    fail "hello-shared does not load libbatonclient.so.0"
  fi
  resolved=$(LD_LIBRARY_PATH=$p/lib ldd "$tmp/hello-shared" | awk '$1 == "libbatonclient.so.0" {print $3}')
  [ "$resolved" = "$p/lib/libbatonclient.so.0" ] && pass "it loads the installed one" ||
    fail "hello-shared loads '$resolved', not $p/lib/libbatonclient.so.0"
  out=$(LD_LIBRARY_PATH=$p/lib "$tmp/hello-shared" 2>&1)
  [ "$out" = "$want" ] && pass "hello-shared prints: $out" || fail "hello-shared printed '$out', expected '$want'"
else
  fail "compiling against baton-client:"; cat "$tmp/cc.err"
fi

# shellcheck disable=SC2046,SC2086
if cc $san -Wall -Wextra -Werror -o "$tmp/hello-static" "$tmp/hello.c" \
      $(pkg-config --cflags --libs baton-client-static) 2>"$tmp/cc.err"; then
  pass "cc hello.c \$(pkg-config --cflags --libs baton-client-static)"
  if readelf -d "$tmp/hello-static" | grep -q 'libbatonclient'; then
    fail "hello-static still loads libbatonclient.so"
  else
    pass "hello-static has libbatonclient linked in"
  fi
  out=$(env -u LD_LIBRARY_PATH "$tmp/hello-static" 2>&1)
  [ "$out" = "$want" ] && pass "hello-static prints: $out" || fail "hello-static printed '$out', expected '$want'"
else
  fail "compiling against baton-client-static:"; cat "$tmp/cc.err"
fi

if [ $fails -eq 0 ]; then echo "test_install: passed"; exit 0; fi
echo "test_install: $fails failed"
exit 1
