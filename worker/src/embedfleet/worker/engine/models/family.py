"""Which family module serves a model directory (what is served at all: `architectures`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from embedfleet.common import judge_prompt
from embedfleet.common.modeldir import ModelDir, ModelDirError
from embedfleet.worker.architectures import refusal
from embedfleet.worker.engine.models import Model
from embedfleet.worker.engine.models.bert import load_bert
from embedfleet.worker.engine.models.classifier import load_classifier
from embedfleet.worker.engine.models.colbert import ColBERT, load_projection
from embedfleet.worker.engine.models.decoder import load_decoder
from embedfleet.worker.engine.models.distilbert import load_distilbert
from embedfleet.worker.engine.models.gemma3 import GEMMA3_TYPES, gemma3_decoder
from embedfleet.worker.engine.models.hybrid import load_hybrid
from embedfleet.worker.engine.models.lexical import load_lexical
from embedfleet.worker.engine.models.llama import LLAMA_TYPES, llama_decoder
from embedfleet.worker.engine.models.modernbert import load_modernbert
from embedfleet.worker.engine.models.mpnet import load_mpnet
from embedfleet.worker.engine.models.splade import load_splade
from embedfleet.worker.engine.models.yes_no import load_yes_no
from embedfleet.worker.engine.weights import Tensors, load_tensors

Loader = Callable[[dict[str, Any], Tensors, torch.dtype, torch.device], Model]

#: model_type -> the encoder of an embedder (the "pool" head); architectures.SERVED says which
#: heads each type is served with
ENCODERS: dict[str, Loader] = {
    "bert": load_bert,
    "roberta": load_bert,
    "xlm-roberta": load_bert,
    "camembert": load_bert,
    "distilbert": load_distilbert,
    "mpnet": load_mpnet,
    "modernbert": load_modernbert,
}

#: model_type of the decoder embedders (Llama layout: Qwen3, Qwen2, Mistral; Gemma3)
DECODER_TYPES = (*LLAMA_TYPES, *GEMMA3_TYPES)


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
    if line := refusal(model_dir):  # before reading gigabytes of weights
        raise ModelDirError(line)
    kind, head = model_dir.model_type, model_dir.head
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
    if head == "colbert":
        projection = load_projection(model_dir, device)
        return ColBERT(ENCODERS[kind](config, tensors, dtype, device), projection)
    if head == "lexical":
        return load_lexical(model_dir, ENCODERS[kind](config, tensors, dtype, device), device)
    if head == "hybrid":
        return load_hybrid(model_dir, ENCODERS[kind](config, tensors, dtype, device), device)
    if kind in DECODER_TYPES:
        build = gemma3_decoder if kind in GEMMA3_TYPES else llama_decoder
        return load_decoder(build, config, tensors, dtype, device, bidirectional)
    return ENCODERS[kind](config, tensors, dtype, device)
