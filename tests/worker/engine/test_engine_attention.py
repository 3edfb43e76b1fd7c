"""The grouped SDPA backend against plain per-sequence attention, and the packing it relies on."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from embedfleet.common.codec import Tokens
from embedfleet.worker.engine.attention import GroupedBackend, plan_groups, select_backend
from embedfleet.worker.engine.batch import pack


def per_sequence(q, k, v, lengths, causal):  # type: ignore[no-untyped-def]
    out, start = [], 0
    for n in lengths:
        s = slice(start, start + n)
        o = F.scaled_dot_product_attention(
            q[s].transpose(0, 1),
            k[s].transpose(0, 1),
            v[s].transpose(0, 1),
            is_causal=causal,
            enable_gqa=True,
        )
        out.append(o.transpose(0, 1))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize(
    "sizes",
    [
        [5, 1, 64, 63, 60, 17, 16, 130, 2, 2, 2],  # mixed; the adjacent 2s are read as one view
        [32, 32, 32, 32],  # the whole batch one view
        [7, 32, 9, 32, 32],  # equal lengths, not all adjacent: gathered
    ],
)
def test_grouped_matches_per_sequence(causal: bool, kv_heads: int, sizes: list[int]) -> None:
    lengths = np.array(sizes, np.int64)
    total = int(lengths.sum())
    g = torch.Generator().manual_seed(0)
    q = torch.randn(total, 4, 8, generator=g)
    k = torch.randn(total, kv_heads, 8, generator=g)
    v = torch.randn(total, kv_heads, 8, generator=g)
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    plan = GroupedBackend().plan(cu, lengths, int(lengths.max()), causal)
    got = plan.attend(q, k, v)
    torch.testing.assert_close(got, per_sequence(q, k, v, lengths.tolist(), causal))


def test_groups_bound_padding_and_skip_empty() -> None:
    lengths = np.array([100, 0, 90, 10, 81, 79, 9, 8, 0], np.int64)
    groups = plan_groups(lengths, min_fill=0.8)
    assert sorted(i for g in groups for i in g) == [0, 2, 3, 4, 5, 6, 7]
    for g in groups:
        top = lengths[g].max()
        assert lengths[g].min() >= 0.8 * top
    capped = plan_groups(np.full(10, 100, np.int64), max_group_tokens=300)
    assert [len(g) for g in capped] == [3, 3, 3, 1]


def test_pack_offsets_positions_and_padding_sequence() -> None:
    parts = [
        Tokens(np.array([1, 2, 3], np.int32), np.array([3], np.int32)),
        Tokens(np.array([4, 5], np.int32), np.array([1, 1], np.int32)),
    ]
    host = pack(parts, position_offset=2, bucket_tokens=8, bucket_sequences=8)
    ids, _types, positions, seq_index = host.tokens
    assert ids.tolist() == [1, 2, 3, 4, 5, 0, 0, 0]
    assert positions.tolist() == [2, 3, 4, 2, 2, 2, 2, 2]
    assert seq_index.tolist() == [0, 0, 0, 1, 2, 3, 3, 3]
    assert host.cu_seqlens.tolist() == [0, 3, 4, 5, 8, 8, 8, 8, 8]
    first, last, lengths = host.seqs
    assert first[:4].tolist() == [0, 3, 4, 5]
    assert last[:4].tolist() == [2, 3, 4, 7]
    assert (first < 8).all()
    assert (last >= 0).all()
    assert (lengths >= 1).all()
    assert host.real_tokens == 5
    assert host.real_sequences == 3
    with pytest.raises(ValueError, match="spare sequence slot"):
        pack(parts, bucket_tokens=8, bucket_sequences=3)


def test_cpu_auto_backend_is_grouped() -> None:
    backend = select_backend("auto", torch.device("cpu"), torch.float32)
    assert backend.name == "torch-grouped"
    assert not backend.graph_safe
    assert select_backend("torch", torch.device("cpu"), torch.bfloat16).name == "torch-grouped"


def test_auto_picks_the_fastest_by_benchmark_on_any_device() -> None:
    # The benchmark runs wherever the backends do; here two CPU backends, timed by a clock that
    # only the slow kernel advances (so the outcome does not depend on the machine's load).
    from embedfleet.worker.engine.attention import (
        AttentionShape,
        GroupedBackend,
        VarlenBackend,
        benchmark_backends,
        fastest,
    )

    now = [0.0]

    def slow_kernel(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu: torch.Tensor,
        n: int,
        c: bool,
        window: int,
    ) -> torch.Tensor:
        now[0] += 0.01
        return q.clone()

    slow = VarlenBackend("slow", slow_kernel)
    grouped = GroupedBackend()
    shape = AttentionShape(heads=4, kv_heads=2, head_dim=16)
    cpu = torch.device("cpu")
    timings = benchmark_backends(
        [slow, grouped], cpu, torch.float32, shape, 256, 64, 3, clock=lambda: now[0]
    )
    assert timings == {"slow": pytest.approx(0.01), "torch-grouped": 0.0}
    assert fastest(timings, ["slow", "torch-grouped"]) == "torch-grouped"


def test_fastest_skips_failures_and_breaks_ties_in_order() -> None:
    from embedfleet.worker.engine.attention import fastest

    inf = float("inf")
    assert fastest({"a": inf, "b": 2.0}, ["a", "b"]) == "b"
    assert fastest({"a": 1.0, "b": 1.0}, ["a", "b"]) == "a"
    assert fastest({"a": inf, "b": inf}, ["a", "b"]) == "a"


def test_a_failing_backend_loses_instead_of_crashing() -> None:
    from embedfleet.worker.engine.attention import AttentionShape, VarlenBackend, benchmark_backends

    def broken(*args: object) -> torch.Tensor:
        raise RuntimeError("no kernel for this shape")

    backends = [VarlenBackend("broken", broken)]
    shape = AttentionShape(2, 2, 8)
    cpu = torch.device("cpu")
    timings = benchmark_backends(backends, cpu, torch.float32, shape, tokens=64, seq=32)
    assert timings == {"broken": float("inf")}


def masked_per_sequence(q, k, v, lengths, causal, window, bias):  # type: ignore[no-untyped-def]
    """The reference for windowed and biased plans: one SDPA per sequence with its own mask."""
    from embedfleet.worker.engine.attention import relative_positions, visible

    out, start = [], 0
    for n in lengths:
        s = slice(start, start + n)
        rel = relative_positions(n, q.device)
        seen = visible(rel, window, causal)
        mask = seen if bias is None else bias(rel).masked_fill(~seen, float("-inf"))
        o = F.scaled_dot_product_attention(
            q[s].transpose(0, 1), k[s].transpose(0, 1), v[s].transpose(0, 1), attn_mask=mask
        )
        out.append(o.transpose(0, 1))
        start += n
    return torch.cat(out)


def toy_bias(relative: torch.Tensor) -> torch.Tensor:
    """A per-head score of the relative position, as MPNet's buckets give one ([4, L, L])."""
    scale = torch.tensor([0.5, -0.25, 0.1, 1.0])[:, None, None]
    return scale * torch.tanh(relative.float() / 7)


@pytest.mark.parametrize("plan_kind", ["grouped", "padded"])
@pytest.mark.parametrize(
    ("causal", "window", "biased"),
    [(False, 3, False), (True, 3, False), (False, -1, True), (False, 5, True)],
)
def test_windowed_and_biased_plans_match_per_sequence_masks(
    plan_kind: str, causal: bool, window: int, biased: bool
) -> None:
    from embedfleet.worker.engine.padded import PaddedPlan, padded_layout, plan_tensors

    lengths = np.array([5, 1, 64, 63, 0, 17, 16, 16, 2], np.int64)
    total = int(lengths.sum())
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(total, 4, 8, generator=g) for _ in range(3))
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    plan = (
        GroupedBackend().plan(cu, lengths, 64, causal)
        if plan_kind == "grouped"
        else PaddedPlan(*plan_tensors(padded_layout(lengths)), causal)
    )
    if biased:
        plan = plan.biased(toy_bias)
    if window >= 0:
        plan = plan.windowed(window)
    bias = toy_bias if biased else None
    want = masked_per_sequence(q, k, v, [int(n) for n in lengths if n], causal, window, bias)
    torch.testing.assert_close(plan.attend(q, k, v), want, atol=1e-5, rtol=1e-5)
    # The window and the bias change the answer: the test would catch either one dropped.
    assert not torch.allclose(want, per_sequence(q, k, v, [int(n) for n in lengths if n], causal))


def test_biased_groups_hold_a_bounded_number_of_scores() -> None:
    lengths = np.full(40, 512, np.int64)
    groups = plan_groups(lengths, max_group_scores=1 << 20)
    assert [len(g) for g in groups] == [4] * 10  # 4 x 512^2 = 2^20 query-key pairs


def test_backends_are_chosen_for_what_the_model_needs() -> None:
    from embedfleet.worker.engine.attention import BackendUnavailableError, VarlenBackend
    from embedfleet.worker.engine.attention import select_backend as pick

    cpu = torch.device("cpu")
    assert pick("auto", cpu, torch.float32, features=frozenset(["bias"])).name == "torch-grouped"
    plan = VarlenBackend("k", lambda *a: a[0]).plan(torch.zeros(2), np.ones(1, np.int64), 1, False)
    with pytest.raises(NotImplementedError, match="bias"):
        plan.biased(toy_bias)
    with pytest.raises(NotImplementedError, match="window"):
        plan.windowed(4)
    with pytest.raises(BackendUnavailableError):
        pick("flash-attn", cpu, torch.float32, features=frozenset(["bias"]))
