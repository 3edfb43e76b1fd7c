"""MPNet (all-mpnet-base-v2, multi-qa-mpnet-*) over a ragged batch.

BERT's post-norm encoder with RoBERTa-style positions (ids start at 2), no segment embeddings, and
a learned bias per head and relative-position bucket added to every attention score: T5's
bidirectional buckets (half per direction; the first half of each exact, the rest log-spaced up
to 128 positions apart). The weights are mapped to BERT's names at load; the bias rides in the
attention plan (`plan.biased`), which only the grouped and padded plans offer (the mask costs
[heads, L, L] scores per sequence of a group, and no CUDA graph is captured: attention.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the universal alias

from embedfleet.worker.engine.attention import AttentionPlan
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.models.bert import BertEncoder
from embedfleet.worker.engine.weights import Tensors, WeightReader, renamed, strip_prefix

#: MPNet's parts -> BERT's (applied in order to each tensor name)
_NAMES = (
    (".attention.attn.q.", ".attention.self.query."),
    (".attention.attn.k.", ".attention.self.key."),
    (".attention.attn.v.", ".attention.self.value."),
    (".attention.attn.o.", ".attention.output.dense."),
    (".attention.LayerNorm.", ".attention.output.LayerNorm."),
)

#: the reference buckets with these whatever config.relative_attention_num_buckets says
BUCKETS = 32
MAX_DISTANCE = 128


def relative_buckets(relative: torch.Tensor) -> torch.Tensor:
    """[Lq, Lk] key - query positions -> bucket ids in [0, BUCKETS)."""
    half = BUCKETS // 2
    distance = -relative
    bucket = (distance < 0).long() * half  # keys after the query use the upper half
    distance = distance.abs()
    exact = half // 2
    # log(distance) only where it is read (distance >= exact): no log(0) to trace.
    far = distance.clamp(min=exact).float() / exact
    spread = torch.log(far) / math.log(MAX_DISTANCE / exact) * (half - exact)
    logarithmic = (exact + spread.long()).clamp(max=half - 1)
    return bucket + torch.where(distance < exact, distance, logarithmic)


@dataclass(frozen=True, slots=True)
class RelativeBias:
    """An `attention.PositionBias`: the learned score of each relative-position bucket."""

    table: torch.Tensor  # [BUCKETS, heads]

    def __call__(self, relative: torch.Tensor) -> torch.Tensor:
        return F.embedding(relative_buckets(relative), self.table).permute(2, 0, 1)


class MPNetEncoder(BertEncoder):
    def __init__(self, config: dict[str, Any], reader: WeightReader) -> None:
        super().__init__(config, reader)
        self.bias = RelativeBias(reader.get("encoder.relative_attention_bias.weight"))
        self.shape = dataclasses.replace(self.shape, attention_features=frozenset(["bias"]))

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        # One bias for every layer: the plan folds it into its masks once per forward.
        return super().forward(batch, plan.biased(self.bias))


def load_mpnet(
    config: dict[str, Any], tensors: Tensors, dtype: torch.dtype, device: torch.device
) -> MPNetEncoder:
    bert_named = renamed(strip_prefix(tensors, ("mpnet.",)), _NAMES)
    return MPNetEncoder(config, WeightReader(bert_named, dtype, device))
