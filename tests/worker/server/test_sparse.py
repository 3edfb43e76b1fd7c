"""Dense SPLADE rows to the SparseEmbed reply's sparse form (`sparse.sparsify`)."""

from __future__ import annotations

import numpy as np

from embedfleet.worker.sparse import sparsify


def test_every_nonzero_entry_ascending_by_default() -> None:
    rows = np.array([[0.0, 2.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [3.0, 0.0, 0.5, 0.0]], np.float32)
    out = sparsify(rows)
    assert out.offsets.tolist() == [0, 2, 2, 4]
    assert out.indices.tolist() == [1, 3, 0, 2]
    assert out.values.tolist() == [2.0, 1.0, 3.0, 0.5]
    assert (out.offsets.dtype, out.indices.dtype, out.values.dtype) == (
        np.int32, np.int32, np.float32,
    )  # fmt: skip


def test_top_k_keeps_the_largest_and_threshold_drops_the_small() -> None:
    rng = np.random.default_rng(0)
    rows = np.maximum(rng.normal(size=(3, 50)), 0).astype(np.float32)
    top = sparsify(rows, top_k=4)
    for i, row in enumerate(rows):
        kept = top.indices[top.offsets[i] : top.offsets[i + 1]]
        assert kept.tolist() == sorted(np.argsort(-row)[:4].tolist())
        np.testing.assert_array_equal(top.values[top.offsets[i] : top.offsets[i + 1]], row[kept])
    over = sparsify(rows, threshold=1.0)
    assert over.indices[over.offsets[0] : over.offsets[1]].tolist() == (
        np.flatnonzero(rows[0] > 1.0).tolist()
    )
    # top_k larger than what the threshold leaves keeps all of that.
    both = sparsify(rows, top_k=49, threshold=1.0)
    assert both.offsets.tolist() == over.offsets.tolist()


def test_no_rows() -> None:
    out = sparsify(np.zeros((0, 7), np.float32))
    assert out.offsets.tolist() == [0]
    assert out.indices.size == out.values.size == 0
