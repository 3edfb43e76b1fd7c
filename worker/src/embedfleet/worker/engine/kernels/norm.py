"""Add + RMSNorm as one Triton kernel: residual += delta (rounded as the reference's add), then the
normalized residual, in one pass over each row.

Self-contained (no other module's @triton.jit helpers), so that a test can load a private copy
whose kernels run in Triton's interpreter. CUDA tensors in production; imported only on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from embedfleet.worker.engine.kernels.types import Norm


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    delta_ptr,
    w_ptr,
    dw_ptr,
    out_ptr,
    x_stride,
    delta_stride,
    out_stride,
    n_cols,
    eps,
    delta_eps,
    HAS_DELTA: tl.constexpr,
    NORM_DELTA: tl.constexpr,
    ROUND_FIRST: tl.constexpr,
    DELTA_ROUND_FIRST: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_row = x_ptr + row * x_stride
    x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        d = tl.load(delta_ptr + row * delta_stride + cols, mask=mask, other=0.0).to(tl.float32)
        if NORM_DELTA:
            d = d * tl.rsqrt(tl.sum(d * d, axis=0) / n_cols + delta_eps)
            if DELTA_ROUND_FIRST:
                d = d.to(x_ptr.dtype.element_ty).to(tl.float32)
            d = d * tl.load(dw_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            d = d.to(x_ptr.dtype.element_ty).to(tl.float32)
        # The residual stream is stored in the compute dtype, as the reference's add leaves it.
        x = (x + d).to(x_ptr.dtype.element_ty)
        tl.store(x_row + cols, x, mask=mask)
        x = x.to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    if ROUND_FIRST:
        y = y.to(out_ptr.dtype.element_ty).to(tl.float32)
    y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _warps(block: int) -> int:
    return min(16, max(1, block // 256))


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, norm: Norm, delta_norm: Norm | None = None
) -> torch.Tensor:
    rows, cols = x.shape
    out = torch.empty_like(x)
    block = triton.next_power_of_2(cols)
    dn = delta_norm if delta_norm is not None else norm
    _add_rms_norm_kernel[(rows,)](
        x,
        delta if delta is not None else x,
        norm.weight,
        dn.weight,
        out,
        x.stride(0),
        delta.stride(0) if delta is not None else 0,
        out.stride(0),
        cols,
        norm.eps,
        dn.eps,
        HAS_DELTA=delta is not None,
        NORM_DELTA=delta_norm is not None,
        ROUND_FIRST=norm.round_first,
        DELTA_ROUND_FIRST=dn.round_first,
        BLOCK=block,
        num_warps=_warps(block),
    )
    return out
