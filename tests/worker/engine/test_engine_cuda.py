"""Real CUDA graphs and async results (marked gpu: skipped where there is no CUDA device)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedfleet.common.similarity import min_cosine
from embedfleet.worker.contract import Options
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.torch_engine import TorchEngine

from .helpers import item, random_sequences

pytestmark = pytest.mark.gpu


def gpu_engine(**kw: object) -> TorchEngine:
    return TorchEngine(EngineConfig(device="cuda", max_input_tokens=512, **kw))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def lazy() -> TorchEngine:
    return gpu_engine(cuda_graphs="lazy")


def test_gpu_defaults(lazy: TorchEngine) -> None:
    assert lazy.info.dtype == "bfloat16"
    assert lazy.backend.graph_safe, f"{lazy.backend.name} cannot be captured"


def test_lazy_capture_then_replay_matches_reference(
    lazy: TorchEngine, minilm_sequences: list[list[int]], minilm_reference: np.ndarray
) -> None:
    before = lazy.counters()
    runs = [lazy.run([item(minilm_sequences)])[0] for _ in range(3)]
    after = lazy.counters()
    assert after.eager_runs - before.eager_runs == 1
    assert after.captures - before.captures == 1
    assert after.replays - before.replays == 1
    assert after.capture_seconds > 0
    for got in runs:
        assert min_cosine(got, minilm_reference) >= 0.999
    assert min_cosine(runs[1], runs[2]) >= 0.99999


def test_other_contents_same_bucket_replay_correctly(
    lazy: TorchEngine, minilm_sequences: list[list[int]], minilm_reference: np.ndarray
) -> None:
    # Two different batches that share a bucket: the second replays the first's graph. (4:10
    # and 3:9, 347 and 225 tokens, were two buckets: the first GPU run failed on that.)
    a, b = minilm_sequences[4:10], minilm_sequences[3:10]
    key = lazy.buckets.key
    assert key(sum(map(len, a)), len(a)) == key(sum(map(len, b)), len(b))
    lazy.run([item(a)])
    lazy.run([item(a)])
    replays = lazy.counters().replays
    [got] = lazy.run([item(b)])
    assert lazy.counters().replays == replays + 1
    assert min_cosine(got, minilm_reference[3:10]) >= 0.999


def test_options_on_graph_outputs(lazy: TorchEngine, minilm_sequences: list[list[int]]) -> None:
    seqs = minilm_sequences[5:9]
    for _ in range(3):
        mixed = lazy.run(
            [item(seqs[:2], Options(dimensions=64)), item(seqs[2:], Options(pooling="cls"))]
        )
    off = gpu_engine(cuda_graphs="off")
    ref = off.run([item(seqs[:2], Options(dimensions=64)), item(seqs[2:], Options(pooling="cls"))])
    assert mixed[0].shape == (2, 64)
    assert min_cosine(mixed[0], ref[0]) >= 0.9999
    assert min_cosine(mixed[1], ref[1]) >= 0.9999


def test_async_next_batch_launches_before_reading(
    lazy: TorchEngine, minilm_sequences: list[list[int]], minilm_reference: np.ndarray
) -> None:
    first = lazy.step([item(minilm_sequences[:10])])
    second = lazy.step([item(minilm_sequences[10:])])
    got = np.concatenate([first.wait()[0], second.wait()[0]])
    assert first.ready()
    assert second.ready()
    assert min_cosine(got, minilm_reference) >= 0.999


def test_eviction_bound_and_eager_mode() -> None:
    engine = gpu_engine(cuda_graphs="lazy", max_graphs=1)
    short, long = [[101, 2000, 102]], [[101] + [2000] * 300 + [102]]
    for seqs in (short, short, long, long, short, short):
        engine.run([item(seqs)])
    c = engine.counters()
    assert c.captures == 3
    assert engine._runner is not None
    assert len(engine._runner) == 1
    listed = gpu_engine(cuda_graphs="eager", graph_buckets=(128,))
    assert listed.counters().captures > 0
    listed.run([item(short)])
    assert listed.counters().replays == 1
    assert listed.counters().eager_runs == 0


def test_graphs_off_never_captures() -> None:
    engine = gpu_engine(cuda_graphs="off")
    for _ in range(3):
        engine.run([item([[101, 2000, 102]])])
    assert engine.counters().captures == 0
    assert engine.counters().eager_runs == 3


def test_qwen3_on_gpu_matches_cpu(qwen3_causal_dir: Path) -> None:
    seqs = random_sequences(512, (1, 5, 64, 200), seed=4)
    cpu = TorchEngine(EngineConfig(model=str(qwen3_causal_dir), device="cpu", dtype="float32"))
    gpu = TorchEngine(EngineConfig(model=str(qwen3_causal_dir), device="cuda"))
    [ref] = cpu.run([item(seqs)])
    for _ in range(3):
        [got] = gpu.run([item(seqs)])
        assert min_cosine(got, ref) >= 0.999
    assert gpu.counters().replays == 1
    assert torch.cuda.is_available()


# ---- issue 19: the mechanisms behind the CPU-tested decisions --------------------------------


def test_every_captured_bucket_replays_like_eager(minilm_sequences: list[list[int]]) -> None:
    # Each new capture is compared with its eager run inside the engine (rejects counts the
    # failures); here also against a graphs-off engine for a spread of bucket sizes.
    engine = gpu_engine(cuda_graphs="lazy")
    off = gpu_engine(cuda_graphs="off")
    batches = [minilm_sequences[i : i + n] for i, n in ((0, 1), (7, 2), (8, 6), (0, 19), (12, 7))]
    batches.append([minilm_sequences[-1]] * 32)  # 16k tokens: the largest bucket
    for seqs in batches:
        [ref] = off.run([item(seqs)])
        for _ in range(3):
            [got] = engine.run([item(seqs)])
            assert min_cosine(got, ref) >= 0.999
    c = engine.counters()
    assert c.rejects == 0
    assert c.captures == len(engine._cache.live) == len(batches)


def test_a_disagreeing_capture_is_never_served(minilm_sequences: list[list[int]]) -> None:
    engine = gpu_engine(cuda_graphs="lazy")
    seqs = minilm_sequences[4:10]
    engine.run([item(seqs)])
    runner = engine._runner_for()
    real_capture = runner.capture

    def bad_capture(*args: object) -> tuple[torch.Tensor, ...]:
        hidden, head, rows = real_capture(*args)  # type: ignore[arg-type]
        return hidden, head.flip(0), rows.flip(0)

    runner.capture = bad_capture  # type: ignore[method-assign]
    [ref] = gpu_engine(cuda_graphs="off").run([item(seqs)])
    for _ in range(3):
        [got] = engine.run([item(seqs)])
        assert min_cosine(got, ref) >= 0.999
    c = engine.counters()
    assert (c.captures, c.rejects, c.replays) == (1, 1, 0)
    assert len(runner) == 0


def test_graphs_share_static_outputs_and_launch_at_the_longest_sequence(
    minilm_sequences: list[list[int]],
) -> None:
    engine = gpu_engine(cuda_graphs="lazy")
    small, large = minilm_sequences[2:6], minilm_sequences[10:19]
    for seqs in (small, small, large, large):
        engine.run([item(seqs)])
    runner = engine._runner_for()
    assert len(runner.live) == 2
    for key in runner.live:
        assert key.attention <= engine.max_tokens
    # The outputs of each graph's replay, as the engine replays it (after loading its batch: a
    # graph replayed over another bucket's inputs reads offsets past its own token count).
    outs: list[tuple[int, ...]] = []
    real_replay = runner.replay

    def replay(key: object) -> tuple[torch.Tensor, ...]:
        got = real_replay(key)  # type: ignore[arg-type]
        outs.append(tuple(o.data_ptr() for o in got))
        return got

    runner.replay = replay  # type: ignore[method-assign]
    for seqs in (small, large):
        engine.run([item(seqs)])
    assert len(outs) == 2
    assert outs[0] == outs[1]  # one buffer of each output for every graph
    # Staging buffers are pinned and reused, result buffers too.
    assert runner._staging.buffer(0).is_pinned()
    assert engine._host_outputs is not None
    before = engine._host_outputs.allocated
    for _ in range(10):
        engine.run([item(small)])
    assert engine._host_outputs.allocated == before


def test_float32_on_cuda_reports_graphs_off_and_eager_mode_refuses() -> None:
    from embedfleet.worker.engine.attention import BackendUnavailableError

    lazy32 = gpu_engine(cuda_graphs="lazy", dtype="float32")
    c = lazy32.counters()
    assert c.graphs_off_reason
    assert c.attention == "torch-grouped"
    with pytest.raises(BackendUnavailableError, match="cannot be captured"):
        gpu_engine(cuda_graphs="eager", dtype="float32")


def test_auto_attention_is_benchmarked_and_exported(lazy: TorchEngine) -> None:
    assert lazy.counters().attention == lazy.backend.name
    assert lazy.backend.graph_safe


def test_memory_fraction_is_applied() -> None:
    engine = gpu_engine(cuda_graphs="off", cuda_memory_fraction=0.5)
    [got] = engine.run([item([[101, 2000, 102]])])
    assert got.shape == (1, 384)
