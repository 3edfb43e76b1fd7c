"""/v1/hybrid-embeddings through the gateway binary in front of a REAL torch worker serving a
random-weight bge-m3 with --task hybrid (testing.families): its dense vector, lexical weights and
token vectors from one forward, each against bge-m3's own recipe run on `transformers`; and every
route an embedder of the same directory answers, from that dense vector."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from embedfleet.common.arrays import FloatArray
from embedfleet.common.modeldir import load_model_dir
from embedfleet.common.similarity import min_cosine
from embedfleet.testing import families
from embedfleet.testing.families import TEXTS, FamilyDirs

from .helpers import Gateway, bge_m3_served_as

ROUTE = "/v1/hybrid-embeddings"


@pytest.fixture(scope="module")
def hybrid(family_dirs: FamilyDirs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    yield from bge_m3_served_as("hybrid", family_dirs, tmp_path_factory.mktemp("hybrid"))


def test_each_input_gets_all_three_outputs(hybrid: Gateway, family_dirs: FamilyDirs) -> None:
    path = family_dirs.get("bge-m3")
    model = load_model_dir(path, "hybrid")
    texts = [*TEXTS[:2], "the the the cat"]
    seqs = [model.tokenizer().encode(t).ids for t in texts]
    dense = families.bge_m3_dense(path, seqs)
    if model.normalize:
        dense /= np.linalg.norm(dense, axis=1, keepdims=True)
    lexical = families.bge_m3_lexical(path, seqs)
    vectors = families.bge_m3_colbert(path, seqs)
    doc = hybrid.ok(ROUTE, {"input": texts})
    assert [d["index"] for d in doc["data"]] == [0, 1, 2]
    for i, entry in enumerate(doc["data"]):
        assert entry["object"] == "hybrid_embedding"
        np.testing.assert_allclose(entry["dense"], dense[i], rtol=1e-4, atol=1e-5)
        ids = sorted(lexical[i])
        assert entry["sparse"]["indices"] == ids
        want = [lexical[i][t] for t in ids]
        assert entry["sparse"]["values"] == pytest.approx(want, rel=1e-4, abs=1e-6)
        got = np.asarray(entry["multi_vector"], np.float32)
        assert got.shape == vectors[i].shape  # no vector for the CLS token
        assert min_cosine(got, vectors[i]) >= 0.999
    tokens = sum(map(len, seqs))
    assert doc["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_outputs_and_encoding_pick_what_comes_back(hybrid: Gateway) -> None:
    text = TEXTS[0]
    [full] = hybrid.ok(ROUTE, {"input": text})["data"]
    [sparse] = hybrid.ok(ROUTE, {"input": text, "outputs": ["sparse"], "top_k": 2})["data"]
    assert set(sparse) == {"object", "index", "sparse"}
    top = np.argsort(full["sparse"]["values"])[::-1][:2]
    assert sparse["sparse"]["indices"] == sorted(full["sparse"]["indices"][i] for i in top)
    body = {"input": text, "outputs": ["multi_vector", "dense"], "encoding_format": "base64"}
    [encoded] = hybrid.ok(ROUTE, body)["data"]
    assert set(encoded) == {"object", "index", "dense", "multi_vector"}
    for key in ("dense", "multi_vector"):
        raw = np.frombuffer(base64.b64decode(encoded[key]), "<f4")
        np.testing.assert_array_equal(raw, np.ravel(np.asarray(full[key], "<f4")))


def test_the_sparse_and_multi_vector_routes_serve_their_output(hybrid: Gateway) -> None:
    """They ask the workers for that output alone; /v1/classify is refused naming the routes
    that serve the model."""
    texts = list(TEXTS[:2])
    full = hybrid.ok(ROUTE, {"input": texts})["data"]
    sparse = hybrid.ok("/v1/sparse_embeddings", {"input": texts})["data"]
    assert [s["embedding"] for s in sparse] == [f["sparse"] for f in full]
    vectors = hybrid.ok("/v1/multi-vector", {"input": texts})["data"]
    assert [v["embedding"] for v in vectors] == [f["multi_vector"] for f in full]
    [tei] = hybrid.ok("/embed_sparse", {"inputs": texts[0]})
    assert [p["index"] for p in tei] == full[0]["sparse"]["indices"]
    error = hybrid.error("/v1/classify", {"input": "a"}, 400)
    assert error["param"] == "model"
    assert "is a hybrid (bge-m3 dense, sparse and multi-vector) model" in error["message"]
    assert error["message"].endswith(
        "Use /v1/hybrid-embeddings, /v1/embeddings, /v1/sparse_embeddings or /v1/multi-vector "
        "(and /v1/rerank, /v1/score by cosine)."
    )


def rows(doc: dict[str, Any]) -> FloatArray:
    return np.asarray([d["embedding"] for d in doc["data"]], np.float32)


def test_the_dense_routes_serve_the_dense_output(hybrid: Gateway) -> None:
    """/v1/embeddings, TEI's /embed (and /, its default route) and Cohere's /v2/embed give the
    hybrid route's dense vectors, with `dimensions` and the encodings as for an embedder."""
    texts = list(TEXTS[:2])
    full = hybrid.ok(ROUTE, {"input": texts, "outputs": ["dense"]})["data"]
    dense = np.asarray([f["dense"] for f in full], np.float32)
    got = rows(hybrid.ok("/v1/embeddings", {"input": texts}))
    assert got.shape == dense.shape
    assert min_cosine(got, dense) >= 0.9999
    cut = rows(hybrid.ok("/v1/embeddings", {"input": texts, "dimensions": 16}))
    assert cut.shape == (2, 16)
    assert min_cosine(cut, dense[:, :16]) >= 0.9999
    encoded = hybrid.ok("/v1/embeddings", {"input": texts, "encoding_format": "base64"})["data"]
    raw = [np.frombuffer(base64.b64decode(e["embedding"]), "<f4") for e in encoded]
    np.testing.assert_array_equal(raw, got)
    signs = hybrid.ok("/v1/embeddings", {"input": texts, "encoding_format": "ubinary"})
    assert rows(signs).astype(np.uint8).tolist() == np.packbits(got > 0, axis=1).tolist()
    for route in ("/embed", "/"):
        tei = np.asarray(hybrid.ok(route, {"inputs": texts}), np.float32)
        assert min_cosine(tei, got) >= 0.9999
    body = {"texts": texts, "embedding_types": ["float"], "output_dimension": 16}
    cohere = np.asarray(hybrid.ok("/v2/embed", body)["embeddings"]["float"], np.float32)
    assert min_cosine(cohere, cut) >= 0.9999


def test_the_pair_routes_score_by_the_dense_cosine(hybrid: Gateway) -> None:
    """/v1/rerank, /v1/score, TEI's /rerank and /similarity and Cohere's /v2/rerank score a pair
    by the cosine of its dense vectors, as for the same model served as an embedder."""
    query, documents = TEXTS[0], list(TEXTS[1:4])
    vectors = rows(hybrid.ok("/v1/embeddings", {"input": [query, *documents]}))
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    want = unit[1:] @ unit[0]
    pair = {"query": query, "documents": documents}
    scores = {
        "/v1/rerank": by_index(hybrid.ok("/v1/rerank", pair)["results"], "relevance_score"),
        "/v2/rerank": by_index(hybrid.ok("/v2/rerank", pair)["results"], "relevance_score"),
        "/rerank": by_index(hybrid.ok("/rerank", {"query": query, "texts": documents}), "score"),
        "/v1/score": [
            d["score"]
            for d in hybrid.ok("/v1/score", {"text_1": query, "text_2": documents})["data"]
        ],
        "/similarity": hybrid.ok(
            "/similarity", {"inputs": {"source_sentence": query, "sentences": documents}}
        ),
    }
    for route, got in scores.items():
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=route)


def by_index(results: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in sorted(results, key=lambda r: r["index"])]
