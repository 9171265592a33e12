#!/usr/bin/env bash
# Builds the local control plane from upstream Go modules with the ordinary
# `go` client and caches the binaries by version outside the repository:
#   $BALLAST_CACHE/bin/<version>/{etcd,kube-apiserver,kube-controller-manager,
#                                 kube-scheduler,kubectl,kwok}
# Work already cached is skipped, so running it again is cheap.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
source "$ROOT/hack/versions.env"
CACHE="${BALLAST_CACHE:-$HOME/.cache/ballast}"
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
# Two cores: building with more jobs only costs memory.
GOBUILD=(go build -trimpath)

log() { printf '[build-cluster] %s\n' "$*" >&2; }

command -v go >/dev/null || { echo "go (1.26+) is required: see README.md" >&2; exit 1; }

build_kubernetes() {
  local v="$KUBERNETES_VERSION" out="$CACHE/bin/kubernetes-$KUBERNETES_VERSION"
  local bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  local missing=()
  for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || missing+=("$b"); done
  if [[ ${#missing[@]} -eq 0 ]]; then log "kubernetes $v: cached"; return; fi

  local src="$CACHE/src/kubernetes-$v"
  mkdir -p "$src" "$out"
  if [[ ! -f "$src/go.sum" ]]; then
    log "kubernetes $v: preparing scratch module"
    local modfile
    modfile="$(go mod download -json "k8s.io/kubernetes@$v" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    {
      echo "module ballast.dev/local-control-plane"
      echo
      echo "go $(sed -n 's/^go \(.*\)/\1/p' "$modfile")"
      echo
      echo "require k8s.io/kubernetes $v"
      echo
      # The kubernetes module requires each staging module at v0.0.0 and
      # replaces it with ./staging; outside that repository the published
      # v0.X.Y of each module is the same code.
      local minor="v0.${v#v1.}"
      sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$modfile" |
        while read -r m; do echo "replace $m => $m $minor"; done
    } >"$src/go.mod.tmp"
    mv "$src/go.mod.tmp" "$src/go.mod"
    cat >"$src/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
    # godebug settings of the kubernetes module do not carry over to ours.
    grep '^godebug' "$modfile" >>"$src/go.mod" || true
    (cd "$src" && go mod tidy -e >/dev/null 2>&1 || true)
    (cd "$src" && go get "k8s.io/kubernetes@$v" && go mod tidy)
  fi
  local minor="${v#v1.}"; minor="${minor%%.*}"
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  for b in "${missing[@]}"; do
    log "kubernetes $v: building $b"
    (cd "$src" && "${GOBUILD[@]}" -ldflags "$ld" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b")
    mv "$out/$b.tmp" "$out/$b"
  done
}

build_etcd() {
  local v="$ETCD_VERSION" out="$CACHE/bin/etcd-$ETCD_VERSION"
  if [[ -x "$out/etcd" ]]; then log "etcd $v: cached"; return; fi
  local src="$CACHE/src/etcd-$v"
  mkdir -p "$src" "$out"
  if [[ ! -f "$src/go.sum" ]]; then
    log "etcd $v: preparing scratch module"
    cat >"$src/main.go" <<'GO'
// The etcd binary, as etcd's own main.go builds it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    printf 'module ballast.dev/local-etcd\n\ngo 1.24\n' >"$src/go.mod"
    (cd "$src" && go get "go.etcd.io/etcd/server/v3@$v" && go mod tidy)
  fi
  log "etcd $v: building"
  (cd "$src" && "${GOBUILD[@]}" -ldflags "-s -w" -o "$out/etcd.tmp" .)
  mv "$out/etcd.tmp" "$out/etcd"
}

build_kwok() {
  local v="$KWOK_VERSION" out="$CACHE/bin/kwok-$KWOK_VERSION"
  if [[ -x "$out/kwok" && -d "$out/stages" ]]; then log "kwok $v: cached"; return; fi
  mkdir -p "$out"
  log "kwok $v: building"
  GOBIN="$out" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$v"
  # v0.8.0 compiles in no default Stages; keep the upstream ones beside it.
  local dir
  dir="$(go mod download -json "sigs.k8s.io/kwok@$v" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  rm -rf "$out/stages.tmp" && mkdir -p "$out/stages.tmp"
  cp -r "$dir/kustomize/stage/." "$out/stages.tmp/"
  chmod -R u+w "$out/stages.tmp"
  rm -rf "$out/stages" && mv "$out/stages.tmp" "$out/stages"
}

start=$(date +%s)
build_etcd
build_kwok
build_kubernetes
log "done in $(( $(date +%s) - start ))s; binaries under $CACHE/bin"
