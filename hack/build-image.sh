#!/usr/bin/env bash
# Builds the manager's OCI image without a container engine or daemon (`make image`), with
# Debian's umoci (installed when missing), from scratch: one layer holding /ballast, a statically
# linked release build (x86_64-unknown-linux-gnu, +crt-static), run as 65532:65532, no shell, no
# libc, nothing else. Writes dist/ballast-<version>.oci.tar (an OCI archive, tag <version>) and
# dist/ballast-<version>.digest (the manifest digest, sha256:...), and, with IMG=<ref>, pushes it
# with skopeo.
#
# Reproducible: every timestamp is SOURCE_DATE_EPOCH (the commit's time unless set), the file is
# owned by 0:0 with a fixed mode and mtime, no history entries carry a clock, and the archive is
# written in name order with fixed owners and mtimes, so one commit gives one digest
# (`make image-check` builds twice and compares).
#
#   hack/build-image.sh [--out DIR] [--no-build]
#     --out DIR   write the archive and digest into DIR (default dist/)
#     --no-build  use the binary that is there (image-check's second build)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="$ROOT/dist"
BUILD=true
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$(mkdir -p "$2" && cd "$2" && pwd)"; shift 2 ;;
    --no-build) BUILD=false; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
log() { printf '[build-image] %s\n' "$*" >&2; }

TARGET=x86_64-unknown-linux-gnu
ARCH=amd64
BIN="$ROOT/target/$TARGET/release/ballast"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
REVISION="$(git rev-parse HEAD)"
git diff --quiet HEAD -- Cargo.toml Cargo.lock src || REVISION="$REVISION-dirty"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}"
CREATED="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"

sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
need() { # need <command> <debian package>
  command -v "$1" >/dev/null && return
  log "installing $2 (apt)"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}
need umoci umoci
need file file

if $BUILD; then
  log "cargo build --release --target $TARGET (+crt-static)"
  RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked --target "$TARGET" --bin ballast
fi
[[ -x "$BIN" ]] || { echo "$BIN is missing: run without --no-build" >&2; exit 1; }
# A scratch image has no libc: the binary must need nothing at run time.
kind="$(file -b "$BIN")"
case "$kind" in
  *"statically linked"* | *"static-pie linked"*) ;;
  *) echo "$BIN is not statically linked: $kind" >&2; exit 1 ;;
esac
log "binary: $kind"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
layout="$work/oci"
umoci init --layout "$layout"
umoci new --image "$layout:$VERSION"
umoci unpack --image "$layout:$VERSION" "$work/bundle" >/dev/null
rootfs="$work/bundle/rootfs"
install -o 0 -g 0 -m 0755 "$BIN" "$rootfs/ballast"
find "$rootfs" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
umoci repack --image "$layout:$VERSION" --no-history "$work/bundle"
umoci config --image "$layout:$VERSION" --no-history \
  --created "$CREATED" --os linux --architecture "$ARCH" \
  --config.user 65532:65532 --config.entrypoint /ballast --config.workingdir / \
  --config.env PATH=/ \
  --config.label "org.opencontainers.image.title=ballast" \
  --config.label "org.opencontainers.image.description=The ballast Kubernetes operator: SpreadPolicy and RolloutStrategy" \
  --config.label "org.opencontainers.image.version=$VERSION" \
  --config.label "org.opencontainers.image.revision=$REVISION" \
  --config.label "org.opencontainers.image.created=$CREATED" \
  --config.label "org.opencontainers.image.licenses=Apache-2.0"
umoci gc --layout "$layout"

mkdir -p "$OUT"
archive="$OUT/ballast-$VERSION.oci.tar"
find "$layout" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -cf "$archive.tmp" -C "$layout" .
mv "$archive.tmp" "$archive"
digest="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$layout/index.json")"
echo "$digest" >"$OUT/ballast-$VERSION.digest"
log "$archive: ballast:$VERSION@$digest (revision $REVISION, created $CREATED)"

if [[ -n "${IMG:-}" ]]; then
  need skopeo skopeo
  log "pushing to $IMG"
  skopeo copy ${SKOPEO_FLAGS:-} "oci-archive:$archive:$VERSION" "docker://$IMG"
fi
echo "$digest"
