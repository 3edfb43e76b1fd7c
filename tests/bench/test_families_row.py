"""The families benchmark's row: each system's texts/s and p99, and embedfleet's ratio."""

from __future__ import annotations

from embedfleet.bench.families import row
from embedfleet.bench.http_load import Measurement
from embedfleet.bench.suites import SystemRun

KEY = "queries/16 clients"


def run(name: str, requests: int, status: str = "ok") -> SystemRun:
    measured = Measurement(16, requests, 0, 10.0, 32, 1, 50.0, 90.0, 60.0)
    return SystemRun(name, "1", "", "embed", status=status, points={KEY: measured})


def test_the_ratio_is_embedfleet_over_sentence_transformers() -> None:
    line = row("mpnet", [run("embedfleet", 300), run("sentence-transformers", 4)], KEY)
    assert line == ("| mpnet | 30.0 texts/s, p99 90 ms | 0.4 texts/s, p99 90 ms | 75.00x |")


def test_a_failed_system_leaves_no_ratio() -> None:
    failed = run("sentence-transformers", 4, status="failed: boom")
    line = row("mpnet", [run("embedfleet", 300), failed], KEY)
    assert line.endswith("| failed: boom | n/a |")
