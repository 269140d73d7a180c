#!/usr/bin/env bash
# A conductor whose event loop fails must exit non-zero, so that systemd's
# Restart=on-failure (and any other supervisor) starts it again.  It runs
# build/tests/batond-pollfail, batond with zmq_poll failing after a few
# calls (tests/integration/pollfail.c), on a one-worker deployment.
set -u
BUILD=${BUILD:-build}
exe=$BUILD/tests/batond-pollfail
tmp=$(mktemp -d /tmp/baton-loopfail-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/baton.yaml" <<YAML
version: 1
daemon:
  listen: ipc://$tmp/baton.sock
  workers_endpoint: ipc://$tmp/workers.sock
workers:
  - {name: cpu0, device: cpu, pool_mb: 16}
models:
  - {name: echo0, backend: echo, worker: cpu0}
graphs:
  - name: echo
    inputs: [x]
    body:
      node: {name: e, model: echo0, inputs: [x], outputs: [{name: x, to: client}]}
YAML
# The worker lives next to batond, not next to this test build of it.
BATON_WORKER=$BUILD/baton-worker BATON_TEST_POLL_FAIL_AFTER=5 \
  timeout 120 "$exe" --config "$tmp/baton.yaml" >"$tmp/log" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "the event loop failed" "$tmp/log"; then
  echo "ok: batond exits 1 when its event loop fails"
  exit 0
fi
echo "FAIL: batond with a failing event loop exited $rc (want 1); its log:"
cat "$tmp/log"
exit 1
