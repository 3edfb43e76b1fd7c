"""Multi-vector (ColBERT-style) outputs: an encoder's last hidden state, token by token, through
a linear projection and an L2 norm, as BAAI/bge-m3's colbert_linear and PyLate's ColBERT (a
sentence-transformers Dense module after the transformer) compute them.

The head stays ragged: [T, D] for every packed token of the batch, padding included; which rows
a request reads back (bge-m3 drops each sequence's first token, its CLS) is `outputs`' business.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - the universal alias

from embedfleet.common.modeldir import ModelDir, ModelDirError, MultiVector
from embedfleet.worker.engine.attention import AttentionPlan
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.models import Model, Shape
from embedfleet.worker.engine.pooling import Dense, load_dense


class ColBERT:
    """An encoder (any embedder family) with a per-token projection for its head."""

    def __init__(self, encoder: Model, projection: Dense) -> None:
        self.encoder = encoder
        self.projection = projection
        self.shape: Shape = encoder.shape

    def forward(self, batch: DeviceBatch, plan: AttentionPlan) -> torch.Tensor:
        return self.encoder.forward(batch, plan)

    def head(self, hidden: torch.Tensor, batch: DeviceBatch) -> torch.Tensor:
        """[T, D] float32 unit vectors, one per packed token."""
        return F.normalize(self.projection(hidden.float()), p=2.0, dim=-1)


def load_projection(model_dir: ModelDir, device: torch.device) -> Dense:
    """The model's projection, float32 on `device` (bge-m3's state dict or a Dense module's)."""
    spec: MultiVector | None = model_dir.multivector
    if spec is None:
        raise ModelDirError(f"{model_dir.path}: no per-token projection to serve multivector")
    if not spec.state_file:
        return load_dense(spec.layer, device)
    file = model_dir.path / spec.state_file
    state = torch.load(str(file), map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "weight" not in state:
        raise ModelDirError(f"{file}: not a torch.nn.Linear state dict (weight, bias)")
    tensors = {f"linear.{name}": tensor for name, tensor in state.items()}
    return load_dense(spec.layer, device, tensors)
