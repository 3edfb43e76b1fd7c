"""Which family module serves a model directory."""

from __future__ import annotations

import torch

from embedfleet.common import judge_prompt
from embedfleet.common.modeldir import ModelDir, ModelDirError
from embedfleet.worker.engine.models import Model
from embedfleet.worker.engine.models.bert import ROBERTA_TYPES, load_bert
from embedfleet.worker.engine.models.classifier import load_classifier
from embedfleet.worker.engine.models.qwen3 import load_qwen3
from embedfleet.worker.engine.models.splade import load_splade
from embedfleet.worker.engine.models.yes_no import load_yes_no
from embedfleet.worker.engine.weights import load_tensors

BERT_TYPES = ("bert", *ROBERTA_TYPES)
QWEN_TYPES = ("qwen3",)


def answer_tokens(model_dir: ModelDir) -> tuple[int, int]:
    """The ("yes", "no") token ids of a yes/no reranker's own tokenizer."""
    tok = model_dir.tokenizer()
    ids = tok.token_to_id(judge_prompt.YES), tok.token_to_id(judge_prompt.NO)
    if ids[0] is None or ids[1] is None:
        raise ModelDirError(
            f"{model_dir.path}: the tokenizer has no single token for "
            f"{judge_prompt.YES!r} and {judge_prompt.NO!r}"
        )
    return ids[0], ids[1]


def load_model(
    model_dir: ModelDir,
    dtype: torch.dtype,
    device: torch.device,
    bidirectional: bool | None = None,
) -> Model:
    kind = model_dir.model_type
    head = model_dir.head
    families = {
        "pool": BERT_TYPES + QWEN_TYPES,
        "classifier": BERT_TYPES,
        "splade": BERT_TYPES,
        "yes_no": QWEN_TYPES,
    }
    if kind not in families[head]:
        raise ModelDirError(
            f"{model_dir.task} models of type {kind!r} are not supported "
            f"({', '.join(families[head])})"
        )
    if head == "yes_no":
        yes, no = answer_tokens(model_dir)  # before reading gigabytes of weights
        return load_yes_no(model_dir.config, load_tensors(model_dir.path), dtype, device, yes, no)
    tensors = load_tensors(model_dir.path)
    config = model_dir.config
    if head == "classifier":
        one = model_dir.task == "score"
        return load_classifier(config, tensors, dtype, device, one, len(model_dir.labels))
    if head == "splade":
        return load_splade(config, tensors, dtype, device)
    if kind in QWEN_TYPES:
        return load_qwen3(config, tensors, dtype, device, bidirectional)
    return load_bert(config, tensors, dtype, device)
