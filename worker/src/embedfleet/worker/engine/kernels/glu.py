"""The gated MLP's activation as one Triton kernel: act(gate) * up from the fused gate_up GEMM's
output, rounding where the reference rounds (after the activation, after the product).

Self-contained, as `norm` is; imported only on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from embedfleet.worker.engine.kernels.types import Activation


@triton.jit
def _glu_kernel(
    gate_up_ptr,
    out_ptr,
    in_stride,
    out_stride,
    width,
    GELU_TANH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    base = gate_up_ptr + row * in_stride
    gate = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(base + width + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU_TANH:
        # 0.5 x (1 + tanh(z)) == x sigmoid(2z), z = sqrt(2 / pi) (x + 0.044715 x^3)
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = gate * tl.sigmoid(2.0 * inner)
    else:
        act = gate * tl.sigmoid(gate)
    act = act.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def glu(gate_up: torch.Tensor, activation: Activation) -> torch.Tensor:
    rows, double = gate_up.shape
    width = double // 2
    out = gate_up.new_empty((rows, width))
    block = min(1024, triton.next_power_of_2(width))
    _glu_kernel[(rows, triton.cdiv(width, block))](
        gate_up,
        out,
        gate_up.stride(0),
        out.stride(0),
        width,
        GELU_TANH=activation == "gelu_tanh",
        BLOCK=block,
        num_warps=4,
    )
    return out
