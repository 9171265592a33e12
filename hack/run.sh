#!/usr/bin/env bash
# `make run`: the main job on the local cluster. Builds and starts the local
# control plane if it is not up, installs config/local (config/default without the
# manager's Deployment: CRDs, RBAC, the revision gate), applies every example into
# namespace `demo`, prints how to point kubectl at the cluster, and runs the
# operator in the foreground (Ctrl-C stops it; the cluster stays up until
# `make cluster-down`).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STATE="${BALLAST_CLUSTER_DIR:-$ROOT/.cluster}"
NS="${BALLAST_DEMO_NAMESPACE:-demo}"

hack/build-cluster.sh
hack/cluster-up.sh
export KUBECONFIG="$STATE/kubeconfig"
KUBECTL="$STATE/bin/kubectl"

cargo build --bin ballast
# Everything config/default installs but the manager's Deployment (config/local): CRDs, RBAC,
# the revision gate. The CRDs first, so the gate's param kind exists when the policy comes.
"$KUBECTL" apply --server-side -k config/crd >/dev/null
"$KUBECTL" wait --for=condition=Established --timeout=60s \
  crd/spreadpolicies.ballast.dev crd/rolloutstrategies.ballast.dev crd/clusterspreadpolicies.ballast.dev >/dev/null
"$KUBECTL" apply --server-side --force-conflicts -k config/local >/dev/null
# The operator runs as its ServiceAccount, with the RBAC of config/ (and the identity the
# revision hold exempts), not as the cluster admin.
OPERATOR_KUBECONFIG="$STATE/operator-run.kubeconfig"
token="$("$KUBECTL" create token ballast-controller-manager -n ballast-system --duration=24h)"
server="$("$KUBECTL" config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
ca="$("$KUBECTL" config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
umask 077
cat >"$OPERATOR_KUBECONFIG" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: $server, certificate-authority-data: $ca}}]
users: [{name: ballast, user: {token: $token}}]
contexts: [{name: ballast, context: {cluster: local, user: ballast, namespace: ballast-system}}]
current-context: ballast
KC
"$KUBECTL" create namespace "$NS" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
# examples/cluster-default.yaml is a ClusterSpreadPolicy for the namespaces labelled so.
"$KUBECTL" label namespace "$NS" ballast.dev/spread-default=zones --overwrite >/dev/null
# For a few seconds after the revision gate is installed, the API server refuses Deployment
# writes with "paramKind ... not yet synced" (failurePolicy: Fail, docs/rollout-strategy.md):
# retry the examples until it has taken the gate up.
for attempt in 1 2 3 4 5 6 7 8 9 10; do
  if out="$("$KUBECTL" apply -n "$NS" -f examples/ 2>&1 >/dev/null)"; then break; fi
  if [ "$attempt" = 10 ] || ! grep -q "not yet synced" <<<"$out"; then echo "$out" >&2; exit 1; fi
  sleep 2
done

cat <<MSG

  The local cluster is up and the examples are applied in namespace '$NS'.
  In another terminal:

    export KUBECONFIG=$STATE/kubeconfig PATH=$STATE/bin:\$PATH
    kubectl get spreadpolicies,rolloutstrategies -n $NS
    kubectl get clusterspreadpolicies               # the cluster default (examples/cluster-default.yaml)
    kubectl get pods -n $NS -o wide -L app        # where the scheduler put them
    kubectl get rolloutstrategies -n $NS -w        # then change an image, e.g.:
    kubectl set image deployment/shop app=registry.example/shop/web:1.1 -n $NS
    kubectl rollout restart deployment/shop -n $NS  # a revision too: its hooks run
    kubectl set image deployment/payments app=registry.example/payments:2.1 -n $NS  # an engine decides

  Starting the operator (Ctrl-C to stop; 'make cluster-down' removes the cluster).

MSG
# The stand-in engine of examples/rollout-webhook.yaml (docs/external-engines.md), on loopback:
# it decides with kubectl as the cluster admin, as a pipeline would with its own credentials.
ENGINE_PID=""
if command -v python3 >/dev/null; then
  mkdir -p "$STATE/logs"
  PATH="$STATE/bin:$PATH" python3 examples/external-engine/engine.py --port 8099 \
    >"$STATE/logs/example-engine.log" 2>&1 &
  ENGINE_PID=$!
  # The example's Deployment is created paused for its first revision's pre webhook: an
  # operator that called before the engine listens would fail that revision (connection refused).
  for _ in $(seq 100); do
    (exec 3<>/dev/tcp/127.0.0.1/8099) 2>/dev/null && break
    sleep 0.1
  done
  echo "  The example engine listens on 127.0.0.1:8099 (log: $STATE/logs/example-engine.log)."
else
  echo "  python3 not found: the example engine of examples/rollout-webhook.yaml is not started." >&2
fi
trap '[ -n "$ENGINE_PID" ] && kill "$ENGINE_PID" 2>/dev/null; true' EXIT
# 127.0.0.1 is allowed for the example's url: hooks (by default no host is).
target/debug/ballast --kubeconfig "$OPERATOR_KUBECONFIG" --http-addr "${BALLAST_HTTP_ADDR:-127.0.0.1:8080}" \
  --webhook-allowed-hosts=127.0.0.1
