#!/usr/bin/env bash
# Stops, starts or restarts one component of the cluster hack/cluster-up.sh
# started, for the fault scenarios that need an outage (tests/faults_cluster.rs):
#   hack/cluster-ctl.sh stop|start|restart COMPONENT
# COMPONENT is one of etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok. `start` replays the command line cluster-up.sh recorded
# in cmds/COMPONENT.args (so no flag is repeated here), appends to the same log
# and returns once the component is healthy again. Honours BALLAST_CLUSTER_DIR
# like the other scripts.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${BALLAST_CLUSTER_DIR:-$ROOT/.cluster}"

log() { printf '[cluster-ctl] %s\n' "$*" >&2; }
die() { printf '[cluster-ctl] error: %s\n' "$*" >&2; exit 1; }

[[ $# -eq 2 ]] || die "usage: $0 stop|start|restart etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kwok"
action="$1" name="$2"
case "$name" in
  etcd | kube-apiserver | kube-controller-manager | kube-scheduler | kwok) ;;
  *) die "unknown component $name" ;;
esac
ARGS="$STATE/cmds/$name.args"
[[ -f "$ARGS" ]] || die "$ARGS is missing: is the cluster in $STATE up (hack/cluster-up.sh)?"
PID="$STATE/pids/$name.pid"

# The same lock as cluster-up.sh: never while it starts or checks the cluster.
exec 9>"$STATE/.lock"
flock 9

stop() {
  [[ -f "$PID" ]] || { log "$name is not running"; return; }
  local pid
  pid="$(cat "$PID")"
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name did not stop in 10s: killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$PID"
}

healthy() {
  local port
  case "$name" in
    kube-apiserver)
      "$STATE/bin/kubectl" --kubeconfig "$STATE/kubeconfig" get --raw /readyz ;;
    kube-controller-manager | kube-scheduler)
      port="$(tr '\0' '\n' <"$ARGS" | sed -n 's/^--secure-port=//p')"
      [[ "$(curl -sk --max-time 2 "https://127.0.0.1:$port/healthz")" == ok ]] ;;
    *) kill -0 "$(cat "$PID")" ;;
  esac
}

start() {
  if [[ -f "$PID" ]] && kill -0 "$(cat "$PID")" 2>/dev/null; then
    die "$name is already running (pid $(cat "$PID"))"
  fi
  local cmd extra=()
  mapfile -d '' cmd <"$ARGS"
  # BALLAST_EXTRA_ARGS: flags added for this start only (e.g. an API server with an API
  # turned off); the next start without it runs the recorded command again.
  [[ -n "${BALLAST_EXTRA_ARGS:-}" ]] && read -r -a extra <<<"$BALLAST_EXTRA_ARGS"
  cmd+=("${extra[@]}")
  log "starting $name ${extra[*]}"
  # As cluster-up.sh: its own process group, without the lock.
  setsid "${cmd[@]}" >>"$STATE/logs/$name.log" 2>&1 </dev/null 9>&- &
  echo $! >"$PID"
  local deadline=$((SECONDS + 120))
  until healthy >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      tail -n 30 "$STATE/logs/$name.log" >&2 || true
      die "$name did not become healthy within 120s"
    fi
    sleep 0.5
  done
  log "$name is healthy"
}

case "$action" in
  stop) stop ;;
  start) start ;;
  restart) stop; start ;;
  *) die "unknown action $action (stop, start or restart)" ;;
esac
