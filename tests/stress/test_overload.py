"""Overload through a real local fleet: `embedfleet serve`'s Fleet with null-engine workers paced to
a known capacity (asleep, so other jobs on the machine do not change it) and the real gateway.

Before admission decided ahead of tokenization, 64 clients got their first 65 requests admitted at
once, far more work than the deadline allowed: 504s, workers dropping queued requests past their
deadline, and 429 for everyone afterwards. These tests assert the invariants instead: no 5xx, no
timeouts, every admitted request inside its deadline, goodput near the capacity the workers
measured in this same run, and 429 (with Retry-After) only with the queue past its bound.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest

from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.testing.overload import (
    Outcome,
    closed_loop,
    mixed_bodies,
    one_request,
    summarize,
    words_of,
)

from .helpers import capacity, local_fleet, null_workers, worker_metric

pytestmark = pytest.mark.slow

#: per worker; two of them. Low enough that 64 clients of 1-100 texts are far past it
PACE = 5000.0
BOUND_SECONDS = 5.0
#: the gateway's deadline for a chunk; admitted work must finish inside it
DEADLINE_SECONDS = 15.0
CLIENTS = 64
SECONDS = 30.0


def _words() -> list[str]:
    return words_of(list(load_model_dir(default_model_path()).tokenizer().get_vocab()))


def test_overload_sheds_beyond_the_bound_and_serves_the_rest_at_capacity(tmp_path: Path) -> None:
    gateway = [
        "--max-queue-seconds",
        str(BOUND_SECONDS),
        "--upstream-timeout-seconds",
        str(DEADLINE_SECONDS),
    ]
    bodies = mixed_bodies(_words(), seed=7, count=300)
    with local_fleet(tmp_path, 2, null_workers(PACE), gateway) as fleet:
        measured = capacity(fleet)
        assert measured == pytest.approx(2 * PACE, rel=0.2)  # the pace, measured at warm-up
        outcomes = asyncio.run(
            closed_loop(
                "127.0.0.1",
                fleet.port,
                CLIENTS,
                SECONDS,
                bodies,
                timeout=DEADLINE_SECONDS + 10,
            )
        )
        dropped = sum(
            worker_metric(w, "embedfleet_worker_dropped_requests_total", reason="deadline")
            for w in fleet.worker_children
        )
    s = summarize(outcomes, measured)
    print(
        f"\n{s.requests} requests: {s.ok} ok, {s.shed} shed (429); goodput {s.goodput:.0f} "
        f"tokens/s = {s.goodput_ratio:.3f} x measured capacity {measured:.0f}; admitted p50 "
        f"{s.ok_p50_seconds:.2f}s max {s.ok_max_seconds:.2f}s; least work in flight at a 429 "
        f"{s.least_seconds_ahead_of_a_429:.2f}s (bound {BOUND_SECONDS}s); worker deadline drops "
        f"{dropped:.0f}"
    )
    assert s.server_errors == {}
    assert s.no_answer == 0
    assert s.other == {}
    assert s.shed > 0, "not overloaded: the test proves nothing"
    assert s.shed_without_retry_after == 0
    assert s.ok_max_seconds < DEADLINE_SECONDS
    assert dropped == 0
    assert s.goodput_ratio >= 0.9
    # The client sees slightly more in flight than the gateway counted (answers on their way) and
    # the gateway counts estimates for requests it is tokenizing: half the bound is far from both.
    assert s.least_seconds_ahead_of_a_429 >= 0.5 * BOUND_SECONDS


def test_a_batch_job_on_one_worker_is_queued_not_refused(tmp_path: Path) -> None:
    """Issue 18: four clients x 100 texts of 512 tokens on ONE worker, at the CPU speed measured
    there (6,700 tokens/s), with the gateway's defaults. The fixed 65,536-token limit answered the
    third 429; the fourth now waits behind ~23 s of work, inside the default 30 s bound."""
    limit = ["--max-input-tokens", "512"]
    text = " ".join(["word"] * 600)  # 600 one-token words, cut to 512 with [CLS]/[SEP]
    body = orjson.dumps({"input": [text] * 100, "truncate": True})
    with local_fleet(tmp_path, 1, [*null_workers(6700.0), *limit], limit) as fleet:

        async def staggered() -> list[Outcome]:
            # One after another (each tokenized and queued before the next arrives), as a batch
            # job's clients drift apart; all at once would pass even the old token count. One
            # request each: a closed loop of 1 ms sent none where it started late (a busy CPU).
            async def client(i: int) -> Outcome:
                await asyncio.sleep(0.5 * i)
                return await one_request("127.0.0.1", fleet.port, body, 120)

            return list(await asyncio.gather(*(client(i) for i in range(4))))

        start = time.monotonic()
        outcomes = asyncio.run(staggered())
        elapsed = time.monotonic() - start
    statuses = [o.status for o in outcomes]
    print(f"\nstatuses {statuses}, tokens {[o.tokens for o in outcomes]}, {elapsed:.1f}s")
    assert statuses == [200] * 4
    assert all(o.tokens == 51_200 for o in outcomes)
