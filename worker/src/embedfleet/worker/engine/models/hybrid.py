"""BAAI/bge-m3's three outputs from one forward: the dense vector (the model's pooling, as the
embedder of the same directory serves it), the lexical weights (`lexical.Lexical`'s head) and the
per-token vectors (`colbert.ColBERT`'s head), each computed by that head's own code.

To the engine's forward paths (eager, the CPU runtimes, CUDA graphs) a hybrid model is an
embedder: its default head is the dense pooling, so the graphs capture that alone. The lexical and
per-token heads run after the forward, and only for a batch whose items ask for them
(`outputs.hybrid_rows`): a lexical row is [vocab] floats a sequence (250,002 for bge-m3), so a
request for the dense vector alone neither computes nor copies back any.
"""

from __future__ import annotations

import torch

from embedfleet.common.modeldir import ModelDir
from embedfleet.worker.engine.attention import AttentionPlan
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.models import Model, Shape
from embedfleet.worker.engine.models.colbert import ColBERT, load_projection
from embedfleet.worker.engine.models.lexical import Lexical, load_lexical


class Hybrid:
    """An encoder with bge-m3's lexical weight and per-token projection beside its pooling."""

    def __init__(self, lexical: Lexical, colbert: ColBERT) -> None:
        self.encoder: Model = lexical.encoder
        self.lexical = lexical
        self.colbert = colbert
        self.shape: Shape = lexical.shape

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        return self.encoder.forward(batch, plan)

    def head(self, hidden: torch.Tensor, batch: DeviceBatch) -> torch.Tensor | None:
        """None: pooled as an embedder; the other two heads run per request."""
        return None


def load_hybrid(model_dir: ModelDir, encoder: Model, device: torch.device) -> Hybrid:
    """`encoder` with bge-m3's sparse_linear.pt and colbert_linear.pt (float32 on `device`)."""
    return Hybrid(
        load_lexical(model_dir, encoder, device),
        ColBERT(encoder, load_projection(model_dir, device)),
    )
