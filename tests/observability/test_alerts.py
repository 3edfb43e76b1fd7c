"""The alert rules pass promtool's checks and unit tests (tests/observability/alerts/)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from .helpers import RULES, alert_names, binary

TESTS = Path(__file__).with_name("alerts") / "embedfleet.rules.test.yaml"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args], capture_output=True, text=True, cwd=cwd, check=False
    )


def test_promtool_check_rules() -> None:
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_test_rules() -> None:
    proc = promtool("test", "rules", TESTS.name, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_has_a_unit_test() -> None:
    alerts = alert_names()
    tested = {
        case["alertname"]
        for test in yaml.safe_load(TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts == tested, f"alerts without a firing test case: {alerts - tested}"


def test_alerts_carry_severity_and_docs() -> None:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
                assert rule["annotations"]["summary"], rule["alert"]
                assert rule["annotations"]["description"], rule["alert"]
