"""One image naming scheme and one writable directory, the same in the chart, the operator's
defaults, the Dockerfiles, the examples and the docs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from embedfleet.operator.manifests import Images, Owner
from embedfleet.operator.render.fleet import children
from embedfleet.operator.settings import (
    DEFAULT_GATEWAY_IMAGE,
    DEFAULT_WORKER_CPU_IMAGE,
    DEFAULT_WORKER_IMAGE,
    OperatorSettings,
    cpu_worker_image,
)
from embedfleet.operator.spec import parse_spec
from embedfleet.testing.containers import WRITABLE_DIR
from embedfleet.testing.imagespec import SPECS, component_version, image_ref, image_version
from embedfleet.testing.tools import REPO_ROOT

CHART = REPO_ROOT / "charts" / "embedfleet"
EXAMPLES = REPO_ROOT / "examples"


def _version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def test_one_version_everywhere() -> None:
    """The release version is the chart's appVersion, every component's package version and the
    gateway crate's."""
    components = ("common", "worker", "fleet", "operator")
    assert {component_version(REPO_ROOT, c) for c in components} == {_version()}
    assert image_version(REPO_ROOT, SPECS["gateway"]) == _version()


def test_operator_defaults_follow_the_scheme() -> None:
    version = _version()
    assert DEFAULT_WORKER_IMAGE == image_ref("worker", version) == SPECS["worker"].ref(version)
    assert image_ref("worker", version, cpu=True) == DEFAULT_WORKER_CPU_IMAGE
    assert SPECS["worker-cpu"].ref(version) == DEFAULT_WORKER_CPU_IMAGE
    assert SPECS["gateway"].ref(version) == DEFAULT_GATEWAY_IMAGE


def test_chart_default_is_the_operator_image() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    tag = values["image"]["tag"] or _version()
    assert f"{values['image']['repository']}:{tag}" == SPECS["operator"].ref(_version())


@pytest.mark.parametrize("name", sorted(SPECS))
def test_dockerfile_comments_name_the_scheme(name: str) -> None:
    spec = SPECS[name]
    text = (REPO_ROOT / spec.dockerfile).read_text()
    assert spec.ref(_version()) in text
    assert f"-t {spec.ref(_version())} ." in text


def test_docs_name_the_scheme() -> None:
    docs = (REPO_ROOT / "README.md").read_text() + (REPO_ROOT / "docs" / "operator.md").read_text()
    for spec in SPECS.values():
        assert spec.ref(_version()) in docs, spec.ref(_version())
    stale = re.findall(r"(?<![\w./-])embedfleet/(?:operator|worker|gateway):", docs)
    assert not stale, "images without the ghcr.io/ registry"


def _worker_image(example: str, op: OperatorSettings) -> str:
    spec = parse_spec(yaml.safe_load((EXAMPLES / example).read_text())["spec"])
    images = Images(op.worker_image, op.gateway_image, worker_cpu=cpu_worker_image(op))
    objs = children(Owner("x", "ns", "uid"), spec, 1, images, False)
    (worker,) = [
        o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "x-worker"
    ]
    return str(worker["spec"]["template"]["spec"]["containers"][0]["image"])


def test_cpu_fleets_get_the_cpu_worker_gpu_fleets_the_cuda_one() -> None:
    defaults = OperatorSettings()
    assert _worker_image("minilm.yaml", defaults) == DEFAULT_WORKER_CPU_IMAGE
    assert _worker_image("qwen3-embedding-gpu.yaml", defaults) == DEFAULT_WORKER_IMAGE
    assert _worker_image("reranker.yaml", defaults) == DEFAULT_WORKER_IMAGE


def test_one_custom_worker_image_serves_every_fleet_unless_a_cpu_one_is_set() -> None:
    custom = OperatorSettings(worker_image="reg/worker:1")
    assert _worker_image("minilm.yaml", custom) == "reg/worker:1"
    both = OperatorSettings(worker_image="reg/worker:1", worker_cpu_image="reg/worker:1-cpu")
    assert _worker_image("minilm.yaml", both) == "reg/worker:1-cpu"
    assert _worker_image("qwen3-embedding-gpu.yaml", both) == "reg/worker:1"


# -- the writable directory ------------------------------------------------------------------------

WRITING_ENV = ("HOME", "TMPDIR", "XDG_CACHE_HOME")


def _final_stage_env(dockerfile: Path) -> dict[str, str]:
    """ENV of the last stage (continuation lines joined)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    stage = text.rsplit("\nFROM ", 1)[-1]
    env: dict[str, str] = {}
    for line in stage.splitlines():
        if line.startswith("ENV "):
            env.update(re.findall(r"(\w+)=(\S+)", line))
    return env


def _pod_mounts(pod: dict[str, Any]) -> set[str]:
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {
        m["mountPath"]
        for m in container["volumeMounts"]
        if "emptyDir" in volumes[m["name"]] and not m.get("readOnly")
    }


@pytest.mark.parametrize("component", ["worker", "gateway", "operator"])
def test_the_images_write_only_under_the_writable_dir(component: str) -> None:
    env = _final_stage_env(REPO_ROOT / "docker" / f"{component}.Dockerfile")
    python = component != "gateway"  # the gateway image holds a native binary alone
    for name in (*WRITING_ENV, "HF_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        if name in env or (python and name in WRITING_ENV):
            assert env[name].startswith(WRITABLE_DIR), f"{component}: {name}={env.get(name)}"
    if python:
        assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    else:
        assert {"HOME", "TMPDIR"} <= set(env)


def test_the_operator_pods_mount_the_writable_dir() -> None:
    spec = parse_spec(yaml.safe_load((EXAMPLES / "minilm.yaml").read_text())["spec"])
    objs = children(Owner("x", "ns", "uid"), spec, 1, Images("w", "g"), False)
    for obj in objs:
        if obj["kind"] == "Deployment":
            pod = obj["spec"]["template"]["spec"]
            assert WRITABLE_DIR in _pod_mounts(pod), obj["metadata"]["name"]
            assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_chart_mounts_the_writable_dir() -> None:
    template = (CHART / "templates" / "deployment.yaml").read_text()
    assert re.search(rf"- name: tmp\n\s+mountPath: {WRITABLE_DIR}\n", template)
    assert re.search(r"- name: tmp\n\s+emptyDir:", template)
