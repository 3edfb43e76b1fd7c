"""The shared gateway's objects from the fleets that name it (pure, no cluster)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from embedfleet.operator.manifests import CONFIG_HASH, LABEL_OWNER, LABEL_SHARED, Images, Owner
from embedfleet.operator.render import shared_gateway
from embedfleet.operator.render.shared_gateway import Member, members, objects, routable
from embedfleet.operator.spec import SpecError, parse_spec

from .helpers import gateway_settings

IMAGES = Images(worker="reg/worker:1", gateway="reg/gateway:1")
NS = "ml"


def _body(name: str, spec: dict[str, Any], namespace: str = NS, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", **meta},
        "spec": spec,
    }


def _fleet(source: str, shared: str = "search", **gateway: Any) -> dict[str, Any]:
    return {"model": {"source": source}, "gateway": {"shared": shared, **gateway}}


FLEETS = [
    _body("minilm", _fleet("file:///opt/minilm")),
    _body(
        "bge",
        _fleet(
            "hf://BAAI/bge-small-en-v1.5",
            replicas=3,
            auth={"secretRef": {"name": "keys"}},
            quantization={"configMapRef": {"name": "bge-ranges"}},
            splitLongInputs=True,
        ),
    ),
    _body(
        "ranker",
        {
            "model": {"source": "pvc://models/rerank", "servedModelName": "rerank-v2"},
            "gateway": {"shared": "search"},
        },
    ),
    _body("alone", {"model": {"source": "file:///opt/x"}}),
    _body("other", _fleet("file:///opt/y", shared="other")),
    _body("elsewhere", _fleet("file:///opt/z"), namespace="prod"),
    _body("going", _fleet("file:///opt/g"), deletionTimestamp="2026-01-01T00:00:00Z"),
]


def _objects() -> dict[str, dict[str, Any]]:
    served, left = routable(members(FLEETS, NS, "search"))
    assert not left
    return {o["kind"]: o for o in objects(NS, "search", served, IMAGES)}


def test_members_are_the_live_fleets_of_the_namespace_naming_it_by_name() -> None:
    found = members(FLEETS, NS, "search")
    assert [m.owner.name for m in found] == ["bge", "minilm", "ranker"]
    assert [m.served_name for m in found] == ["bge", "minilm", "rerank-v2"]
    assert shared_gateway.names_in(FLEETS, NS) == {"search", "other"}
    assert members(FLEETS, NS, "nobody") == []


def test_a_name_served_twice_goes_to_the_first_fleet_by_name() -> None:
    bodies = [
        _body(
            "b",
            {"model": {"source": "file:///b", "servedModelName": "m"}, "gateway": {"shared": "s"}},
        ),
        _body(
            "a",
            {"model": {"source": "file:///a", "servedModelName": "m"}, "gateway": {"shared": "s"}},
        ),
        _body("c", _fleet("file:///c", shared="s")),
    ]
    served, left = routable(members(bodies, NS, "s"))
    assert [m.owner.name for m in served] == ["a", "c"]
    assert [m.owner.name for m in left] == ["b"]


def test_every_member_owns_it_and_none_is_its_controller() -> None:
    for obj in _objects().values():
        refs = obj["metadata"]["ownerReferences"]
        assert [r["name"] for r in refs] == ["bge", "minilm", "ranker"]
        assert [r["uid"] for r in refs] == ["uid-bge", "uid-minilm", "uid-ranker"]
        assert {r["controller"] for r in refs} == {False}
        assert {r["blockOwnerDeletion"] for r in refs} == {False}
        labels = obj["metadata"]["labels"]
        assert labels[LABEL_SHARED] == "search"
        # Listed by the operator's informer, but re-reconciling no one fleet.
        assert labels[LABEL_OWNER] == ""
        assert obj["metadata"]["name"] == "search-shared-gateway"
    assert objects(NS, "search", [], IMAGES) == []


def test_the_models_file_routes_each_member_to_its_workers() -> None:
    """Per-model settings by the binary's names (tests/gateway/test_operator_env.py starts it on
    such a file)."""
    text = _objects()["ConfigMap"]["data"]["models.json"]
    bge, minilm, ranker = json.loads(text)["models"]
    assert (bge["served_model_name"], bge["k8s_service"], bge["k8s_port_name"]) == (
        "bge",
        "bge-worker",
        "grpc",
    )
    assert bge["model"] == "/models/0/BAAI--bge-small-en-v1.5/default"
    assert bge["split_long_inputs"] is True
    assert bge["quantization_file"] == "/etc/embedfleet/quantization/0/embedfleet_quantization.json"
    assert (minilm["model"], minilm["k8s_service"]) == ("/opt/minilm", "minilm-worker")
    assert minilm.get("quantization_file", "") == ""
    assert (ranker["served_model_name"], ranker["model"]) == ("rerank-v2", "/models/2/rerank")
    assert ranker["task"] == "auto"
    assert set().union(*(m.keys() for m in (bge, minilm, ranker))) <= gateway_settings()


def test_each_model_is_mounted_at_a_root_of_its_own() -> None:
    pod = _objects()["Deployment"]["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["model-0"]["mountPath"] == "/models/0"  # bge: downloaded
    assert "emptyDir" in volumes["model-0"]
    (fetch,) = pod["initContainers"]
    assert fetch["name"] == "fetch-model-0"
    assert fetch["command"][-2:] == ["--local-dir", "/models/0/BAAI--bge-small-en-v1.5/default"]
    assert "model-1" not in volumes  # minilm: file://, in the image
    assert volumes["model-2"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert mounts["model-2"]["mountPath"] == "/models/2"
    assert volumes["quantization-0"]["configMap"]["name"] == "bge-ranges"
    assert volumes["models"]["configMap"]["name"] == "search-shared-gateway"
    assert mounts["models"]["mountPath"] == "/etc/embedfleet/models"
    # API keys: bge asks for them, so the gateway does, though minilm (first by name) does not.
    assert volumes["api-keys"]["secret"]["secretName"] == "keys"
    assert pod["serviceAccountName"] == "search-shared-gateway"


def test_process_settings_are_the_first_members_and_keys_anyones() -> None:
    deployment = _objects()["Deployment"]
    env = {
        e["name"]: e["value"]
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["EMBEDFLEET_GATEWAY_MODELS_FILE"] == "/etc/embedfleet/models/models.json"
    assert env["EMBEDFLEET_GATEWAY_API_KEYS_FILE"] == "/etc/embedfleet/auth/api-keys"
    assert deployment["spec"]["replicas"] == 3  # bge's: first by name
    fields = gateway_settings()
    for name in env:
        if name.startswith("EMBEDFLEET_GATEWAY_"):
            assert name.removeprefix("EMBEDFLEET_GATEWAY_").lower() in fields, name


def test_the_gateway_pod_runs_the_binary_and_fetches_with_a_worker_image() -> None:
    pod = _objects()["Deployment"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == ["embedfleet-gateway"]
    assert pod["containers"][0]["image"] == IMAGES.gateway
    (fetch,) = pod["initContainers"]  # bge's hf:// model: the worker image has `hf`
    assert fetch["image"] == IMAGES.worker


def test_a_change_of_members_rolls_the_pods() -> None:
    before = _objects()["Deployment"]["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH]
    fewer = [b for b in FLEETS if b["metadata"]["name"] != "ranker"]
    served, _ = routable(members(fewer, NS, "search"))
    deployment = next(o for o in objects(NS, "search", served, IMAGES) if o["kind"] == "Deployment")
    assert deployment["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH] != before


def test_the_service_and_pods_match_no_fleets_own_gateway() -> None:
    objs = _objects()
    selector = objs["Service"]["spec"]["selector"]
    assert selector["app.kubernetes.io/component"] == "shared-gateway"
    assert objs["Deployment"]["spec"]["selector"]["matchLabels"] == selector
    assert objs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == selector
    (rule,) = objs["Role"]["rules"]
    assert rule == {
        "apiGroups": ["discovery.k8s.io"],
        "resources": ["endpointslices"],
        "verbs": ["get", "list", "watch"],
    }


@pytest.mark.parametrize("bad", ["Search", "-s", "s-", "a_b", "x" * 41])
def test_a_bad_shared_name_is_refused(bad: str) -> None:
    with pytest.raises(SpecError, match=r"gateway\.shared"):
        parse_spec(_fleet("file:///m", shared=bad))


def test_member_names_follow_served_model_name() -> None:
    m = Member(
        Owner("fleet", NS, "u"),
        parse_spec({"model": {"source": "file:///m", "servedModelName": "named"}}),
    )
    assert m.served_name == "named"
