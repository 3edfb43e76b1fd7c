"""The types the fused decoder steps share: their norms, rotary tables, QKV layout and the
`Kernels` bundle each implementation fills in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

#: the MLP gates: SwiGLU (Llama, Qwen, Mistral) and GeGLU with tanh-approximated GELU (Gemma)
Activation = Literal["silu", "gelu_tanh"]


@dataclass(frozen=True, slots=True)
class Norm:
    """One RMSNorm's scale and the way its model rounds around it.

    Llama-style norms (Qwen, Mistral) normalize in float32, round to the compute dtype, then
    scale by a weight in that dtype: `round_first`. Gemma scales in float32 by (1 + weight) and
    rounds once: its loader stores that sum as a float32 `weight`.
    """

    weight: torch.Tensor  # [H], or [heads, d] for per-head q/k norms
    eps: float
    round_first: bool = True


@dataclass(frozen=True, slots=True)
class Rotary:
    """A forward's rotary tables, gathered at its positions once for every layer. The layout is
    the `Kernels` implementation's own (its `rotary` makes them, its `qk_norm_rope` reads them)."""

    cos: torch.Tensor
    sin: torch.Tensor


@dataclass(frozen=True, slots=True)
class QkvLayout:
    """How a fused QKV projection's row splits: query heads, key heads, value heads of `dim`."""

    heads: int
    kv_heads: int
    dim: int
    #: multiplies the queries after rotation: (query_pre_attn_scalar / head_dim) ** -0.5 for
    #: Gemma, whose attention scale is not 1/sqrt(head_dim); 1.0 elsewhere
    q_scale: float = 1.0


@dataclass(frozen=True, slots=True)
class Kernels:
    """The three fused steps. Every function takes and returns packed [T, ...] tensors."""

    name: str
    #: (cos [P, d/2], sin [P, d/2], positions [T]) -> the forward's `Rotary`
    rotary: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Rotary]
    #: (x [T, H], delta [T, H] | None, norm, delta_norm | None) -> normalized [T, H]. With a
    #: delta, x += delta first, in place and rounded to x's dtype as the reference's residual
    #: add rounds (delta_norm, Gemma's post-attention / post-MLP norm, normalizes delta first).
    add_rms_norm: Callable[[torch.Tensor, torch.Tensor | None, Norm, Norm | None], torch.Tensor]
    #: (qkv [T, (Hq + 2 Hkv) d], rotary, layout, per-head norm | None) -> q [T, Hq, d] and
    #: k [T, Hkv, d] contiguous, normalized and rotated; v [T, Hkv, d] a view of qkv
    qk_norm_rope: Callable[
        [torch.Tensor, Rotary, QkvLayout, Norm | None],
        tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ]
    #: (gate_up [T, 2 I], activation) -> act(gate) * up [T, I]
    glu: Callable[[torch.Tensor, Activation], torch.Tensor]
