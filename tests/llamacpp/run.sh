#!/usr/bin/env bash
# baton side by side with llama.cpp (`make llamacpp-check`):
#
#   tokenizer  tests/llamacpp/tokenizer_check.py: 30,000 texts through both
#              tokenizers (SmolLM2's pre-tokenizer, then GPT-2's and Llama 3's
#              on the same vocabulary); every id must match.
#   greedy     tests/llamacpp/greedy_check.py: 8 prompts decoded greedily for
#              32 tokens by both, on llama.cpp's F32 dequantization of the
#              model and on the Q4_1 file itself.
#
#   BUILD=build bash tests/llamacpp/run.sh [tokenizer] [greedy]   (default: both)
#   BUILD=build bash tests/llamacpp/run.sh build    only build the llama.cpp
#                                                   programs; prints their folder
#
# llama.cpp comes from scripts/build-llamacpp.sh (a cache outside the
# repository; about 10 minutes the first time); the two programs that link
# it (llama_tok.c, llama_greedy.c) are compiled here against that build into
# $BUILD/llamacpp/, beside baton_tok and baton_greedy, which `make
# llamacpp-check` builds first.  The F32 model is made once by llama.cpp's
# llama-quantize into the same cache.
#
# Exit status 77 with a line "SKIP: why" when llama.cpp or the model cannot
# be had (the Makefile reports it and succeeds); 1 when a check fails.
set -u
cd "$(dirname "$0")/../.." || exit 2
BUILD=${BUILD:-build}
CC=${CC:-cc}
model=models/smollm2-135m-instruct-q4_1.gguf
out=$BUILD/llamacpp

skip() {
    echo "SKIP: $*"
    exit 77
}

[[ -r $model ]] || skip "$model is absent (scripts/fetch-model.sh fetches it)"
bin=$(bash scripts/build-llamacpp.sh) || skip "llama.cpp is not available (scripts/build-llamacpp.sh failed; its message is above)"
lbuild=$(dirname "$bin")
version=${lbuild##*/build-}
src=$(dirname "$lbuild")/llama_cpp_python-$version/vendor/llama.cpp
libs=("$lbuild/src/libllama.a" "$lbuild/ggml/src/libggml.a" "$lbuild/ggml/src/libggml-cpu.a"
      "$lbuild/ggml/src/libggml-base.a")
for f in "${libs[@]}" "$src/include/llama.h" "$src/ggml/include/ggml.h" "$bin/llama-quantize"; do
    [[ -e $f ]] || skip "the llama.cpp build in $lbuild has no $f"
done

# The llama.cpp programs: C linked against the static libraries (C++ and
# OpenMP inside, hence -lstdc++ -fopenmp), rebuilt when a source or a
# library is newer.
mkdir -p "$out"
for prog in llama_tok llama_greedy; do
    if [[ ! -x $out/$prog || tests/llamacpp/$prog.c -nt $out/$prog || tests/llamacpp/texts_io.h -nt $out/$prog ||
          ${libs[0]} -nt $out/$prog ]]; then
        echo "  CC      $out/$prog (llama.cpp of llama-cpp-python $version)"
        "$CC" -std=gnu11 -O2 -g -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
            -I. -I"$src/include" -I"$src/ggml/include" -o "$out/$prog" "tests/llamacpp/$prog.c" \
            "${libs[@]}" -lstdc++ -fopenmp -lm -lpthread -ldl || exit 1
    fi
done
if [[ ${1:-} == build ]]; then
    echo "$out"
    exit 0
fi
for prog in baton_tok baton_greedy; do
    [[ -x $out/$prog ]] || { echo "$out/$prog is missing: run make BUILD=$BUILD llamacpp-check" >&2; exit 2; }
done

check_tokenizer() {
    /usr/bin/python3 tests/llamacpp/tokenizer_check.py --llama-tok "$out/llama_tok" \
        --baton-tok "$out/baton_tok" --model "$model" --work "$out/tokenizer"
}

check_greedy() {
    # llama.cpp's own dequantization, so that both read the same f32
    # weights; made once, again when the model changes.
    local f32
    f32="$(dirname "$lbuild")/$(basename "$model" .gguf).f32.gguf"
    if [[ ! -s $f32 || $model -nt $f32 ]]; then
        echo "  QUANT   $f32 (llama-quantize F32)"
        "$bin/llama-quantize" --allow-requantize "$model" "$f32.tmp" F32 > "$out/quantize.log" 2>&1 ||
            { echo "llama-quantize failed: see $out/quantize.log"; return 1; }
        mv "$f32.tmp" "$f32"
    fi
    /usr/bin/python3 tests/llamacpp/greedy_check.py --llama-greedy "$out/llama_greedy" \
        --baton-greedy "$out/baton_greedy" --llama-tok "$out/llama_tok" \
        --baton-tok "$out/baton_tok" --q41 "$model" --f32 "$f32"
}

parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(tokenizer greedy)
for part in "${parts[@]}"; do
    [[ $part == tokenizer || $part == greedy ]] ||
        { echo "unknown part '$part' (tokenizer, greedy or build)" >&2; exit 2; }
done
pass=0
fail=0
for part in "${parts[@]}"; do
    if "check_$part"; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
done
echo "llamacpp-check: ${pass} passed, ${fail} failed"
[[ $fail -eq 0 ]]
