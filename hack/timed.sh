#!/usr/bin/env bash
# Runs one build or test step and then says, on stderr, what it cost: wall seconds, CPU seconds
# (user + sys of every process it ran) and, under `make prepare`, when it ended counted from the
# start of prepare. A CI log then shows where its time went, step by step.
#
#   hack/timed.sh STEP COMMAND [ARG...]     exits with COMMAND's status
set -uo pipefail

step=$1
shift
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
TIMEFORMAT="%R s wall, %U s user + %S s sys"
# time's line goes to the report; the command's own stderr still reaches ours (through fd 3).
{ time "$@" 2>&3; } 3>&2 2>"$report"
rc=$?
ended=""
if [[ -n "${EMBEDFLEET_PREPARE_START:-}" ]]; then
  ended=", ended at +$(($(date +%s) - EMBEDFLEET_PREPARE_START)) s"
fi
echo "time $step: $(cat "$report")$ended (load $(cut -d' ' -f1-3 /proc/loadavg)), exit $rc" >&2
exit "$rc"
