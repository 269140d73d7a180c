#!/usr/bin/env bash
# `make run`: after install-deps and the build, fetch the default model and
# serve the default config.  The conductor's serving loop arrives with
# issue 3; until then this validates the deployment and says so plainly.
set -euo pipefail
cd "$(dirname "$0")/.."
BATOND=${1:-build/batond}
CONFIG=${BATON_CONFIG:-config/examples/chat-cpu.yaml}

bash scripts/fetch-model.sh
mkdir -p /tmp/baton
"$BATOND" --check-config "$CONFIG"
cat <<MSG

batond validated $CONFIG (above).  Serving requests (batond --config,
baton-worker, batonctl) is not built yet: it lands with the conductor's
event loop.  Until then, \`make test\` exercises the graph runtime.
MSG
