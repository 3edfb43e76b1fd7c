"""From per-token hidden states to one vector per sequence, as sentence-transformers' modules after
the transformer compute it: Pooling (its mode, or a request's), Dense layers; then Matryoshka
truncation and L2 norm (its Normalize module, or a request's choice).

All in float32 whatever the compute dtype, and without host syncs, so it can sit inside a graph
(the default pooling and the Dense layers run in the captured body).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 - the universal alias

from embedfleet.common.modeldir import DenseLayer, ModelDir, ModelDirError, Pooling
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.weights import load_tensors

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Identity": lambda x: x,
    "Tanh": torch.tanh,
    "ReLU": F.relu,
    "GELU": F.gelu,
    "Sigmoid": torch.sigmoid,
    "SiLU": F.silu,
}


def _sums(hidden: torch.Tensor, batch: DeviceBatch, weights: torch.Tensor | None) -> torch.Tensor:
    """[N, H] float32 per-slot sums of the (weighted) token states."""
    slots = batch.lengths.shape[0]
    rows = hidden.float() if weights is None else hidden.float() * weights[:, None]
    sums = hidden.new_zeros((slots, hidden.shape[1]), dtype=torch.float32)
    return sums.index_add_(0, batch.seq_index, rows)


def pool(hidden: torch.Tensor, batch: DeviceBatch, mode: Pooling) -> torch.Tensor:
    """hidden [T, H] -> [N, H] float32 for the batch's N sequence slots."""
    if mode == "cls":
        return hidden.index_select(0, batch.first).float()
    if mode == "last_token":
        return hidden.index_select(0, batch.last).float()
    lengths = batch.lengths.unsqueeze(1).float()
    if mode == "mean":
        return _sums(hidden, batch, None) / lengths
    if mode == "mean_sqrt_len":
        return _sums(hidden, batch, None) / lengths.sqrt()
    if mode == "weighted_mean":
        # Each token weighs its 1-based position in its sequence: n (n + 1) / 2 in all.
        place = torch.arange(hidden.shape[0], device=hidden.device) - batch.first[batch.seq_index]
        weights = (place + 1).float()
        return _sums(hidden, batch, weights) / (lengths * (lengths + 1) / 2)
    if mode == "max":
        slots = batch.lengths.shape[0]
        out = hidden.new_full((slots, hidden.shape[1]), float("-inf"), dtype=torch.float32)
        index = batch.seq_index[:, None].expand(-1, hidden.shape[1])
        return out.scatter_reduce_(0, index, hidden.float(), "amax")
    raise ValueError(f"unknown pooling {mode!r}")


@dataclass(frozen=True, slots=True)
class Dense:
    """A sentence-transformers Dense module, float32 on the device."""

    weight: torch.Tensor  # [out, in]
    bias: torch.Tensor | None
    activation: Callable[[torch.Tensor], torch.Tensor]
    #: use_residual: None (off), the input itself (square layers) or its projection [out, in]
    residual: torch.Tensor | None = None
    residual_identity: bool = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation(F.linear(x, self.weight, self.bias))
        if self.residual_identity:
            return out + x
        return out if self.residual is None else out + F.linear(x, self.residual)


def load_dense(
    layer: DenseLayer, device: torch.device, tensors: dict[str, torch.Tensor] | None = None
) -> Dense:
    """`layer` from its folder's weights, or from `tensors` (named linear.weight, ...)."""
    tensors = load_tensors(layer.path) if tensors is None else tensors

    def get(name: str) -> torch.Tensor:
        if name not in tensors:
            raise ModelDirError(f"{layer.path}: Dense weight {name!r} is missing")
        return tensors[name].to(device=device, dtype=torch.float32)

    weight = get("linear.weight")
    if tuple(weight.shape) != (layer.out_features, layer.in_features):
        raise ModelDirError(f"{layer.path}: linear.weight is {tuple(weight.shape)}")
    square = layer.in_features == layer.out_features
    return Dense(
        weight=weight,
        bias=get("linear.bias") if layer.bias else None,
        activation=_ACTIVATIONS[layer.activation],
        residual=get("residual.weight") if layer.residual and not square else None,
        residual_identity=layer.residual and square,
    )


@dataclass(frozen=True, slots=True)
class Pooler:
    """One vector per sequence: the model's pooling mode (or a request's), then its Dense
    layers."""

    mode: Pooling
    dense: tuple[Dense, ...] = ()

    @classmethod
    def of(cls, model_dir: ModelDir, device: torch.device) -> Pooler:
        return cls(model_dir.pooling, tuple(load_dense(d, device) for d in model_dir.dense))

    def __call__(
        self, hidden: torch.Tensor, batch: DeviceBatch, mode: Pooling | None = None
    ) -> torch.Tensor:
        """hidden [T, H] -> [N, D] float32 (D: the last Dense layer's size, else H)."""
        vectors = pool(hidden, batch, mode or self.mode)
        for layer in self.dense:
            vectors = layer(vectors)
        return vectors


def finish(vectors: torch.Tensor, dimensions: int, normalize: bool) -> torch.Tensor:
    """Truncate to the first `dimensions` (0 keeps all), then L2-normalize if asked."""
    if 0 < dimensions < vectors.shape[-1]:
        vectors = vectors[..., :dimensions]
    if normalize:
        vectors = F.normalize(vectors, p=2.0, dim=-1)
    return vectors
