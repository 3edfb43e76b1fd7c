"""bge-m3's lexical (sparse) weights: one weight a token, ReLU(sparse_linear(last hidden state)),
max-pooled per token id over each sequence, the tokenizer's cls, eos, pad and unk ids left out
(FlagEmbedding's BGEM3 `_process_token_weights`).

The rows come out as SPLADE's do, [N, vocab] with zeros for absent ids, so the sparse reply path
(`sparse.sparsify`, SparseEmbed) serves both heads alike. The batch is ragged: a token's row is
its sequence's slot (`seq_index`); padding tokens fall in padding slots, never in a real row.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from embedfleet.common.modeldir import BGE_M3_SPARSE, ModelDir, ModelDirError
from embedfleet.worker.engine.attention import AttentionPlan
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.models import Model, Shape

#: the tokenizer's special tokens whose weights FlagEmbedding drops, and XLM-R's names for them
#: when tokenizer_config.json does not say
SPECIAL_TOKENS = {
    "cls_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
}


class Lexical:
    """An encoder (any embedder family) with a per-token weight for its head."""

    def __init__(
        self, encoder: Model, weight: torch.Tensor, bias: torch.Tensor, special: torch.Tensor
    ) -> None:
        self.encoder = encoder
        self.shape: Shape = encoder.shape
        self.weight = weight  # [1, H] float32
        self.bias = bias  # [1] float32
        self.special = special  # [S] int64 token ids that get no weight

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        return self.encoder.forward(batch, plan)

    def head(self, hidden: torch.Tensor, batch: DeviceBatch) -> torch.Tensor:
        """[N, vocab] float32: each slot's largest weight per token id, zero elsewhere."""
        slots, vocab = batch.lengths.shape[0], self.shape.vocab_size
        weights = torch.relu(torch.nn.functional.linear(hidden.float(), self.weight, self.bias))
        ids = batch.input_ids
        # A broadcast compare against the few special ids: no data-dependent shapes (isin may
        # sort), so the head stays capturable in a CUDA graph.
        special = (ids.unsqueeze(1) == self.special).any(dim=1)
        weights = weights.squeeze(1).masked_fill(special, 0.0)  # [T]
        out = hidden.new_zeros((slots * vocab,), dtype=torch.float32)  # weights are >= 0
        out.scatter_reduce_(0, batch.seq_index * vocab + ids, weights, "amax", include_self=True)
        return out.view(slots, vocab)


def special_ids(model_dir: ModelDir) -> list[int]:
    """The ids of the tokenizer's cls, eos, pad and unk tokens (those it has)."""
    config = _json(model_dir.path / "tokenizer_config.json")
    tok = model_dir.tokenizer()
    ids: set[int] = set()
    for key, fallback in SPECIAL_TOKENS.items():
        named = config.get(key, fallback)
        token = named.get("content") if isinstance(named, dict) else named
        found = tok.token_to_id(str(token)) if token else None
        if found is not None:
            ids.add(found)
    return sorted(ids)


def load_lexical(model_dir: ModelDir, encoder: Model, device: torch.device) -> Lexical:
    """`encoder` with bge-m3's sparse_linear.pt (float32 on `device`) for its head."""
    file = model_dir.path / BGE_M3_SPARSE
    state = torch.load(str(file), map_location="cpu", weights_only=True)
    hidden = model_dir.hidden_size
    if (
        not isinstance(state, dict)
        or tuple(state.get("weight", torch.empty(0)).shape) != (1, hidden)
        or tuple(state.get("bias", torch.empty(0)).shape) != (1,)
    ):
        raise ModelDirError(f"{file}: not a torch.nn.Linear({hidden}, 1) state dict")
    special = torch.tensor(special_ids(model_dir), dtype=torch.int64, device=device)
    weight, bias = (state[k].to(device=device, dtype=torch.float32) for k in ("weight", "bias"))
    return Lexical(encoder, weight, bias, special)


def _json(path: Path) -> dict[str, object]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}
