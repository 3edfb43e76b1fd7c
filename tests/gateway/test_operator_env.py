"""What the operator renders for a fleet's gateway, taken by the binary: every EMBEDFLEET_GATEWAY_*
setting is one it knows (env vars of no setting are not checked, so they are passed as flags here,
where an unknown one is refused), and it starts from them."""

from __future__ import annotations

from pathlib import Path

import httpx

from embedfleet.common.modeldir import default_model_path
from embedfleet.operator.manifests import Images, Owner
from embedfleet.operator.render.gateway import gateway_env
from embedfleet.operator.render.shared_gateway import members, objects, routable
from embedfleet.operator.spec import parse_spec
from embedfleet.testing.gateway import running_gateway

from .helpers import run_binary

ENV_PREFIX = "EMBEDFLEET_GATEWAY_"

#: what the test's own process sets: its port, on 127.0.0.1
OWN = {"host", "port"}
IMAGES = Images(worker="reg/worker:1", gateway="reg/gateway:1")


def _rendered() -> dict[str, str]:
    """A fleet using every gateway setting that needs no mounted file: splitting, admission's
    bound, scale to zero (the hold) and the model's limit."""
    raw = {
        "model": {"source": f"file://{default_model_path()}", "maxInputTokens": 256},
        "gateway": {
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


def test_every_setting_the_operator_renders_is_one_the_gateway_takes(tmp_path: Path) -> None:
    settings = _rendered()
    assert {"k8s_service", "hold_requests", "split_long_inputs", "max_queue_seconds"} <= set(
        settings
    )
    assert settings["hold_requests"] != "0"
    flags = _flags({k: v for k, v in settings.items() if k not in OWN})
    # With no API server to reach, discovery retries in the background: the process stays up and
    # serves /health (the hold keeps /ready 200 too) from exactly these settings.
    with running_gateway((), *flags, "--host", "127.0.0.1", log=tmp_path / "gw.log") as gw:
        assert gw.proc.poll() is None
    # The check above could fail: an unknown setting is refused at start, by name.
    refused = run_binary(*flags, "--no-such-setting=1")
    assert refused.returncode == 2
    assert "unknown setting --no-such-setting" in refused.stderr


def test_a_shared_gateway_the_operator_renders_starts_on_its_models_file(tmp_path: Path) -> None:
    """Two fleets naming one shared gateway: its models file (per-model settings) and its env
    (process settings) are what the binary takes."""
    source = f"file://{default_model_path()}"

    def fleet(name: str, **gateway: object) -> dict[str, object]:
        spec = {"model": {"source": source}, "gateway": {"shared": "search", **gateway}}
        return {"metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}"}, "spec": spec}

    bodies = [fleet("a", splitLongInputs=True, maxQueueSeconds=3), fleet("b")]
    served, _ = routable(members(bodies, "ml", "search"))
    rendered = {o["kind"]: o for o in objects("ml", "search", served, IMAGES)}
    models = tmp_path / "models.json"
    models.write_text(rendered["ConfigMap"]["data"]["models.json"])
    (container,) = rendered["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"].removeprefix(ENV_PREFIX).lower(): e["value"] for e in container["env"]
           if e["name"].startswith(ENV_PREFIX)}  # fmt: skip
    assert env.pop("models_file") == "/etc/embedfleet/models/models.json"
    flags = _flags({k: v for k, v in env.items() if k not in OWN})
    log = tmp_path / "gw.log"
    with running_gateway((), *flags, "--models-file", str(models), log=log, wait_ready=False) as gw:
        reply = httpx.get(gw.url + "/v1/models", timeout=10)
        assert [m["id"] for m in reply.json()["data"]] == ["a", "b"]
