"""Configuration files of one real node: pure functions of where it lives and how it connects.

The facts they encode, measured on the 2-core Debian VM (hybrid cgroup v1, no systemd, root
without CAP_SYS_RESOURCE), are spelled out where each knob is set.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE_CIDR = "10.96.0.0/16"  # the control plane's (components.SERVICE_CIDR)
LINK_SUPERNET = ipaddress.ip_network("10.211.0.0/16")
POD_SUPERNET = ipaddress.ip_network("10.212.0.0/16")
MAX_SLOTS = 32
BRIDGE = "efbr0"
UPLINK = "uplink"
KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248
KUBE_PROXY_HEALTHZ_PORT = 10256


@dataclass(frozen=True)
class NodeSlot:
    """One of MAX_SLOTS concurrent real nodes on this machine; every host-visible name and
    address derives from its index and its run, so a later run finds what a killed one left
    behind, and never mistakes what another run in the same slot made for its own.

    The node runs in its own network namespace, joined to the host by one veth pair (a /30):
    the API server listens on the host end, kubelet and kube-proxy on the node end. Pods sit on
    a bridge inside that namespace, so kube-proxy's rules, the bridge and ip_forward live there
    and vanish with it; the host keeps ip_forward=0 and gains only the veth and one route.
    """

    index: int
    run: str
    """Six hex digits naming one claim of the slot."""

    def __post_init__(self) -> None:
        if not 0 <= self.index < MAX_SLOTS:
            raise ValueError(f"slot {self.index} outside 0..{MAX_SLOTS - 1}")
        if not re.fullmatch(r"[0-9a-f]{6}", self.run):
            raise ValueError(f"run {self.run!r} is not six hex digits")

    @property
    def name(self) -> str:
        """The Node object's name (also kubelet's and kube-proxy's hostname)."""
        return f"embedfleet-node-{self.index}"

    @property
    def host_name(self) -> str:
        """The network namespace, cgroup and CNI network of this run."""
        return f"embedfleet-{self.index}-{self.run}"

    @property
    def host_veth(self) -> str:
        return f"ef{self.run}n{self.index}"  # at most 15 characters (IFNAMSIZ)

    def _link(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network((int(LINK_SUPERNET.network_address) + 256 * self.index, 30))

    @property
    def host_ip(self) -> str:
        """The host end of the veth: where the API server binds."""
        return str(self._link().network_address + 1)

    @property
    def node_ip(self) -> str:
        """The node end: the Node's InternalIP, where kubelet and kube-proxy listen."""
        return str(self._link().network_address + 2)

    @property
    def link_cidr(self) -> str:
        return str(self._link())

    @property
    def pod_cidr(self) -> str:
        return str(
            ipaddress.IPv4Network((int(POD_SUPERNET.network_address) + 256 * self.index, 24))
        )

    @property
    def pod_gateway(self) -> str:
        """The bridge's own address: pods route the Service range and the host through it."""
        return str(ipaddress.ip_network(self.pod_cidr).network_address + 1)


@dataclass(frozen=True)
class NodePaths:
    """Everything of one node under one directory (removed on teardown)."""

    root: Path

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_state(self) -> Path:
        return self.root / "run"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def shim_sockets(self) -> Path:
        return self.root / "s"

    @property
    def runc_root(self) -> Path:
        return self.root / "runc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    def config(self, name: str) -> Path:
        return self.root / name


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def containerd_config(paths: NodePaths, cni_bin_dir: Path, runc: Path, pause_image: str) -> str:
    """containerd v2 (config version 3) with the CRI plugin, every path under paths.root."""
    q = _toml_string
    return f"""version = 3
root = {q(str(paths.containerd_root))}
state = {q(str(paths.containerd_state))}
# Plugins that would reach outside the node's directory or need absent tools.
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = {q(str(paths.containerd_socket))}

[ttrpc]
  address = {q(str(paths.containerd_socket) + ".ttrpc")}

[metrics]
  address = ""

[plugins.'io.containerd.internal.v1.opt']
  path = {q(str(paths.root / "opt"))}

[plugins.'io.containerd.shim.v1.manager']
  socket_dir = {q(str(paths.shim_sockets))}

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {q(pause_image)}

[plugins.'io.containerd.cri.v1.runtime']
  # Root here lacks CAP_SYS_RESOURCE, so runc cannot lower a process's oom_score_adj; without
  # this the pause container fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  tolerate_missing_hugetlb_controller = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = {q(str(runc))}
        Root = {q(str(paths.runc_root))}
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [{q(str(cni_bin_dir))}]
    conf_dir = {q(str(paths.cni_conf_dir))}
    max_conf_num = 1
    # containerd raises lo itself: libcni would cache a result per pod outside our directory.
    use_internal_loopback = true
"""


def cni_conflist(slot: NodeSlot, paths: NodePaths) -> dict[str, Any]:
    """A bridge network on the harness's bridge. isGateway false: the bridge plugin would switch
    on ip_forward itself; the harness gives the bridge its address instead. No masquerading and
    no default route: pods reach the Service range and the host's end of the link, nothing else.
    """
    return {
        "cniVersion": "1.0.0",
        "name": slot.host_name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": False,
                "ipMasq": False,
                # A pod reaching itself through a Service comes back in on its own port.
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(paths.cni_ipam_dir),
                    "ranges": [[{"subnet": slot.pod_cidr, "gateway": slot.pod_gateway}]],
                    "routes": [
                        {"dst": SERVICE_CIDR, "gw": slot.pod_gateway},
                        {"dst": slot.link_cidr, "gw": slot.pod_gateway},
                    ],
                },
            }
        ],
    }


def kubelet_config(slot: NodeSlot, paths: NodePaths, ca_cert: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This VM has hybrid cgroup v1 and no systemd.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{slot.host_name}",
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "address": slot.node_ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": slot.node_ip,
        "healthzPort": KUBELET_HEALTHZ_PORT,
        # The API server authenticates with its kubelet client certificate; kubelet asks it
        # (SubjectAccessReview) whether that user may use this API.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local",
        # No cluster DNS runs; "" keeps the host's resolvers out of pods.
        "resolvConf": "",
        "makeIPTablesUtilChains": False,
        # Lowering oom_score_adj needs CAP_SYS_RESOURCE, which root lacks here.
        "oomScoreAdj": 0,
        "failSwapOn": False,
        "podLogsDir": str(paths.pod_logs),
        "volumePluginDir": str(paths.root / "volume-plugins"),
        # The disk is shared: never evict or garbage-collect the images tests imported.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # The host's disk is shared with other builds that fill and free GBs in seconds: a 1%
        # threshold (2.5 GB here) tainted the node DiskPressure for minutes, leaving pods
        # unschedulable or evicted. Evict only when writes are about to fail anyway, and lift the
        # taint soon after (the default transition period is 5 minutes).
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "100Mi",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "100Mi",
        },
        "evictionPressureTransitionPeriod": "10s",
        "podCIDR": slot.pod_cidr,
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
    }


def kube_proxy_config(slot: NodeSlot, kubeconfig: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": slot.name,
        "bindAddress": slot.node_ip,
        "healthzBindAddress": f"{slot.node_ip}:{KUBE_PROXY_HEALTHZ_PORT}",
        "metricsBindAddress": "127.0.0.1:10249",
        "clusterCIDR": slot.pod_cidr,
        "nodePortAddresses": [f"{slot.node_ip}/32"],
        "oomScoreAdj": 0,
        # nf_conntrack_max is global, read-only outside the initial network namespace: leave
        # every conntrack setting as the kernel has it.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def import_room(archive_bytes: int) -> int:
    """Bytes free a node's disk needs to import an image archive of this size: `ctr import`
    writes the archive's blobs into the content store, then unpacks them into snapshots (about
    as large: the archives' layers are uncompressed), and only then discards the blobs; plus a
    GiB for containerd's metadata and the pods' own writes."""
    return 2 * archive_bytes + (1 << 30)


def import_refusal(archive: str, archive_bytes: int, free: int, where: str) -> str | None:
    """Why an import of `archive` would fill the disk under `where` partway (a full disk leaves
    the node's containerd unable to write even its metadata), or None when it fits."""
    needed = import_room(archive_bytes)
    if free >= needed:
        return None
    return (
        f"importing {archive} ({archive_bytes / 1e9:.1f} GB) needs about {needed / 1e9:.1f} GB "
        f"free under {where}; {free / 1e9:.1f} GB are (free the disk: old clones, .venvs, "
        "~/.cache/embedfleet/images)"
    )
