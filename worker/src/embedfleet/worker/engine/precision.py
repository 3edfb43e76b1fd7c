"""Choosing the compute dtype, before the engine exists (the device: `plan`).

`load_model_at_dtype` makes the whole choice: the dtype asked for, or for `auto` bf16 on CUDA and,
on a CPU, bf16 only where it is both faster and as accurate as float32 on the probe inputs. It
returns the model loaded in the chosen dtype, so the engine is built once, in its final precision.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from embedfleet.common.modeldir import ModelDir
from embedfleet.worker.engine.attention import GroupedBackend, select_backend
from embedfleet.worker.engine.forward import default_outputs
from embedfleet.worker.engine.models import Model
from embedfleet.worker.engine.models.family import load_model
from embedfleet.worker.engine.pooling import Pooler
from embedfleet.worker.engine.probe import agreement, probe_items

log = logging.getLogger(__name__)

#: bf16 is kept on CPU only if the probe's embeddings stay this close to float32's
PARITY_MIN_COSINE = 0.999
#: ... and scores this close (absolute, in logits)
PARITY_MAX_SCORE_DIFF = 1e-3

#: ... and a reduced dtype must be this much faster (its time below this share of float32's)
REDUCED_MARGIN = 0.9

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def reduced_precision_pays(dtype: torch.dtype, hidden: int, margin: float = REDUCED_MARGIN) -> bool:
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


def load_model_at_dtype(
    model_dir: ModelDir,
    device: torch.device,
    choice: str,
    attention: str,
    max_tokens: int,
    bidirectional: bool | None = None,
) -> tuple[torch.dtype, Model]:
    """The compute dtype for `choice` (auto, float32, ...) and the model loaded in it.

    A reduced dtype that must first prove itself (auto on a CPU with native bf16) is kept only if
    its GEMMs are faster here and the probe inputs, run through it with the `attention` backend,
    agree with float32 run through the grouped backend; otherwise float32.
    """
    dtype, must_probe = candidate_dtype(choice, device)
    if not must_probe:
        return dtype, load_model(model_dir, dtype, device, bidirectional)
    if not reduced_precision_pays(dtype, model_dir.hidden_size):
        log.info("%s GEMMs are not faster than float32 here: using float32", dtype)
        return torch.float32, load_model(model_dir, torch.float32, device, bidirectional)
    fast = load_model(model_dir, dtype, device, bidirectional)
    reference = load_model(model_dir, torch.float32, device, bidirectional)
    fast_backend = select_backend(attention, device, dtype, features=fast.shape.attention_features)
    items = probe_items(model_dir, max_tokens)
    pooler = Pooler.of(model_dir, device)
    fast_out = [default_outputs(fast, fast_backend, pooler, it.tokens, device) for it in items]
    slow_out = [
        default_outputs(reference, GroupedBackend(), pooler, it.tokens, device) for it in items
    ]
    cosine, score_diff = agreement(fast_out, slow_out, model_dir.task)
    keep = cosine >= PARITY_MIN_COSINE and score_diff <= PARITY_MAX_SCORE_DIFF
    log.info(
        "probe %s vs float32: min cosine %.6f, max score diff %.2e -> %s",
        dtype_name(dtype),
        cosine,
        score_diff,
        "kept" if keep else "float32",
    )
    return (dtype, fast) if keep else (torch.float32, reference)
