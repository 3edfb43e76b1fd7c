from __future__ import annotations

import numpy as np
import pytest

from embedfleet.gateway.splitting import Chunk, chunk_budget, join, paced_chunk_tokens, plan


def test_plan_respects_budget_and_order() -> None:
    chunks = plan([3, 3, 3, 5, 1, 9], budget=9, max_sequences=100)
    assert chunks == [Chunk(0, 3, 9), Chunk(3, 5, 6), Chunk(5, 6, 9)]


def test_plan_caps_sequences() -> None:
    chunks = plan([1] * 7, budget=100, max_sequences=3)
    assert [(c.start, c.stop) for c in chunks] == [(0, 3), (3, 6), (6, 7)]


def test_input_over_budget_travels_alone() -> None:
    assert plan([2, 50, 2], budget=10, max_sequences=10) == [
        Chunk(0, 1, 2),
        Chunk(1, 2, 50),
        Chunk(2, 3, 2),
    ]


@pytest.mark.parametrize("lengths", [[], [1], [5, 5, 5, 5], list(range(1, 60))])
def test_plan_covers_every_input_once(lengths: list[int]) -> None:
    chunks = plan(lengths, budget=17, max_sequences=4)
    covered = [i for c in chunks for i in range(c.start, c.stop)]
    assert covered == list(range(len(lengths)))
    assert sum(c.tokens for c in chunks) == sum(lengths)
    assert all(c.tokens <= 17 or c.stop - c.start == 1 for c in chunks)


def test_budget_spreads_large_requests_but_keeps_small_ones_whole() -> None:
    assert chunk_budget(100, workers=4, max_tokens=8192, min_tokens=512) == 512
    assert chunk_budget(4000, workers=4, max_tokens=8192, min_tokens=512) == 1000
    assert chunk_budget(100_000, workers=4, max_tokens=8192, min_tokens=512) == 8192
    assert chunk_budget(100, workers=0, max_tokens=8192, min_tokens=1) == 100


def test_join_keeps_chunk_order() -> None:
    parts = [np.full((2, 3), i, dtype=np.float32) for i in range(3)]
    assert join(parts)[:, 0].tolist() == [0, 0, 1, 1, 2, 2]
    assert join(parts[:1]) is parts[0]


def test_a_slow_workers_chunks_hold_about_a_second_of_its_work() -> None:
    # Two CPU workers measured at 3,200 tokens/s together: 1,600 tokens a chunk, not 8,192.
    most = paced_chunk_tokens(8192, 3200 / 2, seconds=1.0, min_tokens=512)
    assert most == 1600
    assert chunk_budget(20_000, workers=2, max_tokens=most, min_tokens=512) == 1600
    assert paced_chunk_tokens(8192, 200, seconds=1.0, min_tokens=512) == 512


def test_fast_or_unmeasured_workers_keep_the_chunk_budget() -> None:
    assert paced_chunk_tokens(8192, 150_000, seconds=1.0, min_tokens=512) == 8192
    assert paced_chunk_tokens(8192, 0, seconds=1.0, min_tokens=512) == 8192
    assert paced_chunk_tokens(8192, 1600, seconds=0, min_tokens=512) == 8192
