"""`python -m embedfleet.bench autoscale` prints the operator's simulator scores as a table."""

from __future__ import annotations

import pytest

from embedfleet.bench import __main__ as bench
from embedfleet.bench.autoscale_sim import main


def test_main_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--hours", "0.5", "--trace", "steady", "--trace", "spike"]) == 0
    out = capsys.readouterr().out
    rows = [
        line
        for line in out.splitlines()
        if line.startswith("| steady") or line.startswith("| spike")
    ]
    assert len(rows) == 6
    assert {row.split("|")[2].strip() for row in rows} == {"ours", "hpa", "kubeai"}


def test_the_bench_entry_point_dispatches_to_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["autoscale", "--hours", "0.1", "--trace", "steady"]) == 0
    assert "| steady | ours |" in capsys.readouterr().out
