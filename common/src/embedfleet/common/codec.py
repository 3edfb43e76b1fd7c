"""Packing of token batches and float arrays into the protocol's little-endian byte fields.

Both sides use numpy views, so decoding is a zero-copy `frombuffer` rather than a per-element loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from embedfleet.common.arrays import FloatArray
from embedfleet.common.proto import embedfleet_pb2 as pb

_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")
_F16 = np.dtype("<f2")
_U8 = np.dtype("u1")
_U32 = np.dtype("<u4")

FLOAT_DTYPES: dict[int, np.dtype[np.floating]] = {
    pb.FLOAT_FORMAT_FLOAT32: _F32,
    pb.FLOAT_FORMAT_FLOAT16: _F16,
}


class CodecError(ValueError):
    """A packed field is malformed (odd byte count, lengths that don't add up, ...)."""


@dataclass(frozen=True, slots=True)
class Tokens:
    """A decoded batch: flat ids, per-sequence lengths, optional segment ids aligned with ids,
    optional key lengths (each sequence's leading tokens others attend to; None: all)."""

    ids: npt.NDArray[np.int32]
    lengths: npt.NDArray[np.int32]
    type_ids: npt.NDArray[np.uint8] | None = None
    key_lengths: npt.NDArray[np.int32] | None = None

    @property
    def count(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def total(self) -> int:
        return int(self.ids.shape[0])

    def sequences(self) -> list[npt.NDArray[np.int32]]:
        bounds = np.cumsum(self.lengths)[:-1]
        return list(np.split(self.ids, bounds))


def pack_tokens(
    sequences: Sequence[Sequence[int]] | Sequence[npt.NDArray[np.integer]],
    type_ids: Sequence[Sequence[int]] | None = None,
    key_lengths: Sequence[int] | None = None,
) -> pb.TokenBatch:
    lengths = np.fromiter((len(s) for s in sequences), dtype=_I32, count=len(sequences))
    flat = (
        np.concatenate([np.asarray(s, dtype=_I32) for s in sequences])
        if len(sequences)
        else np.zeros(0, _I32)
    )
    batch = pb.TokenBatch(token_ids=flat.tobytes(), lengths=lengths.tobytes())
    if type_ids is not None:
        types_flat = np.concatenate([np.asarray(t, dtype=_U8) for t in type_ids])
        if types_flat.shape != flat.shape:
            raise CodecError("token_type_ids must align with token_ids")
        batch.token_type_ids = types_flat.tobytes()
    if key_lengths is not None:
        batch.key_lengths = np.asarray(key_lengths, _I32).tobytes()
    return batch


def unpack_tokens(batch: pb.TokenBatch) -> Tokens:
    if len(batch.token_ids) % 4 or len(batch.lengths) % 4:
        raise CodecError("token_ids and lengths must be whole little-endian int32 arrays")
    ids = np.frombuffer(batch.token_ids, dtype=_I32)
    lengths = np.frombuffer(batch.lengths, dtype=_I32)
    # One reduction for both checks on the hot path: read unsigned, a negative length is past
    # 2**31, so no sum holding one can match the count of ids a message can carry.
    if int(lengths.view(_U32).sum(dtype=np.uint64)) != ids.size:
        if lengths.size and int(lengths.min()) < 0:
            raise CodecError("sequence lengths must not be negative")
        raise CodecError(f"lengths sum to {int(lengths.sum())} but {ids.size} token ids were sent")
    type_ids = None
    if batch.token_type_ids:
        type_ids = np.frombuffer(batch.token_type_ids, dtype=_U8)
        if type_ids.size != ids.size:
            raise CodecError("token_type_ids must have one entry per token id")
    keys = _key_lengths(batch.key_lengths, lengths) if batch.key_lengths else None
    return Tokens(ids=ids, lengths=lengths, type_ids=type_ids, key_lengths=keys)


def _key_lengths(data: bytes, lengths: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """The key lengths of a batch, each from 1 to its sequence's length (0 when empty): a query
    with no key to attend to would have no defined output."""
    if len(data) % 4:
        raise CodecError("key_lengths must be a whole little-endian int32 array")
    keys = np.frombuffer(data, dtype=_I32)
    if keys.size != lengths.size:
        raise CodecError("key_lengths must have one entry per sequence")
    if ((keys > lengths) | (keys < np.minimum(lengths, 1))).any():
        raise CodecError("each key length must be from 1 to its sequence's length")
    return keys


def pack_floats(array: npt.NDArray[np.floating], fmt: int = pb.FLOAT_FORMAT_FLOAT32) -> bytes:
    return np.ascontiguousarray(array, dtype=FLOAT_DTYPES[fmt]).tobytes()


def unpack_floats(
    data: bytes, rows: int, cols: int, fmt: int = pb.FLOAT_FORMAT_FLOAT32
) -> npt.NDArray[np.floating]:
    dtype = FLOAT_DTYPES[fmt]
    if len(data) != rows * cols * dtype.itemsize:
        raise CodecError(f"expected {rows}x{cols} values of {dtype}, got {len(data)} bytes")
    return np.frombuffer(data, dtype=dtype).reshape(rows, cols)


SparseVector = tuple[npt.NDArray[np.int32], FloatArray]
"""(vocabulary ids ascending, their weights) of one sparse embedding."""


def unpack_sparse(offsets: bytes, indices: bytes, values: bytes, count: int) -> list[SparseVector]:
    """A SparseEmbedResponse's rows: views into its buffers, no copy."""
    bounds = np.frombuffer(offsets, dtype="<i4")
    ids = np.frombuffer(indices, dtype="<i4")
    weights = np.frombuffer(values, dtype="<f4")
    if bounds.shape[0] != count + 1 or ids.shape != weights.shape:
        raise CodecError(
            f"sparse rows: {bounds.shape[0]} offsets for {count} rows, "
            f"{ids.shape[0]} indices and {weights.shape[0]} values"
        )
    if count and (bounds[0] != 0 or bounds[-1] != ids.shape[0] or np.any(np.diff(bounds) < 0)):
        raise CodecError("sparse rows: offsets do not cover the indices in order")
    return [
        (ids[bounds[i] : bounds[i + 1]].astype(np.int32, copy=False),
         weights[bounds[i] : bounds[i + 1]].astype(np.float32, copy=False))
        for i in range(count)
    ]  # fmt: skip
