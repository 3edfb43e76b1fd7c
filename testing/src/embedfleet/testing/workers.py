"""Start real worker processes on 127.0.0.1 for tests and benchmarks, and wait until they serve.

    with running_worker(tmp_path, "--engine", "null") as worker:
        stub = WorkerStub(worker.channel())

The worker binds port 0 and reports the port it got through --port-file, so there is no race for a
free gRPC port; the metrics port is picked free just before start. Readiness is the standard
grpc.health.v1 check reaching SERVING. Needs the `worker` extra of embedfleet-testing (the worker
itself, grpcio, prometheus-client); the cluster harness does not.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from embedfleet.common.net import free_ports
from embedfleet.common.proto import embedfleet_pb2_grpc as pb_grpc
from embedfleet.testing.polling import WaitTimeoutError, wait_for
from embedfleet.testing.process import log_tail
from embedfleet.testing.tools import rust_artifact


def worker_stub(channel: grpc.Channel) -> pb_grpc.WorkerStub:
    """The generated stub's constructor has no annotations; this typed wrapper does."""
    return pb_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]


def metric_value(exposition: str, name: str, **labels: str) -> float:
    """One sample's value in Prometheus text, 0.0 when absent."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def scrape(metrics_port: int) -> str:
    """The Prometheus text a process serves on 127.0.0.1:metrics_port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


class WorkerStartError(RuntimeError):
    """The worker exited or did not become SERVING in time; the message holds its log's tail."""


def health_status(address: str, timeout: float = 1.0, service: str = "") -> str:
    """SERVING, NOT_SERVING, ... or UNREACHABLE."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError:
            return "UNREACHABLE"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    log: Path
    port_file: Path
    metrics_port: int
    port: int = 0
    _channels: list[grpc.Channel] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def channel(self) -> grpc.Channel:
        """A channel closed by stop(); make one per client thread for real concurrency."""
        channel = grpc.insecure_channel(self.address)
        self._channels.append(channel)
        return channel

    def wait_port(self, timeout: float) -> int:
        def reported() -> int | None:
            self.check_alive()
            if not self.port_file.is_file():
                return None
            return int(json.loads(self.port_file.read_text())["port"])

        try:
            self.port = wait_for("the worker's port file", reported, timeout=timeout, interval=0.02)
        except WaitTimeoutError as exc:
            raise WorkerStartError(f"no port after {timeout:.0f}s\n{log_tail(self.log)}") from exc
        return self.port

    def wait_serving(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        if not self.port:
            self.wait_port(timeout)

        def serving() -> bool:
            self.check_alive()
            return health_status(self.address) == "SERVING"

        try:
            wait_for(
                "the worker to be SERVING",
                serving,
                timeout=max(deadline - time.monotonic(), 0.0),
                interval=0.05,
            )
        except WaitTimeoutError as exc:
            raise WorkerStartError(
                f"not SERVING after {timeout:.0f}s\n{log_tail(self.log)}"
            ) from exc

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise WorkerStartError(
                f"worker exited with {self.proc.returncode}\n{log_tail(self.log)}"
            )

    def metrics_text(self) -> str:
        return scrape(self.metrics_port)

    def metric(self, name: str, **labels: str) -> float:
        """One sample's value, 0.0 when absent: metric("x_total", rpc="Embed", code="OK")."""
        return metric_value(self.metrics_text(), name, **labels)

    def log_records(self) -> list[dict[str, Any]]:
        records = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
        return records

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (drain), then SIGKILL after `timeout`; returns the exit code."""
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start_worker(
    workdir: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    name: str = "worker",
) -> WorkerProcess:
    """Spawn `embedfleet-worker --port 0 ... *args` logging to workdir/<name>.log; don't wait."""
    workdir.mkdir(parents=True, exist_ok=True)
    (metrics_port,) = free_ports(1)
    log = workdir / f"{name}.log"
    port_file = workdir / f"{name}.port.json"
    port_file.unlink(missing_ok=True)
    argv: Sequence[str] = [
        sys.executable,
        "-m",
        "embedfleet.worker.cli",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--port-file",
        str(port_file),
        "--metrics-port",
        str(metrics_port),
        *args,
    ]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    return WorkerProcess(proc=proc, log=log, port_file=port_file, metrics_port=metrics_port)


@contextlib.contextmanager
def running_worker(
    workdir: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    name: str = "worker",
    ready_timeout: float = 180.0,
) -> Iterator[WorkerProcess]:
    """A SERVING worker for the duration of the block; drained and stopped after it."""
    worker = start_worker(workdir, *args, env=env, name=name)
    try:
        worker.wait_serving(ready_timeout)
        yield worker
    finally:
        worker.stop()


#: a prebuilt worker-front extension to use instead of building (e.g. outside a clone)
FRONT_LIBRARY_ENV = "EMBEDFLEET_TEST_FRONT_LIBRARY"


def front_library(*, build: bool = True) -> Path:
    """The worker's Rust front (worker-front/, embedfleet_front.abi3.so) of this tree, compiled
    first when no cached build matches: what `--front rust --front-library` loads."""
    return rust_artifact("worker-front", FRONT_LIBRARY_ENV, build=build)
