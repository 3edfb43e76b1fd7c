"""What a `TorchEngine` will be, decided in one place: `plan_engine(config, facts, model)`.

The plan is a pure function of the engine's settings, a few facts about the machine and two facts
about the model, so every decision is tested without a device (tests/worker/engine/test_plan.py);
the engine only carries it out. Two choices need a measurement on the device itself and are made
while loading, from inputs the plan fixes: a reduced dtype's parity probe on a CPU (`precision`)
and the attention backend's micro-benchmark (`attention.select_backend`). Whether graphs are
captured then follows from the chosen backend through `EnginePlan.graphs`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from embedfleet.worker.contract import UnservableError
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.graph_policy import (
    BucketPolicy,
    GraphKey,
    GraphMode,
    GraphsPlan,
    graphs_plan,
)
from embedfleet.worker.engine.runtime import (
    OPENVINO_MAX_TOKENS,
    RUNTIMES,
    RuntimeName,
    auto_runtime,
    openvino_available,
)


@dataclass(frozen=True)
class DeviceFacts:
    """What the plan needs to know about this machine (`probe` reads it)."""

    cuda: bool
    #: torch's intra-op threads before the engine sets any
    threads: int
    #: whether the openvino package is installed
    openvino: bool = False

    @classmethod
    def probe(cls, device: str) -> DeviceFacts:
        """This machine's facts; CUDA is looked for only where `device` may be a GPU."""
        cuda = device.partition(":")[0] in ("auto", "cuda") and torch.cuda.is_available()
        return cls(cuda, torch.get_num_threads(), openvino_available())


@dataclass(frozen=True)
class ModelFacts:
    """What the plan needs to know about the model directory."""

    task: str
    #: the model's input limit, after the --max-input-tokens override
    max_tokens: int


@dataclass(frozen=True)
class EnginePlan:
    #: what torch.device() is given: "cpu", "cuda", "cuda:1", ...
    device: str
    #: torch.set_num_threads at start (0: leave torch's own)
    set_threads: int
    #: the GPU's share this engine may allocate (0: no limit)
    memory_fraction: float
    #: the GPU index the limit applies to (None: the current device)
    memory_index: int | None
    runtime: RuntimeName
    #: the engine's input limit: the model's, or OpenVINO's attention bound below it
    max_tokens: int
    #: torch's threads for eager batches, and around a compiled runtime's graph calls
    eager_threads: int
    graph_threads: int
    #: measure the longest sequence the compiled runtime beats eager on (else it runs them all)
    measure_seqlen: bool
    #: offer graph-safe attention backends first (graphs may be captured)
    prefer_graph_safe: bool
    buckets: BucketPolicy
    #: the largest bucket: the size of static graph buffers and of the pinned staging buffer
    capacity: GraphKey
    #: stage batches through pinned host memory and copy outputs back asynchronously
    pinned: bool

    @property
    def device_type(self) -> str:
        return self.device.partition(":")[0]

    def graphs(self, mode: GraphMode, backend: str, graph_safe: bool, needs: str) -> GraphsPlan:
        """Whether graphs are captured with the attention backend the engine chose."""
        return graphs_plan(self.device_type, mode, backend, graph_safe, needs)


def plan_engine(config: EngineConfig, facts: DeviceFacts, model: ModelFacts) -> EnginePlan:
    """The engine `config` makes on a machine with `facts` for a model with `model`'s limits.
    Raises UnservableError for settings that cannot run there."""
    if not 0.0 <= config.cuda_memory_fraction <= 1.0:
        raise UnservableError("--cuda-memory-fraction must be between 0 and 1")
    device = _device(config.device, facts)
    device_type, _, index = device.partition(":")
    runtime = _runtime(config, device, facts, model.max_tokens)
    max_tokens = model.max_tokens
    if runtime == "openvino":
        # Its attention materializes each sequence's L x L scores per head: a Qwen3's
        # 40,960-token limit took a worker past 22 GB in the start-up probe alone.
        max_tokens = min(max_tokens, OPENVINO_MAX_TOKENS)
    threads = config.threads if config.threads > 0 else facts.threads
    # Around an OpenVINO graph torch runs only pooling and small heads, and its OpenMP threads,
    # spinning after each op, took the cores from OpenVINO's: one thread made a 16-token batch
    # 0.77x and a 128-token one 0.83x (docs/engine.md). A SPLADE head (a vocabulary-wide GEMM
    # per token) keeps them.
    graph_threads = 1 if runtime == "openvino" and model.task != "sparse" else threads
    cuda = device_type == "cuda"
    # Padding sequences and the graphs' attention launch stop at the longest real sequence.
    buckets = dataclasses.replace(
        config.buckets, max_sequences=config.max_batch_sequences, max_seqlen=max_tokens
    )
    return EnginePlan(
        device=device,
        set_threads=max(0, config.threads),
        # Several engines share one GPU (enginesPerGPU): each keeps to its own share, so one
        # engine's allocator growth cannot starve the others.
        memory_fraction=config.cuda_memory_fraction if cuda else 0.0,
        memory_index=int(index) if index else None,
        runtime=runtime,
        max_tokens=max_tokens,
        eager_threads=threads,
        graph_threads=graph_threads,
        measure_seqlen=runtime == "openvino" and config.cpu_runtime == "auto",
        prefer_graph_safe=config.cuda_graphs != "off",
        buckets=buckets,
        capacity=buckets.capacity(max(config.max_batch_tokens, max_tokens)),
        pinned=cuda,
    )


def _device(name: str, facts: DeviceFacts) -> str:
    if name == "auto":
        return "cuda" if facts.cuda else "cpu"
    if name.partition(":")[0] == "cuda" and not facts.cuda:
        raise UnservableError(
            f"--device {name}: CUDA is not available here; use --device cpu (or auto)"
        )
    return name


def _runtime(config: EngineConfig, device: str, facts: DeviceFacts, limit: int) -> RuntimeName:
    """The runtime --cpu-runtime names on `device`. CUDA runs eager (with CUDA graphs); auto on
    a CPU: `runtime.auto_runtime`."""
    choice = config.cpu_runtime
    if choice not in RUNTIMES:
        raise UnservableError(f"unknown CPU runtime {choice!r}; use one of {list(RUNTIMES)}")
    if device.partition(":")[0] != "cpu":
        if choice in ("inductor", "openvino"):
            raise UnservableError(f"--cpu-runtime {choice} runs on a CPU only (device is {device})")
        return "eager"
    if choice == "auto":
        return auto_runtime(facts.openvino, bool(config.openvino_cache_dir), limit)
    if choice == "openvino" and not facts.openvino:
        raise UnservableError(
            "--cpu-runtime openvino needs the openvino package (pip install "
            "'embedfleet-worker[openvino]')"
        )
    return next(r for r in RUNTIMES if r == choice)
