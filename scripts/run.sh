#!/usr/bin/env bash
# `make run`: after install-deps and the build, fetch the default model and
# serve a deployment in the foreground (Ctrl-C drains and stops).
#
# Serves config/examples/chat-cpu.yaml: SmolLM2-135M-Instruct on one CPU
# worker.  BATON_CONFIG=FILE serves another deployment (e.g.
# config/examples/test-loop.yaml, built from the test backends only).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CONFIG=${BATON_CONFIG:-config/examples/chat-cpu.yaml}

bash scripts/fetch-model.sh
"$BUILD/batond" --check-config "$CONFIG" --quiet
ENDPOINT=$(sed -n 's/^ *listen: *\([^ #]*\).*/\1/p' "$CONFIG" | head -n 1)
ENDPOINT=${ENDPOINT:-ipc:///run/baton/baton.sock}
cat <<MSG

Serving $CONFIG on $ENDPOINT (Ctrl-C to stop).  In another terminal:

  $BUILD/batonctl --endpoint $ENDPOINT health
  $BUILD/batonctl --endpoint $ENDPOINT generate chat "What is the capital of France?"
  $BUILD/batonctl --endpoint $ENDPOINT inspect chat   # graph, partition, schedule
  /usr/bin/python3 client/python/example.py --endpoint $ENDPOINT   # the Python client

MSG
exec "$BUILD/batond" --config "$CONFIG"
