"""A ragged batch: every sequence packed into one token axis, with the indices models need.

No padding between sequences and no [batch, max_len] layout: a sequence is the half-open token range
cu_seqlens[i]:cu_seqlens[i+1]. When the batch is padded up to a graph bucket the extra tokens form
extra sequences of at most `pad_len` tokens each (and the remaining slots are empty sequences), so
they attend only to themselves, never touch a real result, and never make a sequence longer than
the attention's launch length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from embedfleet.common.codec import Tokens

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class HostBatch:
    """The packed batch as numpy arrays (built on the CPU, before any device copy)."""

    #: [4, T] rows: input ids, token type ids, position ids, sequence index
    tokens: I64
    #: [3, N] rows: first token, last token, length (at least 1, for mean pooling)
    seqs: I64
    #: [N + 1] int32 offsets
    cu_seqlens: npt.NDArray[np.int32]
    #: real lengths (zero for padding slots), for planning attention on the host
    lengths: I64
    real_tokens: int
    real_sequences: int
    #: [N] each slot's leading tokens that are attention keys; None when every token is one
    #: (then no plan does any masking work for it)
    keys: I64 | None = None

    @property
    def total_tokens(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def sequences(self) -> int:
        return int(self.seqs.shape[1])


def pack(
    parts: list[Tokens],
    position_offset: int = 0,
    bucket_tokens: int = 0,
    bucket_sequences: int = 0,
    pad_len: int = 0,
) -> HostBatch:
    """Concatenate the items' sequences; optionally pad to (bucket_tokens, bucket_sequences),
    the padding cut into sequences of at most `pad_len` tokens (0: one padding sequence)."""
    ids = np.concatenate([p.ids for p in parts]).astype(np.int64)
    lengths = np.concatenate([p.lengths for p in parts]).astype(np.int64)
    types = np.concatenate(
        [p.type_ids if p.type_ids is not None else np.zeros(p.total, np.uint8) for p in parts]
    ).astype(np.int64)
    real_tokens, real_seqs = int(ids.shape[0]), int(lengths.shape[0])
    total = max(bucket_tokens, real_tokens)
    slots = max(bucket_sequences, real_seqs)
    if total > real_tokens:
        pad = total - real_tokens
        chunks = padding_lengths(pad, pad_len or pad)
        if slots < real_seqs + len(chunks):
            raise ValueError(f"{pad} padding tokens need {len(chunks)} spare sequence slots")
        ids = np.concatenate([ids, np.zeros(pad, np.int64)])
        types = np.concatenate([types, np.zeros(pad, np.int64)])
        spare = np.zeros(slots - real_seqs - len(chunks), np.int64)
        lengths = np.concatenate([lengths, np.asarray(chunks, np.int64), spare])
    elif slots > real_seqs:
        lengths = np.concatenate([lengths, np.zeros(slots - real_seqs, np.int64)])
    keys = _key_lengths(parts, lengths)
    cu = np.zeros(slots + 1, np.int64)
    np.cumsum(lengths, out=cu[1:])
    starts = cu[:-1]
    seq_index = np.repeat(np.arange(slots, dtype=np.int64), lengths)
    positions = np.arange(total, dtype=np.int64) - starts[seq_index] + position_offset
    if total > real_tokens:
        # Padding positions only need to be valid indices; results there are never read.
        positions[real_tokens:] = position_offset
    tokens = np.stack([ids, types, positions, seq_index])
    last = np.maximum(cu[1:] - 1, 0)
    first = np.minimum(starts, max(total - 1, 0))
    seqs = np.stack([first, last, np.maximum(lengths, 1)])
    return HostBatch(
        tokens=tokens,
        seqs=seqs,
        cu_seqlens=cu.astype(np.int32),
        lengths=lengths,
        real_tokens=real_tokens,
        real_sequences=real_seqs,
        keys=keys,
    )


def _key_lengths(parts: list[Tokens], lengths: I64) -> I64 | None:
    """Every slot's key length (`lengths` padded to the slots) where some sequence has fewer
    keys than tokens, else None."""
    if all(p.key_lengths is None for p in parts):
        return None
    real = np.concatenate([p.lengths if p.key_lengths is None else p.key_lengths for p in parts])
    if (real == lengths[: real.shape[0]]).all():
        return None
    return np.concatenate([real.astype(np.int64), lengths[real.shape[0] :]])


def padding_lengths(pad: int, pad_len: int) -> list[int]:
    """`pad` tokens as sequences of at most `pad_len` tokens, longest first."""
    full, rest = divmod(pad, pad_len)
    return [pad_len] * full + ([rest] if rest else [])


@dataclass(frozen=True, slots=True)
class DeviceBatch:
    """The packed batch on the device; what a model's forward reads."""

    input_ids: torch.Tensor  # [T] int64
    type_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    seq_index: torch.Tensor  # [T] int64
    first: torch.Tensor  # [N] int64
    last: torch.Tensor  # [N] int64
    lengths: torch.Tensor  # [N] int64, at least 1
    cu_seqlens: torch.Tensor  # [N + 1] int32


def to_device(host: HostBatch, device: torch.device) -> DeviceBatch:
    """One host-to-device copy per array group; pinned and non-blocking on CUDA (the engine
    stages CUDA batches through reused pinned buffers instead: `staging.Staging`)."""
    cuda = device.type == "cuda"
    tokens = torch.from_numpy(host.tokens)
    seqs = torch.from_numpy(host.seqs)
    cu = torch.from_numpy(host.cu_seqlens)
    if cuda:
        tokens, seqs, cu = tokens.pin_memory(), seqs.pin_memory(), cu.pin_memory()
    tokens = tokens.to(device, non_blocking=cuda)
    seqs = seqs.to(device, non_blocking=cuda)
    cu = cu.to(device, non_blocking=cuda)
    return from_tensors(tokens, seqs, cu)


def from_tensors(tokens: torch.Tensor, seqs: torch.Tensor, cu: torch.Tensor) -> DeviceBatch:
    return DeviceBatch(
        input_ids=tokens[0],
        type_ids=tokens[1],
        positions=tokens[2],
        seq_index=tokens[3],
        first=seqs[0],
        last=seqs[1],
        lengths=seqs[2],
        cu_seqlens=cu,
    )
