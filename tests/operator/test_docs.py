"""docs/operator.md stays in step with the code: the settings table and the metric list (the
autoscaler's metrics are documented in docs/autoscaling.md)."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import REGISTRY

from embedfleet.common.settings import markdown_table
from embedfleet.operator import handlers  # noqa: F401  (registers every metric the process has)
from embedfleet.operator.settings import ENV_PREFIX, OperatorSettings

DOCS = Path(__file__).resolve().parents[2] / "docs"
DOC = DOCS / "operator.md"


def test_settings_table_is_current() -> None:
    assert markdown_table(OperatorSettings, ENV_PREFIX) in DOC.read_text(), (
        "regenerate the table with embedfleet.common.settings.markdown_table"
    )


def test_every_metric_is_documented() -> None:
    text = DOC.read_text() + (DOCS / "autoscaling.md").read_text()
    ours = {
        family.name
        for family in REGISTRY.collect()
        if family.name.startswith("embedfleet_operator_")
    }
    assert "embedfleet_operator_leader" in ours, sorted(ours)
    for name in ours:
        assert re.search(rf"`{name}(_total)?[`{{]", text), name
