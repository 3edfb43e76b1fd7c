"""docs/gateway.md stays in step with the binary: its settings table names every setting --help
names and no other, and every metric family /metrics serves is documented."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from .helpers import Gateway, run_binary

DOC = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"


def test_the_settings_table_names_every_setting() -> None:
    found = re.search(r"<!-- settings:begin -->\n(.*)<!-- settings:end -->", DOC.read_text(), re.S)
    assert found, "settings markers missing"
    documented = set(re.findall(r"`--([a-z][a-z0-9-]+)`", found.group(1)))
    done = run_binary("--help")
    assert done.returncode == 0
    flags = set(re.findall(r"--([a-z][a-z0-9-]+)", done.stdout)) - {"help", "version"}
    assert len(flags) >= 40
    assert flags == documented


def test_every_metric_is_documented(fakes: Gateway) -> None:
    text = DOC.read_text()
    names = {f.name for f in text_string_to_metric_families(fakes.metrics())}
    assert len(names) >= 12
    for name in names:
        assert f"`{name}`" in text or f"`{name}_total`" in text, name
