#!/usr/bin/env bash
# Deletes the leader Leases that test operators left in ballast-system (one per test
# namespace, `ballast-<namespace>[-<n>]`) once their namespace is gone. The cluster is
# torn down in CI; on a long-lived development cluster they would pile up.
set -euo pipefail
ns_list="$(kubectl get namespaces -o name | sed 's|^namespace/||')"
kubectl get leases -n ballast-system -o name 2>/dev/null | sed 's|^lease.coordination.k8s.io/||' |
  while read -r lease; do
    case "$lease" in ballast-*) ;; *) continue ;; esac
    rest="${lease#ballast-}"
    # Only names of test namespaces (<prefix>-<8 hex digits>) are ours to collect.
    [[ "$rest" =~ ^([a-z0-9-]+-[0-9a-f]{8})(-[0-9]+)?$ ]] || continue
    owner="${BASH_REMATCH[1]}"
    if ! grep -qx -- "$owner" <<<"$ns_list"; then
      echo "$lease"
    fi
  done | xargs -r kubectl delete lease -n ballast-system --wait=false >/dev/null
