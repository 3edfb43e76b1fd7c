"""Sequence-classification heads on the BERT-family encoder: cross-encoders (one label, a
relevance logit per pair) and classifiers (one logit per config.id2label entry).

Two head layouts, as transformers saves them: BERT's pooler (dense + tanh on the first token) then
`classifier`; RoBERTa/XLM-R's `classifier.dense` + tanh on the first token then
`classifier.out_proj` (bge-reranker-base and -v2-m3 are XLMRobertaForSequenceClassification).
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


class SequenceClassifier:
    def __init__(self, config: dict[str, Any], reader: WeightReader, one_logit: bool) -> None:
        self.encoder = BertEncoder(config, reader)
        self.shape = self.encoder.shape
        if reader.has("classifier.out_proj.weight"):  # RoBERTa layout
            self.pool_w = reader.get("classifier.dense.weight")
            self.pool_b = reader.get("classifier.dense.bias")
            self.cls_w = reader.get("classifier.out_proj.weight")
            self.cls_b = reader.get("classifier.out_proj.bias")
        else:
            self.pool_w = reader.get("pooler.dense.weight")
            self.pool_b = reader.get("pooler.dense.bias")
            self.cls_w = reader.get("classifier.weight")
            self.cls_b = reader.get("classifier.bias")
        self.labels = int(self.cls_w.shape[0])
        #: cross-encoders answer [N] scores, not [N, 1]
        self.one_logit = one_logit
        if one_logit and self.labels != 1:
            raise ModelDirError(
                f"cross-encoders must give one logit; this head has {self.labels} labels"
            )

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        return self.encoder.forward(batch, plan)

    def head(self, hidden: torch.Tensor, batch: DeviceBatch) -> torch.Tensor | None:
        first = hidden.index_select(0, batch.first)  # [N, H]
        pooled = torch.tanh(F.linear(first, self.pool_w, self.pool_b))
        logits = F.linear(pooled, self.cls_w, self.cls_b).float()  # [N, labels]
        return logits[:, 0] if self.one_logit else logits


def load_classifier(
    config: dict[str, Any],
    tensors: Tensors,
    dtype: torch.dtype,
    device: torch.device,
    one_logit: bool,
    labels: int,
) -> SequenceClassifier:
    # The classifier sits outside the "bert." prefix; strip_prefix leaves unprefixed names alone.
    model = SequenceClassifier(
        config, WeightReader(bert_tensors(tensors), dtype, device), one_logit
    )
    if model.labels != labels:
        raise ModelDirError(
            f"config.json names {labels} labels but the classifier has {model.labels} outputs"
        )
    return model
