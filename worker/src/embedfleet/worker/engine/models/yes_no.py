"""Qwen3-Reranker: a causal LM whose relevance score is its next-token P("yes") against "no".

The gateway renders each pair in the model's judging prompt (common.judge_prompt); the score is
softmax([logit_no, logit_yes])[1] at the last position, which is sigmoid(logit_yes - logit_no). So
the head is one vector, lm_head["yes"] - lm_head["no"], dotted with the last hidden state: the
[tokens, vocab] projection a causal LM would make is never computed. The raw score (activate off)
is that logit difference, the same contract as a one-logit cross-encoder.
"""

from __future__ import annotations

from typing import Any

import torch

from embedfleet.worker.engine.attention import AttentionPlan
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.models.llama import llama_decoder
from embedfleet.worker.engine.weights import Tensors, WeightReader, strip_prefix


class YesNoReranker:
    def __init__(self, config: dict[str, Any], reader: WeightReader, yes: int, no: int) -> None:
        self.encoder = llama_decoder(config, reader, bidirectional=False)
        self.shape = self.encoder.shape
        # Untied checkpoints (Qwen3-Reranker-8B) have their own lm_head; tied ones (0.6B) reuse
        # the input embeddings.
        name = "lm_head.weight" if reader.has("lm_head.weight") else "embed_tokens.weight"
        rows = reader.raw(name)
        direction = rows[yes].float() - rows[no].float()  # [H]: float32 whatever the dtype
        self.direction = direction.to(self.encoder.embed.device)

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        return self.encoder.forward(batch, plan)

    def head(self, hidden: torch.Tensor, batch: DeviceBatch) -> torch.Tensor | None:
        last = hidden.index_select(0, batch.last).float()  # [N, H]
        return last @ self.direction  # [N]: logit_yes - logit_no


def load_yes_no(
    config: dict[str, Any],
    tensors: Tensors,
    dtype: torch.dtype,
    device: torch.device,
    yes: int,
    no: int,
) -> YesNoReranker:
    reader = WeightReader(strip_prefix(tensors, ("model.",)), dtype, device)
    return YesNoReranker(config, reader, yes, no)
