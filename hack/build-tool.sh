#!/usr/bin/env bash
# Builds a Go tool that the tests need from its Go module, with the ordinary `go` client, like
# hack/build-cluster.sh builds the control plane, and caches it by version outside the
# repository: $BALLAST_CACHE/bin/<tool>-<version>/<tool>. A cached build is kept, so running it
# again is cheap. Prints the binary's path on stdout.
#
#   hack/build-tool.sh helm       helm v4, for the chart's tests (tests/install.rs)
#   hack/build-tool.sh promtool   Prometheus' promtool, for the alert rules' tests
#                                 (tests/prometheus_config.rs); without the service discovery
#                                 plugins (build tag remove_all_sd), which rules never use
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
source "$ROOT/hack/versions.env"
CACHE="${BALLAST_CACHE:-$HOME/.cache/ballast}"

tool="${1:?usage: hack/build-tool.sh helm|promtool}"
tags=""
case "$tool" in
  helm)
    version="$HELM_VERSION"
    pkg="helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
    # helm's Makefile sets its version the same way; without it `helm version` says v4.x-dev.
    ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
    ;;
  promtool)
    version="$PROMETHEUS_VERSION"
    # Prometheus 3.x.y is the Go module's v0.3xx.y.
    minor="${PROMETHEUS_VERSION#v3.}"
    pkg="github.com/prometheus/prometheus/cmd/promtool@v0.3$(printf '%02d' "${minor%%.*}").${minor#*.}"
    ldflags="-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}"
    tags="remove_all_sd"
    ;;
  *) echo "hack/build-tool.sh: unknown tool $tool (helm or promtool)" >&2; exit 2 ;;
esac
OUT="$CACHE/bin/$tool-$version"

log() { printf '[build-tool] %s\n' "$*" >&2; }

# One build of a tool at a time: hack/test.sh builds them in the background while the tests run,
# and a test that needs one waits here until that build is done, then finds it cached.
mkdir -p "$CACHE/bin"
exec 9>"$OUT.lock"
flock 9

if [[ -x "$OUT/$tool" ]]; then
  log "$tool $version: cached"
  echo "$OUT/$tool"
  exit 0
fi
command -v go >/dev/null || { echo "go (1.26+) is required: see README.md" >&2; exit 1; }
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
start=$(date +%s)
log "$tool $version: building $pkg"
mkdir -p "$OUT.tmp"
GOBIN="$OUT.tmp" go install -trimpath -tags "$tags" -ldflags "$ldflags" "$pkg"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
log "$tool $version: built in $(( $(date +%s) - start ))s: $OUT/$tool"
echo "$OUT/$tool"
