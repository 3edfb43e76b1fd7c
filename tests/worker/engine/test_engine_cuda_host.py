"""The GPU host path's mechanisms (issue 36), behind the decisions the CPU tests check.

Marked gpu: skipped where there is no CUDA device. bench/gpu_check.sh runs them on one.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from embedfleet.bench.random_models import TINY_QWEN3, qwen3_dir
from embedfleet.common.similarity import min_cosine
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.torch_engine import TorchEngine
from embedfleet.worker.metrics import WorkerMetrics
from embedfleet.worker.runner import BatchRunner, Entry
from embedfleet.worker.scheduler import Budget, FcfsQueue

from .helpers import item

pytestmark = pytest.mark.gpu


def gpu_engine(**kw: object) -> TorchEngine:
    return TorchEngine(EngineConfig(device="cuda", max_input_tokens=512, **kw))  # type: ignore[arg-type]


def test_inputs_reach_the_graph_in_one_contiguous_copy(minilm_sequences: list[list[int]]) -> None:
    engine = gpu_engine(cuda_graphs="lazy")
    seqs = minilm_sequences[3:8]
    for _ in range(2):
        engine.run([item(seqs)])  # eager, capture
    runner = engine._runner_for()
    static = runner._inputs
    views = runner.load(engine._filler(runner.live[0]))  # type: ignore[arg-type]
    start, end = static.data_ptr(), static.data_ptr() + static.numel()
    for tensor in (views.input_ids, views.lengths, views.cu_seqlens):
        assert start <= tensor.data_ptr() < end  # views of the one static buffer
    # The profiler sees one host-to-device copy per batch (three, each then copied again by a
    # kernel into strided rows, before).
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        engine.run([item(seqs)])
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert sum("HtoD" in n for n in names) == 1, names


def test_default_options_launch_nothing_after_the_replay(
    minilm_sequences: list[list[int]], minilm_reference: np.ndarray
) -> None:
    engine = gpu_engine(cuda_graphs="lazy")
    seqs = minilm_sequences[:6]
    for _ in range(2):
        engine.run([item(seqs)])
    runner = engine._runner_for()
    rows = runner._outputs[2]
    with torch.inference_mode():
        out, _ = engine._run([item(seqs)])
    assert rows.data_ptr() <= out.data_ptr() < rows.data_ptr() + rows.numel() * 4
    [got] = engine.run([item(seqs)])
    assert min_cosine(got, minilm_reference[:6]) >= 0.999


def test_warm_up_captures_every_bucket_and_clients_pay_no_capture(
    minilm_sequences: list[list[int]],
) -> None:
    engine = gpu_engine(cuda_graphs="lazy", max_batch_tokens=4096)
    warm = engine.warm_graphs(budget_seconds=120.0)
    assert warm.planned == warm.captured == warm.live == len(engine.buckets.token_buckets(4096))
    assert warm.pool_bytes > 0
    assert engine.counters().rejects == 0
    before = engine.counters()
    for n in (1, 5, 13):
        engine.run([item(minilm_sequences[:n])])
    after = engine.counters()
    assert (after.captures, after.eager_runs) == (before.captures, before.eager_runs)
    assert after.replays == before.replays + 3


def test_evicting_every_graph_gives_the_pool_back() -> None:
    engine = gpu_engine(cuda_graphs="lazy", max_batch_tokens=4096)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    engine.warm_graphs(budget_seconds=120.0)
    runner = engine._runner_for()
    held = torch.cuda.memory_reserved()
    assert runner.pool_bytes > 0
    for key in list(runner.live):
        runner.evict(key)
    assert runner.pool_bytes == 0
    assert torch.cuda.memory_reserved() < held


def test_long_limit_model_launches_attention_at_its_bucketed_sequences(tmp_path: Path) -> None:
    from dataclasses import replace

    model = qwen3_dir(tmp_path / "qwen3", replace(TINY_QWEN3, positions=32768))
    engine = TorchEngine(EngineConfig(model=str(model), device="cuda", max_batch_tokens=16384))
    assert engine.max_tokens == 32768
    seqs = [[100 + i % 500 for i in range(400)]] * 40  # 16,000 tokens of 400-token sequences
    off = TorchEngine(EngineConfig(model=str(model), device="cuda", cuda_graphs="off"))
    [ref] = off.run([item(seqs)])
    for _ in range(3):
        [got] = engine.run([item(seqs)])
        assert min_cosine(got, ref) >= 0.999
    [key] = engine._runner_for().live
    assert (key.tokens, key.attention) == (16384, 512)


def test_the_engine_thread_is_woken_by_the_device(minilm_sequences: list[list[int]]) -> None:
    engine = gpu_engine(cuda_graphs="lazy")
    [expected] = engine.run([item(minilm_sequences[:4])])

    async def serve_one() -> np.ndarray:
        queue: FcfsQueue[Entry] = FcfsQueue(Budget(16384, 512, 65536), 100)
        runner = BatchRunner(engine, queue, WorkerMetrics(), asyncio.get_running_loop())
        runner.start()
        try:
            results = []
            for _ in range(3):
                entry = runner.submit(item(minilm_sequences[:4]))
                results.append(await asyncio.wait_for(entry.future, 30))
            assert runner._waiter is not None  # the results came through the waiter thread
            return results[-1]
        finally:
            runner.stop()
            runner.join(10)

    got = asyncio.run(serve_one())
    assert min_cosine(got, expected) >= 0.9999


def test_a_real_sticky_error_is_classified_as_a_lost_device() -> None:
    # In a process of its own: a device-side assert ends that process's CUDA context.
    code = (
        "import torch\n"
        "from embedfleet.worker.device_errors import device_lost\n"
        "x = torch.zeros(4, device='cuda')\n"
        "try:\n"
        "    x[torch.tensor([100], device='cuda')] = 1.0\n"
        "    torch.cuda.synchronize()\n"
        "except Exception as exc:\n"
        "    first = device_lost(exc)\n"
        "    try:\n"
        "        torch.ones(1, device='cuda').sum().item()\n"
        "        later = False\n"
        "    except Exception as again:\n"
        "        later = device_lost(again)\n"
        "    print('lost', first, later)\n"
        "else:\n"
        "    print('no error')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert "lost True True" in run.stdout, run.stdout + run.stderr[-2000:]
