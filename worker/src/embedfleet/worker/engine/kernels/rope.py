"""Per-head q/k RMSNorm and rotary positions as one Triton kernel, reading the fused QKV GEMM's
output and writing q and k contiguous: one program per token, every query and key head at once.

Self-contained, as `norm` is; imported only on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from embedfleet.worker.engine.kernels.types import Norm, QkvLayout, Rotary


@triton.jit
def _qk_norm_rope_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    w_ptr,
    q_ptr,
    k_ptr,
    qkv_stride,
    eps,
    q_scale,
    HEADS: tl.constexpr,
    QK_HEADS: tl.constexpr,
    DIM: tl.constexpr,
    HAS_NORM: tl.constexpr,
    ROUND_FIRST: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    half: tl.constexpr = DIM // 2
    h = tl.arange(0, BLOCK_H)[:, None]  # head
    i = tl.arange(0, BLOCK_D)[None, :]  # index within a half
    in_half = i < half
    mask = (h < QK_HEADS) & in_half
    src = qkv_ptr + t * qkv_stride + h * DIM + i
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        r = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / DIM + eps)[:, None]
        x1 = x1 * r
        x2 = x2 * r
        if ROUND_FIRST:
            x1 = x1.to(q_ptr.dtype.element_ty).to(tl.float32)
            x2 = x2.to(q_ptr.dtype.element_ty).to(tl.float32)
        w = w_ptr + h * DIM + i
        x1 = x1 * tl.load(w, mask=mask, other=0.0).to(tl.float32)
        x2 = x2 * tl.load(w + half, mask=mask, other=0.0).to(tl.float32)
        # The reference rounds the norm's output before rotating it.
        x1 = x1.to(q_ptr.dtype.element_ty).to(tl.float32)
        x2 = x2.to(q_ptr.dtype.element_ty).to(tl.float32)
    cos = tl.load(cos_ptr + t * half + i, mask=in_half, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + t * half + i, mask=in_half, other=0.0).to(tl.float32)
    scale = tl.where(h < HEADS, q_scale, 1.0)
    o1 = ((x1 * cos - x2 * sin) * scale).to(q_ptr.dtype.element_ty)
    o2 = ((x2 * cos + x1 * sin) * scale).to(q_ptr.dtype.element_ty)
    is_q = mask & (h < HEADS)
    q_dst = q_ptr + t * (HEADS * DIM) + h * DIM + i
    tl.store(q_dst, o1, mask=is_q)
    tl.store(q_dst + half, o2, mask=is_q)
    is_k = mask & (h >= HEADS)
    k_dst = k_ptr + t * ((QK_HEADS - HEADS) * DIM) + (h - HEADS) * DIM + i
    tl.store(k_dst, o1, mask=is_k)
    tl.store(k_dst + half, o2, mask=is_k)


def rotary(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> Rotary:
    """The forward's [T, d/2] rows of the half tables (the kernel rotates half against half)."""
    return Rotary(cos.index_select(0, positions), sin.index_select(0, positions))


def qk_norm_rope(
    qkv: torch.Tensor, rot: Rotary, layout: QkvLayout, norm: Norm | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens = qkv.shape[0]
    heads, kv, d = layout.heads, layout.kv_heads, layout.dim
    q = qkv.new_empty((tokens, heads, d))
    k = qkv.new_empty((tokens, kv, d))
    v = qkv[:, (heads + kv) * d :].view(tokens, kv, d)
    block_h = triton.next_power_of_2(heads + kv)
    block_d = triton.next_power_of_2(d // 2)
    _qk_norm_rope_kernel[(tokens,)](
        qkv,
        rot.cos,
        rot.sin,
        norm.weight if norm is not None else qkv,
        q,
        k,
        qkv.stride(0),
        norm.eps if norm is not None else 0.0,
        layout.q_scale,
        HEADS=heads,
        QK_HEADS=heads + kv,
        DIM=d,
        HAS_NORM=norm is not None,
        ROUND_FIRST=norm.round_first if norm is not None else True,
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        num_warps=min(8, max(1, block_h * block_d // 256)),
    )
    return q, k, v
