"""Choosing the device and the compute dtype."""

from __future__ import annotations

import time
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """AVX512-BF16 or AMX: bf16 GEMMs then run faster than fp32 ones instead of slower."""
    flags = cpu_flags() if flags is None else flags
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def candidate_dtype(choice: str, device: torch.device) -> tuple[torch.dtype, bool]:
    """(dtype to try, whether it must first pass the parity probe against float32)."""
    if choice != "auto":
        try:
            return DTYPES[choice], False
        except KeyError:
            raise ValueError(
                f"unknown dtype {choice!r}; use auto or one of {list(DTYPES)}"
            ) from None
    if device.type == "cuda":
        return torch.bfloat16, False
    if cpu_has_native_bf16():
        return torch.bfloat16, True
    return torch.float32, False


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def gemm_seconds(dtype: torch.dtype, hidden: int, tokens: int = 256, reps: int = 5) -> float:
    """Best time of a [tokens, hidden] x [hidden, 4 hidden] product (the MLP's shape) in `dtype`."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    w = torch.randn(4 * hidden, hidden, generator=gen).to(dtype)
    best = float("inf")
    with torch.inference_mode():
        torch.nn.functional.linear(x, w)  # first call: kernel selection, weight packing
        for _ in range(reps):
            start = time.perf_counter()
            torch.nn.functional.linear(x, w)
            best = min(best, time.perf_counter() - start)
    return best


def reduced_precision_pays(dtype: torch.dtype, hidden: int, margin: float = 0.9) -> bool:
    """Whether `dtype` GEMMs beat float32 ones on this CPU by at least 1/margin.

    CPU flags say what the processor can do, not what this build and this (maybe virtualized,
    maybe shared) machine deliver, so the auto choice measures: a few milliseconds at start.
    The two dtypes are timed alternately so that a noisy neighbour hurts both alike.
    """
    fast, slow = float("inf"), float("inf")
    for _ in range(3):
        fast = min(fast, gemm_seconds(dtype, hidden))
        slow = min(slow, gemm_seconds(torch.float32, hidden))
    return fast < margin * slow
