"""The gateway in front of REAL worker processes serving the real MiniLM weights (`Fleet`, the
machinery of `embedfleet serve`). One fleet serves the whole module; tests leave it healthy.

References come from sentence-transformers in this process; every vector must be within cosine
0.999 of it, every quantized one equal to sentence-transformers' quantization of the float rows.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import openai
import pytest

from embedfleet.common.modeldir import ModelDir, default_model_path
from embedfleet.common.net import free_ports
from embedfleet.fleet.cli import main
from embedfleet.fleet.supervisor import Fleet
from embedfleet.testing.families import TEXTS as MORE_TEXTS
from embedfleet.testing.gateway import bundled_calibration

from .helpers import sample

pytestmark = pytest.mark.slow

TEXTS = [
    "The cat sits on the mat.",
    "A fast car drove along the coastal highway at dawn.",
    "Quantum computers exploit superposition and entanglement.",
    "I like pizza",
    "Embeddings map text to vectors so that similar meanings land close together.",
]
MAX_BATCH = 300
MAX_TOKENS = 20_000
MAX_BODY = 512 * 1024
SCORE_TOLERANCE = 0.01


class Reference:
    def __init__(self) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(default_model_path()), device="cpu")

    def __call__(self, texts: list[str]) -> npt.NDArray[np.float32]:
        out = self.model.encode(texts, normalize_embeddings=False, convert_to_numpy=True)
        return np.asarray(out, dtype=np.float32)


def cos(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def assert_close(got: npt.ArrayLike, want: npt.NDArray[np.float32]) -> None:
    rows = np.asarray(got, dtype=np.float64)
    assert rows.shape == want.shape
    worst = min(cos(g, w) for g, w in zip(rows, want, strict=True))
    assert worst >= 0.999, worst


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    (port,) = free_ports(1)
    gateway_args = [
        # Small chunks, so that a few dozen inputs already split over both workers.
        "--chunk-tokens", "128", "--min-chunk-tokens", "32",
        "--max-client-batch", str(MAX_BATCH), "--max-request-tokens", str(MAX_TOKENS),
        "--max-body-bytes", str(MAX_BODY), "--probe-seconds", "0.5", "--eject-seconds", "2",
    ]  # fmt: skip
    fleet = Fleet(
        workers=2,
        port=port,
        gateway_args=gateway_args,
        # float32: several tests compare answers of separate calls exactly (int8 buckets,
        # calibration ranges at 1e-6), and calls land on either worker in chunks coalesced
        # by timing. Under --dtype auto an AMX CPU runs bf16 (its GEMM measured 6x faster),
        # whose rows move by ~5e-4 with a batch's composition: one bucket in 2% of dimensions.
        worker_args=["--warmup-seconds", "0.5", "--dtype", "float32"],
        log_dir=tmp_path_factory.mktemp("fleet"),
    )
    with fleet:
        yield fleet


@pytest.fixture(scope="module")
def reference() -> Reference:
    return Reference()


@pytest.fixture(scope="module")
def http(fleet: Fleet) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fleet.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def name(http: httpx.Client) -> str:
    return str(http.get("/v1/models").json()["data"][0]["id"])


def embed(http: httpx.Client, **body: object) -> dict[str, object]:
    reply = http.post("/v1/embeddings", json=body)
    assert reply.status_code == 200, reply.text
    doc: dict[str, object] = reply.json()
    return doc


def vectors(doc: dict[str, object]) -> list[list[float]]:
    data = doc["data"]
    assert isinstance(data, list)
    assert [d["index"] for d in data] == list(range(len(data)))
    return [d["embedding"] for d in data]


# --- every input form -----------------------------------------------------------------------------


def test_string_and_list_of_strings(
    http: httpx.Client, reference: Reference, minilm: ModelDir
) -> None:
    tok = minilm.tokenizer()
    one = embed(http, input=TEXTS[0])
    assert_close(vectors(one), reference(TEXTS[:1]))
    assert one["usage"] == {"prompt_tokens": len(tok.encode(TEXTS[0]).ids)} | {
        "total_tokens": len(tok.encode(TEXTS[0]).ids)
    }
    many = embed(http, input=TEXTS)
    assert_close(vectors(many), reference(TEXTS))


def test_token_ids_and_lists_of_token_ids(
    http: httpx.Client, reference: Reference, minilm: ModelDir
) -> None:
    tok = minilm.tokenizer()
    ids = [tok.encode(t).ids for t in TEXTS]
    one = embed(http, input=ids[1])
    assert_close(vectors(one), reference(TEXTS[1:2]))
    many = embed(http, input=ids)
    assert_close(vectors(many), reference(TEXTS))
    assert many["usage"] == {
        "prompt_tokens": sum(map(len, ids)),
        "total_tokens": sum(map(len, ids)),
    }


def test_large_batch_is_split_reassembled_in_order_with_exact_usage(
    http: httpx.Client, reference: Reference, minilm: ModelDir
) -> None:
    tok = minilm.tokenizer()
    texts = [f"{i}: " + TEXTS[i % len(TEXTS)] * (1 + i % 4) for i in range(48)]
    before = http.get("/metrics").text
    doc = embed(http, input=texts)
    after = http.get("/metrics").text
    assert_close(vectors(doc), reference(texts))
    total = sum(len(tok.encode(t).ids) for t in texts)
    assert doc["usage"] == {"prompt_tokens": total, "total_tokens": total}
    chunks = sample(after, "embedfleet_gateway_chunks_per_request_sum") - sample(
        before, "embedfleet_gateway_chunks_per_request_sum"
    )
    assert chunks >= total / 128  # 128-token chunks
    assert (
        sample(after, "embedfleet_gateway_input_tokens_total")
        - sample(before, "embedfleet_gateway_input_tokens_total")
        == total
    )


def test_base64_and_dimensions(http: httpx.Client, reference: Reference) -> None:
    doc = embed(http, input=TEXTS, encoding_format="base64", dimensions=128)
    data = doc["data"]
    assert isinstance(data, list)
    rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data]
    assert all(r.shape == (128,) for r in rows)
    assert all(abs(np.linalg.norm(r) - 1) < 1e-3 for r in rows)  # re-normalized after cutting
    assert_close(rows, reference(TEXTS)[:, :128])


def test_truncation_right_and_left(
    http: httpx.Client, reference: Reference, minilm: ModelDir
) -> None:
    tok = minilm.tokenizer()
    long_text = " ".join(f"word{i}" for i in range(400))  # well over MiniLM's 256 tokens
    ids = tok.encode(long_text).ids
    assert len(ids) > 256
    refused = http.post("/v1/embeddings", json={"input": long_text})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    right = embed(http, input=long_text, truncate=True)
    assert right["usage"] == {"prompt_tokens": 256, "total_tokens": 256}
    # sentence-transformers itself cuts at max_seq_length (256) from the right.
    assert_close(vectors(right), reference([long_text]))
    left = embed(http, input=long_text, truncate=True, truncation_side="left")
    kept = [ids[0], *ids[-255:-1], ids[-1]]  # [CLS] + the last 254 word pieces + [SEP]
    same = embed(http, input=kept)
    assert cos(vectors(left)[0], vectors(same)[0]) >= 0.9999
    assert cos(vectors(left)[0], vectors(right)[0]) < 0.99


# --- quantized formats and long inputs ------------------------------------------------------------


def bundled_ranges(dimensions: int) -> npt.NDArray[np.float32]:
    ranges = json.loads(bundled_calibration().read_text())["ranges"][str(dimensions)]
    return np.array([ranges["min"], ranges["max"]], dtype=np.float32)


def test_quantized_formats_are_sentence_transformers_quantization_of_the_float_rows(
    http: httpx.Client, reference: Reference
) -> None:
    from sentence_transformers.util.quantization import quantize_embeddings

    ranges = bundled_ranges(384)
    floats = np.asarray(vectors(embed(http, input=TEXTS)), dtype=np.float32)
    for precision in ("int8", "uint8", "binary", "ubinary"):
        want = quantize_embeddings(floats, precision, ranges=ranges)
        assert isinstance(want, np.ndarray)
        got = np.asarray(vectors(embed(http, input=TEXTS, encoding_format=precision)))
        np.testing.assert_array_equal(got, want.astype(np.int64))
        packed = vectors(embed(http, input=TEXTS, encoding_format=f"{precision}_base64"))
        raw = np.stack([np.frombuffer(base64.b64decode(str(p)), dtype=want.dtype) for p in packed])
        np.testing.assert_array_equal(raw, want)
    # Against sentence-transformers' own float vectors, the sign bits agree (all but a rare
    # near-zero dimension).
    ours = quantize_embeddings(floats, "ubinary")
    theirs = quantize_embeddings(reference(TEXTS), "ubinary")
    assert isinstance(ours, np.ndarray)
    assert isinstance(theirs, np.ndarray)
    same_bits = (np.unpackbits(ours) == np.unpackbits(theirs)).mean()
    assert same_bits >= 0.995, same_bits


def test_int8_without_calibration_for_the_dimensions_is_a_clear_400(http: httpx.Client) -> None:
    reply = http.post(
        "/v1/embeddings", json={"input": "a", "encoding_format": "int8", "dimensions": 128}
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "encoding_format"
    assert "calibration at 128 dimensions" in error["message"]
    binary = embed(http, input="a", encoding_format="ubinary", dimensions=128)
    assert len(vectors(binary)[0]) == 16


#: past calibrate's batch of 64 texts, so the set travels as two requests
CALIBRATION_SET = [f"{i}. {MORE_TEXTS[i % len(MORE_TEXTS)]}" for i in range(70)]


def test_calibrate_writes_the_ranges_of_what_clients_get(
    fleet: Fleet, http: httpx.Client, tmp_path: Path
) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(CALIBRATION_SET) + "\n\n")
    out = tmp_path / "embedfleet_quantization.json"
    argv = ["--url", fleet.url, "--texts", str(texts), "--dimensions", "384,128", "--out"]
    main(["calibrate", *argv, str(out)])
    written = json.loads(out.read_text())
    assert (written["kind"], written["version"]) == ("embedfleet.dev/quantization-calibration", 1)
    assert written["samples"] == len(CALIBRATION_SET)
    assert written["model"] == http.get("/v1/models").json()["data"][0]["id"]
    for dims in (384, 128):
        rows = np.concatenate([
            np.asarray(vectors(embed(http, input=part, dimensions=dims)), dtype=np.float32)
            for part in (CALIBRATION_SET[:64], CALIBRATION_SET[64:])
        ])  # fmt: skip
        got = written["ranges"][str(dims)]
        np.testing.assert_allclose(got["min"], rows.min(axis=0), rtol=0, atol=1e-6)
        np.testing.assert_allclose(got["max"], rows.max(axis=0), rtol=0, atol=1e-6)


def _windows_reference(
    reference: Reference, ids: list[int], limit: int, overlap: int, specials: bool = True
) -> tuple[npt.NDArray[np.float64], int]:
    """The split input's vector computed directly with the sentence-transformers model's BERT.
    Windows: a span of content every `limit - ends - overlap` tokens, wrapped in [CLS] ... [SEP]
    for a text (token-id inputs are windowed as given); mean pooling per window, the mean of
    windows weighted by their lengths, then L2."""
    import torch

    bert: Any = reference.model[0].auto_model
    head, content, tail = (ids[:1], ids[1:-1], ids[-1:]) if specials else ([], ids, [])
    room = limit - len(head) - len(tail)
    starts = [0]
    while starts[-1] + room < len(content):
        starts.append(starts[-1] + room - overlap)
    windows = [[*head, *content[s : s + room], *tail] for s in starts]
    assert windows[-1][len(windows[-1]) - len(tail) - 1] == content[-1]
    pooled, weights = [], []
    with torch.no_grad():
        for w in windows:
            out = bert(input_ids=torch.tensor([w])).last_hidden_state[0]
            pooled.append(out.mean(dim=0).double().numpy())
            weights.append(len(w))
    vec = np.average(np.stack(pooled), axis=0, weights=weights)
    return vec / np.linalg.norm(vec), sum(weights)


def test_long_inputs_split_into_windows_give_the_weighted_mean(
    http: httpx.Client, reference: Reference, minilm: ModelDir
) -> None:
    tok = minilm.tokenizer()
    long_text = " ".join(f"{i}. {TEXTS[i % len(TEXTS)]}" for i in range(70))
    ids = tok.encode(long_text).ids
    assert len(ids) > 3 * 256
    refused = http.post("/v1/embeddings", json={"input": long_text})
    assert refused.status_code == 400
    assert "split_long_inputs" in refused.json()["error"]["message"]
    both = http.post(
        "/v1/embeddings", json={"input": long_text, "truncate": True, "split_long_inputs": True}
    )
    assert both.status_code == 400
    assert both.json()["error"]["param"] == "split_long_inputs"

    want, tokens = _windows_reference(reference, ids, 256, 32)
    doc = embed(http, input=[TEXTS[0], long_text, TEXTS[1]], split_long_inputs=True)
    rows = vectors(doc)
    assert cos(rows[1], want) >= 0.999, cos(rows[1], want)
    assert abs(np.linalg.norm(rows[1]) - 1) < 1e-3
    assert_close([rows[0], rows[2]], reference([TEXTS[0], TEXTS[1]]))
    short = len(tok.encode(TEXTS[0]).ids) + len(tok.encode(TEXTS[1]).ids)
    assert doc["usage"] == {"prompt_tokens": tokens + short, "total_tokens": tokens + short}
    # Token ids: windows of the ids as given (no special tokens of their own).
    want_ids, tokens_ids = _windows_reference(reference, ids, 256, 32, specials=False)
    as_ids = embed(http, input=ids, split_long_inputs=True)
    assert cos(vectors(as_ids)[0], want_ids) >= 0.999
    assert as_ids["usage"] == {"prompt_tokens": tokens_ids, "total_tokens": tokens_ids}


# --- rerank and score -----------------------------------------------------------------------------


def test_rerank_sorted_by_cosine(http: httpx.Client, reference: Reference) -> None:
    query = "Which vehicle travelled by the sea?"
    reply = http.post(
        "/v1/rerank",
        json={
            "query": query,
            "documents": [*TEXTS[:3], {"text": TEXTS[3]}],
            "top_n": 3,
            "return_documents": True,
        },
    )
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert len(results) == 3
    ref = reference([query, *TEXTS[:4]])
    want = {i: cos(ref[0], ref[i + 1]) for i in range(4)}
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert len({r["index"] for r in results}) == 3
    for r in results:
        # Embeddings agree to cosine 0.999, so a cosine of two of them agrees to about 0.01.
        assert abs(r["relevance_score"] - want[r["index"]]) < SCORE_TOLERANCE
        assert r["document"]["text"] == TEXTS[r["index"]]
    best = max(want, key=lambda i: want[i])
    assert results[0]["index"] == best  # the car on the coastal highway, by a wide margin


def test_score_one_to_many_and_pairs(http: httpx.Client, reference: Reference) -> None:
    ref = reference(TEXTS)
    one_to_many = http.post("/v1/score", json={"text_1": TEXTS[0], "text_2": TEXTS[1:]}).json()
    got = [d["score"] for d in one_to_many["data"]]
    assert len(got) == 4
    for i, score in enumerate(got):
        assert abs(score - cos(ref[0], ref[i + 1])) < SCORE_TOLERANCE
    pairs = http.post("/v1/score", json={"text_1": TEXTS[:2], "text_2": TEXTS[3:5]}).json()
    assert [d["index"] for d in pairs["data"]] == [0, 1]
    assert abs(pairs["data"][1]["score"] - cos(ref[1], ref[4])) < SCORE_TOLERANCE
    same = http.post("/v1/score", json={"text_1": TEXTS[2], "text_2": TEXTS[2]}).json()
    assert same["data"][0]["score"] > 0.999


# --- the official client, the plain GET routes ----------------------------------------------------


def test_official_openai_client(fleet: Fleet, name: str, reference: Reference) -> None:
    client = openai.OpenAI(base_url=fleet.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == [name]
    default = client.embeddings.create(model=name, input=TEXTS)  # the client asks for base64
    assert_close([d.embedding for d in default.data], reference(TEXTS))
    floats = client.embeddings.create(model=name, input=TEXTS[0], encoding_format="float")
    assert_close([floats.data[0].embedding], reference(TEXTS[:1]))
    assert default.usage.prompt_tokens == default.usage.total_tokens > 0
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="x")
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=name, input=[])


def test_get_routes(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    assert http.get("/ready").status_code == 200
    spec = http.get("/openapi.json").json()
    assert {"/v1/embeddings", "/v1/rerank", "/v1/score", "/v1/models"} <= spec["paths"].keys()
    assert "EmbeddingRequest" in spec["components"]["schemas"]
    text = http.get("/metrics").text
    for name in (
        "embedfleet_gateway_requests_total", "embedfleet_gateway_request_seconds_bucket",
        "embedfleet_gateway_tokenize_seconds_bucket", "embedfleet_gateway_upstream_seconds_bucket",
        "embedfleet_gateway_input_tokens_total", "embedfleet_gateway_chunks_per_request_bucket",
        "embedfleet_gateway_retries_total", "embedfleet_gateway_inflight_requests",
        "embedfleet_gateway_worker_ejections_total", "embedfleet_gateway_worker_outstanding_tokens",
    ):  # fmt: skip
        assert name in text, name


# --- bad input ------------------------------------------------------------------------------------


def _bad_requests(name: str) -> list[tuple[str, str | bytes | dict[str, object], int, str]]:
    """(path, body, status, text the message must contain)"""
    return [
        ("/v1/embeddings", b'{"input": "x",', 400, "not valid JSON"),
        ("/v1/embeddings", b"[1, 2]", 400, "JSON object"),
        ("/v1/embeddings", {"input": 5}, 400, "'input' must be"),
        ("/v1/embeddings", {"input": ["a", 1]}, 400, "'input' must be"),
        ("/v1/embeddings", {"input": [[1, 2], "a"]}, 400, "'input' must be"),
        ("/v1/embeddings", {}, 400, "'input' is required"),
        ("/v1/embeddings", {"input": []}, 400, "must not be empty"),
        ("/v1/embeddings", {"input": ["ok", ""]}, 400, "empty string"),
        ("/v1/embeddings", {"input": [[]]}, 400, "empty list of token ids"),
        ("/v1/embeddings", {"input": [[1, 10**9]]}, 400, "outside this model's vocabulary"),
        ("/v1/embeddings", {"input": "x " * 600}, 400, "more than this model's limit of 256"),
        ("/v1/embeddings", {"input": "x", "model": "gpt-9"}, 404, "does not exist"),
        ("/v1/embeddings", {"input": "x", "dimensions": 0}, 400, "'dimensions'"),
        ("/v1/embeddings", {"input": "x", "dimensions": 385}, 400, "between 1 and 384"),
        ("/v1/embeddings", {"input": "x", "encoding_format": "int4"}, 400, "'encoding_format'"),
        (
            "/v1/embeddings",
            {"input": "x", "encoding_format": "uint8", "dimensions": 64},
            400,
            "calibration at 64 dimensions",
        ),
        ("/v1/embeddings", {"input": "x", "split_long_inputs": 1}, 400, "valid boolean"),
        (
            "/v1/embeddings",
            {"input": "x", "split_long_inputs": True, "truncate": True},
            400,
            "pick one",
        ),
        ("/v1/embeddings", {"input": ["x"] * (MAX_BATCH + 1)}, 413, f"at most {MAX_BATCH}"),
        ("/v1/embeddings", {"input": ["word " * 200] * 100}, 413, f"at most {MAX_TOKENS}"),
        ("/v1/embeddings", {"input": "x" * (MAX_BODY + 10)}, 413, "over the limit"),
        ("/v1/rerank", {"documents": ["a"]}, 400, "'query' is required"),
        ("/v1/rerank", {"query": "q", "documents": []}, 400, "must not be empty"),
        ("/v1/rerank", {"query": "q", "documents": [3]}, 400, "'documents' must be"),
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c"]}, 400, "different lengths"),
        ("/v1/nothing", {}, 404, "No route"),
    ]


def test_each_bad_input_class_gets_its_status_and_message(http: httpx.Client, name: str) -> None:
    for path, body, status, needle in _bad_requests(name):
        if isinstance(body, bytes):
            reply = http.post(path, content=body, headers={"content-type": "application/json"})
        else:
            reply = http.post(path, json=body)
        assert reply.status_code == status, (
            path,
            body if len(str(body)) < 200 else "...",
            reply.text,
        )
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert needle in error["message"], (needle, error)
    assert http.get("/v1/embeddings").status_code == 405
    # Still healthy, still correct.
    assert http.get("/ready").status_code == 200
    assert embed(http, input="still fine")["usage"] == {"prompt_tokens": 4, "total_tokens": 4}


# --- failure: a worker killed under load (keep last: the fleet has one worker after it) -------


def test_worker_killed_under_load_loses_no_request(fleet: Fleet, http: httpx.Client) -> None:
    stop = threading.Event()
    failures: list[str] = []
    done = [0]
    texts = [f"{i} " + TEXTS[i % 5] for i in range(24)]

    def client() -> None:
        with httpx.Client(base_url=fleet.url, timeout=60) as c:
            while not stop.is_set():
                reply = c.post("/v1/embeddings", json={"input": texts})
                if reply.status_code != 200:
                    failures.append(reply.text)
                elif len(reply.json()["data"]) != len(texts):
                    failures.append("short reply")
                done[0] += 1

    victim = fleet.worker_children[0]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(client) for _ in range(6)]
        time.sleep(1.5)
        assert victim.process is not None
        before = done[0]
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait()
        time.sleep(2.5)
        stop.set()
        for f in futures:
            f.result()
    assert done[0] > before, "no request completed after the kill"
    assert failures == []
    text = http.get("/metrics").text
    assert sample(text, "embedfleet_gateway_worker_ejections_total") >= 1
    assert sample(text, "embedfleet_gateway_workers", state="ready") == 1  # the survivor
    assert http.get("/ready").status_code == 200


def test_log_lines_are_json_without_request_text(fleet: Fleet) -> None:
    assert fleet.log_dir is not None
    lines = Path(fleet.log_dir, "gateway.log").read_text().splitlines()
    assert lines
    for line in lines:
        json.loads(line)
    joined = "\n".join(lines)
    assert TEXTS[2] not in joined
    assert "word399" not in joined
