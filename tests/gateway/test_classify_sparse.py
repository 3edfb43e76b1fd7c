"""/v1/classify and /v1/sparse_embeddings: finbert's three labels, go_emotions' 28 and SPLADE, as
random-weight checkpoints of testing.families behind a REAL null-engine worker, whose row of an
input is [its tokens, the sum of its ids, its first id, 0, ...]: the expected answers follow from
the model's own tokenizer (`transformers`' tokenizers), and the ties among the zeros show labels
kept in label order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from embedfleet.common.modeldir import ModelDir, load_model_dir
from embedfleet.testing.families import TEXTS, FamilyDirs

from .helpers import Gateway, behind_worker

LONG = "the quick brown fox jumps over the lazy dog " * 120  # over 512 tokens
HUGE = "the quick brown fox jumps over the lazy dog " * 3000  # past the first window
INPUT_FORMS = "'input' must be a non-empty string, an array of strings, an array of token ids"


@dataclass
class Served:
    gateway: Gateway
    model: ModelDir

    def row(self, text: str | list[int], truncate: str = "") -> list[float]:
        """The null engine's [tokens, sum of ids, first id] of a text (or of token ids), cut to
        the model's 512 tokens from `truncate`'s side when given."""
        if isinstance(text, list):
            ids = text[:512] if truncate == "right" else text[-512:] if truncate else text
        else:
            tok = self.model.tokenizer()
            if truncate:
                tok.enable_truncation(512, strategy="longest_first", direction=truncate)
            ids = tok.encode(text).ids
        return [len(ids), sum(ids), ids[0]]


def serve(family_dirs: FamilyDirs, family: str, workdir: Path) -> Iterator[Served]:
    path = family_dirs.get(family)
    with behind_worker(path, workdir) as gateway:
        yield Served(gateway, load_model_dir(path))


# --- classifiers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["finbert", "go_emotions"])
def classifier(
    request: pytest.FixtureRequest,
    family_dirs: FamilyDirs,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    yield from serve(family_dirs, request.param, tmp_path_factory.mktemp("classifier"))


#: name -> (texts, extra fields, the side truncation cuts from)
CLASSIFIED: dict[str, tuple[str | list[str], dict[str, Any], str]] = {
    "one text": (TEXTS[0], {}, ""),
    "the family's texts": (list(TEXTS), {}, ""),
    "top_k one": (list(TEXTS[:2]), {"top_k": 1}, ""),
    "top_k past the labels": ("x", {"top_k": 99}, ""),
    "raw scores": (list(TEXTS[:3]), {"raw_scores": True}, ""),
    "unicode": (["héllo wörld", "日本語のテキスト", "emoji 🙂"], {}, ""),
    "unknown fields": ("x", {"input_type": "query", "other": 1, "model": None}, ""),
    "truncate a long text": ([LONG, "x"], {"truncate": True}, "right"),
    "truncate a huge text left": (HUGE, {"truncate": True, "truncation_side": "left"}, "left"),
}


@pytest.mark.parametrize("name", list(CLASSIFIED))
def test_classify_answers_each_text_with_its_labels(classifier: Served, name: str) -> None:
    texts, extra, side = CLASSIFIED[name]
    listed = [texts] if isinstance(texts, str) else texts
    doc = classifier.gateway.ok("/v1/classify", {"input": texts, **extra})
    labels = classifier.model.labels
    assert doc["object"] == "list"
    total = 0
    for i, (text, entry) in enumerate(zip(listed, doc["data"], strict=True)):
        probs = [*classifier.row(text, side), *[0.0] * (len(labels) - 3)]
        total += int(probs[0])
        ranked = sorted(range(len(labels)), key=lambda k: -probs[k])  # stable: ties in order
        kept = ranked[: extra.get("top_k") or len(labels)]
        assert entry == {
            "object": "classification",
            "index": i,
            "label": labels[ranked[0]],
            "score": probs[ranked[0]],
            "labels": [{"label": labels[k], "score": probs[k]} for k in kept],
            "probs": probs,
            "num_classes": len(labels),
        }
    assert doc["usage"] == {"prompt_tokens": total, "total_tokens": total}


def test_tei_predict_and_its_default_route(classifier: Served) -> None:
    """TEI's /predict (and POST /, a classifier's route there): each text's labels best first,
    ties in label order; one text answers a list, a batch a list of lists."""
    labels = classifier.model.labels

    def predictions(text: str) -> list[dict[str, Any]]:
        probs = [*classifier.row(text), *[0.0] * (len(labels) - 3)]
        ranked = sorted(range(len(labels)), key=lambda k: -probs[k])
        return [{"score": probs[k], "label": labels[k]} for k in ranked]

    gateway = classifier.gateway
    assert gateway.ok("/predict", {"inputs": TEXTS[0]}) == predictions(TEXTS[0])
    batch = {"inputs": [[t] for t in TEXTS[:2]]}
    assert gateway.ok("/", batch) == [predictions(t) for t in TEXTS[:2]]
    pair = gateway.post("/predict", {"inputs": ["a", "b"]})
    assert pair.status == 422
    assert pair.json()["error_type"] == "Validation"


#: name -> (body, status, param, code, a part of the message)
CLASSIFY_REFUSED: dict[str, tuple[dict[str, Any], int, str, str | None, str]] = {
    "token ids": ({"input": [1, 2]}, 400, "input", None, INPUT_FORMS),
    "lists of token ids": ({"input": [[1, 2]]}, 400, "input", None, INPUT_FORMS),
    "no input": ({"input": []}, 400, "input", None, "'input' must not be empty."),
    "too many texts": ({"input": ["a"] * 65}, 413, "input", "request_too_large", "holds 65"),
    "top_k zero": ({"input": "x", "top_k": 0}, 400, "top_k", None, "greater than or equal to 1"),
    "raw_scores not a bool": ({"input": "x", "raw_scores": 1}, 400, "raw_scores", None,
                              "valid boolean"),
    "a long text": ({"input": ["a", LONG]}, 400, "input", "context_length_exceeded",
                    "more than this model's limit of 512."),
    "a huge text": ({"input": HUGE}, 400, "input", "context_length_exceeded", "has at least"),
    "too many tokens": ({"input": [LONG + str(i) for i in range(60)], "truncate": True}, 413,
                        "input", "request_too_large", "The request holds 30720 tokens"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CLASSIFY_REFUSED))
def test_classify_refusals(classifier: Served, name: str) -> None:
    body, status, param, code, words = CLASSIFY_REFUSED[name]
    error = classifier.gateway.error("/v1/classify", body, status)
    assert (error["param"], error["code"]) == (param, code)
    assert words in error["message"]


def test_other_routes_are_refused_naming_the_classify_route(classifier: Served) -> None:
    name = classifier.model.name
    gateway = classifier.gateway
    for path, body, needs in (
        ("/v1/embeddings", {"input": "x"}, "an embedding model"),
        ("/v1/rerank", {"query": "q", "documents": ["d"], "instruction": "i"},
         "a cross-encoder reranker (it scores query-document pairs)"),
        ("/v1/score", {"text_1": "a", "text_2": "b"},
         "a cross-encoder reranker (it scores query-document pairs)"),
        ("/v1/sparse_embeddings", {"input": []},
         "a sparse (SPLADE or bge-m3 lexical weights) embedding model"),
    ):  # fmt: skip
        error = gateway.error(path, body, 400)
        assert error["param"] == "model"
        assert error["message"].startswith(f"'{name}' is a sequence classifier; ")
        assert needs in error["message"]
        assert error["message"].endswith("Use /v1/classify.")
    # The request's own fields are checked first, then the model's name, then its task.
    assert gateway.error("/v1/sparse_embeddings", {"input": "x", "threshold": -1}, 400)[
        "param"
    ] == ("threshold")
    assert gateway.error("/v1/sparse_embeddings", {}, 400)["param"] == "input"
    assert gateway.error("/v1/sparse_embeddings", {"input": "x", "model": "m"}, 404)["code"] == (
        "model_not_found"
    )


def test_classify_counts_requests_tokens_and_chunks(classifier: Served) -> None:
    series = [
        ("embedfleet_gateway_requests_total", {"route": "/v1/classify", "code": "200"}),
        ("embedfleet_gateway_requests_total", {"route": "/v1/classify", "code": "400"}),
        ("embedfleet_gateway_input_tokens_total", {}),
        ("embedfleet_gateway_chunks_per_request_sum", {}),
    ]
    requests = [("/v1/classify", {"input": list(TEXTS)}), ("/v1/classify", {"input": [LONG]})]
    moved = classifier.gateway.deltas(series, requests)
    assert moved[:3] == (1, 1, sum(classifier.row(t)[0] for t in TEXTS))
    assert moved[3] > 1  # the texts went as several chunks


# --- SPLADE ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def splade(family_dirs: FamilyDirs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serve(family_dirs, "splade", tmp_path_factory.mktemp("splade"))


ROUTE = "/v1/sparse_embeddings"
#: name -> (input, extra fields, the side truncation cuts from)
SPARSE: dict[str, tuple[Any, dict[str, Any], str]] = {
    "one text": (TEXTS[0], {}, ""),
    "the family's texts": (list(TEXTS), {}, ""),
    "token ids": ([5, 6, 7], {}, ""),
    "lists of token ids": ([[5, 6], [7, 8, 9, 10]], {}, ""),
    "top_k one": (list(TEXTS[:2]), {"top_k": 1}, ""),
    "top_k past the entries": ("x", {"top_k": 999}, ""),
    "a threshold": (list(TEXTS[:3]), {"threshold": 20.5}, ""),
    "an integer threshold": (list(TEXTS[:3]), {"threshold": 12}, ""),
    "threshold null": ("x", {"threshold": None}, ""),
    "input_type query": ("x", {"input_type": "query"}, ""),
    "unicode": (["héllo wörld", "日本語のテキスト", "emoji 🙂"], {}, ""),
    "truncate a long text": ([LONG, "x"], {"truncate": True}, "right"),
    "truncate a huge text left": (HUGE, {"truncate": True, "truncation_side": "left"}, "left"),
    "truncate long token ids": ([list(range(5, 300)) * 2], {"truncate": True}, "right"),
}


def _inputs(value: Any) -> list[Any]:
    if isinstance(value, str) or (value and isinstance(value[0], int)):
        return [value]
    return list(value)


@pytest.mark.parametrize("name", list(SPARSE))
def test_sparse_vectors_keep_the_largest_weights_over_the_threshold(
    splade: Served, name: str
) -> None:
    value, extra, side = SPARSE[name]
    doc = splade.gateway.ok(ROUTE, {"input": value, **extra})
    total = 0
    for i, (one, entry) in enumerate(zip(_inputs(value), doc["data"], strict=True)):
        row = splade.row(one, side)
        total += row[0]
        kept = [k for k in range(3) if row[k] > (extra.get("threshold") or 0)]
        kept = sorted(sorted(kept, key=lambda k: -row[k])[: extra.get("top_k") or 3])
        assert entry == {
            "object": "sparse_embedding",
            "index": i,
            "embedding": {"indices": kept, "values": [row[k] for k in kept]},
            "dimensions": splade.model.vocab_size,
        }
    assert doc["usage"] == {"prompt_tokens": total, "total_tokens": total}


def test_tei_embed_sparse_and_its_default_route(splade: Served) -> None:
    """TEI's /embed_sparse (and POST /, a SPLADE model's route there): each input's non-zero
    weights as {index, value}, ids ascending."""

    def weights(text: str) -> list[dict[str, Any]]:
        row = splade.row(text)
        return [{"index": k, "value": row[k]} for k in range(3) if row[k] > 0]

    for route in ("/embed_sparse", "/"):
        got = splade.gateway.ok(route, {"inputs": list(TEXTS[:2])})
        assert got == [weights(t) for t in TEXTS[:2]]


#: name -> (body, status, param, a part of the message)
SPARSE_REFUSED: dict[str, tuple[dict[str, Any], int, str, str]] = {
    "an empty list of ids": ({"input": [[1], []]}, 400, "input",
                             "Input 1 is an empty list of token ids."),
    "an id outside the vocabulary": ({"input": [1, 10_000_000]}, 400, "input",
                                     "Input 0 holds a token id outside this model's vocabulary"),
    "a negative id": ({"input": [-1]}, 400, "input", "outside this model's vocabulary"),
    "top_k zero": ({"input": "x", "top_k": 0}, 400, "top_k", "greater than or equal to 1"),
    "threshold negative": ({"input": "x", "threshold": -0.5}, 400, "threshold",
                           "greater than or equal to 0"),
    "threshold a string": ({"input": "x", "threshold": "1"}, 400, "threshold", "valid number"),
    "threshold a bool": ({"input": "x", "threshold": True}, 400, "threshold", "valid number"),
    "long token ids": ({"input": list(range(5, 300)) * 2}, 400, "input",
                       "Input 0 has 590 tokens, more than this model's limit of 512."),
    "too many tokens": ({"input": [LONG + str(i) for i in range(60)], "truncate": True}, 413,
                        "input", "The request holds 30720 tokens"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SPARSE_REFUSED))
def test_sparse_refusals(splade: Served, name: str) -> None:
    body, status, param, words = SPARSE_REFUSED[name]
    error = splade.gateway.error(ROUTE, body, status)
    assert error["param"] == param
    assert words in error["message"]


def test_other_routes_are_refused_naming_the_sparse_route(splade: Served) -> None:
    for path, body in (
        ("/v1/embeddings", {"input": "x"}),
        ("/v1/classify", {"input": "x"}),
        ("/v1/rerank", {"query": "q", "documents": ["d"]}),
    ):
        error = splade.gateway.error(path, body, 400)
        assert error["param"] == "model"
        assert error["message"].startswith("'splade' is a sparse (SPLADE) embedding model;")
        assert error["message"].endswith("Use /v1/sparse_embeddings.")


def test_sparse_counts_requests_tokens_and_chunks(splade: Served) -> None:
    series = [
        ("embedfleet_gateway_requests_total", {"route": ROUTE, "code": "200"}),
        ("embedfleet_gateway_requests_total", {"route": ROUTE, "code": "400"}),
        ("embedfleet_gateway_input_tokens_total", {}),
        ("embedfleet_gateway_chunks_per_request_sum", {}),
    ]
    requests = [(ROUTE, {"input": list(TEXTS)}), (ROUTE, {"input": [[5, 6, 7]]}),
                (ROUTE, {"input": [LONG]})]  # fmt: skip
    moved = splade.gateway.deltas(series, requests)
    assert moved[:3] == (2, 1, sum(splade.row(t)[0] for t in TEXTS) + 3)
    assert moved[3] > 2  # the texts went as several chunks
