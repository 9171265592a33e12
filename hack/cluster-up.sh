#!/usr/bin/env bash
# Starts the local control plane as plain processes on 127.0.0.1:
#   etcd -> kube-apiserver -> kube-controller-manager + kube-scheduler -> kwok
# then registers 6 simulated nodes in 3 zones and waits until they are Ready
# and untainted. State, logs and PIDs live in .cluster/ (gitignored):
#   .cluster/kubeconfig   admin kubeconfig
#   .cluster/bin/kubectl  the kubectl that matches the server
#   .cluster/logs/*.log   one log per component
#   .cluster/pids/*.pid   what cluster-down stops
#   .cluster/cmds/*.args  each component's command line (NUL-separated), so that
#                         hack/cluster-ctl.sh can stop and start one again
# Running it again while the cluster is healthy is a no-op.
# `cluster-up.sh --check` only tells (exit 0) whether it is up and healthy.
#
# The controller manager's client may make 100 requests/s (burst 200) instead of its default
# 20: at 20 it took over a minute to give 500 new Deployments their ReplicaSets or 1000 pods
# their creation, which made tests and benchmarks wait on it rather than on what they measure.
# Large managed clusters raise it likewise.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
source "$ROOT/hack/versions.env"
CACHE="${BALLAST_CACHE:-$HOME/.cache/ballast}"
K8S_BIN="$CACHE/bin/kubernetes-$KUBERNETES_VERSION"
ETCD_BIN="$CACHE/bin/etcd-$ETCD_VERSION"
KWOK_BIN="$CACHE/bin/kwok-$KWOK_VERSION"
STATE="${BALLAST_CLUSTER_DIR:-$ROOT/.cluster}"
# Ports on 127.0.0.1 only. Override if something else holds them.
APISERVER_PORT="${BALLAST_APISERVER_PORT:-16443}"
ETCD_PORT="${BALLAST_ETCD_PORT:-12379}"
ETCD_PEER_PORT="${BALLAST_ETCD_PEER_PORT:-12380}"
KCM_PORT="${BALLAST_KCM_PORT:-10257}"
SCHEDULER_PORT="${BALLAST_SCHEDULER_PORT:-10259}"
KWOK_PORT="${BALLAST_KWOK_PORT:-10247}"
ZONES=(zone-a zone-b zone-c)
NODES_PER_ZONE="${BALLAST_NODES_PER_ZONE:-2}"
# For diagnosis only: an audit policy file; the API server then writes what it selects to
# logs/audit.log (who wrote what, and with which status code: say, whose writes meet 409s).
AUDIT_POLICY="${BALLAST_APISERVER_AUDIT_POLICY:-}"

log() { printf '[cluster-up] %s\n' "$*" >&2; }
die() { printf '[cluster-up] error: %s\n' "$*" >&2; exit 1; }

for b in "$K8S_BIN/kube-apiserver" "$K8S_BIN/kube-controller-manager" "$K8S_BIN/kube-scheduler" \
  "$K8S_BIN/kubectl" "$ETCD_BIN/etcd" "$KWOK_BIN/kwok"; do
  [[ -x "$b" ]] || die "$b is missing: run 'make cluster-build' (or hack/build-cluster.sh) first"
done
for t in openssl curl flock setsid; do command -v "$t" >/dev/null || die "$t is required"; done

mkdir -p "$STATE"
# One cluster-up at a time (tests may race to start it).
exec 9>"$STATE/.lock"
flock 9

KUBECTL=("$K8S_BIN/kubectl" --kubeconfig "$STATE/kubeconfig")

alive() { [[ -f "$STATE/pids/$1.pid" ]] && kill -0 "$(cat "$STATE/pids/$1.pid")" 2>/dev/null; }

healthy() {
  [[ -f "$STATE/kubeconfig" ]] || return 1
  for c in etcd kube-apiserver kube-controller-manager kube-scheduler kwok; do alive "$c" || return 1; done
  "${KUBECTL[@]}" get --raw /readyz >/dev/null 2>&1
}

if [[ "${1:-}" == --check ]]; then healthy; exit; fi
if healthy; then
  log "already up: export KUBECONFIG=$STATE/kubeconfig"
  exit 0
fi
if [[ -d "$STATE/pids" ]] && ls "$STATE/pids"/*.pid >/dev/null 2>&1; then
  log "found a broken cluster in $STATE: stopping it first"
  flock -u 9
  "$ROOT/hack/cluster-down.sh"
  flock 9
fi

for port in "$ETCD_PORT" "$ETCD_PEER_PORT" "$APISERVER_PORT" "$KCM_PORT" "$SCHEDULER_PORT" "$KWOK_PORT"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    die "port $port on 127.0.0.1 is already in use (another local cluster?): stop it, or choose other ports with BALLAST_APISERVER_PORT, BALLAST_ETCD_PORT, BALLAST_ETCD_PEER_PORT, BALLAST_KCM_PORT, BALLAST_SCHEDULER_PORT, BALLAST_KWOK_PORT"
  fi
done

mkdir -p "$STATE"/{pki,logs,pids,cmds,bin,etcd-data}
ln -sfn "$K8S_BIN/kubectl" "$STATE/bin/kubectl"
PKI="$STATE/pki"

# --- PKI: a CA made here, a serving cert for the API server, client certs ---
gen_pki() {
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=ballast-local-ca" \
    -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
  client_cert() { # name CN O
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$2${3:+/O=$3}" \
      -keyout "$PKI/$1.key" -out "$PKI/$1.csr" 2>/dev/null
    openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
      -days 3650 -out "$PKI/$1.crt" -extfile <(printf 'extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment') 2>/dev/null
  }
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$PKI/apiserver.key" -out "$PKI/apiserver.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/apiserver.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -out "$PKI/apiserver.crt" -extfile <(printf '%s\n' \
      'subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local' \
      'extendedKeyUsage=serverAuth' 'keyUsage=critical,digitalSignature,keyEncipherment') 2>/dev/null
  client_cert admin kubernetes-admin system:masters
  client_cert controller-manager system:kube-controller-manager
  client_cert scheduler system:kube-scheduler
  client_cert kwok kwok-controller system:masters
  client_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  rm -f "$PKI"/*.csr
}
[[ -f "$PKI/sa.pub" ]] || { log "generating a local CA and certificates"; gen_pki; }

kubeconfig() { # file user
  local f="$1" u="$2" k=("$K8S_BIN/kubectl" --kubeconfig "$1")
  rm -f "$f"
  "${k[@]}" config set-cluster local --server="https://127.0.0.1:$APISERVER_PORT" \
    --certificate-authority="$PKI/ca.crt" --embed-certs=true >/dev/null
  "${k[@]}" config set-credentials "$u" --client-certificate="$PKI/$u.crt" \
    --client-key="$PKI/$u.key" --embed-certs=true >/dev/null
  "${k[@]}" config set-context local --cluster=local --user="$u" >/dev/null
  "${k[@]}" config use-context local >/dev/null
}
kubeconfig "$STATE/kubeconfig" admin
kubeconfig "$STATE/controller-manager.kubeconfig" controller-manager
kubeconfig "$STATE/scheduler.kubeconfig" scheduler
kubeconfig "$STATE/kwok.kubeconfig" kwok

start() { # name cmd...
  local name="$1"; shift
  log "starting $name"
  printf '%s\0' "$@" >"$STATE/cmds/$name.args"
  # setsid: its own process group, so it survives the shell and is stopped by PID.
  # 9>&-: the component must not inherit (and so hold) the cluster-up lock.
  setsid "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null 9>&- &
  echo $! >"$STATE/pids/$name.pid"
}

wait_for() { # what timeout-seconds cmd...
  local what="$1" timeout="$2"; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      log "timed out waiting for $what; last log lines:"
      tail -n 30 "$STATE/logs/"*.log >&2 || true
      die "$what did not become healthy within ${timeout}s (logs in $STATE/logs)"
    fi
    sleep 1
  done
  log "$what is healthy"
}

https_ok() { # port path: the components' self-signed health endpoints
  [[ "$(curl -sk --max-time 2 "https://127.0.0.1:$1$2")" == ok ]]
}

start etcd "$ETCD_BIN/etcd" \
  --name=ballast-local --data-dir="$STATE/etcd-data" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="ballast-local=http://127.0.0.1:$ETCD_PEER_PORT" \
  --quota-backend-bytes=$((2 * 1024 * 1024 * 1024)) --unsafe-no-fsync=true --log-level=warn
wait_for etcd 60 bash -c "exec 3<>/dev/tcp/127.0.0.1/$ETCD_PORT"

AUDIT_ARGS=()
if [[ -n "$AUDIT_POLICY" ]]; then
  AUDIT_ARGS=(--audit-policy-file="$(realpath "$AUDIT_POLICY")" --audit-log-path="$STATE/logs/audit.log"
    --audit-log-format=json --audit-log-mode=batch)
fi
start kube-apiserver "$K8S_BIN/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$APISERVER_PORT" \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=InternalIP \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --api-audiences=https://kubernetes.default.svc.cluster.local \
  --authorization-mode=RBAC \
  --enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,ResourceQuota \
  --service-cluster-ip-range=10.96.0.0/16 \
  --allow-privileged=true --profiling=false \
  --endpoint-reconciler-type=none \
  ${AUDIT_ARGS[@]+"${AUDIT_ARGS[@]}"} \
  --v=1
wait_for kube-apiserver 120 "${KUBECTL[@]}" get --raw /readyz

start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
  --kubeconfig="$STATE/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$STATE/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$STATE/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
  --leader-elect=false --use-service-account-credentials=true \
  --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --controllers='*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller' \
  --concurrent-deployment-syncs=10 --concurrent-replicaset-syncs=10 --concurrent-job-syncs=10 \
  --kube-api-qps=100 --kube-api-burst=200 \
  --v=1
start kube-scheduler "$K8S_BIN/kube-scheduler" \
  --kubeconfig="$STATE/scheduler.kubeconfig" \
  --authentication-kubeconfig="$STATE/scheduler.kubeconfig" \
  --authorization-kubeconfig="$STATE/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" --leader-elect=false --v=1
wait_for kube-controller-manager 60 https_ok "$KCM_PORT" /healthz
wait_for kube-scheduler 60 https_ok "$SCHEDULER_PORT" /healthz

S="$KWOK_BIN/stages"
KWOK_STAGES=(
  "$S/node/fast/node-initialize.yaml"
  "$S/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml"
  "$S/pod/fast/pod-ready.yaml"
  "$S/pod/general/pod-complete.yaml"
  "$S/pod/fast/pod-delete.yaml"
  "$S/pod/chaos/pod-container-running-failed.yaml"
)
# Every address kwok hands out is only a string in status; the node IP is
# loopback so that anything the API server proxies to a "kubelet" stays here.
start kwok "$KWOK_BIN/kwok" \
  --kubeconfig="$STATE/kwok.kubeconfig" \
  --config="$(IFS=,; echo "${KWOK_STAGES[*]}")" \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-ip=127.0.0.1 --node-port="$KWOK_PORT" --server-address="127.0.0.1:$KWOK_PORT" \
  --cidr=10.0.0.0/16 --node-lease-duration-seconds=40 --v=WARN
wait_for kwok 60 bash -c "exec 3<>/dev/tcp/127.0.0.1/$KWOK_PORT"

log "registering ${#ZONES[@]} zones x $NODES_PER_ZONE simulated nodes"
{
  for z in "${ZONES[@]}"; do
    for i in $(seq 0 $((NODES_PER_ZONE - 1))); do
      n="kwok-$z-$i"
      cat <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: $n
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
    kubernetes.io/hostname: $n
    topology.kubernetes.io/region: region-1
    topology.kubernetes.io/zone: $z
spec: {}
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "110"}
  capacity: {cpu: "32", memory: 256Gi, pods: "110"}
  nodeInfo: {architecture: amd64, operatingSystem: linux, kubeletVersion: fake, kubeProxyVersion: fake}
YAML
    done
  done
} | "${KUBECTL[@]}" apply -f - >/dev/null

nodes_ready() {
  local want=$(( ${#ZONES[@]} * NODES_PER_ZONE ))
  local ready
  ready=$("${KUBECTL[@]}" get nodes -l type=kwok -o \
    jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.conditions[?(@.type=="Ready")].status}{" "}{.spec.taints}{"\n"}{end}' |
    awk '$2=="True" && $3=="" {n++} END {print n+0}')
  [[ "$ready" -eq "$want" ]]
}
wait_for "$(( ${#ZONES[@]} * NODES_PER_ZONE )) Ready, untainted nodes" 120 nodes_ready
wait_for "the default ServiceAccount" 60 "${KUBECTL[@]}" -n default get serviceaccount default

log "up. Point kubectl at it with:"
log "  export KUBECONFIG=$STATE/kubeconfig PATH=$STATE/bin:\$PATH"
