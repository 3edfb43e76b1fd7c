"""One real Kubernetes node joined to a control plane from cluster.py: containerd (CRI, runc
from Debian), kubelet and kube-proxy (nftables), with pods on a CNI bridge, all inside the node's
own network namespace and cgroup subtree, every file under one directory.

    node = start_with_cluster()          # a control plane bound where the node reaches it
    node.import_image(Path("worker.tar"))
    node.cluster.kubectl("apply", "-f", "pod.yaml")
    node.stop()                          # the node, then the control plane

Teardown (and the reclaiming of a killed run's slot) kills everything in the node's cgroups,
unmounts everything under its directory, deletes its network namespace (bridge, veths, routes,
nftables rules and ip_forward go with it) and removes its cgroups and files.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from embedfleet.testing import cgroups, mounts, nodenet, nodeslots, process
from embedfleet.testing.apiclient import ApiError
from embedfleet.testing.cluster import Cluster, ClusterConfig
from embedfleet.testing.kubeconfig import write_kubeconfig
from embedfleet.testing.nodeconfig import (
    KUBE_PROXY_HEALTHZ_PORT,
    NodePaths,
    NodeSlot,
    cni_conflist,
    containerd_config,
    import_refusal,
    kube_proxy_config,
    kubelet_config,
)
from embedfleet.testing.nodes import node_is_ready
from embedfleet.testing.nodetools import NodeToolset, ensure_node_tools, host_program
from embedfleet.testing.pki import ClientIdentity, issue_client
from embedfleet.testing.process import ProcessRecord

T = TypeVar("T")

# libcni (inside containerd) caches each attachment's result here, named after the network.
CNI_CACHE = Path("/var/lib/cni/results")
# Paths kubelet and libcni fix for every instance on a host (kubelet's device-plugin socket).
SHARED_HOST_PATHS = (Path("/var/lib/kubelet"), Path("/var/lib/cni"))
CRI_NAMESPACE = "k8s.io"
RUNTIME_CGROUP = "runtime"
"""The cgroup (below the node's) of containerd, kubelet and kube-proxy; shims inherit it."""


class NodeError(RuntimeError):
    """The node could not start, died, or left something behind."""


@dataclass(frozen=True)
class NodeConfig:
    build: bool = True
    """Build the node's binaries when no cached build exists (minutes); else fail fast."""
    outlive_caller: bool = False
    """Keep running after the starting process exits (hack/dev-cluster)."""
    start_timeout_seconds: float = 180.0
    images: tuple[str, ...] = ("testserver",)
    """Harness images (nodetools.NodeToolset.image) to import at start; pause always is."""


def stop_daemons(
    records: Sequence[ProcessRecord], children: Sequence[subprocess.Popen[bytes]] = ()
) -> None:
    # Clients of containerd first, so that neither logs errors about the other going away.
    process.stop([r for r in records if r.name != "containerd"], children)
    process.stop([r for r in records if r.name == "containerd"], children)


def undo(state: nodeslots.State, children: Sequence[subprocess.Popen[bytes]] = ()) -> None:
    """Removes everything a node made, from its slot record alone; idempotent."""
    slot = NodeSlot(int(state["index"]), str(state["run"]))
    root = Path(state["dir"])
    stop_daemons(nodeslots.records(state), children)
    problems = []
    if left := cgroups.kill_all(slot.host_name):
        problems.append(f"processes {sorted(left)} survived SIGKILL")
    if stuck := mounts.unmount_all(root):
        problems.append(f"mounts stayed: {', '.join(map(str, stuck))}")
    nodenet.teardown(slot)
    if busy := cgroups.remove(slot.host_name):
        problems.append(f"cgroups stayed: {', '.join(map(str, busy))}")
    for cached in CNI_CACHE.glob(f"{slot.host_name}-*"):
        cached.unlink(missing_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    if root.exists():
        problems.append(f"{root} could not be removed")
    if problems:
        raise NodeError(f"{slot.name}: " + "; ".join(problems))


class RealNode:
    """A running node. Make one with start_with_cluster(), or prepare() + join(cluster)."""

    def __init__(self, config: NodeConfig, tools: NodeToolset, state: nodeslots.State) -> None:
        self.config = config
        self.tools = tools
        self.state = state
        self.root = nodeslots.node_root()
        self.slot = NodeSlot(int(state["index"]), str(state["run"]))
        self.paths = NodePaths(Path(state["dir"]))
        self._cluster: Cluster | None = None
        self.owns_cluster = False
        self.processes: list[ProcessRecord] = []
        self._children: list[subprocess.Popen[bytes]] = []
        self.milestones: dict[str, float] = {}
        self._began = time.monotonic()
        self._stopped = False
        self._imported: set[tuple[Path, int, int]] = set()

    @property
    def name(self) -> str:
        """The Node object's name."""
        return self.slot.name

    @property
    def cluster(self) -> Cluster:
        """The control plane this node joined."""
        if self._cluster is None:
            raise NodeError(f"{self.name} has not joined a control plane")
        return self._cluster

    @property
    def api_address(self) -> str:
        """Where the control plane must bind (ClusterConfig.api_address) for this node."""
        return self.slot.host_ip

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    def prepare(cls, config: NodeConfig | None = None) -> RealNode:
        """Claims a slot and sets up the node's network; start the control plane next."""
        config = config or NodeConfig()
        if os.geteuid() != 0:
            raise NodeError("a real node needs root (network namespaces, cgroups, mounts)")
        tools = ensure_node_tools(build=config.build)
        state = nodeslots.claim(nodeslots.node_root(), undo, SHARED_HOST_PATHS)
        node = cls(config, tools, state)
        try:
            for directory in (node.paths.root, node.paths.pki, node.paths.cni_conf_dir):
                directory.mkdir(parents=True, exist_ok=True)
            nodenet.setup(node.slot)
            cgroups.create(f"{node.slot.host_name}/{RUNTIME_CGROUP}")
        except BaseException:
            node.stop()
            raise
        node.milestones["slot and network"] = time.monotonic() - node._began
        return node

    def join(self, cluster: Cluster) -> None:
        """Starts containerd, kubelet and kube-proxy against `cluster`; returns once the Node
        is Ready and kube-proxy has programmed its rules. On failure the node is torn down and
        NodeError carries the failing component's last log lines (kept in the cluster's logs)."""
        if cluster.layout.api_address != self.api_address:
            raise NodeError(
                f"the control plane binds {cluster.layout.api_address}; this node reaches it "
                f"only at {self.api_address} (ClusterConfig(api_address=node.api_address))"
            )
        self._cluster = cluster
        try:
            self._boot(cluster, time.monotonic() + self.config.start_timeout_seconds)
        except BaseException:
            # Keep the control plane's run dir: it holds the node's logs too.
            self.stop(keep_logs=True)
            raise

    def _boot(self, cluster: Cluster, deadline: float) -> None:
        paths, slot, tools = self.paths, self.slot, self.tools
        ca = cluster.layout.pki.ca
        kubeconfigs = {}
        for name, identity in (
            ("kubelet", ClientIdentity(f"system:node:{slot.name}", ("system:nodes",))),
            ("kube-proxy", ClientIdentity("system:kube-proxy")),
        ):
            pair = issue_client(paths.pki, name, identity, ca)
            kubeconfigs[name] = write_kubeconfig(
                paths.config(f"{name}.kubeconfig"), cluster.server, ca.cert, pair, identity.user
            )
        containerd_toml = paths.config("containerd.toml")
        containerd_toml.write_text(
            containerd_config(paths, tools.cni_dir, host_program("runc"), self._ref("pause"))
        )
        conflist = paths.cni_conf_dir / "10-embedfleet.conflist"
        conflist.write_text(json.dumps(cni_conflist(slot, paths), indent=2))
        kubelet_yaml = paths.config("kubelet.yaml")  # JSON is YAML
        kubelet_yaml.write_text(json.dumps(kubelet_config(slot, paths, ca.cert), indent=2))
        proxy_yaml = paths.config("kube-proxy.yaml")
        proxy_yaml.write_text(json.dumps(kube_proxy_config(slot, kubeconfigs["kube-proxy"])))
        self.milestones["certificates and configs"] = time.monotonic() - self._began

        containerd = self._spawn(
            "containerd", [str(tools.path("containerd")), f"--config={containerd_toml}"]
        )
        self._wait("containerd", containerd, self._containerd_up, deadline)
        for image in ("pause", *self.config.images):
            self.import_image(tools.image(image).archive)
        self.milestones["images imported"] = time.monotonic() - self._began

        kubelet = self._spawn(
            "kubelet",
            [
                str(tools.path("kubelet")),
                f"--config={kubelet_yaml}",
                f"--kubeconfig={kubeconfigs['kubelet']}",
                f"--root-dir={paths.kubelet_root}",
                f"--cert-dir={paths.kubelet_root / 'pki'}",
                f"--hostname-override={slot.name}",
                f"--node-ip={slot.node_ip}",
                "--v=1",
            ],
        )
        self._wait("Node Ready", kubelet, functools.partial(self._node_ready, cluster), deadline)
        proxy = self._spawn(
            "kube-proxy", [str(tools.path("kube-proxy")), f"--config={proxy_yaml}", "--v=1"]
        )
        self._wait("kube-proxy /healthz", proxy, self._proxy_healthy, deadline)
        self._publish_api_endpoint(cluster)

    def _publish_api_endpoint(self, cluster: Cluster) -> None:
        """Points the `kubernetes` Service at the API server's address on this node's link, so
        that pods reach it through kube-proxy (the API server runs no endpoint reconciler)."""
        port = cluster.layout.ports["apiserver"]
        cluster.api.create(
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": "kubernetes",
                    "labels": {
                        "kubernetes.io/service-name": "kubernetes",
                        "endpointslice.kubernetes.io/managed-by": "real-node.embedfleet.dev",
                    },
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [self.api_address], "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            },
        )

    def stop(self, *, keep_logs: bool = False) -> None:
        """Removes the node (and the control plane too if start_with_cluster made it)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self._cluster is not None and self.owns_cluster:
                # The API server's clients go first, and the address it binds last: its shutdown
                # waits on requests to itself through that address.
                stop_daemons(self.processes, self._children)
                self._cluster.stop(keep_run_dir=keep_logs)
        finally:
            nodeslots.release(
                self.root, self.state, functools.partial(undo, children=self._children)
            )
        if left := {
            kind: found for kind, found in leftovers(self.slot, self.paths.root).items() if found
        }:
            raise NodeError(f"{self.name} left behind: {left}")

    def __enter__(self) -> RealNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- for tests and tools -------------------------------------------------------------------

    def netns_argv(self, argv: Sequence[str]) -> list[str]:
        """argv run in the node's network namespace: "the host" as the node's pods and kube-proxy
        see it, where Service ClusterIPs work."""
        return nodenet.in_netns(self.slot, argv)

    def ctr(self, *args: str, timeout: float = 600.0) -> str:
        """Runs our ctr against this node's containerd, in the CRI (`k8s.io`) namespace."""
        argv = [str(self.tools.path("ctr")), f"--address={self.paths.containerd_socket}"]
        argv += [f"--namespace={CRI_NAMESPACE}", *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc.stdout

    def import_image(self, archive: Path, timeout: float = 600.0) -> None:
        """Imports a docker-archive or OCI tar into the node's containerd, where kubelet finds
        it (use `imagePullPolicy: Never` or `IfNotPresent`: this node pulls from nowhere).
        An archive this node already imported, unchanged since, is not imported again: every
        test module of a session shares the node, and the worker's takes most of a minute."""
        stat = archive.stat()
        seen = (archive.resolve(), stat.st_size, stat.st_mtime_ns)
        if seen in self._imported:
            return
        free = shutil.disk_usage(self.paths.root).free
        refusal = import_refusal(archive.name, stat.st_size, free, str(self.paths.root))
        if refusal is not None:
            raise NodeError(refusal)
        # Unpacked layers are all a node runs; keeping the archive's blobs too would double the
        # disk an image takes (GBs for the worker).
        self.ctr(
            "images",
            "import",
            "--local",
            "--discard-unpacked-layers",
            str(archive),
            timeout=timeout,
        )
        self._imported.add(seen)

    def images(self) -> list[str]:
        """References of the images the node's kubelet can run."""
        return self.ctr("images", "list", "--quiet").split()

    def image_ref(self, name: str) -> str:
        """The reference of a harness image: `pause` or `testserver`."""
        return self._ref(name)

    def assert_running(self) -> None:
        for record in self.processes:
            if not process.is_running(record):
                raise NodeError(process.died(record))

    def to_state(self) -> dict[str, Any]:
        """What hack/dev-cluster records to stop this node from another process."""
        return {
            "root": str(self.root),
            "index": self.slot.index,
            "run": self.slot.run,
            "dir": str(self.paths.root),
            "name": self.name,
            "processes": [record.to_json() for record in self.processes],
        }

    # -- internals -----------------------------------------------------------------------------

    def _ref(self, image: str) -> str:
        return self.tools.image(image).ref

    def _logs(self) -> Path:
        return self.cluster.layout.run_dir / "logs"

    def _spawn(self, name: str, argv: list[str]) -> ProcessRecord:
        runc_dir = host_program("runc").parent
        # containerd finds its shim on PATH, and the shim must be ours.
        path = f"{self.tools.bin_dir}:{runc_dir}:/usr/sbin:/usr/bin:/sbin:/bin"
        child, record = process.spawn(
            name,
            self.netns_argv(argv),
            self._logs() / f"{name}.log",
            env={**os.environ, "PATH": path},
            die_with_parent=not self.config.outlive_caller,
        )
        self._children.append(child)
        self.processes.append(record)
        self.state["processes"] = [r.to_json() for r in self.processes]
        nodeslots.write(self.root, self.state)
        cgroups.add_process(f"{self.slot.host_name}/{RUNTIME_CGROUP}", record.pid)
        return record

    def _wait(
        self, what: str, record: ProcessRecord, probe: Callable[[], T | None], deadline: float
    ) -> T:
        result = process.wait_while_running(
            what,
            record,
            probe,
            timeout=max(deadline - time.monotonic(), 0.0),
            transient=(OSError, ApiError, http.client.HTTPException, NodeError),
            error=NodeError,
        )
        self.milestones[what] = time.monotonic() - self._began
        return result

    def _containerd_up(self) -> bool:
        if not self.paths.containerd_socket.exists():
            return False
        self.ctr("version", timeout=10)
        return True

    def _node_ready(self, cluster: Cluster) -> bool:
        return node_is_ready(cluster.api.get(f"/api/v1/nodes/{self.name}"))

    def _proxy_healthy(self) -> bool:
        conn = http.client.HTTPConnection(self.slot.node_ip, KUBE_PROXY_HEALTHZ_PORT, timeout=2)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        finally:
            conn.close()


def start_with_cluster(
    cluster_config: ClusterConfig | None = None, node_config: NodeConfig | None = None
) -> RealNode:
    """A control plane of its own (no KWOK nodes unless asked: pods must land on the real node)
    bound to the node's link, plus the node. node.stop() stops both."""
    cluster_config = cluster_config or ClusterConfig(gpu_nodes=0, kwok=False)
    node_config = node_config or NodeConfig()
    node = RealNode.prepare(node_config)
    try:
        cluster = Cluster.start(replace(cluster_config, api_address=node.api_address))
    except BaseException:
        node.stop()
        raise
    node.owns_cluster = True
    node.join(cluster)
    return node


def leftovers(slot: NodeSlot, directory: Path) -> dict[str, list[str]]:
    """What of a node is still on the host, by kind; every list is empty once it is gone."""
    found = {
        "processes": [str(pid) for pid in sorted(cgroups.pids(slot.host_name))],
        "cgroups": [str(path) for path in cgroups.exists(slot.host_name)],
        "mounts": [str(point) for point in mounts.under(directory)],
        "network": nodenet.host_mentions(slot),
        "cni cache": [str(path) for path in CNI_CACHE.glob(f"{slot.host_name}-*")],
        "files": [str(directory)] if directory.exists() else [],
    }
    if nodenet.netns_path(slot).exists():
        found["network"].append(str(nodenet.netns_path(slot)))
    return found


def stop_recorded(state: dict[str, Any]) -> None:
    """Stops a node from its to_state() record, from any process."""
    root = Path(state["root"])
    slot_state = nodeslots.read(root, int(state["index"]))
    if slot_state is not None:
        nodeslots.release(root, slot_state, undo)
