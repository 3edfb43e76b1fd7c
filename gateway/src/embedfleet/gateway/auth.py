"""API keys: which requests may use /v1/*, checked in constant time, reloaded when the file changes.

The keys file holds one key a line (blank lines and # comments ignored); in Kubernetes it is a
mounted Secret, which the kubelet updates by swapping a symlink, so the file is re-read by content
every `api_keys_reload_seconds` (a stat of the path would miss nothing either, but content is what
matters). Only sha256 digests of the keys stay in memory. The presented key's digest is compared
with every stored digest by `hmac.compare_digest`, with no early exit, so the time taken says
nothing about which key, or how much of one, matched. Keys never reach a log or a metric: per-key
counters are labelled by `key_label` (12 hex digits of the sha256).

/health, /ready, /metrics and /openapi.json stay open: probes and Prometheus carry no key, and
none of them reads or computes anything a key protects (docs/gateway.md, "API keys").
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

#: how many hex digits of the key's sha256 label its metrics
LABEL_DIGITS = 12


def parse_keys(text: str) -> list[str]:
    """One key a line; surrounding whitespace, blank lines and lines starting with # dropped."""
    out: list[str] = []
    for line in text.splitlines():
        key = line.strip()
        if key and not key.startswith("#"):
            out.append(key)
    return out


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def key_label(key: str) -> str:
    """What metrics call a key: the start of its sha256 (`printf %s KEY | sha256sum`)."""
    return hashlib.sha256(key.encode()).hexdigest()[:LABEL_DIGITS]


def bearer(authorization: bytes | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.decode("latin-1").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class ApiKeys:
    """A set of keys, as digests. `check` answers the matching key's label, or None."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._entries = [(_digest(k), key_label(k)) for k in dict.fromkeys(keys)]

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, presented: str | None) -> str | None:
        if presented is None:
            return None
        candidate = _digest(presented)
        found: str | None = None
        for digest, label in self._entries:
            # Every entry is compared, whether or not one already matched.
            if hmac.compare_digest(digest, candidate):
                found = label
        return found


class KeyFile:
    """The keys of a file, re-read whenever its content changes; `keys` is the current set.

    A file that cannot be read at start is an error (a gateway that should check keys must not
    start open); one that vanishes later (mid-swap, say) keeps the last keys it had.
    """

    def __init__(self, path: Path, interval: float) -> None:
        self.path = path
        self.interval = interval
        self._raw = path.read_bytes()
        self.keys = ApiKeys(parse_keys(self._raw.decode()))
        self.reloads = 0
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        log.info("api keys loaded", extra={"keys": len(self.keys)})

    def reload(self) -> bool:
        """Re-read the file; True when the keys changed."""
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            if not self._failing:  # once per failure streak: the loop polls every second
                log.warning(
                    "api keys file unreadable; keeping the last keys",
                    extra={"error": type(exc).__name__},
                )
            self._failing = True
            return False
        self._failing = False
        if raw == self._raw:
            return False
        self._raw = raw
        self.keys = ApiKeys(parse_keys(raw.decode(errors="replace")))
        self.reloads += 1
        log.info("api keys reloaded", extra={"keys": len(self.keys)})
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.reload()

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
