"""FCFS batching decisions, without a server: order, budgets, large requests, drops."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest

from embedfleet.worker.scheduler import (
    Admission,
    Budget,
    DropReason,
    FcfsQueue,
    QueueFullError,
    admit,
    paced,
)


@dataclass(eq=False)
class Req:
    name: str
    tokens: int
    sequences: int = 1
    cancelled: bool = False
    deadline: float = float("inf")

    def drop_reason(self, now: float) -> DropReason | None:
        if now >= self.deadline:
            return DropReason.DEADLINE
        return DropReason.CANCELLED if self.cancelled else None


BUDGET = Budget(max_tokens=100, max_sequences=4, hard_max_tokens=400)


def queue_of(*reqs: Req, max_requests: int = 100) -> FcfsQueue[Req]:
    q: FcfsQueue[Req] = FcfsQueue(BUDGET, max_requests)
    for r in reqs:
        q.push(r)
    return q


def names(batch_items: list[Req]) -> list[str]:
    return [r.name for r in batch_items]


def drain(q: FcfsQueue[Req], now: float = 0.0) -> list[list[str]]:
    out = []
    while len(q):
        batch = q.next_batch(now)
        if batch.items:
            out.append(names(batch.items))
    return out


def test_takes_arrival_order_until_the_next_would_exceed_the_token_budget() -> None:
    q = queue_of(Req("a", 40), Req("b", 50), Req("c", 20), Req("d", 10))
    batch = q.next_batch(0.0)
    assert names(batch.items) == ["a", "b"]
    assert batch.tokens == 90
    # "d" (10) would still fit beside "a"+"b" but comes after "c": no skipping ahead.
    assert names(q.next_batch(0.0).items) == ["c", "d"]


def test_exactly_full_budget_is_allowed() -> None:
    q = queue_of(Req("a", 60), Req("b", 40), Req("c", 1))
    assert names(q.next_batch(0.0).items) == ["a", "b"]


def test_sequence_cap_closes_a_batch() -> None:
    q = queue_of(Req("a", 4, sequences=3), Req("b", 4, sequences=2), Req("c", 4, sequences=1))
    assert drain(q) == [["a"], ["b", "c"]]


def test_request_over_budget_runs_alone_in_its_turn() -> None:
    q = queue_of(Req("a", 30), Req("big", 250), Req("b", 30))
    assert drain(q) == [["a"], ["big"], ["b"]]


def test_request_over_sequence_cap_runs_alone() -> None:
    q = queue_of(Req("many", 10, sequences=9), Req("b", 10))
    assert drain(q) == [["many"], ["b"]]


def test_large_request_is_not_starved_by_later_small_ones() -> None:
    q = queue_of(*(Req(f"s{i}", 30) for i in range(3)), Req("big", 300))
    first = q.next_batch(0.0)
    assert names(first.items) == ["s0", "s1", "s2"]
    for i in range(3, 50):  # a stream of small requests keeps arriving
        q.push(Req(f"s{i}", 30))
    assert names(q.next_batch(0.0).items) == ["big"]


def test_dead_requests_are_dropped_without_using_budget() -> None:
    q = queue_of(
        Req("gone", 90, cancelled=True),
        Req("a", 60),
        Req("late", 30, deadline=5.0),
        Req("b", 40),
        Req("c", 10),
    )
    batch = q.next_batch(now=10.0)
    assert names(batch.items) == ["a", "b"]
    assert [(r.name, why) for r, why in batch.dropped] == [
        ("gone", DropReason.CANCELLED),
        ("late", DropReason.DEADLINE),
    ]
    assert q.tokens == 10
    assert len(q) == 1


def test_dead_request_right_after_a_full_batch_is_dropped_on_the_way() -> None:
    q = queue_of(Req("a", 100), Req("gone", 10, cancelled=True), Req("b", 5))
    batch = q.next_batch(0.0)
    assert names(batch.items) == ["a"]
    assert [r.name for r, _ in batch.dropped] == ["gone"]
    assert names(q.next_batch(0.0).items) == ["b"]


def test_queue_only_of_dead_requests_yields_an_empty_batch_with_drops() -> None:
    q = queue_of(Req("x", 5, cancelled=True), Req("y", 5, cancelled=True))
    batch = q.next_batch(0.0)
    assert batch.items == []
    assert len(batch.dropped) == 2
    assert len(q) == 0
    assert q.tokens == 0


def test_queue_full() -> None:
    q = queue_of(Req("a", 1), Req("b", 1), max_requests=2)
    with pytest.raises(QueueFullError):
        q.push(Req("c", 1))
    q.next_batch(0.0)
    q.push(Req("c", 1))


def test_admission_classes() -> None:
    assert admit(100, 4, BUDGET) is Admission.SHARE
    assert admit(101, 1, BUDGET) is Admission.ALONE
    assert admit(10, 5, BUDGET) is Admission.ALONE
    assert admit(400, 1, BUDGET) is Admission.ALONE
    assert admit(401, 1, BUDGET) is Admission.REJECT


def test_budget_rejects_inconsistent_limits() -> None:
    with pytest.raises(ValueError, match="hard"):
        Budget(max_tokens=100, max_sequences=4, hard_max_tokens=50)
    with pytest.raises(ValueError, match="positive"):
        Budget(max_tokens=0, max_sequences=4, hard_max_tokens=50)


def test_random_streams_keep_every_invariant() -> None:
    """Order preserved, budgets kept (or a lone request), batches maximal, tokens accounted."""
    rng = random.Random(7)
    for _ in range(200):
        reqs = [
            Req(
                str(i),
                rng.choice([1, 5, 20, 60, 99, 100, 150, 399]),
                sequences=rng.randint(1, 6),
                cancelled=rng.random() < 0.1,
            )
            for i in range(rng.randint(1, 30))
        ]
        q = queue_of(*reqs)
        order: list[Req] = []
        batches: list[list[Req]] = []
        while len(q):
            batch = q.next_batch(0.0)
            assert all(r.cancelled for r, _ in batch.dropped)
            if batch.items:
                batches.append(batch.items)
                order.extend(batch.items)
            tokens = sum(r.tokens for r in batch.items)
            seqs = sum(r.sequences for r in batch.items)
            assert (tokens <= 100 and seqs <= 4) or len(batch.items) == 1
            assert q.tokens == sum(r.tokens for r in q)
        assert order == [r for r in reqs if not r.cancelled]
        for this, nxt in itertools.pairwise(batches):
            head = nxt[0]
            tokens = sum(r.tokens for r in this)
            seqs = sum(r.sequences for r in this)
            assert tokens + head.tokens > 100 or seqs + head.sequences > 4


def test_a_slow_devices_batches_hold_about_a_second_of_work() -> None:
    budget = Budget(16384, 512, 65536)
    # A shared CPU at 1,500 tokens/s: a full batch was ~11 s that no other worker could take over.
    slow = paced(budget, capacity=1500.0, seconds=1.0)
    assert slow.max_tokens == 1500
    assert (slow.max_sequences, slow.hard_max_tokens) == (512, 65536)  # limits stay as set
    queue: FcfsQueue[Req] = FcfsQueue(slow, 100)
    for i in range(8):
        queue.push(Req(f"r{i}", 500))
    assert [r.name for r in queue.next_batch(0.0).items] == ["r0", "r1", "r2"]


def test_pacing_leaves_fast_devices_unknown_capacity_and_tiny_budgets_alone() -> None:
    budget = Budget(16384, 512, 65536)
    assert paced(budget, capacity=200_000.0, seconds=1.0) == budget  # a GPU
    assert paced(budget, capacity=0.0, seconds=1.0) == budget  # not measured
    assert paced(budget, capacity=1500.0, seconds=0.0) == budget  # switched off
    assert paced(budget, capacity=100.0, seconds=1.0).max_tokens == 512  # the floor
