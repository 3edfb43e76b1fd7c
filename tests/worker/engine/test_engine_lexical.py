"""bge-m3's lexical (sparse) weights from a random-weight bge-m3 (XLM-R with sparse_linear.pt),
against FlagEmbedding's rule written out on `transformers`' XLMRobertaModel
(testing.families.bge_m3_lexical)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedfleet.common.modeldir import load_model_dir
from embedfleet.testing import families
from embedfleet.testing.families import FamilyDirs
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.torch_engine import TorchEngine
from embedfleet.worker.sparse import sparsify

from .helpers import RUNTIMES, cached_engine, item
from .test_engine_graph_path import assert_graph_path_matches


def engine(path: Path, runtime: str = "eager") -> TorchEngine:
    config = EngineConfig(
        model=str(path), device="cpu", dtype="float32", task="sparse", cpu_runtime=runtime
    )
    return cached_engine(config)


def as_dicts(rows: np.ndarray) -> list[dict[int, float]]:
    """The rows as the SparseEmbed reply carries them (`sparsify`), one dict a row."""
    sparse = sparsify(rows)
    return [
        dict(
            zip(
                sparse.indices[a:b].tolist(),
                sparse.values[a:b].tolist(),
                strict=True,
            )
        )
        for a, b in zip(sparse.offsets[:-1], sparse.offsets[1:], strict=True)
    ]


def assert_same(got: list[dict[int, float]], want: list[dict[int, float]]) -> None:
    """Equal sparse vectors, a missing id weighing 0. The floor beside rtol: float32 sums in
    another order (threads, batch shape) move a weight near 0 by ~1e-7, which is 5e-4 of a 3e-4
    weight (seen: 1 run in ~15) or tips it across ReLU into being dropped."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        ids = sorted(g.keys() | w.keys())
        np.testing.assert_allclose(
            [g.get(i, 0.0) for i in ids], [w.get(i, 0.0) for i in ids], rtol=1e-4, atol=1e-6
        )


def test_bge_m3_is_sparse_only_when_asked(family_dirs: FamilyDirs) -> None:
    path = family_dirs.get("bge-m3")
    assert load_model_dir(path).task == "embed"
    model = load_model_dir(path, "sparse")
    assert (model.task, model.head) == ("sparse", "lexical")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_bge_m3_lexical_weights_match_its_rule(family_dirs: FamilyDirs, runtime: str) -> None:
    path = family_dirs.get("bge-m3")
    tok = load_model_dir(path).tokenizer()
    # Lengths from 3 tokens to ~20, repeated words (a max per id) and an unknown character.
    texts = (*families.TEXTS[:4], "hi", "the the the cat", "\u2603 yes no")
    seqs = [tok.encode(t).ids for t in texts]
    assert any(len(set(s)) < len(s) for s in seqs)
    assert any(3 in s for s in seqs)  # <unk>
    want = families.bge_m3_lexical(path, seqs)
    # Random weights: ReLU zeroes about half the tokens, so the zero rule is exercised too.
    assert sum(map(len, want)) > 20
    eng = engine(path, runtime)
    assert eng.info.dimensions == load_model_dir(path).vocab_size
    first, second = eng.run([item(seqs[:3]), item(seqs[3:])])
    assert_same(as_dicts(np.concatenate([first, second])), want)
    # One input alone gives its row of the batch.
    [alone] = eng.run([item(seqs[-1:])])
    assert_same(as_dicts(alone), want[-1:])


def test_graph_path_leaves_padding_out_of_every_row(family_dirs: FamilyDirs) -> None:
    """Bucket padding adds tokens and a spare slot to the head's input: none reaches a row."""
    assert_graph_path_matches(engine(family_dirs.get("bge-m3")), texts=5, split=2, task="sparse")
