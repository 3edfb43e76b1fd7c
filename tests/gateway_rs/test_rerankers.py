"""Rerankers through both gateways: a cross-encoder (bge-reranker's XLM-R structure) and a yes/no
reranker (Qwen3-Reranker), random-weight checkpoints of testing.families, each behind one REAL
worker process with the null engine, whose score of a pair is its token count: equal scores are
equal pair tokenization (truncation, windows, the judging frame). The cross-encoder also runs
behind FAKE workers, whose calls show each gateway's chunking of the pairs; a plain Qwen3 causal
LM served with --task score runs behind a worker computing with torch, against the model card."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from embedfleet.common.modeldir import load_model_dir
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing import families
from embedfleet.testing.families import TEXTS, FamilyDirs
from tests.gateway.fakes import FakeWorker
from tests.gateway.helpers import wait_until

from .conftest import SMALL_CHUNKS, behind_worker, flags
from .pair import Pair, gateways
from .test_differential import PAIRS

#: family name, extra settings of both gateways and the worker, the served limit
MODELS: dict[str, tuple[str, dict[str, object], int]] = {
    "cross-encoder": ("bge-reranker-base", {}, 512),
    "yes-no": ("Qwen3-Reranker-0.6B", {"max_input_tokens": 160}, 160),
}
QUERY = TEXTS[0]
DOCUMENTS = list(TEXTS[1:])
LONG = "the quick brown fox jumps over the lazy dog " * 120  # over 512 tokens of either
HUGE = "the quick brown fox jumps over the lazy dog " * 3000  # past the first window

#: what both kinds of reranker answer alike, beyond PAIRS (test_differential's cases)
RERANKER_PAIRS: dict[str, tuple[str, dict[str, Any]]] = {
    "rerank the family's texts": ("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS}),
    "rerank top_n with documents": (
        "/v1/rerank",
        {"query": QUERY, "documents": DOCUMENTS, "top_n": 3, "return_documents": True},
    ),
    "rerank documents as objects": (
        "/v1/rerank",
        {"query": QUERY, "documents": [{"text": d} for d in DOCUMENTS[:3]]},
    ),
    "rerank a long document truncated": (
        "/v1/rerank",
        {"query": QUERY, "documents": [LONG, "short"], "truncate": True},
    ),
    "rerank a long document truncated left": (
        "/v1/rerank",
        {"query": QUERY, "documents": [LONG], "truncate": True, "truncation_side": "left"},
    ),
    "rerank a huge document truncated": (
        "/v1/rerank",
        {"query": QUERY, "documents": [HUGE], "truncate": True},
    ),
    "rerank a long query truncated": (
        "/v1/rerank",
        {"query": LONG, "documents": ["short", DOCUMENTS[0]], "truncate": True},
    ),
    "rerank a huge query truncated left": (
        "/v1/rerank",
        {"query": HUGE, "documents": ["short"], "truncate": True, "truncation_side": "left"},
    ),
    "rerank both sides long truncated": (
        "/v1/rerank",
        {"query": LONG, "documents": [LONG + "x"], "truncate": True},
    ),
    "rerank a long document refused": ("/v1/rerank", {"query": QUERY, "documents": ["a", LONG]}),
    "rerank a huge document refused": ("/v1/rerank", {"query": QUERY, "documents": [HUGE]}),
    "rerank a huge query refused": ("/v1/rerank", {"query": HUGE, "documents": ["a"]}),
    "rerank an empty instruction": (
        "/v1/rerank",
        {"query": "q", "documents": ["d"], "instruction": ""},
    ),
    "rerank an instruction not a string": (
        "/v1/rerank",
        {"query": "q", "documents": ["d"], "instruction": 3},
    ),
    "score the family's texts": ("/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS}),
    "score with an instruction": (
        "/v1/score",
        {"text_1": QUERY, "text_2": DOCUMENTS[:2], "instruction": "Find the capital"},
    ),
    "score a long pair refused": ("/v1/score", {"text_1": [QUERY, LONG], "text_2": "x"}),
    "score a long pair truncated": (
        "/v1/score",
        {"text_1": [QUERY, LONG], "text_2": "x", "truncate": True},
    ),
    "embeddings refused": ("/v1/embeddings", {"input": "x"}),
    "classify refused": ("/v1/classify", {"input": "x"}),
    "classify refused after its fields": ("/v1/classify", {"input": "x", "top_k": 0}),
    "embeddings refused after the model's name": ("/v1/embeddings", {"input": "x", "model": "m"}),
}
CASES = {**PAIRS, **RERANKER_PAIRS}


def _settings(path: Path, workers: list[str], extra: dict[str, object]) -> GatewaySettings:
    return GatewaySettings(model=str(path), workers=tuple(workers), **SMALL_CHUNKS, **extra)  # type: ignore[arg-type]


def _rust(path: Path, workers: list[str], extra: dict[str, object]) -> list[str]:
    return ["--model", str(path), "--workers", ",".join(workers), *flags({**SMALL_CHUNKS, **extra})]


@dataclass
class Reranker:
    pair: Pair
    kind: str
    limit: int

    def compare(self, path: str, body: Any) -> Any:
        return self.pair.compare("POST", path, content=orjson.dumps(body))


@pytest.fixture(scope="module", params=list(MODELS))
def reranker(
    request: pytest.FixtureRequest,
    family_dirs: FamilyDirs,
    rust_binary: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Reranker]:
    """Both gateways in front of one null-engine worker serving the reranker."""
    family, extra, limit = MODELS[request.param]
    path = family_dirs.get(family)
    with behind_worker(path, tmp_path_factory.mktemp("reranker"), extra) as pair:
        yield Reranker(pair, request.param, limit)


@pytest.fixture(scope="module")
def cross_fakes(
    family_dirs: FamilyDirs, rust_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    """Each gateway in front of two FAKE workers, serving the cross-encoder."""
    path = family_dirs.get("bge-reranker-base")
    log = tmp_path_factory.mktemp("cross_fakes") / "gateway-rs.log"
    py_workers = [FakeWorker(0).start() for _ in range(2)]
    rs_workers = [FakeWorker(0).start() for _ in range(2)]
    settings = _settings(path, [w.address for w in py_workers], {})
    rust = _rust(path, [w.address for w in rs_workers], {})
    try:
        with gateways(load_model_dir(path), settings, rust, log, (py_workers, rs_workers)) as pair:
            wait_until("workers ready", lambda: pair.worker_counts() == [(2, 2)] * 2)
            yield pair
    finally:
        for w in py_workers + rs_workers:
            w.stop()


@pytest.mark.parametrize("name", list(CASES))
def test_reranker_answers_equal(reranker: Reranker, name: str) -> None:
    path, body = CASES[name]
    doc = reranker.compare(path, body)
    if "error" in doc:
        return
    # The null engine scores a pair by its tokens, all of which the usage counts.
    if path == "/v1/rerank":
        scores = [r["relevance_score"] for r in doc["results"]]
        assert scores == sorted(scores, reverse=True)
        if body.get("top_n") is None:
            assert sum(scores) == doc["usage"]["total_tokens"]
    else:
        assert sum(d["score"] for d in doc["data"]) == doc["usage"]["total_tokens"]


def test_long_pairs_are_cut_to_the_limit(reranker: Reranker) -> None:
    """Truncated pairs fill the limit exactly (what the worker ran), on either side, whichever
    side is long; refused, they name the param documents and the limit."""
    for side in ("left", "right"):
        for query, document in ((QUERY, LONG), (LONG, "short"), (HUGE, LONG)):
            body = {"query": query, "documents": [document], "truncate": True}
            doc = reranker.compare("/v1/rerank", {**body, "truncation_side": side})
            assert doc["results"][0]["relevance_score"] == reranker.limit
    error = reranker.compare("/v1/score", {"text_1": "a", "text_2": ["b", LONG]})["error"]
    assert (error["param"], error["code"]) == ("documents", "context_length_exceeded")
    assert error["message"].startswith("Input 1 has ")
    assert f"limit of {reranker.limit}." in error["message"]


def test_the_instruction_goes_into_the_judging_frame(reranker: Reranker) -> None:
    """A yes/no reranker's pair is longer by the words of a longer instruction; a cross-encoder
    refuses any instruction."""
    short = {"query": "q", "documents": ["d"], "instruction": "Find"}
    longer = {**short, "instruction": "Find the capital of the country named"}
    a, b = (reranker.compare("/v1/rerank", x) for x in (short, longer))
    if reranker.kind == "yes-no":
        assert b["usage"]["total_tokens"] > a["usage"]["total_tokens"]
    else:
        assert a["error"]["param"] == b["error"]["param"] == "instruction"


def test_embeddings_are_refused_naming_the_routes(reranker: Reranker) -> None:
    error = reranker.compare("/v1/embeddings", {"input": "x"})["error"]
    assert error["param"] == "model"
    assert "cross-encoder reranker" in error["message"]
    assert "Use /v1/rerank or /v1/score." in error["message"]


def test_reranker_metrics_count_alike(reranker: Reranker) -> None:
    """The same requests move the same series by the same amounts (tokens, chunks, codes)."""
    series = [
        ("embedfleet_gateway_requests_total", {"route": "/v1/rerank", "code": "200"}),
        ("embedfleet_gateway_requests_total", {"route": "/v1/rerank", "code": "400"}),
        ("embedfleet_gateway_requests_total", {"route": "/v1/score", "code": "200"}),
        ("embedfleet_gateway_requests_total", {"route": "/v1/embeddings", "code": "400"}),
        ("embedfleet_gateway_input_tokens_total", {}),
        ("embedfleet_gateway_tokenize_seconds_count", {}),
        ("embedfleet_gateway_chunks_per_request_count", {}),
        ("embedfleet_gateway_chunks_per_request_sum", {}),
        ("embedfleet_gateway_upstream_seconds_count", {}),
    ]

    requests = [
        ("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS}),
        ("/v1/rerank", {"query": QUERY, "documents": [LONG]}),
        ("/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS[:4]}),
        ("/v1/embeddings", {"input": "x"}),
    ]
    deltas = reranker.pair.metric_deltas(series, requests)
    assert deltas[0] == deltas[1]
    assert deltas[0][:4] == (1, 1, 1, 1)
    assert deltas[0][6] == 2  # the two answered
    assert deltas[0][7] > 2  # in several chunks


@pytest.mark.parametrize("name", list(CASES))
def test_cross_encoder_chunks_alike(cross_fakes: Pair, name: str) -> None:
    """Each gateway's FAKE workers see the same Score calls (pairs per call) for every case."""
    path, body = CASES[name]
    doc = cross_fakes.compare("POST", path, content=orjson.dumps(body))
    py_calls, rs_calls = cross_fakes.calls()
    assert py_calls == rs_calls
    if "error" in doc:
        assert py_calls == []
    elif name == "rerank the family's texts":
        assert len(py_calls) > 1  # the pairs went as several chunks


@pytest.fixture(scope="module")
def judge(
    family_dirs: FamilyDirs, rust_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Pair, Path]]:
    """A Qwen3-Reranker checkpoint under a name without "reranker", which alone would embed,
    served with --task score by both gateways and the worker."""
    workdir = tmp_path_factory.mktemp("judge")
    plain = workdir / "judge"
    shutil.copytree(family_dirs.get("Qwen3-Reranker-8B"), plain)
    assert load_model_dir(plain).task == "embed"
    extra: dict[str, object] = {"task": "score", "max_input_tokens": 160}
    with behind_worker(plain, workdir, extra, engine="torch") as pair:
        yield pair, plain


#: the model card's code batches left-padded in this process, the worker its own way: the scores
#: agree to test_fleet_families' tolerance, not to the bit
CARD_TOLERANCE = 1e-3


@pytest.mark.parametrize("instruction", [None, "Given a claim, find documents that refute it"])
def test_task_score_scores_a_plain_qwen3_alike(
    judge: tuple[Pair, Path], instruction: str | None
) -> None:
    pair, path = judge
    extra = {"instruction": instruction} if instruction else {}
    want = families.qwen3_reranker_scores(path, [(QUERY, d) for d in DOCUMENTS[:4]], instruction)
    score = {"text_1": QUERY, "text_2": DOCUMENTS[:4], **extra}
    scored = pair.compare("POST", "/v1/score", content=orjson.dumps(score))["data"]
    np.testing.assert_allclose([d["score"] for d in scored], want, rtol=0, atol=CARD_TOLERANCE)
    rerank = {"query": QUERY, "documents": DOCUMENTS[:4], "top_n": 2, **extra}
    results = pair.compare("POST", "/v1/rerank", content=orjson.dumps(rerank))["results"]
    assert [r["index"] for r in results] == list(np.argsort(-want, kind="stable")[:2])


def test_task_score_refuses_the_other_routes_alike(judge: tuple[Pair, Path]) -> None:
    pair, _ = judge
    for route in ("/v1/embeddings", "/v1/sparse_embeddings", "/v1/classify"):
        error = pair.compare("POST", route, content=b'{"input":"x"}')["error"]
        assert error["param"] == "model", route
        assert error["message"].endswith("Use /v1/rerank or /v1/score."), route
