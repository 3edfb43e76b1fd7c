"""Settings the Rust gateway cannot take are refused at start, naming themselves, never
ignored: an unknown name, or a task the checkpoint does not fit; and every setting of the Python
gateway is one it takes."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import orjson
import pytest

from embedfleet.gateway.catalog import PER_MODEL, Catalog, CatalogError, parse_models
from embedfleet.gateway.served import ServedModel
from embedfleet.gateway.settings import GatewaySettings

from .conftest import run_binary

BASE = GatewaySettings()


def _json(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def test_an_unknown_setting_is_refused_at_start(rust_binary: Path) -> None:
    proc = run_binary(rust_binary, "--workers", "127.0.0.1:1", "--port", "0", "--no-such-flag", "1")
    assert proc.returncode == 2
    assert "unknown setting --no-such-flag" in proc.stderr, proc.stderr


@pytest.mark.parametrize("task", ["score", "classify", "sparse", "nonsense"])
def test_a_task_the_checkpoint_does_not_fit_is_refused(rust_binary: Path, task: str) -> None:
    """MiniLM (a BertModel) is no reranker, classifier or SPLADE model: refused as the Python
    gateway refuses it (modeldir.py), whatever the Rust gateway serves."""
    proc = run_binary(rust_binary, "--workers", "127.0.0.1:1", "--port", "0", "--task", task)
    assert proc.returncode == 2
    want = "unknown task" if task == "nonsense" else f"task {task} does not fit architectures"
    assert want in proc.stderr, proc.stderr


def test_a_bad_models_file_is_refused_as_the_python_gateway_refuses_it(
    rust_binary: Path, tmp_path: Path
) -> None:
    """The same file, the same message (catalog.py's, naming the entry and the field)."""
    for n, doc in enumerate(
        [
            {"models": []},
            {"models": [{"workers": ["127.0.0.1:1"], "port": 1}]},
            {"models": [{"workers": ["127.0.0.1:1"], "hold_requests": True}]},
            {"models": [{"model": "x"}]},
            # Every per-model setting, at the Python default's type and value (so no workers):
            # each is one the Rust gateway takes.
            {"models": [{k: _json(getattr(BASE, k)) for k in PER_MODEL}]},
            {"models": [{"workers": ["127.0.0.1:1"]}, {"workers": ["127.0.0.1:2"]}]},
        ]
    ):
        path = tmp_path / f"models-{n}.json"
        path.write_bytes(orjson.dumps(doc))
        try:
            Catalog.of(
                [m.name for m in (ServedModel(s) for s in parse_models(path.read_text(), BASE))]
            )
        except CatalogError as exc:
            python = str(exc)
        else:
            raise AssertionError(f"the Python gateway took {doc}")
        proc = run_binary(rust_binary, "--models-file", str(path), "--port", "0")
        assert proc.returncode == 2
        assert python in proc.stderr, (python, proc.stderr)


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
