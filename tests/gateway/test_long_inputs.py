"""Splitting over-long inputs into windows, and their token-weighted mean (pure)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from embedfleet.gateway.long_inputs import merge, special_ends, split, windows_of


def test_special_ends() -> None:
    assert special_ends([1, 0, 0, 0, 1]) == (1, 1)
    assert special_ends([0, 0]) == (0, 0)
    assert special_ends([1, 1, 0, 1]) == (2, 1)
    assert special_ends([1, 1]) == (2, 0)


def test_short_input_is_one_window_unchanged() -> None:
    assert windows_of([101, 5, 6, 102], 1, 1, 8, 2) == [[101, 5, 6, 102]]


@pytest.mark.parametrize("length", [9, 10, 11, 17, 40, 101])
@pytest.mark.parametrize("overlap", [0, 2, 3, 100])
def test_windows_cover_the_content_in_order_within_the_limit(length: int, overlap: int) -> None:
    limit = 8
    content = list(range(1000, 1000 + length))
    ids = [101, *content, 102]
    wins = windows_of(ids, 1, 1, limit, overlap)
    room = limit - 2
    shared = min(overlap, room // 2)
    assert len(wins) > 1
    for w in wins:
        assert 3 <= len(w) <= limit
        assert w[0] == 101
        assert w[-1] == 102
    inner = [w[1:-1] for w in wins]
    # Consecutive windows share exactly `shared` tokens (the last may share more: it ends at the
    # input's end), and together they are the content, in order.
    rebuilt = list(inner[0])
    for prev, cur in itertools.pairwise(inner):
        start = content.index(cur[0])
        assert content[start : start + len(cur)] == cur
        assert start <= content.index(prev[-1]) + 1
        if cur is not inner[-1]:
            assert content.index(prev[-1]) - start + 1 == shared
        rebuilt += [t for t in cur if t > rebuilt[-1]]
    assert rebuilt == content
    assert inner[-1][-1] == content[-1]


def test_token_ids_without_specials() -> None:
    wins = windows_of(list(range(10)), 0, 0, 4, 1)
    assert wins == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]


def test_a_window_too_small_for_the_specials_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hold 4 special tokens"):
        windows_of([1, 2, 3, 4, 5], 2, 2, 4, 0)


def test_split_flattens_in_input_order_and_merge_takes_the_weighted_mean() -> None:
    ids = [[101, 1, 2, 3, 4, 5, 102], [101, 9, 102]]
    windows = split(ids, [(1, 1), (1, 1)], limit=5, overlap=1)
    assert windows.ids == [[101, 1, 2, 3, 102], [101, 3, 4, 5, 102], [101, 9, 102]]
    assert windows.owner == [0, 0, 1]
    rows = np.array([[1, 0], [0, 2], [3, 4]], dtype=np.float32)
    weights = np.array(windows.weights, dtype=np.float64)
    want0 = (rows[:2] * weights[:2, None]).sum(0) / weights[:2].sum()
    raw = merge(rows, windows, normalize=False)
    np.testing.assert_allclose(raw[0], want0, rtol=1e-6)
    np.testing.assert_allclose(raw[1], [3, 4])
    unit = merge(rows, windows, normalize=True)
    np.testing.assert_allclose(unit[1], [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1, rtol=1e-6)
