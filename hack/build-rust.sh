#!/usr/bin/env bash
# Builds (or reuses) one crate of the root cargo workspace and prints its artifact's path as its
# last line: gateway (embedfleet-gateway, the gateway of gateway/, docs/gateway.md; also
# hack/build-gateway.sh) or worker-front (embedfleet_front.abi3.so, the worker's Rust front,
# a Python extension loaded by embedfleet-worker --front rust --front-library PATH).
#
#   hack/build-rust.sh CRATE [--key | --target-dir]
#
# The artifact lands in ${EMBEDFLEET_CACHE:-$HOME/.cache/embedfleet}/CRATE/bin/<key>/, key =
# hash of rustc -V, the workspace's Cargo.toml and Cargo.lock, the crate's Cargo.toml, build.rs,
# src/ (with the calibration the gateway embeds), contract/ (the OpenAPI document the gateway
# serves), proto/, the proto both compile and the shared crates (crates/, which both use): a
# cached build is reused without invoking cargo.
# Both crates share one target directory (under the gateway's cache), keyed by rustc -V alone,
# so a source change recompiles the crate, not its ~150 dependencies (cargo tracks Cargo.lock in
# it itself). Cargo runs under nice with CARGO_BUILD_JOBS jobs (default: every core).
# Builds beyond the newest six (EMBEDFLEET_GATEWAY_BINARY_KEEP) are removed after a build.
# --key prints the artifact's path without building; --target-dir the cargo target directory.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="${1:?usage: hack/build-rust.sh CRATE [--key | --target-dir]}"
shift
case "$name" in
  gateway) built=embedfleet-gateway artifact=embedfleet-gateway ;;
  # abi3: the name CPython's importer accepts for an extension of any version >= 3.11
  worker-front) built=libembedfleet_front.so artifact=embedfleet_front.abi3.so ;;
  *) echo "hack/build-rust.sh: unknown crate $name (gateway, worker-front)" >&2; exit 2 ;;
esac
crate="$root/$name"
cargo="${CARGO:-$(command -v cargo || echo "$HOME/.cargo/bin/cargo")}"
rustc="${RUSTC:-$(command -v rustc || echo "$HOME/.cargo/bin/rustc")}"
cache_root="${EMBEDFLEET_CACHE:-$HOME/.cache/embedfleet}"
cache="$cache_root/$name"
proto="$root/common/src/embedfleet/common/proto/embedfleet.proto"
shared="$root/crates"
# What the key covers (and a build touches) of the crate's own files.
sources=()
for path in build.rs src contract proto; do [[ -e "$crate/$path" ]] && sources+=("$path"); done

toolchain="$("$rustc" -V)"
key="$(
  {
    echo "$toolchain"
    sha256sum "$root/Cargo.toml" "$root/Cargo.lock" | cut -d' ' -f1
    cd "$crate"
    find Cargo.toml "${sources[@]}" -type f | LC_ALL=C sort | xargs sha256sum
    sha256sum "$proto" | cut -d' ' -f1
    cd "$shared"
    find . -type f | LC_ALL=C sort | xargs sha256sum
  } | sha256sum | cut -c1-16
)"
deps_key="$(echo "$toolchain" | sha256sum | cut -c1-16)"
bin_dir="$cache/bin/$key"
target="$cache_root/gateway/target-$deps_key"
binary="$bin_dir/$artifact"

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
  echo "building $name (target $target)" >&2
  # Checkouts share the target directory, and cargo judges the crate fresh by mtime: sources
  # older than another checkout's last build would leave that build's binary in place, filed
  # here under this checkout's key. Touching what the key covers makes cargo rebuild the crate
  # (its dependencies are judged by hash and stay built).
  (cd "$crate" && find "${sources[@]}" -type f -exec touch {} +)
  find "$shared" -type f -exec touch {} +
  touch "$proto"
  (cd "$crate" && CARGO_TARGET_DIR="$target" nice -n 19 "$cargo" build --release --locked \
    -j "${CARGO_BUILD_JOBS:-$(nproc)}" >&2)
  staging="$(mktemp -d "$cache/bin/.building.XXXXXX")"
  cp "$target/release/$built" "$staging/$artifact"
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
