"""What the end-to-end tests do to the real node's cluster, as a user would: kubectl and helm,
plus the load generator (e2eload.py) running where Service addresses route, and the figures."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

from embedfleet.testing.apiclient import ApiError
from embedfleet.testing.polling import wait_for

from .e2eload import RUNNING

if TYPE_CHECKING:
    from embedfleet.testing.node import RealNode

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "embedfleet"
EXAMPLE = REPO / "examples" / "minilm.yaml"
LOADGEN = Path(__file__).with_name("e2eload.py")
RELEASE = "embedfleet"
SYSTEM = "embedfleet-system"
"""The operator's namespace (the chart's release namespace)."""
NAMESPACE = "default"
"""Where the user applies examples/minilm.yaml (it names no namespace)."""
NAME = "minilm"
OWNER_LABEL = f"embedfleet.dev/deployment={NAME}"
EMB_PATH = f"/apis/embedfleet.dev/v1alpha1/namespaces/{NAMESPACE}/embeddingdeployments"
FORBIDDEN = re.compile(r"\b403\b|forbidden", re.IGNORECASE)

FIGURES: dict[str, Any] = {}
"""Measured figures, printed at the end of the session (tests/e2e/conftest.py)."""


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next(
        (c for c in (obj.get("status") or {}).get("conditions") or () if c.get("type") == kind),
        None,
    )


def _is_info(line: str) -> bool:
    """A JSON log record (either gateway's) below warning; anything else is kept."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("level") in {"debug", "info"}


def is_ready(pod: dict[str, Any]) -> bool:
    ready = condition(pod, "Ready")
    return bool(ready and ready["status"] == "True") and not pod["metadata"].get(
        "deletionTimestamp"
    )


@dataclass
class Fleet:
    node: RealNode
    work: Path

    # -- kubectl ---------------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 60.0) -> str:
        return self.node.cluster.kubectl(*args, input=input, timeout=timeout).stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args))

    def api(self, path: str, **query: str) -> Any:
        """One GET on the API (in-process: polling through kubectl would cost a process a call)."""
        return self.node.cluster.api.get(f"{path}?{urlencode(query)}" if query else path)

    def api_or_none(self, path: str) -> Any:
        try:
            return self.api(path)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def emb(self) -> dict[str, Any]:
        return dict(self.api(f"{EMB_PATH}/{NAME}"))

    def deployment(self, component: str) -> dict[str, Any]:
        path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{NAME}-{component}"
        return dict(self.api(path))

    def pods(self, component: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        instance = RELEASE if namespace == SYSTEM else NAME
        selector = f"app.kubernetes.io/instance={instance},app.kubernetes.io/component={component}"
        found = self.api(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector)
        return list(found["items"])

    def ready_pods(self, component: str) -> list[dict[str, Any]]:
        return [p for p in self.pods(component) if is_ready(p)]

    def logs(self, namespace: str, pod: str) -> str:
        return self.kubectl("logs", "-n", namespace, pod, "--all-containers", timeout=30)

    def forbidden_lines(self) -> list[str]:
        """Log lines of the operator and gateway pods that say the API refused them."""
        found = []
        for namespace, component in ((SYSTEM, "operator"), (NAMESPACE, "gateway")):
            for pod in self.pods(component, namespace):
                text = self.logs(namespace, pod["metadata"]["name"])
                found += [line for line in text.splitlines() if FORBIDDEN.search(line)]
        return found

    def describe(self, namespace: str = NAMESPACE) -> str:
        """What a user would look at when something does not come up: pods, events, logs."""
        kubectl = self.node.cluster.kubectl
        out = [kubectl("get", "pods,deployments,events", "-A", "-o", "wide", check=False).stdout]
        out.append(kubectl("describe", "pods", "-n", namespace, check=False).stdout[-4000:])
        for previous in ("false", "true"):
            args = ["logs", "-n", namespace, "-l", "app.kubernetes.io/name", "--all-containers"]
            args += ["--prefix", "--tail=40", f"--previous={previous}"]
            logs = kubectl(*args, check=False)
            out.append(logs.stdout + logs.stderr)
        return "\n".join(out)[-15000:]

    def gateway_errors(self) -> str:
        """The gateways' warnings and errors, with tracebacks: why a request failed."""
        out = []
        for pod in self.pods("gateway"):
            text = self.logs(NAMESPACE, pod["metadata"]["name"])
            out += [line for line in text.splitlines() if not _is_info(line)]
        return "\n".join(out)[-8000:]

    def cluster_ip(self) -> str:
        return str(self.api(f"/api/v1/namespaces/{NAMESPACE}/services/{NAME}")["spec"]["clusterIP"])

    def wait(self, what: str, probe: Callable[[], T | None], timeout: float) -> T:
        """Waits with the node checked on every poll: a dead node fails fast, with its log."""

        def checked() -> T | None:
            self.node.assert_running()
            return probe()

        return wait_for(what, checked, timeout=timeout, interval=0.25)

    def wait_settled(self, replicas: int, timeout: float) -> None:
        """Until `replicas` worker pods of the current template are ready and no other is left."""

        def settled() -> bool:
            dep = self.deployment("worker")
            status = dep.get("status") or {}
            return (
                status.get("observedGeneration") == dep["metadata"]["generation"]
                and status.get("updatedReplicas") == replicas
                and status.get("readyReplicas") == replicas
                and status.get("replicas") == replicas
                and len(self.pods("worker")) == replicas
            )

        self.wait(f"{replicas} settled worker pods", settled, timeout)

    # -- load ------------------------------------------------------------------------------------

    def in_node(self, argv: list[str]) -> list[str]:
        """argv run where the node's pods and kube-proxy see the network: ClusterIPs route."""
        return self.node.netns_argv(argv)

    @contextmanager
    def load(
        self, name: str, *, streams: int = 3, seconds: float = 150.0, rate: float = 8.0
    ) -> Iterator[Load]:
        """Steady load through the gateway Service's ClusterIP for the block's duration:
        `streams` closed loops of at most `rate` requests a second each."""
        out = self.work / f"load-{name}.json"
        argv = [sys.executable, str(LOADGEN), "load", "--url", f"http://{self.cluster_ip()}/v1"]
        argv += ["--out", str(out), "--streams", str(streams), "--seconds", str(seconds)]
        argv += ["--rate", str(rate)]
        log_path = self.work / f"load-{name}.log"
        log = log_path.open("w")
        proc = subprocess.Popen(self.in_node(argv), stdout=log, stderr=subprocess.STDOUT)
        load = Load(proc, out)
        try:
            # From its first answer, not its start: its imports alone take seconds when busy,
            # and a test that acted "after 4 s of load" acted before any request was sent.
            self.wait("the load's first answer", lambda: load.running(log_path), timeout=120)
            yield load
        finally:
            load.finish()
            log.close()

    def embed_ok(self, pod: dict[str, Any]) -> int:
        """Embed RPCs a worker pod answered OK, from its /metrics (the host routes to pod IPs)."""
        url = f"http://{pod['status']['podIP']}:9090/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            text = reply.read().decode()
        pattern = r'^embedfleet_worker_requests_total\{code="OK",rpc="Embed"\} ([0-9.e+]+)$'
        match = re.search(pattern, text, re.MULTILINE)
        return int(float(match.group(1))) if match else 0

    def embed_in_node(self, url: str, texts: list[str]) -> list[list[float]]:
        argv = self.in_node([sys.executable, str(LOADGEN), "embed", "--url", url])
        proc = subprocess.run(
            argv, input=json.dumps(texts), capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, proc.stderr
        return list(json.loads(proc.stdout))


@dataclass
class Applied:
    fleet: Fleet
    seconds: float
    """From `kubectl apply` to Available=True."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    """What each poll saw, whenever it changed: Available, ready worker and gateway pods."""


@dataclass
class Report:
    records: list[dict[str, Any]]

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["error"]]

    def between(self, start: float, end: float) -> list[dict[str, Any]]:
        return [r for r in self.records if start <= r["start"] < end]

    def summary(self) -> str:
        errors: dict[str, int] = {}
        for r in self.failures:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
        return f"{len(self.records)} requests, {len(self.failures)} failed: {errors}"


@dataclass
class Load:
    proc: subprocess.Popen[bytes]
    out: Path
    report: Report | None = field(default=None)

    def running(self, log: Path) -> bool | None:
        """True once the generator printed that its first request was answered."""
        assert self.proc.poll() is None, f"load generator exited {self.proc.returncode}"
        return RUNNING in log.read_text(errors="replace") or None

    def wait_running(self, seconds: float) -> None:
        """Lets the load run `seconds`, failing at once if the load generator died."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"load generator exited {self.proc.returncode}"
            time.sleep(0.2)

    def finish(self) -> Report:
        if self.report is None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)
            assert self.out.exists(), f"load generator exited {self.proc.returncode}, no report"
            self.report = Report(json.loads(self.out.read_text())["records"])
        return self.report
