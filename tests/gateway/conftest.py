"""Gateway test fixtures: the bundled model directory, shared by every test, and the real app in
front of two FAKE workers, one per module that asks for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from embedfleet.common.modeldir import ModelDir, default_model_path, load_model_dir
from embedfleet.gateway.settings import GatewaySettings

from .fakes import FakeWorker
from .helpers import GatewayThread, wait_until


@pytest.fixture(scope="session")
def minilm() -> ModelDir:
    return load_model_dir(default_model_path())


@pytest.fixture(scope="module")
def fake_fleet_gateway(minilm: ModelDir) -> Iterator[GatewayThread]:
    """The gateway with default settings in front of two fake workers, both in rotation."""
    workers = [FakeWorker(i).start() for i in range(2)]
    settings = GatewaySettings(workers=tuple(w.address for w in workers), probe_seconds=0.1)
    gw = GatewayThread(settings, minilm).start()
    try:
        wait_until("workers ready", lambda: len(gw.app.balancer.usable()) == 2)
        yield gw
    finally:
        gw.stop()
        for w in workers:
            w.stop()
