"""/v1/rerank and /v1/score on each kind of model: a bi-encoder by the cosine of its vectors (FAKE
workers, fakes.py), a BERT cross-encoder's pairs with their type ids (FAKE workers), the XLM-R and
Qwen3 yes/no rerankers of testing.families behind a REAL null-engine worker (its score of a pair
is the pair's tokens, so the scores are the expected tokenization), and a plain Qwen3 causal LM
served with --task score behind a worker computing with torch, against the model card."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedfleet.common import judge_prompt
from embedfleet.common.modeldir import ModelDir, default_model_path, load_model_dir
from embedfleet.testing import families
from embedfleet.testing.families import TEXTS, FamilyDirs

from .helpers import LIMITS, Gateway, behind_worker, fake_fleet

QUERY = TEXTS[0]
DOCUMENTS = list(TEXTS[1:])
LONG = "the quick brown fox jumps over the lazy dog " * 120  # over 512 tokens of either
HUGE = "the quick brown fox jumps over the lazy dog " * 3000  # past the first window


# --- a bi-encoder: the cosine of the fakes' rows ------------------------------------------------


def cosines(minilm: ModelDir, query: str, documents: list[str]) -> list[float]:
    """The cosine of the fakes' rows [CLS, SEP, tokens, 0] of the query and each document."""
    tok = minilm.tokenizer()

    def row(text: str) -> np.ndarray:
        return np.array([101, 102, len(tok.encode(text).ids), 0], dtype=np.float64)

    q = row(query)
    return [float(q @ row(d) / (np.linalg.norm(q) * np.linalg.norm(row(d)))) for d in documents]


def test_a_bi_encoder_reranks_by_cosine_embedding_each_text_once(
    fakes: Gateway, minilm: ModelDir
) -> None:
    docs = ["a thing", "b", "a thing"]
    doc = fakes.ok("/v1/rerank", {"query": "what is it", "documents": docs})
    want = cosines(minilm, "what is it", docs)
    assert [r["index"] for r in doc["results"]] == [0, 2, 1]  # ties keep their order
    np.testing.assert_allclose([r["relevance_score"] for r in doc["results"]],
                               [want[0], want[2], want[1]], atol=1e-6)  # fmt: skip
    assert "document" not in doc["results"][0]
    assert doc["usage"] == {"prompt_tokens": 12, "total_tokens": 12}  # 5 + 4 + 3: "a thing" once
    assert fakes.calls() == [3]
    top = fakes.ok("/v1/rerank", {"query": "q", "documents": [{"text": "one", "extra": 1}, "two"],
                                  "top_n": 1, "return_documents": True})  # fmt: skip
    assert [(r["index"], r["document"]) for r in top["results"]] == [(0, {"text": "one"})]
    past = fakes.ok("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": 9})
    assert [r["index"] for r in past["results"]] == [0]
    cut = fakes.ok("/v1/rerank", {"query": "q", "documents": [LONG], "truncate": True,
                                  "truncation_side": "left"})  # fmt: skip
    assert cut["usage"]["prompt_tokens"] == 3 + 256
    fakes.calls()


@pytest.mark.parametrize(
    ("body", "scores", "tokens", "calls"),
    [
        ({"text_1": "a", "text_2": "b"}, 1, 6, [2]),
        ({"text_1": "a", "text_2": ["b", "c", "b"]}, 3, 9, [3]),
        ({"text_1": ["b", "c"], "text_2": "a"}, 2, 9, [3]),
        ({"text_1": ["a", "b"], "text_2": ["c", "d"]}, 2, 12, [4]),
    ],
)
def test_a_bi_encoder_scores_one_to_one_one_to_many_and_pairs(
    fakes: Gateway, body: dict[str, Any], scores: int, tokens: int, calls: list[int]
) -> None:
    doc = fakes.ok("/v1/score", body)
    assert doc["object"] == "list"
    assert [(d["object"], d["index"]) for d in doc["data"]] == [("score", i) for i in range(scores)]
    # every one-word text is the same fake row [CLS, SEP, 3, 0]: cosine 1
    np.testing.assert_allclose([d["score"] for d in doc["data"]], [1.0] * scores, atol=1e-6)
    assert doc["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert fakes.calls() == calls


# --- a BERT cross-encoder: pairs with type ids ---------------------------------------------------


def bert_cross_encoder(directory: Path) -> Path:
    """MiniLM's tokenizer under a one-label BertForSequenceClassification config: a cross-encoder
    as the gateway sees one (the fakes compute nothing)."""
    directory.mkdir()
    for f in default_model_path().iterdir():
        if f.is_file() and f.name not in ("config.json", "modules.json"):
            (directory / f.name).symlink_to(f)
    config = json.loads((default_model_path() / "config.json").read_text())
    config.update(architectures=["BertForSequenceClassification"], id2label={"0": "LABEL_0"},
                  label2id={"LABEL_0": 0})  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_a_cross_encoder_scores_pairs_with_their_type_ids(minilm: ModelDir, tmp_path: Path) -> None:
    model = bert_cross_encoder(tmp_path / "cross")
    settings = {**LIMITS, "model": model, "chunk_tokens": 16, "min_chunk_tokens": 1}
    with fake_fleet(settings, tmp_path / "gateway.log") as gateway:
        docs = ["one", "one two three four", "one two", "one two three four five six seven"]
        doc = gateway.ok("/v1/rerank", {"query": "a query", "documents": docs, "top_n": 3})
        pairs = [minilm.tokenizer().encode("a query", d) for d in docs]
        # The fake scores a pair by its document segment's tokens ([SEP] included).
        want = [sum(p.type_ids) for p in pairs]
        assert [r["index"] for r in doc["results"]] == [3, 1, 2]
        assert [r["relevance_score"] for r in doc["results"]] == [want[3], want[1], want[2]]
        assert doc["usage"]["total_tokens"] == sum(len(p.ids) for p in pairs)
        assert len(gateway.calls()) >= 2  # split into several chunks
        error = gateway.error("/v1/embeddings", {"input": "x"}, 400)
        assert error["param"] == "model"
        assert "cross-encoder" in error["message"]


# --- the families' rerankers behind a null-engine worker -----------------------------------------


@dataclass
class Reranker:
    gateway: Gateway
    model: ModelDir
    kind: str
    limit: int

    def tokens(self, query: str, document: str, instruction: str | None = None) -> int:
        """The pair's tokens as the model reads it (the null engine's score of it)."""
        tok = self.model.tokenizer()
        if self.kind == "cross-encoder":
            return len(tok.encode(query, document).ids)
        frame = judge_prompt.body(instruction or judge_prompt.DEFAULT_INSTRUCTION, query, document)
        parts = (judge_prompt.PREFIX, frame, judge_prompt.SUFFIX)
        return sum(len(tok.encode(p, add_special_tokens=False).ids) for p in parts)


#: kind -> family, extra settings of the gateway and the worker, the served limit
MODELS: dict[str, tuple[str, dict[str, object], int]] = {
    "cross-encoder": ("bge-reranker-base", {}, 512),
    "yes-no": ("Qwen3-Reranker-0.6B", {"max_input_tokens": 160}, 160),
}


@pytest.fixture(scope="module", params=list(MODELS))
def reranker(
    request: pytest.FixtureRequest,
    family_dirs: FamilyDirs,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Reranker]:
    family, extra, limit = MODELS[request.param]
    path = family_dirs.get(family)
    with behind_worker(path, tmp_path_factory.mktemp("reranker"), extra) as gateway:
        yield Reranker(gateway, load_model_dir(path), request.param, limit)


#: (query, documents, extra fields)
ANSWERED: dict[str, tuple[str, list[Any], dict[str, Any]]] = {
    "the family's texts": (QUERY, DOCUMENTS, {}),
    "duplicates and objects": ("what is it", ["a thing", {"text": "b"}, "a thing"], {}),
    "top_n with documents": (QUERY, DOCUMENTS, {"top_n": 3, "return_documents": True}),
}


@pytest.mark.parametrize("name", list(ANSWERED))
def test_rerank_scores_are_the_pairs_as_the_model_reads_them(reranker: Reranker, name: str) -> None:
    query, documents, extra = ANSWERED[name]
    texts = [d if isinstance(d, str) else d["text"] for d in documents]
    want = [reranker.tokens(query, d) for d in texts]
    doc = reranker.gateway.ok("/v1/rerank", {"query": query, "documents": documents, **extra})
    order = list(np.argsort(-np.array(want), kind="stable"))[: extra.get("top_n")]
    assert [r["index"] for r in doc["results"]] == order
    assert [r["relevance_score"] for r in doc["results"]] == [want[i] for i in order]
    if extra.get("return_documents"):
        assert [r["document"]["text"] for r in doc["results"]] == [texts[i] for i in order]
    assert doc["usage"]["total_tokens"] == sum(want)


def test_score_is_the_pairs_as_the_model_reads_them(reranker: Reranker) -> None:
    doc = reranker.gateway.ok("/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS})
    want = [reranker.tokens(QUERY, d) for d in DOCUMENTS]
    assert [d["score"] for d in doc["data"]] == want
    pairs = reranker.gateway.ok("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d e"]})
    assert [d["score"] for d in pairs["data"]] == [reranker.tokens("a", "c"),
                                                   reranker.tokens("b", "d e")]  # fmt: skip


def test_long_pairs_are_cut_to_the_limit_or_refused(reranker: Reranker) -> None:
    """Truncated pairs fill the limit exactly, on either side, whichever side is long; refused,
    they name the param documents and the limit."""
    gateway = reranker.gateway
    for side in ("left", "right"):
        for query, document in ((QUERY, LONG), (LONG, "short"), (HUGE, LONG), (QUERY, HUGE)):
            body = {"query": query, "documents": [document], "truncate": True}
            doc = gateway.ok("/v1/rerank", {**body, "truncation_side": side})
            assert doc["results"][0]["relevance_score"] == reranker.limit
    for body in ({"query": QUERY, "documents": ["a", LONG]}, {"query": HUGE, "documents": ["a"]}):
        error = gateway.error("/v1/rerank", body, 400)
        assert (error["param"], error["code"]) == ("documents", "context_length_exceeded")
        assert f"more than this model's limit of {reranker.limit}." in error["message"]
    error = gateway.error("/v1/score", {"text_1": "a", "text_2": ["b", LONG]}, 400)
    assert error["message"].startswith("Input 1 has ")
    mixed = gateway.ok("/v1/score", {"text_1": [QUERY, LONG], "text_2": "x", "truncate": True})
    assert [d["score"] for d in mixed["data"]] == [reranker.tokens(QUERY, "x"), reranker.limit]


def test_the_instruction_goes_into_the_judging_frame(reranker: Reranker) -> None:
    """A yes/no reranker's pair is longer by a longer instruction; a cross-encoder refuses any."""
    gateway = reranker.gateway
    for instruction in ("Find", "Find the capital of the country named", ""):
        body = {"query": "q", "documents": ["d"], "instruction": instruction}
        if reranker.kind == "cross-encoder":
            error = gateway.error("/v1/rerank", body, 400)
            assert error["param"] == "instruction"
            assert error["message"].startswith("'instruction' applies only to prompt-template")
        elif instruction:
            doc = gateway.ok("/v1/rerank", body)
            assert doc["usage"]["total_tokens"] == reranker.tokens("q", "d", instruction)
        else:
            error = gateway.error("/v1/rerank", body, 400)
            assert error["message"] == "'instruction' must not be empty."
    error = gateway.error("/v1/rerank", {"query": "q", "documents": ["d"], "instruction": 3}, 400)
    assert error["message"] == "'instruction': Input should be a valid string."


def test_other_routes_are_refused_naming_the_reranking_routes(reranker: Reranker) -> None:
    gateway = reranker.gateway
    name = reranker.model.name
    for route in ("/v1/embeddings", "/v1/classify", "/v1/sparse_embeddings"):
        error = gateway.error(route, {"input": "x"}, 400)
        assert error["param"] == "model", route
        assert error["message"].startswith(
            f"'{name}' is a cross-encoder reranker (it scores query-document pairs);"
        )
        assert error["message"].endswith("Use /v1/rerank or /v1/score.")
    # What comes first: the fields of the request, the model's name, then its task.
    assert gateway.error("/v1/classify", {"input": "x", "top_k": 0}, 400)["param"] == "top_k"
    unknown = gateway.error("/v1/embeddings", {"input": "x", "model": "m"}, 404)
    assert unknown["message"] == f"The model 'm' does not exist; this server serves '{name}'."


def test_reranking_counts_requests_tokens_and_chunks(reranker: Reranker) -> None:
    series = [
        ("embedfleet_gateway_requests_total", {"route": "/v1/rerank", "code": "200"}),
        ("embedfleet_gateway_requests_total", {"route": "/v1/rerank", "code": "400"}),
        ("embedfleet_gateway_requests_total", {"route": "/v1/score", "code": "200"}),
        ("embedfleet_gateway_input_tokens_total", {}),
        ("embedfleet_gateway_chunks_per_request_count", {}),
        ("embedfleet_gateway_chunks_per_request_sum", {}),
    ]
    requests = [
        ("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS}),
        ("/v1/rerank", {"query": QUERY, "documents": [LONG]}),
        ("/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS[:4]}),
    ]
    moved = reranker.gateway.deltas(series, requests)
    tokens = sum(reranker.tokens(QUERY, d) for d in DOCUMENTS + DOCUMENTS[:4])
    assert moved[:5] == (1, 1, 1, tokens, 2)
    assert moved[5] > 2  # the pairs went as several chunks (64-token chunks: SMALL_CHUNKS)


# --- --task score makes a plain Qwen3 causal LM a yes/no reranker ------------------------------


def test_task_score_scores_a_plain_qwen3_as_the_model_card(
    family_dirs: FamilyDirs, tmp_path: Path
) -> None:
    """Named without "reranker", the checkpoint embeds; --task score (model.task: score in the
    CRD) makes worker and gateway score it by its yes/no logits."""
    plain = tmp_path / "judge"
    shutil.copytree(family_dirs.get("Qwen3-Reranker-8B"), plain)
    assert load_model_dir(plain).task == "embed"
    extra: dict[str, object] = {"task": "score", "max_input_tokens": 160}
    with behind_worker(plain, tmp_path, extra, engine="torch") as gateway:
        for instruction in (None, "Given a claim, find documents that refute it"):
            given = {"instruction": instruction} if instruction else {}
            pairs = [(QUERY, d) for d in DOCUMENTS[:4]]
            want = families.qwen3_reranker_scores(plain, pairs, instruction)
            body = {"text_1": QUERY, "text_2": DOCUMENTS[:4], **given}
            scored = gateway.ok("/v1/score", body)["data"]
            # the card's code batches left-padded, the worker its own way: 1e-3, not the bit
            np.testing.assert_allclose([d["score"] for d in scored], want, rtol=0, atol=1e-3)
            body = {"query": QUERY, "documents": DOCUMENTS[:4], "top_n": 2, **given}
            results = gateway.ok("/v1/rerank", body)["results"]
            assert [r["index"] for r in results] == list(np.argsort(-want, kind="stable")[:2])
        for route in ("/v1/embeddings", "/v1/sparse_embeddings", "/v1/classify"):
            error = gateway.error(route, {"input": "x"}, 400)
            assert error["message"].endswith("Use /v1/rerank or /v1/score."), route
