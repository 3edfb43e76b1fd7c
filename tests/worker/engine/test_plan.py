"""The engine's plan: every start-up decision from settings and facts, without a device."""

from __future__ import annotations

import pytest

from embedfleet.worker.contract import UnservableError
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.plan import DeviceFacts, EnginePlan, ModelFacts, plan_engine
from embedfleet.worker.engine.runtime import OPENVINO_MAX_TOKENS

CPU = DeviceFacts(cuda=False, threads=8, openvino=True)
GPU = DeviceFacts(cuda=True, threads=8, openvino=True)
BERT = ModelFacts(task="embed", max_tokens=512)


def plan(facts: DeviceFacts = CPU, model: ModelFacts = BERT, **config: object) -> EnginePlan:
    return plan_engine(EngineConfig(**config), facts, model)  # type: ignore[arg-type]


def test_cpu_runs_eager_without_pinned_staging() -> None:
    got = plan(CPU)
    assert (got.device, got.runtime, got.pinned, got.memory_fraction) == ("cpu", "eager", False, 0)
    # torch's own threads are kept: none set, eager and graph calls alike
    assert (got.set_threads, got.eager_threads, got.graph_threads) == (0, 8, 8)
    assert got.max_tokens == 512
    assert got.buckets.max_seqlen == 512


def test_cuda_pins_and_limits_its_memory_share() -> None:
    got = plan(GPU, cuda_memory_fraction=0.5, threads=2)
    assert (got.device, got.runtime, got.pinned) == ("cuda", "eager", True)
    assert (got.memory_fraction, got.memory_index) == (0.5, None)
    assert (got.set_threads, got.eager_threads) == (2, 2)
    assert plan(GPU, device="cuda:1", cuda_memory_fraction=0.5).memory_index == 1
    # A CPU engine on a GPU machine leaves the GPU alone.
    cpu = plan(GPU, device="cpu", cuda_memory_fraction=0.5)
    assert (cpu.memory_fraction, cpu.pinned) == (0.0, False)


def test_capacity_covers_the_larger_of_batch_and_input_limit() -> None:
    small = plan(max_batch_tokens=256, max_batch_sequences=16)
    assert small.capacity.tokens >= 512
    assert small.buckets.max_sequences == 16
    assert plan(max_batch_tokens=8192).capacity.tokens >= 8192


def test_device_and_memory_settings_refused() -> None:
    with pytest.raises(UnservableError, match="CUDA is not available here; use --device cpu"):
        plan(CPU, device="cuda")
    with pytest.raises(UnservableError, match="between 0 and 1"):
        plan(GPU, cuda_memory_fraction=1.5)


def test_runtime_choice() -> None:
    # Eager although openvino is installed: without a kept cache its conversion would cost
    # every new pod most of a minute of start-up.
    assert plan(CPU).runtime == "eager"
    assert plan(CPU, openvino_cache_dir="/c").runtime == "openvino"
    assert plan(GPU, openvino_cache_dir="/c").runtime == "eager"  # CUDA graphs instead
    assert plan(CPU, cpu_runtime="openvino").runtime == "openvino"
    assert plan(CPU, cpu_runtime="inductor").runtime == "inductor"
    with pytest.raises(ValueError, match="CPU only"):
        plan(GPU, cpu_runtime="openvino")
    with pytest.raises(ValueError, match="unknown CPU runtime"):
        plan(CPU, cpu_runtime="tensorrt")


def test_openvino_by_name_needs_the_package() -> None:
    bare = DeviceFacts(cuda=False, threads=4, openvino=False)
    assert plan(bare, openvino_cache_dir="/c").runtime == "eager"
    with pytest.raises(ValueError, match=r"embedfleet-worker\[openvino\]"):
        plan(bare, cpu_runtime="openvino")


def test_openvino_gives_torch_one_thread_and_bounds_the_input() -> None:
    long = ModelFacts(task="embed", max_tokens=40960)
    got = plan(CPU, long, cpu_runtime="openvino")
    assert got.max_tokens == OPENVINO_MAX_TOKENS == got.buckets.max_seqlen
    assert (got.eager_threads, got.graph_threads, got.measure_seqlen) == (8, 1, False)
    # auto measures where the compiled graph pays; it never lowers a model's limit, so a long
    # model stays eager
    assert plan(CPU, openvino_cache_dir="/c").measure_seqlen
    assert plan(CPU, long, openvino_cache_dir="/c").runtime == "eager"
    # A SPLADE head's vocabulary-wide GEMM keeps torch's threads.
    sparse = plan(CPU, ModelFacts("sparse", 512), cpu_runtime="openvino")
    assert sparse.graph_threads == 8


def test_graphs_follow_the_chosen_backend() -> None:
    gpu, cpu = plan(GPU), plan(CPU)
    assert gpu.prefer_graph_safe
    assert not plan(GPU, cuda_graphs="off").prefer_graph_safe
    assert gpu.graphs("lazy", "flash-attn", True, "").enabled
    assert not cpu.graphs("lazy", "flash-attn", True, "").enabled
    lazy = gpu.graphs("lazy", "grouped", False, "")
    assert (lazy.enabled, lazy.warn, lazy.refuse) == (False, True, False)
    assert gpu.graphs("eager", "grouped", False, "bias").refuse
