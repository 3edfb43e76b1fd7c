"""Which family module serves a model directory."""

from __future__ import annotations

import torch

from embedfleet.common.modeldir import ModelDir, ModelDirError
from embedfleet.worker.engine.models import Model
from embedfleet.worker.engine.models.bert import ROBERTA_TYPES, load_bert
from embedfleet.worker.engine.models.cross_encoder import load_cross_encoder
from embedfleet.worker.engine.models.qwen3 import load_qwen3
from embedfleet.worker.engine.weights import load_tensors

BERT_TYPES = ("bert", *ROBERTA_TYPES)
QWEN_TYPES = ("qwen3",)


def load_model(
    model_dir: ModelDir,
    dtype: torch.dtype,
    device: torch.device,
    bidirectional: bool | None = None,
) -> Model:
    tensors = load_tensors(model_dir.path)
    kind = model_dir.model_type
    if model_dir.task == "score":
        if kind not in BERT_TYPES:
            raise ModelDirError(f"cross-encoders of type {kind!r} are not supported")
        return load_cross_encoder(model_dir.config, tensors, dtype, device)
    if kind in BERT_TYPES:
        return load_bert(model_dir.config, tensors, dtype, device)
    if kind in QWEN_TYPES:
        return load_qwen3(model_dir.config, tensors, dtype, device, bidirectional)
    raise ModelDirError(f"model type {kind!r} is not supported (bert-style, qwen3)")
