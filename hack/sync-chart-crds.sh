#!/usr/bin/env bash
# Copies the CRDs (crds/, the source of truth) into the chart (charts/embedfleet/crds/), which Helm
# installs before the templates on a first install. Files in the chart's crds/ that crds/ no
# longer has are removed. tests/chart/test_crds_sync.py fails when the two differ.
#
#   hack/sync-chart-crds.sh           copy
#   hack/sync-chart-crds.sh --check   exit 1 (and list the differences) when out of sync
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
src="$root/crds"
dst="$root/charts/embedfleet/crds"

if [[ "${1:-}" == "--check" ]]; then
  if diff -r "$src" "$dst" >&2; then exit 0; fi
  echo "chart CRDs differ from crds/: run hack/sync-chart-crds.sh" >&2
  exit 1
fi

mkdir -p "$dst"
shopt -s nullglob
for f in "$dst"/*; do
  [[ -e "$src/$(basename "$f")" ]] || rm -f "$f"
done
for f in "$src"/*; do
  [[ -f "$f" ]] && cp "$f" "$dst/"
done
