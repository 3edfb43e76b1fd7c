"""The gateway benchmark's pure parts: its overhead table and the CPU accounting it relies on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from embedfleet.bench import cpu_profile
from embedfleet.bench.cpu_profile import stage_of
from embedfleet.bench.gateway import Row, table, tree_cpu_seconds
from embedfleet.bench.gateway_cpu import CpuRow, cpu_table


def test_overhead_is_gateway_minus_worker_at_equal_clients() -> None:
    rows = [
        Row("concurrency", "worker alone (gRPC)", 1, 1.0, 2.0, 900.0, 0, 500.0),
        Row("concurrency", "gateway+worker (HTTP)", 1, 1.75, 3.0, 600.0, 0, 800.0),
    ]
    text = table(rows)
    assert "| 1 | +0.750 | 0.67 |" in text
    assert "| 800 |" in text


def test_tree_cpu_counts_this_process() -> None:
    before = tree_cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert tree_cpu_seconds(os.getpid()) > before


def test_cpu_rows_add_gateway_and_worker_and_ratio_against_the_first_gateway() -> None:
    rows = [
        CpuRow("worker alone (gRPC)", "null", "1x20", 16, 100, 900.0, 1.0, 2.0, 0.0, 600.0, 0),
        CpuRow("baseline gateway", "null", "1x20", 16, 100, 300.0, 5.0, 9.0, 800.0, 700.0, 0),
        CpuRow("gateway (default)", "null", "1x20", 16, 100, 600.0, 3.0, 8.0, 500.0, 250.0, 0),
    ]
    assert rows[2].total_cpu_us == 750.0
    assert round(rows[2].per_core) == 1333
    text = cpu_table(rows)
    assert (
        "| null | 1x20 | 16 | gateway (default) / baseline gateway | 0.50 | 0.62 | 2.00 |" in text
    )


def test_profile_stages_come_from_file_and_function_names() -> None:
    assert stage_of("/x/grpc/aio/_call.py:_invoke") == "gRPC (Python side)"
    assert stage_of("~:<method 'encode_batch' of 'tokenizers.Tokenizer' objects>") == "tokenize"
    assert stage_of("/x/uvicorn/protocols/http/httptools_impl.py:send").startswith("HTTP server")
    assert stage_of("/x/gateway/coalescing.py:embed") == "dispatch + balance"


def test_the_hook_profiles_a_child_between_the_signals(tmp_path: Path) -> None:
    hook = cpu_profile.hook_dir(tmp_path / "hook")
    child = (
        "import os, signal\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "def spin():\n    return sum(i * i for i in range(300_000))\n"
        "spin()\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
    )
    env = {**os.environ, cpu_profile.ENV: str(tmp_path)}
    env["PYTHONPATH"] = f"{hook}{os.pathsep}{env.get('PYTHONPATH', '')}"
    subprocess.run([sys.executable, "-c", child], env=env, check=True, timeout=60)
    (prof,) = tmp_path.glob("*.prof")
    process, main = cpu_profile.process_cpu([prof])
    assert main > 0
    assert process == pytest.approx(main, rel=0.05)  # one thread: its CPU is the process's
    assert any("spin" in f for f, _ in cpu_profile.top_functions([prof], 20))
