"""prometheusURL mode against a real Prometheus (Debian's package) scraping stub worker processes
with the labels a ServiceMonitor attaches (namespace, pod)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from embedfleet.common.net import free_ports
from embedfleet.operator.autoscaling import signals
from embedfleet.testing.polling import WaitTimeoutError, wait_for
from embedfleet.testing.stub_worker import StubWorker, start_stub

pytestmark = pytest.mark.slow


@pytest.fixture
def prometheus(
    stub_workers: list[StubWorker], tmp_path: Path
) -> Iterator[tuple[str, list[StubWorker]]]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus not on PATH; install it with hack/install-prometheus.sh")
    stubs = [
        start_stub(stub_workers, tmp_path, tokens_per_second=6_000, latency_seconds=0.3,
                   capacity=10_000, queued_tokens=100),
        start_stub(stub_workers, tmp_path, tokens_per_second=4_000, latency_seconds=0.3,
                   capacity=12_000, queued_tokens=50),
        # Fleet "fleet-worker-b": its pods start with fleet "fleet"'s worker prefix.
        start_stub(stub_workers, tmp_path, tokens_per_second=1_000, latency_seconds=0.05,
                   capacity=5_000, queued_tokens=7),
    ]  # fmt: skip
    pods = [
        ("ns1", "fleet-worker-5d4f8b7c9-x2k4p"),
        ("ns1", "fleet-worker-5d4f8b7c9-p4x2k"),
        ("ns1", "fleet-worker-b-worker-7c9d6f-k2x4p"),
    ]
    targets = [
        {"targets": [f"127.0.0.1:{s.port}"], "labels": {"namespace": ns, "pod": pod}}
        for s, (ns, pod) in zip(stubs, pods, strict=True)
    ]
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "workers", "static_configs": targets}],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    (port,) = free_ports(1)
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError((tmp_path / "prometheus.log").read_text())
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2) as reply:
                    return bool(reply.status == 200)
            except OSError:
                return False

        try:
            wait_for("prometheus to be ready", ready, timeout=60, interval=0.2)
        except WaitTimeoutError:
            raise RuntimeError((tmp_path / "prometheus.log").read_text()) from None
        yield url, stubs
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


async def observe(url: str, namespace: str = "", fleet: str = "") -> signals.Answers:
    # A range shorter than the operator's 1m: rate() over a series younger than its range
    # reads low, and these series are seconds old.
    queries = signals.prometheus_queries("10s", namespace, fleet)
    async with aiohttp.ClientSession() as session:
        return await signals.query_prometheus(session, url, queries)


def fleet_of(answers: signals.Answers, key: signals.FleetKey) -> signals.Observation | None:
    return signals.observation_from_prometheus(signals.values_of(answers, key), ready_replicas=2)


def test_prometheus_signals(prometheus: tuple[str, list[StubWorker]]) -> None:
    url, _ = prometheus
    answers: signals.Answers = {}

    def settled() -> bool:
        nonlocal answers
        answers = asyncio.run(observe(url))
        o = fleet_of(answers, ("ns1", "fleet"))
        # Enough scrapes for rate() and the histogram to settle on both pods.
        return o is not None and o.tokens_per_second > 9_000 and o.p99_seconds is not None

    with contextlib.suppress(WaitTimeoutError):
        wait_for("the signals to settle", settled, timeout=60, interval=1)
    # One set of queries answers for every fleet, each from its own pods only.
    assert set(answers["worker_tokens"]) == {("ns1", "fleet"), ("ns1", "fleet-worker-b")}
    o = fleet_of(answers, ("ns1", "fleet"))
    assert o is not None
    assert o.tokens_per_second == pytest.approx(10_000, rel=0.15)
    assert o.p99_seconds is not None
    assert 0.25 < o.p99_seconds <= 0.5
    assert o.capacity_tokens_per_second == pytest.approx(11_000)
    assert o.queued_tokens == 150
    other = fleet_of(answers, ("ns1", "fleet-worker-b"))
    assert other is not None
    assert other.tokens_per_second == pytest.approx(1_000, rel=0.25)
    assert other.capacity_tokens_per_second == pytest.approx(5_000)
    assert other.queued_tokens == 7
    # The queries of one fleet (a wake) see that fleet alone; another namespace has no series.
    alone = asyncio.run(observe(url, "ns1", "fleet"))
    assert set(alone["queued"]) == {("ns1", "fleet")}
    assert alone["queued"][("ns1", "fleet")] == 150
    assert fleet_of(asyncio.run(observe(url, "elsewhere", "fleet")), ("elsewhere", "fleet")) is None


def test_prometheus_errors_surface() -> None:
    (port,) = free_ports(1)  # nothing listens there

    async def query() -> None:
        async with aiohttp.ClientSession() as session:
            await signals.query_prometheus(session, f"http://127.0.0.1:{port}", {"x": "up"}, 2.0)

    with pytest.raises(aiohttp.ClientError):
        asyncio.run(query())
