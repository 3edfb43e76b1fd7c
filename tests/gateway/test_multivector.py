"""/v1/multi-vector, TEI's /embed_all and MaxSim reranking through the gateway binary in front of a
REAL torch worker serving a random-weight bge-m3 as multivector (testing.families): each token's
vector against bge-m3's own recipe run on `transformers`. Vectors cross the wire as float16."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pytest

from embedfleet.common.modeldir import load_model_dir
from embedfleet.common.similarity import min_cosine
from embedfleet.testing import families
from embedfleet.testing.families import TEXTS, FamilyDirs

from .helpers import Gateway, bge_m3_served_as

Vectors = npt.NDArray[np.float32]


@pytest.fixture(scope="module")
def colbert(family_dirs: FamilyDirs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    yield from bge_m3_served_as("multivector", family_dirs, tmp_path_factory.mktemp("colbert"))


@pytest.fixture(scope="module")
def reference(family_dirs: FamilyDirs) -> dict[str, Vectors]:
    """bge-m3's colbert vectors of each of TEXTS[:4], and their token counts."""
    path = family_dirs.get("bge-m3")
    tok = load_model_dir(path).tokenizer()
    texts = TEXTS[:4]
    vectors = families.bge_m3_colbert(path, [tok.encode(t).ids for t in texts])
    return dict(zip(texts, vectors, strict=True))


def test_each_input_gets_its_token_vectors(colbert: Gateway, reference: dict[str, Vectors]) -> None:
    texts = list(reference)[:3]
    doc = colbert.ok("/v1/multi-vector", {"input": texts})
    assert doc["object"] == "list"
    assert [d["index"] for d in doc["data"]] == [0, 1, 2]
    for text, entry in zip(texts, doc["data"], strict=True):
        assert entry["object"] == "multi_vector"
        got = np.asarray(entry["embedding"], np.float32)
        want = reference[text]
        assert got.shape == want.shape  # bge-m3 has no vector for its CLS token
        assert min_cosine(got, want) >= 0.999
    tokens = sum(len(reference[t]) + 1 for t in texts)
    assert doc["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    encoded = colbert.ok("/v1/multi-vector", {"input": texts[0], "encoding_format": "base64"})
    raw = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), "<f4")
    np.testing.assert_array_equal(raw, np.ravel(np.asarray(doc["data"][0]["embedding"], "<f4")))


def test_tei_embed_all_answers_a_vector_per_token(
    colbert: Gateway, reference: dict[str, Vectors]
) -> None:
    text = list(reference)[1]
    [one] = colbert.ok("/embed_all", {"inputs": text})
    assert min_cosine(np.asarray(one, np.float32), reference[text]) >= 0.999
    assert colbert.ok("/", {"inputs": [text]}) == [one]  # POST / takes a multivector model here


def test_rerank_scores_by_max_sim(colbert: Gateway, reference: dict[str, Vectors]) -> None:
    query, *documents = list(reference)
    doc = colbert.ok("/v1/rerank", {"query": query, "documents": documents})
    q = reference[query]
    want = {i: float((q @ reference[d].T).max(axis=1).sum()) for i, d in enumerate(documents)}
    got = {r["index"]: r["relevance_score"] for r in doc["results"]}
    assert got == pytest.approx(want, abs=2e-2)
    assert [r["index"] for r in doc["results"]] == sorted(want, key=lambda i: -want[i])
