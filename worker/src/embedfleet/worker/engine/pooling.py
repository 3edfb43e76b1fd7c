"""From per-token hidden states to one vector per sequence; then Matryoshka truncation and L2 norm.

All in float32 whatever the compute dtype, and without host syncs, so it can sit inside a graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - the universal alias

from embedfleet.common.modeldir import Pooling
from embedfleet.worker.engine.batch import DeviceBatch


def pool(hidden: torch.Tensor, batch: DeviceBatch, mode: Pooling) -> torch.Tensor:
    """hidden [T, H] -> [N, H] float32 for the batch's N sequence slots."""
    if mode == "cls":
        return hidden.index_select(0, batch.first).float()
    if mode == "last_token":
        return hidden.index_select(0, batch.last).float()
    if mode == "mean":
        slots = batch.lengths.shape[0]
        sums = hidden.new_zeros((slots, hidden.shape[1]), dtype=torch.float32)
        sums.index_add_(0, batch.seq_index, hidden.float())
        return sums / batch.lengths.unsqueeze(1).float()
    raise ValueError(f"unknown pooling {mode!r}")


def finish(vectors: torch.Tensor, dimensions: int, normalize: bool) -> torch.Tensor:
    """Truncate to the first `dimensions` (0 keeps all), then L2-normalize if asked."""
    if 0 < dimensions < vectors.shape[-1]:
        vectors = vectors[..., :dimensions]
    if normalize:
        vectors = F.normalize(vectors, p=2.0, dim=-1)
    return vectors
