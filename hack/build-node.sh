#!/usr/bin/env bash
# Builds (or reuses) what one real Kubernetes node needs besides Debian's runc:
#   bin/     kubelet, kube-proxy (the Kubernetes release in hack/tools), containerd, ctr,
#            containerd-shim-runc-v2 (hack/node/containerd), testserver (hack/node/testserver)
#   cni/     bridge, host-local (hack/node/cni): the only plugins the node's CNI config names
#            (containerd raises the pods' loopback itself; no hostPorts, so no portmap)
#   images/  pause.tar (a static pause from the Kubernetes module, compiled with gcc) and
#            testserver.tar: one-layer image archives; images.json names their references.
#
# Everything lands in ${EMBEDFLEET_CACHE:-$HOME/.cache/embedfleet}/node/<key>/, shared by every
# checkout. <key> names the versions plus a hash of every input (the three Go modules, the test
# server's source, the image packer, the Go and gcc versions, the flags), so a cached build is
# reused without invoking a compiler. Progress goes to stderr; the last line on stdout is the dir.
#
#   hack/build-node.sh          build if needed, print the directory
#   hack/build-node.sh --key    print the directory it would use, build nothing
set -euo pipefail

hack_dir="$(cd "$(dirname "$0")" && pwd)"
tools_dir="$hack_dir/tools"
node_dir="$hack_dir/node"
# shellcheck source=tools/versions.env
. "$tools_dir/versions.env"
# shellcheck source=lib/k8s-ldflags.sh
. "$hack_dir/lib/k8s-ldflags.sh"
# shellcheck source=lib/go-build.sh
. "$hack_dir/lib/go-build.sh"

# The pins live in each module's go.mod; read them rather than repeat them.
module_version() { sed -n "s#^[[:space:]]*$2 \(v[^[:space:]]*\).*#\1#p" "$1/go.mod" | head -1; }
containerd_version="$(module_version "$node_dir/containerd" github.com/containerd/containerd/v2)"
cni_version="$(module_version "$node_dir/cni" github.com/containernetworking/plugins)"
[[ -n "$containerd_version" && -n "$cni_version" ]] || {
  echo "build-node: cannot read the containerd/CNI versions from hack/node/*/go.mod" >&2
  exit 1
}

# Without btrfs, devmapper and zfs containerd needs no C libraries (CGO_ENABLED=0).
containerd_tags="no_btrfs no_devmapper no_zfs"
pause_cflags="-Os -Wall -Werror -static"
# module dir:output dir:packages. One `go build` per module, so the packages its commands share
# compile once; kubelet and kube-proxy come after hack/build-tools.sh, whose control plane has
# compiled nearly all of their packages with the same flags.
builds=(
  "containerd:bin:github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr"
  "cni:cni:github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/ipam/host-local"
  "testserver:bin:."
  "tools:bin:k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy"
)

toolchains="$(go env GOVERSION GOOS GOARCH | tr '\n' ' ') $(gcc -dumpfullversion 2>/dev/null || echo no-gcc)"
digest="$(
  {
    cat "$tools_dir/go.mod" "$tools_dir/go.sum"
    for m in containerd cni testserver; do cat "$node_dir/$m/go.mod" "$node_dir/$m"/go.sum 2>/dev/null || true; done
    cat "$node_dir/testserver/main.go" "$node_dir/image-archive.py"
    echo "$toolchains"; echo "${go_flags[*]}"; echo "$k8s_ldflags"; echo "$containerd_tags"
    echo "$pause_cflags"; printf '%s\n' "${builds[@]}"
  } | sha256sum | cut -c1-12
)"
key="k8s-${K8S_VERSION}_containerd-${containerd_version}_cni-${cni_version}_${digest}"
cache="${EMBEDFLEET_CACHE:-$HOME/.cache/embedfleet}"
out_dir="$cache/node/$key"

if [[ "${1:-}" == "--key" ]]; then
  echo "$out_dir"
  exit 0
fi
if [[ -f "$out_dir/.complete" ]]; then
  echo "$out_dir"
  exit 0
fi

mkdir -p "$cache/node"
# One builder at a time per cache: a second caller waits, then finds the finished build.
exec 9>"$cache/node/.build.lock"
flock 9
if [[ -f "$out_dir/.complete" ]]; then
  echo "$out_dir"
  exit 0
fi
command -v gcc >/dev/null || { echo "build-node: gcc not found (run hack/install-node-deps.sh)" >&2; exit 1; }

staging="$(mktemp -d "$cache/node/.building.XXXXXX")"
chmod 0755 "$staging"
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging/bin" "$staging/cni" "$staging/images"
echo "build-node: building $key" >&2
total_start=$SECONDS
for build in "${builds[@]}"; do
  IFS=: read -r module output pkgs <<<"$build"
  flags=("${go_flags[@]}")
  case "$module" in
    tools)
      # Compiles the control plane's packages first (or finds it built): kubelet then only links.
      bash "$hack_dir/build-tools.sh" >/dev/null
      flags+=(-ldflags "$k8s_ldflags"); module_dir="$tools_dir" ;;
    containerd) flags+=(-ldflags "-s -w" -tags "$containerd_tags"); module_dir="$node_dir/containerd" ;;
    *) flags+=(-ldflags "-s -w"); module_dir="$node_dir/$module" ;;
  esac
  start=$SECONDS
  echo "build-node: go build $pkgs" >&2
  # shellcheck disable=SC2086 # the packages are words
  (cd "$module_dir" && go build "${flags[@]}" -o "$staging/$output/" $pkgs)
  echo "$module $((SECONDS - start))s" | tee -a "$staging/build-times.txt" >&2
done

# The pause binary and its version come from the pinned Kubernetes module, as upstream builds it.
k8s_src="$(cd "$tools_dir" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
pause_tag="$(sed -n 's/^TAG ?= //p' "$k8s_src/build/pause/Makefile")"
start=$SECONDS
# shellcheck disable=SC2086 # the flags are words
gcc $pause_cflags "-DVERSION=v${pause_tag}" -o "$staging/images/pause" "$k8s_src/build/pause/linux/pause.c"
echo "pause $((SECONDS - start))s" | tee -a "$staging/build-times.txt" >&2

pause_ref="localhost/embedfleet/pause:${pause_tag}"
testserver_ref="localhost/embedfleet/node-testserver:${digest}"
python3 "$node_dir/image-archive.py" --tag "$pause_ref" --entrypoint /pause --user 65535:65535 \
  --file "$staging/images/pause:/pause" -o "$staging/images/pause.tar"
python3 "$node_dir/image-archive.py" --tag "$testserver_ref" --entrypoint /testserver \
  --user 65534:65534 --file "$staging/bin/testserver:/testserver" -o "$staging/images/testserver.tar"
rm "$staging/images/pause"
cat >"$staging/images.json" <<EOF
{
  "pause": {"ref": "$pause_ref", "archive": "images/pause.tar"},
  "testserver": {"ref": "$testserver_ref", "archive": "images/testserver.tar"}
}
EOF
echo "total $((SECONDS - total_start))s" | tee -a "$staging/build-times.txt" >&2
touch "$staging/.complete"
rm -rf "$out_dir"
mv "$staging" "$out_dir"
trap - EXIT
echo "$out_dir"
