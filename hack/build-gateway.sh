#!/usr/bin/env bash
# Builds (or reuses) embedfleet-gateway, the gateway of gateway/ (docs/gateway.md), and
# prints the binary's path as its last line.
#
# The binary lands in ${EMBEDFLEET_CACHE:-$HOME/.cache/embedfleet}/gateway/bin/<key>/, key =
# hash of rustc -V, the workspace's Cargo.toml and Cargo.lock, the crate's Cargo.toml, build.rs,
# src/ (with the calibration it embeds),
# contract/ (the OpenAPI document it serves), proto/ and the proto it compiles: a cached build is
# reused without invoking cargo. The target directory
# is keyed by rustc -V alone, so a source change recompiles the crate, not its ~150 dependencies
# (cargo tracks Cargo.lock in it itself). Cargo runs under nice with CARGO_BUILD_JOBS jobs
# (default: every core).
# Builds beyond the newest six (EMBEDFLEET_GATEWAY_BINARY_KEEP) are removed after a build.
# --key prints the binary's path without building; --target-dir the cargo target directory.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
crate="$root/gateway"
cargo="${CARGO:-$(command -v cargo || echo "$HOME/.cargo/bin/cargo")}"
rustc="${RUSTC:-$(command -v rustc || echo "$HOME/.cargo/bin/rustc")}"
cache="${EMBEDFLEET_CACHE:-$HOME/.cache/embedfleet}/gateway"
proto="$root/common/src/embedfleet/common/proto/embedfleet.proto"

toolchain="$("$rustc" -V)"
key="$(
  {
    echo "$toolchain"
    sha256sum "$root/Cargo.toml" "$root/Cargo.lock" | cut -d' ' -f1
    cd "$crate"
    find Cargo.toml build.rs src contract proto -type f | LC_ALL=C sort | xargs sha256sum
    sha256sum "$proto" | cut -d' ' -f1
  } | sha256sum | cut -c1-16
)"
deps_key="$(echo "$toolchain" | sha256sum | cut -c1-16)"
bin_dir="$cache/bin/$key"
target="$cache/target-$deps_key"
binary="$bin_dir/embedfleet-gateway"

if [[ "${1:-}" == "--target-dir" ]]; then
  echo "$target"
  exit 0
fi
if [[ "${1:-}" == "--key" ]]; then
  echo "$binary"
  exit 0
fi
if [[ -x "$binary" ]]; then
  echo "$binary"
  exit 0
fi

mkdir -p "$cache/bin"
# One builder at a time per cache: a second caller waits, then finds the finished build.
exec 9>"$cache/bin/.build.lock"
flock 9
if [[ ! -x "$binary" ]]; then
  echo "building embedfleet-gateway (target $target)" >&2
  # Checkouts share the target directory, and cargo judges the crate fresh by mtime: sources
  # older than another checkout's last build would leave that build's binary in place, filed
  # here under this checkout's key. Touching what the key covers makes cargo rebuild the crate
  # (its dependencies are judged by hash and stay built).
  (cd "$crate" && find build.rs src contract proto -type f -exec touch {} +)
  touch "$proto"
  (cd "$crate" && CARGO_TARGET_DIR="$target" nice -n 19 "$cargo" build --release --locked \
    -j "${CARGO_BUILD_JOBS:-$(nproc)}" >&2)
  staging="$(mktemp -d "$cache/bin/.building.XXXXXX")"
  cp "$target/release/embedfleet-gateway" "$staging/"
  rm -rf "$bin_dir"
  mv "$staging" "$bin_dir"
  # Each source change leaves a 12 MB binary: keep the newest ${EMBEDFLEET_GATEWAY_BINARY_KEEP:-6}
  # (worktrees sharing the cache alternate between their trees), never the one just built.
  keep="${EMBEDFLEET_GATEWAY_BINARY_KEEP:-6}"
  for old in $(ls -1t "$cache/bin" | grep -E '^[0-9a-f]{16}$' | tail -n +"$((keep + 1))" || true); do
    if [[ "$cache/bin/$old" != "$bin_dir" ]]; then rm -rf "${cache:?}/bin/$old"; fi
  done
fi
echo "$binary"
