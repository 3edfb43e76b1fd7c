"""What the Rust gateway does not do yet says so (a refusal at start naming the setting),
never a different answer: the Python gateway serves these."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.gateway_rs import child_env

from .conftest import run_binary


@pytest.mark.parametrize(
    "argv",
    [
        ["--tracing-endpoint", "http://127.0.0.1:4317"],
        ["--models-file", "m.json"],
        ["--tracing-service-name", "gw"],
        ["--no-such-flag", "1"],
    ],
)
def test_unsupported_settings_are_refused_at_start(rust_binary: Path, argv: list[str]) -> None:
    proc = run_binary(rust_binary, "--workers", "127.0.0.1:1", "--port", "0", *argv)
    assert proc.returncode == 2
    assert argv[0] in proc.stderr, proc.stderr


@pytest.mark.parametrize("task", ["score", "classify", "sparse", "nonsense"])
def test_a_task_the_checkpoint_does_not_fit_is_refused(rust_binary: Path, task: str) -> None:
    """MiniLM (a BertModel) is no reranker, classifier or SPLADE model: refused as the Python
    gateway refuses it (modeldir.py), whatever the Rust gateway serves."""
    proc = run_binary(rust_binary, "--workers", "127.0.0.1:1", "--port", "0", "--task", task)
    assert proc.returncode == 2
    want = "unknown task" if task == "nonsense" else f"task {task} does not fit architectures"
    assert want in proc.stderr, proc.stderr


def test_unsupported_env_vars_are_refused_at_start(rust_binary: Path) -> None:
    env = {**child_env(), "EMBEDFLEET_GATEWAY_TRACING_SAMPLE_RATIO": "0.5"}
    proc = run_binary(rust_binary, "--workers", "127.0.0.1:1", env=env)
    assert proc.returncode == 2
    assert "--tracing-sample-ratio" in proc.stderr


def test_every_python_setting_is_taken_or_refused_by_name(rust_binary: Path) -> None:
    """No setting of the Python gateway is silently ignored: each flag is either one the Rust
    binary takes (it then fails later, on the bogus value or the unreachable worker) or one it
    refuses naming itself as unsupported."""
    for f in dataclasses.fields(GatewaySettings):
        flag = "--" + f.name.replace("_", "-")
        argv = ("--workers", "127.0.0.1:1", flag, "not-a-value", "--port", "x")
        proc = run_binary(rust_binary, *argv, env=dict(os.environ))
        assert proc.returncode == 2, flag
        assert "unknown setting" not in proc.stderr, f"{flag}: {proc.stderr}"
