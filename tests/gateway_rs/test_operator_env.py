"""What the operator renders for a gateway.implementation: rust fleet, taken by the Rust binary:
every EMBEDFLEET_GATEWAY_* setting is one it knows (the binary ignores env vars of no setting, so
they are passed as flags here, where an unknown one is refused), and it starts from them."""

from __future__ import annotations

from pathlib import Path

from embedfleet.common.modeldir import default_model_path
from embedfleet.gateway.settings import ENV_PREFIX
from embedfleet.operator.manifests import Owner, gateway_env
from embedfleet.operator.spec import parse_spec
from embedfleet.testing.gateway_rs import running_gateway_rs

from .conftest import run_binary

#: what the test's own process sets: its port, on 127.0.0.1
OWN = {"host", "port"}


def _rendered() -> dict[str, str]:
    """A fleet using every gateway setting that needs no mounted file: splitting, admission's
    bound, scale to zero (the hold) and the model's limit."""
    raw = {
        "model": {"source": f"file://{default_model_path()}", "maxInputTokens": 256},
        "gateway": {
            "implementation": "rust",
            "splitLongInputs": True,
            "splitOverlapTokens": 16,
            "maxQueueSeconds": 4.5,
            "maxClientBatch": 100,
        },
        "autoscaling": {"enabled": True, "minReplicas": 0},
    }
    env = gateway_env(Owner(name="minilm", namespace="ml", uid="u"), parse_spec(raw))
    assert all(name.startswith(ENV_PREFIX) for name in env)
    return {name.removeprefix(ENV_PREFIX).lower(): value for name, value in env.items()}


def _flags(settings: dict[str, str]) -> list[str]:
    return [f"--{name.replace('_', '-')}={value}" for name, value in sorted(settings.items())]


def test_every_setting_the_operator_renders_is_one_the_rust_gateway_takes(
    rust_binary: Path, tmp_path: Path
) -> None:
    settings = _rendered()
    assert {"k8s_service", "hold_requests", "split_long_inputs", "max_queue_seconds"} <= set(
        settings
    )
    assert settings["hold_requests"] != "0"
    flags = _flags({k: v for k, v in settings.items() if k not in OWN})
    # With no API server to reach, discovery retries in the background: the process stays up and
    # serves /health (the hold keeps /ready 200 too) from exactly these settings.
    with running_gateway_rs((), *flags, "--host", "127.0.0.1", log=tmp_path / "gw.log") as gw:
        assert gw.proc.poll() is None
    # The check above could fail: an unknown setting is refused at start, by name.
    refused = run_binary(rust_binary, *flags, "--no-such-setting=1")
    assert refused.returncode == 2
    assert "unknown setting --no-such-setting" in refused.stderr
