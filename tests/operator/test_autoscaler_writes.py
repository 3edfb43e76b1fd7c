"""The autoscaler writes status.autoscaling only when a decision changes its content."""

from __future__ import annotations

from embedfleet.operator.autoscaling.autoscaler import unchanged


def test_a_repeated_decision_is_no_write() -> None:
    old = {"desiredReplicas": 2, "reason": "NoMetrics", "policyState": {"load": []}, "x": 1}
    assert unchanged(
        old, {"desiredReplicas": 2, "reason": "NoMetrics", "policyState": {"load": []}}
    )


def test_any_changed_field_is_a_write() -> None:
    old = {"desiredReplicas": 2, "reason": "NoMetrics", "policyState": {"load": []}}
    assert not unchanged(old, {**old, "desiredReplicas": 3})
    assert not unchanged(old, {**old, "policyState": {"load": [[1.0, 2.0]]}})
    assert not unchanged(old, {**old, "observedTokensPerSecond": 0.0})  # a new field
