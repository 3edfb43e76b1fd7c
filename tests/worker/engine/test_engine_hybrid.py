"""bge-m3's dense, lexical and per-token outputs from one forward (task hybrid), against each
single head's engine and the references written out on `transformers`' XLMRobertaModel
(testing.families.bge_m3_colbert / bge_m3_lexical)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedfleet.common.modeldir import ModelDirError, load_model_dir
from embedfleet.common.similarity import min_cosine
from embedfleet.testing import families
from embedfleet.testing.families import FamilyDirs
from embedfleet.worker.contract import HYBRID_OUTPUTS, Options, WorkItem, hybrid_parts
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.forward import default_outputs
from embedfleet.worker.engine.models.hybrid import Hybrid
from embedfleet.worker.engine.torch_engine import TorchEngine

from .helpers import RUNTIMES, cached_engine, item
from .test_engine_graph_path import assert_graph_path_matches
from .test_engine_lexical import as_dicts, assert_same

EVERY = Options(outputs=frozenset(HYBRID_OUTPUTS))


def engine(path: Path, task: str, runtime: str = "eager") -> TorchEngine:
    config = EngineConfig(
        model=str(path), device="cpu", dtype="float32", task=task, cpu_runtime=runtime
    )
    return cached_engine(config)


def test_hybrid_needs_both_of_bge_m3s_heads(family_dirs: FamilyDirs, tmp_path: Path) -> None:
    path = family_dirs.get("bge-m3")
    assert load_model_dir(path).task == "embed"
    model = load_model_dir(path, "hybrid")
    assert (model.task, model.head) == ("hybrid", "hybrid")
    assert model.pooling == load_model_dir(path).pooling
    assert model.multivector is not None
    assert model.multivector.skip == 1
    # One of the two files alone is not enough.
    for name in ("config.json", "colbert_linear.pt"):
        (tmp_path / name).write_bytes((path / name).read_bytes())
    with pytest.raises(ModelDirError, match=r"task hybrid needs BAAI/bge-m3's colbert_linear\.pt"):
        load_model_dir(tmp_path, "hybrid")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_one_forward_gives_each_heads_output(family_dirs: FamilyDirs, runtime: str) -> None:
    path = family_dirs.get("bge-m3")
    tok = load_model_dir(path).tokenizer()
    texts = (*families.TEXTS[:4], "hi", "the the the cat")
    seqs = [tok.encode(t).ids for t in texts]
    hybrid = engine(path, "hybrid", runtime)
    info = hybrid.info
    items = [item(seqs[:3], EVERY), item(seqs[3:], EVERY)]
    got = [
        hybrid_parts(flat, it.tokens.count, info, EVERY.outputs)
        for flat, it in zip(hybrid.run(items), items, strict=True)
    ]
    dense, lexical, vectors = (np.concatenate([g[name] for g in got]) for name in HYBRID_OUTPUTS)
    # Each single head's engine, run on the same items.
    want_dense = np.concatenate(engine(path, "embed", runtime).run(items))
    np.testing.assert_allclose(dense, want_dense, atol=1e-5)
    assert_same(as_dicts(lexical), families.bge_m3_lexical(path, seqs))
    want_vectors = np.concatenate(families.bge_m3_colbert(path, seqs))
    assert vectors.shape == want_vectors.shape == (sum(len(s) - 1 for s in seqs), 64)
    assert min_cosine(vectors, want_vectors) >= 0.999
    np.testing.assert_allclose(
        vectors, np.concatenate(engine(path, "multivector", runtime).run(items)), atol=1e-5
    )


def test_the_encoder_runs_once_a_batch(
    family_dirs: FamilyDirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = family_dirs.get("bge-m3")
    hybrid = engine(path, "hybrid")
    assert isinstance(hybrid.model, Hybrid)
    encoder = hybrid.model.encoder
    calls: list[int] = []
    forward = encoder.forward

    def counted(*args: object) -> object:
        calls.append(1)
        return forward(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(encoder, "forward", counted)
    tok = load_model_dir(path).tokenizer()
    seqs = [tok.encode(t).ids for t in families.TEXTS[:3]]
    hybrid.run([item(seqs[:1], EVERY), item(seqs[1:])])
    assert len(calls) == 1


def test_only_the_outputs_asked_for_are_computed_and_returned(
    family_dirs: FamilyDirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dense-only item (an Embed call) runs neither the lexical nor the per-token head and
    gets an embedder's rows, its options honoured; a multi-vector one skips the lexical head."""
    path = family_dirs.get("bge-m3")
    hybrid = engine(path, "hybrid")
    assert isinstance(hybrid.model, Hybrid)
    calls: list[str] = []
    for name in ("lexical", "colbert"):
        head = getattr(hybrid.model, name)
        monkeypatch.setattr(head, "head", counted(head.head, name, calls))
    tok = load_model_dir(path).tokenizer()
    seqs = [tok.encode(t).ids for t in families.TEXTS[:3]]
    options = Options(pooling="mean", dimensions=32)
    [rows] = hybrid.run([item(seqs, options)])
    assert calls == []
    [want] = engine(path, "embed").run([item(seqs, options)])
    assert want.shape == (3, 32)
    np.testing.assert_allclose(rows.reshape(3, -1), want, atol=1e-5)
    only = frozenset({"multi_vector"})
    [flat] = hybrid.run([item(seqs, Options(outputs=only))])
    assert calls == ["colbert"]
    parts = hybrid_parts(flat, 3, hybrid.info, only)
    assert list(parts) == ["multi_vector"]
    assert parts["multi_vector"].shape == (sum(len(s) - 1 for s in seqs), 64)
    # Items of one batch keep their own options and outputs.
    cut, every = hybrid.run([item(seqs, options), item(seqs, EVERY)])
    np.testing.assert_allclose(cut.reshape(3, -1), want, atol=1e-5)
    dense = hybrid_parts(every, 3, hybrid.info, EVERY.outputs)["dense"]
    [embedded] = engine(path, "embed").run([item(seqs)])
    np.testing.assert_allclose(dense, embedded, atol=1e-5)


def counted(call: object, name: str, calls: list[str]) -> object:
    def run(*args: object) -> object:
        calls.append(name)
        return call(*args)  # type: ignore[operator]

    return run


def test_the_dtype_probe_compares_every_tokens_vector(family_dirs: FamilyDirs) -> None:
    path = family_dirs.get("bge-m3")
    hybrid = engine(path, "hybrid")
    tok = load_model_dir(path).tokenizer()
    probe = item([tok.encode(t).ids for t in families.TEXTS[:2]]).tokens
    rows = default_outputs(hybrid.model, hybrid.backend, hybrid.pooler, probe, hybrid.device)
    [want] = engine(path, "multivector").run([WorkItem(probe)])
    # Every token's vector, the CLS tokens' too (the multivector rows drop them).
    assert rows.shape == (probe.total, 64)
    keep = np.ones(probe.total, bool)
    keep[np.cumsum(probe.lengths) - probe.lengths] = False
    np.testing.assert_allclose(rows[keep], want, atol=1e-5)


def test_graph_path_cuts_each_items_outputs(family_dirs: FamilyDirs) -> None:
    """Bucket padding (graph path, its recording mocked on the CPU): each item still reads its
    own rows of each output it asks for (the first all three, the second the dense ones)."""
    assert_graph_path_matches(
        engine(family_dirs.get("bge-m3"), "hybrid"), texts=5, split=2, first=EVERY, task="hybrid"
    )
