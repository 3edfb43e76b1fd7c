"""Choosing a worker: least outstanding tokens between two random candidates, with ejection.

Load is counted in tokens, not requests, because a worker's latency grows with tokens. Power of
two choices avoids the herd that pure least-loaded picking causes when several requests arrive
before any completes, and it needs no global ordering.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class Endpoint:
    address: str
    #: tokens this gateway has sent and not yet had answered
    outstanding_tokens: int = 0
    #: the worker's last Info said ready (and not draining)
    ready: bool = False
    ejected_until: float = 0.0
    #: queue depth the worker last reported (all gateways' load, as of the last probe)
    queued_tokens: int = 0
    #: of that, what other gateways queued: the report less this gateway's tokens there then
    queued_elsewhere: int = 0
    #: tokens/s the worker sustains saturated: its own batches' figure, else its warm-up
    #: measurement (0: neither reported yet)
    capacity: float = 0.0


def choose(loads: Sequence[int], rng: random.Random) -> int:
    """Index of the less loaded of two distinct random candidates (the only one if just one)."""
    if len(loads) == 1:
        return 0
    a, b = rng.sample(range(len(loads)), 2)
    return a if loads[a] <= loads[b] else b


class Balancer:
    def __init__(
        self,
        eject_seconds: float,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.eject_seconds = eject_seconds
        self._rng = rng or random.Random()
        self._clock = clock
        self.endpoints: dict[str, Endpoint] = {}

    def set_addresses(self, addresses: Collection[str]) -> tuple[set[str], set[str]]:
        """Makes the set of endpoints equal `addresses`; returns (added, removed)."""
        added = set(addresses) - self.endpoints.keys()
        removed = self.endpoints.keys() - set(addresses)
        for address in removed:
            del self.endpoints[address]
        for address in sorted(added):
            self.endpoints[address] = Endpoint(address)
        return added, removed

    def usable(self) -> list[Endpoint]:
        now = self._clock()
        return [e for e in self.endpoints.values() if e.ready and e.ejected_until <= now]

    def pick(self, exclude: Collection[str] = ()) -> Endpoint | None:
        candidates = [e for e in self.usable() if e.address not in exclude]
        if not candidates:
            # Ejection is advice: with no healthy worker left, trying an ejected one beats failing.
            candidates = [
                e for e in self.endpoints.values() if e.ready and e.address not in exclude
            ]
        if not candidates:
            return None
        return candidates[choose([e.outstanding_tokens for e in candidates], self._rng)]

    def eject(self, endpoint: Endpoint) -> bool:
        """Returns True if this ejected a worker that was not already ejected."""
        now = self._clock()
        fresh = endpoint.ejected_until <= now
        endpoint.ejected_until = now + self.eject_seconds
        return fresh

    def readmit(self, endpoint: Endpoint) -> None:
        """End an ejection early."""
        endpoint.ejected_until = 0.0
