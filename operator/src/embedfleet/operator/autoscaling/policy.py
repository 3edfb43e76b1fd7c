"""The scaling decision: a pure function of (policy state, observation, spec.autoscaling,
replicas, now).

Capacity is tokens/s, so the load-driven target is ceil(demand / tokens/s one replica serves within
the SLO). Around it:

- demand is the offered tokens/s plus the backlog drained over the stable window;
- two windows of demand: the stable window smooths noise, the panic window catches bursts; scale-up
  follows whichever asks for more, and a burst also blocks scale-down for one stable window;
- a tolerance band around the current fleet suppresses changes for small deviations;
- p99 above the SLO forces a scale-up (once earlier scale-ups have become ready), p99 near the SLO
  blocks any scale-down; the latency guard catches a wrong capacity figure;
- scale-down goes to the highest recommendation of the stabilization window (as the HPA does);
- rate limits both ways, then a clamp to [min, max].

Times are seconds on any clock that does not go backwards within one policy's life; the operator
uses Unix time so the state it keeps in status stays meaningful across restarts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from embedfleet.operator.replicas import clamp
from embedfleet.operator.spec import Autoscaling

#: p99 above this fraction of the SLO blocks scale-down.
NEAR_SLO_FRACTION = 0.8
#: One interval's demand at this multiple of the fleet's target is a burst by itself.
BURST_RATIO = 1.5
#: A latency-forced scale-up adds this fraction of the fleet (at least one replica).
LATENCY_STEP = 0.25


class Reason(StrEnum):
    """Why a decision came out as it did; also the Event reason."""

    SCALE_UP_FOR_LOAD = "ScaleUpForLoad"
    SCALE_UP_FOR_BURST = "ScaleUpForBurst"
    SCALE_UP_FOR_LATENCY = "ScaleUpForLatency"
    SCALE_DOWN_FOR_LOAD = "ScaleDownForLoad"
    SCALE_TO_BOUNDS = "ScaleToBounds"
    WITHIN_TOLERANCE = "WithinTolerance"
    SCALE_DOWN_STABILIZING = "ScaleDownStabilizing"
    SCALE_DOWN_BLOCKED_BY_LATENCY = "ScaleDownBlockedByLatency"
    SCALE_DOWN_BLOCKED_BY_BURST = "ScaleDownBlockedByBurst"
    WAITING_FOR_REPLICAS = "WaitingForReplicas"
    CAPACITY_UNKNOWN = "CapacityUnknown"
    NO_METRICS = "NoMetrics"


@dataclass(frozen=True, slots=True)
class Observation:
    """One measurement of the whole fleet."""

    #: offered load: tokens/s accepted by the gateways (or computed by the workers)
    tokens_per_second: float
    #: p99 request latency over the last interval; None when no request finished
    p99_seconds: float | None = None
    #: tokens/s one replica sustains at saturation (the workers' own measurement); None: unknown
    capacity_tokens_per_second: float | None = None
    #: tokens waiting in the workers' queues
    queued_tokens: float = 0.0
    ready_replicas: int = 0
    #: requests the gateways hold because no worker is ready (scale from zero), and their tokens
    held_requests: float = 0.0
    held_tokens: float = 0.0


@dataclass(frozen=True, slots=True)
class PolicyState:
    """What the policy remembers between decisions (kept in status, see `state`)."""

    #: (time, demand tokens/s) within the stable window, oldest first
    load: tuple[tuple[float, float], ...] = ()
    #: (time, p99 seconds) within the panic window, oldest first
    latency: tuple[tuple[float, float], ...] = ()
    #: (time, recommended replicas) within the stabilization window; values strictly decrease,
    #: so the first entry is the window's maximum (older, smaller entries can never matter)
    recommendations: tuple[tuple[float, int], ...] = ()
    #: a burst blocks scale-down until then
    panic_until: float | None = None
    last_scale_time: float | None = None
    #: the last measured capacity per replica: still the best guess while no worker reports one
    #: (all restarting, or scaled to zero)
    capacity: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    replicas: int
    previous: int
    reason: Reason
    message: str
    state: PolicyState
    #: demand per replica target used, for status; None when capacity is unknown
    per_replica_tokens_per_second: float | None = None

    @property
    def scaled(self) -> bool:
        return self.replicas != self.previous


def _slo(spec: Autoscaling) -> float:
    return spec.p99_latency_slo_milliseconds / 1000


def per_replica_target(spec: Autoscaling, capacity: float | None) -> float | None:
    """Tokens/s one replica should carry: the fixed target, or capacity x utilization."""
    if spec.target_tokens_per_second is not None:
        return float(spec.target_tokens_per_second)
    return None if capacity is None else capacity * spec.target_utilization


def _usable(capacity: float | None) -> float | None:
    return capacity if capacity is not None and math.isfinite(capacity) and capacity > 0 else None


def decide(
    state: PolicyState,
    observation: Observation | None,
    spec: Autoscaling,
    replicas: int,
    now: float,
) -> Decision:
    """The replica count for `now`, given the fleet currently asks for `replicas`."""
    current = max(replicas, 0)
    if observation is None:
        return _hold(state, spec, current, now, Reason.NO_METRICS, "no metrics from the fleet")
    state, demand = _observed(state, observation, spec, now)
    load, latency, capacity = state.load, state.latency, state.capacity
    # Requests held at a gateway wait for a ready worker: at least one must exist, whatever the
    # capacity figure (none was ever measured for a fleet that started at zero).
    waiting = observation.held_requests > 0
    per_replica = per_replica_target(spec, capacity)
    if per_replica is None and waiting and current == 0:
        final = clamp(1, spec.min_replicas, spec.max_replicas)
        state = replace(state, last_scale_time=now if final != current else state.last_scale_time)
        why = f"{observation.held_requests:.0f} requests held at the gateways, no capacity known"
        return Decision(final, current, Reason.SCALE_UP_FOR_LOAD, f"0 -> {final}: {why}", state)
    if per_replica is None:
        return _hold(
            state, spec, current, now, Reason.CAPACITY_UNKNOWN, "no capacity measurement yet"
        )

    stable_rate = _mean(load)
    panic_rate = _panic_rate(load, demand, now, spec, current * per_replica)
    want_stable = _want(stable_rate, per_replica, current, spec.tolerance)
    want_panic = _want(panic_rate, per_replica, current, spec.tolerance)
    want = max(want_stable, want_panic, 1 if waiting else 0)
    panic_until = state.panic_until if state.panic_until and state.panic_until > now else None
    burst = want_panic > current and want_panic > want_stable
    if burst:
        panic_until = now + spec.stable_window_seconds
    if panic_until is not None and want < current:
        want, held = current, Reason.SCALE_DOWN_BLOCKED_BY_BURST
    else:
        held = Reason.WITHIN_TOLERANCE
    load_want = want

    p99 = latency[-1][1] if latency and latency[-1][0] == now else None
    want, held, latency_up = _for_latency(
        latency, p99, spec, (current, observation.ready_replicas), (want, held)
    )

    recommendations = _push_max(
        state.recommendations, now, want, spec.scale_down_stabilization_seconds
    )
    target = want
    if want < current:
        target = min(current, recommendations[0][1])
        if target > want:
            held = Reason.SCALE_DOWN_STABILIZING

    final = _within_rates(target, current, spec)

    reason, message = _explain(
        current=current,
        final=final,
        target=target,
        spec=spec,
        held=held,
        latency_up=latency_up,
        burst=burst and load_want == want_panic,
        demand=(stable_rate, panic_rate),
        per_replica=per_replica,
        p99=p99,
        held_requests=observation.held_requests,
    )
    new_state = PolicyState(
        load=load,
        latency=latency,
        recommendations=recommendations,
        panic_until=panic_until,
        last_scale_time=now if final != current else state.last_scale_time,
        capacity=capacity,
    )
    return Decision(final, current, reason, message, new_state, per_replica)


def _observed(
    state: PolicyState, observation: Observation, spec: Autoscaling, now: float
) -> tuple[PolicyState, float]:
    """`state` with this interval's demand, p99 and capacity in its windows, and the demand:
    tokens/s now plus the backlog drained over the stable window."""
    # A backlog is drained over the stable window: pods asked for during a burst are still
    # starting, and draining it faster would buy replicas that are idle once they are ready.
    demand = (
        max(observation.tokens_per_second, 0.0)
        + max(observation.queued_tokens + observation.held_tokens, 0.0) / spec.stable_window_seconds
    )
    load = (*_window(state.load, now, spec.stable_window_seconds), (now, demand))
    latency = _window(state.latency, now, spec.panic_window_seconds)
    if observation.p99_seconds is not None and observation.tokens_per_second > 0:
        latency += ((now, observation.p99_seconds),)
    capacity = _usable(observation.capacity_tokens_per_second) or state.capacity
    return replace(state, load=load, latency=latency, capacity=capacity), demand


def _panic_rate(
    load: tuple[tuple[float, float], ...],
    demand: float,
    now: float,
    spec: Autoscaling,
    fleet: float,
) -> float:
    """The demand the panic window sees; `fleet` is what the current replicas are sized for."""
    rate = _mean(_window(load, now, spec.panic_window_seconds))
    # A mean over the panic window lags half of it, so a latest interval far above the fleet
    # (beyond noise) counts alone; with no replicas any demand is a burst.
    if fleet <= 0 or demand >= BURST_RATIO * fleet:
        rate = max(rate, demand)
    return rate


def _for_latency(
    latency: tuple[tuple[float, float], ...],
    p99: float | None,
    spec: Autoscaling,
    replicas: tuple[int, int],
    wanted: tuple[int, Reason],
) -> tuple[int, Reason, bool]:
    """The replicas wanted once the p99 (this interval's, None without one) has its say, why a
    scale-down is held, and whether latency alone raised it; `replicas` is (current, ready)."""
    (current, ready), (want, held) = replicas, wanted
    if p99 is None:
        return want, held, False
    # One interval's p99 is noisy: force a scale-up only when every interval of the panic window
    # missed the SLO and latency is not falling (a backlog being drained by replicas that just
    # became ready needs no more of them); the latest interval alone blocks a scale-down.
    if min(v for _, v in latency) > _slo(spec) and p99 >= latency[0][1]:
        if ready >= current:
            step = max(1, math.ceil(current * LATENCY_STEP))
            return max(want, current + step), held, current + step > want
        if want < current:
            return current, Reason.WAITING_FOR_REPLICAS, False
    elif p99 > NEAR_SLO_FRACTION * _slo(spec) and want < current:
        return current, Reason.SCALE_DOWN_BLOCKED_BY_LATENCY, False
    return want, held, False


def _within_rates(target: int, current: int, spec: Autoscaling) -> int:
    """`target` within the spec's scale-up and scale-down rates, then its replica bounds."""
    limited = min(target, max(current + 1, math.ceil(current * spec.max_scale_up_rate)))
    # ceil: "at most halve" must never round down to more than halving; 1 -> 0 stays possible.
    floor = math.ceil(current / spec.max_scale_down_rate - 1e-9) if current > 1 else 0
    return clamp(max(limited, floor), spec.min_replicas, spec.max_replicas)


def _explain(
    *,
    current: int,
    final: int,
    target: int,
    spec: Autoscaling,
    held: Reason,
    latency_up: bool,
    burst: bool,
    demand: tuple[float, float],
    per_replica: float,
    p99: float | None,
    held_requests: float = 0.0,
) -> tuple[Reason, str]:
    stable_rate, panic_rate = demand
    latency = "n/a" if p99 is None else f"{p99 * 1000:.0f}ms"
    facts = (
        f"demand {stable_rate:.0f} tokens/s ({spec.stable_window_seconds:g}s), "
        f"{panic_rate:.0f} tokens/s ({spec.panic_window_seconds:g}s); "
        f"target {per_replica:.0f} tokens/s per replica; p99 {latency} "
        f"(SLO {_slo(spec) * 1000:.0f}ms)"
    )
    if held_requests > 0:
        facts += f"; {held_requests:.0f} requests held at the gateways for a ready worker"
    if not spec.min_replicas <= current <= spec.max_replicas and final == clamp(
        current, spec.min_replicas, spec.max_replicas
    ):
        return Reason.SCALE_TO_BOUNDS, (
            f"{current} -> {final}: outside [{spec.min_replicas}, {spec.max_replicas}]; {facts}"
        )
    limit = "" if final == target else f" (wanted {target}, limited by rate or bounds)"
    if final > current:
        if latency_up:
            reason = Reason.SCALE_UP_FOR_LATENCY
        elif burst:
            reason = Reason.SCALE_UP_FOR_BURST
        else:
            reason = Reason.SCALE_UP_FOR_LOAD
        return reason, f"{current} -> {final}{limit}: {facts}"
    if final < current:
        return Reason.SCALE_DOWN_FOR_LOAD, f"{current} -> {final}{limit}: {facts}"
    return held, f"stay at {current}: {facts}"


def _hold(
    state: PolicyState, spec: Autoscaling, current: int, now: float, reason: Reason, why: str
) -> Decision:
    # Without a usable signal only the bounds apply; the windows keep what they had.
    final = clamp(current, spec.min_replicas, spec.max_replicas)
    if final != current:
        reason, why = Reason.SCALE_TO_BOUNDS, f"outside [{spec.min_replicas}, {spec.max_replicas}]"
        state = replace(state, last_scale_time=now)
    return Decision(final, current, reason, f"{current} -> {final}: {why}", state)


def _want(rate: float, per_replica: float, current: int, tolerance: float) -> int:
    if current > 0 and abs(rate / (current * per_replica) - 1) <= tolerance:
        return current
    # The epsilon keeps an exact multiple (rate == k x per_replica) at k, not k + 1.
    return max(0, math.ceil(rate / per_replica - 1e-9))


def _window(
    points: tuple[tuple[float, float], ...], now: float, seconds: float
) -> tuple[tuple[float, float], ...]:
    # Points from the future (a clock that stepped back) would stick around; drop them too.
    return tuple(p for p in points if now - seconds < p[0] <= now)


def _mean(points: tuple[tuple[float, float], ...]) -> float:
    return sum(v for _, v in points) / len(points) if points else 0.0


def _push_max(
    points: tuple[tuple[float, int], ...], now: float, value: int, seconds: float
) -> tuple[tuple[float, int], ...]:
    """A sliding-window maximum: only entries larger than every later one are kept."""
    kept = [(now, value)]
    for p in reversed([p for p in points if now - seconds < p[0] <= now]):
        if p[1] > kept[-1][1]:
            kept.append(p)
    return tuple(reversed(kept))
