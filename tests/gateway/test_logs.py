"""The gateway's log: JSON lines in the shape of every embedfleet component's (common/logs.py:
ts, level, logger, msg, then the fields), filtered by --log-level."""

from __future__ import annotations

import json
from pathlib import Path

from embedfleet.testing.gateway import running_gateway
from embedfleet.testing.workers import running_worker


def _records(log: Path) -> list[dict[str, object]]:
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines
    return [json.loads(line) for line in lines]  # every line is one JSON object


def test_every_line_is_a_json_record_of_the_shared_shape(tmp_path: Path) -> None:
    with running_worker(tmp_path, "--engine", "null", "--warmup-seconds", "0.2") as worker:
        log = tmp_path / "gw.log"
        with running_gateway([worker.address], log=log):
            pass
    records = _records(log)
    for record in records:
        assert list(record)[:4] == ["ts", "level", "logger", "msg"]
        assert record["level"] in {"debug", "info", "warning", "error"}
        assert str(record["logger"]).startswith("embedfleet.gateway")
    # Discovery says what changed, so one log query follows the fleet.
    changed = [r for r in records if r["msg"] == "workers changed"]
    assert changed
    assert changed[0]["added"] == [worker.address]
    assert changed[0]["removed"] == []
    assert changed[0]["workers"] == 1
    assert any(
        r["msg"] == "worker readiness" and r["worker"] == worker.address and r["ready"] is True
        for r in records
    )


def test_log_level_warning_keeps_only_warnings_and_errors(tmp_path: Path) -> None:
    log = tmp_path / "gw.log"
    # A worker that never answers: its probe failures are warnings, its start-up lines info.
    flags = ("--log-level", "warning", "--hold-requests", "1")
    with running_gateway(["127.0.0.1:9"], *flags, log=log):
        pass
    text = log.read_text()
    assert '"level":"info"' not in text
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert all(r["level"] in {"warning", "error"} for r in records)
