from __future__ import annotations

import random
from collections import Counter

from embedfleet.gateway.balancer import Balancer, choose


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _balancer(n: int, clock: Clock | None = None) -> Balancer:
    b = Balancer(eject_seconds=5, rng=random.Random(1), clock=clock or Clock())
    b.set_addresses([f"w{i}" for i in range(n)])
    for e in b.endpoints.values():
        e.ready = True
    return b


def test_choose_prefers_the_lighter_of_two() -> None:
    rng = random.Random(0)
    picks = Counter(choose([0, 1000, 1000], rng) for _ in range(3000))
    # Index 0 wins whenever it is sampled (2 of 3 pairs); the heavy ones only against each other.
    assert picks[0] > 1800
    assert choose([7], rng) == 0


def test_power_of_two_spreads_equal_load() -> None:
    b = _balancer(4)
    counts: Counter[str] = Counter()
    for _ in range(400):
        e = b.pick()
        assert e is not None
        e.outstanding_tokens += 10  # never released: load accumulates
        counts[e.address] += 1
    assert max(counts.values()) - min(counts.values()) <= 2


def test_ejected_worker_is_skipped_until_its_time_is_up() -> None:
    clock = Clock()
    b = _balancer(2, clock)
    assert b.eject(b.endpoints["w0"]) is True
    assert b.eject(b.endpoints["w0"]) is False  # already out: counted once
    assert {b.pick().address for _ in range(20)} == {"w1"}  # type: ignore[union-attr]
    clock.now += 5.1
    assert {b.pick().address for _ in range(50)} == {"w0", "w1"}  # type: ignore[union-attr]


def test_exclusion_and_fallback_to_ejected() -> None:
    b = _balancer(2)
    b.eject(b.endpoints["w1"])
    # With the only healthy worker excluded (a retry), an ejected one is better than nothing.
    assert b.pick(exclude={"w0"}).address == "w1"  # type: ignore[union-attr]
    assert b.pick(exclude={"w0", "w1"}) is None


def test_unready_workers_are_never_picked() -> None:
    b = _balancer(2)
    b.endpoints["w0"].ready = False
    assert {b.pick().address for _ in range(20)} == {"w1"}  # type: ignore[union-attr]
    b.endpoints["w1"].ready = False
    assert b.pick() is None


def test_set_addresses_adds_and_removes() -> None:
    b = _balancer(2)
    added, removed = b.set_addresses(["w1", "w2"])
    assert (added, removed) == ({"w2"}, {"w0"})
    assert sorted(b.endpoints) == ["w1", "w2"]
    assert b.endpoints["w1"].ready  # kept its state
    assert not b.endpoints["w2"].ready  # new ones wait for their first probe
