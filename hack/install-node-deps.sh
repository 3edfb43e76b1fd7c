#!/usr/bin/env bash
# Installs, from Debian and idempotently, what the real-node harness runs but does not build:
# runc (the OCI runtime under containerd), nft (kube-proxy's nftables mode), ip and nsenter (the
# node's network namespace), gcc and a static libc (the pause binary), openssl (certificates).
#
#   hack/install-node-deps.sh      apt-get install only what is missing
set -euo pipefail
# shellcheck source=lib/apt.sh
. "$(dirname "$0")/lib/apt.sh"

# command -> Debian package
declare -A packages=(
  [runc]=runc
  [nft]=nftables
  [ip]=iproute2
  [nsenter]=util-linux
  [gcc]=gcc
  [openssl]=openssl
)
missing=()
for cmd in "${!packages[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${packages[$cmd]}")
done
# The pause binary links statically against glibc.
[[ -f /usr/lib/x86_64-linux-gnu/libc.a ]] || missing+=(libc6-dev)
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
apt_install "${missing[@]}"
echo "install-node-deps: installed ${missing[*]}" >&2
