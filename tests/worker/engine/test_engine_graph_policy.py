"""Graph buckets and the eager -> capture -> replay / eviction policy, without CUDA."""

from __future__ import annotations

import numpy as np
import pytest

from embedfleet.common.codec import Tokens
from embedfleet.worker.engine.batch import pack, padding_lengths
from embedfleet.worker.engine.graph_policy import (
    Action,
    BucketPolicy,
    Decision,
    GraphCache,
    GraphKey,
    graph_mode,
    graphs_plan,
    lone_keys,
    warmup_plan,
)

LINEAR = BucketPolicy(token_scheme="linear", sequence_scheme="pow2")


def test_token_buckets_round_up_in_two_steps() -> None:
    p = LINEAR
    assert [p.tokens(n) for n in (1, 64, 65, 1000, 1024)] == [64, 64, 128, 1024, 1024]
    assert [p.tokens(n) for n in (1025, 1280, 1281, 16384)] == [1280, 1280, 1536, 16384]
    custom = BucketPolicy(
        token_scheme="linear", token_step=32, token_switch=256, token_large_step=128
    )
    assert [custom.tokens(n) for n in (33, 256, 257)] == [64, 256, 384]
    with pytest.raises(ValueError, match="positive"):
        BucketPolicy(token_step=0)


def test_sequence_buckets_leave_a_slot_for_padding() -> None:
    p = LINEAR
    got = [p.sequences(n, 64, 63, 64) for n in (1, 2, 3, 4, 7, 8, 100)]
    assert got == [2, 4, 4, 8, 8, 16, 128]
    assert p.key(100, 3, 40) == GraphKey(128, 4, 128)
    assert p.key(128, 4, 40) == GraphKey(128, 4, 128)  # no padding: no padding slot needed
    assert p.key(100, 4, 40) == GraphKey(128, 8, 128)
    assert [k.sequences for k in p.keys_for(64)] == [2, 4, 8, 16, 32, 64, 128]
    # up to 4095 padding tokens in sequences of at most 512: 512 + 8 slots
    assert [k.sequences for k in p.keys_for(4096)] == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def test_lazy_first_use_eager_second_capture_then_replay() -> None:
    cache = GraphCache(mode="lazy", max_graphs=4)
    key = GraphKey(128, 4, 128)
    assert cache.decide(key).action is Action.EAGER
    assert cache.decide(key).action is Action.CAPTURE
    assert cache.decide(key).action is Action.REPLAY
    assert cache.decide(key).action is Action.REPLAY
    assert cache.live == [key]


def test_lru_eviction_at_the_bound() -> None:
    cache = GraphCache(mode="lazy", max_graphs=2)
    a, b, c = GraphKey(64, 2, 64), GraphKey(128, 2, 128), GraphKey(192, 2, 192)
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
        key = GraphKey(64, 2, 64)
        assert [cache.decide(key).action for _ in range(3)] == [Action.EAGER] * 3
    cache = GraphCache(mode="eager", max_graphs=1)
    first, second = GraphKey(64, 2, 64), GraphKey(128, 4, 128)
    assert cache.preload(first).action is Action.CAPTURE
    assert cache.decide(first) == Decision(Action.REPLAY, first)
    assert cache.preload(second).evict == (first,)
    # A smaller batch replays the smallest captured bucket that holds it.
    assert cache.decide(first) == Decision(Action.REPLAY, second)
    assert cache.decide(GraphKey(64, 8, 64)).action is Action.EAGER
    assert cache.decide(GraphKey(192, 2, 192)).action is Action.EAGER


def test_oversized_and_failed_buckets_stay_eager() -> None:
    cache = GraphCache(mode="lazy", max_graphs=8, max_tokens=1024, max_sequences=64)
    big = GraphKey(2048, 2, 512)
    assert [cache.decide(big).action for _ in range(3)] == [Action.EAGER] * 3
    wide = GraphKey(128, 128, 128)  # more sequence slots than the static buffers hold
    assert [cache.decide(wide).action for _ in range(3)] == [Action.EAGER] * 3
    assert cache.preload(wide).action is Action.EAGER
    key = GraphKey(64, 2, 64)
    cache.decide(key)
    assert cache.decide(key).action is Action.CAPTURE
    cache.forget(key)
    assert cache.live == []
    assert [cache.decide(key).action for _ in range(3)] == [Action.EAGER] * 3


def test_zero_graphs_means_always_eager() -> None:
    cache = GraphCache(mode="lazy", max_graphs=0)
    key = GraphKey(64, 2, 64)
    assert [cache.decide(key).action for _ in range(3)] == [Action.EAGER] * 3


def test_graph_mode_types_the_setting() -> None:
    assert [graph_mode(name) for name in ("lazy", "eager", "off")] == ["lazy", "eager", "off"]
    with pytest.raises(ValueError, match="unknown CUDA graph mode"):
        graph_mode("on")


def test_geometric_buckets_bound_padding_and_count() -> None:
    p = BucketPolicy()
    assert [p.tokens(n) for n in (1, 64, 65, 81, 128, 129, 161)] == [64, 64, 80, 96, 128, 160, 192]
    assert [p.tokens(n) for n in (1025, 1281, 16383, 16384)] == [1280, 1536, 16384, 16384]
    buckets = p.token_buckets(16384)
    assert (buckets[0], buckets[-1]) == (64, 16384)
    assert len(buckets) == 33
    for n in range(1, 16385, 7):
        b = p.tokens(n)
        assert b >= n
        assert b - n < max(64, n / 4 + 16)  # padding under a quarter of the batch (+ rounding)
    assert buckets == sorted(set(buckets))
    linear = LINEAR.token_buckets(16384)
    assert len(linear) == 76  # the old scheme: 16 + 60 buckets


def test_fixed_sequence_slots_make_one_graph_per_token_bucket() -> None:
    p = BucketPolicy(max_sequences=512, max_seqlen=512)
    keys = {p.key(1000, n, min(500, 1000 // n)) for n in (2, 7, 100, 500)}
    assert keys == {GraphKey(1024, 512 + 2, 512)}
    # Slots hold every real sequence plus padding cut at the attention length.
    for total, count in ((16000, 512), (16000, 32), (65, 65), (5, 5), (9000, 18)):
        key = p.key(total, count, -(-total // count))
        assert key.sequences >= count + p.pad_slots(key.tokens - total, key.attention)
    assert p.capacity(16384) == GraphKey(16384, 512 + 32, 512)
    assert p.keys_for(16384) == [GraphKey(16384, 544, 512)]


def test_graph_attention_launches_at_the_longest_sequence_not_the_bucket() -> None:
    # Finding 1: a 16k-token bucket of 512-token sequences launched for 16k would be mostly
    # empty blocks; the launch length is the longest sequence a batch may hold.
    p = BucketPolicy(max_seqlen=512)
    key = p.key(16000, 40, 400)
    assert key.attention == 512
    assert p.key(60, 2, 30).attention == 64
    # And no padding sequence is ever longer than that.
    assert padding_lengths(1300, 512) == [512, 512, 276]
    assert padding_lengths(0, 512) == []
    ids = np.ones(16000, np.int32)
    host = pack([Tokens(ids, np.full(40, 400, np.int32))], 0, key.tokens, key.sequences, 512)
    assert host.total_tokens == key.tokens
    assert int(host.lengths.max()) <= 512
    assert int(host.lengths.sum()) == key.tokens
    assert host.real_sequences == 40
    with pytest.raises(ValueError, match="spare sequence slots"):
        pack([Tokens(ids, np.full(40, 400, np.int32))], 0, 16384, 41, 128)


def test_eager_mode_pads_into_a_larger_bucket_only_with_slots_for_the_padding() -> None:
    cache = GraphCache(mode="eager", max_graphs=4)
    big = GraphKey(4096, 4, 512)
    cache.preload(big)
    # 100 tokens in one sequence -> ~4000 padding tokens need 8 slots of 512: 4 do not hold it.
    assert cache.decide(GraphKey(128, 2, 128)).action is Action.EAGER
    roomy = GraphKey(4096, 16, 512)
    cache.preload(roomy)
    assert cache.decide(GraphKey(128, 2, 128)) == Decision(Action.REPLAY, roomy)
    # With the batch's real counts known, the check is exact: 100 tokens in one sequence.
    assert cache.holds(GraphKey(4096, 9, 512), GraphKey(128, 2, 128), (100, 1, 100))
    assert not cache.holds(GraphKey(4096, 8, 512), GraphKey(128, 2, 128), (100, 1, 100))
    # A bucket launched for shorter sequences than the batch's longest never holds it.
    assert not cache.holds(GraphKey(4096, 64, 512), GraphKey(1024, 4, 1024), (900, 1, 900))


def test_capture_decisions_never_exceed_the_static_buffers() -> None:
    # Finding 5: a CAPTURE that the runner cannot hold used to pop evictees the runner kept.
    rng = np.random.default_rng(0)
    p = BucketPolicy(max_sequences=64, max_seqlen=256)
    cap = p.capacity(2048)
    cache = GraphCache(
        mode="lazy", max_graphs=3, max_tokens=cap.tokens, max_sequences=cap.sequences
    )
    runner: set[GraphKey] = set()
    for _ in range(2000):
        total = int(rng.integers(1, 4096))
        count = int(rng.integers(1, min(total, 200) + 1))
        d = cache.decide(p.key(total, count, min(256, -(-total // count))))
        for old in d.evict:
            runner.discard(old)
        if d.action is Action.CAPTURE:
            assert d.key is not None
            assert cache.fits(d.key)
            runner.add(d.key)
        assert set(cache.live) == runner
        assert len(runner) <= 3


def test_graphs_plan_refuses_or_reports_an_uncapturable_backend() -> None:
    # Finding 7: grouped SDPA on CUDA used to switch graphs off with only a warning.
    assert graphs_plan("cuda", "lazy", "flash-attn", True).enabled
    lazy = graphs_plan("cuda", "lazy", "torch-grouped", False)
    assert (lazy.enabled, lazy.refuse, lazy.warn) == (False, False, True)
    assert "torch-grouped" in lazy.reason
    eager = graphs_plan("cuda", "eager", "torch-grouped", False)
    assert (eager.enabled, eager.refuse) == (False, True)
    assert graphs_plan("cpu", "lazy", "torch-grouped", False).reason == ""
    assert graphs_plan("cuda", "off", "torch-grouped", False).reason == ""


def _attention_blocks(key: GraphKey, block: int = 128) -> int:
    """A varlen flash kernel's grid per head: a row of query blocks per sequence slot."""
    return -(-key.attention // block) * key.sequences


def test_long_limit_models_launch_attention_at_the_bucketed_longest_sequence() -> None:
    # Issue 36 finding 5: the launch length was min(bucket, model limit), so a 32k-limit model's
    # 16k-token bucket of 512-token sequences launched 128 rows of blocks per slot, ~1M blocks
    # per layer at 16 heads, nearly all empty.
    p = BucketPolicy(max_seqlen=32768)
    key = p.key(16384, 32, 512)
    assert key == GraphKey(16384, 512 + 32, 512)
    before = GraphKey(16384, 512 + 1, 16384)  # min(bucket, limit), padding in one slot
    assert 16 * _attention_blocks(before) > 1_000_000
    assert _attention_blocks(before) > 25 * _attention_blocks(key)
    # Bucketed by the longest sequence, never past the bucket nor the limit.
    assert [p.key(16384, 4, n).attention for n in (1, 512, 513, 2048, 2049, 9000)] == [
        512, 512, 2048, 2048, 8192, 16384,
    ]  # fmt: skip
    assert p.key(300, 1, 300).attention == 320  # the bucket itself, below the floor
    assert p.attentions(16384) == [512, 2048, 8192, 16384]
    # A 512-limit model keeps one launch length per bucket, as before.
    bert = BucketPolicy(max_seqlen=512)
    assert {bert.key(16000, 40, n).attention for n in (1, 100, 512)} == {512}
    assert bert.attentions(16384) == [512]
    # Padding is cut at the launch length, so the graph never sees a longer sequence.
    host = pack([Tokens(np.ones(100, np.int32), np.asarray([100], np.int32))], 0,
                key.tokens, key.sequences, key.attention)  # fmt: skip
    assert int(host.lengths.max()) <= key.attention


def test_warmup_plan_is_every_bucket_largest_first_then_longer_attention() -> None:
    # Issue 36 finding 4: the buckets a fleet will use, captured before it serves.
    bert = BucketPolicy(max_seqlen=512)
    plan = warmup_plan(bert, bert.token_buckets(16384), max_graphs=64)
    assert [k.tokens for k in plan] == bert.token_buckets(16384)[::-1]
    assert plan[0] == bert.capacity(16384)
    qwen = BucketPolicy(max_seqlen=32768)
    buckets = qwen.token_buckets(16384)
    plan = warmup_plan(qwen, buckets, max_graphs=64)
    first = plan[: len(buckets)]
    assert [k.tokens for k in first] == buckets[::-1]
    assert all(k.attention == min(512, k.tokens) for k in first)
    rest = plan[len(buckets) :]
    assert rest
    assert all(k.attention > 512 for k in rest)
    assert rest[0] == GraphKey(16384, 512 + 8, 2048)  # largest first again
    assert len(plan) == 64  # bounded by max_graphs: no capture at start evicts another
    assert len(set(plan)) == 64
    assert warmup_plan(bert, [128, 64, 128], max_graphs=64) == [
        GraphKey(128, 129, 128), GraphKey(64, 65, 64),
    ]  # fmt: skip
    assert warmup_plan(bert, bert.token_buckets(1024), max_graphs=0) == []


def test_warmup_plan_leaves_no_capture_to_client_traffic() -> None:
    # The graph simulator's hour of mixed traffic after the plan: no batch pays a capture or
    # runs eager for a first use.
    from embedfleet.bench import graph_sim

    batches = graph_sim.batches_of(graph_sim.synthetic_trace(120, seed=1))
    p = BucketPolicy(max_seqlen=graph_sim.MAX_SEQLEN, max_sequences=graph_sim.MAX_SEQUENCES)
    lazy = graph_sim.simulate("lazy", p, batches, 64)
    assert lazy.captures > 0
    assert lazy.replayed < 1.0
    plan = warmup_plan(p, p.token_buckets(graph_sim.MAX_TOKENS), 64)
    warm = graph_sim.simulate("warm", p, batches, 64, plan)
    assert warm.captures == 0
    assert warm.replayed == 1.0


@pytest.mark.parametrize(("limit", "budget"), [(512, 16384), (32768, 16384)])
def test_warmup_plan_captures_every_lone_request_first(limit: int, budget: int) -> None:
    # Issue 38: a batch-1 client paid a bucket's capture (its second use, lazy mode) when the
    # start-up plan, largest first, ran out of graphs before the small buckets.
    policy = BucketPolicy(max_seqlen=limit)
    lone = lone_keys(policy, limit)
    assert len(lone) == len(set(lone)) <= 45
    plan = warmup_plan(policy, policy.token_buckets(budget), 1 + len(lone), lone)
    assert plan[0] == policy.capacity(budget)  # the pool-sizing graph still comes first
    cap = policy.capacity(max(budget, limit))
    cache = GraphCache(mode="lazy", max_tokens=cap.tokens, max_sequences=cap.sequences)
    for key in plan:
        assert cache.preload(key).action is Action.CAPTURE
    for n in range(1, limit + 1, 7 if limit > 512 else 1):
        key = policy.key(n, 1, n)
        assert cache.decide(key, (n, 1, n)).action is Action.REPLAY, n


def test_a_lone_key_already_planned_is_captured_once() -> None:
    bert = BucketPolicy(max_seqlen=512)
    lone = lone_keys(bert, 512)
    assert [k.tokens for k in lone] == bert.token_buckets(512)  # one bucket per token bucket
    plan = warmup_plan(bert, bert.token_buckets(16384), 64, lone)
    assert len(plan) == len(set(plan)) == len(bert.token_buckets(16384))
