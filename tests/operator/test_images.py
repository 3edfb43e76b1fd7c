"""Each image's entrypoint (and every command the operator runs in it) is a program that image
holds: a console script of a distribution it installs, or the gateway binary it copies in."""

from __future__ import annotations

import json
import re
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from embedfleet.operator.manifests import Images, Owner
from embedfleet.operator.render.fleet import children
from embedfleet.operator.spec import parse_spec

from .helpers import REPO

DOCKER = REPO / "docker"
VENV_BIN = Path(sys.executable).parent


def _entrypoint(dockerfile: Path) -> list[str]:
    lines = [line for line in dockerfile.read_text().splitlines() if line.startswith("ENTRYPOINT")]
    assert lines, f"{dockerfile} has no ENTRYPOINT"
    argv = json.loads(lines[-1].removeprefix("ENTRYPOINT").strip())  # exec form only
    assert isinstance(argv, list)
    return [str(a) for a in argv]


def _commands(dockerfile: Path) -> list[list[str]]:
    """What a container of the image can run as its command: the entrypoint, and each binary
    the Dockerfile copies onto PATH (the gateway image's Rust gateway, the operator's default)."""
    copied = re.findall(r"^COPY .* /usr/local/bin/(\S+)$", dockerfile.read_text(), re.MULTILINE)
    return [_entrypoint(dockerfile), *([name] for name in copied)]


def _installed_components(dockerfile: Path) -> list[str]:
    """Repository components the Dockerfile pip-installs (`./common`, `./worker`, ...)."""
    return re.findall(
        r"\./(\w+)", " ".join(re.findall(r"pip install[^\n]*", dockerfile.read_text()))
    )


def _scripts(component: str) -> dict[str, str]:
    project = tomllib.loads((REPO / component / "pyproject.toml").read_text())["project"]
    return dict(project.get("scripts", {}))


@pytest.mark.parametrize("image", ["operator", "worker"])
def test_entrypoint_is_an_installed_console_script(image: str) -> None:
    dockerfile = DOCKER / f"{image}.Dockerfile"
    (command,) = _entrypoint(dockerfile)
    components = _installed_components(dockerfile)
    assert image in components
    assert "common" in components
    assert command in _scripts(image), f"{command} is not a script of {image}/pyproject.toml"
    assert (VENV_BIN / command).is_file() or shutil.which(command), f"{command} not installed"


def test_the_gateway_image_runs_the_binary_it_copies_in_and_installs_nothing() -> None:
    dockerfile = DOCKER / "gateway.Dockerfile"
    assert _entrypoint(dockerfile) == ["embedfleet-gateway"]
    text = dockerfile.read_text()
    assert " /rootfs/usr/local/bin/embedfleet-gateway\n" in text
    final = text.rsplit("\nFROM ", 1)[-1]
    assert final.startswith("scratch\nCOPY --from=rootfs /rootfs /\n")
    assert "pip install" not in final


def test_commands_the_operator_runs_exist_in_their_images() -> None:
    spec = parse_spec({"model": {"source": "hf://org/model"}})
    objs = children(Owner("x", "ns", "uid"), spec, 1, Images("w", "g"), False)
    for obj in objs:
        if obj["kind"] != "Deployment":
            continue
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        dockerfile = DOCKER / f"{component}.Dockerfile"
        pod = obj["spec"]["template"]["spec"]
        assert pod["containers"][0]["command"] in _commands(dockerfile)
        (fetch,) = pod["initContainers"]
        # The init container runs `hf` from huggingface_hub, which the worker image installs.
        assert fetch["image"] == "w"
        assert fetch["command"][0] == "hf"
        assert "huggingface_hub" in (DOCKER / "worker.Dockerfile").read_text()
        assert (VENV_BIN / "hf").is_file()


def test_images_run_as_non_root() -> None:
    for dockerfile in DOCKER.glob("*.Dockerfile"):
        users = [line for line in dockerfile.read_text().splitlines() if line.startswith("USER")]
        assert users, dockerfile
        assert users[-1] == "USER 65532:65532", dockerfile
