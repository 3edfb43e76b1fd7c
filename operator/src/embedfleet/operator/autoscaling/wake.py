"""Waking a fleet at zero workers the moment a gateway holds a request for it.

The autoscaler decides every INTERVAL_SECONDS (autoscaler.py); a fleet scaled to zero would then
wait up to a whole interval, on top of its cold start, before anything happens for the request
its gateway holds. Between two ticks the autoscaler therefore polls, every POLL_SECONDS, the
gateway pods of the fleets at zero only, and decides for one at once when a gateway reports held
requests (its `embedfleet_gateway_held_requests` gauge, the demand the policy scales from zero on).

A poll, rather than a watch on something the gateway writes or a call from the gateway to the
operator: it needs no new permission on either side (the operator already lists pods and scrapes
them; the gateway writes nothing to the API), no new port, and costs only while a fleet is at
zero: one GET per gateway pod of each such fleet per POLL_SECONDS, at most CONCURRENT_POLLS at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from embedfleet.operator.autoscaling.signals import parse_gateway
from embedfleet.operator.spec import Autoscaling

#: Seconds between two polls of a fleet at zero: a held request waits at most this for a decision.
POLL_SECONDS = 0.5
#: Bound on one gateway's answer: a hung pod costs one poll, never the next tick.
POLL_TIMEOUT_SECONDS = 1.0
#: Gateways polled at once, across every fleet at zero.
CONCURRENT_POLLS = 32


@dataclass(frozen=True, slots=True)
class Sleeping:
    """A fleet at zero workers and where its gateways' metrics are."""

    namespace: str
    name: str
    gateway_urls: tuple[str, ...]


def at_zero(spec: Autoscaling, desired: int | None) -> bool:
    """Whether the fleet is held at zero workers by its autoscaler, so a request can only wake it
    (pure): scale to zero allowed and zero the last decision."""
    return spec.min_replicas == 0 and desired == 0


def demand_waiting(expositions: Iterable[str]) -> bool:
    """Whether any gateway's /metrics exposition (text format) reports a held request (pure)."""
    return any(parse_gateway(text, 0.0).held_requests > 0 for text in expositions)
