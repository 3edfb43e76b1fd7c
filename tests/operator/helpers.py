"""Helpers of the operator tests: the repository's CRD and examples, the operator as a real process
(`embedfleet-operator`), kubectl reads of what it made, and a proxy that slows the API server."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from embedfleet.common.net import free_ports
from embedfleet.testing.cluster import Cluster
from embedfleet.testing.polling import wait_for

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "embedfleet.dev_embeddingdeployments.yaml"
EXAMPLES = REPO / "examples"
GATEWAY_SETTINGS = REPO / "gateway" / "contract" / "settings.md"


def gateway_settings() -> set[str]:
    """The gateway binary's settings by name (max_input_tokens, ...): its contract's table, which
    tests/gateway/test_docs.py holds to the binary's --help."""
    text = GATEWAY_SETTINGS.read_text()
    return {flag.replace("-", "_") for flag in re.findall(r"^\| `--([a-z][a-z0-9-]+)`", text, re.M)}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def crd_schema() -> dict[str, Any]:
    crd = load_yaml(CRD_PATH)
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


MINILM_CHILDREN = {
    "ConfigMap/minilm-config",
    "Deployment/minilm-gateway",
    "Deployment/minilm-worker",
    "PodDisruptionBudget/minilm-gateway",
    "PodDisruptionBudget/minilm-worker",
    "Role/minilm-gateway",
    "RoleBinding/minilm-gateway",
    "Service/minilm",
    "Service/minilm-worker",
    "ServiceAccount/minilm-gateway",
}
"""Children of an EmbeddingDeployment named minilm (no ServiceMonitor)."""

OPERATOR_NAMESPACE = "embedfleet-system"
RBAC = REPO / "operator" / "deploy" / "rbac.yaml"
COMMAND = Path(sys.executable).parent / "embedfleet-operator"


@dataclass
class OperatorProcess:
    cluster: Cluster
    kubeconfig: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    lease_name: str = "embedfleet-operator"

    def env(self) -> dict[str, str]:
        metrics, health = free_ports(2)
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "EMBEDFLEET_OPERATOR_RESYNC_SECONDS": "10",
            "EMBEDFLEET_OPERATOR_LEASE_SECONDS": "3",
            "EMBEDFLEET_OPERATOR_LEASE_NAMESPACE": OPERATOR_NAMESPACE,
            "EMBEDFLEET_OPERATOR_LEASE_NAME": self.lease_name,
            "EMBEDFLEET_OPERATOR_IDENTITY": f"test-operator-{self.starts}",
            "EMBEDFLEET_OPERATOR_METRICS_PORT": str(metrics),
            "EMBEDFLEET_OPERATOR_HEALTH_PORT": str(health),
            "EMBEDFLEET_OPERATOR_WORKER_IMAGE": "example.invalid/worker:test",
            "EMBEDFLEET_OPERATOR_GATEWAY_IMAGE": "example.invalid/gateway:test",
            **self.extra_env,
        }

    def start(self, *, wait: bool = True) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        env = self.env()
        self.metrics_port = int(env["EMBEDFLEET_OPERATOR_METRICS_PORT"])
        self.health_port = int(env["EMBEDFLEET_OPERATOR_HEALTH_PORT"])
        with self.log.open("ab") as log:
            log.write(f"--- start {self.starts}\n".encode())
            self.proc = subprocess.Popen(
                [str(COMMAND)], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.identity = env["EMBEDFLEET_OPERATOR_IDENTITY"]
        if wait:
            self.wait_leading()

    def wait_leading(self, timeout: float = 60) -> None:
        identity = self.identity
        wait_for(
            f"{identity} to lead", lambda: self._leads(identity), timeout=timeout, interval=0.2
        )

    def health(self) -> Any:
        """The operator's /healthz answer (JSON)."""
        url = f"http://127.0.0.1:{self.health_port}/healthz"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())

    def leads(self) -> bool:
        return self._leads(self.identity)

    def _leads(self, identity: str) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"operator exited {self.proc.returncode}:\n{self.tail()}")
        proc = self.cluster.kubectl(
            "get", "lease", self.lease_name, "-n", OPERATOR_NAMESPACE, "-o", "json",
            check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            return False
        return bool(json.loads(proc.stdout)["spec"].get("holderIdentity") == identity)

    def kill(self) -> None:
        """SIGKILL: no cleanup, the Lease is left to expire."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def operator_kubeconfig(
    cluster: Cluster, path: Path, server: str = "", account: str = "embedfleet-operator"
) -> Path:
    """A ServiceAccount of the operator's namespace as a kubeconfig, for `server` (default: the
    API server)."""
    token = cluster.kubectl(
        "create", "token", account, "-n", OPERATOR_NAMESPACE, "--duration=2h"
    ).stdout.strip()
    ca = cluster.layout.pki.ca.cert
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "test",
                "cluster": {"server": server or cluster.server, "certificate-authority": str(ca)},
            }
        ],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "operator"}}],
        "current-context": "test",
    }
    path.write_text(json.dumps(config))
    return path


def wait_until(
    what: str, probe: Callable[[], Any], op: OperatorProcess, timeout: float = 60
) -> Any:
    """wait_for, with the operator's log in the failure message."""
    try:
        return wait_for(what, probe, timeout=timeout, interval=0.25)
    except TimeoutError as err:
        raise AssertionError(f"{err}\n--- operator log tail:\n{op.tail()}") from err


CHILD_KINDS = "deployments,services,configmaps,serviceaccounts,roles,rolebindings,pdb"
OWNER_LABEL = "embedfleet.dev/deployment"


def get_json(cluster: Cluster, ns: str, *what: str) -> Any:
    """`kubectl get <what> -o json` in `ns`; None when kubectl fails (e.g. not found)."""
    proc = cluster.kubectl("get", *what, "-n", ns, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def child_objects(cluster: Cluster, ns: str, owner: str) -> dict[str, Any]:
    """The children the operator labelled as `owner`'s, by "Kind/name"."""
    selector = f"{OWNER_LABEL}={owner}"
    found = get_json(cluster, ns, CHILD_KINDS, "-l", selector, "--show-managed-fields")
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in (found or {}).get("items", ())}


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    conds = (obj.get("status") or {}).get("conditions") or ()
    return next((c for c in conds if c["type"] == kind), {})


def available(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    """The EmbeddingDeployment once Available=True for its current generation, else None."""
    obj = get_json(cluster, ns, "emb", name)
    if obj is None or condition(obj, "Available").get("status") != "True":
        return None
    if obj["status"].get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    return dict(obj)


# A TCP proxy on 127.0.0.1 that delivers every byte from the server `delay` seconds late: a slow
# API server (a loaded machine, a congested control plane) without slowing the machine. Pure
# added latency, no throughput limit; TLS passes through untouched.
CHUNK = 65536


@dataclass
class LatencyProxy:
    """Every reply from `upstream` arrives `delay` seconds late (settable at any time; a delay
    beyond the client's patience is an API server that hangs)."""

    upstream: tuple[str, int]
    delay: float
    _listener: socket.socket = field(init=False)
    _sockets: list[socket.socket] = field(default_factory=list, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _closed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, name="latency-proxy", daemon=True).start()

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self.upstream)
            except OSError:
                return
            with self._lock:
                if self._closed:
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
            _start(_pump, client, server, 0.0)
            late: queue.Queue[tuple[float, bytes]] = queue.Queue()
            _start(_read_into, server, late)
            _start(_deliver, late, client, self)


def _start(target: object, *args: object) -> None:
    threading.Thread(target=target, args=args, daemon=True).start()  # type: ignore[arg-type]


def _pump(source: socket.socket, sink: socket.socket, _: float) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(CHUNK):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _read_into(source: socket.socket, late: queue.Queue[tuple[float, bytes]]) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(CHUNK):
            late.put((time.monotonic(), data))
    late.put((time.monotonic(), b""))


def _deliver(
    late: queue.Queue[tuple[float, bytes]], sink: socket.socket, proxy: LatencyProxy
) -> None:
    with contextlib.suppress(OSError):
        while True:
            arrived, data = late.get()
            time.sleep(max(0.0, arrived + proxy.delay - time.monotonic()))
            if not data:
                sink.shutdown(socket.SHUT_WR)
                return
            sink.sendall(data)
