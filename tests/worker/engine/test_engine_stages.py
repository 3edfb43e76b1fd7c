"""The torch engine's own stages of a CPU batch (contract.StageTimes): what the worker exports as
embedfleet_worker_stage_seconds{stage=pack|forward|pool}."""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt
import pytest
import torch

from embedfleet.worker.contract import Done
from embedfleet.worker.engine import torch_engine
from embedfleet.worker.engine.batch import DeviceBatch
from embedfleet.worker.engine.forward import encode
from embedfleet.worker.engine.torch_engine import TorchEngine
from embedfleet.worker.metrics import ENGINE_STAGES

from .helpers import item, minilm, random_sequences


class _Clock:
    """perf_counter_ns that moves only when the encoder runs: each stage's time is then exactly
    the work attributed to it."""

    def __init__(self) -> None:
        self.ns = 0

    def perf_counter_ns(self) -> int:
        return self.ns


class _TimedEncoder:
    """The engine's own eager encoder, advancing the clock by one second: where that second
    lands says which stage times the encoder."""

    name = "timed"

    def __init__(self, engine: TorchEngine, clock: _Clock) -> None:
        self._engine, self._clock = engine, clock

    def hidden(
        self,
        batch: DeviceBatch,
        lengths: npt.NDArray[np.int64],
        keys: npt.NDArray[np.int64] | None = None,
    ) -> torch.Tensor:
        self._clock.ns += 1_000_000_000
        e = self._engine
        return encode(e.model, e.backend, batch, int(lengths.max()), lengths, keys=keys)


def test_a_cpu_batch_reports_pack_forward_and_pool() -> None:
    engine = minilm("float32", "eager")
    items = [item(random_sequences(30000, (5, 40))), item(random_sequences(30000, (12,), seed=1))]
    want = engine.run(items)
    start = time.perf_counter_ns()
    pending = engine.step(items)
    wall = time.perf_counter_ns() - start
    assert isinstance(pending, Done)
    names = [name for name, _ in pending.stages]
    assert names == list(ENGINE_STAGES)
    assert all(ns > 0 for _, ns in pending.stages)
    # Disjoint parts of the one step: together no longer than the step itself.
    assert sum(ns for _, ns in pending.stages) <= wall
    for got, expected in zip(pending.wait(), want, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_the_encoder_is_timed_as_forward_only(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = minilm("float32", "eager")
    items = [item(random_sequences(30000, (7, 9)))]
    want = engine.run(items)
    clock = _Clock()
    monkeypatch.setattr(torch_engine, "time", clock)
    monkeypatch.setattr(engine, "runtime", _TimedEncoder(engine, clock))
    pending = engine.step(items)
    assert isinstance(pending, Done)
    assert dict(pending.stages) == {"pack": 0, "forward": 1_000_000_000, "pool": 0}
    np.testing.assert_array_equal(pending.wait()[0], want[0])
