#!/usr/bin/env bash
# Installs every Debian package that building, testing and `make run` need.
# Idempotent: when every package is already present it returns at once, so
# `make test` and `make run` can call it every time without paying for apt
# (apt reaches the network only when a package is missing; with
# BATON_OFFLINE=1 a missing package is an error instead).
#
# --build leaves out what only the tests use (the image builds of
# Dockerfile.cpu and Dockerfile run `make` and `make install`, never `make
# test`).
set -euo pipefail

PKGS=(
  build-essential pkg-config git ca-certificates
  libzmq3-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
  libyaml-dev libjemalloc-dev libopenblas-dev libsystemd-dev
  libmicrohttpd-dev libjansson-dev
  libsodium-dev            # base64 of the audio in a voice chat's message
  libfftw3-dev             # the FFT of Whisper's log-mel features
  libsndfile1-dev libsoxr-dev  # audio files decoded, resampled to 16 kHz
  zlib1g-dev               # the compression ratio by which Whisper judges a window
  libdnnl-dev              # oneDNN: bf16 products of Whisper's encoder (AMX, AVX-512 BF16)
  python3 python3-pip python3-zmq python3-protobuf python3-yaml
  curl unzip
)
TEST_PKGS=(
  libcmocka-dev
  prometheus               # promtool, which checks the /metrics text in the tests
  iproute2                 # `ip netns`, the hosts of the multi-host tests
  espeak-ng                # spoken clips of known sentences for bench_whisper's WER
)
case "${1:-}" in
  --build) ;;
  "") PKGS+=("${TEST_PKGS[@]}") ;;
  *) echo "usage: install-deps.sh [--build]" >&2; exit 2 ;;
esac

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  [ "${BATON_DEPS_QUIET:-0}" = 1 ] || echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

# BATON_OFFLINE=1: apt is not run (it reaches the Debian mirrors).
if [ "${BATON_OFFLINE:-}" = 1 ]; then
  echo "install-deps: BATON_OFFLINE=1, and these packages are missing: ${missing[*]} (install them, or unset BATON_OFFLINE)" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
