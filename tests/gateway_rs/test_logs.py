"""The Rust gateway's log: JSON lines in the Python components' shape (common/logs.py), filtered
by --log-level; and --help answered on stdout with success."""

from __future__ import annotations

import json
from pathlib import Path

from embedfleet.testing.gateway_rs import running_gateway_rs
from embedfleet.testing.workers import running_worker

from .conftest import run_binary


def _records(log: Path) -> list[dict[str, object]]:
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines
    return [json.loads(line) for line in lines]  # every line is one JSON object


def test_every_line_is_a_json_record_with_the_python_keys(tmp_path: Path) -> None:
    with running_worker(tmp_path, "--engine", "null", "--warmup-seconds", "0.2") as worker:
        log = tmp_path / "gw.log"
        with running_gateway_rs([worker.address], log=log):
            pass
    records = _records(log)
    for record in records:
        assert list(record)[:4] == ["ts", "level", "logger", "msg"]
        assert record["level"] in {"debug", "info", "warning", "error"}
        assert str(record["logger"]).startswith("embedfleet.gateway_rs")
    # The discovery lines are the Python gateway's (gateway/pool.py), so one log query reads both.
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
    with running_gateway_rs(["127.0.0.1:9"], *flags, log=log):
        pass
    text = log.read_text()
    assert '"level":"info"' not in text
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert all(r["level"] in {"warning", "error"} for r in records)


def test_help_is_answered_on_stdout_with_success(rust_binary: Path) -> None:
    done = run_binary(rust_binary, "--help")
    assert done.returncode == 0, done.stderr
    assert "--workers" in done.stdout
    assert "--log-level" in done.stdout
    assert done.stderr == ""
