from __future__ import annotations

from typing import Any

import pytest

from embedfleet.operator.replicas import autoscaler_desired, worker_replicas
from embedfleet.operator.spec import parse_spec


def _spec(replicas: int = 2, **autoscaling: Any) -> Any:
    return parse_spec(
        {
            "model": {"source": "hf://o/m"},
            "worker": {"replicas": replicas},
            "autoscaling": autoscaling,
        }
    )


def _status(desired: object) -> dict[str, Any]:
    return {"autoscaling": {"desiredReplicas": desired}}


def test_without_autoscaling_the_spec_wins() -> None:
    assert worker_replicas(_spec(3), _status(7)) == 3


def test_external_scaler_writes_the_spec() -> None:
    spec = _spec(5, enabled=True, external=True, minReplicas=1, maxReplicas=2)
    # HPA/KEDA own the bounds of their own objects; the operator follows spec.worker.replicas.
    assert worker_replicas(spec, _status(1)) == 5


@pytest.mark.parametrize(("desired", "expected"), [(3, 3), (0, 1), (9, 4), (1, 1), (4, 4)])
def test_autoscaler_decision_is_clamped(desired: int, expected: int) -> None:
    spec = _spec(2, enabled=True, minReplicas=1, maxReplicas=4)
    assert worker_replicas(spec, _status(desired)) == expected


@pytest.mark.parametrize("status", [None, {}, {"autoscaling": {}}, _status("3"), _status(True)])
def test_before_a_decision_the_spec_is_clamped(status: Any) -> None:
    assert worker_replicas(_spec(9, enabled=True, minReplicas=2, maxReplicas=5), status) == 5
    assert worker_replicas(_spec(0, enabled=True, minReplicas=2, maxReplicas=5), status) == 2


def test_autoscaler_desired_reads_only_counts() -> None:
    assert autoscaler_desired(_status(3.0)) == 3
    assert autoscaler_desired(_status(None)) is None
    assert autoscaler_desired({"autoscaling": "x"}) is None
