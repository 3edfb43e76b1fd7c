#!/usr/bin/env bash
# Installs what `make images` and tests/images need from Debian, idempotently: buildah (the
# daemonless builder), debootstrap (the base image) and runc (RUN steps, and the tests' containers).
#
#   hack/install-image-tools.sh     install whichever of them is missing
set -euo pipefail

missing=()
for tool in buildah debootstrap runc; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
if [[ "$(id -u)" != 0 ]]; then
  echo "install-image-tools: need root for apt-get (or install Debian's ${missing[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Another apt run (a second engineer, CI's other jobs) holds the lock: wait for it, up to 10 min.
apt() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }
apt-get install -y --no-install-recommends --dry-run "${missing[@]}" >/dev/null 2>&1 || apt update -qq
apt install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for tool in "${missing[@]}"; do
  command -v "$tool" >/dev/null || { echo "install-image-tools: $tool still missing" >&2; exit 1; }
done
