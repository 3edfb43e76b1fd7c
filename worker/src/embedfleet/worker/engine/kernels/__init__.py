"""The fused elementwise ops of a decoder layer, behind one small interface.

A pre-norm decoder layer is, per token, GEMMs and attention with three memory-bound steps between
them: add the residual and normalize, normalize and rotate q and k, gate the MLP. On a GPU each
unfused step is several kernel launches (casts, norms on strided slices, rotary in three ops,
silu and its product apart), and at small batches the launches are the forward's time
(docs/benchmarks/gpu.md). `Kernels` names the three steps once; the decoder families call them:

- `torch_ops.KERNELS`: PyTorch ops. The CPU path, the compiled CPU runtimes' traced graph, and
  the reference the Triton kernels are tested against.
- `fused()`: one Triton kernel per step (`norm`, `rope`, `glu`), CUDA only. Triton ships with
  the CUDA build of torch; the CPU image leaves it out, so these modules are imported only here,
  and only for a CUDA device.

With the fused kernels a layer is nine launches: add+RMSNorm, QKV GEMM, q/k-norm+RoPE, attention,
o-proj GEMM, add+RMSNorm, gate_up GEMM, GLU, down GEMM (the down GEMM's residual add rides in the
next layer's first norm).
"""

from __future__ import annotations

import importlib.util

import torch

from embedfleet.worker.engine.kernels import torch_ops
from embedfleet.worker.engine.kernels.types import Kernels


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def fused() -> Kernels:
    """The Triton kernels (CUDA tensors only; the interpreter runs them on CPU tensors in tests)."""
    from embedfleet.worker.engine.kernels import glu, norm, rope

    return Kernels("triton", rope.rotary, norm.add_rms_norm, rope.qk_norm_rope, glu.glu)


def for_device(device: torch.device) -> Kernels:
    """Triton's fused kernels on CUDA where Triton imports; PyTorch ops everywhere else."""
    if device.type == "cuda" and triton_available():
        return fused()
    return torch_ops.KERNELS
