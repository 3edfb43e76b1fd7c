"""The engine's settings: the part of WorkerSettings that shapes loading and running batches."""

from __future__ import annotations

from dataclasses import dataclass, field

from embedfleet.worker.engine.graph_policy import (
    SEQUENCE_SCHEMES,
    TOKEN_SCHEMES,
    BucketPolicy,
    GraphMode,
    graph_mode,
)
from embedfleet.worker.settings import WorkerSettings


@dataclass(frozen=True)
class EngineConfig:
    """See WorkerSettings for each field's meaning."""

    model: str = ""
    task: str = "auto"
    max_input_tokens: int = 0
    device: str = "auto"
    dtype: str = "auto"
    threads: int = 0
    cpu_runtime: str = "auto"
    openvino_cache_dir: str = ""
    attention: str = "auto"
    cuda_graphs: GraphMode = "lazy"
    graph_buckets: tuple[int, ...] = ()
    max_graphs: int = 64
    buckets: BucketPolicy = field(default_factory=BucketPolicy)
    max_batch_tokens: int = 16384
    max_batch_sequences: int = 512
    cuda_memory_fraction: float = 0.0
    #: Qwen3 only: None follows config.json; True = full attention within each sequence
    bidirectional: bool | None = None

    @classmethod
    def from_settings(cls, s: WorkerSettings) -> EngineConfig:
        return cls(
            model=s.model,
            task=s.task,
            max_input_tokens=s.max_input_tokens,
            device=s.device,
            dtype=s.dtype,
            threads=s.threads,
            cpu_runtime=s.cpu_runtime,
            openvino_cache_dir=s.openvino_cache_dir,
            attention=s.attention,
            cuda_graphs=graph_mode(s.cuda_graphs),
            graph_buckets=tuple(s.graph_buckets),
            max_graphs=s.max_graphs,
            buckets=BucketPolicy(
                token_scheme=next(t for t in TOKEN_SCHEMES if t == s.token_buckets),
                token_step=s.token_bucket_step,
                token_switch=s.token_bucket_switch,
                token_large_step=s.token_bucket_large_step,
                per_octave=s.token_buckets_per_octave,
                sequence_scheme=next(q for q in SEQUENCE_SCHEMES if q == s.sequence_buckets),
                max_sequences=s.max_batch_sequences,
            ),
            max_batch_tokens=s.max_batch_tokens,
            max_batch_sequences=s.max_batch_sequences,
            cuda_memory_fraction=s.cuda_memory_fraction,
        )
