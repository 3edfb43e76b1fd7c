"""The agreement measure between two runs of the same inputs, shared by the worker's self-check,
the engine tests and the benchmarks' fidelity checks."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def min_cosine(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """The smallest row-wise cosine between two [..., H] arrays, computed in float64.

    A zero row counts as cosine 0 (fully disagreeing) rather than NaN, so it fails any bar.
    """
    x = np.asarray(a, np.float64)
    y = np.asarray(b, np.float64)
    num = (x * y).sum(-1)
    den = np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1)
    return float((num / np.maximum(den, 1e-30)).min())
