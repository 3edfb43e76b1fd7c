"""The engine's graph counters and info as scraped: rejects, live graphs, attention label."""

from __future__ import annotations

from prometheus_client import generate_latest

from embedfleet.worker.contract import GraphCounters
from embedfleet.worker.metrics import WorkerMetrics


def test_engine_info_and_graph_rejects_are_exported() -> None:
    counters = GraphCounters(
        captures=5,
        rejects=2,
        live_graphs=3,
        attention="torch-varlen",
        graphs_enabled=True,
        runtime="eager",
    )
    text = generate_latest(WorkerMetrics(lambda: counters).registry).decode()
    assert "embedfleet_worker_graph_rejects_total 2.0" in text
    assert "embedfleet_worker_live_graphs 3.0" in text
    info = 'embedfleet_worker_engine_info{attention="torch-varlen",cuda_graphs="on",' + (
        'runtime="eager"}'
    )
    assert info + " 1.0" in text
    off = GraphCounters(
        attention="torch-grouped", graphs_off_reason="cannot be captured", runtime="openvino"
    )
    text = generate_latest(WorkerMetrics(lambda: off).registry).decode()
    info = 'embedfleet_worker_engine_info{attention="torch-grouped",cuda_graphs="off",' + (
        'runtime="openvino"}'
    )
    assert info + " 1.0" in text
