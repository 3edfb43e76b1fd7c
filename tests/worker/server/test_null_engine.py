"""The null engine's pace: a harness worker of known capacity (stress tests rely on it)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from embedfleet.common.codec import Tokens
from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.testing.families import FamilyDirs
from embedfleet.worker.contract import Done, UnservableError, WorkItem
from embedfleet.worker.null_engine import NullEngine


def _item(tokens: int) -> WorkItem:
    ids = np.full(tokens, 1000, dtype=np.int32)
    return WorkItem(Tokens(ids=ids, lengths=np.array([tokens], dtype=np.int32)))


def test_a_paced_batch_takes_its_tokens_over_the_pace() -> None:
    model = load_model_dir(default_model_path())
    paced = NullEngine.from_model_dir(model, tokens_per_second=10_000)
    start = time.monotonic()
    result = paced.step([_item(1000), _item(1000)])
    assert time.monotonic() - start >= 0.2  # 2,000 tokens at 10,000/s; sleep never ends early
    assert isinstance(result, Done)


def test_a_multivector_model_gets_a_row_a_token_with_a_vector(family_dirs: FamilyDirs) -> None:
    """bge-m3's CLS (each sequence's first token) has no vector, so none of its rows."""
    model = load_model_dir(family_dirs.get("bge-m3"), "multivector")
    engine = NullEngine.from_model_dir(model)
    ids = np.array([5, 6, 7, 8, 9], np.int32)
    [rows] = engine.step([WorkItem(Tokens(ids, np.array([3, 2], np.int32)))]).wait()
    assert rows.shape == (3, model.hidden_size)
    assert rows[:, :2].tolist() == [[6, 1], [7, 2], [9, 1]]


def test_a_hybrid_model_is_refused(family_dirs: FamilyDirs) -> None:
    model = load_model_dir(family_dirs.get("bge-m3"), "hybrid")
    with pytest.raises(UnservableError, match="null engine does not serve task hybrid"):
        NullEngine.from_model_dir(model)
