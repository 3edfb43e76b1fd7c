"""Pure: the desired-state hash of a child, and whether a child needs applying at all.

A server-side apply that changes nothing still costs the API server a write request (admission,
a managedFields diff, an etcd read), and the operator used to send about ten of them per fleet on
every resync and on every status change. Now each child carries the hash of the manifest it was
last applied from (annotation HASH_ANNOTATION), and the operator applies a child only when

- it does not exist (or is being deleted),
- its hash differs from the manifest's (the spec, the images or the renderer changed), or
- someone else changed it since the operator last looked: its metadata.generation moved (kinds
  with a spec: Deployments, PodDisruptionBudgets), or else its resourceVersion did (ConfigMaps,
  Services, ServiceAccounts, RBAC: nothing but a hand edit changes those).

What the operator last looked at is `Seen`, kept in memory from its own apply replies and the
informer's first sight of each child. After a restart it starts from what the children are:
a hand edit made while no operator ran stays until the spec changes (it used to be reverted by
the first resync), the one trade for an idle operator that writes nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

HASH_ANNOTATION = "embedfleet.dev/desired-hash"


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    """A stable hash of a manifest as rendered (before the hash annotation is stamped on)."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def stamped(manifest: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The manifest with its hash annotation, and the hash."""
    digest = manifest_hash(manifest)
    meta = dict(manifest["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), HASH_ANNOTATION: digest}
    return {**manifest, "metadata": meta}, digest


@dataclass(frozen=True, slots=True)
class Live:
    """What the operator needs to know of a child as the API server has it."""

    hash: str
    generation: int
    resource_version: str
    deleting: bool = False

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Live:
        meta = obj.get("metadata") or {}
        return cls(
            hash=str((meta.get("annotations") or {}).get(HASH_ANNOTATION, "")),
            generation=int(meta.get("generation") or 0),
            resource_version=str(meta.get("resourceVersion") or ""),
            deleting=bool(meta.get("deletionTimestamp")),
        )


@dataclass(frozen=True, slots=True)
class Seen:
    """A child as the operator last applied or accepted it."""

    hash: str
    generation: int
    resource_version: str

    @classmethod
    def of(cls, live: Live) -> Seen:
        return cls(live.hash, live.generation, live.resource_version)


def needs_apply(digest: str, live: Live | None, seen: Seen | None) -> bool:
    """Whether the child rendered with hash `digest` must be applied (see the module docstring);
    `seen` None means the operator has not looked at this child since it started."""
    if live is None or live.deleting or live.hash != digest:
        return True
    if seen is None:
        return False
    if seen.hash != digest:
        return True
    if live.generation or seen.generation:
        return live.generation != seen.generation
    return live.resource_version != seen.resource_version
