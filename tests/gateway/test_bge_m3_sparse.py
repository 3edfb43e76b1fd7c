"""/v1/sparse_embeddings and TEI's /embed_sparse through the gateway binary in front of a REAL
torch worker serving a random-weight bge-m3 with --task sparse (testing.families): its lexical
weights (sparse_linear.pt) against FlagEmbedding's rule run on `transformers`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from embedfleet.common.modeldir import load_model_dir
from embedfleet.testing import families
from embedfleet.testing.families import TEXTS, FamilyDirs

from .helpers import Gateway, bge_m3_served_as


@pytest.fixture(scope="module")
def lexical(family_dirs: FamilyDirs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    yield from bge_m3_served_as("sparse", family_dirs, tmp_path_factory.mktemp("lexical"))


def test_sparse_routes_serve_bge_m3s_lexical_weights(
    lexical: Gateway, family_dirs: FamilyDirs
) -> None:
    path = family_dirs.get("bge-m3")
    model = load_model_dir(path, "sparse")
    texts = [*TEXTS[:3], "the the the cat"]
    tok = model.tokenizer()
    want = families.bge_m3_lexical(path, [tok.encode(t).ids for t in texts])
    doc = lexical.ok("/v1/sparse_embeddings", {"input": texts})
    for entry, weights in zip(doc["data"], want, strict=True):
        assert entry["dimensions"] == model.vocab_size
        ids = sorted(weights)
        assert entry["embedding"]["indices"] == ids
        # float32's rounding is absolute to the weights' scale (up to ~1): a weight of 0.0012
        # differed by 1.5e-7 (1.2e-4 of it) once, batched four texts to one against alone.
        values = [weights[i] for i in ids]
        assert entry["embedding"]["values"] == pytest.approx(values, rel=1e-4, abs=1e-6)
    [tei] = lexical.ok("/embed_sparse", {"inputs": texts[-1]})
    assert [p["index"] for p in tei] == sorted(want[-1])
    assert [p["value"] for p in tei] == pytest.approx(
        [want[-1][i] for i in sorted(want[-1])], rel=1e-4
    )


def test_a_lexical_model_is_named_as_one(lexical: Gateway) -> None:
    """The wrong-route 400 and TEI's /info say what the model is: bge-m3's lexical weights, not
    SPLADE."""
    error = lexical.error("/v1/embeddings", {"input": "a"}, 400)
    assert "is a sparse (bge-m3 lexical weights) embedding model;" in error["message"]
    info = lexical.request("GET", "/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "lexical"}}
