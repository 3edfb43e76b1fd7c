"""The PyTorch engine: ragged batches in, pooled vectors or scores out, graphs on CUDA.

`step()` validates cheaply, packs every sequence of every work item into one token axis, runs the
model (replaying a captured CUDA graph when the bucket has one), pools, applies each item's options
and queues the copy back to pinned host memory; it returns before the device is done. What runs is
decided elsewhere: the device and dtype before the engine exists (`precision`), bucket actions by
`graph_policy`, per-item options by `outputs`.
"""

from __future__ import annotations

import logging
import time
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
    GraphWarmup,
    InvalidInputError,
    Pending,
    WorkItem,
    check_tokens,
    output_dimensions,
)
from embedfleet.worker.engine.attention import (
    AttentionBackend,
    AttentionShape,
    BackendUnavailableError,
    GroupedBackend,
    select_backend,
)
from embedfleet.worker.engine.batch import DeviceBatch, HostBatch, from_tensors, pack, to_device
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.forward import Runtime, default_head, encode, forward
from embedfleet.worker.engine.graph_policy import (
    Action,
    GraphCache,
    GraphKey,
    lone_keys,
    warmup_plan,
)
from embedfleet.worker.engine.graph_runner import MIN_AGREEMENT, GraphRunner, agreement
from embedfleet.worker.engine.models.hybrid import Hybrid
from embedfleet.worker.engine.outputs import apply_options, default_rows
from embedfleet.worker.engine.pending import InFlight, Slice, split
from embedfleet.worker.engine.plan import DeviceFacts, EnginePlan, ModelFacts, plan_engine
from embedfleet.worker.engine.pooling import Pooler
from embedfleet.worker.engine.precision import dtype_name, load_model_at_dtype
from embedfleet.worker.engine.runtime import (
    InductorRuntime,
    filler_batch,
    openvino_at_dtype,
    openvino_seqlen,
    seqlen_probe_lengths,
)
from embedfleet.worker.engine.staging import HostOutputs, Staging, packed_views
from embedfleet.worker.settings import WorkerSettings

log = logging.getLogger(__name__)


class TorchEngine:
    """Implements `contract.Engine`. `step` is called from one thread only."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_dir: ModelDir = load_model_dir(resolve_model_path(config.model), config.task)
        model = ModelFacts(
            self.model_dir.task, self.model_dir.max_input_tokens(config.max_input_tokens)
        )
        self.plan = plan = plan_engine(config, DeviceFacts.probe(config.device), model)
        if plan.set_threads:
            # Process-wide, and set before the first op: the engine is the process's only user.
            torch.set_num_threads(plan.set_threads)
        self.device = torch.device(plan.device)
        if plan.memory_fraction > 0:
            # torch >= 2.11 wants the device's index: a bare "cuda" raises ValueError.
            index = torch.cuda.current_device() if plan.memory_index is None else plan.memory_index
            torch.cuda.set_per_process_memory_fraction(plan.memory_fraction, index)
        self.max_tokens = plan.max_tokens
        if self.max_tokens < model.max_tokens:
            log.warning(
                "openvino runtime: input limit lowered to its bound",
                extra={"model_limit": model.max_tokens, "limit": self.max_tokens},
            )
        self.runtime_name = plan.runtime
        #: the compiled CPU runtime the encoder runs in; None runs it eager
        self.runtime: Runtime | None = None
        self._eager_threads, self._graph_threads = plan.eager_threads, plan.graph_threads
        self._threads_now = torch.get_num_threads()
        #: the longest sequence of a batch the compiled runtime runs; longer ones run eager
        self.compiled_seqlen = self.max_tokens
        self._load()
        self.shape = self.model.shape
        #: a hybrid model's lexical and per-token heads, run per batch as its items ask
        self._hybrid = self.model if isinstance(self.model, Hybrid) else None
        #: sentence-transformers' pooling and Dense modules (embedders; unused by other heads)
        self.pooler = Pooler.of(self.model_dir, self.device)
        self.backend: AttentionBackend = select_backend(
            config.attention,
            self.device,
            self.dtype,
            self._attention_shape(),
            graphs=plan.prefer_graph_safe,
            features=self.shape.attention_features,
        )
        #: what runs a batch with key lengths: the model's backend when it takes them, else the
        #: grouped one (any device and dtype), eager
        self.keyed_backend: AttentionBackend = (
            self.backend if "keys" in self.backend.features else GroupedBackend()
        )
        if self.runtime is not None and self.runtime_name == "openvino":
            if plan.measure_seqlen:
                self.compiled_seqlen = self._measured_seqlen(self.runtime)
            self._use_threads(self.runtime)
        self._info = self._engine_info()
        self._set_up_graphs(plan)

    def _set_up_graphs(self, plan: EnginePlan) -> None:
        """The graph cache, the staging buffers and, in eager mode, the listed captures."""
        self.buckets = plan.buckets
        self._capacity = plan.capacity
        self._cache = GraphCache(
            mode=self.config.cuda_graphs,
            max_graphs=self.config.max_graphs,
            max_tokens=self._capacity.tokens,
            max_sequences=self._capacity.sequences,
        )
        self._runner: GraphRunner | None = None
        graphs = plan.graphs(
            self.config.cuda_graphs,
            self.backend.name,
            self.backend.graph_safe,
            needs=", ".join(sorted(self.shape.attention_features & {"bias"})),
        )
        self._graphs_enabled = graphs.enabled
        #: why graphs are off ("" when on), exported with the engine's metrics
        self.graphs_off_reason = graphs.reason
        if graphs.refuse:
            raise BackendUnavailableError(graphs.reason)
        if graphs.warn:
            log.error("CUDA graphs off: %s", graphs.reason)
        self._staging = (
            Staging(self._capacity.tokens, self._capacity.sequences, pin=True)
            if plan.pinned
            else None
        )
        self._host_outputs = HostOutputs(pin=True) if plan.pinned else None
        self._counts = {"captures": 0, "replays": 0, "eager_runs": 0, "rejects": 0}
        if self._graphs_enabled and self.config.cuda_graphs == "eager":
            self._capture_listed()

    def _load(self) -> None:
        """The model's weights in the plan's runtime: `dtype`, `model` and `runtime`."""
        config = self.config
        if self.runtime_name == "openvino":
            self.dtype, self.model, self.runtime = openvino_at_dtype(
                self.model_dir,
                config.dtype,
                config.threads,
                self.max_tokens,
                config.bidirectional,
                config.openvino_cache_dir,
            )
            return
        self.dtype, self.model = load_model_at_dtype(
            self.model_dir,
            self.device,
            config.dtype,
            config.attention,
            self.max_tokens,
            config.bidirectional,
        )
        if self.runtime_name == "inductor":
            self.runtime = InductorRuntime(self.model)

    def _engine_info(self) -> EngineInfo:
        multivector = self.model_dir.multivector
        return EngineInfo(
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
            skip_tokens=multivector.skip if multivector else 0,
            token_dimensions=(
                multivector.layer.out_features
                if multivector and self.model_dir.task == "hybrid"
                else 0
            ),
        )

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> TorchEngine:
        return cls(EngineConfig.from_settings(settings))

    # ---- contract ------------------------------------------------------------------------

    @property
    def info(self) -> EngineInfo:
        return self._info

    def validate(self, item: WorkItem) -> None:
        check_tokens(
            item.tokens, self.max_tokens, self.shape.vocab_size, self.shape.type_vocab_size
        )
        dims = item.options.dimensions
        if self.model_dir.task in ("embed", "hybrid") and not 0 <= dims <= self._info.dimensions:
            raise InvalidInputError(
                f"dimensions must be between 1 and {self._info.dimensions} (0 for all)"
            )

    def step(self, items: Sequence[WorkItem]) -> Pending:
        if not items:
            return Done([])
        # Cheap, and an id past the vocabulary would be a device-side assert on CUDA.
        for item in items:
            self.validate(item)
        with torch.inference_mode():
            if not self._graphs_enabled and self.device.type != "cuda":
                return self._step_cpu(items)
            out, slices = self._run(items)
            if self.device.type == "cuda":
                return InFlight(out, slices, self._host_outputs)
            # Graphs on a CPU: only the graph path's tests (the CUDA recording mocked).
            return Done(split(out.numpy(), slices))

    def counters(self) -> GraphCounters:
        return GraphCounters(
            captures=self._counts["captures"],
            replays=self._counts["replays"],
            eager_runs=self._counts["eager_runs"],
            capture_seconds=self._runner.capture_seconds if self._runner else 0.0,
            graph_pool_bytes=self._runner.pool_bytes if self._runner else 0,
            rejects=self._counts["rejects"],
            live_graphs=len(self._cache),
            graphs_enabled=self._graphs_enabled,
            attention=self.backend.name,
            runtime=self.runtime_name,
            graphs_off_reason=self.graphs_off_reason,
        )

    # ---- conveniences --------------------------------------------------------------------

    def run(self, items: Sequence[WorkItem]) -> list[FloatArray]:
        """step + wait."""
        return self.step(items).wait()

    # ---- internals -----------------------------------------------------------------------

    def _attention_shape(self) -> AttentionShape | None:
        """The model's attention heads as config.json gives them (None: not a shape we read)."""
        cfg = self.model_dir.config
        try:
            heads = int(cfg["num_attention_heads"])
            kv = int(cfg.get("num_key_value_heads") or heads)
            dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None
        return AttentionShape(heads, kv, dim, self.shape.causal)

    def _run(self, items: Sequence[WorkItem]) -> tuple[torch.Tensor, list[Slice]]:
        parts = [it.tokens for it in items]
        offset = self.shape.position_offset
        total = sum(p.total for p in parts)
        count = sum(p.count for p in parts)
        # A captured graph's plan reads cu_seqlens alone: key lengths run eager.
        if self._graphs_enabled and all(p.key_lengths is None for p in parts):
            longest = max(int(p.lengths.max()) for p in parts)
            real = (total, count, longest)
            decision = self._cache.decide(self.buckets.key(*real), real)
            key = decision.key
            if key is not None:
                host = pack(parts, offset, key.tokens, key.sequences, key.attention)
                graphed = self._graph_outputs(key, host, decision.action, decision.evict)
                if graphed is not None:
                    outputs, views = graphed
                    return self._finish(items, outputs, views, host)
        host = pack(parts, offset)
        batch = self._to_device(host)
        outputs = self._body(batch, int(host.lengths.max()), host)
        self._counts["eager_runs"] += 1
        return self._finish(items, outputs, batch, host)

    def _step_cpu(self, items: Sequence[WorkItem]) -> Done:
        """One batch on the CPU, synchronous, with its stages timed (pack: host batch and
        tensors; forward: the encoder; pool: head, options and the copy out). On a CPU each op
        is done on return, so reading the clock costs nothing else; CUDA's launches are
        asynchronous and report no stages (timing them would need a synchronisation or events)."""
        start = time.perf_counter_ns()
        host = pack([it.tokens for it in items], self.shape.position_offset)
        batch = to_device(host, self.device)
        packed = time.perf_counter_ns()
        longest = int(host.lengths.max())
        runtime = self._runtime_for(host, longest)
        self._use_threads(runtime)
        backend = self._backend_for(host)
        hidden = encode(self.model, backend, batch, longest, host.lengths, runtime, host.keys)
        encoded = time.perf_counter_ns()
        head = default_head(self.model, self.pooler, hidden, batch)
        out, slices = self._finish(items, (hidden, head), batch, host)
        results = split(out.numpy(), slices)
        pooled = time.perf_counter_ns()
        self._counts["eager_runs"] += 1
        return Done(
            results,
            (("pack", packed - start), ("forward", encoded - packed), ("pool", pooled - encoded)),
        )

    def _runtime_for(self, host: HostBatch, longest: int) -> Runtime | None:
        """The compiled runtime when it runs this batch, else None (eager): past its longest
        sequence, or a causal model's batch with key lengths (its graph ignores the key mask)."""
        if longest > self.compiled_seqlen or self._keyed_causal(host):
            return None
        return self.runtime

    def _keyed_causal(self, host: HostBatch) -> bool:
        return host.keys is not None and self.shape.causal

    def _backend_for(self, host: HostBatch | None) -> AttentionBackend:
        return self.backend if host is None or host.keys is None else self.keyed_backend

    def _measured_seqlen(self, runtime: Runtime) -> int:
        """Under auto, the longest sequence a batch may have to run in `runtime` rather than
        eager: timed here, one sequence per length, as each path would run it (its threads and
        dtype), best of two after a first call, alternately so that a noisy neighbour hurts
        both. Where OpenVINO overtakes
        eager depends on the CPU's GEMMs: at 256-512 tokens on AVX-512 without AMX; never below
        2,048 on AMX, whose bf16 OpenVINO uses and eager float32 does not."""

        def timer(length: int) -> tuple[float, float]:
            batch, lengths = filler_batch(length)
            paths = (("openvino", runtime), ("eager", None))
            best = {"openvino": float("inf"), "eager": float("inf")}

            def run(path: Runtime | None) -> float:
                self._use_threads(path)
                start = time.perf_counter()
                encode(self.model, self.backend, batch, length, lengths, path)
                return time.perf_counter() - start

            with torch.inference_mode():
                for _, path in paths:
                    run(path)  # first call at this shape: memory and kernel set-up
                for _ in range(2):
                    for name, path in paths:
                        best[name] = min(best[name], run(path))
            return best["openvino"], best["eager"]

        seqlen, timings = openvino_seqlen(seqlen_probe_lengths(self.max_tokens), timer)
        last, openvino_s, eager_s = timings[-1]
        why = "eager faster" if openvino_s >= eager_s else "timing budget spent"
        log.info(
            "auto runtime: openvino for sequences up to %d tokens, eager past them (%s; "
            "openvino vs eager per length: %s)",
            seqlen,
            "the model's limit" if seqlen == self.max_tokens else why,
            ", ".join(f"{n}: {1e3 * o:.1f} vs {1e3 * e:.1f} ms" for n, o, e in timings),
            extra={"openvino_max_seqlen": seqlen, "timed_up_to": last},
        )
        return seqlen

    def _use_threads(self, runtime: Runtime | None) -> None:
        """Torch's threads for a batch run by `runtime` (None: eager), set only on a change."""
        want = self._eager_threads if runtime is None else self._graph_threads
        if want != self._threads_now:
            torch.set_num_threads(want)
            self._threads_now = want

    def _to_device(self, host: HostBatch) -> DeviceBatch:
        if self._staging is None or not self._staging.fits(host):
            return to_device(host, self.device)
        staged = self._staging.stage(host)
        on_device = staged.to(self.device, non_blocking=True)  # one copy for the whole batch
        self._staging.copied()
        return from_tensors(*packed_views(on_device, host.total_tokens, host.sequences))

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
            outputs = runner.capture(key, views, key.attention)
        except RuntimeError:
            log.exception("CUDA graph capture failed for %s; running it eager from now on", key)
            self._cache.forget(key)
            runner.evict(key)
            return None
        self._counts["captures"] += 1
        # Every new graph is checked once against the eager run of the same batch (launched at
        # the batch's own longest sequence): a graph that disagrees is never served.
        eager = self._body(views, int(host.lengths.max()), host)
        score = self._agreement(outputs, eager, host)
        if score < MIN_AGREEMENT:
            log.error(
                "CUDA graph for %s disagrees with eager (agreement %.6f < %s); running it eager "
                "from now on",
                key,
                score,
                MIN_AGREEMENT,
            )
            self._counts["rejects"] += 1
            self._cache.forget(key)
            runner.evict(key)
            return eager, views
        return outputs, views

    def _agreement(
        self, graphed: tuple[torch.Tensor, ...], eager: tuple[torch.Tensor, ...], host: HostBatch
    ) -> float:
        """`agreement` of the real rows of the two runs' default heads."""
        real = host.real_sequences
        return agreement(graphed[1][:real], eager[1][:real])

    def _runner_for(self) -> GraphRunner:
        if self._runner is None:
            cap = self._capacity
            self._runner = GraphRunner(self._graph_body, self.device, cap.tokens, cap.sequences)
        return self._runner

    def _graph_body(self, batch: DeviceBatch, max_seqlen: int) -> tuple[torch.Tensor, ...]:
        return self._body(batch, max_seqlen, None)

    def _body(
        self, batch: DeviceBatch, max_seqlen: int, host: HostBatch | None
    ) -> tuple[torch.Tensor, ...]:
        """Forward, the default head and the default rows: (hidden [T, H], pooled [N, H] or
        scores [N], what a request with the model's default options gets [N, ...]). Inside a
        graph all three are captured: such a request launches nothing after the replay."""
        lengths = host.lengths if host is not None else np.zeros(0, np.int64)
        keys = host.keys if host is not None else None
        # Graph captures (CUDA, host None) never meet a CPU runtime.
        runtime = None if host is None or self._keyed_causal(host) else self.runtime
        backend = self._backend_for(host)
        hidden, head = forward(
            self.model, backend, self.pooler, batch, max_seqlen, lengths, runtime, keys
        )
        return hidden, head, default_rows(head, self._info)

    def _finish(
        self,
        items: Sequence[WorkItem],
        outputs: tuple[torch.Tensor, ...],
        batch: DeviceBatch,
        host: HostBatch,
    ) -> tuple[torch.Tensor, list[Slice]]:
        """Each item's rows from (hidden, head) and, when the body made them, the default rows."""
        hidden, head, *made = outputs
        default = made[0] if made else None
        return apply_options(
            items,
            hidden,
            head,
            batch,
            host.real_sequences,
            self._info,
            self.pooler,
            default,
            self._hybrid,
        )

    def _capture_listed(self) -> None:
        """eager mode: capture the whole plan at construction, however long it takes."""
        self.precapture(self.graph_plan(), budget_seconds=float("inf"))

    def graph_plan(self) -> list[GraphKey]:
        """The graphs captured before the worker serves, in order (`graph_policy.warmup_plan`):
        the buckets of --graph-buckets, else every lone request's bucket up to the input limit
        and every token bucket up to the batch budget."""
        listed = self.config.graph_buckets
        sizes = (
            sorted({self.buckets.tokens(n) for n in listed})
            if listed
            else self.buckets.token_buckets(self.config.max_batch_tokens)
        )
        lone = () if listed else lone_keys(self.buckets, self.max_tokens)
        plan = warmup_plan(self.buckets, sizes, self.config.max_graphs, lone)
        return [key for key in plan if self._cache.fits(key)]

    def warm_graphs(self, budget_seconds: float) -> GraphWarmup:
        """Lazy mode's start: capture the plan within `budget_seconds`, so that no client
        request pays a capture (nor a bucket's first eager run) for the buckets captured."""
        start = time.monotonic()
        plan = self.graph_plan() if self._graphs_enabled else []
        captured = self.precapture(plan, budget_seconds)
        runner = self._runner
        return GraphWarmup(
            planned=len(plan),
            captured=len(captured),
            live=len(self._cache),
            seconds=time.monotonic() - start,
            capture_seconds=runner.capture_seconds if runner else 0.0,
            pool_bytes=runner.pool_bytes if runner else 0,
        )

    def precapture(self, keys: Sequence[GraphKey], budget_seconds: float) -> list[GraphKey]:
        """Capture (and check) `keys` in order until `budget_seconds` is spent; the captured."""
        if not self._graphs_enabled:
            return []
        start = time.monotonic()
        done: list[GraphKey] = []
        for key in keys:
            if time.monotonic() - start >= budget_seconds:
                break
            host = self._filler(key)
            if host is None:
                continue
            decision = self._cache.preload(key)
            if decision.action is not Action.CAPTURE:
                continue
            with torch.inference_mode():
                if self._graph_outputs(key, host, decision.action, decision.evict) is not None:
                    done.append(key)
        return done

    def _filler(self, key: GraphKey) -> HostBatch | None:
        """A batch of filler tokens that falls in bucket `key` (None when none can)."""
        real = max(1, min(key.sequences // 2, key.tokens, self.config.max_batch_sequences))
        length = max(1, min(key.tokens // real, key.attention))
        if not self._cache.fits(key) or not self._cache.holds(
            key, key, (real * length, real, length)
        ):
            return None
        ids = np.full(real * length, self._filler_id(), np.int32)
        filler = Tokens(ids, np.full(real, length, np.int32))
        offset = self.shape.position_offset
        return pack([filler], offset, key.tokens, key.sequences, key.attention)

    def _filler_id(self) -> int:
        return min(1000, self.shape.vocab_size - 1)
