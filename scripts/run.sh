#!/usr/bin/env bash
# `make run`: after install-deps and the build, fetch the default model and
# serve a deployment in the foreground (Ctrl-C drains and stops).
#
# The default model's backend (transformer) arrives in a later issue, so for
# now this serves config/examples/test-loop.yaml, built from the test
# backends; BATON_CONFIG=FILE serves another deployment.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CONFIG=${BATON_CONFIG:-config/examples/test-loop.yaml}

bash scripts/fetch-model.sh
"$BUILD/batond" --check-config "$CONFIG" --quiet
ENDPOINT=$(sed -n 's/^ *listen: *\([^ #]*\).*/\1/p' "$CONFIG" | head -n 1)
ENDPOINT=${ENDPOINT:-ipc:///run/baton/baton.sock}
cat <<MSG

Serving $CONFIG on $ENDPOINT (Ctrl-C to stop).  In another terminal:

  $BUILD/batonctl --endpoint $ENDPOINT health
  $BUILD/batonctl --endpoint $ENDPOINT infer count --input x=i32:1:0 --stream
  $BUILD/batonctl --endpoint $ENDPOINT infer echo --input x=i32:2,2:1,2,3,4
  $BUILD/batonctl --endpoint $ENDPOINT inspect count
  /usr/bin/python3 scripts/python/example.py   # the Python client

MSG
exec "$BUILD/batond" --config "$CONFIG"
