"""Pure: a worker's refusal of its model, and whether it holds the fleet's workers at zero.

A worker given a model it cannot serve exits with `EXIT_REFUSED` and says why in one line, its
termination message. Restarting it would only repeat that, so the first refusal seen in a
worker pod's last termination is recorded in the EmbeddingDeployment's conditions (reason
`UnsupportedModel`, with that generation), and while the record stands for the current
generation the worker Deployment is held at zero replicas. Any change to the spec makes a new
generation, so the workers start again and tell anew.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from embedfleet.common.exits import EXIT_REFUSED
from embedfleet.operator.conditions import DEGRADED, find
from embedfleet.operator.manifests import CONFIG_HASH
from embedfleet.operator.status import UNSUPPORTED_MODEL, RolloutState

#: what the condition says when a refusal came without its message
UNSAID = f"the worker refused its model (exit code {EXIT_REFUSED}) without saying why"


def recorded(status: Mapping[str, Any], generation: int) -> str:
    """The refusal recorded for this generation of the spec ("" when none stands)."""
    cond = find(status.get("conditions"), DEGRADED)
    if cond is None or cond.get("reason") != UNSUPPORTED_MODEL:
        return ""
    if cond.get("observedGeneration") != generation:
        return ""
    return str(cond.get("message") or UNSAID)


def must_look(refusal: str, workers: RolloutState) -> bool:
    """Whether the worker pods are worth reading: workers are wanted and not all ready, and no
    refusal already stands."""
    return not refusal and workers.desired > 0 and workers.ready < workers.desired


def reported(pods: Iterable[Mapping[str, Any]], config: str, container: str = "worker") -> str:
    """The refusal a worker container ended with, now or at its last run ("" when none did): the
    last line of its termination message (the whole log tail when the kubelet fell back to it).
    Only pods of the current spec count (their `CONFIG_HASH` annotation is `config`, and they
    are not going away): a refusing pod of the spec before must not stop a fixed one."""
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (
            meta.get("deletionTimestamp")
            or (meta.get("annotations") or {}).get(CONFIG_HASH) != config
        ):
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            if status.get("name") != container:
                continue
            for state in (status.get("state"), status.get("lastState")):
                ended = (state or {}).get("terminated") or {}
                if ended.get("exitCode") == EXIT_REFUSED:
                    lines = str(ended.get("message") or "").strip().splitlines()
                    return lines[-1].strip() if lines else UNSAID
    return ""
