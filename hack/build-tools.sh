#!/usr/bin/env bash
# Builds (or reuses) the control-plane binaries pinned in hack/tools/versions.env:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok and helm.
#
# Binaries land in ${EMBEDFLEET_CACHE:-$HOME/.cache/embedfleet}/bin/<key>/, outside the clone, so
# every checkout and CI run on a machine shares them. <key> names the pinned versions plus a hash of
# go.mod, go.sum, the Go toolchain and the build flags: it changes exactly when a rebuild is needed.
# A cached build is reused without invoking the compiler. Progress goes to stderr; the last line on
# stdout is the binary directory.
#
#   hack/build-tools.sh          build if needed, print the directory
#   hack/build-tools.sh --key    print the directory it would use, build nothing
set -euo pipefail

tools_dir="$(cd "$(dirname "$0")/tools" && pwd)"
# shellcheck source=tools/versions.env
. "$tools_dir/versions.env"

# shellcheck source=lib/k8s-ldflags.sh
. "$tools_dir/../lib/k8s-ldflags.sh"
# shellcheck source=lib/go-build.sh
. "$tools_dir/../lib/go-build.sh"
helm_ver="${HELM_VERSION#v}"
# The variables the upstream release builds set (kubernetes hack/lib/version.sh, helm's Makefile,
# kwok's hack/releases.sh), so /version, `kubectl version` and Helm's kubeVersion checks are real.
ldflags="$k8s_ldflags"
ldflags+=" -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=${k8s_minor}"
done
ldflags+=" -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
ldflags+=" -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION}"

# name=package.
targets=(
  "etcd=go.etcd.io/etcd/server/v3"
  "kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager"
  "kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler"
  "kubectl=k8s.io/kubernetes/cmd/kubectl"
  "kwok=sigs.k8s.io/kwok/cmd/kwok"
  "helm=helm.sh/helm/v3/cmd/helm"
)

go_version="$(go env GOVERSION GOOS GOARCH | tr '\n' ' ')"
digest="$(
  {
    cat "$tools_dir/go.mod" "$tools_dir/go.sum"
    echo "$go_version"; echo "${go_flags[*]}"; echo "$ldflags"; printf '%s\n' "${targets[@]}"
  } |
    sha256sum | cut -c1-12
)"
key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-v${helm_ver}_${digest}"
cache="${EMBEDFLEET_CACHE:-$HOME/.cache/embedfleet}"
bin_dir="$cache/bin/$key"

# KWOK's behaviour (nodes turn Ready and heartbeat, pods turn Running, deletions finish) is data:
# Stage objects. Use the ones shipped in the pinned kwok module, as kwokctl does.
kwok_stages=(
  node/fast/node-initialize.yaml
  node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml
  pod/fast/pod-complete.yaml
  pod/fast/pod-delete.yaml
)
write_kwok_stages() {
  local dir="$1" stage_root tmp f
  [[ -f "$dir/kwok-stages.yaml" ]] && return 0
  stage_root="$(cd "$tools_dir" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
  tmp="$(mktemp "$dir/.kwok-stages.XXXXXX")"
  for f in "${kwok_stages[@]}"; do
    echo "---"
    cat "$stage_root/$f"
  done >"$tmp"
  chmod 0644 "$tmp"
  mv "$tmp" "$dir/kwok-stages.yaml"
}

if [[ "${1:-}" == "--key" ]]; then
  echo "$bin_dir"
  exit 0
fi
if [[ -f "$bin_dir/.complete" ]]; then
  write_kwok_stages "$bin_dir"
  echo "$bin_dir"
  exit 0
fi

mkdir -p "$cache/bin"
# One builder at a time per cache: a second caller waits, then finds the finished build.
exec 9>"$cache/bin/.build.lock"
flock 9
if [[ -f "$bin_dir/.complete" ]]; then
  write_kwok_stages "$bin_dir"
  echo "$bin_dir"
  exit 0
fi

staging="$(mktemp -d "$cache/bin/.building.XXXXXX")"
chmod 0755 "$staging"
trap 'rm -rf "$staging"' EXIT
echo "build-tools: building $key (cold builds take tens of minutes)" >&2
cd "$tools_dir"
total_start=$SECONDS
# One `go build` for all seven: one action graph, so the packages they share compile once and a link
# (single-threaded, tens of seconds for the big ones) overlaps with compiling the next binary's
# packages instead of idling a core.
pkgs=()
for target in "${targets[@]}"; do pkgs+=("${target#*=}"); done
echo "build-tools: go build ${pkgs[*]}" >&2
mkdir "$staging/out"
go build "${go_flags[@]}" -ldflags "$ldflags" -o "$staging/out/" "${pkgs[@]}"
for target in "${targets[@]}"; do
  name="${target%%=*}"
  pkg="${target#*=}"
  # go names a binary after its package's last path element, skipping a major-version suffix.
  built="$(basename "$(sed -E 's#/v[0-9]+$##' <<<"$pkg")")"
  mv "$staging/out/$built" "$staging/$name"
done
rmdir "$staging/out"
echo "total $((SECONDS - total_start))s" | tee -a "$staging/build-times.txt" >&2
write_kwok_stages "$staging"
touch "$staging/.complete"
rm -rf "$bin_dir"
mv "$staging" "$bin_dir"
trap - EXIT
echo "$bin_dir"
