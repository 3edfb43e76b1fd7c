"""Fixtures: a local fleet (gateway + 2 MiniLM workers), load on it, and a real Prometheus."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prom_harness import REPO_ROOT, Prometheus

from embedfleet.gateway.fleet import Fleet, free_ports

RULES = REPO_ROOT / "charts" / "embedfleet" / "alerts" / "embedfleet.rules.yaml"
WORDS = ("embedding", "fleets", "batch", "tokens", "by", "budget", "and", "reply", "in", "order")


def worker_metrics_targets(fleet: Fleet) -> list[str]:
    """host:port of each worker's /metrics (the port `Fleet` picked for --metrics-port)."""
    targets = []
    for child in fleet.worker_children:
        port = child.argv[child.argv.index("--metrics-port") + 1]
        targets.append(f"127.0.0.1:{port}")
    return targets


@dataclass
class Load:
    """Clients posting a mix of requests until stopped; counts answers by status code."""

    url: str
    clients: int = 2
    codes: Counter[int] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def requests(self, n: int) -> list[object]:
        sentence = " ".join(WORDS[(n + i) % len(WORDS)] for i in range(24))
        return [
            {"input": f"query number {n}"},
            # 64 inputs of ~30 tokens: over min_chunk_tokens, so the gateway splits it.
            {"input": [f"{sentence} {i}" for i in range(64)]},
            {"input": [sentence] * 4, "encoding_format": "base64"},
            # Invalid on purpose: the errors-by-code panel needs 4xx answers to show.
            {"input": 5},
        ]

    def _run(self, seed: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            n = seed
            while not self._stop.is_set():
                for body in self.requests(n):
                    try:
                        reply = client.post("/v1/embeddings", json=body)
                        self.codes[reply.status_code] += 1
                    except httpx.HTTPError:
                        self.codes[0] += 1
                n += self.clients

    def start(self) -> Load:
        for i in range(self.clients):
            thread = threading.Thread(target=self._run, args=(i,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


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


def start_prometheus(workdir: Path, jobs: dict[str, list[str]]) -> Prometheus:
    return Prometheus(workdir=workdir, jobs=jobs, rule_files=[RULES]).start()


@pytest.fixture(scope="module")
def fleet_jobs(fleet: Fleet) -> dict[str, list[str]]:
    """Scrape jobs named as the alerts expect (job names containing "worker" / "gateway")."""
    return {
        "embedfleet-gateway": [fleet.url.removeprefix("http://")],
        "embedfleet-worker": worker_metrics_targets(fleet),
    }
