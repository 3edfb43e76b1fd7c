#!/usr/bin/env bash
# Installs the real Prometheus server and promtool from Debian (package `prometheus`), idempotently.
# The tests start their own Prometheus with a generated config; the packaged system service must
# never start, so a temporary policy-rc.d forbids service starts during the install (Debian's
# invoke-rc.d honours it), and an already running packaged service is left alone but not started.
#
#   hack/install-prometheus.sh      install if `prometheus` or `promtool` is missing
set -euo pipefail
# shellcheck source=lib/apt.sh
. "$(dirname "$0")/lib/apt.sh"

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
  echo "install-prometheus: need root for apt-get (or install Debian's prometheus package)" >&2
  exit 1
fi

policy=/usr/sbin/policy-rc.d
restore=""
if [[ -e "$policy" ]]; then
  restore="$(mktemp)"
  cp -p "$policy" "$restore"
fi
cleanup() {
  if [[ -n "$restore" ]]; then mv "$restore" "$policy"; else rm -f "$policy"; fi
}
trap cleanup EXIT
printf '#!/bin/sh\n# install-prometheus.sh: no service starts while packages install\nexit 101\n' >"$policy"
chmod 0755 "$policy"

# --no-install-recommends: skips the node exporter and other services the tests do not use.
apt_install prometheus
command -v prometheus >/dev/null && command -v promtool >/dev/null
prometheus --version 2>&1 | head -1 >&2
