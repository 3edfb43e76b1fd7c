"""A worker's refusal of its model: read from its pod's last termination, recorded in the
conditions for the spec's generation, holding the workers at zero until the spec changes."""

from __future__ import annotations

import copy
from typing import Any, cast

from embedfleet.common.exits import EXIT_REFUSED
from embedfleet.operator.conditions import find
from embedfleet.operator.informer import Bodies, Informer
from embedfleet.operator.kube import Kube
from embedfleet.operator.manifests import CONFIG_HASH, Images
from embedfleet.operator.reconciler import Reconciler
from embedfleet.operator.refusal import UNSAID, must_look, recorded, reported
from embedfleet.operator.render.config import config_hash
from embedfleet.operator.render.workers import worker_env
from embedfleet.operator.spec import parse_spec
from embedfleet.operator.status import RolloutState, compute_status

from .fakes import FLEET, ApplyingKube, FakeInformer

LINE = "unsupported model: model_type 't5' cannot be served: no engine family implements it."
SPEC = parse_spec({"model": {"source": "file:///m"}})


#: the config hash the pods of the current spec carry
CONFIG = "abc123"


def pod(
    *states: tuple[str, int, str], name: str = "worker", config: str = CONFIG
) -> dict[str, Any]:
    """A pod of `config` whose container `name` is in `state` and ended its last run as
    `lastState`."""
    status: dict[str, Any] = {"name": name}
    for where, code, message in states:
        status[where] = {"terminated": {"exitCode": code, "message": message}}
    meta = {"annotations": {CONFIG_HASH: config}}
    return {"metadata": meta, "status": {"containerStatuses": [status]}}


def test_a_refusal_is_read_from_the_current_or_the_last_run() -> None:
    assert reported([pod(("lastState", EXIT_REFUSED, LINE + "\n"))], CONFIG) == LINE
    assert reported([pod(("state", EXIT_REFUSED, LINE))], CONFIG) == LINE
    # With terminationMessagePolicy FallbackToLogsOnError the message is the log's tail.
    tail = '{"level": "error", "message": "model refused"}\n' + LINE + "\n"
    assert reported([pod(("lastState", EXIT_REFUSED, tail))], CONFIG) == LINE
    assert reported([pod(("lastState", EXIT_REFUSED, ""))], CONFIG) == UNSAID


def test_only_pods_of_the_current_spec_count() -> None:
    """A pod of the spec before (the user fixed the model since) or one going away must not hold
    the fixed fleet at zero."""
    old = pod(("lastState", EXIT_REFUSED, LINE), config="before")
    assert reported([old], CONFIG) == ""
    going = pod(("lastState", EXIT_REFUSED, LINE))
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert reported([going], CONFIG) == ""


def test_other_exits_and_containers_are_no_refusal() -> None:
    assert reported([], CONFIG) == ""
    assert reported([{"status": {}}], CONFIG) == ""
    assert reported([pod(("lastState", 1, "Traceback ..."))], CONFIG) == ""  # a crash
    assert reported([pod(("lastState", 137, ""))], CONFIG) == ""  # OOM-killed
    assert reported([pod(("lastState", EXIT_REFUSED, LINE), name="fetch-model")], CONFIG) == ""
    # One refusing pod among healthy ones is enough.
    assert reported([pod(), pod(("lastState", EXIT_REFUSED, LINE))], CONFIG) == LINE


def status_with(refusal: str, generation: int) -> dict[str, Any]:
    workers = RolloutState(desired=0)
    gateways = RolloutState(desired=1, replicas=1, ready=1, updated=1, available=1, current=True)
    return compute_status(
        spec=SPEC,
        old={},
        generation=generation,
        workers=workers,
        gateways=gateways,
        selector="a=b",
        endpoint="http://x",
        error="",
        now="2026-01-01T00:00:00Z",
        refusal=refusal,
    )


def test_the_recorded_refusal_stands_for_its_generation_only() -> None:
    status = status_with(LINE, generation=3)
    degraded, available = (
        find(status["conditions"], "Degraded"),
        find(status["conditions"], "Available"),
    )
    assert degraded is not None
    assert available is not None
    assert (degraded["status"], degraded["reason"], degraded["message"]) == (
        "True", "UnsupportedModel", LINE
    )  # fmt: skip
    assert (available["status"], available["reason"]) == ("False", "UnsupportedModel")
    assert recorded(status, 3) == LINE
    assert recorded(status, 4) == ""  # the spec changed: the workers try again
    assert recorded(status_with("", 3), 3) == ""
    assert recorded({}, 3) == ""


def test_pods_are_read_only_while_workers_are_wanted_and_not_ready() -> None:
    waiting = RolloutState(desired=2, ready=1)
    assert must_look("", waiting)
    assert not must_look(LINE, waiting)  # already refused: held at zero, nothing to read
    assert not must_look("", RolloutState(desired=2, ready=2))
    assert not must_look("", RolloutState(desired=0))


def test_the_reconciler_holds_refused_workers_at_zero_until_the_spec_changes() -> None:
    """Through the reconciler with FAKE API server and informer (fakes.py): a worker pod that
    ended refusing its model takes the worker Deployment to zero and writes the condition; the
    next passes keep it there without reading pods; a new generation tries again."""
    kube, informer, bodies = ApplyingKube(), FakeInformer(), Bodies()
    bodies.put(copy.deepcopy(FLEET))
    rec = Reconciler(cast(Kube, kube), Images("w", "g"), cast(Informer, informer), bodies)
    worker = "/apis/apps/v1/namespaces/ns/deployments/f-worker"

    rec.reconcile("ns", "f")  # the workers start; none has ended yet
    assert kube.applied[worker]["spec"]["replicas"] == 1
    config = config_hash(worker_env(parse_spec(FLEET["spec"])))
    kube.pods = [pod(("lastState", EXIT_REFUSED, LINE), config=config)]
    outcome = rec.reconcile("ns", "f")  # e.g. the resync after the pod's first exit
    assert kube.applied[worker]["spec"]["replicas"] == 0
    assert [e.reason for e in outcome.events] == ["Scaled", "UnsupportedModel"]
    status = (bodies.get(("ns", "f")) or {})["status"]
    assert recorded(status, 1) == LINE
    assert status["desiredReplicas"] == 0

    lists = kube.pod_lists
    for _ in range(2):
        rec.reconcile("ns", "f")
    assert kube.applied[worker]["spec"]["replicas"] == 0
    assert kube.pod_lists == lists  # a standing refusal reads no pods

    kube.pods = []  # the refusing pods went with the scale-down
    edited = copy.deepcopy(bodies.get(("ns", "f")) or {})
    edited["metadata"].update(resourceVersion=kube.next_version(), generation=2)
    edited["spec"]["model"]["revision"] = "v2"
    bodies.put(edited)
    rec.reconcile("ns", "f")
    assert kube.applied[worker]["spec"]["replicas"] == 1
    assert recorded((bodies.get(("ns", "f")) or {})["status"], 2) == ""
