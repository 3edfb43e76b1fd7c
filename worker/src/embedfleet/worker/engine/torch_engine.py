"""The PyTorch engine: ragged batches in, pooled vectors or scores out, graphs on CUDA.

`step()` validates cheaply, packs every sequence of every work item into one token axis, runs the
model (replaying a captured CUDA graph when the bucket has one), pools, applies each item's options
and queues the copy back to pinned host memory; it returns before the device is done. What runs is
decided elsewhere: the device and dtype before the engine exists (`precision`), bucket actions by
`graph_policy`, per-item options by `outputs`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import Tokens
from embedfleet.common.modeldir import ModelDir, load_model_dir, resolve_model_path
from embedfleet.worker.contract import (
    Done,
    EngineInfo,
    GraphCounters,
    InvalidInputError,
    Pending,
    WorkItem,
    output_dimensions,
)
from embedfleet.worker.engine.attention import AttentionBackend, select_backend
from embedfleet.worker.engine.batch import DeviceBatch, HostBatch, pack, to_device
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.forward import forward
from embedfleet.worker.engine.graph_policy import Action, GraphCache, GraphKey
from embedfleet.worker.engine.graph_runner import GraphRunner
from embedfleet.worker.engine.outputs import apply_options
from embedfleet.worker.engine.pending import InFlight, Slice, split
from embedfleet.worker.engine.precision import dtype_name, load_model_at_dtype, resolve_device
from embedfleet.worker.settings import WorkerSettings

log = logging.getLogger(__name__)


class TorchEngine:
    """Implements `contract.Engine`. `step` is called from one thread only."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.threads > 0:
            # Process-wide, and set before the first op: the engine is the process's only user.
            torch.set_num_threads(config.threads)
        self.model_dir: ModelDir = load_model_dir(resolve_model_path(config.model), config.task)
        self.device = resolve_device(config.device)
        self.max_tokens = self.model_dir.max_input_tokens(config.max_input_tokens)
        self.dtype, self.model = load_model_at_dtype(
            self.model_dir,
            self.device,
            config.dtype,
            config.attention,
            self.max_tokens,
            config.bidirectional,
        )
        self.backend: AttentionBackend = select_backend(config.attention, self.device, self.dtype)
        self.shape = self.model.shape
        self._info = EngineInfo(
            model_name=self.model_dir.name,
            task=self.model_dir.task,
            dimensions=output_dimensions(self.model_dir),
            max_input_tokens=self.max_tokens,
            vocab_size=self.shape.vocab_size,
            dtype=dtype_name(self.dtype),
            device=str(self.device),
            default_pooling=self.model_dir.pooling,
            default_normalize=self.model_dir.normalize,
            activation=self.model_dir.activation,
        )
        self._cache = GraphCache(
            mode=config.cuda_graphs,
            max_graphs=config.max_graphs,
            max_tokens=config.buckets.tokens(max(config.max_batch_tokens, self.max_tokens)),
        )
        self._runner: GraphRunner | None = None
        self._graphs_enabled = (
            self.device.type == "cuda" and config.cuda_graphs != "off" and self.backend.graph_safe
        )
        if self.device.type == "cuda" and config.cuda_graphs != "off" and not self._graphs_enabled:
            log.warning(
                "attention backend %s cannot be captured: CUDA graphs off", self.backend.name
            )
        self._counts = {"captures": 0, "replays": 0, "eager_runs": 0}
        if self._graphs_enabled and config.cuda_graphs == "eager":
            self._capture_listed()

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> TorchEngine:
        return cls(EngineConfig.from_settings(settings))

    # ---- contract ------------------------------------------------------------------------

    @property
    def info(self) -> EngineInfo:
        return self._info

    def validate(self, item: WorkItem) -> None:
        tokens = item.tokens
        if tokens.count == 0:
            raise InvalidInputError("no sequences to run")
        lengths = tokens.lengths
        if int(lengths.min()) <= 0:
            raise InvalidInputError(f"sequence {int(np.argmin(lengths))} is empty")
        longest = int(lengths.max())
        if longest > self.max_tokens:
            raise InvalidInputError(
                f"sequence of {longest} tokens exceeds the limit of {self.max_tokens} tokens"
            )
        ids = tokens.ids
        if int(ids.min()) < 0 or int(ids.max()) >= self.shape.vocab_size:
            raise InvalidInputError(f"token id outside the vocabulary [0, {self.shape.vocab_size})")
        types = tokens.type_ids
        if types is not None and types.size and int(types.max()) >= self.shape.type_vocab_size:
            raise InvalidInputError(
                f"token type id outside [0, {self.shape.type_vocab_size}) for this model"
            )
        dims = item.options.dimensions
        if self.model_dir.task == "embed" and not 0 <= dims <= self.shape.hidden_size:
            raise InvalidInputError(
                f"dimensions must be between 1 and {self.shape.hidden_size} (0 for all)"
            )

    def step(self, items: Sequence[WorkItem]) -> Pending:
        if not items:
            return Done([])
        # Cheap, and an id past the vocabulary would be a device-side assert on CUDA.
        for item in items:
            self.validate(item)
        with torch.inference_mode():
            out, slices = self._run(items)
            if self.device.type == "cuda":
                return InFlight(out, slices)
            return Done(split(out.numpy(), slices))

    def counters(self) -> GraphCounters:
        return GraphCounters(
            captures=self._counts["captures"],
            replays=self._counts["replays"],
            eager_runs=self._counts["eager_runs"],
            capture_seconds=self._runner.capture_seconds if self._runner else 0.0,
        )

    # ---- conveniences --------------------------------------------------------------------

    def run(self, items: Sequence[WorkItem]) -> list[FloatArray]:
        """step + wait."""
        return self.step(items).wait()

    # ---- internals -----------------------------------------------------------------------

    def _run(self, items: Sequence[WorkItem]) -> tuple[torch.Tensor, list[Slice]]:
        parts = [it.tokens for it in items]
        offset = self.shape.position_offset
        total = sum(p.total for p in parts)
        count = sum(p.count for p in parts)
        if self._graphs_enabled:
            decision = self._cache.decide(self.config.buckets.key(total, count))
            key = decision.key
            if key is not None and not self._runner_for().fits(key):
                self._cache.forget(key)  # more sequences than the static buffers hold
            elif key is not None:
                host = pack(parts, offset, key.tokens, key.sequences)
                graphed = self._graph_outputs(key, host, decision.action, decision.evict)
                if graphed is not None:
                    outputs, views = graphed
                    return self._finish(items, outputs, views, host)
        host = pack(parts, offset)
        batch = to_device(host, self.device)
        outputs = self._body(batch, int(host.lengths.max()), host)
        self._counts["eager_runs"] += 1
        return self._finish(items, outputs, batch, host)

    def _graph_outputs(
        self,
        key: GraphKey,
        host: HostBatch,
        action: Action,
        evict: tuple[GraphKey, ...],
    ) -> tuple[tuple[torch.Tensor, ...], DeviceBatch] | None:
        runner = self._runner_for()
        for old in evict:
            runner.evict(old)
        views = runner.load(host)
        if action is Action.REPLAY:
            self._counts["replays"] += 1
            return runner.replay(key), views
        try:
            outputs = runner.capture(key, views)
        except RuntimeError:
            log.exception("CUDA graph capture failed for %s; running it eager from now on", key)
            self._cache.forget(key)
            runner.evict(key)
            return None
        self._counts["captures"] += 1
        return outputs, views

    def _runner_for(self) -> GraphRunner:
        if self._runner is None:
            buckets = self.config.buckets
            tokens = buckets.tokens(max(self.config.max_batch_tokens, self.max_tokens))
            seqs = buckets.sequences(self.config.max_batch_sequences)
            self._runner = GraphRunner(self._graph_body, self.device, tokens, seqs)
        return self._runner

    def _graph_body(self, batch: DeviceBatch, max_seqlen: int) -> tuple[torch.Tensor, ...]:
        return self._body(batch, max_seqlen, None)

    def _body(
        self, batch: DeviceBatch, max_seqlen: int, host: HostBatch | None
    ) -> tuple[torch.Tensor, ...]:
        """Forward + the default head: (hidden [T, H], pooled [N, H] or scores [N])."""
        lengths = host.lengths if host is not None else np.zeros(0, np.int64)
        return forward(self.model, self.backend, self.model_dir.pooling, batch, max_seqlen, lengths)

    def _finish(
        self,
        items: Sequence[WorkItem],
        outputs: tuple[torch.Tensor, ...],
        batch: DeviceBatch,
        host: HostBatch,
    ) -> tuple[torch.Tensor, list[Slice]]:
        hidden, head = outputs
        return apply_options(items, hidden, head, batch, host.real_sequences, self._info)

    def _capture_listed(self) -> None:
        """eager mode: capture every listed token bucket with each sequence bucket it can meet."""
        runner = self._runner_for()
        buckets = self.config.buckets
        for listed in self.config.graph_buckets:
            tokens = buckets.tokens(listed)
            for slots in buckets.sequence_buckets(tokens, self.config.max_batch_sequences):
                real = max(1, slots // 2)
                key = GraphKey(tokens, slots)
                if real > tokens or not runner.fits(key):
                    continue
                filler = Tokens(np.zeros(real, np.int32), np.ones(real, np.int32))
                host = pack([filler], self.shape.position_offset, tokens, slots)
                decision = self._cache.preload(key)
                self._graph_outputs(key, host, decision.action, decision.evict)
