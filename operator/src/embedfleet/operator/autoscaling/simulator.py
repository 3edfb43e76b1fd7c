"""Autoscaling simulator: replays load traces against a fleet model and scores scaling policies.

It lives next to the policy it simulates; `python -m embedfleet.bench autoscale` prints its table
(bench/src/embedfleet/bench/autoscale_sim.py).

The fleet model (one step per second, load spread evenly over ready replicas):
- a replica computes `capacity` tokens/s; work beyond the ready replicas' capacity queues;
- a worker batches whatever arrived while the previous batch ran, so a batch takes
  fixed / (1 - utilization) and a request waits up to two batches: p99 = 2 x fixed / (1 - rho)
  + (p99 request tokens / capacity) + queued tokens / (ready x capacity);
- a new pod serves only `start_seconds` after it was asked for, and costs from that moment.

Policies see what the operator sees, once per `interval` (5 s): offered tokens and requests per
second over the interval, the interval's p99, queued tokens, ready replicas, the workers' capacity
gauge (which reads a little low, as a warm-up measurement does). Compared in one run:
- ours: `embedfleet.operator.autoscaling.policy.decide`;
- hpa: requests/s per replica against a target tuned at 100 tokens per request (what a hand-tuned
  HPA on a request-rate metric does), 15 s sync, 10% tolerance, 300 s scale-down stabilization;
- kubeai: in-flight requests averaged over a 10-minute window, 10 s interval, a target of
  in-flight requests per replica tuned at 100 tokens per request (KubeAI's defaults).
The oracle knows each second's load and has instant pods: the least replicas meeting the SLO.
Scores: SLO attainment (share of seconds with p99 <= SLO), replica-hours against the oracle's
and against an instant policy holding the target utilization, scale events, and reversals (a
scale-down after a scale-up, or the other way round, within 10 minutes).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from embedfleet.operator.autoscaling.policy import Observation, PolicyState, decide
from embedfleet.operator.spec import Autoscaling

REVERSAL_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class Fleet:
    capacity: float = 10_000.0  # tokens/s one replica computes at saturation
    fixed_seconds: float = 0.02  # per-batch overhead (launch, pooling, reply)
    p99_request_tokens: float = 512.0
    start_seconds: float = 30.0  # scheduling + image + weights + warm-up
    gauge_error: float = 0.97  # the capacity gauge reads this fraction of the truth
    slo_seconds: float = 0.5

    def p99(self, load: float, ready: int, queued: float) -> float:
        if ready <= 0:
            return math.inf if load > 0 or queued > 0 else 0.0
        rho = min(load / (ready * self.capacity), 0.99)
        return (
            2 * self.fixed_seconds / (1 - rho)
            + self.p99_request_tokens / self.capacity
            + queued / (ready * self.capacity)
        )

    def max_utilization(self) -> float:
        """The utilization at which p99 meets the SLO exactly (no queue)."""
        budget = self.slo_seconds - self.p99_request_tokens / self.capacity
        return 1 - 2 * self.fixed_seconds / budget

    def oracle(self, load: float) -> int:
        return max(1, math.ceil(load / (self.capacity * self.max_utilization()) - 1e-9))


@dataclass(frozen=True, slots=True)
class Load:
    tokens_per_second: float
    tokens_per_request: float


Trace = Callable[[float], Load]


def steady(hours: float) -> Trace:
    return lambda t: Load(60_000.0, 100.0)


def diurnal(hours: float) -> Trace:
    # One day compressed into the run (slopes steeper than a real day); requests get longer at the
    # peak (document ingestion during business hours), which misleads request-count scalers.
    period = hours * 3600.0

    def load(t: float) -> Load:
        phase = (1 - math.cos(2 * math.pi * t / period)) / 2
        return Load(20_000.0 + 100_000.0 * phase, 80.0 + 120.0 * phase)

    return load


def step_burst(hours: float) -> Trace:
    # A bulk indexing job: 4x the tokens in long documents for a third of the run.
    start, end = hours * 3600.0 / 3, hours * 3600.0 * 2 / 3

    def load(t: float) -> Load:
        return Load(120_000.0, 400.0) if start <= t < end else Load(30_000.0, 100.0)

    return load


def spike(hours: float) -> Trace:
    # Every two hours (first at one hour): 2x within 10 s, held for 90 s. Beyond the headroom no
    # reactive policy avoids misses for detection + pod start + backlog drain (~50 s each here).
    def load(t: float) -> Load:
        into = (t - 3600.0) % 7200.0 if t >= 3600.0 else -1.0
        if 0 <= into < 100:
            ramp = min(into / 10.0, 1.0)
            return Load(40_000.0 * (1 + ramp), 100.0)
        return Load(40_000.0, 100.0)

    return load


def slow_ramp(hours: float) -> Trace:
    span = hours * 3600.0
    return lambda t: Load(10_000.0 + 150_000.0 * t / span, 100.0)


TRACES: dict[str, Callable[[float], Trace]] = {
    "steady": steady,
    "diurnal": diurnal,
    "step-burst": step_burst,
    "spike": spike,
    "slow-ramp": slow_ramp,
}


@dataclass(frozen=True, slots=True)
class Sample:
    """What a policy sees at one decision."""

    now: float
    tokens_per_second: float
    requests_per_second: float
    p99_seconds: float
    inflight_requests: float
    queued_tokens: float
    ready: int
    capacity_gauge: float


class Policy(Protocol):
    name: str
    interval: float

    def step(self, sample: Sample, current: int) -> int: ...


@dataclass
class Ours:
    spec: Autoscaling
    name: str = "ours"
    interval: float = 5.0
    state: PolicyState = field(default_factory=PolicyState)

    def step(self, sample: Sample, current: int) -> int:
        observation = Observation(
            tokens_per_second=sample.tokens_per_second,
            p99_seconds=sample.p99_seconds,
            capacity_tokens_per_second=sample.capacity_gauge,
            queued_tokens=sample.queued_tokens,
            ready_replicas=sample.ready,
        )
        decision = decide(self.state, observation, self.spec, current, sample.now)
        self.state = decision.state
        return decision.replicas


@dataclass
class HpaRequests:
    """An HPA on requests/s per pod, the target tuned at 100 tokens per request."""

    target_requests_per_second: float
    min_replicas: int
    max_replicas: int
    name: str = "hpa"
    interval: float = 15.0
    window: deque[tuple[float, float]] = field(default_factory=deque)
    history: deque[tuple[float, int]] = field(default_factory=deque)

    def step(self, sample: Sample, current: int) -> int:
        # rate(...[1m]) through the Prometheus adapter
        self.window.append((sample.now, sample.requests_per_second))
        while self.window[0][0] <= sample.now - 60:
            self.window.popleft()
        rate = sum(v for _, v in self.window) / len(self.window)
        ratio = rate / (max(sample.ready, 1) * self.target_requests_per_second)
        want = current if abs(ratio - 1) <= 0.1 else math.ceil(max(sample.ready, 1) * ratio)
        want = min(want, max(2 * current, current + 4))
        self.history.append((sample.now, want))
        while self.history[0][0] <= sample.now - 300:
            self.history.popleft()
        if want < current:
            want = min(current, max(v for _, v in self.history))
        return min(max(want, self.min_replicas), self.max_replicas)


@dataclass
class KubeAiAverage:
    """KubeAI's scaler: the moving average of in-flight requests over a window / target."""

    target_inflight: float
    min_replicas: int
    max_replicas: int
    name: str = "kubeai"
    interval: float = 10.0
    window_seconds: float = 600.0
    scale_down_delay: float = 30.0
    samples: deque[float] = field(default_factory=deque)
    last_up: float = -math.inf

    def step(self, sample: Sample, current: int) -> int:
        self.samples.append(sample.inflight_requests)
        while len(self.samples) > self.window_seconds / self.interval:
            self.samples.popleft()
        average = sum(self.samples) / len(self.samples)
        want = min(
            max(math.ceil(average / self.target_inflight), self.min_replicas), self.max_replicas
        )
        if want > current:
            self.last_up = sample.now
        elif want < current and sample.now - self.last_up < self.scale_down_delay:
            want = current
        return want


@dataclass(frozen=True, slots=True)
class Score:
    trace: str
    policy: str
    slo_attainment: float
    replica_hours: float
    oracle_hours: float
    #: replica-hours of an instant policy holding each second's load at the target utilization
    target_hours: float
    scale_events: int
    reversals: int

    @property
    def over_oracle(self) -> float:
        return self.replica_hours / self.oracle_hours - 1

    @property
    def over_target(self) -> float:
        return self.replica_hours / self.target_hours - 1


def run(
    trace_name: str,
    trace: Trace,
    policy: Policy,
    fleet: Fleet,
    seconds: int,
    seed: int,
    target_utilization: float = 0.8,
) -> Score:
    rng = random.Random(f"{trace_name}/{seed}")  # the same noise for every policy
    initial = fleet.oracle(trace(0).tokens_per_second / 0.9)
    pods: list[float] = [0.0] * initial  # times at which each pod becomes ready
    queued = 0.0
    ok = 0
    replica_seconds = 0.0
    oracle_seconds = target_seconds = 0.0
    per_replica_target = fleet.capacity * fleet.gauge_error * target_utilization
    events: list[tuple[float, int]] = []
    tokens = requests = 0.0
    worst = 0.0
    for second in range(seconds):
        now = float(second)
        load = trace(now)
        mean_requests = load.tokens_per_second / load.tokens_per_request
        # Poisson arrivals, and request sizes with a coefficient of variation of 1.
        noise = rng.gauss(0.0, math.sqrt(2.0 / max(mean_requests, 1.0)))
        arrived = max(0.0, load.tokens_per_second * (1 + noise))
        ready = sum(1 for p in pods if p <= now)
        served = min(arrived + queued, ready * fleet.capacity)
        queued = queued + arrived - served
        p99 = fleet.p99(arrived, ready, queued)
        ok += p99 <= fleet.slo_seconds
        replica_seconds += len(pods)
        oracle_seconds += fleet.oracle(arrived)
        target_seconds += max(1, math.ceil(arrived / per_replica_target))
        tokens += arrived
        requests += arrived / load.tokens_per_request
        worst = max(worst, p99)
        if (second + 1) % round(policy.interval) == 0:
            interval = policy.interval
            rps = requests / interval
            sample = Sample(
                now=now,
                tokens_per_second=tokens / interval,
                requests_per_second=rps,
                p99_seconds=worst,
                inflight_requests=rps * min(worst, 30.0) / 2,
                queued_tokens=queued,
                ready=ready,
                capacity_gauge=fleet.capacity * fleet.gauge_error,
            )
            tokens = requests = worst = 0.0
            want = policy.step(sample, len(pods))
            if want != len(pods):
                events.append((now, want - len(pods)))
            if want > len(pods):
                pods.extend([now + fleet.start_seconds] * (want - len(pods)))
            elif want < len(pods):
                # Starting pods go first (a Deployment removes unready pods before ready ones).
                pods = sorted(pods)[:want]
    return Score(
        trace=trace_name,
        policy=policy.name,
        slo_attainment=ok / seconds,
        replica_hours=replica_seconds / 3600,
        oracle_hours=oracle_seconds / 3600,
        target_hours=target_seconds / 3600,
        scale_events=len(events),
        reversals=_reversals(events),
    )


def _reversals(events: Sequence[tuple[float, int]]) -> int:
    return sum(
        1
        for (t0, d0), (t1, d1) in itertools.pairwise(events)
        if (d0 > 0) != (d1 > 0) and t1 - t0 < REVERSAL_SECONDS
    )


def ours_spec(max_replicas: int = 32) -> Autoscaling:
    """spec.autoscaling as a user would write it: the CRD's defaults but for maxReplicas."""
    return Autoscaling(enabled=True, max_replicas=max_replicas)


def policies(fleet: Fleet, max_replicas: int = 32) -> list[Callable[[], Policy]]:
    # The baselines' targets are what an operator would tune at 100 tokens per request and 80%
    # utilization: right for some traffic, wrong once requests get longer or shorter.
    per_replica_requests = 0.8 * fleet.capacity / 100.0
    latency_at_target = fleet.p99(0.8 * fleet.capacity, 1, 0.0)
    return [
        lambda: Ours(ours_spec(max_replicas)),
        lambda: HpaRequests(per_replica_requests, 1, max_replicas),
        lambda: KubeAiAverage(per_replica_requests * latency_at_target / 2, 1, max_replicas),
    ]


def simulate(
    hours: float = 4.0, seed: int = 7, fleet: Fleet | None = None, traces: Sequence[str] = ()
) -> list[Score]:
    fleet = fleet or Fleet()
    seconds = int(hours * 3600)
    scores = []
    for name in traces or TRACES:
        trace = TRACES[name](hours)
        for make in policies(fleet):
            scores.append(run(name, trace, make(), fleet, seconds, seed))
    return scores
