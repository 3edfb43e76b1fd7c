"""A reconcile that finds nothing it reads changed since the fleet's last clean one renders
nothing (reconciler.py `_fingerprint`); anything it reads that changed makes it a full one."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

from embedfleet.operator import metrics, reconciler
from embedfleet.operator.informer import Bodies, Informer
from embedfleet.operator.kube import Kube
from embedfleet.operator.manifests import Images
from embedfleet.operator.reconciler import Reconciler

from .fakes import FLEET, ApplyingKube, FakeInformer


def test_nothing_read_changed_renders_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered: list[int] = []
    real = reconciler.children

    def counting(*args: Any, **kwargs: Any) -> Any:
        rendered.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(reconciler, "children", counting)
    kube, informer, bodies = ApplyingKube(), FakeInformer(), Bodies()
    bodies.put(copy.deepcopy(FLEET))
    rec = Reconciler(cast(Kube, kube), Images("w", "g"), cast(Informer, informer), bodies)
    first = rec.reconcile("ns", "f")
    assert not first.error
    assert any(w.startswith("APPLY") for w in kube.writes)
    # Its own writes moved versions: one more full pass, which finds everything in place.
    second = rec.reconcile("ns", "f")
    assert len(rendered) == 2
    writes, unchanged = len(kube.writes), metrics.RECONCILES_UNCHANGED._value.get()

    again = rec.reconcile("ns", "f")  # e.g. the resync: the same body, the same children
    assert len(rendered) == 2
    assert len(kube.writes) == writes
    assert metrics.RECONCILES_UNCHANGED._value.get() == unchanged + 1
    assert (again.desired, again.ready, again.events) == (second.desired, second.ready, [])

    # A measurement the autoscaler wrote is not read: still nothing to render.
    measured = copy.deepcopy(bodies.get(("ns", "f")) or {})
    measured["metadata"]["resourceVersion"] = kube.next_version()
    measured["status"]["autoscaling"] = {"observedTokensPerSecond": 5.0}
    bodies.put(measured)
    rec.reconcile("ns", "f")
    assert len(rendered) == 2

    # A child changed (its Deployment's status, a hand edit): full passes until one finds
    # nothing to write, then none.
    worker = informer.objects[("Deployment", "ns", "f-worker")]
    worker["metadata"]["resourceVersion"] = kube.next_version()
    worker["status"] = {"readyReplicas": 1, "replicas": 1, "updatedReplicas": 1}
    assert _passes_until_quiet(rec) >= 1

    # The spec changed: a full pass.
    edited = copy.deepcopy(bodies.get(("ns", "f")) or {})
    edited["metadata"].update(resourceVersion=kube.next_version(), generation=2)
    edited["spec"]["worker"] = {"replicas": 3}
    bodies.put(edited)
    assert _passes_until_quiet(rec) >= 1


def test_a_child_that_changes_during_a_pass_makes_the_next_one_full() -> None:
    # The Deployment's controller updates its status while the operator's pass runs (here: as
    # the pass writes the fleet's status, after it read the Deployment). That pass saw the old
    # status; the next must not be skipped, or the fleet's status would keep the old counts.
    kube, informer, bodies = ApplyingKube(), FakeInformer(), Bodies()
    bodies.put(copy.deepcopy(FLEET))
    rec = Reconciler(cast(Kube, kube), Images("w", "g"), cast(Informer, informer), bodies)
    assert _passes_until_quiet(rec) >= 1
    real = kube.merge_status

    def status_then_rollout(path: str, status: Any) -> Any:
        worker = informer.objects[("Deployment", "ns", "f-worker")]
        worker["metadata"]["resourceVersion"] = kube.next_version()
        worker["status"] = {"readyReplicas": 2, "replicas": 2, "updatedReplicas": 2}
        return real(path, status)

    kube.merge_status = status_then_rollout  # type: ignore[method-assign]
    fleet = copy.deepcopy(bodies.get(("ns", "f")) or {})
    fleet["metadata"].update(generation=2, resourceVersion=kube.next_version())
    fleet["spec"]["worker"] = {"replicas": 2}
    bodies.put(fleet)
    rec.reconcile("ns", "f")  # reads the Deployment, then the rollout moves on
    kube.merge_status = real  # type: ignore[method-assign]
    before = metrics.RECONCILES_UNCHANGED._value.get()
    rec.reconcile("ns", "f")
    assert metrics.RECONCILES_UNCHANGED._value.get() == before  # a full pass: not skipped


def _passes_until_quiet(rec: Reconciler, most: int = 5) -> int:
    """Reconciles until a pass is skipped; the full passes it took."""
    for full in range(most):
        before = metrics.RECONCILES_UNCHANGED._value.get()
        rec.reconcile("ns", "f")
        if metrics.RECONCILES_UNCHANGED._value.get() > before:
            return full
    raise AssertionError(f"no pass was skipped in {most}")
