"""The gateway benchmark's pure parts: its overhead table and the CPU accounting it relies on."""

from __future__ import annotations

import os

from embedfleet.bench.gateway import Row, table, tree_cpu_seconds


def test_overhead_is_gateway_minus_worker_at_equal_clients() -> None:
    rows = [
        Row("concurrency", "worker alone (gRPC)", 1, 1.0, 2.0, 900.0, 0, 500.0),
        Row("concurrency", "gateway+worker (HTTP)", 1, 1.75, 3.0, 600.0, 0, 800.0),
    ]
    text = table(rows)
    assert "| 1 | +0.750 | 0.67 |" in text
    assert "| 800 |" in text


def test_tree_cpu_counts_this_process() -> None:
    before = tree_cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert tree_cpu_seconds(os.getpid()) > before
