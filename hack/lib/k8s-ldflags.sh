# Sourced by the build scripts: sets k8s_minor and k8s_ldflags, the link flags the upstream
# Kubernetes release build sets (kubernetes hack/lib/version.sh), so /version, `kubectl version`
# and each node's kubeletVersion report $K8S_VERSION. Needs K8S_VERSION (hack/tools/versions.env).
k8s_minor="${K8S_VERSION#v1.}"
k8s_minor="${k8s_minor%%.*}"
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=${K8S_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${k8s_minor}"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean"
done
