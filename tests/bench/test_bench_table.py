"""The benchmarks' pure parts: the gateway overhead table and its CPU accounting, the comparison's
best-peer row, the per-stage breakdown and the layout table."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from embedfleet.bench import cpu_profile, thread_cpu
from embedfleet.bench.cpu_profile import stage_of
from embedfleet.bench.gateway import Row, table
from embedfleet.bench.gateway_cpu import CpuRow, cpu_table, medians, own_ms
from embedfleet.bench.http_load import Measurement
from embedfleet.bench.layouts import FIGURES, LayoutRun
from embedfleet.bench.layouts import table as layouts_table
from embedfleet.bench.report import best_peer, suite_table, systems_table, targets_table
from embedfleet.bench.stages import (
    Breakdown,
    Shape,
    engine_stages,
    histogram_sums,
    parse_shape,
    stage_rows,
)
from embedfleet.bench.stages import cpu_table as stages_cpu_table
from embedfleet.bench.stages import table as stages_table
from embedfleet.bench.suites import Point, SystemRun
from embedfleet.testing.procfs import tree_cpu_seconds


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


def test_a_gateways_own_time_is_its_request_time_less_its_worker_calls() -> None:
    # 200 requests took 0.5 s in the gateway, 0.3 s of it waiting on their 200 worker calls
    assert own_ms((10, 1.0, 10, 0.7), (210, 1.5, 210, 1.0)) == pytest.approx(1.0)
    assert math.isnan(own_ms((10, 1.0, 10, 0.7), (10, 1.0, 10, 0.7)))  # no request
    # calls that overlap (several chunks a request) say nothing of the gateway's own time
    assert math.isnan(own_ms((0, 0.0, 0, 0.0), (100, 1.0, 400, 3.0)))
    row = CpuRow("rust gateway", "null", "1x20", 1, 10, 1.0, 1.0, 1.0, 50.0, 60.0, 0, 0.0421)
    assert "| 1.00 | 0.042 | 50 | 60 | 110 |" in cpu_table([row])


def test_paired_rows_are_ratioed_against_the_baseline_that_ran_beside_them() -> None:
    rows = [
        CpuRow("baseline worker alone (gRPC)", "null", "1x20", 16, 9, 1.0, 1, 2, 0.0, 600.0, 0),
        CpuRow("baseline gateway", "null", "1x20", 16, 100, 300.0, 5.0, 9.0, 800.0, 200.0, 0),
        CpuRow("gateway (default)", "null", "1x20", 16, 100, 600.0, 3.0, 8.0, 500.0, 250.0, 0),
        CpuRow("baseline gateway, paired", "null", "1x20", 16, 100, 400.0, 5, 9, 400.0, 100.0, 0),
        CpuRow("gateway (default), paired", "null", "1x20", 16, 100, 200.0, 3, 8, 200.0, 50.0, 0),
    ]
    text = cpu_table(rows)
    assert "gateway (default), paired / baseline gateway, paired | 0.50 | 0.50 | 0.50 |" in text
    assert "baseline gateway, paired / baseline gateway" not in text
    assert "worker alone (gRPC) / " not in text


def test_each_systems_median_round_is_kept_in_first_seen_order() -> None:
    def row(system: str, gateway_us: float) -> CpuRow:
        return CpuRow(system, "null", "1x20", 1, 10, 1.0, 1.0, 1.0, gateway_us, 100.0, 0)

    rounds = [row("b", 500), row("a", 900), row("b", 300), row("a", 100), row("b", 400)]
    kept = medians(rounds)
    assert [(r.system, r.gateway_cpu_us) for r in kept] == [("b", 400), ("a", 100)]


def test_profile_stages_come_from_file_and_function_names() -> None:
    assert stage_of("/x/grpc/aio/_call.py:_invoke") == "gRPC (Python side)"
    assert stage_of("/x/worker/scheduler.py:take") == "worker front"
    assert stage_of("/x/worker/engine/torch_engine.py:step") == "engine"


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


# --- the comparison table's best-peer row ----------------------------------------------------


def _m(tps: float, p50: float, p99: float) -> Measurement:
    return Measurement(1, int(tps / 100), 0, 1.0, 100, 1, p50, p99, p50)  # tps tok/s in 1 s


def test_each_point_ends_with_embedfleet_over_the_best_peer_figure_by_figure() -> None:
    point = Point("latency", "128 tokens", "embed", 1, 1, 128, 1.0, 0.1, 1)
    runs = [
        SystemRun("embedfleet", "dev", "", "rerank", points={point.key: _m(1000, 20.0, 40.0)}),
        SystemRun("fast-p50", "1", "", "embed", points={point.key: _m(800, 10.0, 80.0)}),
        SystemRun("fast-p99", "1", "", "embed", points={point.key: _m(2000, 30.0, 20.0)}),
        SystemRun("absent", "1", "", "embed", status="unavailable: not installed"),
    ]
    text = suite_table("latency", [point], runs)
    best = next(line for line in text.splitlines() if "best peer" in line)
    # tok/s against fast-p99's 2,000; p50 against fast-p50's 10 ms; p99 against fast-p99's 20 ms
    assert "| 0.50× (fast-p99) | 0.50× (fast-p99) | 2.00× (fast-p50) | 2.00× (fast-p99) |" in best
    assert "| 128 tokens | absent | unavailable: not installed |" in text


def test_best_peer_is_none_without_peers() -> None:
    point = Point("latency", "128 tokens", "embed", 1, 1, 128, 1.0, 0.1, 1)
    ours = SystemRun("embedfleet", "dev", "", "rerank", points={point.key: _m(1000, 20.0, 40.0)})
    assert best_peer([ours], point.key, "p50_ms", higher=False) is None
    assert "best peer** | – | – | – | – |" in suite_table("latency", [point], [ours])


def test_peak_memory_is_held_against_the_leanest_peer_that_was_measured() -> None:
    runs = [
        SystemRun("embedfleet", "dev", "", "rerank", peak_rss_mb=900.0),
        SystemRun("lean", "1", "", "embed", peak_rss_mb=600.0),
        SystemRun("heavy", "1", "", "embed", peak_rss_mb=2000.0),
        SystemRun("remote", "1", "", "embed"),  # no processes of ours to read
    ]
    row = next(line for line in targets_table(runs).splitlines() if "peak RSS" in line)
    assert row == "| peak RSS MiB | 900 | lean 600 | 1.50× | ≤ 1.0× | no |"
    runs[0].peak_rss_mb = 550.0
    assert "| 0.92× | ≤ 1.0× | yes |" in targets_table(runs)
    assert "| 2,000 | ok |" in systems_table(runs)
    assert "| – | ok |" in systems_table(runs)  # the remote one
    without = next(line for line in targets_table(runs[:1]).splitlines() if "peak RSS" in line)
    assert without.endswith("| not measured |")


# --- the per-stage breakdown -------------------------------------------------------------------


def _hist(name: str, total: float, count: float, **labels: str) -> str:
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    lab = "{" + lab + "}" if lab else ""
    return f"# TYPE {name} histogram\n{name}_sum{lab} {total}\n{name}_count{lab} {count}\n"


def test_stage_rows_account_for_the_client_latency() -> None:
    g, w = "embedfleet_gateway_", "embedfleet_worker_"
    before = histogram_sums(_hist(g + "request_seconds", 1.0, 10, route="/v1/embeddings"))
    gateway = "".join(
        [
            _hist(g + "request_seconds", 1.0 + 0.050, 12, route="/v1/embeddings"),
            "# TYPE embedfleet_gateway_stage_seconds histogram\n"
            f'{g}stage_seconds_sum{{stage="parse"}} 0.002\n'
            f'{g}stage_seconds_count{{stage="parse"}} 2\n'
            f'{g}stage_seconds_sum{{stage="respond"}} 0.004\n'
            f'{g}stage_seconds_count{{stage="respond"}} 2\n',
            _hist(g + "tokenize_seconds", 0.006, 2),
            _hist(g + "upstream_seconds", 0.030, 2),
        ]
    )
    worker = "".join(
        [
            _hist(w + "request_seconds", 0.020, 2),
            _hist(w + "queue_wait_seconds", 0.002, 2),
            _hist(w + "compute_seconds", 0.014, 2),
            "# TYPE embedfleet_worker_stage_seconds histogram\n",
            *(
                f'{w}stage_seconds_sum{{stage="{s}"}} {v}\n'
                f'{w}stage_seconds_count{{stage="{s}"}} 2\n'
                for s, v in (
                    ("parse", 0.0002),
                    ("validate", 0.0004),
                    ("reply", 0.0006),
                    ("serialize", 0.0008),
                    ("forward", 0.012),
                    ("pool", 0.001),
                )
            ),
        ]
    )
    rows = stage_rows(30.0, (before, histogram_sums(gateway)), ({}, histogram_sums(worker)))
    # The engine's own stages split compute; one it did not report (pack here) is left out.
    split = engine_stages(({}, histogram_sums(worker)))
    assert split == {"forward": pytest.approx(6.0), "pool": pytest.approx(0.5)}
    assert rows["client + HTTP server"] == pytest.approx(30.0 - 25.0)  # gateway: 50 ms / 2
    assert rows["gateway glue"] == pytest.approx(25.0 - 1.0 - 3.0 - 15.0 - 2.0)
    assert rows["gRPC out + back"] == pytest.approx(15.0 - 10.0 - 0.1 - 0.4)
    assert rows["worker glue"] == pytest.approx(10.0 - 0.2 - 1.0 - 7.0 - 0.3)
    assert sum(rows.values()) == pytest.approx(30.0)  # every millisecond lands in one row
    text = stages_table([Breakdown("1x2", 128, 2, 29.0, 30.0, rows, split)])
    assert "| compute | worker | 7.00 |" in text
    assert "| ↳ forward (engine) | worker | 6.00 |" in text
    assert "| ↳ pack (engine) | worker | – |" in text
    assert "| **sum = client mean** | | **30.00** |" in text


def test_layout_table_gives_ratios_to_the_first_layout() -> None:
    figures = dict.fromkeys((k for k, _, _ in FIGURES), 10.0)
    faster = dict.fromkeys((k for k, _, _ in FIGURES), 20.0)
    runs = [
        LayoutRun("2x1", 1, figures),
        LayoutRun("1x2", 1, faster),
        LayoutRun("2x1", 2, dict.fromkeys(figures, 30.0)),
        LayoutRun("1x2", 2, faster),
    ]
    text = layouts_table(runs)
    assert "| figure | 2x1 | 1x2 |" in text
    assert "| lone 128-token request p50 ms | 20.0 | 20.0 (1.00×) |" in text  # medians per layout


def test_a_stages_layout_names_workers_threads_wait_policy_and_runtime() -> None:
    assert parse_shape("2x1") == Shape(2, 1)
    assert parse_shape("1x2:passive") == Shape(1, 2, "PASSIVE")
    shape = parse_shape("1x2:passive+eager")
    assert shape == Shape(1, 2, "PASSIVE", "eager")
    assert shape.label == "1x2 passive eager"
    assert parse_shape("1x2+openvino").label == "1x2 openvino"
    assert replace(shape, engine="null").label == "1x2 passive eager null"


def test_thread_cpu_groups_threads_by_name_and_counts_per_request(tmp_path: Path) -> None:
    # A fake /proc: the main thread, two numbered tokio workers, one thread named as the process.
    for tid, comm, ns in ((7, "worker", 4_000_000), (8, "tokio-rt-worker-1", 1_000_000)):
        _task(tmp_path, 7, tid, comm, ns)
    _task(tmp_path, 7, 9, "tokio-rt-worker-2", 2_000_000)
    _task(tmp_path, 7, 10, "worker", 500_000)
    (tmp_path / "7" / "comm").write_text("worker\n")
    before = thread_cpu.thread_ns(7, tmp_path)
    assert before == {"main": 4_000_000, "tokio-rt-worker": 3_000_000, "unnamed threads": 500_000}
    after = {**before, "main": 6_000_000, "event_engine": 1_000_000}
    assert thread_cpu.per_request_us(before, after, 4) == {"main": 500.0, "event_engine": 250.0}
    assert thread_cpu.thread_ns(99, tmp_path) == {}  # a process gone reads as nothing


def _task(proc: Path, pid: int, tid: int, comm: str, ns: int) -> None:
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True)
    (task / "comm").write_text(comm + "\n")
    (task / "schedstat").write_text(f"{ns} 1234 56\n")


def test_cpu_table_totals_each_process_and_the_servers() -> None:
    row = Breakdown(
        "1x2", 20, 10, 1.0, 1.1, cpu_us={"gateway: main": 100.0, "worker-0: main": 300.0}
    )
    row.cpu_us["worker-0: event_engine"] = 50.0
    text = stages_cpu_table([row, Breakdown("1x2 null", 20, 10, 1.0, 1.1)])
    assert "| worker-0: event_engine | 50 | – |" in text
    assert "| **worker-0 total** | 350 | 0 |" in text
    assert "| **servers total** | **450** | **0** |" in text
