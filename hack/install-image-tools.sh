#!/usr/bin/env bash
# Installs what `make images` and tests/images need from Debian, idempotently: buildah (the
# daemonless builder), debootstrap (the base image) and runc (RUN steps, and the tests' containers).
#
#   hack/install-image-tools.sh     install whichever of them is missing
set -euo pipefail
# shellcheck source=lib/apt.sh
. "$(dirname "$0")/lib/apt.sh"

missing=()
for tool in buildah debootstrap runc; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
apt_install "${missing[@]}"
for tool in "${missing[@]}"; do
  command -v "$tool" >/dev/null || { echo "install-image-tools: $tool still missing" >&2; exit 1; }
done
