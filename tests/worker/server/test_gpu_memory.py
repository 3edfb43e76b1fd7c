"""embedfleet_worker_gpu_memory_bytes{kind} and _total_bytes: sampled at scrape time from a CUDA
engine, absent (no series at all) on CPU. The gpu-marked test skips where there is no CUDA device
(tests/conftest.py); the others run everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.testing.workers import WorkerProcess, running_worker
from embedfleet.worker.metrics import GpuMemory, WorkerMetrics, engine_gpu_memory
from embedfleet.worker.null_engine import NullEngine

from .helpers import WORKER_ARGS

GPU_METRICS = ("embedfleet_worker_gpu_memory_bytes", "embedfleet_worker_gpu_memory_total_bytes")


def samples(text: str) -> dict[tuple[str, str], float]:
    """(sample name, kind label) -> value, for the GPU memory families only."""
    return {
        (s.name, s.labels.get("kind", "")): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in GPU_METRICS
    }


def test_series_are_read_at_scrape_time() -> None:
    current = [GpuMemory(allocated=10, reserved=30, total=100)]
    metrics = WorkerMetrics(gpu_memory=lambda: current[0])
    first = samples(generate_latest(metrics.registry).decode())
    assert first == {
        ("embedfleet_worker_gpu_memory_bytes", "allocated"): 10,
        ("embedfleet_worker_gpu_memory_bytes", "reserved"): 30,
        ("embedfleet_worker_gpu_memory_total_bytes", ""): 100,
    }
    current[0] = GpuMemory(allocated=20, reserved=40, total=100)
    second = samples(generate_latest(metrics.registry).decode())
    assert second[("embedfleet_worker_gpu_memory_bytes", "allocated")] == 20


def test_no_series_without_a_gpu() -> None:
    text = generate_latest(WorkerMetrics().registry).decode()
    assert "gpu_memory" not in text
    assert engine_gpu_memory(None) is None
    null = NullEngine.from_model_dir(load_model_dir(default_model_path()))
    assert engine_gpu_memory(null) is None
    assert engine_gpu_memory(NullEngine(replace(null.info, device="cpu"))) is None


@pytest.fixture(scope="module")
def cpu_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    workdir: Path = tmp_path_factory.mktemp("cpu-worker")
    with running_worker(workdir, *WORKER_ARGS, "--device", "cpu") as worker:
        yield worker


def test_a_cpu_worker_exports_no_gpu_memory(cpu_worker: WorkerProcess) -> None:
    text = cpu_worker.metrics_text()
    # The registry is complete (the worker is serving), so the absence is not a missing scrape.
    assert "embedfleet_worker_ready 1.0" in text
    assert "gpu_memory" not in text


@pytest.mark.gpu
def test_a_cuda_worker_exports_its_gpu_memory(tmp_path: Path) -> None:
    with running_worker(tmp_path, *WORKER_ARGS, "--device", "cuda") as worker:
        found = samples(worker.metrics_text())
    allocated = found[("embedfleet_worker_gpu_memory_bytes", "allocated")]
    reserved = found[("embedfleet_worker_gpu_memory_bytes", "reserved")]
    total = found[("embedfleet_worker_gpu_memory_total_bytes", "")]
    # MiniLM's weights alone are ~45 MB in bf16; the allocator reserves at least what it hands out.
    assert allocated > 20e6, found
    assert allocated <= reserved <= total, found
