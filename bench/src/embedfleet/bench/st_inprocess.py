"""The lone request's baseline: sentence-transformers called in this process, one text per call.

What a user gets without a server: `SentenceTransformer.encode([text])`, tokenization included, no
HTTP and no gRPC. The OpenVINO backend (`backend="openvino"`) needs optimum-intel, which the
project's venv does not carry (the `st-openvino` peer installs it into a venv of its own, which
needs PyPI); where it is missing the PyTorch backend alone runs, and the result says so.
Measured while no fleet runs, so the two never share the cores.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Baseline:
    backend: str
    length: int
    requests: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    #: this process's CPU per call (every thread: torch's intra-op pool included)
    cpu_us: float


def backends() -> list[str]:
    """The backends this environment can run: torch always, openvino with optimum-intel."""
    try:
        intel = importlib.util.find_spec("optimum.intel") is not None
    except ModuleNotFoundError:  # no optimum at all
        intel = False
    return ["torch", "openvino"] if intel else ["torch"]


def load(model_dir: str, backend: str) -> Any:
    from sentence_transformers import SentenceTransformer

    if backend == "openvino":
        return SentenceTransformer(model_dir, device="cpu", backend="openvino")
    return SentenceTransformer(model_dir, device="cpu")


def measure(model: Any, backend: str, length: int, texts: Sequence[str], n: int) -> Baseline:
    """`n` calls of one text each (cycling `texts`), after 5 untimed ones."""
    for text in texts[-5:]:
        model.encode([text])
    latencies = []
    cpu0 = time.process_time()
    for i in range(n):
        started = time.perf_counter()
        model.encode([texts[i % len(texts)]])
        latencies.append(time.perf_counter() - started)
    cpu = time.process_time() - cpu0
    return Baseline(
        backend,
        length,
        n,
        statistics.median(latencies) * 1e3,
        float(np.percentile(latencies, 99)) * 1e3,
        statistics.fmean(latencies) * 1e3,
        max(latencies) * 1e3,
        cpu / n * 1e6,
    )
