"""The compiled CPU runtimes' own parts: the padded attention layout they trace, the choice of
runtime, OpenVINO's dtype choice and its conversion cache. Their parity with the references is in
the family and MiniLM tests, parametrized over every runtime (helpers.RUNTIMES)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from embedfleet.testing.families import FamilyDirs
from embedfleet.worker.engine import runtime as runtimes
from embedfleet.worker.engine import torch_engine
from embedfleet.worker.engine.attention import GroupedBackend
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.padded import PaddedPlan, padded_layout, plan_tensors
from embedfleet.worker.engine.precision import cpu_has_native_bf16
from embedfleet.worker.engine.torch_engine import TorchEngine

from .helpers import item, random_sequences


def test_padded_layout_skips_empty_slots_and_round_trips() -> None:
    lengths = np.array([3, 0, 1, 2, 0], np.int64)  # spare bucket slots are empty
    layout = padded_layout(lengths)
    assert layout.valid.tolist() == [[True] * 3, [True, False, False], [True, True, False]]
    # Padded slots read their own sequence's first token; real ones their token.
    assert layout.gather.tolist() == [0, 1, 2, 3, 3, 3, 4, 5, 4]
    # Every packed token comes back from its own slot.
    assert layout.gather[layout.inverse].tolist() == list(range(6))


@pytest.mark.parametrize(("causal", "kv_heads"), [(False, 4), (True, 4), (True, 2), (False, 1)])
def test_padded_plan_attends_like_the_grouped_backend(causal: bool, kv_heads: int) -> None:
    lengths = np.array([7, 1, 30, 0, 12, 12], np.int64)
    total = int(lengths.sum())
    gen = torch.Generator().manual_seed(0)
    q = torch.randn((total, 4, 16), generator=gen)
    k, v = (torch.randn((total, kv_heads, 16), generator=gen) for _ in range(2))
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    want = GroupedBackend().plan(cu, lengths, 30, causal).attend(q, k, v)
    got = PaddedPlan(*plan_tensors(padded_layout(lengths)), causal).attend(q, k, v)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("installed", "kept_cache", "max_tokens", "want"),
    [
        (True, True, 512, "openvino"),
        (True, True, runtimes.OPENVINO_MAX_TOKENS, "openvino"),
        # over OpenVINO's attention bound: openvino would lower the model's input limit
        (True, True, runtimes.OPENVINO_MAX_TOKENS + 1, "eager"),
        # a pod's emptyDir cache: every new pod would convert again
        (True, False, 512, "eager"),
        (False, True, 512, "eager"),
    ],
)
def test_auto_runs_openvino_where_its_conversion_is_kept(
    installed: bool, kept_cache: bool, max_tokens: int, want: str
) -> None:
    assert runtimes.auto_runtime(installed, kept_cache, max_tokens) == want


@pytest.mark.parametrize("pays", [True, False])
def test_openvino_auto_dtype_needs_speed_and_parity(
    family_dirs: FamilyDirs,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    pays: bool,
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(runtimes, "reduced_pays", lambda reduced, float32: pays)
    path = family_dirs.get("splade")
    engine = TorchEngine(EngineConfig(model=str(path), device="cpu", cpu_runtime="openvino"))
    want = "bfloat16" if pays and cpu_has_native_bf16() else "float32"
    assert engine.info.dtype == want
    assert isinstance(engine.runtime, runtimes.OpenVINORuntime)
    assert engine.runtime.precision == runtimes.OV_PRECISIONS[getattr(torch, want)]


def test_openvino_conversion_is_cached(
    family_dirs: FamilyDirs, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = family_dirs.get("Qwen3-Reranker-8B")
    config = EngineConfig(model=str(path), device="cpu", dtype="float32", cpu_runtime="openvino")
    seqs = random_sequences(300, (3, 40, 17))
    [first] = TorchEngine(config).run([item(seqs)])
    assert list(tmp_path.glob("embedfleet/openvino/*/encoder.xml"))

    def no_conversion(model: object) -> None:
        raise AssertionError("converted again although the graph was cached")

    monkeypatch.setattr(runtimes, "convert", no_conversion)
    [second] = TorchEngine(config).run([item(seqs)])
    np.testing.assert_array_equal(first, second)
    # Another checkpoint (here: the same weights causal vs bidirectional) is its own entry.
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    qwen = family_dirs.get("Qwen3-Reranker-0.6B")
    other = TorchEngine(EngineConfig(model=str(qwen), device="cpu", cpu_runtime="openvino"))
    assert other.run([item(seqs)])[0].shape == (3,)
    # Qwen3 allows 40,960 tokens; OpenVINO's L x L attention holds this runtime to its bound (the
    # start-up probe at the model's own limit took the process past 22 GB).
    assert other.max_tokens == runtimes.OPENVINO_MAX_TOKENS
    assert len(list(tmp_path.glob("embedfleet/openvino/*/encoder.xml"))) == 2


def test_openvino_cache_dir_is_where_graphs_are_kept(
    family_dirs: FamilyDirs, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--openvino-cache-dir (the operator points it into a model cache claim, shared by a fleet's
    pods): a second engine there reads the first one's graph instead of converting."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    shared = tmp_path / "claim" / ".openvino"
    path = family_dirs.get("splade")
    config = EngineConfig(
        model=str(path),
        device="cpu",
        dtype="float32",
        cpu_runtime="openvino",
        openvino_cache_dir=str(shared),
    )
    seqs = random_sequences(300, (4, 21))
    [first] = TorchEngine(config).run([item(seqs)])
    assert len(list(shared.glob("*/encoder.xml"))) == 1
    assert not (tmp_path / "xdg").exists()
    assert not list(shared.glob(".partial-*"))

    def no_conversion(model: object) -> None:
        raise AssertionError("converted again although the graph was cached")

    monkeypatch.setattr(runtimes, "convert", no_conversion)
    # auto with a kept cache is openvino (what `embedfleet serve` gives its workers) up to the
    # sequence length it measured OpenVINO the faster at, on this CPU: one of the timed lengths
    auto = TorchEngine(replace(config, cpu_runtime="auto"))
    assert auto.runtime_name == "openvino"
    assert auto.counters().runtime == "openvino"
    assert auto.compiled_seqlen in [0, *runtimes.seqlen_probe_lengths(auto.max_tokens)]

    # Which batches run where, with the measurement replaced (a fake timer, so that the turn is
    # known): OpenVINO faster at 32 tokens, eager from 64 on.
    def turns_at_64(lengths: list[int], timer: object) -> tuple[int, list[Any]]:
        return runtimes.openvino_seqlen(lengths, lambda n: (1.0, 2.0) if n < 64 else (2.0, 1.0))

    monkeypatch.setattr(torch_engine, "openvino_seqlen", turns_at_64)
    auto = TorchEngine(replace(config, cpu_runtime="auto"))
    assert auto.compiled_seqlen == 32
    assert auto.runtime is not None
    compiled, calls = auto.runtime.hidden, []

    def counted(*args: Any) -> torch.Tensor:
        calls.append(args)
        return compiled(*args)

    monkeypatch.setattr(auto.runtime, "hidden", counted)
    [second] = auto.run([item(seqs)])
    np.testing.assert_array_equal(first, second)
    assert len(calls) == 1
    longer = random_sequences(300, (33, 7))
    [eager] = auto.run([item(longer)])
    assert len(calls) == 1
    [want] = TorchEngine(replace(config, cpu_runtime="eager")).run([item(longer)])
    np.testing.assert_array_equal(eager, want)


def test_the_probe_lengths_double_up_to_the_limit() -> None:
    assert runtimes.seqlen_probe_lengths(256) == [32, 64, 128, 256]
    assert runtimes.seqlen_probe_lengths(512) == [32, 64, 128, 256, 512]
    assert runtimes.seqlen_probe_lengths(300) == [32, 64, 128, 256, 300]
    assert runtimes.seqlen_probe_lengths(16) == [16]


class _Clock:
    """A clock that each timed length moves on by its seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("eager_faster_from", "want", "timed"),
    [
        (512, 256, [32, 64, 128, 256, 512]),  # AVX-512 without AMX: the turn measured there
        (10_000, 2048, [32, 64, 128, 256, 512, 1024, 2048]),  # OpenVINO bf16 on AMX: never
        (32, 0, [32]),  # eager the faster at once: every batch eager
    ],
)
def test_auto_runs_openvino_up_to_the_length_eager_overtakes_it(
    eager_faster_from: int, want: int, timed: list[int]
) -> None:
    clock, asked = _Clock(), []

    def timer(length: int) -> tuple[float, float]:
        asked.append(length)
        clock.now += 0.01
        return (1.0, 2.0) if length < eager_faster_from else (2.0, 1.0)

    lengths = runtimes.seqlen_probe_lengths(2048)
    seqlen, timings = runtimes.openvino_seqlen(lengths, timer, clock=clock)
    assert seqlen == want
    # Nothing past the turn is timed: those lengths run eager anyway.
    assert asked == timed == [n for n, _, _ in timings]


def test_the_length_probe_stops_at_its_budget() -> None:
    """A long-context model's eager forward takes seconds at its limit on a small CPU: the
    lengths past the budget run eager, as past a turn."""
    clock = _Clock()

    def timer(length: int) -> tuple[float, float]:
        clock.now += length / 100  # 0.32 s at 32 tokens, 20.48 s at 2,048
        return 1.0, 2.0

    lengths = runtimes.seqlen_probe_lengths(2048)
    seqlen, timings = runtimes.openvino_seqlen(lengths, timer, budget_seconds=5.0, clock=clock)
    # 0.32 + 0.64 + 1.28 + 2.56 = 4.8 s within the budget; 512 starts there and is the last
    assert [n for n, _, _ in timings] == [32, 64, 128, 256, 512]
    assert seqlen == 512


class _FakeOV:
    """openvino.save_model's file-writing alone, tagged with who wrote the pair."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def save_model(self, model: object, path: str, compress_to_fp16: bool) -> None:
        xml = Path(path)
        xml.write_text(self.tag)
        xml.with_suffix(".bin").write_text(self.tag)


def test_a_saved_graph_appears_whole_and_the_first_writer_wins(tmp_path: Path) -> None:
    entry = tmp_path / "key"
    runtimes._save(_FakeOV("first"), None, entry)
    # A second pod converting the same checkpoint at the same time keeps the first's pair.
    runtimes._save(_FakeOV("second"), None, entry)
    assert (entry / "encoder.xml").read_text() == (entry / "encoder.bin").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key"]  # no partial folders left
    # An entry without its graph (older code wrote partial files in place) is replaced.
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "partial-1.bin").write_text("half")
    runtimes._save(_FakeOV("new"), None, stale)
    assert sorted(p.name for p in stale.iterdir()) == ["encoder.bin", "encoder.xml"]


def test_the_cache_keeps_the_most_recently_used_graphs(tmp_path: Path) -> None:
    """Each checkpoint or code change keys a new entry: the oldest go, a partial one stays."""
    for n in range(5):
        entry = tmp_path / f"k{n}"
        runtimes._save(_FakeOV(str(n)), None, entry)
        os.utime(entry, (1000 + n, 1000 + n))
    os.utime(tmp_path / "k0", (2000, 2000))  # read last: the most recently used
    (tmp_path / ".partial-x").mkdir()  # another writer's, mid-save
    runtimes._prune(tmp_path, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".partial-x", "k0", "k3", "k4"]


def test_openvino_leaves_torch_one_thread_unless_its_head_is_heavy(
    family_dirs: FamilyDirs, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Torch's spinning OpenMP threads took the cores from OpenVINO's around each graph call; a
    SPLADE head (a vocabulary-wide GEMM per token, run in torch) keeps them."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    before = torch.get_num_threads()
    try:
        for family, want in (("bge-reranker-base", 1), ("splade", 2)):
            config = EngineConfig(
                model=str(family_dirs.get(family)),
                device="cpu",
                dtype="float32",
                cpu_runtime="openvino",
                threads=2,
            )
            TorchEngine(config)
            assert torch.get_num_threads() == want, family
    finally:
        torch.set_num_threads(before)
