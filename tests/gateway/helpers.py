"""Helpers shared by the gateway tests: the real Gateway app in a thread, waits, metric reads."""

from __future__ import annotations

import threading
from collections.abc import Callable

import uvicorn

from embedfleet.common.modeldir import ModelDir
from embedfleet.common.net import free_ports
from embedfleet.gateway.app import Gateway
from embedfleet.gateway.cli import server_config
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.polling import WaitTimeoutError, wait_for


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
