"""Reused host staging buffers (finding 6), with the same bookkeeping as on CUDA but unpinned."""

from __future__ import annotations

import numpy as np
import torch

from embedfleet.common.codec import Tokens
from embedfleet.worker.engine.batch import HostBatch, pack
from embedfleet.worker.engine.staging import HostOutputs, Staging, packed_bytes, packed_views


def _host(lengths: list[int], seed: int) -> HostBatch:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 1000, sum(lengths)).astype(np.int32)
    return pack([Tokens(ids, np.asarray(lengths, np.int32))], 0, 128, 8, 64)


def test_staging_reuses_the_same_buffers_in_turn_and_holds_each_batch() -> None:
    staging = Staging(max_tokens=256, max_sequences=16, pin=False)
    seen = []
    for turn in range(6):
        host = _host([5, 30, 17][: 1 + turn % 3], seed=turn)
        staged = staging.stage(host)
        # One contiguous prefix: a single copy carries the whole batch to the device.
        assert staged.is_contiguous()
        assert staged.numel() == packed_bytes(host.total_tokens, host.sequences)
        tokens, seqs, cu = packed_views(staged, host.total_tokens, host.sequences)
        np.testing.assert_array_equal(tokens.numpy(), host.tokens)
        np.testing.assert_array_equal(seqs.numpy(), host.seqs)
        np.testing.assert_array_equal(cu.numpy(), host.cu_seqlens)
        assert all(v.is_contiguous() for v in (tokens, seqs, cu))
        seen.append(staged.data_ptr())
        staging.copied()
    # Two sets used alternately: no allocation per batch.
    assert len(set(seen)) == 2
    assert seen[0] == seen[2] == seen[4]
    assert staging.buffer(0).data_ptr() == seen[0]


def test_packed_views_of_a_static_buffer_are_contiguous_for_every_bucket() -> None:
    # Issue 36 finding 3: a bucket's inputs were the leading columns of [4, max_tokens] rows,
    # filled by strided copies; packed, every bucket's views are contiguous byte ranges of the
    # one static buffer, at offsets its int64 rows can be read at.
    static = torch.zeros(packed_bytes(1024, 64), dtype=torch.uint8)
    for t, n in ((64, 2), (80, 65), (1024, 64)):
        views = packed_views(static, t, n)
        assert [tuple(v.shape) for v in views] == [(4, t), (3, n), (n + 1,)]
        assert all(v.is_contiguous() for v in views)
        ends = [v.data_ptr() - static.data_ptr() + v.numel() * v.element_size() for v in views]
        assert ends[-1] == packed_bytes(t, n)
        assert all(v.data_ptr() % 8 == 0 for v in views[:2])


def test_host_outputs_hand_back_buffers_for_the_next_batches() -> None:
    outputs = HostOutputs(pin=False)
    view, buf = outputs.take((10, 384))
    assert tuple(view.shape) == (10, 384)
    outputs.give_back(buf)
    again, buf2 = outputs.take((7, 384))
    assert buf2.data_ptr() == buf.data_ptr()
    assert again.data_ptr() == view.data_ptr()
    bigger, buf3 = outputs.take((512, 1024))  # does not fit: a new one, while buf2 is out
    assert buf3.data_ptr() != buf2.data_ptr()
    assert bigger.numel() == 512 * 1024
    assert outputs.allocated == 2
    for _ in range(20):
        outputs.give_back(buf3)
    assert outputs.free == HostOutputs.KEEP
