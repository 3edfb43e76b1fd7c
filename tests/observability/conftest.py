"""Fixtures: a local fleet (gateway + 2 MiniLM workers), load on it, and a real Prometheus."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from embedfleet.common.net import free_ports
from embedfleet.fleet.supervisor import Fleet

from .helpers import Load, worker_metrics_targets


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    logs = tmp_path_factory.mktemp("fleet-logs")
    fleet = Fleet(workers=2, port=free_ports(1)[0], log_dir=logs)
    try:
        fleet.start(timeout=300)
    except Exception as exc:
        tails = {p.name: p.read_text()[-1500:] for p in logs.glob("*.log")}
        raise RuntimeError(f"fleet did not start: {exc}; logs: {tails}") from exc
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture(scope="module")
def load(fleet: Fleet) -> Iterator[Load]:
    load = Load(fleet.url).start()
    try:
        yield load
    finally:
        load.stop()


@pytest.fixture(scope="module")
def fleet_jobs(fleet: Fleet) -> dict[str, list[str]]:
    """Scrape jobs named as the alerts expect (job names containing "worker" / "gateway")."""
    return {
        "embedfleet-gateway": [fleet.url.removeprefix("http://")],
        "embedfleet-worker": worker_metrics_targets(fleet),
    }
