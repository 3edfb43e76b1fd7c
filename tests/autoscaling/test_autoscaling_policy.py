"""The scaling policy: table-driven cases for each rule, then properties over random histories."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from embedfleet.operator.autoscaling.policy import (
    NEAR_SLO_FRACTION,
    Decision,
    Observation,
    PolicyState,
    Reason,
    decide,
)
from embedfleet.operator.spec import Autoscaling

CAP = 10_000.0  # measured capacity per replica; the target is 8,000 tokens/s at utilization 0.8
SPEC = Autoscaling(enabled=True, min_replicas=1, max_replicas=20)


def obs(
    tps: float,
    p99: float | None = 0.1,
    *,
    cap: float | None = CAP,
    queued: float = 0.0,
    ready: int = 100,
) -> Observation:
    return Observation(tps, p99, cap, queued, ready)


def run(
    observations: list[Observation | None],
    replicas: int,
    spec: Autoscaling = SPEC,
    *,
    start: float = 1000.0,
    step: float = 5.0,
    state: PolicyState | None = None,
) -> list[Decision]:
    """Feeds observations every `step` seconds, applying each decision, like the operator."""
    state = state or PolicyState()
    decisions = []
    for i, o in enumerate(observations):
        d = decide(state, o, spec, replicas, start + i * step)
        decisions.append(d)
        state, replicas = d.state, d.replicas
    return decisions


# -- single decisions from an empty history ------------------------------------------------------

CASES = [
    # (name, observation, current replicas, spec, expected replicas, expected reason)
    ("exact fit stays", obs(40_000), 5, SPEC, 5, Reason.WITHIN_TOLERANCE),
    ("within +10% stays", obs(43_900), 5, SPEC, 5, Reason.WITHIN_TOLERANCE),
    ("above +10% scales up", obs(44_500), 5, SPEC, 6, Reason.SCALE_UP_FOR_LOAD),
    ("double load doubles", obs(80_000), 5, SPEC, 10, Reason.SCALE_UP_FOR_LOAD),
    ("up rate limit 2x", obs(400_000), 5, SPEC, 10, Reason.SCALE_UP_FOR_LOAD),
    ("up to max", obs(400_000), 15, SPEC, 20, Reason.SCALE_UP_FOR_LOAD),
    ("from one by +1 at least", obs(100_000), 1, replace(SPEC, max_scale_up_rate=1.0), 2,
     Reason.SCALE_UP_FOR_LOAD),
    ("within -10% stays", obs(36_500), 5, SPEC, 5, Reason.WITHIN_TOLERANCE),
    ("no stabilization: down", obs(24_000), 5, replace(SPEC, scale_down_stabilization_seconds=0),
     3, Reason.SCALE_DOWN_FOR_LOAD),
    ("down rate limit halves", obs(8_000), 10, replace(SPEC, scale_down_stabilization_seconds=0),
     5, Reason.SCALE_DOWN_FOR_LOAD),
    ("down to min", obs(0), 2, replace(SPEC, scale_down_stabilization_seconds=0), 1,
     Reason.SCALE_DOWN_FOR_LOAD),
    ("to zero when min is 0", obs(0, None), 1,
     replace(SPEC, min_replicas=0, scale_down_stabilization_seconds=0), 0,
     Reason.SCALE_DOWN_FOR_LOAD),
    ("from zero on traffic", obs(1_000), 0, replace(SPEC, min_replicas=0), 1,
     Reason.SCALE_UP_FOR_LOAD),
    ("fixed target wins over capacity", obs(40_000), 5,
     replace(SPEC, target_tokens_per_second=4_000), 10, Reason.SCALE_UP_FOR_LOAD),
    ("utilization 0.5 doubles the fleet", obs(40_000), 5,
     replace(SPEC, target_utilization=0.5), 8, Reason.SCALE_UP_FOR_LOAD),
    ("backlog counts as demand", obs(40_000, queued=960_000), 5, SPEC, 7,
     Reason.SCALE_UP_FOR_LOAD),
    ("p99 near the SLO blocks scale-down", obs(8_000, p99=0.45), 5,
     replace(SPEC, scale_down_stabilization_seconds=0), 5, Reason.SCALE_DOWN_BLOCKED_BY_LATENCY),
    ("p99 above the SLO forces scale-up", obs(8_000, p99=0.9), 4, SPEC, 5,
     Reason.SCALE_UP_FOR_LATENCY),
    ("p99 above the SLO adds 25%", obs(8_000, p99=0.9), 12, SPEC, 15,
     Reason.SCALE_UP_FOR_LATENCY),
    ("p99 above the SLO while pods start: wait", obs(8_000, p99=0.9, ready=3), 5,
     replace(SPEC, scale_down_stabilization_seconds=0), 5, Reason.WAITING_FOR_REPLICAS),
    ("p99 without traffic is ignored", obs(0, p99=5.0), 3,
     replace(SPEC, scale_down_stabilization_seconds=0), 2, Reason.SCALE_DOWN_FOR_LOAD),
    ("unknown capacity holds", obs(80_000, cap=None), 5, SPEC, 5, Reason.CAPACITY_UNKNOWN),
    ("zero capacity holds", obs(80_000, cap=0.0), 5, SPEC, 5, Reason.CAPACITY_UNKNOWN),
    ("NaN capacity holds", obs(80_000, cap=math.nan), 5, SPEC, 5, Reason.CAPACITY_UNKNOWN),
    ("no metrics hold", None, 5, SPEC, 5, Reason.NO_METRICS),
    ("no metrics, above max: clamp", None, 25, SPEC, 20, Reason.SCALE_TO_BOUNDS),
    ("above max: clamp", obs(400_000), 25, SPEC, 20, Reason.SCALE_TO_BOUNDS),
    ("below min: clamp", obs(0), 0, replace(SPEC, min_replicas=2), 2, Reason.SCALE_TO_BOUNDS),
]  # fmt: skip


@pytest.mark.parametrize(
    ("observation", "replicas", "spec", "expected", "reason"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_single_decision(
    observation: Observation | None, replicas: int, spec: Autoscaling, expected: int, reason: Reason
) -> None:
    d = decide(PolicyState(), observation, spec, replicas, 1000.0)
    assert (d.replicas, d.reason) == (expected, reason), d.message
    assert d.previous == replicas
    assert d.scaled == (expected != replicas)
    assert d.message


# -- windows and memory ---------------------------------------------------------------------------


def test_scale_down_waits_for_the_stabilization_window() -> None:
    spec = replace(SPEC, scale_down_stabilization_seconds=60)
    # 8 replicas busy, then load falls to a quarter: nothing before the window has passed.
    ds = run([obs(64_000)] * 3 + [obs(16_000)] * 60, 8, spec)
    times = [1000.0 + 5 * i for i in range(len(ds))]
    first_down = next(t for t, d in zip(times, ds, strict=True) if d.replicas < 8)
    assert first_down - times[2] >= 60
    assert all(d.reason == Reason.SCALE_DOWN_STABILIZING for d in ds[4:13])
    assert ds[-1].replicas == 2


def test_scale_down_stabilization_uses_the_highest_recommendation() -> None:
    spec = replace(SPEC, scale_down_stabilization_seconds=30, stable_window_seconds=10)
    # After 10 replicas' worth of load, 6 then 2: the fleet steps down to 6 first, not 2.
    ds = run([obs(80_000)] * 2 + [obs(48_000)] * 3 + [obs(16_000)] * 12, 10, spec)
    sizes = [d.replicas for d in ds]
    assert 6 in sizes
    assert sizes.index(6) < sizes.index(2)


def test_stable_window_smooths_a_single_dip() -> None:
    # One interval at half the load must not scale down a fleet (stable mean barely moves).
    spec = replace(SPEC, scale_down_stabilization_seconds=0)
    ds = run([obs(40_000)] * 12 + [obs(20_000)] + [obs(40_000)] * 3, 5, spec)
    assert [d.replicas for d in ds] == [5] * 16


def test_burst_scales_up_within_one_interval_and_blocks_scale_down() -> None:
    spec = replace(SPEC, scale_down_stabilization_seconds=0)
    ds = run([obs(40_000)] * 12 + [obs(80_000)] + [obs(20_000)] * 12, 5, spec)
    burst = ds[12]
    assert burst.replicas == 10
    assert burst.reason == Reason.SCALE_UP_FOR_BURST
    # For one stable window (60 s = 12 intervals) after the burst, no scale-down.
    assert all(d.replicas == 10 for d in ds[13:24])
    assert ds[13].reason == Reason.SCALE_DOWN_BLOCKED_BY_BURST
    assert ds[24].replicas < 10


def test_latency_guard_needs_the_whole_panic_window() -> None:
    # One bad interval alone blocks scale-down but does not add replicas.
    ds = run([obs(40_000)] * 4 + [obs(40_000, p99=0.9)] + [obs(40_000, p99=0.9)], 5)
    assert ds[4].replicas == 5
    assert ds[5].replicas == 7  # two intervals (the panic window) over the SLO
    assert ds[5].reason == Reason.SCALE_UP_FOR_LATENCY


def test_latency_guard_skips_a_draining_backlog() -> None:
    # p99 above the SLO but falling: replicas just became ready and drain the queue.
    ds = run([obs(40_000, p99=3.0), obs(40_000, p99=1.5), obs(40_000, p99=0.9)], 5)
    assert ds[0].reason == Reason.SCALE_UP_FOR_LATENCY
    assert ds[2].replicas == ds[1].replicas == ds[0].replicas


def test_latency_guard_repeats_once_replicas_are_ready() -> None:
    # A wrong capacity figure (load looks like 2.5 replicas' worth) but p99 keeps missing.
    spec = replace(SPEC, scale_down_stabilization_seconds=0)
    state, replicas, sizes = PolicyState(), 3, []
    for i in range(12):
        ready = replicas if i % 3 == 2 else replicas - 1  # new pods become ready later
        d = decide(state, obs(20_000, p99=0.9, ready=ready), spec, replicas, 1000.0 + 5 * i)
        state, replicas = d.state, d.replicas
        sizes.append(replicas)
    assert sizes == sorted(sizes)
    assert sizes[-1] >= 6


def test_remembers_capacity_while_no_worker_reports_one() -> None:
    # Measured once; then every worker restarts (gauge 0 until warm-up) under rising load.
    spec = replace(SPEC, min_replicas=0, scale_down_stabilization_seconds=0)
    ds = run([obs(40_000), obs(80_000, cap=0.0), obs(80_000, cap=None)], 5, spec)
    assert ds[1].reason != Reason.CAPACITY_UNKNOWN
    assert ds[1].replicas == 10
    # Scaled to zero, no worker left to measure: gateway traffic still brings one back.
    d = decide(ds[-1].state, obs(5_000, cap=None, ready=0), spec, 0, 2000.0)
    assert (d.replicas, d.reason) == (1, Reason.SCALE_UP_FOR_LOAD)


def test_requests_held_at_zero_wake_the_fleet_without_any_capacity_measured() -> None:
    # A fleet that started at zero never measured a capacity; the gateways hold two requests.
    spec = replace(SPEC, min_replicas=0, max_replicas=4)
    held = Observation(0.0, None, None, 0.0, 0, held_requests=2, held_tokens=30)
    d = decide(PolicyState(), held, spec, 0, 1000.0)
    assert (d.replicas, d.reason) == (1, Reason.SCALE_UP_FOR_LOAD)
    assert "held" in d.message
    # Nothing held, nothing measured: the fleet stays at zero.
    d = decide(PolicyState(), Observation(0.0), spec, 0, 1000.0)
    assert d.replicas == 0
    # Bounded by maxReplicas like every decision.
    d = decide(PolicyState(), held, replace(spec, max_replicas=0), 0, 1000.0)
    assert d.replicas == 0


def test_held_requests_keep_the_last_worker_and_count_as_backlog() -> None:
    spec = replace(SPEC, min_replicas=0, scale_down_stabilization_seconds=0)
    # The one worker went unready while requests wait for it: never scale it away.
    held = Observation(0.0, None, CAP, 0.0, 0, held_requests=1, held_tokens=10)
    assert decide(PolicyState(), held, spec, 1, 1000.0).replicas == 1
    assert decide(PolicyState(), replace(held, held_requests=0, held_tokens=0), spec, 1,
                  1000.0).replicas == 0  # fmt: skip
    # Held tokens are demand drained over the stable window, like a worker's queue.
    big = Observation(0.0, None, CAP, 0.0, 0, held_requests=100, held_tokens=60 * 24_000)
    d = decide(PolicyState(), big, spec, 2, 1000.0)
    assert d.replicas == 3
    assert "100 requests held" in d.message


def test_recovers_after_clock_steps_back() -> None:
    ds = run([obs(40_000)] * 5, 5)
    state = ds[-1].state
    d = decide(state, obs(40_000), SPEC, 5, 500.0)  # far in the past of every sample
    assert d.replicas == 5
    assert all(t <= 500.0 for t, _ in d.state.load)


def test_windows_stay_bounded() -> None:
    spec = Autoscaling(
        enabled=True, min_replicas=1, max_replicas=50, scale_down_stabilization_seconds=300
    )
    rng = random.Random(3)
    ds = run([obs(rng.uniform(0, 400_000)) for _ in range(2000)], 5, spec)
    for d in ds:
        assert len(d.state.load) <= spec.stable_window_seconds / 5
        assert len(d.state.latency) <= spec.panic_window_seconds / 5
        assert len(d.state.recommendations) <= spec.scale_down_stabilization_seconds / 5
        values = [n for _, n in d.state.recommendations]
        assert values == sorted(values, reverse=True)
        assert len(set(values)) == len(values)


# -- properties over random histories -------------------------------------------------------------


def random_spec(rng: random.Random) -> Autoscaling:
    low = rng.randint(0, 5)
    stable = rng.choice([10, 30, 60, 120])
    return Autoscaling(
        enabled=True,
        min_replicas=low,
        max_replicas=low + rng.randint(0, 40),
        target_tokens_per_second=rng.choice([None, None, rng.randint(500, 20_000)]),
        target_utilization=rng.uniform(0.3, 1.0),
        p99_latency_slo_milliseconds=rng.randint(50, 2000),
        panic_window_seconds=rng.randint(1, stable),
        stable_window_seconds=stable,
        scale_down_stabilization_seconds=rng.choice([0, 30, 300]),
        max_scale_up_rate=rng.uniform(1, 4),
        max_scale_down_rate=rng.uniform(1, 4),
        tolerance=rng.uniform(0, 0.5),
    )


def random_observation(rng: random.Random, replicas: int) -> Observation | None:
    if rng.random() < 0.05:
        return None
    return Observation(
        tokens_per_second=rng.choice([0.0, rng.uniform(0, 500_000)]),
        p99_seconds=rng.choice([None, rng.uniform(0, 3)]),
        capacity_tokens_per_second=rng.choice([None, 0.0, rng.uniform(100, 50_000)]),
        queued_tokens=rng.choice([0.0, rng.uniform(0, 1e6)]),
        ready_replicas=rng.randint(0, replicas + 1),
    )


def random_walks(seed: int, steps: int = 60):  # type: ignore[no-untyped-def]
    """(spec, state, observation, replicas, now, decision) along random operator runs."""
    rng = random.Random(seed)
    spec = random_spec(rng)
    state, replicas, now = PolicyState(), rng.randint(0, 50), 1e9
    for _ in range(steps):
        now += rng.choice([1.0, 5.0, 5.0, 5.0, 30.0])
        o = random_observation(rng, replicas)
        d = decide(state, o, spec, replicas, now)
        yield spec, state, o, replicas, now, d
        state = d.state
        # Sometimes someone else changes the count (kubectl scale, a spec edit).
        replicas = d.replicas if rng.random() > 0.05 else rng.randint(0, 60)


SEEDS = range(300)


@pytest.mark.parametrize("seed", SEEDS)
def test_invariants(seed: int) -> None:
    for spec, state, o, replicas, now, d in random_walks(seed):
        # Within bounds, always.
        assert spec.min_replicas <= d.replicas <= spec.max_replicas
        # Pure: the same inputs give the same decision.
        assert decide(state, o, spec, replicas, now) == d
        in_bounds = spec.min_replicas <= replicas <= spec.max_replicas
        if in_bounds:
            # Rate limits both ways.
            assert d.replicas <= max(replicas + 1, math.ceil(replicas * spec.max_scale_up_rate))
            if replicas > 1:
                assert d.replicas >= math.ceil(replicas / spec.max_scale_down_rate - 1e-9)
        known = (o is not None and o.capacity_tokens_per_second) or state.capacity
        if o is None or (spec.target_tokens_per_second is None and not known):
            if in_bounds:
                assert d.replicas == replicas  # no signal: hold
            continue
        latest_p99 = o.p99_seconds if o.tokens_per_second > 0 else None
        if (
            in_bounds
            and latest_p99 is not None
            and latest_p99 > NEAR_SLO_FRACTION * spec.p99_latency_slo_milliseconds / 1000
        ):
            assert d.replicas >= replicas, "p99 near or above the SLO never scales down"
        if in_bounds and d.replicas < replicas:
            # A scale-down respects every recommendation of the stabilization window.
            window = [
                n
                for t, n in state.recommendations
                if now - t < spec.scale_down_stabilization_seconds
            ]
            assert d.replicas >= min(replicas, max(window, default=0))
            assert state.panic_until is None or state.panic_until <= now
        assert d.state.capacity is None or d.state.capacity > 0
        if d.scaled:
            assert d.state.last_scale_time == now
        else:
            assert d.state.last_scale_time == state.last_scale_time  # fmt: skip


@pytest.mark.parametrize("seed", range(100))
def test_more_load_never_means_fewer_replicas(seed: int) -> None:
    rng = random.Random(seed)
    spec = replace(random_spec(rng), target_tokens_per_second=None)
    for _, state, o, replicas, now, _d in random_walks(seed, steps=30):
        if o is None:
            continue
        more = replace(o, tokens_per_second=o.tokens_per_second * rng.uniform(1, 3) + 1)
        low = decide(state, o, spec, replicas, now).replicas
        high = decide(state, more, spec, replicas, now).replicas
        assert high >= low


@pytest.mark.parametrize("seed", range(20))
def test_steady_noisy_load_never_oscillates(seed: int) -> None:
    """Poisson-like noise (a few % per interval) around a fixed load: at most one change."""
    rng = random.Random(seed)
    load = rng.uniform(5_000, 300_000)
    per_replica = 0.8 * CAP
    replicas = max(1, round(load / per_replica))
    spec = Autoscaling(enabled=True, min_replicas=1, max_replicas=100)
    ds = run(
        [obs(load * (1 + rng.gauss(0, 0.03)), p99=rng.uniform(0.1, 0.3)) for _ in range(720)],
        replicas,
        spec,
    )
    changes = [d for d in ds if d.scaled]
    assert len(changes) <= 1, [(d.previous, d.replicas, d.reason) for d in changes]
    assert (
        ds[-1].replicas == math.ceil(load / per_replica)
        or abs(load / (ds[-1].replicas * per_replica) - 1) <= spec.tolerance
    )
