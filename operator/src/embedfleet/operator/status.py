"""Pure: the EmbeddingDeployment's status from its spec and its children's observed state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from embedfleet.operator.conditions import (
    AVAILABLE,
    DEGRADED,
    MONITORED,
    PROGRESSING,
    SCALING_ACTIVE,
    Condition,
    set_conditions,
)
from embedfleet.operator.replicas import autoscaler_desired
from embedfleet.operator.spec import Spec

#: Mirrored from status.autoscaling to the top of status, for the printer columns (same names).
MIRRORED = ("observedTokensPerSecond", "p99LatencyMilliseconds")
#: the reason of a worker's refusal of its model (refusal.py), in Available and Degraded
UNSUPPORTED_MODEL = "UnsupportedModel"


def mirrored(autoscaling: Mapping[str, Any]) -> dict[str, Any]:
    """The printer columns status.autoscaling gives the top of status: the autoscaler writes
    them with its own write, so the reconcile that write triggers has nothing left to write."""
    return {key: autoscaling[key] for key in MIRRORED if key in autoscaling}


@dataclass(frozen=True)
class RolloutState:
    """What a Deployment's status says, reduced to what the conditions need."""

    desired: int
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    available: int = 0
    current: bool = False
    """The Deployment controller has observed the latest spec."""
    deadline_exceeded: bool = False
    failure: str = ""
    """Message of a ReplicaFailure condition (e.g. quota or admission refusals)."""

    @property
    def rolled_out(self) -> bool:
        return (
            self.current
            and self.updated >= self.desired
            and self.replicas == self.desired
            and self.available >= self.desired
        )


def rollout_state(deployment: Mapping[str, Any] | None, desired: int) -> RolloutState:
    if not deployment:
        return RolloutState(desired=desired)
    status = deployment.get("status") or {}
    generation = deployment.get("metadata", {}).get("generation", 0)
    conds = {c.get("type"): c for c in status.get("conditions") or ()}
    progressing = conds.get("Progressing") or {}
    failure = conds.get("ReplicaFailure") or {}
    return RolloutState(
        desired=desired,
        replicas=int(status.get("replicas", 0)),
        ready=int(status.get("readyReplicas", 0)),
        updated=int(status.get("updatedReplicas", 0)),
        available=int(status.get("availableReplicas", 0)),
        current=int(status.get("observedGeneration", -1)) >= int(generation),
        deadline_exceeded=progressing.get("reason") == "ProgressDeadlineExceeded",
        failure=str(failure.get("message", "")) if failure.get("status") == "True" else "",
    )


def _available(workers: RolloutState, gateways: RolloutState, refusal: str) -> Condition:
    if refusal:
        return Condition(AVAILABLE, "False", UNSUPPORTED_MODEL, refusal)
    if workers.desired == 0:
        return Condition(AVAILABLE, "False", "ScaledToZero", "worker replicas are 0")
    if workers.ready == 0:
        return Condition(AVAILABLE, "False", "WorkersUnavailable", "no worker pod is ready")
    if gateways.ready == 0:
        return Condition(AVAILABLE, "False", "GatewayUnavailable", "no gateway pod is ready")
    return Condition(
        AVAILABLE,
        "True",
        "MinimumReplicasAvailable",
        f"{workers.ready}/{workers.desired} workers and {gateways.ready}/{gateways.desired} "
        "gateways ready",
    )


def _progressing(workers: RolloutState, gateways: RolloutState) -> Condition:
    pending = [
        f"{what} {s.updated} updated, {s.available} available of {s.desired}"
        for what, s in (("workers", workers), ("gateways", gateways))
        if not s.rolled_out
    ]
    if pending:
        return Condition(PROGRESSING, "True", "RollingOut", "; ".join(pending))
    return Condition(PROGRESSING, "False", "RolloutComplete", "all pods run the current spec")


def _degraded(error: str, workers: RolloutState, gateways: RolloutState, refusal: str) -> Condition:
    if refusal:  # what refusal.recorded reads back: it holds the workers at zero
        return Condition(DEGRADED, "True", UNSUPPORTED_MODEL, refusal)
    if error:
        return Condition(DEGRADED, "True", "ReconcileFailed", error)
    for what, state in (("worker", workers), ("gateway", gateways)):
        if state.failure:
            return Condition(DEGRADED, "True", "ReplicaFailure", f"{what}: {state.failure}")
        if state.deadline_exceeded:
            return Condition(
                DEGRADED,
                "True",
                "ProgressDeadlineExceeded",
                f"the {what} rollout made no progress within its deadline",
            )
    return Condition(DEGRADED, "False", "AsExpected", "no problems observed")


def _scaling(spec: Spec, status: Mapping[str, Any]) -> Condition:
    auto = spec.autoscaling
    if not auto.enabled:
        return Condition(
            SCALING_ACTIVE, "False", "Disabled", "replicas come from spec.worker.replicas"
        )
    if auto.external:
        return Condition(
            SCALING_ACTIVE,
            "False",
            "External",
            "an external scaler (HPA/KEDA) sets spec.worker.replicas via the scale subresource",
        )
    if autoscaler_desired(status) is None:
        return Condition(
            SCALING_ACTIVE, "False", "AwaitingDecision", "the autoscaler has not decided yet"
        )
    return Condition(
        SCALING_ACTIVE,
        "True",
        "AutoscalerActive",
        f"replicas follow the autoscaler within [{auto.min_replicas}, {auto.max_replicas}]",
    )


def monitored(name: str, enabled: bool, served: bool, refusal: str) -> Condition:
    """The Monitored condition: whether the ServiceMonitor the spec may ask for is in place.

    Never a reason to call the fleet Degraded: the fleet serves either way, and the default chart
    grants no ServiceMonitor rights.
    """
    if not enabled:
        return Condition(
            MONITORED, "False", "Disabled", "spec.monitoring.serviceMonitor.enabled is false"
        )
    if not served:
        return Condition(
            MONITORED,
            "False",
            "CRDNotInstalled",
            "no ServiceMonitor: the API server serves no monitoring.coreos.com/v1 "
            "servicemonitors (install the Prometheus Operator's CRDs)",
        )
    if refusal:
        return Condition(
            MONITORED,
            "False",
            "Forbidden",
            "no ServiceMonitor: the operator may not manage servicemonitors.monitoring.coreos.com "
            f"(grant it, e.g. the chart's rbac.serviceMonitors=true): {refusal}",
        )
    return Condition(
        MONITORED, "True", "ServiceMonitorApplied", f"ServiceMonitor {name} selects the fleet"
    )


def compute_status(
    *,
    spec: Spec,
    old: Mapping[str, Any],
    generation: int,
    workers: RolloutState,
    gateways: RolloutState,
    selector: str,
    endpoint: str,
    error: str,
    now: str,
    monitoring: Condition | None = None,
    refusal: str = "",
) -> dict[str, Any]:
    """The fields of status the operator owns (status.autoscaling belongs to the autoscaler).
    `refusal`: the workers' refusal of the model standing for this generation (refusal.py)."""
    wanted = [
        _available(workers, gateways, refusal),
        _progressing(workers, gateways),
        _degraded(error, workers, gateways, refusal),
        _scaling(spec, old),
        *([monitoring] if monitoring is not None else []),
    ]
    out: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": set_conditions(old.get("conditions"), wanted, generation, now),
        "replicas": workers.replicas,
        "readyReplicas": workers.ready,
        "updatedReplicas": workers.updated,
        "desiredReplicas": workers.desired,
        "gatewayReadyReplicas": gateways.ready,
        "selector": selector,
        "endpoint": endpoint,
    }
    auto = old.get("autoscaling")
    if isinstance(auto, Mapping):
        for key, value in mirrored(auto).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[key] = value
    return out


def changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether writing `new` would change anything (skips no-op status writes and their events)."""
    return any(old.get(key) != value for key, value in new.items())
