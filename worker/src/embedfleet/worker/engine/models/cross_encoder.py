"""BERT cross-encoders (BertForSequenceClassification with one label): a relevance logit per pair.

The encoder is the BERT family's; the head is the pooler (dense + tanh on the first token) and a
one-output classifier.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the universal alias

from embedfleet.common.modeldir import ModelDirError
from embedfleet.worker.engine.attention import AttentionPlan
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.models.bert import BertEncoder, bert_tensors
from embedfleet.worker.engine.weights import Tensors, WeightReader


class CrossEncoder:
    def __init__(self, config: dict[str, Any], reader: WeightReader) -> None:
        self.encoder = BertEncoder(config, reader)
        self.shape = self.encoder.shape
        self.pool_w = reader.get("pooler.dense.weight")
        self.pool_b = reader.get("pooler.dense.bias")
        self.cls_w = reader.get("classifier.weight")
        self.cls_b = reader.get("classifier.bias")
        if self.cls_w.shape[0] != 1:
            raise ModelDirError(
                f"cross-encoders must give one logit; this head has {self.cls_w.shape[0]} labels"
            )

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        return self.encoder.forward(batch, plan)

    def score(self, hidden: torch.Tensor, batch: DeviceBatch) -> torch.Tensor | None:
        first = hidden.index_select(0, batch.first)  # [N, H]
        pooled = torch.tanh(F.linear(first, self.pool_w, self.pool_b))
        return F.linear(pooled, self.cls_w, self.cls_b)[:, 0].float()


def load_cross_encoder(
    config: dict[str, Any], tensors: Tensors, dtype: torch.dtype, device: torch.device
) -> CrossEncoder:
    # The classifier sits outside the "bert." prefix; strip_prefix leaves unprefixed names alone.
    return CrossEncoder(config, WeightReader(bert_tensors(tensors), dtype, device))
