"""The PyTorch engine: ragged batches in, pooled vectors or scores out, graphs on CUDA.

`step()` validates cheaply, packs every sequence of every work item into one token axis, runs the
model (replaying a captured CUDA graph when the bucket has one), pools, applies each item's options
and queues the copy back to pinned host memory; it returns before the device is done.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from embedfleet.common.codec import Tokens
from embedfleet.common.modeldir import ModelDir, Pooling, load_model_dir, resolve_model_path
from embedfleet.worker.contract import (
    EngineInfo,
    GraphCounters,
    InvalidInputError,
    Pending,
    WorkItem,
)
from embedfleet.worker.engine.attention import AttentionBackend, GroupedBackend, select_backend
from embedfleet.worker.engine.batch import DeviceBatch, HostBatch, pack, to_device
from embedfleet.worker.engine.graph_policy import (
    Action,
    BucketPolicy,
    GraphCache,
    GraphKey,
    GraphMode,
)
from embedfleet.worker.engine.graph_runner import GraphRunner
from embedfleet.worker.engine.models import Model
from embedfleet.worker.engine.models.family import load_model
from embedfleet.worker.engine.pending import Done, InFlight, Slice, split
from embedfleet.worker.engine.pooling import finish, pool
from embedfleet.worker.engine.precision import (
    candidate_dtype,
    dtype_name,
    reduced_precision_pays,
    resolve_device,
)
from embedfleet.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

#: bf16 is kept on CPU only if the probe's embeddings stay this close to float32's
PARITY_MIN_COSINE = 0.999
#: ... and scores this close (absolute, in logits)
PARITY_MAX_SCORE_DIFF = 1e-3


@dataclass(frozen=True)
class EngineConfig:
    """The engine's part of WorkerSettings (see there for each field's meaning)."""

    model: str = ""
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
        mode: Any = s.cuda_graphs
        return cls(
            model=s.model,
            max_input_tokens=s.max_input_tokens,
            device=s.device,
            dtype=s.dtype,
            threads=s.threads,
            attention=s.attention,
            cuda_graphs=mode,
            graph_buckets=tuple(s.graph_buckets),
            max_graphs=s.max_graphs,
            buckets=BucketPolicy(
                s.token_bucket_step, s.token_bucket_switch, s.token_bucket_large_step
            ),
            max_batch_tokens=s.max_batch_tokens,
            max_batch_sequences=s.max_batch_sequences,
        )


class TorchEngine:
    """Implements `contract.Engine`. `step` is called from one thread only."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.threads > 0:
            # Process-wide, and set before the first op: the engine is the process's only user.
            torch.set_num_threads(config.threads)
        self.model_dir: ModelDir = load_model_dir(resolve_model_path(config.model))
        self.device = resolve_device(config.device)
        self.max_tokens = self.model_dir.max_input_tokens(config.max_input_tokens)
        dtype, probe = candidate_dtype(config.dtype, self.device)
        self.model: Model = load_model(self.model_dir, dtype, self.device, config.bidirectional)
        self.dtype = dtype
        self.backend: AttentionBackend = select_backend(config.attention, self.device, dtype)
        self.shape = self.model.shape
        if probe:
            self._check_reduced_precision()
        self._info = EngineInfo(
            model_name=self.model_dir.name,
            task=self.model_dir.task,
            dimensions=self.shape.hidden_size if self.model_dir.task == "embed" else 1,
            max_input_tokens=self.max_tokens,
            vocab_size=self.shape.vocab_size,
            dtype=dtype_name(self.dtype),
            device=str(self.device),
            default_pooling=self.model_dir.pooling,
            default_normalize=self.model_dir.normalize,
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

    def run(self, items: Sequence[WorkItem]) -> list[np.ndarray[Any, np.dtype[np.float32]]]:
        """step + wait."""
        return self.step(items).wait()

    def embed(self, sequences: Sequence[Sequence[int]]) -> np.ndarray[Any, np.dtype[np.float32]]:
        """Default-option vectors (or scores) for token id lists, as one array."""
        lengths = np.array([len(s) for s in sequences], np.int32)
        ids = np.concatenate([np.asarray(s, np.int32) for s in sequences])
        return self.run([WorkItem(Tokens(ids, lengths))])[0]

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
        plan = self.backend.plan(batch.cu_seqlens, lengths, max_seqlen, self.shape.causal)
        hidden = self.model.forward(batch, plan)
        scores = self.model.score(hidden, batch)
        if scores is not None:
            return hidden, scores
        return hidden, pool(hidden, batch, self.model_dir.pooling)

    def _finish(
        self,
        items: Sequence[WorkItem],
        outputs: tuple[torch.Tensor, ...],
        batch: DeviceBatch,
        host: HostBatch,
    ) -> tuple[torch.Tensor, list[Slice]]:
        """Apply each item's options; one [N, H] (or [N]) float32 tensor for all items."""
        hidden, head = outputs
        real = host.real_sequences
        slices: list[Slice] = []
        row = 0
        if self.model_dir.task == "score":
            scores = head[:real]
            if any(it.options.activate for it in items):
                scores = scores.clone()
                for it in items:
                    if it.options.activate:
                        span = slice(row, row + it.tokens.count)
                        scores[span] = torch.sigmoid(scores[span])
                    row += it.tokens.count
                row = 0
            for it in items:
                slices.append(Slice(row, row + it.tokens.count, 0))
                row += it.tokens.count
            return scores.contiguous(), slices
        default = self.model_dir.pooling
        pooled: dict[Pooling, torch.Tensor] = {default: head[:real]}
        choices = [self._options(it) for it in items]
        if len(set(choices)) == 1:
            mode, dims, norm = choices[0]
            vectors = self._pooled(pooled, mode, hidden, batch, real)
            out = finish(vectors, dims, norm).contiguous()
            for it in items:
                slices.append(Slice(row, row + it.tokens.count, out.shape[1]))
                row += it.tokens.count
            return out, slices
        out = torch.zeros((real, self.shape.hidden_size), dtype=torch.float32, device=self.device)
        for it, (mode, dims, norm) in zip(items, choices, strict=True):
            span = slice(row, row + it.tokens.count)
            vectors = finish(self._pooled(pooled, mode, hidden, batch, real)[span], dims, norm)
            out[span, : vectors.shape[1]] = vectors
            slices.append(Slice(span.start, span.stop, vectors.shape[1]))
            row = span.stop
        return out, slices

    def _options(self, item: WorkItem) -> tuple[Pooling, int, bool]:
        o = item.options
        dims = o.dimensions if 0 < o.dimensions < self.shape.hidden_size else 0
        return (
            o.pooling or self.model_dir.pooling,
            dims,
            self.model_dir.normalize if o.normalize is None else o.normalize,
        )

    @staticmethod
    def _pooled(
        cache: dict[Pooling, torch.Tensor],
        mode: Pooling,
        hidden: torch.Tensor,
        batch: DeviceBatch,
        real: int,
    ) -> torch.Tensor:
        if mode not in cache:
            cache[mode] = pool(hidden, batch, mode)[:real]
        return cache[mode]

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

    def _check_reduced_precision(self) -> None:
        """Keep the reduced dtype only if it is faster here and the probe's outputs match
        float32's; else fall back to float32."""
        from embedfleet.worker.engine.probe import agreement, probe_items

        if not reduced_precision_pays(self.dtype, self.shape.hidden_size):
            log.info("%s GEMMs are not faster than float32 here: using float32", self.dtype)
            self._use_float32(
                load_model(self.model_dir, torch.float32, self.device, self.config.bidirectional)
            )
            return
        items = probe_items(self.model_dir, self.max_tokens)
        fast = [self._eager_default(it) for it in items]
        reference = load_model(
            self.model_dir, torch.float32, self.device, self.config.bidirectional
        )
        saved, saved_backend = self.model, self.backend
        self.model, self.backend = reference, GroupedBackend()
        try:
            slow = [self._eager_default(it) for it in items]
        finally:
            self.model, self.backend = saved, saved_backend
        cosine, score_diff = agreement(fast, slow, self.model_dir.task)
        keep = cosine >= PARITY_MIN_COSINE and score_diff <= PARITY_MAX_SCORE_DIFF
        log.info(
            "probe %s vs float32: min cosine %.6f, max score diff %.2e -> %s",
            dtype_name(self.dtype),
            cosine,
            score_diff,
            "kept" if keep else "float32",
        )
        if not keep:
            self._use_float32(reference)

    def _use_float32(self, model: Model) -> None:
        self.model, self.dtype = model, torch.float32
        self.backend = select_backend(self.config.attention, self.device, torch.float32)

    def _eager_default(self, item: WorkItem) -> np.ndarray[Any, np.dtype[np.float32]]:
        with torch.inference_mode():
            host = pack([item.tokens], self.model.shape.position_offset)
            batch = to_device(host, self.device)
            _, head = self._body(batch, int(host.lengths.max()), host)
            return head[: host.real_sequences].float().cpu().numpy()
