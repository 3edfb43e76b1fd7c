"""The Triton kernels (engine/kernels/: add+RMSNorm, q/k-norm+RoPE, GLU) in Triton's interpreter on
CPU tensors, against the PyTorch ops the CPU path runs (`kernels.torch_ops`).

float32 agrees to float32 rounding. In bf16 both round where `transformers` rounds (the residual
stream after each add, a norm's output, the activation before its product), so they differ by at
most a unit in the last place: the interpreter casts to bf16 by truncation where a GPU rounds to
nearest, and the torch path rounds Llama-style norms once (after the weight) instead of twice.
"""

from __future__ import annotations

import pytest
import torch

from embedfleet.worker.engine.kernels import torch_ops
from embedfleet.worker.engine.kernels.types import Kernels, Norm, QkvLayout

DTYPES = (torch.float32, torch.bfloat16)
STYLES = ("llama", "gemma")


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """float32 to float32 rounding; bf16 to two units in the last place of the largest value
    (each side rounds a few times, each time by up to half a unit)."""
    assert got.dtype == want.dtype
    if got.dtype == torch.bfloat16:
        ulps = 2 * 2**-7 * float(want.float().abs().max())
        torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=ulps)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def rand(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=gen)).to(dtype)


def norm_of(style: str, shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> Norm:
    """A Llama-style norm (weight in the compute dtype, rounded before it) or Gemma's (1 + w in
    float32, rounded once)."""
    w = rand(*shape, dtype=torch.float32, seed=seed, scale=0.2)
    if style == "gemma":
        return Norm(1.0 + w.to(dtype).float(), 1e-6, round_first=False)
    return Norm((1.0 + w).to(dtype), 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("hidden", [64, 96])
def test_add_rms_norm(fused_kernels: Kernels, dtype: torch.dtype, style: str, hidden: int) -> None:
    x = rand(6, hidden, dtype=dtype, seed=0)
    delta = rand(6, hidden, dtype=dtype, seed=1, scale=3.0)
    norm = norm_of(style, (hidden,), dtype, 2)
    delta_norm = norm_of(style, (hidden,), dtype, 3) if style == "gemma" else None
    # No delta: the first layer's input norm; x is read, never written.
    before = x.clone()
    close(fused_kernels.add_rms_norm(x, None, norm, None), torch_ops.add_rms_norm(x, None, norm))
    assert torch.equal(x, before)
    # With a delta: x += delta in place (the residual stream stays in the compute dtype).
    mine, theirs = x.clone(), x.clone()
    got = fused_kernels.add_rms_norm(mine, delta, norm, delta_norm)
    want = torch_ops.add_rms_norm(theirs, delta, norm, delta_norm)
    close(got, want)
    close(mine, theirs)
    assert not torch.equal(mine, before)


def test_add_rms_norm_rounds_as_the_reference(fused_kernels: Kernels) -> None:
    """bf16: the residual is the bf16 sum, the output normalizes that rounded sum and rounds the
    normalized value before the weight (LlamaRMSNorm's order)."""
    x = rand(4, 128, dtype=torch.bfloat16, seed=4)
    delta = rand(4, 128, dtype=torch.bfloat16, seed=5)
    norm = norm_of("llama", (128,), torch.bfloat16, 6)
    residual = (x.float() + delta.float()).to(torch.bfloat16)
    normed = residual.float() * torch.rsqrt(residual.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    want = norm.weight * normed.to(torch.bfloat16)
    got = fused_kernels.add_rms_norm(x, delta, norm, None)
    close(x, residual)
    close(got, want)


LAYOUTS = {
    "qwen3-like": QkvLayout(4, 2, 16),  # grouped heads, a small head_dim
    "gemma-like": QkvLayout(3, 1, 256, q_scale=0.5),  # EmbeddingGemma's 3/1 heads of 256
    "mha-like": QkvLayout(2, 2, 64),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout_name", sorted(LAYOUTS))
@pytest.mark.parametrize("style", [*STYLES, "none"])
def test_qk_norm_rope(
    fused_kernels: Kernels, dtype: torch.dtype, layout_name: str, style: str
) -> None:
    layout = LAYOUTS[layout_name]
    heads = layout.heads + layout.kv_heads
    tokens, d = 5, layout.dim
    qkv = rand(tokens, (heads + layout.kv_heads) * d, dtype=dtype, seed=7)
    gen = torch.Generator().manual_seed(8)
    angles = torch.rand(32, d // 2, generator=gen) * 6.0
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    positions = torch.tensor([0, 3, 1, 31, 2])
    norm = None if style == "none" else norm_of(style, (heads, d), dtype, 9)
    q, k, v = fused_kernels.qk_norm_rope(
        qkv, fused_kernels.rotary(cos, sin, positions), layout, norm
    )
    wq, wk, wv = torch_ops.qk_norm_rope(qkv, torch_ops.rotary(cos, sin, positions), layout, norm)
    assert q.shape == (tokens, layout.heads, d)
    assert k.shape == (tokens, layout.kv_heads, d)
    assert q.is_contiguous()
    assert k.is_contiguous()
    close(q, wq.contiguous())
    close(k, wk.contiguous())
    # v is the QKV output itself, never copied.
    assert torch.equal(v, wv)
    assert v.data_ptr() == wv.data_ptr()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("width", [48, 1100])
def test_glu(fused_kernels: Kernels, dtype: torch.dtype, activation: str, width: int) -> None:
    gate_up = rand(3, 2 * width, dtype=dtype, seed=10, scale=3.0)
    got = fused_kernels.glu(gate_up, activation)  # type: ignore[arg-type]
    close(got, torch_ops.glu(gate_up, activation))  # type: ignore[arg-type]
    assert got.shape == (3, width)
