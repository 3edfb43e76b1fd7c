"""BAAI/bge-m3's three outputs from one forward: the dense vector (the model's pooling, as the
embedder of the same directory serves it), the lexical weights (`lexical.Lexical`'s head) and the
per-token vectors (`colbert.ColBERT`'s head), each computed by that head's own code.

The head's output is one flat float32 tensor, [N * D | N * vocab | T * D'] (`Layout`), so that
the engine's paths that carry one head tensor (eager, CUDA graphs, the copy back) carry all three;
`outputs.hybrid_rows` cuts each work item's share out of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embedfleet.common.modeldir import ModelDir
from embedfleet.worker.engine.attention import AttentionPlan
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.models import Model, Shape
from embedfleet.worker.engine.models.colbert import ColBERT, load_projection
from embedfleet.worker.engine.models.lexical import Lexical, load_lexical
from embedfleet.worker.engine.pooling import Pooler, finish


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each output sits in a hybrid head's flat tensor for `slots` sequence slots and
    `tokens` packed tokens."""

    dense: int  # D, the dense vector's size
    vocab: int
    vectors: int  # D', each per-token vector's size

    def split(
        self, flat: torch.Tensor, slots: int, tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dense [N, D], lexical [N, vocab], per-token [T, D']) views of `flat`."""
        lexical_at = slots * self.dense
        vectors_at = lexical_at + slots * self.vocab
        return (
            flat[:lexical_at].view(slots, self.dense),
            flat[lexical_at:vectors_at].view(slots, self.vocab),
            flat[vectors_at : vectors_at + tokens * self.vectors].view(tokens, self.vectors),
        )


class Hybrid:
    """An encoder with bge-m3's pooling, lexical weight and per-token projection for its head."""

    def __init__(
        self, lexical: Lexical, colbert: ColBERT, pooler: Pooler, normalize: bool, layout: Layout
    ) -> None:
        self.encoder: Model = lexical.encoder
        self.lexical = lexical
        self.colbert = colbert
        self.pooler = pooler
        self.normalize = normalize
        self.layout = layout
        self.shape: Shape = lexical.shape

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        return self.encoder.forward(batch, plan)

    def head(self, hidden: torch.Tensor, batch: DeviceBatch) -> torch.Tensor:
        """Flat float32 [N * D + N * vocab + T * D'] (`Layout`): every slot's dense vector and
        lexical row, every packed token's vector."""
        dense = finish(self.pooler(hidden, batch), 0, self.normalize)
        parts = (dense, self.lexical.head(hidden, batch), self.colbert.head(hidden, batch))
        return torch.cat([p.reshape(-1) for p in parts])

    def token_vectors(self, head: torch.Tensor, batch: DeviceBatch) -> torch.Tensor:
        """The per-token vectors [T, D'] of this head's output for `batch`."""
        tokens = batch.input_ids.shape[0]
        return self.layout.split(head, batch.lengths.shape[0], tokens)[2]


def load_hybrid(model_dir: ModelDir, encoder: Model, device: torch.device) -> Hybrid:
    """`encoder` with bge-m3's sparse_linear.pt and colbert_linear.pt (float32 on `device`) and
    the directory's pooling."""
    projection = load_projection(model_dir, device)
    layout = Layout(model_dir.embedding_size, encoder.shape.vocab_size, projection.weight.shape[0])
    return Hybrid(
        load_lexical(model_dir, encoder, device),
        ColBERT(encoder, projection),
        Pooler.of(model_dir, device),
        model_dir.normalize,
        layout,
    )
