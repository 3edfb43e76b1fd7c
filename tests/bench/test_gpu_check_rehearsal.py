"""bench/gpu_check.sh in rehearsal mode: the whole device check runs on the CPU, the GPU parts
skipped or on CPU stand-ins (the worker, sentence-transformers and the `transformers` server on
the CPU, tiny widths with the real tokenizers), so that its one try on a GPU goes to measuring,
not debugging. The preparation is the one a device run carries (`--prepare`, without the wheels,
which only the device's Python 3.12 needs)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def _script(
    env: dict[str, str], *args: str, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**os.environ, **env},
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prep = tmp_path_factory.mktemp("gpucheck") / "prepared"
    proc = _script({"GPU_CHECK_PREPARED": str(prep), "GPU_CHECK_NO_WHEELS": "1"}, "--prepare")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return prep


def test_preflight_stops_at_once_naming_what_is_missing(tmp_path: Path, prepared: Path) -> None:
    (tmp_path / "prep").mkdir()
    env = {"GPU_CHECK_REHEARSAL": "1", "OUT": str(tmp_path / "out"),
           "GPU_CHECK_PREPARED": str(tmp_path / "prep")}  # fmt: skip
    proc = _script(env, timeout=120)
    assert proc.returncode == 2
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "MISSING: prepared file" in summary
    assert "bin/embedfleet-gateway" in summary
    assert "stopped at the preflight" in summary
    assert "== gpu tests" not in summary


def test_rehearsal_runs_every_step_and_writes_one_json_and_one_table(
    tmp_path: Path, prepared: Path
) -> None:
    out = tmp_path / "out"
    env = {"GPU_CHECK_REHEARSAL": "1", "OUT": str(out), "GPU_CHECK_PREPARED": str(prepared)}
    proc = _script(env)
    summary = (out / "summary.txt").read_text() if (out / "summary.txt").is_file() else ""
    run_log = (out / "run.log").read_text() if (out / "run.log").is_file() else ""
    assert proc.returncode == 0, summary[-4000:] + run_log[-6000:] + proc.stderr[-2000:]
    assert "skipped" in (out / "gpu_tests.log").read_text()  # collected, none failed
    # Within the device tool's limit on files brought back.
    assert len(list(out.iterdir())) <= 8
    result = json.loads((out / "results.json").read_text())
    engine = result["engine"]
    assert engine["errors"] == {}
    assert engine["mode"].startswith("rehearsal")
    for key in ("minilm@128", "minilm@512", "qwen3-0.6b@128", "qwen3-0.6b@512"):
        row = engine["latency"][key]
        assert row["eager_ms"] > 0
        assert row["graphs_ms"] == "skipped (no CUDA)"
    for name in ("minilm", "bert-base", "qwen3-0.6b"):
        assert engine["throughput"][name]["tokens_per_second"] > 0
        assert engine["throughput"][name]["fraction_of_peak"] is None  # no peak for a CPU
    suites = result["suites"]
    assert suites["errors"] == {}
    assert set(suites["models"]) == {"minilm", "qwen3-0.6b"}  # BERT-base: MiniLM's path
    for name, model in suites["models"].items():
        for system in ("embedfleet", "sentence-transformers", "transformers-http"):
            run = model["systems"][system]
            assert run["status"] == "ok", (name, system, run["status"])
            assert run["fidelity"]["min_cosine"] >= 0.999, (name, system, run["fidelity"])
            points = run["points"]
            assert {k.split("/")[0] for k in points} == {
                "latency", "scoring", "throughput", "concurrency", "queries"
            }  # fmt: skip
            assert all(p["requests"] > 0 and p["errors"] == 0 for p in points.values())
    table = (out / "results.md").read_text()
    assert "| batch-1 qwen3-0.6b@128 tokens" in table
    assert "### qwen3-0.6b" in table
    assert "| concurrency/4 clients |" in table
    metrics = (out / "metrics.txt").read_text()
    for name in ("minilm", "qwen3-0.6b"):
        assert f"# {name}" in metrics
    assert "embedfleet_worker_eager_runs_total" in metrics
    assert "embedfleet_worker_graph_captures_total" in metrics
