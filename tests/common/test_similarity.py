"""The one agreement measure: row-wise cosine, its minimum, and zero rows failing every bar."""

from __future__ import annotations

import numpy as np
import pytest

from embedfleet.common.similarity import min_cosine


def test_min_cosine_is_the_worst_row() -> None:
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], np.float32)
    b = np.array([[2.0, 0.0], [1.0, 1.0], [1.0, 1.0]], np.float32)
    assert min_cosine(a, b) == pytest.approx(np.sqrt(0.5))
    assert min_cosine(a, 3 * a) == pytest.approx(1.0)


def test_min_cosine_of_vectors_and_opposites() -> None:
    v = np.array([0.3, -0.2, 0.9])
    assert min_cosine(v, v) == pytest.approx(1.0)
    assert min_cosine(v, -v) == pytest.approx(-1.0)


def test_a_zero_row_disagrees_instead_of_giving_nan() -> None:
    a = np.array([[1.0, 0.0], [0.0, 0.0]])
    assert min_cosine(a, np.ones((2, 2))) == 0.0
