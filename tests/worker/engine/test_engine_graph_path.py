"""The engine's graph path (bucket padding, capture/replay bookkeeping, options on static outputs)
exercised on the CPU. The CUDA part alone is replaced: `EagerRunner` is a mock of GraphRunner that
runs the captured body instead of recording it, and the attention is a per-sequence varlen kernel
that reads `cu_seqlens` (graph-safe in shape, like the CUDA kernels)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from embedfleet.common.modeldir import load_model_dir
from embedfleet.common.similarity import min_cosine
from embedfleet.testing import families
from embedfleet.worker.contract import Options
from embedfleet.worker.engine import torch_engine
from embedfleet.worker.engine.attention import VarlenBackend, relative_positions, visible
from embedfleet.worker.engine.batch import DeviceBatch, HostBatch, from_tensors
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.graph_policy import GraphKey, lone_keys
from embedfleet.worker.engine.graph_runner import Body
from embedfleet.worker.engine.torch_engine import TorchEngine

from .helpers import item


def varlen_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: torch.Tensor,
    max_len: int,
    causal: bool,
    window: int = -1,
) -> torch.Tensor:
    out = torch.zeros_like(q)
    bounds = cu.tolist()
    # What a real varlen kernel needs: no sequence longer than the length it is launched for.
    assert max(b - a for a, b in itertools.pairwise(bounds)) <= max_len
    LAUNCHES.append(max_len)
    for start, stop in itertools.pairwise(bounds):
        if stop > start:
            s = slice(start, stop)
            mask = visible(relative_positions(stop - start, q.device), window, causal)
            out[s] = F.scaled_dot_product_attention(
                q[s].transpose(0, 1), k[s].transpose(0, 1), v[s].transpose(0, 1), attn_mask=mask
            ).transpose(0, 1)
    return out


#: the reference kernel as a backend: a sliding window in the kernel, as flash-attn's
REFERENCE = VarlenBackend("cpu-varlen-reference", varlen_reference, features=frozenset(["window"]))


LAUNCHES: list[int] = []


class EagerRunner:
    """Mock of GraphRunner: same interface, runs the body at 'capture' and 'replay'.

    `corrupt`: replays return a wrong head, as a bad capture would.
    """

    def __init__(self, body: Body, corrupt: bool = False) -> None:
        self.body = body
        self.views: DeviceBatch | None = None
        self.graphs: dict[GraphKey, int] = {}
        self.capture_seconds = 0.0
        self.pool_bytes = 0
        self.corrupt = corrupt

    def fits(self, key: GraphKey) -> bool:
        return key.tokens <= 4096

    @property
    def live(self) -> list[GraphKey]:
        return sorted(self.graphs)

    def load(self, host: HostBatch) -> DeviceBatch:
        self.views = from_tensors(
            torch.from_numpy(host.tokens),
            torch.from_numpy(host.seqs),
            torch.from_numpy(host.cu_seqlens),
        )
        return self.views

    def capture(
        self, key: GraphKey, views: DeviceBatch, attention_len: int
    ) -> tuple[torch.Tensor, ...]:
        assert self.fits(key)
        self.graphs[key] = attention_len
        return self.replay(key)

    def replay(self, key: GraphKey) -> tuple[torch.Tensor, ...]:
        assert key in self.graphs
        assert self.views is not None
        assert self.views.input_ids.shape[0] == key.tokens  # padded to the bucket
        hidden, *per_slot = self.body(self.views, self.graphs[key])
        return (hidden, *(o.flip(0) if self.corrupt else o for o in per_slot))

    def evict(self, key: GraphKey) -> None:
        self.graphs.pop(key, None)

    def __len__(self) -> int:
        return len(self.graphs)


def graph_engine(corrupt: bool = False, **kw: object) -> tuple[TorchEngine, EagerRunner]:
    config = EngineConfig(device="cpu", dtype="float32", max_input_tokens=512, cpu_runtime="eager")
    engine = TorchEngine(dataclasses.replace(config, **kw))  # type: ignore[arg-type]
    engine.backend = REFERENCE
    engine._graphs_enabled = True
    runner = EagerRunner(engine._graph_body, corrupt)
    engine._runner = runner  # type: ignore[assignment]
    # The mock holds what the real static buffers would (4096 tokens).
    engine._cache.max_tokens = 4096
    return engine, runner


def assert_graph_path_matches(
    eager: TorchEngine, texts: int, split: int, first: Options | None = None, **kw: object
) -> None:
    """The first `texts` of families.TEXTS, as two items split at `split` (the first with
    `first` options), give on the graph path what `eager` gives, at its first (eager) run, its
    capture and its replay; one graph in all. `kw`: the graph engine's config beyond the model."""
    path = Path(eager.model_dir.path)
    tok = load_model_dir(path).tokenizer()
    seqs = [tok.encode(t).ids for t in families.TEXTS[:texts]]
    items = [item(seqs[:split], first), item(seqs[split:])]
    want = eager.run(items)
    graphed, runner = graph_engine(model=str(path), **kw)
    for _ in range(3):  # eager, capture, replay
        got = graphed.run(items)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5)
    counts = graphed.counters()
    assert (counts.eager_runs, counts.captures, counts.replays) == (1, 1, 1)
    assert len(runner) == 1


def test_lazy_graph_path_matches_eager(
    minilm_fp32: TorchEngine, minilm_sequences: list[list[int]]
) -> None:
    engine, runner = graph_engine(max_graphs=2)
    seqs = minilm_sequences[:8]
    [expected] = minilm_fp32.run([item(seqs)])
    runs = [engine.run([item(seqs)])[0] for _ in range(3)]
    c = engine.counters()
    assert (c.eager_runs, c.captures, c.replays) == (1, 1, 1)
    for got in runs:
        assert min_cosine(got, expected) >= 0.99999
    # Options applied after the graph, from its static outputs, per item.
    mixed = engine.run(
        [
            item(seqs[:3], Options(dimensions=32)),
            item(seqs[3:], Options(pooling="cls", normalize=False)),
        ]
    )
    ref = minilm_fp32.run(
        [
            item(seqs[:3], Options(dimensions=32)),
            item(seqs[3:], Options(pooling="cls", normalize=False)),
        ]
    )
    assert mixed[0].shape == (3, 32)
    np.testing.assert_allclose(mixed[0], ref[0], atol=1e-5)
    np.testing.assert_allclose(mixed[1], ref[1], atol=1e-4)
    # Eviction at the bound of two graphs.
    for other in (minilm_sequences[10:12], minilm_sequences[13:15]):
        engine.run([item(other)])
        engine.run([item(other)])
    assert len(runner) == 2
    assert engine.counters().captures == 3


def test_eager_mode_captures_listed_buckets_and_pads_up(
    minilm_fp32: TorchEngine, minilm_sequences: list[list[int]]
) -> None:
    engine, runner = graph_engine(cuda_graphs="eager", graph_buckets=(128,), max_batch_sequences=8)
    # At start this runs on CUDA only; here, once the mock runner is in place.
    engine._capture_listed()
    captured = engine.counters().captures
    assert captured == len(runner) > 0
    seqs = minilm_sequences[2:7]  # 64 tokens in 5 sequences: replays the (128, 8) bucket
    [got] = engine.run([item(seqs)])
    [expected] = minilm_fp32.run([item(seqs)])
    assert engine.counters().replays == 1
    assert engine.counters().eager_runs == 0
    assert min_cosine(got, expected) >= 0.99999


def test_every_new_graph_is_checked_and_a_disagreeing_one_never_served(
    minilm_fp32: TorchEngine, minilm_sequences: list[list[int]]
) -> None:
    # Finding 3: a wrong capture used to serve wrong vectors; now the capture's replay is
    # compared with the eager run of the same batch, once, and a mismatch is never served.
    engine, runner = graph_engine(corrupt=True)
    seqs = minilm_sequences[3:9]
    [expected] = minilm_fp32.run([item(seqs)])
    runs = [engine.run([item(seqs)])[0] for _ in range(4)]
    for got in runs:
        assert min_cosine(got, expected) >= 0.99999
    c = engine.counters()
    assert (c.captures, c.rejects, c.replays, c.eager_runs) == (1, 1, 0, 3)
    assert len(runner) == 0
    assert engine._cache.live == []
    assert len(engine._cache.failed) == 1
    good, _ = graph_engine()
    for _ in range(3):
        good.run([item(seqs)])
    assert (good.counters().captures, good.counters().rejects) == (1, 0)


def test_cache_and_runner_stay_in_step_over_a_mixed_trace(
    minilm_sequences: list[list[int]],
) -> None:
    # Finding 5: a capture the static buffers could not hold left the cache's evictions undone
    # in the runner. Batches here include more sequences than the buffers' slots.
    engine, runner = graph_engine(max_graphs=2, max_batch_sequences=8)
    rng = np.random.default_rng(3)
    for _ in range(40):
        count = int(rng.integers(1, 14))
        picks = rng.choice(len(minilm_sequences), count).tolist()
        engine.run([item([minilm_sequences[i][:40] for i in picks])])
        assert runner.live == sorted(engine._cache.live)
        assert len(runner) <= 2
    assert engine.counters().captures > 2  # evictions happened


def test_graph_attention_launch_length_is_the_longest_sequence(
    minilm_fp32: TorchEngine, minilm_sequences: list[list[int]]
) -> None:
    # Finding 1: a 3k-token bucket launched its attention for 3k-long sequences.
    engine, runner = graph_engine()
    seqs = [s for s in minilm_sequences if len(s) >= 200][:8]
    [expected] = minilm_fp32.run([item(seqs)])
    LAUNCHES.clear()
    for _ in range(3):
        [got] = engine.run([item(seqs)])
        assert min_cosine(got, expected) >= 0.99999
    [key] = runner.live
    assert key.tokens > 2048
    assert runner.graphs[key] == 512
    assert max(LAUNCHES) <= 512


def test_default_options_are_served_from_the_graphs_own_outputs(
    minilm_fp32: TorchEngine, minilm_sequences: list[list[int]]
) -> None:
    # Issue 36 finding 3: the default head's normalization ran after the replay, a few launches
    # per batch; the graph now computes the rows a request with default options gets.
    engine, runner = graph_engine()
    seqs = minilm_sequences[:4]
    for _ in range(2):
        engine.run([item(seqs)])  # eager, then capture
    replayed: list[tuple[torch.Tensor, ...]] = []
    replay = runner.replay

    def recording(key: GraphKey) -> tuple[torch.Tensor, ...]:
        replayed.append(replay(key))
        return replayed[-1]

    runner.replay = recording  # type: ignore[method-assign]
    with torch.inference_mode():
        out, _ = engine._run([item(seqs)])
        assert out.data_ptr() == replayed[-1][2].data_ptr()  # the graph's rows, as they are
        other, _ = engine._run([item(seqs, Options(dimensions=32))])
        assert other.data_ptr() != replayed[-1][2].data_ptr()  # options: computed after it
    [expected] = minilm_fp32.run([item(seqs)])
    assert min_cosine(out.numpy(), expected) >= 0.99999
    assert engine.counters().replays == 2


def test_warm_up_captures_the_plan_largest_first_within_its_budget(
    minilm_sequences: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 36 finding 4: lazy mode's buckets were captured on client requests (a first use
    # eager, the second a capture). The worker's start captures the plan until its budget is
    # spent. MOCK clock: each capture "takes" 1 s per 1,024 bucket tokens.
    engine, runner = graph_engine(max_batch_tokens=4096)
    clock = [0.0]
    capture = runner.capture

    def timed(key: GraphKey, views: DeviceBatch, attention_len: int) -> tuple[torch.Tensor, ...]:
        clock[0] += key.tokens / 1024
        return capture(key, views, attention_len)

    runner.capture = timed  # type: ignore[method-assign]
    monkeypatch.setattr(torch_engine.time, "monotonic", lambda: clock[0])
    plan = engine.graph_plan()
    # The pool-sizing largest bucket, then every lone request's (issue 38: a batch-1 client paid
    # the capture a budget left out), then the other token buckets, largest first.
    lone = lone_keys(engine.buckets, 512)
    assert plan[0].tokens == 4096
    assert plan[1 : 1 + len(lone)] == lone
    rest = [t for t in engine.buckets.token_buckets(4096)[::-1] if 512 < t < 4096]
    assert [k.tokens for k in plan[1 + len(lone) :]] == rest
    warm = engine.warm_graphs(budget_seconds=10.0)
    # 4096 (4 "s"), the 13 lone buckets (2,976 tokens) and 3584 take 10.4 "s": the budget stops
    # it there.
    assert {k.tokens for k in runner.live} == {4096, 3584} | {k.tokens for k in lone}
    assert (warm.planned, warm.captured, warm.live) == (len(plan), 15, 15)
    assert engine.counters().captures == 15
    # A client batch in a captured bucket, and a lone request, replay at once: no eager first
    # use, no capture.
    text = next(s[:200] for s in minilm_sequences if len(s) >= 200)
    assert engine.buckets.tokens(200 * 16) == 3584
    engine.run([item([text] * 16)])
    engine.run([item([text])])
    c = engine.counters()
    assert (c.eager_runs, c.captures, c.replays) == (0, 15, 2)
