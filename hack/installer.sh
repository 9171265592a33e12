#!/usr/bin/env bash
# `make installer`: dist/install.yaml, the whole of config/default in one file (CRDs, RBAC, the
# manager, the revision gate), with the manager's image pinned by digest:
#   IMG     the image's repository (default: ballast, as config/manager names it)
#   DIGEST  sha256:... (default: the digest `make image` wrote to dist/ballast-<version>.digest)
#   hack/installer.sh [OUT]   (default dist/install.yaml)
# Apply it with `kubectl apply --server-side -f install.yaml`; uninstall as docs/install.md says.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=versions.env
source "$ROOT/hack/versions.env"
OUT="${1:-$ROOT/dist/install.yaml}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
REPO="${IMG:-ballast}"
REPO="${REPO%@*}"
# A tag in IMG is dropped: the digest names the image.
[[ "${REPO##*/}" == *:* ]] && REPO="${REPO%:*}"
DIGEST="${DIGEST:-}"
if [[ -z "$DIGEST" ]]; then
  f="$ROOT/dist/ballast-$VERSION.digest"
  [[ -f "$f" ]] || { echo "no image digest: run 'make image' first, or set DIGEST=sha256:..." >&2; exit 1; }
  DIGEST="$(cat "$f")"
fi
[[ "$DIGEST" =~ ^sha256:[0-9a-f]{64}$ ]] || { echo "DIGEST is not sha256:<64 hex>: $DIGEST" >&2; exit 1; }

KUBECTL="${KUBECTL:-}"
if [[ -z "$KUBECTL" ]]; then
  KUBECTL="${BALLAST_CACHE:-$HOME/.cache/ballast}/bin/kubernetes-$KUBERNETES_VERSION/kubectl"
  [[ -x "$KUBECTL" ]] || KUBECTL="$(command -v kubectl)" ||
    { echo "kubectl is missing: run 'make cluster-build'" >&2; exit 1; }
fi

# kustomize takes bases by relative path only: the overlay lives in target/.
work="$ROOT/target/installer-overlay"
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
cat >"$work/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../config/default
images:
  - name: ballast
    newName: $REPO
    digest: $DIGEST
YAML
mkdir -p "$(dirname "$OUT")"
{
  echo "# ballast $VERSION ($(git rev-parse HEAD)): config/default in one file, made by 'make installer'."
  echo "# Image: $REPO@$DIGEST"
  echo "#   kubectl apply --server-side -f install.yaml"
  echo "# Uninstall in the order of docs/install.md (custom resources first, while the manager runs)."
  "$KUBECTL" kustomize "$work"
} >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$OUT: image $REPO@$DIGEST" >&2
