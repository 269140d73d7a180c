#!/usr/bin/env bash
# The RUN steps of the images (Dockerfile.cpu, Dockerfile) but the first,
# scripts/install-deps.sh --build (a layer of its own, for the cache), so
# that what an image build runs is a script that CI runs too
# (tests/integration/test_docker.sh runs each command below outside Docker).
#
#   docker-build.sh stage DESTDIR [--config FILE] [--no-model]
#       The build stage: Debian packages for building (install-deps.sh
#       --build), `make`, the default model (fetch-model.sh, the script of
#       `make run`) and `make install DESTDIR=DESTDIR PREFIX=/usr/local`;
#       then FILE becomes DESTDIR/etc/baton/baton.yaml and the model
#       DESTDIR/var/lib/baton/models/.  Nothing is cleaned first: in an
#       image build the tree has no build/ or models/ (.dockerignore); run
#       in a checkout it reuses both, so it is quick there.
#   docker-build.sh runtime-deps [--check | --list]
#       The runtime stage's packages: the shared libraries the installed
#       programs load, and curl for HEALTHCHECK.  --check only says whether
#       they are all installed (CI; it never runs apt), --list names them.
#   docker-build.sh setup [--root DIR]
#       The runtime stage, after DESTDIR's tree is copied to /: the user
#       baton (uid and gid 10001), /run/baton for it, the linker cache, and
#       checks that every installed program finds its libraries and that
#       batond accepts /etc/baton/baton.yaml.  With --root DIR (CI) it
#       checks the tree under DIR and changes nothing outside it.
#
# Environment: JOBS (parallel make jobs; default: every core), and what the
# Makefile reads, e.g. CUDA=0, CUDA_ARCH=sm_90, BUILD.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian 12 names; Ubuntu 22.04 (the CUDA image) has the same ones.
RUNTIME_PKGS=(
  libzmq5 libprotobuf-c1 libyaml-0-2 libjemalloc2 libopenblas0 libsystemd0
  libmicrohttpd12 libjansson4 libsodium23 libfftw3-double3 libsndfile1 libsoxr0 zlib1g libdnnl2 libgomp1
  curl                     # HEALTHCHECK
)
MODEL=models/smollm2-135m-instruct-q4_1.gguf
IMAGE_UID=10001

usage() { sed -n '2,/^set -euo/p' "$0" | sed -n 's/^# \{0,1\}//p' >&2; exit 2; }
say() { echo "docker-build: $*"; }

stage() {
  local dest="" config="" model=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --config) config=${2:?--config needs a file}; shift 2 ;;
      --no-model) model=0; shift ;;
      -*) usage ;;
      *) [ -z "$dest" ] || usage; dest=$1; shift ;;
    esac
  done
  [ -n "$dest" ] || usage
  mkdir -p "$dest"
  dest=$(cd "$dest" && pwd)
  [ -z "$config" ] || [ -f "$config" ] || { say "no config file $config" >&2; exit 1; }

  bash scripts/install-deps.sh --build
  make -j"${JOBS:-$(nproc)}" all
  [ $model = 0 ] || bash scripts/fetch-model.sh
  make install DESTDIR="$dest" PREFIX=/usr/local
  if [ -n "$config" ]; then
    install -D -m 0644 "$config" "$dest/etc/baton/baton.yaml"
  fi
  if [ $model = 1 ]; then
    install -d "$dest/var/lib/baton/models"
    # A hard link where the tree is on the same file system (CI); a copy
    # otherwise.
    ln -f "$MODEL" "$dest/var/lib/baton/models/" 2>/dev/null ||
      install -m 0644 "$MODEL" "$dest/var/lib/baton/models/"
  fi
  say "staged under $dest"
}

missing_pkgs() {
  local p
  for p in "${RUNTIME_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}

runtime_deps() {
  local check=0
  case "${1:-}" in
    --check) check=1 ;;
    --list) printf '%s\n' "${RUNTIME_PKGS[@]}"; return 0 ;;
    "") ;;
    *) usage ;;
  esac
  local missing
  missing=$(missing_pkgs)
  if [ -z "$missing" ]; then
    say "runtime packages present: ${RUNTIME_PKGS[*]}"
    return 0
  fi
  if [ $check = 1 ]; then
    say "runtime packages not installed: ${missing//$'\n'/ }" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # shellcheck disable=SC2086
  apt-get install -y -q --no-install-recommends $missing
  rm -rf /var/lib/apt/lists/*
}

setup() {
  local root=/
  case "${1:-}" in
    --root) root=${2:?--root needs a folder} ;;
    "") ;;
    *) usage ;;
  esac
  root=$(cd "$root" && pwd)
  local prefix=${root%/}/usr/local

  if [ "$root" = / ]; then
    getent group baton >/dev/null || groupadd --system --gid $IMAGE_UID baton
    getent passwd baton >/dev/null ||
      useradd --system --uid $IMAGE_UID --gid baton --home-dir /var/lib/baton \
        --no-create-home --shell /usr/sbin/nologin baton
    install -d -o baton -g baton -m 0750 /run/baton
    ldconfig
  else
    install -d -m 0750 "$root/run/baton"
  fi

  # Every program and library finds its shared libraries.
  local f bad=0 out
  for f in "$prefix"/bin/* "$prefix"/lib/libbatonclient.so.0; do
    out=$(LD_LIBRARY_PATH="$prefix/lib" ldd "$f" 2>&1) || { say "ldd $f: $out" >&2; bad=1; continue; }
    if grep -q 'not found' <<<"$out"; then
      say "$f: missing libraries:" >&2
      grep 'not found' <<<"$out" >&2
      bad=1
    fi
  done
  [ $bad = 0 ] || exit 1
  "$prefix/bin/batond" --version
  # The paths in the image's config are the image's: check them only there.
  if [ "$root" = / ]; then
    /usr/local/bin/batond --check-config /etc/baton/baton.yaml --quiet
  fi
  say "runtime tree under $root ready"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  stage) stage "$@" ;;
  runtime-deps) runtime_deps "$@" ;;
  setup) setup "$@" ;;
  *) usage ;;
esac
