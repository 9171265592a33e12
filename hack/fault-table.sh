#!/usr/bin/env bash
# Prints the fault-injection table from the rows the fault scenarios wrote under
# target/fault-results/ (one <id>.tsv per scenario; see tests/support/faults.rs).
# `make test` runs the scenarios and then this script; docs/reliability.md quotes its output.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/target/fault-results"
if ! compgen -G "$DIR/*.tsv" >/dev/null; then
  echo "no fault results under $DIR (run make test first)" >&2
  exit 1
fi
echo "| id | fault | runs | passed | checked |"
echo "|---|---|---|---|---|"
cat "$DIR"/*.tsv | sort -t$'\t' -k1,1V | awk -F'\t' '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }'
failed=$(awk -F'\t' '$3 != $4' "$DIR"/*.tsv | wc -l)
if [ "$failed" -ne 0 ]; then
  echo "$failed fault scenario(s) failed" >&2
  exit 1
fi
