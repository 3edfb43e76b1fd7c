"""bench/gpu_check.sh in rehearsal mode: the whole device check runs on the CPU, GPU parts
skipped and recorded as such, so its first minutes on a GPU go to measuring, not debugging."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rehearsal_runs_every_step_and_writes_json_and_table(tmp_path: Path) -> None:
    env = {**os.environ, "GPU_CHECK_REHEARSAL": "1", "OUT": str(tmp_path)}
    proc = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh")],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = (tmp_path / "summary.txt").read_text()
    assert "== gpu tests" in summary
    assert "skipped" in (tmp_path / "gpu_tests.log").read_text()  # collected, none failed
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["errors"] == {}
    assert result["mode"].startswith("rehearsal")
    for key in ("minilm@128", "minilm@512", "qwen3-0.6b@128", "qwen3-0.6b@512"):
        row = result["latency"][key]
        assert row["eager_ms"] > 0
        assert row["graphs_ms"] == "skipped (no CUDA)"
    for name in ("minilm", "bert-base", "qwen3-0.6b"):
        assert result["throughput"][name]["tokens_per_second"] > 0
    engines = result["engines"]["minilm"]
    assert engines["engines_1_tokens_per_second"] > 0
    assert engines["engines_2_tokens_per_second"] > 0
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| batch-1 qwen3-0.6b@128 tokens" in table
    assert "engines per GPU" in table
