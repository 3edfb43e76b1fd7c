"""The worker's per-stage histogram: one observation per stage of each request, none for the
gateway's Info probes, and the engine's own stages where its Pending reports them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
from prometheus_client import generate_latest

from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.testing.workers import WorkerProcess, metric_value, worker_stub
from embedfleet.worker.contract import Done, EngineInfo, GraphCounters, Pending, WorkItem
from embedfleet.worker.metrics import STAGES, WorkerMetrics
from embedfleet.worker.runner import BatchRunner, Entry
from embedfleet.worker.scheduler import Budget, FcfsQueue

from .helpers import embed_request

STAGE = "embedfleet_worker_stage_seconds"


def _counts(worker: WorkerProcess) -> dict[str, float]:
    text = worker.metrics_text()
    return {s: metric_value(text, STAGE + "_count", stage=s) for s in STAGES}


def test_each_request_stage_is_observed_once_and_probes_not_at_all(
    null_worker: WorkerProcess,
) -> None:
    stub = worker_stub(null_worker.channel())
    before = _counts(null_worker)
    for _ in range(3):
        stub.Embed(embed_request([[101, 2000, 102]]), timeout=30)
    after_embeds = _counts(null_worker)
    for _ in range(5):
        stub.Info(pb.InfoRequest(), timeout=30)
    after_probes = _counts(null_worker)
    assert {s: after_embeds[s] - before[s] for s in STAGES} == dict.fromkeys(STAGES, 3.0)
    assert after_probes == after_embeds
    text = null_worker.metrics_text()
    assert metric_value(text, STAGE + "_sum", stage="validate") > 0


class _StagedEngine:
    """MOCK: an engine whose Pending reports its stages, as the contract lets one do."""

    info = EngineInfo("staged", "embed", 1, 16, 100, "none", "mock", "mean", False)

    def validate(self, item: WorkItem) -> None:
        pass

    def step(self, items: Sequence[WorkItem]) -> Pending:
        rows = [np.zeros((it.tokens.count, 1), np.float32) for it in items]
        return Done(rows, stages=(("pack", 2_000_000), ("forward", 5_000_000), ("pool", 1_000)))

    def counters(self) -> GraphCounters:
        return GraphCounters()


async def test_the_runner_exports_the_stages_an_engine_reports() -> None:
    from embedfleet.common.codec import Tokens

    metrics = WorkerMetrics()
    queue: FcfsQueue[Entry] = FcfsQueue(Budget(8, 8, 32), 100)
    runner = BatchRunner(_StagedEngine(), queue, metrics, asyncio.get_running_loop())
    runner.start()
    ids = np.ones(4, np.int32)
    entry = runner.submit(WorkItem(Tokens(ids, np.array([4], np.int32))))
    await asyncio.wait_for(entry.future, 5)
    runner.stop()
    assert await asyncio.to_thread(runner.join, 5)
    text = generate_latest(metrics.registry).decode()
    assert metric_value(text, STAGE + "_count", stage="forward") == 1
    assert metric_value(text, STAGE + "_sum", stage="forward") == 0.005
    assert metric_value(text, STAGE + "_sum", stage="pack") == 0.002
    assert metric_value(text, STAGE + "_count", stage="parse") == 0  # the server's, not here
