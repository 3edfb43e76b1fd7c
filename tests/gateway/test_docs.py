"""docs/gateway.md stays in step with the code: the settings table and the metric list."""

from __future__ import annotations

import re
from pathlib import Path

from embedfleet.common.settings import markdown_table
from embedfleet.gateway.balancer import Balancer
from embedfleet.gateway.metrics import Metrics
from embedfleet.gateway.settings import ENV_PREFIX, GatewaySettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"


def test_settings_table_is_current() -> None:
    text = DOC.read_text()
    found = re.search(r"<!-- settings:begin -->\n(.*)<!-- settings:end -->", text, re.S)
    assert found, "settings markers missing"
    assert found.group(1) == markdown_table(GatewaySettings, ENV_PREFIX), (
        "regenerate the table with embedfleet.common.settings.markdown_table"
    )


def test_every_metric_is_documented() -> None:
    text = DOC.read_text()
    balancer = Balancer(1)
    metrics = Metrics(lambda: balancer)
    names = {m.name for m in metrics.registry.collect()}
    assert len(names) >= 12
    for name in names:
        suffix = "_total" if f"`{name}_total`" in text else ""
        assert f"`{name}{suffix}`" in text, name
