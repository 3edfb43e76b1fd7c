"""The docs stay in step with the binary: the settings contract names every setting --help names
and no other, and every metric family /metrics serves is documented in docs/gateway.md."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from .helpers import Gateway, run_binary

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "gateway.md"
SETTINGS = ROOT / "gateway" / "contract" / "settings.md"


def test_the_settings_table_names_every_setting() -> None:
    documented = set(re.findall(r"^\| `--([a-z][a-z0-9-]+)`", SETTINGS.read_text(), re.M))
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
