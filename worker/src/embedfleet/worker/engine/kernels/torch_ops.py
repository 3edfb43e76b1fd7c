"""The decoder layer's fused steps as PyTorch ops: the CPU path and the Triton kernels' reference.

Few ops each (on a CPU the per-op dispatch is what a launch is on a GPU), and all traceable, so the
compiled CPU runtimes take them as they are. Where a bf16 step would cost an extra op to round as
`transformers` does (Llama-style norms round before their weight), it rounds once, after: within
the parity bar, and one op less.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - the universal alias

from embedfleet.worker.engine.kernels.types import Activation, Kernels, Norm, QkvLayout, Rotary


def rms_norm(x: torch.Tensor, norm: Norm) -> torch.Tensor:
    """RMSNorm over the last dimension; a float32 weight (Gemma's 1 + w) scales in float32."""
    if norm.weight.dtype == x.dtype:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)
    return F.rms_norm(x.float(), (x.shape[-1],), norm.weight.float(), norm.eps).to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, norm: Norm, delta_norm: Norm | None = None
) -> torch.Tensor:
    if delta is not None:
        x.add_(delta if delta_norm is None else rms_norm(delta, delta_norm))
    return rms_norm(x, norm)


def rotary(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> Rotary:
    """[T, 1, d] tables: cos for both halves, and the sine signed so that rotate_half(x) * sin is
    roll(x, d/2) * [-sin | sin] (one roll and one addcmul per layer instead of slices and a cat)."""
    c = cos.index_select(0, positions)
    s = sin.index_select(0, positions)
    return Rotary(torch.cat([c, c], -1).unsqueeze(1), torch.cat([-s, s], -1).unsqueeze(1))


def qk_norm_rope(
    qkv: torch.Tensor, rot: Rotary, layout: QkvLayout, norm: Norm | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    heads, d = layout.heads, layout.dim
    qk_heads = heads + layout.kv_heads
    qk = qkv[:, : qk_heads * d].view(-1, qk_heads, d)
    v = qkv[:, qk_heads * d :].view(-1, layout.kv_heads, d)
    if norm is not None:
        if norm.weight.dtype == qk.dtype:
            qk = F.rms_norm(qk, (d,), eps=norm.eps) * norm.weight
        else:
            qk = (F.rms_norm(qk.float(), (d,), eps=norm.eps) * norm.weight).to(qk.dtype)
    qk = torch.addcmul(qk * rot.cos, qk.roll(d // 2, dims=-1), rot.sin)
    q, k = qk[:, :heads], qk[:, heads:]
    if layout.q_scale != 1.0:
        q = q * layout.q_scale
    return q, k, v


def glu(gate_up: torch.Tensor, activation: Activation) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    if activation == "silu":
        return F.silu(gate) * up
    return F.gelu(gate, approximate="tanh") * up


KERNELS = Kernels("torch", rotary, add_rms_norm, qk_norm_rope, glu)
