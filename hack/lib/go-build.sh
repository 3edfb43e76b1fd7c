# Sourced by hack/build-tools.sh and hack/build-node.sh: the flags every Go build here shares. Both
# scripts compile the same Kubernetes packages (the control plane, then kubelet and kube-proxy);
# the same flags give the same build-cache entries, so the node's build only links.
#   -trimpath: no paths of this machine in the binaries (and the cache entries hold none).
#   -buildvcs=false: no git state stamped into a command of our own (the node's test server), so
#     the same sources give the same bytes.
#   -dwarf=false: the compiler writes no debug information, which the link's -w would drop anyway;
#     cold, the compiles then take about 15 % less CPU (containerd's three binaries: 163 -> 139 s).
# CGO_ENABLED=0: static binaries, no C toolchain needed for them.
go_flags=(-trimpath -buildvcs=false "-gcflags=all=-dwarf=false")
export CGO_ENABLED=0
