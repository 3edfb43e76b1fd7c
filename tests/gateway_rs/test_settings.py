"""Numeric settings below their minimum (gateway/settings.py `minimum=`), NaN among them, stop
both gateways' start with the same readable message, and the minimum itself starts: before,
the Python gateway started and misbehaved (a negative deadline on every call) and the Rust one
panicked (a zero probe interval)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from embedfleet.common.settings import flag_name, load, minimums
from embedfleet.gateway.settings import ENV_PREFIX, GatewaySettings
from embedfleet.testing.gateway_rs import running_gateway_rs

from .conftest import run_binary

MINIMUMS = minimums(GatewaySettings)
FLOATS = sorted(f.name for f in dataclasses.fields(GatewaySettings) if f.type == "float")


def _below(least: float) -> str:
    return "-1" if least == 0 else "0" if least < 1 else str(int(least) - 1)


def _python_refusal(name: str, value: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        load(GatewaySettings, ENV_PREFIX, [flag_name(name), value], env={})
    assert stopped.value.code == 2
    return capsys.readouterr().err


def test_every_numeric_limit_has_a_minimum() -> None:
    # The fields a negative or zero value would break; a new one must choose its minimum.
    assert set(MINIMUMS) >= {
        "upstream_timeout_seconds",
        "probe_seconds",
        "api_keys_reload_seconds",
        "eject_seconds",
        "chunk_tokens",
        "chunk_sequences",
        "tokenize_threads",
        "retry_after_seconds",
        "max_body_bytes",
    }
    assert MINIMUMS["probe_seconds"] == 0.01


@pytest.mark.parametrize("name", sorted(MINIMUMS))
def test_below_the_minimum_is_refused_alike(
    name: str, rust_binary: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    least = MINIMUMS[name]
    value = _below(least)
    expected = f"{flag_name(name)}: "
    said = f"is below the minimum, {least:g}"
    python = _python_refusal(name, value, capsys)
    assert expected in python, python
    assert said in python, python
    done = run_binary(rust_binary, "--workers", "127.0.0.1:9", flag_name(name), value)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"embedfleet-gateway-rs: {expected}{value} {said}\n"


@pytest.mark.parametrize("name", [n for n in FLOATS if n in MINIMUMS])
def test_nan_is_refused_alike(
    name: str, rust_binary: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "is below the minimum" in _python_refusal(name, "nan", capsys)
    done = run_binary(rust_binary, "--workers", "127.0.0.1:9", flag_name(name), "nan")
    assert done.returncode == 2, done.stderr
    assert "is below the minimum" in done.stderr


def test_each_minimum_itself_starts_both(tmp_path: Path) -> None:
    argv = [f for name, least in MINIMUMS.items() for f in (flag_name(name), f"{least:g}")]
    # The Python gateway takes them all (its settings are what it would start with) ...
    settings = load(GatewaySettings, ENV_PREFIX, ["--workers", "127.0.0.1:9", *argv], env={})
    for name, least in MINIMUMS.items():
        assert getattr(settings, name) == least
    # ... and the Rust one starts on them: running_gateway_rs waits until /health answers (no
    # worker). Each flag is checked as it is read, so the 0 s header and body bounds pass the
    # check before the two later flags replace them: at 0 s a request could get its 408 first.
    log = tmp_path / "gateway-rs.log"
    served = ["--header-timeout-seconds", "10", "--body-timeout-seconds", "10"]
    with running_gateway_rs(["127.0.0.1:9"], *argv, *served, log=log, wait_ready=False) as gateway:
        assert gateway.proc.poll() is None
    text = log.read_text()
    assert "embedfleet-gateway-rs listening on" in text
    assert "panicked" not in text
