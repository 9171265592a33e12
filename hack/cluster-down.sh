#!/usr/bin/env bash
# Stops exactly the processes hack/cluster-up.sh started (by the PIDs it
# recorded) and removes the cluster's state directory.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${BALLAST_CLUSTER_DIR:-$ROOT/.cluster}"

log() { printf '[cluster-down] %s\n' "$*" >&2; }

if [[ ! -d "$STATE" ]]; then log "nothing to stop"; exit 0; fi

# Reverse start order: clients first, etcd last.
for c in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
  f="$STATE/pids/$c.pid"
  [[ -f "$f" ]] || continue
  pid="$(cat "$f")"
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $c (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$c did not stop in 10s: killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$f"
done
rm -rf "$STATE"
log "stopped; state removed"
