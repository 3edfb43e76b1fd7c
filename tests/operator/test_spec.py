from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from embedfleet.operator.spec import (
    Autoscaling,
    Engine,
    Gateway,
    GatewayService,
    ModelSource,
    SpecError,
    Worker,
    parse_source,
    parse_spec,
)

from .helpers import EXAMPLES, crd_schema, load_yaml


@pytest.mark.parametrize(
    ("source", "revision", "expected"),
    [
        ("hf://BAAI/bge-m3", "", ModelSource(kind="hf", repo="BAAI/bge-m3")),
        (
            "hf://Qwen/Qwen3-Embedding-0.6B@v1.0",
            "",
            ModelSource("hf", "Qwen/Qwen3-Embedding-0.6B", "v1.0"),
        ),
        ("hf://org/name", "abc123", ModelSource(kind="hf", repo="org/name", revision="abc123")),
        ("pvc://models/minilm/", "", ModelSource(kind="pvc", claim="models", path="minilm")),
        ("pvc://models/a/b", "", ModelSource(kind="pvc", claim="models", path="a/b")),
        ("file:///opt/model", "", ModelSource(kind="file", path="/opt/model")),
    ],
)
def test_sources_parse(source: str, revision: str, expected: ModelSource) -> None:
    assert parse_source(source, revision) == expected


@pytest.mark.parametrize(
    "source",
    [
        "",
        "hf://noslash",
        "s3://bucket/model",
        "pvc://Claim/x",
        "pvc://claim",
        "file://relative",
        "/abs",
    ],
)
def test_bad_sources_are_refused(source: str) -> None:
    with pytest.raises(SpecError, match=r"model\.source"):
        parse_source(source)


def test_missing_model_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match=r"model\.source is required"):
        parse_spec({"worker": {"replicas": 1}})


def test_example_specs_parse() -> None:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec = parse_spec(load_yaml(path)["spec"])
        assert spec.worker.replicas >= 1, path


def _schema_defaults(schema: dict[str, Any]) -> dict[str, Any]:
    """Every default in the CRD, flattened to dotted camelCase paths."""
    out: dict[str, Any] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, child in (node.get("properties") or {}).items():
            path = f"{prefix}{key}"
            if "default" in child and child["default"] != {}:
                out[path] = child["default"]
            walk(child, path + ".")

    walk(schema["properties"]["spec"], "")
    return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _code_defaults() -> dict[str, Any]:
    out: dict[str, Any] = {}
    sections: dict[str, Any] = {
        "worker": Worker(),
        "worker.engine": Engine(),
        "gateway": Gateway(),
        "gateway.service": GatewayService(),
        "autoscaling": Autoscaling(),
    }
    for prefix, obj in sections.items():
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, bool | int | float | str) and value != "":
                key = _camel(f.name).replace("Slo", "SLO").replace("Gpu", "GPU")
                out[f"{prefix}.{key}"] = value
    return out


def test_code_defaults_match_the_crd() -> None:
    """The API server fills in the CRD's defaults; spec.py's must be the same values."""
    schema = _schema_defaults(crd_schema())
    code = _code_defaults()
    shared = set(schema) & set(code)
    assert len(shared) >= 25, sorted(shared)
    assert {k: schema[k] for k in shared} == {k: code[k] for k in shared}
    # Every scalar default of these sections appears in the CRD (nothing silently code-only).
    assert set(code) - set(schema) == set()
