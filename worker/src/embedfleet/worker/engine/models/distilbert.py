"""DistilBERT (distilbert-base, msmarco-distilbert-*, multi-qa-distilbert-*) over a ragged batch.

BERT's post-norm encoder without segment embeddings, saved under its own names: the names are
mapped to BERT's at load and `bert.BertEncoder` runs it (config keys such as `dim` and `n_heads`
are read under BERT's names by `modeldir`).
"""

from __future__ import annotations

from typing import Any

import torch

from embedfleet.worker.engine.models.bert import BertEncoder
from embedfleet.worker.engine.weights import Tensors, WeightReader, renamed, strip_prefix

#: DistilBERT's parts -> BERT's (applied in order to each tensor name)
_NAMES = (
    ("transformer.layer.", "encoder.layer."),
    (".attention.q_lin.", ".attention.self.query."),
    (".attention.k_lin.", ".attention.self.key."),
    (".attention.v_lin.", ".attention.self.value."),
    (".attention.out_lin.", ".attention.output.dense."),
    (".sa_layer_norm.", ".attention.output.LayerNorm."),
    (".ffn.lin1.", ".intermediate.dense."),
    (".ffn.lin2.", ".output.dense."),
    (".output_layer_norm.", ".output.LayerNorm."),
)


def load_distilbert(
    config: dict[str, Any], tensors: Tensors, dtype: torch.dtype, device: torch.device
) -> BertEncoder:
    bert_named = renamed(strip_prefix(tensors, ("distilbert.",)), _NAMES)
    return BertEncoder(config, WeightReader(bert_named, dtype, device))
