"""One real local fleet for the whole directory: the gateway binary built from this tree in front
of one worker serving the bundled MiniLM (float32, so vectors compare across calls), and the
sentence-transformers reference on the same weights."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from embedfleet.common.net import free_ports
from embedfleet.fleet.supervisor import Fleet
from embedfleet.testing.gateway import gateway_binary
from tests.gateway.test_minilm import Reference


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    (port,) = free_ports(1)
    fleet = Fleet(
        workers=1,
        port=port,
        worker_args=["--warmup-seconds", "0.5", "--dtype", "float32"],
        log_dir=tmp_path_factory.mktemp("clients_fleet"),
        gateway_binary=str(gateway_binary()),
    )
    with fleet:
        yield fleet


@pytest.fixture(scope="session")
def reference() -> Reference:
    return Reference()


@pytest.fixture(scope="session")
def name(fleet: Fleet) -> str:
    return str(httpx.get(fleet.url + "/v1/models", timeout=30).json()["data"][0]["id"])
