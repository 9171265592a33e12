#!/usr/bin/env bash
# Runs test executables side by side, JOBS at a time (hack/test.sh's pool). The tests spend most
# of their time waiting on the cluster (a third of a core, measured), one binary after another as
# `cargo test` runs them; here a second binary runs while the first waits.
#
#   hack/test-binaries.sh JOBFILE
#
# JOBFILE has one job a line: `label<TAB>command[<TAB>alone]` (the command is run by bash from
# the repository's root, as cargo runs a test). Jobs start in the file's order, so the longest go
# first; a job marked `alone` starts when no other runs, and none starts beside it. Each job's
# output is kept in target/test-logs/<label>.log and printed whole when the job ends; a line says
# when each starts. Every job runs (no fail-fast); the exit status is 1 if any failed, and the
# end prints each job's wall time and which failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOBFILE="$1"
JOBS="${BALLAST_TEST_JOBS:-2}"
LOGS="$ROOT/target/test-logs"
rm -rf "$LOGS"
mkdir -p "$LOGS"

declare -A label_of started_at
labels=()
cmds=()
alone=()
while IFS=$'\t' read -r label cmd how; do
  [ -n "$label" ] || continue
  labels+=("$label")
  cmds+=("$cmd")
  alone+=("$([ "$how" = alone ] && echo 1 || echo 0)")
done <"$JOBFILE"

failed=()
times=()
# Interrupted (Ctrl-C, a CI timeout): the binaries still running go too.
trap 'kill ${!label_of[*]} 2>/dev/null || true' INT TERM
running=0
running_alone=0
next=0
t0=$(date +%s)

finish() {
  local pid=$1 rc=$2 label=${label_of[$1]}
  local took=$(($(date +%s) - ${started_at[$1]}))
  echo "     Finished $label in ${took} s (exit $rc, $(($(date +%s) - t0)) s into the run)"
  cat "$LOGS/$label.log"
  times+=("$(printf '%6d s  %s' "$took" "$label")")
  [ "$rc" -eq 0 ] || failed+=("$label")
  running=$((running - 1))
  running_alone=0
}

while [ "$next" -lt "${#labels[@]}" ] || [ "$running" -gt 0 ]; do
  while [ "$running" -lt "$JOBS" ] && [ "$next" -lt "${#labels[@]}" ] && [ "$running_alone" = 0 ]; do
    if [ "${alone[$next]}" = 1 ]; then
      [ "$running" -eq 0 ] || break
      running_alone=1
    fi
    label=${labels[$next]}
    echo "     Starting $label ($(($(date +%s) - t0)) s into the run): ${cmds[$next]}"
    bash -c "${cmds[$next]}" >"$LOGS/$label.log" 2>&1 &
    label_of[$!]=$label
    started_at[$!]=$(date +%s)
    running=$((running + 1))
    next=$((next + 1))
  done
  # The next job to end, whichever it is.
  rc=0
  wait -n -p done_pid "${!label_of[@]}" || rc=$?
  finish "$done_pid" "$rc"
  unset "label_of[$done_pid]"
done

echo
echo "Test binaries, wall time each ($JOBS at a time; $(($(date +%s) - t0)) s in all):"
printf '%s\n' "${times[@]}" | sort -rn
if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
