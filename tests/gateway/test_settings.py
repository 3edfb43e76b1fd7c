"""Settings the binary cannot take stop its start with one readable line on stderr and exit code 2,
never ignored and never a panic: an unknown name, a number below its minimum (NaN included), a
task the checkpoint does not fit, a bad models file (naming the entry and the field), a bad
tracing setting; each minimum itself starts; --help answers on stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from embedfleet.testing.gateway import running_gateway

from .helpers import run_binary

#: each numeric setting's least value (0 where a zero means "none" or "off")
MINIMUMS: dict[str, float] = {
    "split_overlap_tokens": 0, "api_keys_reload_seconds": 0.01, "max_client_batch": 1,
    "max_request_tokens": 1, "max_body_bytes": 1, "chunk_tokens": 1, "min_chunk_tokens": 1,
    "chunk_sequences": 1, "chunk_seconds": 0, "max_queue_seconds": 0, "retry_after_seconds": 0,
    "hold_requests": 0, "hold_seconds": 0, "eject_seconds": 0, "upstream_timeout_seconds": 0.01,
    "coalesce_inflight": 0, "probe_seconds": 0.01, "tokenize_threads": 1,
    "tokenize_inline_chars": 0, "tokenize_large_chars": 0, "header_timeout_seconds": 0,
    "body_timeout_seconds": 0, "keep_alive_seconds": 0, "max_connection_age_seconds": 0,
    "max_connections": 0,
}  # fmt: skip
#: the settings that take a float (NaN is refused as below any minimum)
FLOATS = sorted(n for n in MINIMUMS if n.endswith("_seconds") and n != "retry_after_seconds")
WORKER = ("--workers", "127.0.0.1:9")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _below(least: float) -> str:
    return "-1" if least == 0 else "0" if least < 1 else str(int(least) - 1)


@pytest.mark.parametrize("name", sorted(MINIMUMS))
def test_below_the_minimum_is_refused(name: str) -> None:
    least, value = MINIMUMS[name], _below(MINIMUMS[name])
    done = run_binary(*WORKER, flag(name), value)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith(f"{flag(name)}: {value} is below the minimum, {least:g}")
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", FLOATS)
def test_nan_is_refused(name: str) -> None:
    done = run_binary(*WORKER, flag(name), "nan")
    assert done.returncode == 2, done.stderr
    assert "is below the minimum" in done.stderr


def test_each_minimum_itself_starts(tmp_path: Path) -> None:
    """Each flag is checked as it is read, so the 0 s header and body bounds pass the check
    before the two later flags replace them: at 0 s a request could get its 408 first."""
    argv = [f for name, least in MINIMUMS.items() for f in (flag(name), f"{least:g}")]
    served = ["--header-timeout-seconds", "10", "--body-timeout-seconds", "10"]
    log = tmp_path / "gateway.log"
    with running_gateway(["127.0.0.1:9"], *argv, *served, log=log, wait_ready=False) as gw:
        assert gw.proc.poll() is None
    text = log.read_text()
    assert "embedfleet-gateway listening on" in text
    assert "panicked" not in text


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--no-such-flag", "1"], "unknown setting --no-such-flag"),
        (["--port", "x"], "--port"),
        (["--task", "nonsense"], "unknown task"),
        (["--task", "score"], "task score does not fit architectures"),
        (["--task", "classify"], "task classify does not fit architectures"),
        (["--task", "sparse"], "task sparse does not fit architectures"),
        (["--tracing-endpoint", "http://127.0.0.1:9", "--tracing-sample-ratio", "1.5"],
         "between 0 and 1, got 1.5"),
        (["--tracing-endpoint", "ftp://x:1"], "use http:// (plaintext) or https:// (TLS)"),
    ],
)  # fmt: skip
def test_a_setting_it_cannot_take_is_refused_naming_it(argv: list[str], said: str) -> None:
    """MiniLM (a BertModel) is no reranker, classifier or SPLADE model."""
    done = run_binary(*WORKER, *argv)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr, done.stderr


PER_MODEL = (
    "model, task, served_model_name, max_input_tokens, quantization_file, split_long_inputs, "
    "split_overlap_tokens, workers, workers_file, k8s_service, k8s_port_name, chunk_tokens, "
    "min_chunk_tokens, chunk_sequences, max_queue_seconds, hold_requests, hold_seconds"
)
MODELS_FILES: list[tuple[Any, str]] = [
    ({"models": []}, 'the models file needs a non-empty list "models"'),
    ({"models": [3]}, "models[0] must be an object"),
    ({"models": [{"workers": ["127.0.0.1:1"], "port": 1}]},
     f"models[0]: port cannot be set per model (per-model settings: {PER_MODEL})"),
    ({"models": [{"k8s_service": "w", "api_keys_file": "/k"}]},
     "models[0]: api_keys_file cannot be set per model"),
    ({"models": [{"workers": ["127.0.0.1:1"], "hold_requests": True}]},
     "models[0]: 'hold_requests' must be an integer, got True"),
    ({"models": [{"k8s_service": "w", "max_input_tokens": "9"}]},
     "models[0]: 'max_input_tokens' must be an integer, got '9'"),
    ({"models": [{"model": "x"}]},
     "models[0]: name its workers (workers, workers_file or k8s_service)"),
    # every per-model setting at its default (so no workers): each one the binary takes
    ({"models": [{k.strip(): v for k, v in zip(PER_MODEL.split(","), [
        "", "auto", "", 0, "", False, 32, [], "", "", "grpc", 8192, 512, 256, 30.0, 0, 120.0],
        strict=True)}]}, "models[0]: name its workers (workers, workers_file or k8s_service)"),
    ({"models": [{"workers": ["127.0.0.1:1"]}, {"workers": ["127.0.0.1:2"]}]},
     "two models are served as 'sentence-transformers/all-MiniLM-L6-v2'; give each its own "
     "served_model_name"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "said"), MODELS_FILES)
def test_a_bad_models_file_is_refused_naming_the_entry_and_field(
    tmp_path: Path, doc: Any, said: str
) -> None:
    path = tmp_path / "models.json"
    path.write_bytes(orjson.dumps(doc))
    done = run_binary("--models-file", str(path), "--port", "0")
    assert done.returncode == 2
    assert said in done.stderr, done.stderr


def test_help_is_answered_on_stdout_with_success() -> None:
    done = run_binary("--help")
    assert done.returncode == 0, done.stderr
    assert "--workers" in done.stdout
    assert "--log-level" in done.stdout
    assert done.stderr == ""
