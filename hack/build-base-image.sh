#!/usr/bin/env bash
# Makes the local base image: Debian SUITE by `debootstrap --variant=minbase` plus PACKAGES (comma
# separated) as a rootfs tarball ROOTFS_TAR (reused when it exists), imported into buildah's storage
# as IMAGE. embedfleet.testing.images calls it with a content key in both names, so unchanged inputs
# never rebuild. By hand:
#   hack/build-base-image.sh bookworm python3,python3-venv /tmp/rootfs.tar localhost/embedfleet/base:x
set -euo pipefail

[[ $# -eq 4 ]] || { echo "usage: $0 SUITE PACKAGES ROOTFS_TAR IMAGE" >&2; exit 2; }
suite=$1 packages=$2 rootfs_tar=$3 image=$4
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

for tool in debootstrap buildah; do
  command -v "$tool" >/dev/null || {
    echo "build-base-image: $tool not found (apt-get install debootstrap buildah runc)" >&2
    exit 1
  }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/embedfleet-base.XXXXXX")
ctr=""
cleanup() {
  [[ -z $ctr ]] || buildah rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

if [[ ! -f $rootfs_tar ]]; then
  mkdir -p "$(dirname "$rootfs_tar")"
  debootstrap --variant=minbase --include="$packages" "$suite" "$work/root" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -40 "$work/debootstrap.log" >&2; exit 1; }
  # What no container needs at run time: apt's lists and caches, docs, man pages, logs.
  rm -rf "$work"/root/var/lib/apt/lists/* "$work"/root/var/cache/apt/* \
    "$work"/root/var/cache/debconf/*-old "$work"/root/var/log/* \
    "$work"/root/usr/share/doc/* "$work"/root/usr/share/man/* "$work"/root/usr/share/info/*
  # Fixed order, owners and times: the same packages give the same tarball.
  tar --numeric-owner --sort=name --mtime='2000-01-01 00:00Z' -C "$work/root" \
    -cf "$rootfs_tar.partial" .
  mv "$rootfs_tar.partial" "$rootfs_tar"
fi

ctr=$(buildah from scratch)
buildah add --quiet "$ctr" "$rootfs_tar" / >/dev/null
buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env LANG=C.UTF-8 --cmd /bin/sh "$ctr"
buildah commit --quiet --rm "$ctr" "$image" >/dev/null
ctr=""
echo "$image"
