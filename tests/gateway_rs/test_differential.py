"""The Rust gateway answers as the Python gateway does: every input form and encoding, the
limits and their errors, chunking over the workers, worker failures and the GET routes, each
request sent to both and the answers compared (pair.py)."""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from embedfleet.gateway.quantization import ENCODINGS
from embedfleet.testing.workers import metric_value
from tests.gateway.helpers import wait_until

from .pair import STALE, Pair

NAME = "sentence-transformers/all-MiniLM-L6-v2"
LONG = "the quick brown fox jumps over the lazy dog " * 40  # ~361 tokens: over 256
HUGE = "lorem ipsum dolor sit amet " * 4000  # past the first window: "at least N tokens"
IDS = list(range(1000, 1020))


EMBEDDINGS: dict[str, dict[str, Any]] = {
    "string": {"input": "Hello, world!"},
    "strings": {"input": ["one", "two words", "three short words here"]},
    "token ids": {"input": IDS},
    "lists of token ids": {"input": [IDS, [101, 102], list(range(3000, 3050))]},
    "base64 string": {"input": "Hello, world!", "encoding_format": "base64"},
    "base64 strings": {"input": ["a", "b c"], "encoding_format": "base64"},
    "base64 token ids": {"input": [IDS, IDS[:3]], "encoding_format": "base64"},
    "explicit float": {"input": "x", "encoding_format": "float"},
    "binary": {"input": ["a", "b c"], "encoding_format": "binary"},
    "ubinary": {"input": ["a", "b c"], "encoding_format": "ubinary"},
    "binary base64": {"input": "a", "encoding_format": "binary_base64"},
    "ubinary base64 below the model's dimensions": {
        "input": "a",
        "encoding_format": "ubinary_base64",
        "dimensions": 2,
    },
    "served model named": {"input": "x", "model": NAME},
    "model null": {"input": "x", "model": None},
    "dimensions below the model's": {"input": "x", "dimensions": 2},
    "dimensions equal to the model's": {"input": "x", "dimensions": 4},
    "unicode": {"input": ["héllo wörld", "日本語のテキスト", "emoji 🙂 text"]},
    "truncate right": {"input": LONG, "truncate": True},
    "truncate left": {"input": LONG, "truncate": True, "truncation_side": "left"},
    "truncate huge": {"input": [HUGE, "short"], "truncate": True},
    "truncate huge left": {"input": HUGE, "truncate": True, "truncation_side": "left"},
    "truncate token ids right": {"input": list(range(1, 400)), "truncate": True},
    "truncate token ids left": {
        "input": [list(range(1, 400))],
        "truncate": True,
        "truncation_side": "left",
    },
    "input_type query": {"input": "x", "input_type": "query"},
    "user and unknown fields": {"input": "x", "user": "u", "something": [1, 2]},
    "split_long_inputs false": {"input": "x", "split_long_inputs": False},
    "split a long text": {"input": LONG, "split_long_inputs": True},
    "split one of several": {"input": ["short", LONG, "also short"], "split_long_inputs": True},
    "split long token ids": {"input": list(range(1, 400)), "split_long_inputs": True},
    "split nothing over the limit": {"input": ["a", "b"], "split_long_inputs": True},
    "split with a prompt": {"input": LONG, "split_long_inputs": True, "input_type": "query"},
    "split below the model's dimensions": {
        "input": LONG,
        "split_long_inputs": True,
        "dimensions": 2,
    },
    "split then quantized": {"input": LONG, "split_long_inputs": True, "encoding_format": "binary"},
    "many inputs": {"input": [f"text number {i}" for i in range(64)]},
}

ERRORS: dict[str, Any] = {
    "unknown model": {"input": "x", "model": "other"},
    "missing input": {},
    "empty input list": {"input": []},
    "empty string": {"input": ""},
    "empty string in list": {"input": ["a", ""]},
    "empty token id list": {"input": [[1, 2], []]},
    "token id past the vocabulary": {"input": [30522]},
    "negative token id": {"input": [[5, -1]]},
    "huge token id": b'{"input": [1180591620717411303424]}',
    "token id past int64 in a list": b'{"input": [[1, 1180591620717411303424]]}',
    "float token id": {"input": [1.0]},
    "bool token id": {"input": [True]},
    "mixed list": {"input": ["a", 1]},
    "input a number": {"input": 5},
    "input an object": {"input": {"text": "a"}},
    "over-long text": {"input": LONG},
    "over-long text second": {"input": ["fine", LONG]},
    "huge text": {"input": HUGE},
    "over-long token ids": {"input": list(range(1, 400))},
    "too many inputs": {"input": ["x"] * 65},
    "too many tokens": {"input": [LONG] * 60, "truncate": True},
    "model not a string": {"input": "x", "model": 3},
    "truncate not a bool": {"input": "x", "truncate": "yes"},
    "truncate a number": {"input": "x", "truncate": 1},
    "texts and ids mixed": {"input": [[1, 2], "a"]},
    "truncate null": {"input": "x", "truncate": None},
    "truncation side": {"input": "x", "truncation_side": "middle"},
    "encoding format": {"input": "x", "encoding_format": "float16"},
    "int8 without ranges at these dimensions": {"input": "x", "encoding_format": "int8"},
    "uint8 base64 without ranges": {"input": "x", "encoding_format": "uint8_base64"},
    "dimensions zero": {"input": "x", "dimensions": 0},
    "dimensions a string": {"input": "x", "dimensions": "2"},
    "dimensions a float": {"input": "x", "dimensions": 2.0},
    "dimensions above the model's": {"input": "x", "dimensions": 5},
    "split and truncate": {"input": "x", "truncate": True, "split_long_inputs": True},
    "split not a bool": {"input": "x", "split_long_inputs": 1},
    "split past the request's tokens": {"input": [HUGE], "split_long_inputs": True},
    "user not a string": {"input": "x", "user": 1},
    "input_type": {"input": "x", "input_type": "passage"},
    "first failing field wins": {"input": 1, "model": 2, "dimensions": 0},
    "not an object": ["input"],
    "a string document": "input",
}


@pytest.mark.parametrize("name", list(EMBEDDINGS))
def test_embeddings_equal(fake_pair: Pair, name: str) -> None:
    doc = fake_pair.embed(EMBEDDINGS[name])
    assert [d["index"] for d in doc["data"]] == list(range(len(doc["data"])))
    assert doc["usage"]["prompt_tokens"] > 0
    py_calls, rs_calls = fake_pair.calls()
    assert py_calls == rs_calls


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors_equal(fake_pair: Pair, name: str) -> None:
    body = ERRORS[name]
    if isinstance(body, bytes):  # past what orjson writes
        doc = fake_pair.compare("POST", "/v1/embeddings", content=body)
    else:
        doc = fake_pair.embed(body)
    assert set(doc) == {"error"}
    assert fake_pair.calls() == ([], [])


#: (route, body) -> the same scores, order and usage from both, or the same error
PAIRS: dict[str, tuple[str, Any]] = {
    "rerank": ("/v1/rerank", {"query": "what is it", "documents": ["a thing", "b", "a thing"]}),
    "rerank objects and strings": (
        "/v1/rerank",
        {"query": "q", "documents": [{"text": "one", "extra": 1}, "two"], "top_n": 1},
    ),
    "rerank returning documents": (
        "/v1/rerank",
        {"query": "q", "documents": ["x y", "z"], "return_documents": True, "model": NAME},
    ),
    "rerank top_n past the documents": (
        "/v1/rerank",
        {"query": "q", "documents": ["d"], "top_n": 9},
    ),
    "rerank truncating a long document": (
        "/v1/rerank",
        {"query": "q", "documents": [LONG], "truncate": True, "truncation_side": "left"},
    ),
    "score one to one": ("/v1/score", {"text_1": "a", "text_2": "b"}),
    "score one to many": ("/v1/score", {"text_1": "a", "text_2": ["b", "c", "b"]}),
    "score many to one": ("/v1/score", {"text_1": ["b", "c"], "text_2": "a"}),
    "score element-wise": ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d"]}),
    # errors, in the schema's field order and then the service's
    "rerank without query": ("/v1/rerank", {"documents": ["d"]}),
    "rerank query not a string": ("/v1/rerank", {"query": 1, "documents": ["d"]}),
    "rerank empty query": ("/v1/rerank", {"query": "", "documents": ["d"]}),
    "rerank without documents": ("/v1/rerank", {"query": "q"}),
    "rerank a document a number": ("/v1/rerank", {"query": "q", "documents": ["d", 3]}),
    "rerank documents not a list": ("/v1/rerank", {"query": "q", "documents": "d"}),
    "rerank a document without text": ("/v1/rerank", {"query": "q", "documents": [{"t": "d"}]}),
    "rerank an empty document": ("/v1/rerank", {"query": "q", "documents": ["d", ""]}),
    "rerank no documents": ("/v1/rerank", {"query": "q", "documents": []}),
    "rerank too many documents": ("/v1/rerank", {"query": "q", "documents": ["d"] * 65}),
    "rerank top_n zero": ("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": 0}),
    "rerank top_n a float": ("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": 1.0}),
    "rerank return_documents not a bool": (
        "/v1/rerank",
        {"query": "q", "documents": ["d"], "return_documents": 1},
    ),
    "rerank an instruction": ("/v1/rerank", {"query": "q", "documents": ["d"], "instruction": "i"}),
    "rerank a long document": ("/v1/rerank", {"query": "q", "documents": ["d", LONG]}),
    "rerank too many tokens": (
        "/v1/rerank",
        {"query": "q", "documents": [LONG + str(i) for i in range(60)], "truncate": True},
    ),
    "rerank unknown model": ("/v1/rerank", {"query": "q", "documents": ["d"], "model": "m"}),
    "score lists of different lengths": ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c"]}),
    "score without text_2": ("/v1/score", {"text_1": "a"}),
    "score text_1 a number": ("/v1/score", {"text_1": 1, "text_2": "b"}),
    "score truncate not a bool": ("/v1/score", {"text_1": "a", "text_2": "b", "truncate": "true"}),
    "score an empty text": ("/v1/score", {"text_1": "a", "text_2": ["b", ""]}),
    "score no pairs": ("/v1/score", {"text_1": "a", "text_2": []}),
    "classify on a model of another task": ("/v1/classify", {"input": ["a", "b"]}),
    "classify a bad input on a model of another task": ("/v1/classify", {"input": [1]}),
    "sparse on a model of another task": ("/v1/sparse_embeddings", {"input": ["a", "b"]}),
    "sparse a bad threshold on a model of another task": (
        "/v1/sparse_embeddings",
        {"input": "a", "threshold": -1},
    ),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_rerank_and_score_equal(fake_pair: Pair, name: str) -> None:
    path, body = PAIRS[name]
    doc = fake_pair.compare("POST", path, content=orjson.dumps(body))
    py_calls, rs_calls = fake_pair.calls()
    assert py_calls == rs_calls
    if "error" in doc:
        assert py_calls == []
    elif path == "/v1/rerank":
        scores = [r["relevance_score"] for r in doc["results"]]
        assert scores == sorted(scores, reverse=True)
    else:
        assert [d["index"] for d in doc["data"]] == list(range(len(doc["data"])))


def test_the_openapi_document_is_the_python_gateway_s(fake_pair: Pair) -> None:
    py, rs = fake_pair.both("GET", "/openapi.json")
    assert py.status == rs.status == 200
    assert py.body == rs.body, STALE
    assert "securitySchemes" not in py.json()["components"]


def test_long_request_is_chunked_alike(fake_pair: Pair) -> None:
    """Over min_chunk_tokens per worker, the request spreads over both workers in chunks."""
    doc = fake_pair.embed({"input": [list(range(1, 151))] * 60})  # 9,000 tokens
    assert len(doc["data"]) == 60
    py_calls, rs_calls = fake_pair.calls()
    assert py_calls == rs_calls == [30, 30]


def _raw(pair: Pair, method: str, path: str, **kw: Any) -> Any:
    return pair.compare(method, path, **kw)


@pytest.mark.parametrize(
    ("method", "path", "kw"),
    [
        ("GET", "/v1/embeddings", {}),
        ("PUT", "/v1/embeddings", {"content": b"{}"}),
        ("POST", "/health", {}),
        ("DELETE", "/v1/models", {}),
        ("GET", "/nope", {}),
        ("POST", "/v1/embeddings/", {"content": b"{}"}),
        ("GET", "/health", {}),
        ("HEAD", "/health", {}),
        ("GET", "/ready", {}),
        (
            "POST",
            "/v1/embeddings",
            {"content": b'{"input": "x"}', "headers": {"content-type": "text/plain"}},
        ),
        (
            "POST",
            "/v1/embeddings",
            {"content": b'{"input": "x"}', "headers": {"content-type": "application/x+json"}},
        ),
        *(
            (
                "POST",
                "/v1/embeddings",
                {"content": b'{"input": "x"}', "headers": {"content-type": t}},
            )
            for t in (
                "text/json",
                "application/x-www-form-urlencoded",
                "application/json; charset=utf-8",
                "Application/JSON",
            )
        ),
        ("POST", "/v1/embeddings", {"content": b'{"input": "x"}', "headers": {}}),
        ("POST", "/v1/embeddings", {"content": b"x" * 400_001}),
        ("POST", "/v1/embeddings", {"content": b"[]"}),
    ],
)
def test_routes_methods_and_bodies_equal(
    fake_pair: Pair, method: str, path: str, kw: dict[str, Any]
) -> None:
    if method == "HEAD":
        py, rs = fake_pair.both(method, path)
        assert (py.status, py.body) == (rs.status, rs.body) == (200, b"")
        return
    _raw(fake_pair, method, path, **kw)


@pytest.mark.parametrize("body", [b"{bad", b"", b'{"input": "x",}', b"\xff"])
def test_bad_json_equal_but_for_the_parser_s_words(fake_pair: Pair, body: bytes) -> None:
    """Both quote their JSON parser's own description of the fault (orjson's, serde_json's)."""
    py, rs = fake_pair.both("POST", "/v1/embeddings", content=body)
    assert py.status == rs.status == 400
    a, b = py.json()["error"], rs.json()["error"]
    prefix = "The request body is not valid JSON: "
    assert a["message"].startswith(prefix)
    assert b["message"].startswith(prefix)
    assert {**a, "message": ""} == {**b, "message": ""}


def test_models_equal_but_for_the_start_time(fake_pair: Pair) -> None:
    assert fake_pair.models() == {
        "object": "list",
        "data": [{"id": NAME, "object": "model", "owned_by": "embedfleet"}],
    }


def _fail(pair: Pair, code: grpc.StatusCode | None, counts: tuple[int, int]) -> None:
    for workers in (pair.python_workers, pair.rust_workers):
        for w, count in zip(workers, counts, strict=True):
            w.fail_code, w.fail_count = code, count


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
        (grpc.StatusCode.INTERNAL, 502),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),  # both workers busy: retry, then 429
        (grpc.StatusCode.UNAVAILABLE, 502),  # both down: retry, then 502
    ],
)
def test_worker_failures_equal(fake_pair: Pair, code: grpc.StatusCode, status: int) -> None:
    _fail(fake_pair, code, (1, 1))
    try:
        doc = fake_pair.embed({"input": "x"})
        assert set(doc) == {"error"}
        py, rs = fake_pair.both("GET", "/health")  # both still serve
        assert py.status == rs.status == 200
    finally:
        _fail(fake_pair, None, (0, 0))
        time.sleep(0.3)  # past --eject-seconds: later tests see both workers in rotation
        fake_pair.calls()
    assert (
        fake_pair.python().request("POST", "/v1/embeddings", content=b'{"input":"x"}').status == 200
    )


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED])
def test_one_failure_is_retried_on_the_other_worker(fake_pair: Pair, code: grpc.StatusCode) -> None:
    """Only worker 0 fails, once: whichever gateway picks it retries on worker 1 and answers."""
    _fail(fake_pair, code, (1, 0))
    try:
        for _ in range(30):
            doc = fake_pair.embed({"input": "x"})
            assert "data" in doc
            if all(
                ws[0].fail_count == 0 for ws in (fake_pair.python_workers, fake_pair.rust_workers)
            ):
                break
        else:
            pytest.fail("worker 0 was never picked in 30 requests")
    finally:
        _fail(fake_pair, None, (0, 0))
        time.sleep(0.3)
        fake_pair.calls()


def test_request_metrics_count_alike(fake_pair: Pair) -> None:
    """The same requests move the same series by the same amounts, under the same names."""

    def scrape() -> list[str]:
        return fake_pair.scrape()

    def values(texts: list[str]) -> list[tuple[float, ...]]:
        series = [
            ("embedfleet_gateway_requests_total", {"route": "/v1/embeddings", "code": "200"}),
            ("embedfleet_gateway_requests_total", {"route": "/v1/embeddings", "code": "400"}),
            ("embedfleet_gateway_requests_total", {"route": "other", "code": "404"}),
            ("embedfleet_gateway_request_seconds_count", {"route": "/v1/embeddings"}),
            (
                "embedfleet_gateway_request_seconds_bucket",
                {"route": "/v1/embeddings", "le": "+Inf"},
            ),
            ("embedfleet_gateway_input_tokens_total", {}),
            # parsed: the three answered and the empty input (refused after parsing); answered
            ("embedfleet_gateway_stage_seconds_count", {"stage": "parse"}),
            ("embedfleet_gateway_stage_seconds_bucket", {"stage": "parse", "le": "+Inf"}),
            ("embedfleet_gateway_stage_seconds_count", {"stage": "respond"}),
        ]
        return [tuple(metric_value(t, n, **labels) for n, labels in series) for t in texts]

    before = values(scrape())
    for _ in range(3):
        fake_pair.embed({"input": "Hello, world!"})  # 6 tokens
    fake_pair.embed({"input": ""})
    fake_pair.compare("GET", "/nowhere")
    fake_pair.embed({"input": 5})  # refused by the parser: no parse stage
    after = values(scrape())
    deltas = [
        tuple(a - b for a, b in zip(x, y, strict=True)) for x, y in zip(after, before, strict=True)
    ]
    assert deltas[0] == deltas[1] == (3, 2, 1, 5, 5, 18, 4, 4, 3)
    assert metric_value(scrape()[1], "embedfleet_gateway_inflight_requests") == 1  # the scrape


def _buckets(text: str, family: str) -> dict[str, list[str]]:
    """Each series' bucket bounds (le) of a histogram family, by its other labels."""
    out: dict[str, list[str]] = {}
    for f in text_string_to_metric_families(text):
        if f.name == family:
            for sample in f.samples:
                if not sample.name.endswith("_bucket"):
                    continue
                labels = sorted(sample.labels.items())
                rest = ",".join(f"{k}={v}" for k, v in labels if k != "le")
                out.setdefault(rest, []).append(sample.labels["le"])
    return out


def test_stage_histograms_have_the_same_series_and_buckets(fake_pair: Pair) -> None:
    texts = fake_pair.scrape()
    stages = [_buckets(t, "embedfleet_gateway_stage_seconds") for t in texts]
    assert sorted(stages[0]) == ["stage=parse", "stage=respond"]
    assert stages[0] == stages[1]
    assert stages[0]["stage=parse"][:3] == ["1e-05", "2.5e-05", "5e-05"]


def test_real_worker_answers_equal(null_pair: Pair) -> None:
    """A real worker process (null engine): the same vectors through either gateway, down to
    the bytes of the response (floats written as the same shortest float32 text)."""
    for body in (
        {"input": "Hello, world!"},
        {"input": ["a b c", "d e f g"], "encoding_format": "base64"},
        {"input": [IDS, IDS[:5]]},
        {"input": "x", "dimensions": 8},
        {"input": [LONG], "truncate": True},
        {"input": "x", "dimensions": 10_000},
        # the bundled model's calibration (384 dimensions), every quantized encoding
        *(
            {"input": ["a b c", "d e f g", "Hello, world!"], "encoding_format": encoding}
            for encoding in ENCODINGS
        ),
        {"input": "x", "encoding_format": "int8", "dimensions": 8},  # no ranges: 400 alike
        {"input": [LONG, "x", LONG + LONG], "split_long_inputs": True},
    ):
        null_pair.embed(body)
        py, rs = null_pair.both("POST", "/v1/embeddings", content=orjson.dumps(body))
        assert py.body == rs.body


def test_prose_tokenizes_alike(null_pair: Pair) -> None:
    """Every line of the repository's docs (ASCII prose, code, tables, and lines with non-ASCII
    characters): the Rust gateway's ASCII fast path (wordpiece.rs) and its general path must
    give the Python tokenizer's ids. The null engine's vector carries each input's length, the
    sum of its ids and its first id, so equal bodies mean equal tokens."""
    root = Path(__file__).resolve().parents[2]
    lines = sorted(
        {
            line.strip()
            for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
            for line in doc.read_text().splitlines()
            if line.strip()
        }
    )
    assert len(lines) > 1000
    assert sum(not line.isascii() for line in lines) > 50  # the general path is taken too
    for start in range(0, len(lines), 64):
        body = {"input": lines[start : start + 64], "truncate": True}
        py, rs = null_pair.both("POST", "/v1/embeddings", content=orjson.dumps(body))
        assert py.status == rs.status == 200
        assert py.body == rs.body, lines[start : start + 64]


def test_the_first_window_is_what_a_huge_text_is_refused_by(fake_pair: Pair) -> None:
    doc = fake_pair.embed({"input": HUGE})
    assert doc["error"]["message"].startswith("Input 0 has at least ")
    assert doc["error"]["code"] == "context_length_exceeded"


def test_concurrent_queries_are_coalesced_and_answered_right(fake_pair: Pair) -> None:
    """16 clients at once against slow workers: both gateways merge the small chunks that wait
    into fewer Embed calls, and every client still gets its own rows ([first id, last id,
    length, worker number] from the fakes)."""
    fake_pair.calls()  # forget earlier tests' calls
    for w in fake_pair.python_workers + fake_pair.rust_workers:
        w.delay = 0.05
    try:
        for one in (fake_pair.python(), fake_pair.rust()):
            bodies = [orjson.dumps({"input": [[100 + i, 7, 200 + i]]}) for i in range(16)]
            with ThreadPoolExecutor(16) as pool:
                replies = list(pool.map(functools.partial(_post, one), bodies))
            for i, reply in enumerate(replies):
                assert reply.status == 200, reply.body
                assert reply.json()["data"][0]["embedding"] == [100 + i, 200 + i, 3, 0]
        py_calls, rs_calls = fake_pair.calls()
        assert sum(py_calls) == sum(rs_calls) == 16
        assert len(py_calls) < 16, py_calls
        assert len(rs_calls) < 16, rs_calls
    finally:
        for w in fake_pair.python_workers + fake_pair.rust_workers:
            w.delay = 0.0


def _post(one: Any, body: bytes) -> Any:
    return one.request("POST", "/v1/embeddings", content=body)


def test_real_worker_scores_equal(null_pair: Pair) -> None:
    """Scores from a real worker's vectors (null engine, 384 dimensions): the same order and the
    same float32 cosines through either gateway (numpy's and Rust's float32 sums may differ in
    the last bit, hence the tolerance of pair.py)."""
    for path, body in (
        ("/v1/rerank", {"query": "Hello", "documents": ["a b c", "d e f g", LONG[:200]]}),
        ("/v1/score", {"text_1": ["x y", "z"], "text_2": ["z", "x y"]}),
    ):
        doc = null_pair.compare("POST", path, content=orjson.dumps(body))
        assert "error" not in doc


def test_dispatch_metrics_count_alike(fake_pair: Pair) -> None:
    """Tokenization, chunks, calls, split inputs and the worker gauges: the same series move
    alike (the durations' counts; their sums are each process's own clock)."""
    series = [
        ("embedfleet_gateway_tokenize_seconds_count", {}),
        ("embedfleet_gateway_upstream_seconds_count", {}),
        ("embedfleet_gateway_chunks_per_request_count", {}),
        ("embedfleet_gateway_chunks_per_request_sum", {}),
        ("embedfleet_gateway_chunks_per_request_bucket", {"le": "1.0"}),
        ("embedfleet_gateway_split_inputs_total", {}),
        ("embedfleet_gateway_retries_total", {}),
        ("embedfleet_gateway_worker_ejections_total", {}),
    ]

    def values() -> list[tuple[float, ...]]:
        return [
            tuple(metric_value(t, n, **labels) for n, labels in series) for t in fake_pair.scrape()
        ]

    before = values()
    fake_pair.embed({"input": ["a", "b"]})  # tokenized once, one chunk, one call
    fake_pair.embed({"input": [LONG, "x"], "split_long_inputs": True})  # one input split
    fake_pair.embed({"input": [list(range(1, 151))] * 60})  # ids: no tokenizing; two chunks
    fake_pair.calls()
    after = values()
    deltas = [
        tuple(a - b for a, b in zip(x, y, strict=True)) for x, y in zip(after, before, strict=True)
    ]
    assert deltas[0] == deltas[1] == (2, 4, 3, 4, 2, 1, 0, 0)
    texts = fake_pair.scrape()
    for text, workers in zip(
        texts, (fake_pair.python_workers, fake_pair.rust_workers), strict=True
    ):
        assert metric_value(text, "embedfleet_gateway_workers", state="ready") == 2
        assert metric_value(text, "embedfleet_gateway_workers", state="unready") == 0
        for worker in workers:  # every call answered: nothing outstanding, each worker listed
            assert f'outstanding_tokens{{worker="{worker.address}"}} 0.0' in text


def test_work_other_gateways_queued_sheds_alike(fake_pair: Pair) -> None:
    """Admission: the workers report 50,000 tokens queued each (other gateways' work) at 1,000
    tokens/s each, 50 s of work against the default 30 s bound: every route is shed before
    tokenizing, with the same 429, message and Retry-After, and counted alike."""

    def shed_count() -> list[float]:
        name = "embedfleet_gateway_shed_requests_total"
        return [metric_value(t, name) for t in fake_pair.scrape()]

    fake_pair.set_workers(queued_tokens=50_000, capacity=1000.0)
    try:
        requests = [
            ("/v1/embeddings", {"input": ["a", "b"]}),
            ("/v1/rerank", {"query": "q", "documents": ["d"]}),
            ("/v1/score", {"text_1": "a", "text_2": ["b", "c"]}),
            # shed before the inputs are checked: this one's would be a 400
            ("/v1/embeddings", {"input": "", "dimensions": 99}),
        ]
        before: list[float] = []
        for path, body in requests:
            message, retry_after = fake_pair.shed_alike(path, body)
            # Counted from the first request both shed (until then one may have shed alone).
            before = before or shed_count()
            assert message == (
                "The workers have 50.0s of work queued, more than this gateway's bound of 30s; "
                "retry later."
            )
            assert retry_after == "20"
        fake_pair.queued_seconds_are(50.0)
        after = shed_count()
        assert after[0] - before[0] == after[1] - before[1] == len(requests) - 1
    finally:
        fake_pair.set_workers(queued_tokens=0, capacity=0.0)
    fake_pair.served_alike()


def test_work_this_gateway_admitted_counts_until_answered(fake_pair: Pair) -> None:
    """A request in flight holds its tokens in the queue: at 10 tokens/s a worker, 700 tokens
    admitted are 35 s ahead of the next request, which is shed with Retry-After 5 by both;
    once the first is answered its work is given back and requests are served again."""
    big = {"input": [list(range(1000, 1100))] * 7}  # 700 token ids, counted exactly
    try:
        # One token queued elsewhere at each worker shows the probes have read the capacity
        # (0.1 s of work); then none, so that only the admitted request is ahead.
        fake_pair.set_workers(capacity=10.0, queued_tokens=1, delay=1.5)
        fake_pair.queued_seconds_are(0.1)
        fake_pair.set_workers(queued_tokens=0)
        fake_pair.queued_seconds_are(0.0)
        with ThreadPoolExecutor(2) as pool:
            first = [
                pool.submit(one.request, "POST", "/v1/embeddings", content=orjson.dumps(big))
                for one in (fake_pair.python(), fake_pair.rust())
            ]
            time.sleep(0.5)  # both admitted, their chunks at the (slow) workers
            py, rs = fake_pair.both("POST", "/v1/embeddings", content=b'{"input":"x"}')
            answers = [f.result() for f in first]
        assert [a.status for a in answers] == [200, 200]
        assert py.status == rs.status == 429, (py.body, rs.body)
        assert py.json() == rs.json()
        assert py.headers["retry-after"] == rs.headers["retry-after"] == "5"
        assert "35.0s of work queued" in py.json()["error"]["message"]
    finally:
        fake_pair.set_workers(capacity=0.0, queued_tokens=0, delay=0.0)
    fake_pair.served_alike()
    fake_pair.calls()


def test_a_client_that_leaves_cancels_its_calls_alike(fake_pair: Pair) -> None:
    """A client gone while its chunk is at a slow worker: both gateways drop the request and
    cancel the call (the fake sees it cancelled), counted alike."""
    names = (
        "embedfleet_gateway_cancelled_requests_total",
        "embedfleet_gateway_cancelled_calls_total",
    )

    def counts() -> list[tuple[float, ...]]:
        return [tuple(metric_value(t, n) for n in names) for t in fake_pair.scrape()]

    before = counts()
    fake_pair.set_workers(delay=3.0)
    try:
        for url in (fake_pair.python_url, fake_pair.rust_url):
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url + "/v1/embeddings", json={"input": "leaves"}, timeout=0.5)
        wait_until("both counted", lambda: [tuple(a - b for a, b in zip(x, y, strict=True))
                   for x, y in zip(counts(), before, strict=True)] == [(1, 1), (1, 1)])  # fmt: skip

        def cancelled() -> list[int]:
            return [
                sum(w.cancelled for w in ws)
                for ws in (fake_pair.python_workers, fake_pair.rust_workers)
            ]

        # A gateway counts the call when it drops it; the fake sees the reset when it next
        # polls its context (every 10 ms, on its own thread): not at the same instant.
        wait_until(
            "both fakes saw the cancel", lambda: cancelled() != [0, 0] and 0 not in cancelled()
        )
        assert cancelled() == [1, 1]
    finally:
        fake_pair.set_workers(delay=0.0)
    fake_pair.served_alike()
    fake_pair.calls()
