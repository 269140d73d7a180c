#!/usr/bin/env bash
# Builds llama.cpp, the peer the CPU benchmarks and the side-by-side checks
# compare baton with, from the source distribution of llama-cpp-python on
# PyPI (which vendors it), into a cache outside the repository.  Nothing of
# llama.cpp is ever committed here.
#
#   scripts/build-llamacpp.sh            prints the bin folder on success
#
# BATON_LLAMACPP_CACHE: the cache folder (default ~/.cache/baton-bench).
# LLAMACPP_PYPI_VERSION: the sdist's version (default 0.3.36).
# Idempotent: a finished build is reused.  Exit status 2, with a message on
# stderr, when PyPI cannot be reached (callers then skip, saying so).
set -euo pipefail

cache="${BATON_LLAMACPP_CACHE:-$HOME/.cache/baton-bench}"
version="${LLAMACPP_PYPI_VERSION:-0.3.36}"
src="$cache/llama_cpp_python-$version/vendor/llama.cpp"
build="$cache/build-$version"
bins=(llama-bench llama-batched-bench llama-quantize llama-tokenize llama-simple)

done_marker="$build/.baton-built"
if [[ -f "$done_marker" ]]; then
    echo "$build/bin"
    exit 0
fi
mkdir -p "$cache"
tarball="$cache/llama_cpp_python-$version.tar.gz"
if [[ ! -f "$tarball" ]]; then
    if [[ "${BATON_OFFLINE:-}" = 1 ]]; then
        echo "build-llamacpp: BATON_OFFLINE=1: not downloading llama-cpp-python $version from PyPI" >&2
        exit 2
    fi
    if ! python3 -m pip download --quiet --no-deps --no-binary :all: \
            "llama-cpp-python==$version" -d "$cache" >&2; then
        echo "build-llamacpp: cannot download llama-cpp-python $version from PyPI" >&2
        exit 2
    fi
fi
[[ -d "$src" ]] || tar -xzf "$tarball" -C "$cache"
echo "build-llamacpp: building llama.cpp (llama-cpp-python $version) in $build;" \
     "about 10 minutes on 2 cores" >&2
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$build" -j"$(nproc)" --target "${bins[@]}" >&2
touch "$done_marker"
echo "$build/bin"
