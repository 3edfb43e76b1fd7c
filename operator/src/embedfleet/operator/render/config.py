"""Settings as the processes read them (EMBEDFLEET_* env vars), the hash that rolls the pods
reading them, and where a model directory is inside a container."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from embedfleet.operator.manifests import MODEL_DIR
from embedfleet.operator.spec import ModelSource, Spec


def env(prefix: str, values: Mapping[str, object]) -> dict[str, str]:
    """`values` as env vars: `prefix` + the upper-cased name; booleans as true/false."""

    def text(value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return {prefix + key.upper(): text(value) for key, value in values.items()}


def config_hash(values: Mapping[str, str]) -> str:
    """Annotates a pod template, so a settings change rolls exactly the pods that read it."""
    blob = json.dumps(dict(values), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def tracing_env(prefix: str, spec: Spec, service_name: str) -> dict[str, str]:
    """The tracing settings of one component; none when spec.monitoring.tracing has no endpoint,
    so an untraced deployment's config (and its pods' config hash) is what it was before."""
    tracing = spec.tracing
    if not tracing.endpoint:
        return {}
    return env(
        prefix,
        {
            "tracing_endpoint": tracing.endpoint,
            "tracing_sample_ratio": tracing.sample_ratio,
            "tracing_service_name": service_name,
        },
    )


def model_path(source: ModelSource, root: str = MODEL_DIR) -> str:
    """Where the model directory is inside the worker and gateway containers (`root`: where
    its volume is mounted; a shared gateway mounts each fleet's at a root of its own)."""
    if source.kind == "hf":
        org, name = source.repo.split("/", 1)
        return f"{root}/{org}--{name}/{source.revision or 'default'}"
    if source.kind == "pvc":
        return f"{root}/{source.path}"
    return source.path


def served_task(spec: Spec) -> str:
    """The worker's and gateway's --task: embed, the default, leaves the choice to the checkpoint
    (so a cross-encoder deployed without model.task still scores); the others are checked
    against it at start."""
    return "auto" if spec.model.task == "embed" else spec.model.task
