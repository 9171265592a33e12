#!/usr/bin/env bash
# Builds helm (v4, HELM_VERSION in hack/versions.env) from its Go module with the ordinary `go`
# client, like hack/build-cluster.sh builds the control plane, and caches it by version outside
# the repository: $BALLAST_CACHE/bin/helm-<version>/helm. A cached build is kept, so running it
# again is cheap. Prints the binary's path on stdout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
source "$ROOT/hack/versions.env"
CACHE="${BALLAST_CACHE:-$HOME/.cache/ballast}"
OUT="$CACHE/bin/helm-$HELM_VERSION"

log() { printf '[build-helm] %s\n' "$*" >&2; }

if [[ -x "$OUT/helm" ]]; then
  log "helm $HELM_VERSION: cached"
  echo "$OUT/helm"
  exit 0
fi
command -v go >/dev/null || { echo "go (1.26+) is required: see README.md" >&2; exit 1; }
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
start=$(date +%s)
log "helm $HELM_VERSION: building"
mkdir -p "$OUT.tmp"
# helm's Makefile sets its version the same way; without it `helm version` says v4.x-dev.
GOBIN="$OUT.tmp" go install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
  "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
log "helm $HELM_VERSION: built in $(( $(date +%s) - start ))s: $OUT/helm"
echo "$OUT/helm"
