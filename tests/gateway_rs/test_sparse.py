"""SPLADE through both gateways: naver's splade structure as a random-weight checkpoint of
testing.families, behind one REAL worker process with the null engine, whose vector of an input
is its tokens, the sum of its ids and its first id at vocabulary ids 0, 1 and 2 (zeros dropped):
equal vectors are equal tokenization, and top_k and threshold show in which entries remain. Models
of the other tasks refuse the sparse route alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from embedfleet.common.modeldir import ModelDir, load_model_dir
from embedfleet.testing.families import TEXTS, FamilyDirs

from .conftest import behind_worker
from .pair import Pair
from .test_rerankers import MODELS as RERANKERS

LONG = "the quick brown fox jumps over the lazy dog " * 120  # over 512 tokens
HUGE = "the quick brown fox jumps over the lazy dog " * 3000  # past the first window
ROUTE = "/v1/sparse_embeddings"

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "one text": (ROUTE, {"input": TEXTS[0]}),
    "the family's texts": (ROUTE, {"input": list(TEXTS)}),
    "token ids": (ROUTE, {"input": [5, 6, 7]}),
    "lists of token ids": (ROUTE, {"input": [[5, 6], [7, 8, 9, 10]]}),
    "top_k one": (ROUTE, {"input": TEXTS[:2], "top_k": 1}),
    "top_k past the entries": (ROUTE, {"input": "x", "top_k": 999}),
    "a threshold": (ROUTE, {"input": TEXTS[:3], "threshold": 20.5}),
    "an integer threshold": (ROUTE, {"input": TEXTS[:3], "threshold": 12}),
    "threshold null": (ROUTE, {"input": "x", "threshold": None}),
    "input_type query": (ROUTE, {"input": "x", "input_type": "query"}),
    "truncate a long text": (ROUTE, {"input": [LONG, "x"], "truncate": True}),
    "truncate a huge text left": (
        ROUTE,
        {"input": HUGE, "truncate": True, "truncation_side": "left"},
    ),
    "truncate long token ids": (ROUTE, {"input": [list(range(5, 300)) * 2], "truncate": True}),
    "unicode": (ROUTE, {"input": ["héllo wörld", "日本語のテキスト", "emoji 🙂"]}),
    # errors, in the schema's field order and then the service's
    "missing input": (ROUTE, {}),
    "input a number": (ROUTE, {"input": 1}),
    "input mixed": (ROUTE, {"input": ["a", 1]}),
    "no input": (ROUTE, {"input": []}),
    "an empty text": (ROUTE, {"input": ["a", ""]}),
    "an empty list of ids": (ROUTE, {"input": [[1], []]}),
    "an id outside the vocabulary": (ROUTE, {"input": [1, 10_000_000]}),
    "a negative id": (ROUTE, {"input": [-1]}),
    "too many texts": (ROUTE, {"input": ["a"] * 65}),
    "top_k zero": (ROUTE, {"input": "x", "top_k": 0}),
    "threshold negative": (ROUTE, {"input": "x", "threshold": -0.5}),
    "threshold a string": (ROUTE, {"input": "x", "threshold": "1"}),
    "threshold a bool": (ROUTE, {"input": "x", "threshold": True}),
    "input_type wrong": (ROUTE, {"input": "x", "input_type": "passage"}),
    "unknown model": (ROUTE, {"input": "x", "model": "m"}),
    "a long text": (ROUTE, {"input": ["a", LONG]}),
    "a huge text": (ROUTE, {"input": HUGE}),
    "long token ids": (ROUTE, {"input": list(range(5, 300)) * 2}),
    "too many tokens": (ROUTE, {"input": [LONG + str(i) for i in range(60)], "truncate": True}),
    "embeddings refused": ("/v1/embeddings", {"input": "x"}),
    "classify refused": ("/v1/classify", {"input": "x"}),
    "rerank refused": ("/v1/rerank", {"query": "q", "documents": ["d"]}),
}


#: non-SPLADE families (the embedding model is test_differential's) -> their settings, and the
#: route their refusal sends clients to
OTHER_TASKS: dict[str, tuple[dict[str, object], str]] = {
    "finbert": ({}, "Use /v1/classify."),
    "go_emotions": ({}, "Use /v1/classify."),
    **{family: (extra, "Use /v1/rerank or /v1/score.") for family, extra, _ in RERANKERS.values()},
}
#: sparse requests a model of another task refuses, valid or not (which check comes first shows)
REFUSED: dict[str, dict[str, Any]] = {
    "one text": {"input": "x"},
    "token ids": {"input": [5, 6, 7]},
    "top_k and threshold": {"input": TEXTS[:2], "top_k": 2, "threshold": 0.5},
    "no input": {"input": []},
    "an empty text": {"input": ["a", ""]},
    "threshold negative": {"input": "x", "threshold": -1},
    "top_k zero": {"input": "x", "top_k": 0},
    "unknown model": {"input": "x", "model": "m"},
    "missing input": {},
}


@pytest.fixture(scope="module")
def splade(
    family_dirs: FamilyDirs, rust_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Pair, ModelDir]]:
    """Both gateways in front of one null-engine worker serving the SPLADE model."""
    path = family_dirs.get("splade")
    with behind_worker(path, tmp_path_factory.mktemp("splade")) as pair:
        yield pair, load_model_dir(path)


@pytest.mark.parametrize("name", list(CASES))
def test_sparse_answers_equal(splade: tuple[Pair, ModelDir], name: str) -> None:
    pair, model = splade
    path, body = CASES[name]
    doc = pair.compare("POST", path, content=orjson.dumps(body))
    if "error" in doc:
        return
    for i, row in enumerate(doc["data"]):
        assert (row["index"], row["dimensions"]) == (i, model.vocab_size)
        indices, values = row["embedding"]["indices"], row["embedding"]["values"]
        assert indices == sorted(indices)
        assert len(indices) == len(values) <= (body.get("top_k") or 3)
        assert all(v > (body.get("threshold") or 0) for v in values)


def test_the_usage_is_the_tokens_the_worker_embedded(splade: tuple[Pair, ModelDir]) -> None:
    pair, _ = splade
    doc = pair.compare("POST", ROUTE, content=orjson.dumps({"input": list(TEXTS)}))
    # index 0 holds the input's tokens in the null engine's vector
    assert sum(r["embedding"]["values"][0] for r in doc["data"]) == doc["usage"]["total_tokens"]


def test_other_routes_are_refused_naming_the_sparse_route(splade: tuple[Pair, ModelDir]) -> None:
    pair, _ = splade
    error = pair.compare("POST", "/v1/embeddings", content=b'{"input":"x"}')["error"]
    assert error["param"] == "model"
    assert "is a sparse (SPLADE) embedding model;" in error["message"]
    assert error["message"].endswith("Use /v1/sparse_embeddings.")


def test_sparse_metrics_count_alike(splade: tuple[Pair, ModelDir]) -> None:
    pair, _ = splade
    series = [
        ("embedfleet_gateway_requests_total", {"route": ROUTE, "code": "200"}),
        ("embedfleet_gateway_requests_total", {"route": ROUTE, "code": "400"}),
        ("embedfleet_gateway_input_tokens_total", {}),
        ("embedfleet_gateway_tokenize_seconds_count", {}),
        ("embedfleet_gateway_chunks_per_request_sum", {}),
        ("embedfleet_gateway_upstream_seconds_count", {}),
    ]
    requests = [
        (ROUTE, {"input": list(TEXTS)}),
        (ROUTE, {"input": [[5, 6, 7]]}),
        (ROUTE, {"input": [LONG]}),
    ]
    deltas = pair.metric_deltas(series, requests)
    assert deltas[0] == deltas[1]
    assert deltas[0][:2] == (2, 1)
    assert deltas[0][4] > 2  # the texts went as several chunks


@pytest.fixture(scope="module", params=list(OTHER_TASKS))
def other_task(
    request: pytest.FixtureRequest,
    family_dirs: FamilyDirs,
    rust_binary: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Pair, str]]:
    """Both gateways in front of one null-engine worker serving a model of another task, and the
    advice its refusal ends with."""
    extra, advice = OTHER_TASKS[request.param]
    path = family_dirs.get(request.param)
    with behind_worker(path, tmp_path_factory.mktemp("other_task"), extra) as pair:
        yield pair, advice


@pytest.mark.parametrize("name", list(REFUSED))
def test_other_tasks_refuse_sparse_alike(other_task: tuple[Pair, str], name: str) -> None:
    pair, _ = other_task
    error = pair.compare("POST", ROUTE, content=orjson.dumps(REFUSED[name]))["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"


def test_other_tasks_name_their_own_route(other_task: tuple[Pair, str]) -> None:
    pair, advice = other_task
    py, rs = pair.both("POST", ROUTE, content=b'{"input":"x"}')
    assert py.status == rs.status == 400
    error = pair.compare("POST", ROUTE, content=b'{"input":"x"}')["error"]
    assert error["param"] == "model"
    assert "/v1/sparse_embeddings needs a sparse (SPLADE) embedding model." in error["message"]
    assert error["message"].endswith(advice)
