"""Attention over a ragged batch as one padded [B, L] block: the layout a compiled CPU graph takes.

The grouped backend (`attention.GroupedBackend`) plans on the host per batch and runs a Python loop
over length groups, which a traced or compiled graph cannot hold. Here the plan is three tensors
made on the host (`padded_layout`) and fed to the graph as inputs: every layer gathers the packed
q, k, v into [B, L] by `gather`, runs one SDPA with the key mask `valid`, and reads each packed
token's row back by `inverse`. The GEMMs still run on the packed [T, H] tokens, so padding costs
only attention work, and the graph's shapes follow (T, B, L) alone: dynamic dimensions, not one
graph per batch structure.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F  # noqa: N812 - the universal alias

from embedfleet.worker.engine.attention import (
    AttentionPlan,
    PositionBias,
    relative_positions,
    visible,
)

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class PaddedLayout:
    #: [B * L] packed token index of each padded slot; slots past a sequence's end read its
    #: first token (the key mask, or causality, hides them)
    gather: I64
    #: [T] padded slot of each packed token
    inverse: I64
    #: [B, L] True where a slot holds a real token of its sequence
    valid: npt.NDArray[np.bool_]
    #: [B, L] True where a slot is a key: `valid`, or the first `keys` tokens when given
    keys: npt.NDArray[np.bool_]


def padded_layout(lengths: I64, keys: I64 | None = None) -> PaddedLayout:
    """The [B, L] block for sequences of `lengths` (packed one after another; empty ones, the
    spare slots of a bucket, are left out); `keys`: each sequence's leading tokens that are keys
    (None: all)."""
    lengths = np.asarray(lengths, np.int64)
    starts = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    keep = lengths > 0
    lens, first = lengths[keep], starts[:-1][keep]
    width = int(lens.max()) if lens.size else 1
    offsets = np.arange(width, dtype=np.int64)
    valid = offsets[None, :] < lens[:, None]
    gather = first[:, None] + np.where(valid, offsets[None, :], 0)
    inverse = np.flatnonzero(valid.ravel()).astype(np.int64)
    seen = valid if keys is None else offsets[None, :] < np.asarray(keys, np.int64)[keep, None]
    return PaddedLayout(gather.ravel(), inverse, valid, seen)


@dataclass(frozen=True, slots=True)
class PaddedPlan:
    """An `attention.AttentionPlan` made of tensors only: traceable, no host work per layer.

    `mask` is [B, 1, 1, L] (True where a key is real, or in a sequence's key prefix); causal
    attention ignores it, as right padding is never seen by a real query (the engine runs a
    causal model's batch with key lengths eager). A windowed or biased plan carries its combined
    mask in `scores` (made once per forward: [B, 1, L, L] bool, or [B, H, L, L] additive scores).
    """

    gather: torch.Tensor
    inverse: torch.Tensor
    mask: torch.Tensor
    causal: bool
    window: int = -1
    bias: PositionBias | None = None
    scores: torch.Tensor | None = None

    def windowed(self, window: int) -> AttentionPlan:
        return self._derived(window, self.bias)

    def biased(self, bias: PositionBias) -> AttentionPlan:
        return self._derived(self.window, bias)

    def _derived(self, window: int, bias: PositionBias | None) -> PaddedPlan:
        # The block's width is a dynamic dimension of the traced graph: read it from the mask.
        relative = relative_positions(self.mask.shape[-1], self.mask.device)
        seen = visible(relative, window, self.causal)[None, None] & self.mask
        scores = seen
        if bias is not None:
            scores = bias(relative)[None].masked_fill(~seen, float("-inf"))
        return dataclasses.replace(self, window=window, bias=bias, scores=scores)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch = self.mask.shape[0]
        # Head counts are the model's, fixed: plain ints even while tracing.
        gqa = int(q.shape[1]) != int(k.shape[1])

        def block(x: torch.Tensor) -> torch.Tensor:  # [T, h, d] -> [B, h, L, d]
            return x.index_select(0, self.gather).view(batch, -1, *x.shape[1:]).transpose(1, 2)

        mask: torch.Tensor | None = None if self.causal else self.mask
        causal = self.causal
        if self.scores is not None:  # the window's or bias's mask holds causality too
            mask, causal = self.scores, False
        out = F.scaled_dot_product_attention(
            block(q), block(k), block(v), attn_mask=mask, is_causal=causal, enable_gqa=gqa
        )
        return out.transpose(1, 2).flatten(0, 1).index_select(0, self.inverse)


def plan_tensors(layout: PaddedLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gather, inverse, mask [B, 1, 1, L]) as CPU tensors over the layout's arrays."""
    return (
        torch.from_numpy(layout.gather),
        torch.from_numpy(layout.inverse),
        torch.from_numpy(layout.keys[:, None, None, :]),
    )
