"""Graph buckets and the eager -> capture -> replay / eviction policy, without CUDA."""

from __future__ import annotations

import pytest

from embedfleet.worker.engine.graph_policy import (
    Action,
    BucketPolicy,
    Decision,
    GraphCache,
    GraphKey,
    graph_mode,
)


def test_token_buckets_round_up_in_two_steps() -> None:
    p = BucketPolicy()
    assert [p.tokens(n) for n in (1, 64, 65, 1000, 1024)] == [64, 64, 128, 1024, 1024]
    assert [p.tokens(n) for n in (1025, 1280, 1281, 16384)] == [1280, 1280, 1536, 16384]
    custom = BucketPolicy(token_step=32, token_switch=256, token_large_step=128)
    assert [custom.tokens(n) for n in (33, 256, 257)] == [64, 256, 384]
    with pytest.raises(ValueError, match="positive"):
        BucketPolicy(token_step=0)


def test_sequence_buckets_leave_a_slot_for_padding() -> None:
    p = BucketPolicy()
    assert [p.sequences(n) for n in (1, 2, 3, 4, 7, 8, 100)] == [2, 4, 4, 8, 8, 16, 128]
    assert p.key(100, 3) == GraphKey(128, 4)
    assert p.sequence_buckets(64, 512) == [2, 4, 8, 16, 32, 64, 128]
    assert p.sequence_buckets(4096, 6) == [2, 4, 8]


def test_lazy_first_use_eager_second_capture_then_replay() -> None:
    cache = GraphCache(mode="lazy", max_graphs=4)
    key = GraphKey(128, 4)
    assert cache.decide(key).action is Action.EAGER
    assert cache.decide(key).action is Action.CAPTURE
    assert cache.decide(key).action is Action.REPLAY
    assert cache.decide(key).action is Action.REPLAY
    assert cache.live == [key]


def test_lru_eviction_at_the_bound() -> None:
    cache = GraphCache(mode="lazy", max_graphs=2)
    a, b, c = GraphKey(64, 2), GraphKey(128, 2), GraphKey(192, 2)
    for k in (a, a, b, b):
        cache.decide(k)
    assert cache.live == [a, b]
    cache.decide(a)  # a is now the most recently used
    cache.decide(c)
    decision = cache.decide(c)
    assert decision == Decision(Action.CAPTURE, c, (b,))
    assert cache.live == [a, c]
    # An evicted bucket starts over: eager once, then captured again.
    assert cache.decide(b).action is Action.EAGER
    assert cache.decide(b).evict == (a,)


def test_off_and_eager_modes_never_capture_lazily() -> None:
    for mode in ("off", "eager"):
        cache = GraphCache(mode=mode, max_graphs=8)  # type: ignore[arg-type]
        key = GraphKey(64, 2)
        assert [cache.decide(key).action for _ in range(3)] == [Action.EAGER] * 3
    cache = GraphCache(mode="eager", max_graphs=1)
    first, second = GraphKey(64, 2), GraphKey(128, 4)
    assert cache.preload(first).action is Action.CAPTURE
    assert cache.decide(first) == Decision(Action.REPLAY, first)
    assert cache.preload(second).evict == (first,)
    # A smaller batch replays the smallest captured bucket that holds it.
    assert cache.decide(first) == Decision(Action.REPLAY, second)
    assert cache.decide(GraphKey(64, 8)).action is Action.EAGER
    assert cache.decide(GraphKey(192, 2)).action is Action.EAGER


def test_oversized_and_failed_buckets_stay_eager() -> None:
    cache = GraphCache(mode="lazy", max_graphs=8, max_tokens=1024)
    big = GraphKey(2048, 2)
    assert [cache.decide(big).action for _ in range(3)] == [Action.EAGER] * 3
    key = GraphKey(64, 2)
    cache.decide(key)
    assert cache.decide(key).action is Action.CAPTURE
    cache.forget(key)
    assert cache.live == []
    assert [cache.decide(key).action for _ in range(3)] == [Action.EAGER] * 3


def test_zero_graphs_means_always_eager() -> None:
    cache = GraphCache(mode="lazy", max_graphs=0)
    key = GraphKey(64, 2)
    assert [cache.decide(key).action for _ in range(3)] == [Action.EAGER] * 3


def test_graph_mode_types_the_setting() -> None:
    assert [graph_mode(name) for name in ("lazy", "eager", "off")] == ["lazy", "eager", "off"]
    with pytest.raises(ValueError, match="unknown CUDA graph mode"):
        graph_mode("on")
