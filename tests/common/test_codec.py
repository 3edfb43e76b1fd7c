from __future__ import annotations

import numpy as np
import pytest

from embedfleet.common.codec import (
    CodecError,
    pack_floats,
    pack_tokens,
    unpack_floats,
    unpack_tokens,
)
from embedfleet.common.proto import embedfleet_pb2 as pb


def test_tokens_round_trip_through_the_wire() -> None:
    seqs = [[101, 7, 102], [101, 102], [5]]
    batch = pb.TokenBatch.FromString(
        pack_tokens(seqs, [[0, 0, 0], [0, 1], [1]]).SerializeToString()
    )
    tokens = unpack_tokens(batch)
    assert tokens.count == 3
    assert tokens.total == 6
    assert [s.tolist() for s in tokens.sequences()] == seqs
    assert tokens.type_ids is not None
    assert tokens.type_ids.tolist() == [0, 0, 0, 0, 1, 1]
    assert tokens.key_lengths is None


def test_key_lengths_round_trip_and_are_bounded_by_their_sequence() -> None:
    seqs = [[101, 7, 102, 9], [101, 102], []]
    tokens = unpack_tokens(pack_tokens(seqs, key_lengths=[3, 2, 0]))
    assert tokens.key_lengths is not None
    assert tokens.key_lengths.tolist() == [3, 2, 0]
    for keys in ([5, 2, 0], [0, 2, 0], [3, 2, 1], [3, 2]):
        with pytest.raises(CodecError):
            unpack_tokens(pack_tokens(seqs, key_lengths=keys))


@pytest.mark.parametrize(
    "batch",
    [
        pb.TokenBatch(token_ids=b"\x01\x00\x00", lengths=b"\x01\x00\x00\x00"),
        pb.TokenBatch(token_ids=b"\x01\x00\x00\x00", lengths=np.array([2], "<i4").tobytes()),
        pb.TokenBatch(token_ids=b"", lengths=np.array([-1, 1], "<i4").tobytes()),
        pb.TokenBatch(
            token_ids=np.array([1, 2], "<i4").tobytes(),
            lengths=np.array([2], "<i4").tobytes(),
            token_type_ids=b"\x00",
        ),
    ],
    ids=["odd-bytes", "lengths-mismatch", "negative-length", "type-ids-mismatch"],
)
def test_malformed_batches_are_rejected(batch: pb.TokenBatch) -> None:
    with pytest.raises(CodecError):
        unpack_tokens(batch)


@pytest.mark.parametrize("fmt", [pb.FLOAT_FORMAT_FLOAT32, pb.FLOAT_FORMAT_FLOAT16])
def test_floats_round_trip(fmt: int) -> None:
    values = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    back = unpack_floats(pack_floats(values, fmt), 3, 4, fmt)
    np.testing.assert_allclose(back, values, atol=1e-3)
    with pytest.raises(CodecError):
        unpack_floats(pack_floats(values, fmt), 4, 4, fmt)


def test_sparse_rows_decode_and_malformed_ones_are_refused() -> None:
    from embedfleet.common.codec import unpack_sparse

    offsets = np.array([0, 2, 2, 3], "<i4").tobytes()
    indices = np.array([4, 9, 1], "<i4").tobytes()
    values = np.array([0.5, 1.5, 2.0], "<f4").tobytes()
    rows = unpack_sparse(offsets, indices, values, 3)
    assert [r[0].tolist() for r in rows] == [[4, 9], [], [1]]
    assert [r[1].tolist() for r in rows] == [[0.5, 1.5], [], [2.0]]
    with pytest.raises(CodecError, match="offsets for 2 rows"):
        unpack_sparse(offsets, indices, values, 2)
    with pytest.raises(CodecError, match="do not cover"):
        unpack_sparse(np.array([0, 3, 2, 3], "<i4").tobytes(), indices, values, 3)
    with pytest.raises(CodecError, match="2 values"):
        unpack_sparse(offsets, indices, values[:8], 3)
