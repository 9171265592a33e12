#!/usr/bin/env bash
# make bench-cluster: the cluster benchmarks (benches/cluster_*.rs) against the local control
# plane, each on that cluster started afresh, in the order of CLUSTER_BENCHES; every one runs even
# when one before it failed, and the script fails if any did. Then the plots.
#
# P2 of cluster_spread (ten minutes of scale churn and a minute at rest) measures counts of the
# operator's own requests, not times, and the load of others does not change them; so, to bring
# the whole closer to issue 9's 30 minutes on a bare 2-core machine, other work runs beside it:
#   1. only what cluster_spread and cluster_admission need is built first (the dependencies,
#      the manager, those two benches), while the first cluster starts;
#   2. cluster_spread starts; once P2's churn has begun (the bench creates a file),
#      cluster_admission (it compares phases of its own run, with and without the policies,
#      under the same background) runs on the same cluster, waiting for its own cleanup; first,
#      so that the controller manager's work it leaves is done before the churn ends (P2's end
#      waits for that controller);
#   3. then P2 may end its churn and start its minute at rest (it waits for a second file), which
#      nothing of cluster_admission's reaches (P2's operator watches only its namespace); the
#      other benches build meanwhile (a build asks the API server nothing);
#   4. the rest, each on a fresh cluster: cluster_scheduler (its pods are made by the controller
#      manager, which P1's 20000 Deployments keep busy through the whole of P2: beside P2 its
#      floor placed 2.3 pods/s instead of 55), then cluster_rollout (P5 and P6 judge tens of
#      milliseconds). The first of them gets a second cluster (state in $BALLAST_CLUSTER_DIR-next,
#      ports 10000 above the default ones), started during P2 once the benches beside it are
#      done, so that it can begin as soon as cluster_spread ends; the last runs on the cluster of
#      $BALLAST_CLUSTER_DIR, which it leaves up (and clean) for `make test`.
# Each bench's results record what ran beside it (`settings.beside`).
#
# The benches are built with `--no-default-features`: cargo builds every binary of a package for
# its benches, and they need only the manager, not crdgen or the kubectl plugin (about 40 s less
# before the first bench on a bare 2-core machine).
#
# Environment: CLUSTER_BENCHES (all four), BENCH_FRESH (1: each bench, or the group above, on the
# cluster started afresh; 0: the cluster as it is), BENCH_BESIDE_P2 (1; 0: each bench alone, one
# after another, as before 2026-12-07), CARGO, BALLAST_CLUSTER_DIR (.cluster).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

CARGO="${CARGO:-cargo}"
read -r -a BENCHES <<<"${CLUSTER_BENCHES:-cluster_spread cluster_scheduler cluster_admission cluster_rollout}"
FRESH="${BENCH_FRESH:-1}"
STATE="${BALLAST_CLUSTER_DIR:-$ROOT/.cluster}"
export BALLAST_CLUSTER_DIR="$STATE"
# The cluster started during P2 for the first bench after cluster_spread (see above).
NEXT="$STATE-next"
NEXT_APISERVER_PORT=26443
FEATURES=(--no-default-features)
# The benches that may run beside P2 (when asked for).
CAN_BESIDE=(cluster_admission)

log() { echo "[bench-cluster] $*" >&2; }

wanted() {
    local b
    for b in "${BENCHES[@]}"; do [[ "$b" == "$1" ]] && return 0; done
    return 1
}

beside=()
if [[ "${BENCH_BESIDE_P2:-1}" == 1 ]] && wanted cluster_spread && [[ "${BALLAST_BENCH_STEADY_N:-}" != 0 ]]; then
    for b in "${CAN_BESIDE[@]}"; do wanted "$b" && beside+=("$b"); done
fi
if [[ ${#beside[@]} -gt 0 ]]; then
    rest=()
    for b in "${BENCHES[@]}"; do
        [[ "$b" == cluster_spread ]] && continue
        [[ " ${beside[*]} " == *" $b "* ]] && continue
        rest+=("$b")
    done
else
    rest=("${BENCHES[@]}")
fi

hack/build-cluster.sh

started_at=$SECONDS
failed=()
tmp="$(mktemp -d)"
spread_pid=""
next_pid=""
down_pids=()
cleanup() {
    # P2 must never wait for benches that will not come.
    touch "$tmp/hold" 2>/dev/null || true
    if [[ -n "$spread_pid" ]] && kill -0 "$spread_pid" 2>/dev/null; then
        wait "$spread_pid" 2>/dev/null || true
    fi
    if [[ -n "$next_pid" ]]; then wait "$next_pid" 2>/dev/null || true; fi
    for p in "${down_pids[@]}"; do wait "$p" 2>/dev/null || true; done
    next hack/cluster-down.sh >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT

# The cluster as the next bench (or group) should find it: started afresh, or as it is.
cluster() {
    if [[ "$FRESH" == 1 ]]; then hack/cluster-down.sh; fi
    hack/cluster-up.sh
}

# The second cluster: its own state directory and ports (10000 above the defaults).
next() {
    env BALLAST_CLUSTER_DIR="$NEXT" BALLAST_APISERVER_PORT="$NEXT_APISERVER_PORT" \
        BALLAST_ETCD_PORT=22379 BALLAST_ETCD_PEER_PORT=22380 BALLAST_KCM_PORT=20257 \
        BALLAST_SCHEDULER_PORT=20259 BALLAST_KWOK_PORT=20247 "$@"
}

# run_bench NAME CLEANUP [ENV=VALUE...]: one bench against the cluster of $ON ($STATE unless
# said otherwise); CLEANUP is `wait` or `background` (BALLAST_BENCH_CLEANUP: whether it waits
# for its namespaces to be gone).
ON="$STATE"
run_bench() {
    local b="$1" cleanup="$2"
    shift 2
    env KUBECONFIG="$ON/kubeconfig" PATH="$ON/bin:$PATH" BALLAST_BENCH_CLEANUP="$cleanup" "$@" \
        "$CARGO" bench "${FEATURES[@]}" --bench "$b"
}

# The bench that ends last: it waits for its cleanup, so that the cluster it leaves up is clean.
if [[ ${#rest[@]} -gt 0 ]]; then LAST="${rest[-1]}"; else LAST="${BENCHES[-1]}"; fi
if [[ ${#beside[@]} -gt 0 && ${#rest[@]} -eq 0 ]]; then LAST=cluster_spread; fi

# Whether a bench but the last may leave its cleanup to the next fresh start.
cleanup_of() {
    if [[ "$FRESH" == 1 && "$1" != "$LAST" ]]; then echo background; else echo wait; fi
}

# cluster_spread deletes its floors' namespaces as P2 begins, without waiting (P2 counts
# requests, not time). What runs beside P2 starts once they are gone, so that their deletion (15000
# Deployments at N = 5000, tens of seconds of the API server's work) falls in no phase of its own.
floors_gone() {
    local i
    for i in $(seq 1 150); do
        if ! KUBECONFIG="$ON/kubeconfig" "$ON/bin/kubectl" get namespaces -o name 2>/dev/null |
            grep -q '^namespace/bench-spread-.*-floor'; then
            return 0
        fi
        sleep 2
    done
    log "cluster_spread's floor namespaces still there after 5 minutes; going on"
}

build() {
    local args=() b
    for b in "$@"; do args+=(--bench "$b"); done
    "$CARGO" bench --no-run "${FEATURES[@]}" "${args[@]}"
}

if [[ ${#beside[@]} -gt 0 ]]; then
    # The first cluster starts while cluster_spread and the benches beside P2 build (both wait
    # for each other's end).
    cluster >"$tmp/cluster-up.log" 2>&1 &
    up_pid=$!
    build cluster_spread "${beside[@]}"
    up=0
    wait "$up_pid" || up=$?
    cat "$tmp/cluster-up.log" >&2
    if [[ $up != 0 ]]; then
        log "the cluster did not start beside the build; once more, alone"
        cluster && up=0
    fi
    if [[ $up == 0 ]]; then
        log "cluster_spread; once its P2 churns: ${beside[*]} on the same cluster"
        run_bench cluster_spread "$(cleanup_of cluster_spread)" \
            BALLAST_BENCH_STEADY_STARTED="$tmp/started" BALLAST_BENCH_STEADY_HOLD="$tmp/hold" \
            BALLAST_BENCH_BESIDE="${beside[*]} (during P2's churn)" &
        spread_pid=$!
        while [[ ! -e "$tmp/started" ]] && kill -0 "$spread_pid" 2>/dev/null; do sleep 2; done
        if [[ -e "$tmp/started" ]]; then
            # First what runs beside the churn, so that the controller manager's work it leaves
            # (a new ReplicaSet for each of its template changes, minutes of it at 100
            # requests/s) is done before the churn ends: P2's end waits for that controller.
            floors_gone
            log "P2 churns ($((SECONDS - started_at)) s in; the floors' namespaces gone): ${beside[*]}, then the other benches' build"
            for b in "${beside[@]}"; do
                run_bench "$b" wait BALLAST_BENCH_BESIDE="cluster_spread, P2's churn" || failed+=("$b")
            done
            if [[ "$FRESH" == 1 && ${#rest[@]} -gt 1 ]]; then
                log "starting ${rest[0]}'s cluster beside P2 ($NEXT, API server on 127.0.0.1:$NEXT_APISERVER_PORT)"
                { next hack/cluster-down.sh && next hack/cluster-up.sh; } >"$tmp/next-up.log" 2>&1 &
                next_pid=$!
            fi
            log "${beside[*]} done; P2 may end its churn"
            touch "$tmp/hold"
        else
            log "cluster_spread ended before P2's churn: ${beside[*]} each on a cluster of its own"
            rest=("${beside[@]}" "${rest[@]}")
            LAST="${rest[-1]}"
        fi
        build "${rest[@]}" plots || failed+=(build)
        wait "$spread_pid" || failed+=(cluster_spread)
        spread_pid=""
    else
        failed+=(cluster_spread "${beside[@]}")
        build "${rest[@]}" plots || failed+=(build)
    fi
else
    build "${rest[@]}" plots
fi

# A cluster that is done with goes in the background, while the next bench sets up.
if [[ -n "$next_pid" ]]; then
    up=0
    wait "$next_pid" || up=$?
    next_pid=""
    cat "$tmp/next-up.log" >&2
    if [[ $up == 0 ]]; then
        # cluster_spread's cluster is done with: the next bench runs on the second one.
        hack/cluster-down.sh >"$tmp/down.log" 2>&1 &
        down_pids+=($!)
        b="${rest[0]}"
        rest=("${rest[@]:1}")
        ON="$NEXT" run_bench "$b" "$(cleanup_of "$b")" || failed+=("$b")
        wait "${down_pids[@]}" || true
        cat "$tmp/down.log" >&2
        next hack/cluster-down.sh >"$tmp/down-next.log" 2>&1 &
        down_pids=($!)
    else
        log "the second cluster did not start; ${rest[0]} on a fresh one of its own"
        next hack/cluster-down.sh || true
    fi
fi

for b in "${rest[@]}"; do
    if cluster; then
        run_bench "$b" "$(cleanup_of "$b")" || failed+=("$b")
    else
        failed+=("$b")
    fi
done
if [[ ${#down_pids[@]} -gt 0 ]]; then
    wait "${down_pids[@]}" || true
    cat "$tmp/down-next.log" >&2
fi

"$CARGO" bench "${FEATURES[@]}" --bench plots || failed+=(plots)
log "done in $((SECONDS - started_at)) s (the control plane's binaries: hack/build-cluster.sh, before)"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "bench-cluster: failed: ${failed[*]}" >&2
    exit 1
fi
