"""The self-check compares every round it serves, so a graph's replays are checked too."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from embedfleet.common.arrays import FloatArray
from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.worker.contract import WorkItem
from embedfleet.worker.selfcheck import (
    ROUNDS,
    SelfCheckError,
    load_reference,
    run_selfcheck,
    weights_digest,
)


def _served_like_a_lazy_graph(bad_from_call: int) -> tuple[object, list[int]]:
    """A submit that returns the committed vectors, wrong from call `bad_from_call` on (as a
    bad capture's replays would be: first run eager and right, later ones from the graph)."""
    model = load_model_dir(default_model_path())
    stored = load_reference(weights_digest(model.path))
    assert stored is not None
    rows = {
        tuple(ids): np.asarray(vec, np.float32)
        for ids, vec in zip(stored["token_ids"], stored["embeddings"], strict=True)
    }
    calls = [0]

    async def submit(item: WorkItem) -> FloatArray:
        calls[0] += 1
        row = rows[tuple(int(i) for i in item.tokens.ids)]
        if calls[0] >= bad_from_call:
            row = row[::-1].copy()
        return row[None, :]

    return submit, calls


def test_a_wrong_replay_after_a_right_eager_run_fails_the_check() -> None:
    texts = 4
    submit, calls = _served_like_a_lazy_graph(bad_from_call=2 * texts + 1)  # round 3 is wrong
    model = load_model_dir(default_model_path())
    with pytest.raises(SelfCheckError, match="round 3"):
        asyncio.run(run_selfcheck(submit, model))  # type: ignore[arg-type]
    assert calls[0] == ROUNDS * texts


def test_all_rounds_right_passes() -> None:
    submit, calls = _served_like_a_lazy_graph(bad_from_call=10**9)
    model = load_model_dir(default_model_path())
    result = asyncio.run(run_selfcheck(submit, model))  # type: ignore[arg-type]
    assert result.min_cosine >= 0.9999
    assert calls[0] == ROUNDS * 4
