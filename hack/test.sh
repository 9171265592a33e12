#!/usr/bin/env bash
# The README's test command (`make test`): builds the control plane if it is
# not cached, starts the local cluster (unless one is already up), runs every
# test against it, two test binaries at a time (hack/test-binaries.sh), and
# stops the cluster again if this script started it. Arguments are test
# filters for every binary. With none, the pool also runs the RolloutStrategy
# tests in pause-at-rest mode, the smoke bench, and the two tests that bring
# up and stop clusters of their own (tests/faults_cluster.rs, tests/install.rs).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STATE="${BALLAST_CLUSTER_DIR:-$ROOT/.cluster}"

# tests/argocd_health.rs runs the Argo CD health check with a real Lua interpreter (and fails
# without one): install it on a bare machine.
if ! command -v lua5.4 >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  apt_install() { $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lua5.4; }
  log="$(mktemp)"
  if ! { apt_install || { $sudo apt-get update -qq && apt_install; }; } >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
  rm -f "$log"
fi

hack/build-cluster.sh
# The real helm (v4; tests/install.rs renders and installs the chart with it) and promtool
# (tests/prometheus_config.rs), each built once from its Go modules and cached like the control
# plane. On a bare machine that is about 6 minutes of two busy cores, while the tests leave most
# of them idle (waiting on the cluster): so the tools build in the background at the lowest CPU
# priority while the tests run, and a test that needs one before it is built waits for that
# build (hack/build-tool.sh takes a lock per tool), or builds it itself.
tools_log="$(mktemp)"
built="$(mktemp)"
jobfile="$(mktemp)"
(nice -n 19 hack/build-tool.sh helm && nice -n 19 hack/build-tool.sh promtool) >/dev/null 2>"$tools_log" &
tools=$!

started=false
if ! hack/cluster-up.sh --check 2>/dev/null; then
  started=true
fi
cleanup() {
  # Nothing is left building: a run that needed neither tool waits for their build here.
  if ! wait "$tools"; then
    echo "hack/test.sh: building helm or promtool failed (the tests that need them say so too):" >&2
    cat "$tools_log" >&2
  fi
  rm -f "$tools_log" "$built" "$jobfile"
  if $started; then
    hack/cluster-down.sh
  else
    # A cluster that stays up keeps no Leases of finished tests.
    KUBECONFIG="$STATE/kubeconfig" PATH="$STATE/bin:$PATH" hack/gc-test-leases.sh || true
  fi
}
trap cleanup EXIT
hack/cluster-up.sh

export KUBECONFIG="$STATE/kubeconfig"
# Tests that need the cluster fail (never skip) when it cannot be started.
# Benches are built by `make lint` (clippy --all-targets) and run by `make bench`.
rm -rf target/fault-results
# Every test executable is built first, then run by hack/test-binaries.sh, two at a time
# (BALLAST_TEST_JOBS): each test waits on the cluster most of the time, and the run took 33 minutes
# one binary after another.
extra=()
[ $# -gt 0 ] || extra=(--bench cluster_spread)
cargo test --no-run --lib --bins --tests "${extra[@]}" 2>&1 | tee "$built" >&2
# Each `Executable [unittests ]<source> (<path>)` line of cargo, read once: exe[<label>] is the
# path; the label is a test target's name (tests/faults_proxy/main.rs: faults_proxy), else
# `unittests-src-lib`, `bench-cluster_spread`.
declare -A exe queued
labels=()
while IFS=$'\t' read -r src path; do
  case "$src" in
    tests/*) label="${src#tests/}" label="${label%/main.rs}" ;;
    benches/*) label="bench-${src#benches/}" label="${label%/main.rs}" ;;
    *) label="unittests-$src" ;;
  esac
  label="${label%.rs}"
  label="${label//\//-}"
  exe[$label]=$path
  labels+=("$label")
done < <(sed -En 's#^ *Executable (unittests )?(.*) \((.*)\)$#\2\t\3#p' "$built")
q() { printf '%q ' "$@"; }
job() {
  queued[$1]=1
  printf '%s\t%s\t%s\n' "$1" "$2" "${3:-}" >>"$jobfile"
}

# tests/faults_cluster.rs's outages and tests/install.rs's install start clusters of their own:
# they are jobs of their own (when no test is named), and skipped in their binaries' jobs.
skip=(--skip outages_and_uninstall_on_a_cluster_of_their_own
  --skip installer_and_chart_install_and_uninstall_cleanly_on_a_cluster_of_their_own)
# Alone, before the others: tests/spread_distribution.rs counts its policies' status writes in
# the steady state of a spread with a Pending pod, whose scheduler message ("0/N nodes are
# available: …") changes, truly, when another test adds nodes to the cluster.
job spread_distribution "$(q "${exe[spread_distribution]}" "${skip[@]}" "$@")" alone
# Then the longest first, so that the pool does not end waiting on one of them (wall times of
# tests/*.rs from target/test-logs of a run: hack/test-binaries.sh prints them at its end).
for t in faults_proxy rollout_strategy spread_policy faults rollout_gate foundation faults_spread \
  rollout_steady_state rollout_webhook; do
  job "$t" "$(q "${exe[$t]}" "${skip[@]}" "$@")"
done
if [ $# -eq 0 ]; then
  # The RolloutStrategy and webhook hook tests ran with the revision gate (admission, the
  # default); once more in the fallback mode, where governed Deployments are kept paused at rest.
  for t in rollout_strategy rollout_webhook; do
    job "$t-pause-at-rest" "BALLAST_TEST_GATE=pause-at-rest $(q "${exe[$t]}")"
  done
  # F5 and F6 restart the API server and delete the CRDs: the target starts a cluster of its
  # own (target/faults-cluster, other ports; see its module doc), runs them and stops it.
  job faults_cluster-own-cluster "$(q "${exe[faults_cluster]}" --test-threads=1 --exact \
    outages_and_uninstall_on_a_cluster_of_their_own)"
  # The SpreadPolicy fan-out benchmark's harness, small (N = 200, this debug build; only its
  # counts of writes and requests are judged), so that `make bench-cluster` cannot rot.
  job bench-cluster_spread "BALLAST_BENCH_SMOKE=1 PATH=$(printf %q "$STATE/bin"):\$PATH $(q "${exe[bench-cluster_spread]}")"
fi
# Every other test executable, in cargo's order.
for label in "${labels[@]}"; do
  [ -n "${queued[$label]:-}" ] || job "$label" "$(q "${exe[$label]}" "${skip[@]}" "$@")"
done
if [ $# -eq 0 ]; then
  # dist/install.yaml and the Helm chart installed and uninstalled (target/install-cluster), last:
  # on a bare machine Helm is still being built (above) while the first jobs run.
  job install-own-cluster "$(q "${exe[install]}" --exact \
    installer_and_chart_install_and_uninstall_cleanly_on_a_cluster_of_their_own)"
fi
status=0
hack/test-binaries.sh "$jobfile" || status=$?
if [ $# -eq 0 ]; then
  # The fault-injection scenarios (tests/faults*.rs) each wrote a row; print the table.
  hack/fault-table.sh
fi
exit "$status"
