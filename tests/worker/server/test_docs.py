"""docs/worker.md's generated tables match the code (settings and metrics)."""

from __future__ import annotations

from embedfleet.worker.docs import DOC, render
from embedfleet.worker.metrics import WorkerMetrics, metric_rows
from embedfleet.worker.settings import ENV_PREFIX, WorkerSettings


def test_worker_doc_tables_are_up_to_date() -> None:
    text = DOC.read_text()
    assert render(text) == text, "run: .venv/bin/python -m embedfleet.worker.docs"


def test_every_setting_and_metric_is_in_the_doc() -> None:
    text = DOC.read_text()
    for name in WorkerSettings.__dataclass_fields__:
        assert f"`--{name.replace('_', '-')}`" in text
        assert f"`{ENV_PREFIX}{name.upper()}`" in text
    rows = metric_rows(WorkerMetrics())
    assert len(rows) >= 16
    for metric, *_ in rows:
        assert metric.startswith("embedfleet_worker_")
        assert f"`{metric}`" in text
