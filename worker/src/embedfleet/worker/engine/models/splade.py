"""SPLADE: a BERT-family masked-LM head, max-pooled as log(1 + ReLU(logits)) per vocabulary id.

The head is transformers' (BertForMaskedLM `cls.predictions`: dense, activation, LayerNorm, then
the decoder tied to the word embeddings; RobertaForMaskedLM `lm_head`: the same with GELU). Only
real tokens of a sequence reach its row (the batch is ragged), which is the attention-mask rule of
the reference. The [tokens, vocab] logits are made a slice of tokens at a time, so a full batch
never holds them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the universal alias

from embedfleet.worker.engine.attention import AttentionPlan
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.models.bert import BertEncoder, LayerNorm, activation, bert_tensors
from embedfleet.worker.engine.weights import Tensors, WeightReader

#: tokens per slice of the vocabulary projection: 2048 x 30522 float32 is 250 MB
TOKEN_SLICE = 2048


class Splade:
    def __init__(self, config: dict[str, Any], reader: WeightReader) -> None:
        self.encoder = BertEncoder(config, reader)
        self.shape = self.encoder.shape
        eps = float(config.get("layer_norm_eps", 1e-12))
        self.act: Callable[[torch.Tensor], torch.Tensor]
        if reader.has("lm_head.dense.weight"):  # RoBERTa layout
            p = "lm_head."
            self.dense_w, self.dense_b = (
                reader.get(p + "dense.weight"),
                reader.get(p + "dense.bias"),
            )
            self.norm = LayerNorm(reader.get(p + "layer_norm.weight"),
                                  reader.get(p + "layer_norm.bias"), eps)  # fmt: skip
            self.act = F.gelu
            decoder, bias = p + "decoder.weight", (p + "bias", p + "decoder.bias")
        else:
            p = "cls.predictions."
            t = p + "transform."
            self.dense_w, self.dense_b = (
                reader.get(t + "dense.weight"),
                reader.get(t + "dense.bias"),
            )
            self.norm = LayerNorm(reader.get(t + "LayerNorm.weight"),
                                  reader.get(t + "LayerNorm.bias"), eps)  # fmt: skip
            self.act = activation(str(config.get("hidden_act", "gelu")))
            decoder, bias = p + "decoder.weight", (p + "bias", p + "decoder.bias")
        # Tied to the word embeddings, so save_pretrained usually stores it only there.
        tied = reader.optional(decoder)
        self.decoder_w = tied if tied is not None else self.encoder.word
        found = [reader.optional(name) for name in bias]
        self.decoder_b = next((b for b in found if b is not None), None)

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        return self.encoder.forward(batch, plan)

    def head(self, hidden: torch.Tensor, batch: DeviceBatch) -> torch.Tensor | None:
        slots, vocab = batch.lengths.shape[0], self.decoder_w.shape[0]
        out = hidden.new_zeros((slots, vocab), dtype=torch.float32)  # weights are >= 0
        for start in range(0, hidden.shape[0], TOKEN_SLICE):
            h = hidden[start : start + TOKEN_SLICE]
            h = self.norm(self.act(F.linear(h, self.dense_w, self.dense_b)))
            logits = F.linear(h, self.decoder_w, self.decoder_b)  # [t, vocab]
            weights = torch.log1p(torch.relu(logits.float()))
            rows = batch.seq_index[start : start + TOKEN_SLICE]
            index = rows.unsqueeze(1).expand(-1, vocab)
            out.scatter_reduce_(0, index, weights, "amax", include_self=True)
        return out


def load_splade(
    config: dict[str, Any], tensors: Tensors, dtype: torch.dtype, device: torch.device
) -> Splade:
    return Splade(config, WeightReader(bert_tensors(tensors), dtype, device))
