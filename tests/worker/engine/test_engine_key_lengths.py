"""Key lengths (a sequence whose last tokens no token attends to: PyLate's query expansion with
`attend_to_expansion_tokens` false): the grouped and padded plans against a dense reference, and
the engine against `transformers` with those tokens masked, on each CPU runtime and on the route
a graph-enabled engine takes for them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from embedfleet.common.codec import Tokens
from embedfleet.common.similarity import min_cosine
from embedfleet.testing import families
from embedfleet.testing.families import FamilyDirs
from embedfleet.worker.contract import WorkItem
from embedfleet.worker.engine.attention import (
    GroupedBackend,
    UnsupportedFeatureError,
    relative_positions,
    visible,
)
from embedfleet.worker.engine.batch import pack
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.padded import PaddedPlan, padded_layout, plan_tensors
from embedfleet.worker.engine.torch_engine import TorchEngine

from .helpers import RUNTIMES, cached_engine, item
from .test_engine_graph_path import REFERENCE, graph_engine

#: float32 on both sides: each token's vector within this of the reference's (relative)
RTOL = 1e-4


def dense_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: list[int],
    keys: list[int],
    causal: bool = False,
    window: int = -1,
) -> torch.Tensor:
    """Each sequence alone, its keys cut to the first `keys` tokens by an explicit mask."""
    out, start = torch.zeros_like(q), 0
    for n, kn in zip(lengths, keys, strict=True):
        s = slice(start, start + n)
        mask = visible(relative_positions(n, q.device), window, causal)
        mask[:, kn:] = False
        out[s] = F.scaled_dot_product_attention(
            q[s].transpose(0, 1), k[s].transpose(0, 1), v[s].transpose(0, 1), attn_mask=mask
        ).transpose(0, 1)
        start += n
    return out


def keyed(seqs: list[list[int]], keys: list[int]) -> WorkItem:
    """One item of `seqs` with their key lengths."""
    return WorkItem(
        Tokens(
            np.concatenate([np.asarray(s, np.int32) for s in seqs]),
            np.array([len(s) for s in seqs], np.int32),
            key_lengths=np.array(keys, np.int32),
        )
    )


def qkv(total: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn((total, 2, 8), generator=gen) for _ in range(3))


@pytest.mark.parametrize(
    ("lengths", "keys"),
    [
        ([12], [5]),  # alone: the view path
        ([12, 12, 12], [12, 4, 12]),  # equal and adjacent: the view path with a key mask
        ([12, 10, 3, 11], [7, 10, 3, 11]),  # gathered groups, one of them cut
    ],
    ids=["alone", "equal", "gathered"],
)
@pytest.mark.parametrize("shape", ["full", "causal", "window"])
def test_grouped_and_padded_plans_hide_the_keys_past_the_prefix(
    lengths: list[int], keys: list[int], shape: str
) -> None:
    causal, window = shape == "causal", 3 if shape == "window" else -1
    q, k, v = qkv(sum(lengths))
    want = dense_reference(q, k, v, lengths, keys, causal, window)
    host_lengths, host_keys = np.array(lengths, np.int64), np.array(keys, np.int64)
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    plan = GroupedBackend().plan(cu, host_lengths, max(lengths), causal, host_keys)
    if window >= 0:
        plan = plan.windowed(window)
    torch.testing.assert_close(plan.attend(q, k, v), want, rtol=1e-5, atol=1e-6)
    if causal:
        return  # the padded plan ignores its key mask when causal: such a batch runs eager
    padded: PaddedPlan = PaddedPlan(*plan_tensors(padded_layout(host_lengths, host_keys)), False)
    if window >= 0:
        padded = padded._derived(window, None)
    torch.testing.assert_close(padded.attend(q, k, v), want, rtol=1e-5, atol=1e-6)


def test_key_lengths_pack_only_where_some_fall_short() -> None:
    plain = Tokens(np.arange(5, dtype=np.int32), np.array([3, 2], np.int32))
    cut = Tokens(np.arange(4, dtype=np.int32), np.array([4], np.int32), key_lengths=np.array([2]))
    full = Tokens(np.arange(4, dtype=np.int32), np.array([4], np.int32), key_lengths=np.array([4]))
    assert pack([plain]).keys is None
    assert pack([plain, full]).keys is None  # as long as the sequences: nothing to mask
    host = pack([plain, cut], bucket_tokens=16, bucket_sequences=6, pad_len=4)
    assert host.keys is not None
    assert host.keys.tolist() == [3, 2, 2, *host.lengths[3:].tolist()]
    with pytest.raises(UnsupportedFeatureError):
        REFERENCE.plan(torch.zeros(2, dtype=torch.int32), np.array([4]), 4, False, np.array([2]))


@pytest.fixture(scope="module")
def expanded(family_dirs: FamilyDirs) -> tuple[list[list[int]], list[int]]:
    """An expanded PyLate query (its key length: up to its last token before the mask tokens)
    and two documents, as PyLate encodes them."""
    path = family_dirs.get("pylate-colbert-marked")
    [query] = families.pylate_encoded(path, ["capital of France?"], query=True)
    docs = families.pylate_encoded(path, list(families.TEXTS[1:3]), query=False)
    mask = query[-1]
    keys = len(query) - next(i for i, t in enumerate(reversed(query)) if t != mask)
    assert 3 <= keys < len(query)
    return [query, *docs], [keys, *map(len, docs)]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_expanded_query_beside_documents_matches_pylate(
    family_dirs: FamilyDirs, expanded: tuple[list[list[int]], list[int]], runtime: str
) -> None:
    path = family_dirs.get("pylate-colbert-marked")
    seqs, keys = expanded
    engine = cached_engine(
        EngineConfig(model=str(path), device="cpu", dtype="float32", cpu_runtime=runtime)
    )
    assert engine.runtime_name == runtime
    want = families.pylate_colbert_vectors(path, seqs, keys)
    # The query and the documents as two items of one batch: the documents' item has none.
    got_query, got_docs = engine.run([keyed(seqs[:1], keys[:1]), item(seqs[1:])])
    np.testing.assert_allclose(got_query, want[0], rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose(got_docs, np.concatenate(want[1:]), rtol=RTOL, atol=RTOL)
    # The documents alone (today's path, no key mask) give the same rows.
    [alone] = engine.run([item(seqs[1:])])
    np.testing.assert_allclose(got_docs, alone, rtol=1e-5, atol=1e-6)
    # The same query with every token a key is another answer: the mask did something.
    [attended] = engine.run([item(seqs[:1])])
    assert np.abs(attended - got_query).max() > 1e-3


def test_a_graph_engine_runs_key_lengths_eager_on_the_grouped_plan(
    family_dirs: FamilyDirs, expanded: tuple[list[list[int]], list[int]]
) -> None:
    """The graph path's backend (a varlen kernel: cu_seqlens only) refuses key lengths, so such a
    batch must leave the graphs for the grouped backend; plain batches graph as before."""
    path = family_dirs.get("pylate-colbert-marked")
    seqs, keys = expanded
    engine, _ = graph_engine(model=str(path))
    assert isinstance(engine.keyed_backend, GroupedBackend)
    [got] = engine.run([keyed(seqs, keys)])
    want = np.concatenate(families.pylate_colbert_vectors(path, seqs, keys))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL)
    counts = engine.counters()
    assert (counts.eager_runs, counts.captures) == (1, 0)
    for _ in range(2):  # a bucket's first batch runs eager, its second is captured
        engine.run([item(seqs)])
    assert engine.counters().captures == 1


@pytest.mark.gpu
def test_on_cuda_key_lengths_leave_the_graphs_for_the_grouped_backend(
    family_dirs: FamilyDirs, expanded: tuple[list[list[int]], list[int]]
) -> None:
    """The real CUDA route: a graph-safe varlen backend, its captured graphs for plain batches,
    and a batch with key lengths eager on the grouped backend (bf16)."""
    path = family_dirs.get("pylate-colbert-marked")
    seqs, keys = expanded
    engine = TorchEngine(EngineConfig(model=str(path), device="cuda", cuda_graphs="lazy"))
    assert engine.backend.graph_safe, engine.graphs_off_reason
    assert isinstance(engine.keyed_backend, GroupedBackend)
    want = np.concatenate(families.pylate_colbert_vectors(path, seqs, keys))
    for _ in range(3):
        [got] = engine.run([keyed(seqs, keys)])
        assert min_cosine(got, want) >= 0.999
    for _ in range(3):  # eager, capture, replay
        engine.run([item(seqs)])
    counts = engine.counters()
    assert (counts.eager_runs, counts.captures, counts.replays) == (4, 1, 1)
