"""The desired-state hash and the no-op decision (desired.py), and what the informer keeps."""

from __future__ import annotations

from typing import Any, cast

from embedfleet.operator.desired import (
    HASH_ANNOTATION,
    Live,
    Seen,
    manifest_hash,
    needs_apply,
    stamped,
)
from embedfleet.operator.informer import Bodies, Change, newer, trim
from embedfleet.operator.kube import Kube, KubeError, resource_of
from embedfleet.operator.manifests import LABEL_OWNER, Images, Owner
from embedfleet.operator.reconciler import Reconciler
from embedfleet.operator.render.fleet import children
from embedfleet.operator.spec import parse_spec

from .fakes import TERMINATING_STATUS, NoFleetsKube, TerminatingNamespaceKube

IMAGES = Images("w:1", "g:1", worker_cpu="w:1-cpu")
OWNER = Owner(name="fleet", namespace="ns", uid="u-1")


def rendered(replicas: int = 2) -> list[dict[str, Any]]:
    spec = parse_spec({"model": {"source": "hf://org/model"}, "worker": {"replicas": replicas}})
    return [dict(m) for m in children(OWNER, spec, replicas, IMAGES, False)]


def test_the_hash_is_stable_and_follows_the_manifest() -> None:
    first, again = rendered(), rendered()
    assert [manifest_hash(m) for m in first] == [manifest_hash(m) for m in again]
    scaled = rendered(replicas=3)
    changed = [manifest_hash(a) != manifest_hash(b) for a, b in zip(first, scaled, strict=True)]
    # Only the worker Deployment renders the replica count.
    kinds = [m["kind"] for m, c in zip(first, changed, strict=True) if c]
    assert kinds == ["Deployment"]


def test_stamping_adds_the_annotation_and_keeps_the_rest() -> None:
    manifest = {"kind": "ConfigMap", "metadata": {"name": "a", "annotations": {"x": "1"}}}
    out, digest = stamped(manifest)
    assert out["metadata"]["annotations"] == {"x": "1", HASH_ANNOTATION: digest}
    assert digest == manifest_hash(manifest)
    assert manifest["metadata"]["annotations"] == {"x": "1"}  # the input is left as it was


def live(digest: str = "h", generation: int = 0, rv: str = "10", **kw: Any) -> Live:
    return Live(digest, generation, rv, **kw)


def test_missing_deleting_or_outdated_children_are_applied() -> None:
    assert needs_apply("h", None, None)
    assert needs_apply("h", live(deleting=True), Seen("h", 0, "10"))
    assert needs_apply("new", live("old"), Seen("old", 0, "10"))


def test_an_unchanged_child_is_not_applied() -> None:
    assert not needs_apply("h", live(rv="10"), Seen("h", 0, "10"))
    # First sight after a restart: the annotation is trusted.
    assert not needs_apply("h", live(rv="10"), None)


def test_an_edit_by_someone_else_is_repaired() -> None:
    # A kind without generation (ConfigMap): any new resourceVersion is an edit.
    assert needs_apply("h", live(rv="11"), Seen("h", 0, "10"))
    # A kind with one (Deployment): status and annotation writes by controllers are no edit...
    assert not needs_apply("h", live(generation=3, rv="99"), Seen("h", 3, "10"))
    # ...a spec edit (kubectl scale) is.
    assert needs_apply("h", live(generation=4, rv="99"), Seen("h", 3, "10"))


def test_live_reads_an_object() -> None:
    obj = {
        "metadata": {
            "annotations": {HASH_ANNOTATION: "abc"},
            "generation": 2,
            "resourceVersion": "7",
            "deletionTimestamp": "2026-01-01T00:00:00Z",
        }
    }
    assert Live.of(obj) == Live("abc", 2, "7", deleting=True)
    assert Live.of({}) == Live("", 0, "", deleting=False)


def test_trim_keeps_what_the_reconciler_reads() -> None:
    deployment = {
        "metadata": {
            "name": "fleet-worker",
            "namespace": "ns",
            "resourceVersion": "5",
            "generation": 2,
            "labels": {LABEL_OWNER: "fleet", "other": "x"},
            "annotations": {HASH_ANNOTATION: "h", "big": "x" * 1000},
            "managedFields": [{"manager": "m"}],
        },
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "w"}},
            "template": {"spec": {"containers": []}},
        },
        "status": {"readyReplicas": 3},
    }
    kept = trim("Deployment", deployment)
    assert kept["metadata"]["labels"] == {LABEL_OWNER: "fleet"}
    assert kept["metadata"]["annotations"] == {HASH_ANNOTATION: "h"}
    assert "managedFields" not in kept["metadata"]
    # The selector: the autoscaler finds the pods to scrape from the informer's copy.
    assert kept["spec"] == {"replicas": 3, "selector": {"matchLabels": {"app": "w"}}}
    assert kept["status"] == {"readyReplicas": 3}
    assert "status" not in trim("ConfigMap", {**deployment, "kind": "ConfigMap"})


def test_an_older_version_never_replaces_a_newer_one() -> None:
    def at(rv: str) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": rv}}

    assert newer(at("11"), at("10"))
    assert newer(at("10"), at("10"))
    assert not newer(at("9"), at("10"))
    assert newer(at("9"), None)
    assert newer(at("opaque"), at("10"))


def test_resource_of_a_path() -> None:
    assert resource_of("/api/v1/namespaces/a/configmaps/b") == "configmaps"
    assert resource_of("/apis/apps/v1/deployments") == "deployments"
    assert (
        resource_of("/apis/embedfleet.dev/v1alpha1/namespaces/a/embeddingdeployments/b/status")
        == "embeddingdeployments/status"
    )
    assert resource_of("/apis/coordination.k8s.io/v1/namespaces/s/leases/l") == "leases"
    assert resource_of("/apis/monitoring.coreos.com/v1") == "discovery"


def test_bodies_tell_a_spec_change_from_a_status_change_and_an_echo() -> None:
    bodies = Bodies()

    def body(rv: str, generation: int) -> dict[str, Any]:
        meta = {"name": "a", "namespace": "ns", "resourceVersion": rv, "generation": generation}
        return {"metadata": {**meta, "managedFields": [{}]}, "status": {"rv": rv}}

    assert bodies.put(body("10", 1)) is Change.SPEC  # first sight
    assert "managedFields" not in (bodies.get(("ns", "a")) or {})["metadata"]
    assert bodies.put(body("11", 1)) is Change.OTHER  # status only
    assert bodies.put(body("11", 1)) is Change.NOTHING  # the echo of our own write
    assert bodies.put(body("9", 1)) is Change.NOTHING  # older than what is known
    assert (bodies.get(("ns", "a")) or {})["status"] == {"rv": "11"}
    assert bodies.put(body("12", 2)) is Change.SPEC
    bodies.forget(("ns", "a"))
    assert bodies.get(("ns", "a")) is None


def test_bodies_tell_the_autoscalers_measurements_from_what_a_reconcile_acts_on() -> None:
    bodies = Bodies()

    def body(rv: str, **status: Any) -> dict[str, Any]:
        meta = {"name": "a", "namespace": "ns", "resourceVersion": rv, "generation": 1}
        return {"metadata": meta, "spec": {"x": 1}, "status": status}

    auto = {"desiredReplicas": 2, "observedTokensPerSecond": 100.0, "policyState": {"load": []}}
    assert bodies.put(body("1", autoscaling=auto, observedTokensPerSecond=100.0)) is Change.SPEC
    moved = {**auto, "observedTokensPerSecond": 120.0, "policyState": {"load": [[1.0, 120.0]]}}
    measured = body("2", autoscaling=moved, observedTokensPerSecond=120.0)
    assert bodies.put(measured) is Change.MEASURED
    assert (bodies.get(("ns", "a")) or {})["metadata"]["resourceVersion"] == "2"  # still kept
    decided = body("3", autoscaling={**moved, "desiredReplicas": 3}, observedTokensPerSecond=120.0)
    assert bodies.put(decided) is Change.OTHER  # the reconcile sets the Deployment's replicas
    ours = body("4", autoscaling={**moved, "desiredReplicas": 3}, readyReplicas=3)
    assert bodies.put(ours) is Change.OTHER  # a field of the reconciler's own


def _fleet(uid: str, rv: str) -> dict[str, Any]:
    meta = {"name": "a", "namespace": "ns", "uid": uid, "resourceVersion": rv, "generation": 1}
    return {"metadata": meta}


def test_a_deleted_fleet_stays_deleted_until_created_again() -> None:
    bodies = Bodies(tombstone_seconds=300.0)
    assert bodies.put(_fleet("u1", "10")) is Change.SPEC
    bodies.forget(("ns", "a"), now=1000.0)
    assert bodies.deleted(("ns", "a"), now=1001.0)
    # A status-write reply of the deleted object, arriving after its deletion, is no news.
    assert bodies.put(_fleet("u1", "11")) is Change.NOTHING
    assert bodies.get(("ns", "a")) is None
    assert bodies.deleted(("ns", "a"), now=1001.0)
    # Created again under the same name: a new uid.
    assert bodies.put(_fleet("u2", "20")) is Change.SPEC
    assert not bodies.deleted(("ns", "a"), now=1001.0)


def test_tombstones_expire() -> None:
    bodies = Bodies(tombstone_seconds=300.0)
    bodies.forget(("ns", "a"), now=1000.0)
    assert bodies.deleted(("ns", "a"), now=1299.0)
    assert not bodies.deleted(("ns", "a"), now=1300.0)


def test_a_reconcile_of_a_fleet_known_deleted_asks_the_api_server_nothing() -> None:
    kube = NoFleetsKube()
    bodies = Bodies()
    reconciler = Reconciler(cast(Kube, kube), Images("w", "g"), bodies=bodies)
    reconciler.reconcile("ns", "unknown")
    assert len(kube.gets) == 1  # not known: asked once
    bodies.put(_fleet("u1", "10"))
    bodies.forget(("ns", "a"))
    for _ in range(10):  # e.g. one per deleted child's watch event
        assert reconciler.reconcile("ns", "a").body is None
    assert len(kube.gets) == 1


def test_a_fleet_in_a_terminating_namespace_is_left_to_go_with_it() -> None:
    fleet = {
        "metadata": {"name": "f", "namespace": "ns", "uid": "u-f", "generation": 1},
        "spec": {"model": {"source": "hf://org/model"}},
    }
    kube = TerminatingNamespaceKube(fleet)
    reconciler = Reconciler(cast(Kube, kube), IMAGES)
    outcome = reconciler.reconcile("ns", "f")
    # No error (a retry with backoff would be refused again until the fleet is deleted), no
    # status write, and no apply after the first refusal.
    assert (outcome.error, outcome.body) == ("", None)
    assert len(kube.writes) == 1, kube.writes
    assert kube.writes[0].startswith("APPLY ")


def test_a_kube_error_reads_the_causes_of_a_status() -> None:
    err = KubeError("PATCH", "/api/v1/namespaces/ns/configmaps/f-config", 403, TERMINATING_STATUS)
    assert err.causes == ("NamespaceTerminating",)
    assert err.namespace_terminating
    assert "being terminated" in err.message
    plain = KubeError("PATCH", "/x", 403, '{"message": "forbidden: no rights"}')
    assert not plain.namespace_terminating
    assert not KubeError("GET", "/x", 500, "not json").namespace_terminating
