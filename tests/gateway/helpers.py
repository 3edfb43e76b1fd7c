"""Helpers shared by the gateway tests: the real Gateway app in a thread, waits, metric reads."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

from embedfleet.common.modeldir import ModelDir
from embedfleet.common.net import free_ports
from embedfleet.gateway.app import Gateway
from embedfleet.gateway.cli import server_config
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.polling import WaitTimeoutError, wait_for

from .fakes import FakeWorker


def wait_until(what: str, probe: Callable[[], object], timeout: float = 20.0) -> None:
    """`wait_for` at the pace of in-process fakes: they change state within milliseconds."""
    wait_for(what, probe, timeout=timeout, interval=0.02)


def metric(text: str, name: str) -> float:
    """The value of an unlabelled series in Prometheus text format."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


class GatewayThread:
    """The real Gateway app under uvicorn, in a thread of the test process."""

    def __init__(self, settings: GatewaySettings, model: ModelDir) -> None:
        (port,) = free_ports(1)
        self.app = Gateway(GatewaySettings(**{**settings.__dict__, "port": port}), model=model)
        self.url = f"http://127.0.0.1:{port}"
        # The production server settings (bounded connections, timeouts), on a plain asyncio loop.
        config = server_config(self.app, self.app.settings, loop="asyncio")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> GatewayThread:
        self.thread.start()

        def started() -> bool:
            if self.server.started:
                return True
            if not self.thread.is_alive():
                raise RuntimeError("gateway thread did not start")
            return False

        try:
            wait_for("the gateway thread to start", started, timeout=20, interval=0.02)
        except WaitTimeoutError as exc:
            raise RuntimeError("gateway thread did not start") from exc
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def host_ip() -> str:
    """This machine's outbound IPv4 address: the API refuses loopback endpoint addresses."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("203.0.113.1", 9))  # UDP connect sends nothing; it only picks a route
            return str(sock.getsockname()[0])
    except OSError:  # no default route: any non-loopback address of this host
        names = socket.gethostbyname_ex(socket.gethostname())[2]
        return next(a for a in names if not a.startswith("127."))


def service_slice(
    name: str, service: str, ip: str, port: int, ready: bool = True
) -> dict[str, Any]:
    """An EndpointSlice of `service` with one endpoint at ip:port (its port named grpc)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}}],
    }


@contextlib.contextmanager
def host_fakes(count: int) -> Iterator[list[FakeWorker]]:
    """`count` FAKE workers on this host's own address (EndpointSlices refuse loopback ones)."""
    workers = [FakeWorker(i, host=host_ip()).start() for i in range(count)]
    try:
        yield workers
    finally:
        for w in workers:
            w.stop()
