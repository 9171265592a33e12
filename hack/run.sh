#!/usr/bin/env bash
# `make run`: the main job on the local cluster. Builds and starts the local
# control plane if it is not up, installs the CRDs, applies every example into
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
"$KUBECTL" apply --server-side -k config/crd >/dev/null
"$KUBECTL" wait --for=condition=Established --timeout=60s \
  crd/spreadpolicies.ballast.dev crd/rolloutstrategies.ballast.dev >/dev/null
"$KUBECTL" create namespace "$NS" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
"$KUBECTL" apply -n "$NS" -f examples/ >/dev/null

cat <<MSG

  The local cluster is up and the examples are applied in namespace '$NS'.
  In another terminal:

    export KUBECONFIG=$STATE/kubeconfig PATH=$STATE/bin:\$PATH
    kubectl get spreadpolicies,rolloutstrategies -n $NS
    kubectl get pods -n $NS -o wide -L app        # where the scheduler put them
    kubectl get rolloutstrategies -n $NS -w        # then change an image, e.g.:
    kubectl set image deployment/shop app=registry.example/shop/web:1.1 -n $NS

  Starting the operator (Ctrl-C to stop; 'make cluster-down' removes the cluster).

MSG
exec target/debug/ballast --http-addr 127.0.0.1:8080
