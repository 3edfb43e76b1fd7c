"""Admission by the workers' measured capacity: past `--max-queue-seconds` of queued work a request
is shed with 429 and a Retry-After (at least `--retry-after-seconds`) before it is tokenized; a
burst is admitted only up to the bound; text is admitted on its estimate and then counted at its
true size until answered. The FAKE workers (fakes.py) report the capacity and queue the test sets,
and hold their calls at a gate for as long as a test needs."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fakes import FakeWorker
from .helpers import LIMITS, Gateway, Reply, fake_fleet

#: what a shed request leaves alone (it is shed before it is tokenized) and what it counts
SERIES: list[tuple[str, dict[str, Any]]] = [
    ("embedfleet_gateway_tokenize_seconds_count", {}),
    ("embedfleet_gateway_input_tokens_total", {}),
    ("embedfleet_gateway_shed_requests_total", {}),
]


def shed_message(queued: str, bound: str) -> str:
    return (
        f"The workers have {queued}s of work queued, more than this gateway's bound of {bound}s; "
        "retry later."
    )


def test_other_gateways_work_sheds_every_route_before_tokenizing(fakes: Gateway) -> None:
    """50,000 tokens queued at each worker at 1,000 tokens/s each: 50 s against the default 30 s
    bound. Every route is shed with the same 429 before its task or inputs are checked (this model
    serves neither classify nor sparse)."""
    fakes.set_workers(queued_tokens=50_000, capacity=1000.0)
    try:
        fakes.queued_seconds_are(50.0)
        before = fakes.values(SERIES)
        for path, body in [
            ("/v1/embeddings", {"input": ["a", "b"]}),
            ("/v1/rerank", {"query": "q", "documents": ["d"]}),
            ("/v1/score", {"text_1": "a", "text_2": ["b", "c"]}),
            ("/v1/classify", {"input": ["a", "b"]}),
            ("/v1/sparse_embeddings", {"input": [[5, 6]]}),
            ("/v1/embeddings", {"input": "", "dimensions": 99}),
        ]:
            assert fakes.shed(path, body) == (shed_message("50.0", "30"), "20")
        moved = tuple(a - b for a, b in zip(fakes.values(SERIES), before, strict=True))
        assert moved == (0, 0, 6)
    finally:
        fakes.set_workers(queued_tokens=0, capacity=0.0)
    fakes.served()
    assert fakes.calls() == [1]


def test_work_queued_past_the_bound_is_shed_until_it_is_back_within(tmp_path: Path) -> None:
    """A 10 s bound with a Retry-After floor of 7: 15 s of work sheds with 7 (5 s over), 25 s
    with its own 15; a request of any size is shed untokenized; back within the bound, served."""
    settings = {**LIMITS, "max_queue_seconds": 10, "retry_after_seconds": 7}

    def make(number: int) -> FakeWorker:
        return FakeWorker(number, capacity=1000.0, queued_tokens=15_000)

    with fake_fleet(settings, tmp_path / "gateway.log", make) as gateway:
        assert gateway.shed("/v1/embeddings", {"input": "a b c"}) == (
            shed_message("15.0", "10"),
            "7",
        )
        # Large enough to be tokenized off the event loop, were it admitted.
        big = {"input": ["many words " * 2000] * 3}
        assert gateway.deltas(SERIES, [("/v1/embeddings", big)]) == (0, 0, 1)
        gateway.queued_seconds_are(15.0)
        gateway.set_workers(queued_tokens=25_000)
        gateway.queued_seconds_are(25.0)
        assert gateway.shed("/v1/embeddings", big)[1] == "15"
        gateway.set_workers(queued_tokens=7_000)  # 7 s ahead: within the bound
        gateway.served()


def test_a_workers_saturated_rate_replaces_its_warm_up_figure(tmp_path: Path) -> None:
    """Once a worker reports the rate it sustained saturated on real traffic, admission queues
    by that instead of its warm-up measurement."""

    def make(number: int) -> FakeWorker:
        return FakeWorker(number, capacity=1000.0, queued_tokens=1000)

    with fake_fleet(LIMITS, tmp_path / "gateway.log", make) as gateway:
        gateway.queued_seconds_are(1.0)  # 2,000 tokens at 2 x 1,000 tokens/s
        gateway.set_workers(saturated=500.0)
        gateway.queued_seconds_are(2.0)


#: a 2 s bound with a Retry-After floor of 3, in front of fakes of 10 tokens/s each (_gated)
GATED: dict[str, object] = {**LIMITS, "max_queue_seconds": 2, "retry_after_seconds": 3}


@dataclass
class Gated:
    """Requests admitted and held at the workers until the block ends; then their answers."""

    gateway: Gateway
    pool: ThreadPoolExecutor
    futures: list[Future[Reply]] = field(default_factory=list)
    answers: list[Reply] = field(default_factory=list)

    def admit(self, request: Any, queued_seconds: float) -> None:
        """`request` sent and admitted: then `queued_seconds` of work are ahead."""
        self.futures.append(self.pool.submit(self.gateway.post, "/v1/embeddings", request))
        # Waited for, so that the gateway decides on the next request with this one counted.
        self.gateway.queued_seconds_are(queued_seconds)


@contextlib.contextmanager
def _gated(tmp_path: Path) -> Iterator[Gated]:
    """The gateway (GATED) in front of fakes holding every Embed call until the block ends; the
    requests admitted meanwhile answered after it, and their work given back."""
    gate = threading.Event()

    def make(number: int) -> FakeWorker:
        return FakeWorker(number, capacity=10.0, queued_tokens=1, gate=gate)

    with fake_fleet(GATED, tmp_path / "gateway.log", make) as gateway:
        # The probes read the capacity (one token each queued elsewhere), then nothing is.
        gateway.queued_seconds_are(2 / 20)
        gateway.set_workers(queued_tokens=0)
        gateway.queued_seconds_are(0.0)
        with ThreadPoolExecutor(6) as pool:
            held = Gated(gateway, pool)
            try:
                yield held
                assert not any(f.done() for f in held.futures)
            finally:
                gate.set()
            held.answers = [f.result(timeout=30) for f in held.futures]
        assert [a.status for a in held.answers] == [200] * len(held.answers)
        gateway.queued_seconds_are(0.0)
        gateway.served()


def test_a_burst_is_admitted_only_up_to_the_bound(tmp_path: Path) -> None:
    """20 tokens/s, a 2 s bound: requests of 15 token ids each (counted exactly) are admitted
    while the work ahead is within it (0, 0.75 and 1.5 s), the rest shed behind 2.25 s with the
    Retry-After floor of 3, and counted."""
    request = {"input": [[1000] * 15]}
    with _gated(tmp_path) as held:
        for n in (1, 2, 3):
            held.admit(request, n * 15 / 20)
        gateway = held.gateway
        assert gateway.deltas(SERIES, [("/v1/embeddings", request)] * 2) == (0, 0, 2)
        assert gateway.shed("/v1/embeddings", request) == (shed_message("2.2", "2"), "3")


def test_text_is_admitted_on_its_estimate_and_then_counts_its_true_size(tmp_path: Path) -> None:
    """Ten 2,000-character words: estimated at the 256-token cap each (128 s of work at 20
    tokens/s) yet admitted, its own size being no part of the decision; tokenized, they are
    [CLS] [UNK] [SEP] each, and from then on 30 tokens (1.5 s) are what the gateway counts ahead
    of the next request. Had the estimate stayed, that one would be shed."""
    with _gated(tmp_path) as held:
        held.admit({"input": ["x" * 2000] * 10}, 30 / 20)
        held.admit({"input": "one two three four five six seven eight nine ten"}, 42 / 20)
        message, _ = held.gateway.shed("/v1/embeddings", {"input": "next"})
        assert message.startswith("The workers have 2.1s of work queued")
    assert [a.json()["usage"]["prompt_tokens"] for a in held.answers] == [30, 12]


def test_work_this_gateway_admitted_counts_until_answered(tmp_path: Path) -> None:
    """At 10 tokens/s a worker, 700 token ids in flight are 35 s ahead of the next request, shed
    with Retry-After 5; once answered, their work is given back and requests are served."""
    big = {"input": [list(range(1000, 1100))] * 7}
    with _gated(tmp_path) as held:
        held.admit(big, 35.0)
        message, retry_after = held.gateway.shed("/v1/embeddings", {"input": "x"})
        assert (message, retry_after) == (shed_message("35.0", "2"), "33")
