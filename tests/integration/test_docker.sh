#!/usr/bin/env bash
# The images (Dockerfile.cpu, Dockerfile) without a Docker engine: what can
# be checked of them outside Docker.
#
#   1. The Dockerfiles: every RUN step runs a script of scripts/ (so that
#      this test runs what the image build runs); the CPU image is Debian 12
#      slim, EXPOSEs the port of its config's http_listen, has a
#      HEALTHCHECK on /health and STOPSIGNAL SIGTERM, and its `docker run`
#      example gives a --stop-timeout above drain_timeout_ms + 3 s; the CUDA
#      image's CUDA version is the local nvcc's (when there is one).
#   2. The CPU image's config is chat-cpu.yaml but for paths and address.
#   3. The build stage, `scripts/docker-build.sh stage`, run on this
#      checkout: it reuses build/ and models/ (no rebuild, no download) and
#      installs into a temporary tree, as the image's /.
#   4. The runtime stage: `runtime-deps --check` (its packages are
#      installed here), every library the installed programs load comes from
#      those packages or their dependencies (so that the slim image has it),
#      and `setup --root` on the tree.
#   5. The installed batond serves the image's config from that tree (paths
#      moved into it, another port): /health answers 200 and the
#      HEALTHCHECK command passes; SIGTERM ends it, with status 0, within the
#      stop timeout.
#
#   BUILD=build bash tests/integration/test_docker.sh
#
# Exit status 0 (pass), 1 (fail), 77 with a line saying SKIP when the model
# is absent (scripts/fetch-model.sh); parts 1 and 2 run anyway.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
. tests/integration/lib_install.sh

CONF=config/examples/chat-cpu-docker.yaml

# ---- 1. the Dockerfiles -------------------------------------------------------
# run_steps FILE: its RUN instructions, continuation lines joined.
run_steps() { sed -e ':a' -e '/\\$/N; s/\\\n[[:space:]]*/ /; ta' "$1" | grep '^RUN '; }
for df in Dockerfile.cpu Dockerfile; do
  n=0
  while read -r step; do
    n=$((n + 1))
    # RUN [VAR=value ...] bash SCRIPT [args]: SCRIPT is a file of scripts/,
    # or the copy of one that a COPY line of the same file puts there.
    script=$(sed -E -n 's#^RUN ([A-Z_]+=[^ ]+ )*bash ([^ ;&|]+\.sh)( [^;&|]*)?$#\2#p' <<<"$step")
    case "$script" in
      scripts/*) src=$script ;;
      /*) src=$(sed -n "s#^COPY \(scripts/[^ ]*\.sh\) $script\$#\1#p" "$df") ;;
      *) src= ;;
    esac
    if [ -n "$src" ] && [ -f "$src" ]; then pass "$df: $step"
    else fail "$df: '$step' is not one script of scripts/"; fi
  done < <(run_steps "$df")
  [ $n -gt 0 ] || fail "$df: no RUN step found"
done

port=$(sed -n 's/^  http_listen: 0\.0\.0\.0:\([0-9]*\)$/\1/p' "$CONF")
[ -n "$port" ] && pass "$CONF: http_listen on 0.0.0.0:$port" || fail "$CONF does not listen on 0.0.0.0"
[ "$(grep -c '^FROM debian:12-slim' Dockerfile.cpu)" -eq 2 ] && pass "Dockerfile.cpu: both stages FROM debian:12-slim" ||
  fail "Dockerfile.cpu: stages are not FROM debian:12-slim"
grep -q -- "--config $CONF" Dockerfile.cpu && pass "Dockerfile.cpu installs $CONF" || fail "Dockerfile.cpu does not install $CONF"
grep -qx "EXPOSE ${port:-none}" Dockerfile.cpu && pass "Dockerfile.cpu: EXPOSE $port" || fail "Dockerfile.cpu: no EXPOSE ${port:-}"
grep -qx 'STOPSIGNAL SIGTERM' Dockerfile.cpu && pass "Dockerfile.cpu: STOPSIGNAL SIGTERM" || fail "Dockerfile.cpu: no STOPSIGNAL SIGTERM"
health=$(sed -e ':a' -e '/\\$/N; s/\\\n[[:space:]]*/ /; ta' Dockerfile.cpu | sed -n 's/^HEALTHCHECK .* CMD \(.*\)$/\1/p')
grep -qF "http://127.0.0.1:${port:-none}/health" <<<"$health" && pass "Dockerfile.cpu: HEALTHCHECK CMD $health" ||
  fail "Dockerfile.cpu: no HEALTHCHECK on http://127.0.0.1:$port/health"
drain_ms=$(sed -n 's/^  drain_timeout_ms: \([0-9]*\)$/\1/p' "$CONF")
for df in Dockerfile.cpu Dockerfile; do
  stop=$(sed -n 's/.*--stop-timeout \([0-9]*\).*/\1/p' "$df" | head -n 1)
  if [ -n "$stop" ] && [ -n "$drain_ms" ] && [ $((stop * 1000)) -gt $((drain_ms + 3000)) ]; then
    pass "$df: docker run --stop-timeout $stop > drain_timeout_ms $drain_ms + 3 s"
  else
    fail "$df: --stop-timeout '${stop:-}' does not exceed drain_timeout_ms '${drain_ms:-}' + 3 s"
  fi
done
cuda=$(sed -n 's/^ARG CUDA_VERSION=\(.*\)$/\1/p' Dockerfile)
grep -q '^FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build$' Dockerfile &&
grep -q '^FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU} AS runtime$' Dockerfile &&
  pass "Dockerfile: nvidia/cuda:$cuda-devel/-runtime" || fail "Dockerfile: FROM lines"
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
if [ -n "$nvcc" ]; then
  release=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\),.*/\1/p')
  [ "${cuda%.*}" = "$release" ] && pass "Dockerfile: CUDA $cuda is nvcc's release $release" ||
    fail "Dockerfile: CUDA_VERSION $cuda, but nvcc here is release $release"
fi

# ---- 2. the image's config ----------------------------------------------------
if out=$(same_as_chat_cpu "$CONF"); then pass "$CONF is chat-cpu.yaml but for paths and address"
else fail "$CONF departs from chat-cpu.yaml:"; echo "$out"; fi

if [ ! -f models/smollm2-135m-instruct-q4_1.gguf ]; then
  [ $fails -eq 0 ] || { echo "test_docker: $fails failed"; exit 1; }
  if [ "${BATON_CI:-}" = 1 ]; then
    echo "FAIL test_docker.sh: no model in models/, and with BATON_CI=1 the model tests must run"
    exit 1
  fi
  if [ "${BATON_OFFLINE:-}" = 1 ]; then
    echo "SKIP test_docker.sh (stage, runtime, serving): no model in models/ (BATON_OFFLINE=1: scripts/fetch-model.sh did not fetch it)"
  else
    echo "SKIP test_docker.sh (stage, runtime, serving): no model in models/ (scripts/fetch-model.sh)"
  fi
  exit 77
fi

# ---- 3. the build stage ---------------------------------------------------------
tmp=$(mktemp -d /tmp/baton-docker-test.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
root=$tmp/root
if JOBS=1 bash scripts/docker-build.sh stage "$root" --config "$CONF" >"$tmp/stage.log" 2>&1; then
  pass "docker-build.sh stage (reusing $BUILD and models/)"
else
  cat "$tmp/stage.log"; fail "docker-build.sh stage"; echo "test_docker: $fails failed"; exit 1
fi
cmp -s "$root/etc/baton/baton.yaml" "$CONF" && pass "staged /etc/baton/baton.yaml is $CONF" || fail "staged /etc/baton/baton.yaml"
cmp -s "$root/var/lib/baton/models/smollm2-135m-instruct-q4_1.gguf" models/smollm2-135m-instruct-q4_1.gguf &&
  pass "staged /var/lib/baton/models/smollm2-135m-instruct-q4_1.gguf" || fail "the model is not staged"

# ---- 4. the runtime stage -------------------------------------------------------
if out=$(bash scripts/docker-build.sh runtime-deps --check 2>&1); then pass "docker-build.sh runtime-deps --check"
else fail "docker-build.sh runtime-deps --check: $out"; fi
# Each library the programs load belongs to a package that the runtime
# packages are or pull in (Depends, Pre-Depends, recursively): apt installs
# exactly those in the slim image.  Not checked: CUDA's libraries (this
# checkout may be built with nvcc; the CPU image is built with CUDA=0 and
# the CUDA image has them) and the sanitizers' runtimes (make asan-test).
libs=$(for f in "$root"/usr/local/bin/* "$root"/usr/local/lib/libbatonclient.so.0; do
         LD_LIBRARY_PATH=$root/usr/local/lib ldd "$f"; done |
       awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
       grep -v -e '^/usr/local/cuda' -e "^$root/" -e '/lib\(a\|ub\)san\.so')
pkgs=$(for l in $libs; do
         for c in "$l" "$(readlink -f "$l")" "/usr$l" "${l#/usr}"; do
           p=$(dpkg -S "$c" 2>/dev/null | head -n 1 | cut -d: -f1) && [ -n "$p" ] && { echo "$p"; break; }
         done || echo "?$l"
       done | sort -u)
# shellcheck disable=SC2046  # one argument per package name
closure=$(python3 - $(bash scripts/docker-build.sh runtime-deps --list) <<'EOF'
import re, subprocess, sys
out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Provides}\t${Depends}, ${Pre-Depends}\n"],
                     capture_output=True, text=True).stdout
deps, provides = {}, {}
for line in out.splitlines():
    name, prov, dep = line.split("\t")
    deps[name] = [[re.sub(r"[ (:].*", "", a.strip()) for a in d.split("|")] for d in dep.split(",") if d.strip()]
    for p in prov.split(","):
        if p.strip():
            provides.setdefault(re.sub(r"[ (:].*", "", p.strip()), []).append(name)
seen, queue = set(), list(sys.argv[1:])
while queue:
    p = queue.pop()
    if p in seen:
        continue
    seen.add(p)
    for alts in deps.get(p, []):
        for a in alts:
            queue.extend([a] if a in deps else provides.get(a, []))
print("\n".join(sorted(seen)))
EOF
)
missing=$(comm -23 <(grep -v '^?' <<<"$pkgs" | sort) <(sort <<<"$closure"))
unknown=$(grep '^?' <<<"$pkgs")
if [ -z "$missing" ] && [ -z "$unknown" ] && [ -n "$pkgs" ]; then
  pass "every loaded library comes with the runtime packages ($(wc -l <<<"$pkgs") packages)"
else
  fail "libraries from packages the runtime stage does not install: ${missing//$'\n'/ } ${unknown//$'\n'/ }"
fi
if out=$(bash scripts/docker-build.sh setup --root "$root" 2>&1); then pass "docker-build.sh setup --root"
else fail "docker-build.sh setup --root:"; echo "$out"; fi

# ---- 5. serving the image's config ----------------------------------------------
# The image's paths moved into the tree, the port to a free one; the
# address stays 0.0.0.0 as in the image.
hport=$(free_port)
sed -e "s#ipc:///run/baton/#ipc://$root/run/baton/#" -e "s#/var/lib/baton/#$root/var/lib/baton/#" \
    -e "s#http_listen: 0\.0\.0\.0:$port#http_listen: 0.0.0.0:$hport#" "$CONF" >"$tmp/baton.yaml"
grep -q "0.0.0.0:$hport" "$tmp/baton.yaml" || fail "could not move the port"
# Under a sanitizer everything is many times slower.
wait_s=60; grep -q asan <<<"$BUILD" && wait_s=300
(cd "$root/var/lib/baton" && exec "$root/usr/local/bin/batond" --config "$tmp/baton.yaml") >"$tmp/batond.log" 2>&1 &
pid=$!
code=000
for _ in $(seq $((wait_s * 10))); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$hport/health" 2>/dev/null)
  [ "$code" = 200 ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if [ "$code" = 200 ]; then pass "the installed batond: GET /health 200"
else fail "GET /health: $code after up to ${wait_s}s"; tail -n 30 "$tmp/batond.log"; fi
# batond started the baton-worker beside it, the installed one.
if ps -o args= --ppid "$pid" | grep -q "^$root/usr/local/bin/baton-worker "; then
  pass "its worker is the installed baton-worker"
else
  fail "batond's children: $(ps -o args= --ppid "$pid")"
fi
hc=${health//$port/$hport}
if sh -c "$hc" >/dev/null 2>&1; then pass "HEALTHCHECK command: $hc"; else fail "HEALTHCHECK command failed: $hc"; fi
body=$(curl -s -X POST "http://127.0.0.1:$hport/v1/chat/completions" -H 'Content-Type: application/json' \
         -d '{"model": "smollm2", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}')
grep -q '"finish_reason"' <<<"$body" && pass "POST /v1/chat/completions answers" || fail "chat completion: $body"

kill -TERM "$pid"
stop=$(sed -n 's/.*--stop-timeout \([0-9]*\).*/\1/p' Dockerfile.cpu | head -n 1)
limit=${stop:-20}; grep -q asan <<<"$BUILD" && limit=$((limit * 5))
for _ in $(seq $((limit * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
  fail "batond still runs ${limit}s after SIGTERM"
else
  wait "$pid"; rc=$?; pid=
  [ $rc -eq 0 ] && pass "SIGTERM: batond drained and exited 0 within ${limit}s" || { fail "batond exited $rc after SIGTERM"; tail -n 20 "$tmp/batond.log"; }
fi

if [ $fails -eq 0 ]; then echo "test_docker: passed"; exit 0; fi
echo "test_docker: $fails failed"
exit 1
