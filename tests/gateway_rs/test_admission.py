"""Admission and chunk pacing by the workers' measured capacity, through both gateways alike:
`--chunk-seconds` sizing chunks, shedding past `--max-queue-seconds` before tokenizing with a
Retry-After of at least `--retry-after-seconds`, a burst admitted only up to the bound, and text
admitted on its estimate, then counted at its true size. Each gateway is in front of its own pair
of FAKE workers, which report the capacity and queue the test sets."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedfleet.common.modeldir import ModelDir
from tests.gateway.fakes import FakeWorker

from .conftest import LIMITS, fake_gateways
from .pair import Answer, Pair

#: what a shed request leaves alone (it is shed before it is tokenized) and what it counts
SERIES: list[tuple[str, dict[str, str]]] = [
    ("embedfleet_gateway_tokenize_seconds_count", {}),
    ("embedfleet_gateway_input_tokens_total", {}),
    ("embedfleet_gateway_shed_requests_total", {}),
]


def test_chunks_hold_chunk_seconds_of_a_slow_workers_work(
    minilm: ModelDir, rust_binary: Path, tmp_path: Path
) -> None:
    """Workers that measured 2 tokens/s each: with `--chunk-seconds 3`, 6-token chunks (two
    3-token inputs), where the 10-token budget alone would make 3-input chunks."""
    settings: dict[str, object] = {
        **LIMITS,
        "chunk_tokens": 10,
        "min_chunk_tokens": 1,
        "chunk_seconds": 3.0,
    }

    def make(number: int) -> FakeWorker:
        # Its one queued token shows in the gauge once a gateway's probe read the capacity.
        return FakeWorker(number, capacity=2.0, queued_tokens=1)

    with fake_gateways(minilm, settings, tmp_path / "gw.log", make) as pair:
        pair.queued_seconds_are(2 / 4)
        doc = pair.embed({"input": [[i + 1] * 3 for i in range(40)]})
        assert [int(d["embedding"][0]) for d in doc["data"]] == list(range(1, 41))
        assert pair.calls() == ([2] * 20, [2] * 20)


def test_work_queued_past_the_bound_is_shed_before_tokenizing(
    minilm: ModelDir, rust_binary: Path, tmp_path: Path
) -> None:
    """Other gateways' work at 1,000 tokens/s a worker against a 10 s bound: 15 s of it sheds
    with the Retry-After floor of 7 (5 s over), 25 s with its own 15; a request of any size is
    shed untokenized and counted; back within the bound, requests are served again."""
    settings: dict[str, object] = {**LIMITS, "max_queue_seconds": 10, "retry_after_seconds": 7}

    def make(number: int) -> FakeWorker:
        return FakeWorker(number, capacity=1000.0, queued_tokens=15_000)

    with fake_gateways(minilm, settings, tmp_path / "gw.log", make) as pair:
        message, retry_after = pair.shed_alike("/v1/embeddings", {"input": "a b c"})
        assert message == (
            "The workers have 15.0s of work queued, more than this gateway's bound of 10s; "
            "retry later."
        )
        assert retry_after == "7"
        # Large enough to be tokenized off the event loop, were it admitted.
        big = {"input": ["many words " * 2000] * 3}
        deltas = pair.metric_deltas(SERIES, [("/v1/embeddings", big)])
        assert deltas[0] == deltas[1] == (0, 0, 1)
        pair.queued_seconds_are(15.0)
        pair.set_workers(queued_tokens=25_000)
        pair.queued_seconds_are(25.0)
        _, retry_after = pair.shed_alike("/v1/embeddings", big)
        assert retry_after == "15"
        pair.set_workers(queued_tokens=7_000)  # 7 s ahead: within the bound
        pair.served_alike()


#: a 2 s bound with a Retry-After floor of 3, in front of fakes of 10 tokens/s each (_gated)
GATED: dict[str, object] = {**LIMITS, "max_queue_seconds": 2, "retry_after_seconds": 3}


@dataclass
class Gated:
    """Requests admitted by both gateways and held at the workers until the block ends; then
    each one's two answers, in the order sent."""

    pair: Pair
    pool: ThreadPoolExecutor
    futures: list[tuple[Future[Answer], Future[Answer]]] = field(default_factory=list)
    answers: list[tuple[Answer, Answer]] = field(default_factory=list)

    def admit(self, request: Any, queued_seconds: float) -> None:
        """`request` sent to both, which admit it: then `queued_seconds` of work are ahead."""
        py, rs = (
            self.pool.submit(one.request, "POST", "/v1/embeddings", json=request)
            for one in (self.pair.python(), self.pair.rust())
        )
        self.futures.append((py, rs))
        # Waited for, so that each gateway decides on the next request with this one counted.
        self.pair.queued_seconds_are(queued_seconds)


@contextlib.contextmanager
def _gated(minilm: ModelDir, tmp_path: Path) -> Iterator[Gated]:
    """Both gateways (GATED) in front of fakes that hold every Embed call until the block
    ends; the requests admitted meanwhile answered alike after it, and their work given
    back."""
    gate = threading.Event()

    def make(number: int) -> FakeWorker:
        return FakeWorker(number, capacity=10.0, queued_tokens=1, gate=gate)

    with fake_gateways(minilm, GATED, tmp_path / "gw.log", make) as pair:
        # The probes read the capacity (one token each queued elsewhere), then nothing is.
        pair.queued_seconds_are(2 / 20)
        pair.set_workers(queued_tokens=0)
        pair.queued_seconds_are(0.0)
        with ThreadPoolExecutor(6) as pool:
            held = Gated(pair, pool)
            # Set however the block ends, so that the pool's requests end with it.
            try:
                yield held
                assert not any(f.done() for both in held.futures for f in both)
            finally:
                gate.set()
            held.answers = [
                (py.result(timeout=30), rs.result(timeout=30)) for py, rs in held.futures
            ]
        for py, rs in held.answers:
            assert py.status == rs.status == 200, (py.body, rs.body)
            assert py.json() == rs.json()
        pair.queued_seconds_are(0.0)
        pair.served_alike()


def test_a_burst_is_admitted_only_up_to_the_bound(
    minilm: ModelDir, rust_binary: Path, tmp_path: Path
) -> None:
    """20 tokens/s, a 2 s bound: requests of 15 token ids each (counted exactly) are admitted
    while the work ahead is within it (0, 0.75 and 1.5 s), the rest shed behind 2.25 s with
    the Retry-After floor of 3, by both, and counted."""
    request = {"input": [[1000] * 15]}
    with _gated(minilm, tmp_path) as held:
        for n in (1, 2, 3):
            held.admit(request, n * 15 / 20)
        pair = held.pair
        deltas = pair.metric_deltas(SERIES, [("/v1/embeddings", request)] * 2)
        assert deltas[0] == deltas[1] == (0, 0, 2)
        message, retry_after = pair.shed_alike("/v1/embeddings", request)
        assert message == (
            "The workers have 2.2s of work queued, more than this gateway's bound of 2s; "
            "retry later."
        )
        assert retry_after == "3"


def test_text_is_admitted_on_its_estimate_and_then_counts_its_true_size(
    minilm: ModelDir, rust_binary: Path, tmp_path: Path
) -> None:
    """Ten 2,000-character words: estimated at the 256-token cap each (128 s of work at 20
    tokens/s) yet admitted, its own size being no part of the decision; tokenized, they are
    [CLS] [UNK] [SEP] each, and from then on 30 tokens (1.5 s) are what both gateways count
    ahead of the next request. Had the estimate stayed, that one would be shed."""
    with _gated(minilm, tmp_path) as held:
        held.admit({"input": ["x" * 2000] * 10}, 30 / 20)
        held.admit({"input": "one two three four five six seven eight nine ten"}, 42 / 20)
        message, _ = held.pair.shed_alike("/v1/embeddings", {"input": "next"})
        assert message.startswith("The workers have 2.1s of work queued")
    assert [py.json()["usage"]["prompt_tokens"] for py, _ in held.answers] == [30, 12]
