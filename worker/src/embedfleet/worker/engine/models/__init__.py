"""Model families: each module turns a checkpoint into a ragged-batch forward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from embedfleet.worker.engine.attention import AttentionPlan, Feature
from embedfleet.worker.engine.batch import DeviceBatch


@dataclass(frozen=True, slots=True)
class Shape:
    """What the engine needs to know about a loaded model to validate and pack inputs."""

    hidden_size: int
    vocab_size: int
    #: token type (segment) ids accepted; 1 for models without segment embeddings
    type_vocab_size: int
    #: attention is causal within each sequence
    causal: bool
    #: added to 0-based positions (RoBERTa-style models start after the padding index)
    position_offset: int = 0
    #: what its attention needs beyond full attention within a sequence (attention.Feature):
    #: only backends offering it are chosen
    attention_features: frozenset[Feature] = frozenset()


class Model(Protocol):
    shape: Shape

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        """Packed hidden states [T, hidden] (compute dtype) for the batch's tokens."""
        ...

    def head(self, hidden: torch.Tensor, batch: DeviceBatch) -> torch.Tensor | None:
        """The model's own head per sequence slot, float32: [N] relevance logits (score), [N, K]
        class logits (classify), [N, vocab] SPLADE or lexical weights (sparse), or per packed
        token [T, D] unit vectors (multivector); None for embedders, which are pooled instead."""
        ...
