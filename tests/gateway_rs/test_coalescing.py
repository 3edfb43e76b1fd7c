"""How many small Embed calls each gateway keeps in flight to one worker: by the device the
worker's Info reports (one on a CPU, two on an accelerator) unless --coalesce-inflight says."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from embedfleet.common.modeldir import ModelDir
from tests.gateway.fakes import FakeWorker

from .conftest import LIMITS, fake_gateways
from .pair import Answer, One

#: concurrent one-text queries: more than two calls' worth per fake, all sent within its delay
QUERIES = 10


@pytest.mark.parametrize(
    ("device", "settings", "most"),
    [("cpu", {}, 1), ("null", {}, 1), ("cuda:0", {}, 2), ("cpu", {"coalesce_inflight": 2}, 2)],
    ids=["cpu", "null-engine", "cuda", "cpu-set-to-2"],
)
def test_calls_in_flight_follow_the_workers_device(
    minilm: ModelDir,
    rust_binary: Path,
    tmp_path: Path,
    device: str,
    settings: dict[str, object],
    most: int,
) -> None:
    def make(number: int) -> FakeWorker:
        return FakeWorker(number, delay=0.5, device=device)

    texts = [" ".join(["word"] * n) for n in range(1, QUERIES + 1)]
    with fake_gateways(minilm, {**LIMITS, **settings}, tmp_path / "gw.log", make) as pair:
        for gateway, workers in (
            (pair.python(), pair.python_workers),
            (pair.rust(), pair.rust_workers),
        ):
            with ThreadPoolExecutor(QUERIES) as pool:
                answers = list(pool.map(functools.partial(_embed, gateway), texts))
            assert [a.status for a in answers] == [200] * QUERIES
            # Every query answered with its own row (fakes._rows: n words -> n + 2 tokens).
            assert [a.json()["data"][0]["embedding"][2] for a in answers] == [
                n + 2 for n in range(1, QUERIES + 1)
            ]
            assert sum(sum(w.calls) for w in workers) == QUERIES
            assert max(w.most_running for w in workers) == most, [w.calls for w in workers]


def _embed(gateway: One, text: str) -> Answer:
    return gateway.request("POST", "/v1/embeddings", json={"input": text})
