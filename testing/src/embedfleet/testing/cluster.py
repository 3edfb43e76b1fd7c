"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and KWOK with fake GPU nodes, each a child process with its own temp files.

    with Cluster.start() as cluster:
        cluster.kubectl("apply", "-f", "deploy.yaml")
"""

from __future__ import annotations

import functools
import http.client
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from embedfleet.common.net import free_ports
from embedfleet.testing import components, fence, process
from embedfleet.testing.apiclient import ApiClient, ApiError
from embedfleet.testing.components import Layout
from embedfleet.testing.kubeconfig import write_kubeconfig
from embedfleet.testing.nodes import NodeShape, fake_gpu_node, node_is_ready
from embedfleet.testing.pki import create_pki
from embedfleet.testing.polling import WaitTimeoutError, wait_for
from embedfleet.testing.process import ProcessRecord
from embedfleet.testing.tools import Toolset, ensure_tools

T = TypeVar("T")


class ClusterError(RuntimeError):
    """The cluster failed to start, or a component died."""


class CommandError(RuntimeError):
    """kubectl or helm failed; stderr holds its message."""

    def __init__(self, args: Sequence[str], proc: subprocess.CompletedProcess[str]) -> None:
        command = " ".join(args)
        super().__init__(f"{command} exited {proc.returncode}: {proc.stderr.strip()}")
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr


@dataclass(frozen=True)
class ClusterConfig:
    gpu_nodes: int = 3
    """KWOK nodes to create, named kwok-gpu-0, kwok-gpu-1, ..."""
    node_shape: NodeShape = field(default_factory=NodeShape)
    controller_manager: bool = True
    scheduler: bool = True
    kwok: bool = True
    build: bool = True
    """Build the binaries when no cached build exists (tens of minutes); else fail fast."""
    start_timeout_seconds: float = 120.0
    outlive_caller: bool = False
    """Keep running after the starting process exits (hack/dev-cluster). By default the
    components die with the thread that started them, even when it is killed."""
    run_dir: Path | None = None
    """Certs, kubeconfigs, etcd data and logs; default: a fresh temp dir, removed on stop."""
    api_address: str = components.LOCALHOST
    """The API server's bind and advertise address (see components.Layout.api_address)."""
    client_rate: components.ClientRate | None = None
    """The controller-manager's and the scheduler's limit on their API requests; None keeps
    their defaults, which tests' few pods never reach. A scale run (bench.operator_scale) raises
    it so that pod creation and binding keep up with the API server (components.ClientRate)."""
    controller_syncs: int | None = None
    """Deployments and ReplicaSets the controller-manager syncs at once (each; None: its default,
    5). A scale run raises it with client_rate (components.controller_manager_argv)."""


class Cluster:
    """A running control plane. Make one with Cluster.start(); stop it with stop() or `with`."""

    def __init__(
        self, config: ClusterConfig, tools: Toolset, layout: Layout, owns_run_dir: bool
    ) -> None:
        self.config = config
        self.tools = tools
        self.layout = layout
        self.owns_run_dir = owns_run_dir
        self.processes: list[ProcessRecord] = []
        self._children: list[subprocess.Popen[bytes]] = []
        self.api = ApiClient(layout.server, layout.pki.ca.cert, layout.pki.clients["admin"])
        self.startup_seconds = 0.0
        """Seconds from start() to ready, excluding any build of the binaries."""
        self.milestones: dict[str, float] = {}
        """Seconds from start() (after the binaries) until each readiness check passed."""
        self._began = time.monotonic()
        self._stopped = False
        self._fence: Path | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    def start(cls, config: ClusterConfig | None = None) -> Cluster:
        config = config or ClusterConfig()
        tools = ensure_tools(build=config.build)
        began = time.monotonic()
        owns_run_dir = config.run_dir is None
        run_dir = config.run_dir or Path(tempfile.mkdtemp(prefix="embedfleet-k8s-"))
        try:
            layout = _prepare(run_dir, config.api_address)
        except BaseException:
            if owns_run_dir:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        cluster = cls(config, tools, layout, owns_run_dir)
        cluster._began = began
        cluster.milestones["certificates and kubeconfigs"] = time.monotonic() - began
        try:
            cluster._boot(deadline=began + config.start_timeout_seconds)
        except BaseException:
            # Keep the run dir: its logs explain the failure.
            cluster.stop(keep_run_dir=True)
            raise
        cluster.startup_seconds = time.monotonic() - began
        return cluster

    def _boot(self, deadline: float) -> None:
        layout, tools, config = self.layout, self.tools, self.config
        etcd = self._spawn("etcd", components.etcd_argv(tools, layout))
        self._wait(
            "etcd /health", etcd, lambda: _http_ok(layout.ports["etcd_client"], "/health"), deadline
        )
        apiserver = self._spawn("kube-apiserver", components.apiserver_argv(tools, layout))
        # Before any pod or Service gets an address that leads nowhere on this machine.
        self._fence = fence.hold(apiserver)
        self._wait("kube-apiserver /readyz", apiserver, self._api_ready, deadline)

        # The rest only needs the API; start them together.
        started: list[tuple[ProcessRecord, str]] = []
        if config.controller_manager:
            argv = components.controller_manager_argv(
                tools, layout, config.client_rate, config.controller_syncs
            )
            started.append((self._spawn("kube-controller-manager", argv), "controller_manager"))
        if config.scheduler:
            argv = components.scheduler_argv(tools, layout, config.client_rate)
            started.append((self._spawn("kube-scheduler", argv), "scheduler"))
        if config.kwok:
            kwok = self._spawn("kwok", components.kwok_argv(tools, layout))
            self._create_nodes()
        for record, port in started:
            self._wait(
                f"{record.name} /healthz",
                record,
                functools.partial(_https_ok, layout.ports[port], "/healthz"),
                deadline,
            )
        if config.kwok:
            self._wait("KWOK nodes Ready", kwok, self._nodes_ready, deadline)
        if config.controller_manager:
            # Pods are only admitted once their namespace's `default` ServiceAccount exists.
            self.wait_for_default_service_account("default", deadline - time.monotonic())
            self.milestones["ServiceAccount default/default"] = time.monotonic() - self._began

    def stop(self, *, keep_run_dir: bool = False) -> None:
        """Stops exactly the processes this cluster started; removes its temp dir. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        # Clients first, then the API server, then its store: nothing logs errors about the others.
        by_name = {record.name: record for record in self.processes}
        etcd = [by_name["etcd"]] if "etcd" in by_name else []
        others = [record for record in reversed(self.processes) if record.name != "etcd"]
        left = process.stop(others, self._children) + process.stop(etcd, self._children)
        if left:
            names = ", ".join(f"{r.name} (pid {r.pid})" for r in left)
            raise ClusterError(f"could not stop {names}")
        if self._fence is not None:
            fence.release(self._fence)
        if self.owns_run_dir and not keep_run_dir:
            shutil.rmtree(self.layout.run_dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- for tests and tools -------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """The admin (system:masters) kubeconfig."""
        return self.layout.kubeconfigs["admin"]

    @property
    def server(self) -> str:
        return self.layout.server

    def env(self) -> dict[str, str]:
        """Environment variables pointing kubectl, helm and client libraries at this cluster."""
        path = os.environ.get("PATH", "")
        return {"KUBECONFIG": str(self.kubeconfig), "PATH": f"{self.tools.bin_dir}:{path}"}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Runs our kubectl against this cluster; raises CommandError on failure if `check`."""
        return self._run("kubectl", args, input, check, timeout)

    def helm(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Runs our helm against this cluster; raises CommandError on failure if `check`."""
        return self._run("helm", args, input, check, timeout)

    def remove_release(self, release: str, namespace: str, fleets_namespace: str) -> None:
        """Undoes a test's `helm install`: its EmbeddingDeployments first (the operator still runs
        their finalizers), then every pod they made, then the release. A session's node is shared
        by test modules; the next one's install must find it as the first one did."""
        self.kubectl(
            "delete", "embeddingdeployments", "--all", "-n", fleets_namespace,
            "--wait=true", "--timeout=180s", timeout=200,
        )  # fmt: skip

        def no_pods() -> bool:
            return not self.api.get(f"/api/v1/namespaces/{fleets_namespace}/pods")["items"]

        wait_for(f"every pod in {fleets_namespace} gone", no_pods, timeout=180, interval=0.5)
        # A test may have uninstalled it itself (the user path's last test does).
        self.helm("uninstall", release, "--namespace", namespace, "--ignore-not-found", "--wait",
                  "--timeout", "120s", timeout=140)  # fmt: skip

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """Creates a namespace and returns once pods can be created in it."""
        meta: dict[str, Any] = {"name": name}
        if labels:
            meta["labels"] = dict(labels)
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}
        self.api.create("/api/v1/namespaces", namespace)
        if self.config.controller_manager:
            self.wait_for_default_service_account(name, self.config.start_timeout_seconds)

    def delete_namespace(self, name: str) -> None:
        """Starts deleting a namespace (the namespace controller finishes it asynchronously)."""
        try:
            self.api.delete(f"/api/v1/namespaces/{name}")
        except ApiError as err:
            if err.status != 404:
                raise

    def wait_established(self, crd: str, timeout: float = 60.0) -> None:
        """Returns once the CustomResourceDefinition `crd` (its name) serves its kind. Not `kubectl
        wait --for=condition=Established`: a CRD just created has `conditions: null` until the API
        server's controller writes them, and kubectl fails on that at once instead of waiting."""
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"

        def established() -> bool:
            conditions = (self.api.get(path).get("status") or {}).get("conditions") or ()
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(f"CustomResourceDefinition {crd} Established", established, timeout=timeout)

    def wait_for_default_service_account(self, namespace: str, timeout: float) -> None:
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/default"
        wait_for(f"ServiceAccount {namespace}/default", lambda: self._exists(path), timeout=timeout)

    def assert_running(self) -> None:
        """Raises ClusterError naming any component that has exited."""
        for record in self.processes:
            if not process.is_running(record):
                raise ClusterError(_died(record))

    def to_state(self) -> dict[str, Any]:
        """What hack/dev-cluster records to find and stop this cluster from another process."""
        return {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "bin_dir": str(self.tools.bin_dir),
            "run_dir": str(self.layout.run_dir),
            "owns_run_dir": self.owns_run_dir,
            "startup_seconds": round(self.startup_seconds, 2),
            "milestones": {what: round(seconds, 2) for what, seconds in self.milestones.items()},
            "processes": [record.to_json() for record in self.processes],
            "fence": str(self._fence) if self._fence else None,
        }

    # -- internals -----------------------------------------------------------------------------

    def _run(
        self, tool: str, args: Sequence[str], input: str | None, check: bool, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.tools.path(tool)), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **self.env()},
        )
        if check and proc.returncode != 0:
            raise CommandError((tool, *args), proc)
        return proc

    def _spawn(self, name: str, argv: list[str]) -> ProcessRecord:
        log = self.layout.run_dir / "logs" / f"{name}.log"
        child, record = process.spawn(
            name, argv, log, die_with_parent=not self.config.outlive_caller
        )
        self._children.append(child)
        self.processes.append(record)
        return record

    def _wait(
        self, what: str, record: ProcessRecord, probe: Callable[[], T | None], deadline: float
    ) -> T:
        def checked() -> T | None:
            if not process.is_running(record):
                raise ClusterError(_died(record))
            try:
                return probe()
            except (OSError, ApiError, http.client.HTTPException):
                return None

        try:
            result = wait_for(what, checked, timeout=max(deadline - time.monotonic(), 0.0))
        except WaitTimeoutError as err:
            tail = process.log_tail(record.log)
            raise ClusterError(f"{err}; last lines of {record.log}:\n{tail}") from err
        self.milestones[what] = time.monotonic() - self._began
        return result

    def _api_ready(self) -> bool:
        status, _ = self.api.request("GET", "/readyz")
        return status == 200

    def _exists(self, path: str) -> bool:
        status, _ = self.api.request("GET", path)
        return status == 200

    def _create_nodes(self) -> None:
        version = self.api.get("/version")["gitVersion"]
        for i in range(self.config.gpu_nodes):
            node = fake_gpu_node(f"kwok-gpu-{i}", self.config.node_shape, version)
            self.api.create("/api/v1/nodes", node)

    def _nodes_ready(self) -> bool:
        nodes = self.api.get("/api/v1/nodes?labelSelector=type%3Dkwok")["items"]
        ready = [node for node in nodes if node_is_ready(node)]
        return len(ready) >= self.config.gpu_nodes


def _prepare(run_dir: Path, api_address: str) -> Layout:
    """Picks ports and writes certificates and kubeconfigs for a new cluster in run_dir."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    names = components.PORT_NAMES
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    pki = create_pki(
        run_dir / "pki",
        server_names=components.API_SERVER_NAMES,
        server_ips=tuple(dict.fromkeys((components.LOCALHOST, api_address, components.SERVICE_IP))),
        clients=components.CLIENTS,
    )
    server = f"https://{api_address}:{ports['apiserver']}"
    kubeconfigs = {
        name: write_kubeconfig(
            run_dir / f"{name}.kubeconfig", server, pki.ca.cert, pki.clients[name], who.user
        )
        for name, who in components.CLIENTS.items()
    }
    return Layout(run_dir, ports, pki, kubeconfigs, api_address)


def stop_recorded(state: Mapping[str, Any], grace_seconds: float = 10.0) -> list[ProcessRecord]:
    """Stops the processes in a to_state() record, from any process; returns any left running."""
    records = [ProcessRecord.from_json(item) for item in state["processes"]]
    etcd = [record for record in records if record.name == "etcd"]
    others = [record for record in reversed(records) if record.name != "etcd"]
    left = process.stop(others, grace_seconds=grace_seconds)
    left += process.stop(etcd, grace_seconds=grace_seconds)
    if not left and state.get("fence"):
        fence.release(Path(state["fence"]))
    if not left and state.get("owns_run_dir"):
        shutil.rmtree(state["run_dir"], ignore_errors=True)
    return left


def _died(record: ProcessRecord) -> str:
    return f"{record.name} exited; last lines of {record.log}:\n{process.log_tail(record.log)}"


def _http_ok(port: int, path: str) -> bool:
    conn = http.client.HTTPConnection(components.LOCALHOST, port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    finally:
        conn.close()


def _https_ok(port: int, path: str) -> bool:
    # These components serve a self-signed certificate; this only asks whether they are up.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    conn = http.client.HTTPSConnection(components.LOCALHOST, port, timeout=2, context=context)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    finally:
        conn.close()
