"""The engine's settings: the part of WorkerSettings that shapes loading and running batches."""

from __future__ import annotations

from dataclasses import dataclass, field

from embedfleet.worker.engine.graph_policy import BucketPolicy, GraphMode, graph_mode
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
    attention: str = "auto"
    cuda_graphs: GraphMode = "lazy"
    graph_buckets: tuple[int, ...] = ()
    max_graphs: int = 64
    buckets: BucketPolicy = field(default_factory=BucketPolicy)
    max_batch_tokens: int = 16384
    max_batch_sequences: int = 512
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
            attention=s.attention,
            cuda_graphs=graph_mode(s.cuda_graphs),
            graph_buckets=tuple(s.graph_buckets),
            max_graphs=s.max_graphs,
            buckets=BucketPolicy(
                s.token_bucket_step, s.token_bucket_switch, s.token_bucket_large_step
            ),
            max_batch_tokens=s.max_batch_tokens,
            max_batch_sequences=s.max_batch_sequences,
        )
