"""The client libraries users already have, called as their docs show, through a real local fleet
(conftest.py): only the base URL differs from their usual server. Every vector is within cosine
0.999 of sentence-transformers on the same weights; scores within 0.01 of the reference's cosine.

LangChain's OpenAIEmbeddings runs with check_embedding_ctx_length=False: by default it tokenizes
with tiktoken (an OpenAI tokenizer, not the model's) and sends those token ids, which this model
reads as other words (docs/clients.md)."""

from __future__ import annotations

import cohere
import httpx
import numpy as np
import openai
import pytest
from huggingface_hub import InferenceClient
from langchain_openai import OpenAIEmbeddings

from embedfleet.fleet.supervisor import Fleet
from tests.gateway.test_minilm import TEXTS, Reference, assert_close, cos

pytestmark = pytest.mark.slow

SCORE_TOLERANCE = 0.01
QUERY = "Where does the cat sit?"


def test_openai(fleet: Fleet, name: str, reference: Reference) -> None:
    client = openai.OpenAI(base_url=fleet.url + "/v1", api_key="unused", max_retries=0)
    got = client.embeddings.create(model=name, input=TEXTS)
    assert_close([d.embedding for d in got.data], reference(TEXTS))


def test_huggingface_hub_feature_extraction(fleet: Fleet, reference: Reference) -> None:
    """InferenceClient posts to its base URL itself: TEI's POST /, /embed for this model."""
    client = InferenceClient(base_url=fleet.url)
    for text in TEXTS[:2]:
        assert_close(client.feature_extraction(text), reference([text]))
    cut = client.feature_extraction(" ".join(["word"] * 400), truncate=True)
    assert cut.shape == (1, 384)


def test_huggingface_hub_sentence_similarity(fleet: Fleet, reference: Reference) -> None:
    client = InferenceClient(base_url=fleet.url + "/similarity")
    got = client.sentence_similarity(QUERY, other_sentences=TEXTS)
    want = reference([QUERY, *TEXTS])
    assert len(got) == len(TEXTS)
    for score, row in zip(got, want[1:], strict=True):
        assert abs(score - cos(want[0], row)) < SCORE_TOLERANCE


def test_cohere_embed_by_type(fleet: Fleet, name: str, reference: Reference) -> None:
    client = cohere.ClientV2(base_url=fleet.url, api_key="unused")
    got = client.embed(
        model=name,
        texts=TEXTS,
        input_type="search_document",
        embedding_types=["float", "ubinary"],
    )
    floats = np.asarray(got.embeddings.float_, dtype=np.float32)
    assert_close(floats, reference(TEXTS))
    # ubinary: each dimension's sign bit, 8 a byte, most significant first
    assert got.embeddings.ubinary == np.packbits(floats > 0, axis=1).tolist()
    assert got.texts == TEXTS
    with pytest.raises(cohere.BadRequestError):
        client.embed(model=name, texts=TEXTS, input_type="image", embedding_types=["float"])


def test_cohere_rerank(fleet: Fleet, name: str, reference: Reference) -> None:
    client = cohere.ClientV2(base_url=fleet.url, api_key="unused")
    got = client.rerank(model=name, query=QUERY, documents=TEXTS, top_n=3)
    want = reference([QUERY, *TEXTS])
    scores = [r.relevance_score for r in got.results]
    assert len(scores) == 3
    assert scores == sorted(scores, reverse=True)
    assert got.results[0].index == 0  # the cat sentence
    for r in got.results:
        assert abs(r.relevance_score - cos(want[0], want[r.index + 1])) < SCORE_TOLERANCE


def test_langchain_openai(fleet: Fleet, name: str, reference: Reference) -> None:
    embeddings = OpenAIEmbeddings(
        model=name,
        base_url=fleet.url + "/v1",
        api_key="unused",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    assert_close(embeddings.embed_documents(TEXTS), reference(TEXTS))
    assert_close([embeddings.embed_query(QUERY)], reference([QUERY]))


def test_tei_routes_answer_in_teis_shapes(fleet: Fleet, reference: Reference) -> None:
    """What no client above calls: /rerank, /tokenize, /decode, /info, and TEI's error shape."""
    with httpx.Client(base_url=fleet.url, timeout=60) as http:
        ranks = http.post("/rerank", json={"query": QUERY, "texts": TEXTS, "return_text": True})
        assert ranks.status_code == 200, ranks.text
        assert [r["text"] for r in ranks.json()] == [TEXTS[r["index"]] for r in ranks.json()]
        assert ranks.json()[0]["index"] == 0
        tokens = http.post("/tokenize", json={"inputs": "I like pizza"}).json()[0]
        assert [t["text"] for t in tokens] == ["[CLS]", "I", "like", "pizza", "[SEP]"]
        assert [t["start"] for t in tokens] == [None, 0, 2, 7, None]
        ids = [t["id"] for t in tokens]
        assert http.post("/decode", json={"ids": ids}).json() == ["i like pizza"]
        info = http.get("/info").json()
        assert info["max_input_length"] == 256
        assert "embedding" in info["model_type"]
        embed = http.post("/embed", json={"inputs": TEXTS[:2], "normalize": False}).json()
        assert_close(embed, reference(TEXTS[:2]))
        too_long = http.post("/embed", json={"inputs": " ".join(["word"] * 400)})
        assert too_long.status_code == 413
        assert set(too_long.json()) == {"error", "error_type"}
        assert too_long.json()["error_type"] == "Validation"
        wrong_task = http.post("/predict", json={"inputs": "a"})
        assert wrong_task.status_code == 413
        assert "/v1/embeddings" in wrong_task.json()["error"]
