"""Multi-vector (ColBERT) outputs from a random-weight bge-m3 (XLM-R with colbert_linear.pt),
token by token against its own recipe run on `transformers` (testing.families.bge_m3_colbert)."""

from __future__ import annotations

import numpy as np
import pytest

from embedfleet.common.codec import Tokens
from embedfleet.common.modeldir import ModelDirError, load_model_dir
from embedfleet.common.similarity import min_cosine
from embedfleet.testing import families
from embedfleet.testing.families import FamilyDirs
from embedfleet.worker.contract import WorkItem
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.torch_engine import TorchEngine

from .helpers import cached_engine
from .test_engine_graph_path import assert_graph_path_matches


def tokens(seqs: list[list[int]]) -> Tokens:
    ids = np.concatenate([np.asarray(s, np.int32) for s in seqs])
    return Tokens(ids, np.array([len(s) for s in seqs], np.int32))


@pytest.fixture(scope="module")
def bge_m3(family_dirs: FamilyDirs) -> TorchEngine:
    path = family_dirs.get("bge-m3")
    config = EngineConfig(model=str(path), device="cpu", dtype="float32", task="multivector")
    return cached_engine(config)


def test_bge_m3_serves_dense_unless_multivector_is_asked(family_dirs: FamilyDirs) -> None:
    path = family_dirs.get("bge-m3")
    assert load_model_dir(path).task == "embed"
    model = load_model_dir(path, "multivector")
    assert (model.task, model.head) == ("multivector", "colbert")
    assert model.multivector is not None
    assert model.multivector.skip == 1
    with pytest.raises(ModelDirError, match="per-token projection"):
        load_model_dir(family_dirs.get("bge-reranker-base"), "multivector")


def test_bge_m3_token_vectors_match_its_recipe(
    bge_m3: TorchEngine, family_dirs: FamilyDirs
) -> None:
    path = family_dirs.get("bge-m3")
    tok = load_model_dir(path).tokenizer()
    # Lengths from 3 tokens to ~20 in one ragged batch, as two items: rows must not mix.
    seqs = [tok.encode(t).ids for t in (*families.TEXTS[:4], "hi", "yes no")]
    ref = families.bge_m3_colbert(path, seqs)
    first, second = bge_m3.run([WorkItem(tokens(seqs[:2])), WorkItem(tokens(seqs[2:]))])
    want = np.concatenate(ref)
    got = np.concatenate([first, second])
    assert first.shape == (sum(len(s) - 1 for s in seqs[:2]), bge_m3.info.dimensions)
    assert got.shape == want.shape
    assert min_cosine(got, want) >= 0.999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # One input alone gives its rows of the batch.
    [alone] = bge_m3.run([WorkItem(tokens(seqs[:1]))])
    assert min_cosine(alone, ref[0]) >= 0.999


def test_pylate_colbert_vectors_every_token(family_dirs: FamilyDirs) -> None:
    """A PyLate layout (Dense right after the transformer) is multivector on auto and keeps
    every token, its first included."""
    path = family_dirs.get("pylate-colbert")
    model = load_model_dir(path)
    assert (model.task, model.head) == ("multivector", "colbert")
    eng = cached_engine(EngineConfig(model=str(path), device="cpu", dtype="float32"))
    assert eng.info.dimensions == 24
    tok = model.tokenizer()
    seqs = [tok.encode(t).ids for t in (*families.TEXTS[:3], "hi")]
    [got] = eng.run([WorkItem(tokens(seqs))])
    want = np.concatenate(families.pylate_colbert_vectors(path, seqs))
    assert got.shape == want.shape == (sum(map(len, seqs)), 24)
    assert min_cosine(got, want) >= 0.999


def test_graph_path_reads_each_items_token_rows(
    bge_m3: TorchEngine, family_dirs: FamilyDirs
) -> None:
    """Bucket padding (graph path, its recording mocked on the CPU) adds tokens to the batch's
    head: none reaches a request, and the CLS rows are dropped from the static output alike."""
    assert_graph_path_matches(bge_m3, texts=5, split=2, task="multivector")
