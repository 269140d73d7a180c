# shellcheck shell=bash
# Helpers of the shell tests that start batond themselves (sourced, from
# the repository's root): the tally, a scratch folder, and the one-worker
# echo deployment they run.
. tests/integration/lib_tally.sh

# scratch NAME: TMP is a new folder /tmp/baton-NAME-XXXXXX; at exit every
# process in PID and PIDS is killed and the folder removed.
pid=
pids=()
scratch() {
  tmp=$(mktemp -d "/tmp/baton-$1-XXXXXX")
  trap scratch_cleanup EXIT
}
scratch_cleanup() {
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$tmp"
}

# echo_deployment FILE LISTEN WORKERS [DAEMON-LINE...]: writes to FILE a
# deployment of one CPU worker (16 MiB pool) with an echo model and the
# graph "echo", batond listening on LISTEN for clients and WORKERS for
# workers, each DAEMON-LINE added under daemon: as it is.
echo_deployment() {
  local file=$1 listen=$2 workers=$3 line
  shift 3
  {
    printf 'version: 1\ndaemon:\n  listen: %s\n  workers_endpoint: %s\n' "$listen" "$workers"
    for line in "$@"; do printf '  %s\n' "$line"; done
    cat <<'YAML'
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
  } >"$file"
}
