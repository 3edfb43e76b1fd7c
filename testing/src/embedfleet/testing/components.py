"""Command lines of the control-plane components: pure functions of a cluster's layout.

Every listener binds 127.0.0.1 on a port picked for this cluster, so several clusters (other
engineers, parallel CI jobs) coexist on one machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from embedfleet.testing.nodes import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE
from embedfleet.testing.pki import ClientIdentity, ClusterPki
from embedfleet.testing.tools import Toolset

LOCALHOST = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service: first address of SERVICE_CIDR
POD_CIDR = "10.244.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
API_SERVER_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)

# Client identities, keyed by the name of the kubeconfig/cert files. The scheduler uses its
# built-in RBAC user, as kubeadm sets it up. The controller manager runs every controller under
# its own identity, hence cluster-admin: kubeadm's one service account per controller
# (--use-service-account-credentials) costs ~5 s of start-up in token requests and changes
# nothing the operator's tests can observe. KWOK stands in for every kubelet (node and pod
# status, leases, final pod deletion), hence cluster-admin too.
CLIENTS: Mapping[str, ClientIdentity] = {
    "admin": ClientIdentity("embedfleet-admin", ("system:masters",)),
    "kube-controller-manager": ClientIdentity(
        "system:kube-controller-manager", ("system:masters",)
    ),
    "kube-scheduler": ClientIdentity("system:kube-scheduler"),
    "kwok": ClientIdentity("kwok-controller", ("system:masters",)),
    # The API server's identity towards real kubelets (logs, exec, port-forward), which ask it
    # back whether this user may (webhook authorization), as kubeadm sets it up.
    "kube-apiserver-kubelet-client": ClientIdentity(
        "kube-apiserver-kubelet-client", ("system:masters",)
    ),
}

PORT_NAMES = ("etcd_client", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok")


@dataclass(frozen=True)
class ClientRate:
    """A Go component's own limit on its requests to the API server (client-go's token bucket,
    `--kube-api-qps` / `--kube-api-burst`).

    The defaults (controller-manager 20/s, burst 30; scheduler 50/s, burst 100) suit a test's
    handful of pods. A scale run needs more: at 20/s the ReplicaSet controller alone takes five
    minutes to create 6,000 pods, however fast the API server answers, so that run measured the
    controller-manager's throttle instead of the operator or the control plane."""

    qps: float
    burst: int

    def __post_init__(self) -> None:
        if self.qps <= 0 or self.burst < 1:
            raise ValueError(f"client rate needs qps > 0 and burst >= 1, got {self}")

    def flags(self) -> list[str]:
        return [f"--kube-api-qps={self.qps:g}", f"--kube-api-burst={self.burst}"]


@dataclass(frozen=True)
class Layout:
    """Where one cluster's files live and which ports it listens on."""

    run_dir: Path
    ports: Mapping[str, int]
    pki: ClusterPki
    kubeconfigs: Mapping[str, Path]
    api_address: str = LOCALHOST
    """Where the API server binds and what it advertises: 127.0.0.1, or the host end of a real
    node's link (nodeconfig.NodeSlot.host_ip) so that the node and its pods reach it."""

    @property
    def etcd_url(self) -> str:
        return f"http://{LOCALHOST}:{self.ports['etcd_client']}"

    @property
    def server(self) -> str:
        return f"https://{self.api_address}:{self.ports['apiserver']}"


def etcd_argv(tools: Toolset, layout: Layout) -> list[str]:
    peer = f"http://{LOCALHOST}:{layout.ports['etcd_peer']}"
    return [
        str(tools.path("etcd")),
        "--name=embedfleet",
        f"--data-dir={layout.run_dir / 'etcd'}",
        f"--listen-client-urls={layout.etcd_url}",
        f"--advertise-client-urls={layout.etcd_url}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=embedfleet={peer}",
        # A throwaway store: durability buys nothing and fsync is slow on shared disks.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver_argv(tools: Toolset, layout: Layout) -> list[str]:
    pki = layout.pki
    kubelet_client = pki.clients.get("kube-apiserver-kubelet-client")
    kubelet_flags = (
        [
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
        ]
        if kubelet_client
        else []
    )
    return [
        str(tools.path("kube-apiserver")),
        f"--advertise-address={layout.api_address}",
        f"--bind-address={layout.api_address}",
        f"--secure-port={layout.ports['apiserver']}",
        f"--etcd-servers={layout.etcd_url}",
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca.cert}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.service_account_pub}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # The `kubernetes` Service's endpoints may not be loopback, and the lease reconciler
        # stalls the API server's shutdown; a real node writes the endpoint it reaches instead.
        "--endpoint-reconciler-type=none",
        *kubelet_flags,
        # Node names need not resolve: reach kubelets at the address they report.
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        # Real kubelets authenticate as system:node:<name>; the Node authorizer and
        # NodeRestriction confine each to its own node and pods, as in a production cluster.
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        "--profiling=false",
    ]


def _serving_flags(layout: Layout, port: str, kubeconfig: Path) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={LOCALHOST}",
        f"--secure-port={layout.ports[port]}",
        "--leader-elect=false",
        "--profiling=false",
    ]


def _rate_flags(rate: ClientRate | None) -> list[str]:
    return rate.flags() if rate is not None else []


def controller_manager_argv(
    tools: Toolset, layout: Layout, rate: ClientRate | None = None, syncs: int | None = None
) -> list[str]:
    """`rate`: the client limit of every controller in it; `syncs`: how many Deployments and
    how many ReplicaSets their controllers sync at once. None keeps each default (5 syncs: at
    N=1,000 fleets the Deployment controller, its syncs waiting on a loaded API server, made
    under 2 ReplicaSets a second, once the client limit no longer bounded it)."""
    pki = layout.pki
    kubeconfig = layout.kubeconfigs["kube-controller-manager"]
    return [
        str(tools.path("kube-controller-manager")),
        *_serving_flags(layout, "controller_manager", kubeconfig),
        f"--root-ca-file={pki.ca.cert}",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        *_rate_flags(rate),
        *(
            [f"--concurrent-deployment-syncs={syncs}", f"--concurrent-replicaset-syncs={syncs}"]
            if syncs is not None
            else []
        ),
    ]


def scheduler_argv(tools: Toolset, layout: Layout, rate: ClientRate | None = None) -> list[str]:
    """`rate`: the scheduler's client limit (its bindings); None keeps its default. The flags
    are deprecated in favour of a --config file, which this harness does not use."""
    kubeconfig = layout.kubeconfigs["kube-scheduler"]
    return [
        str(tools.path("kube-scheduler")),
        *_serving_flags(layout, "scheduler", kubeconfig),
        *_rate_flags(rate),
    ]


def kwok_argv(tools: Toolset, layout: Layout) -> list[str]:
    return [
        str(tools.path("kwok")),
        f"--kubeconfig={layout.kubeconfigs['kwok']}",
        f"--config={tools.kwok_stages}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}",
        f"--cidr={POD_CIDR}",
        "--node-lease-duration-seconds=40",
        f"--server-address={LOCALHOST}:{layout.ports['kwok']}",
    ]
