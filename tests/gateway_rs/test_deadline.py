"""A chunk that outlives --upstream-timeout-seconds: both gateways answer 504 upstream_timeout
after one call, not a retry on another worker that would wait out the bound again (tonic calls its
own timeout CANCELLED, which the Rust gateway retried)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from embedfleet.common.modeldir import ModelDir
from tests.gateway.fakes import FakeWorker

from .conftest import LIMITS, fake_gateways
from .pair import Pair


@pytest.fixture(scope="module")
def slow_pair(
    minilm: ModelDir, rust_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    log = tmp_path_factory.mktemp("gateway_rs_deadline") / "gateway-rs.log"
    settings = {**LIMITS, "upstream_timeout_seconds": 0.5}
    with fake_gateways(minilm, settings, log, lambda n: FakeWorker(n, delay=5.0)) as pair:
        yield pair


def test_an_expired_chunk_is_a_504_after_one_call(slow_pair: Pair) -> None:
    doc = slow_pair.embed({"input": "slow"})
    assert doc["error"]["code"] == "upstream_timeout"
    pair = slow_pair
    calls = [sum(len(w.calls) for w in ws) for ws in (pair.python_workers, pair.rust_workers)]
    assert calls == [1, 1]
