"""Classifiers through both gateways: finbert's three softmax labels and go_emotions' 28
multi-label ones, random-weight checkpoints of testing.families, each behind one REAL worker
process with the null engine, whose row of an input is [its tokens, the sum of its ids, its first
id, 0, ...]: equal rows are equal tokenization, and the zeros' order shows the ties kept in label
order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from embedfleet.common.modeldir import load_model_dir
from embedfleet.testing.families import TEXTS, FamilyDirs

from .conftest import behind_worker
from .pair import Pair

FAMILIES = ("finbert", "go_emotions")
LONG = "the quick brown fox jumps over the lazy dog " * 120  # over 512 tokens of either
HUGE = "the quick brown fox jumps over the lazy dog " * 3000  # past the first window

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "one text": ("/v1/classify", {"input": TEXTS[0]}),
    "the family's texts": ("/v1/classify", {"input": list(TEXTS)}),
    "top_k one": ("/v1/classify", {"input": TEXTS[:2], "top_k": 1}),
    "top_k past the labels": ("/v1/classify", {"input": "x", "top_k": 99}),
    "raw scores": ("/v1/classify", {"input": TEXTS[:3], "raw_scores": True}),
    "served model named": ("/v1/classify", {"input": "x", "model": None}),
    "truncate a long text": ("/v1/classify", {"input": [LONG, "x"], "truncate": True}),
    "truncate a huge text left": (
        "/v1/classify",
        {"input": HUGE, "truncate": True, "truncation_side": "left"},
    ),
    "unicode": ("/v1/classify", {"input": ["héllo wörld", "日本語のテキスト", "emoji 🙂"]}),
    "unknown fields": ("/v1/classify", {"input": "x", "input_type": "query", "other": 1}),
    # errors, in the schema's field order and then the service's
    "missing input": ("/v1/classify", {}),
    "input a number": ("/v1/classify", {"input": 1}),
    "input token ids": ("/v1/classify", {"input": [1, 2]}),
    "input lists of token ids": ("/v1/classify", {"input": [[1, 2]]}),
    "input mixed": ("/v1/classify", {"input": ["a", 1]}),
    "no input": ("/v1/classify", {"input": []}),
    "an empty text": ("/v1/classify", {"input": ["a", ""]}),
    "too many texts": ("/v1/classify", {"input": ["a"] * 65}),
    "top_k zero": ("/v1/classify", {"input": "x", "top_k": 0}),
    "top_k a float": ("/v1/classify", {"input": "x", "top_k": 1.0}),
    "raw_scores not a bool": ("/v1/classify", {"input": "x", "raw_scores": 1}),
    "truncate not a bool": ("/v1/classify", {"input": "x", "truncate": "yes"}),
    "truncation_side wrong": ("/v1/classify", {"input": "x", "truncation_side": "up"}),
    "model not a string": ("/v1/classify", {"input": "x", "model": 3}),
    "unknown model": ("/v1/classify", {"input": "x", "model": "m"}),
    "a long text": ("/v1/classify", {"input": ["a", LONG]}),
    "a huge text": ("/v1/classify", {"input": HUGE}),
    "too many tokens": (
        "/v1/classify",
        {"input": [LONG + str(i) for i in range(60)], "truncate": True},
    ),
    "embeddings refused": ("/v1/embeddings", {"input": "x"}),
    "rerank refused": ("/v1/rerank", {"query": "q", "documents": ["d"]}),
    "score refused": ("/v1/score", {"text_1": "a", "text_2": "b"}),
    "rerank refused before the instruction": (
        "/v1/rerank",
        {"query": "q", "documents": ["d"], "instruction": "i"},
    ),
}


@dataclass
class Classifier:
    pair: Pair
    labels: tuple[str, ...]

    def compare(self, path: str, body: Any) -> Any:
        return self.pair.compare("POST", path, content=orjson.dumps(body))


@pytest.fixture(scope="module", params=FAMILIES)
def classifier(
    request: pytest.FixtureRequest,
    family_dirs: FamilyDirs,
    rust_binary: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Classifier]:
    """Both gateways in front of one null-engine worker serving the classifier."""
    path = family_dirs.get(request.param)
    with behind_worker(path, tmp_path_factory.mktemp("classifier")) as pair:
        yield Classifier(pair, load_model_dir(path).labels)


@pytest.mark.parametrize("name", list(CASES))
def test_classifier_answers_equal(classifier: Classifier, name: str) -> None:
    path, body = CASES[name]
    doc = classifier.compare(path, body)
    if "error" in doc:
        return
    labels = classifier.labels
    for i, row in enumerate(doc["data"]):
        assert row["index"] == i
        assert row["num_classes"] == len(row["probs"]) == len(labels)
        scores = [x["score"] for x in row["labels"]]
        assert scores == sorted(scores, reverse=True)
        assert (row["label"], row["score"]) == (row["labels"][0]["label"], scores[0])
        assert len(row["labels"]) == min(body.get("top_k") or len(labels), len(labels))
    # The null engine's first column is the input's tokens, all of which the usage counts.
    assert sum(row["probs"][0] for row in doc["data"]) == doc["usage"]["total_tokens"]


def test_ties_keep_the_label_order(classifier: Classifier) -> None:
    """The null engine's zeros (every label past the third, and more) tie: listed in label
    order."""
    row = classifier.compare("/v1/classify", {"input": "x"})["data"][0]
    zeros = [x["label"] for x in row["labels"] if x["score"] == 0]
    assert len(zeros) >= len(classifier.labels) - 3
    assert zeros == [classifier.labels[k] for k, v in enumerate(row["probs"]) if v == 0]


def test_other_routes_are_refused_naming_the_classify_route(classifier: Classifier) -> None:
    for path, body in (
        ("/v1/embeddings", {"input": "x"}),
        ("/v1/score", {"text_1": "a", "text_2": "b"}),
    ):
        error = classifier.compare(path, body)["error"]
        assert error["param"] == "model"
        assert "is a sequence classifier;" in error["message"]
        assert error["message"].endswith("Use /v1/classify.")


def test_classifier_metrics_count_alike(classifier: Classifier) -> None:
    """The same requests move the same series by the same amounts (tokens, chunks, codes)."""
    series = [
        ("embedfleet_gateway_requests_total", {"route": "/v1/classify", "code": "200"}),
        ("embedfleet_gateway_requests_total", {"route": "/v1/classify", "code": "400"}),
        ("embedfleet_gateway_requests_total", {"route": "/v1/rerank", "code": "400"}),
        ("embedfleet_gateway_input_tokens_total", {}),
        ("embedfleet_gateway_tokenize_seconds_count", {}),
        ("embedfleet_gateway_chunks_per_request_count", {}),
        ("embedfleet_gateway_chunks_per_request_sum", {}),
        ("embedfleet_gateway_upstream_seconds_count", {}),
    ]
    requests = [
        ("/v1/classify", {"input": list(TEXTS)}),
        ("/v1/classify", {"input": [LONG]}),
        ("/v1/rerank", {"query": "q", "documents": ["d"]}),
    ]
    deltas = classifier.pair.metric_deltas(series, requests)
    assert deltas[0] == deltas[1]
    assert deltas[0][:3] == (1, 1, 1)
    assert deltas[0][6] > 1  # the texts went as several chunks
