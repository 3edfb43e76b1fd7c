"""The families with their own heads through the HTTP API: the gateway and a REAL worker process
(`Fleet`, as `embedfleet serve` runs them) per family, serving a random-weight checkpoint built on
the published config (testing.families); answers against `transformers` in this process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from embedfleet.common.modeldir import load_model_dir
from embedfleet.common.net import free_ports
from embedfleet.fleet.supervisor import Fleet
from embedfleet.testing import families
from embedfleet.testing.families import FamilyDirs

pytestmark = pytest.mark.slow

SCORE_TOLERANCE = 1e-3
QUERY = families.TEXTS[0]
DOCUMENTS = list(families.TEXTS[1:])


@contextlib.contextmanager
def serve(
    path: Path, log_dir: Path, *args: str, worker: tuple[str, ...] = ()
) -> Iterator[httpx.Client]:
    """`args` go to the gateway and the worker, `worker` to the worker alone."""
    (port,) = free_ports(1)
    fleet = Fleet(
        workers=1,
        model=str(path),
        port=port,
        # Small chunks: a request of a few inputs already travels as several calls.
        gateway_args=["--chunk-tokens", "64", "--min-chunk-tokens", "16", *args],
        worker_args=["--warmup-seconds", "0.2", "--threads", "1", *args, *worker],
        log_dir=log_dir,
    )
    with fleet, httpx.Client(base_url=fleet.url, timeout=60) as client:
        yield client


def post(http: httpx.Client, route: str, **body: object) -> dict[str, object]:
    reply = http.post(route, json=body)
    assert reply.status_code == 200, reply.text
    doc: dict[str, object] = reply.json()
    return doc


def refused(http: httpx.Client, route: str, status: int, **body: object) -> str:
    reply = http.post(route, json=body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return str(error["message"])


def sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(1 / (1 + np.exp(-x)))


# --- XLM-R cross-encoder (bge-reranker-v2-m3 shape) ---------------------------------------------


@pytest.fixture(scope="module")
def xlmr(
    family_dirs: FamilyDirs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    path = family_dirs.get("bge-reranker-v2-m3")
    with serve(path, tmp_path_factory.mktemp("xlmr"), "--max-input-tokens", "512") as http:
        yield http


def test_xlmr_rerank_and_score(xlmr: httpx.Client, family_dirs: FamilyDirs) -> None:
    path = family_dirs.get("bge-reranker-v2-m3")
    tok = load_model_dir(path).tokenizer()
    pairs = [tok.encode(QUERY, d) for d in DOCUMENTS]
    seqs, types = [p.ids for p in pairs], [p.type_ids for p in pairs]
    want = sigmoid(families.classifier_logits(path, seqs, types)[:, 0])
    doc = post(xlmr, "/v1/rerank", query=QUERY, documents=DOCUMENTS)
    results = doc["results"]
    assert isinstance(results, list)
    got = {r["index"]: r["relevance_score"] for r in results}
    assert [r["index"] for r in results] == list(np.argsort(-want, kind="stable"))
    np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], want, atol=SCORE_TOLERANCE)
    assert doc["usage"] == {
        "prompt_tokens": sum(map(len, seqs)),
        "total_tokens": sum(map(len, seqs)),
    }
    scored = post(xlmr, "/v1/score", text_1=QUERY, text_2=DOCUMENTS)["data"]
    assert isinstance(scored, list)
    np.testing.assert_allclose([d["score"] for d in scored], want, atol=SCORE_TOLERANCE)


def test_xlmr_refuses_what_it_cannot_do(xlmr: httpx.Client) -> None:
    message = refused(xlmr, "/v1/embeddings", 400, input="x")
    assert "/v1/rerank" in message
    message = refused(xlmr, "/v1/rerank", 400, query="q", documents=["d"], instruction="x")
    assert "'instruction' applies only to prompt-template rerankers" in message
    assert "needs a sequence classifier" in refused(xlmr, "/v1/classify", 400, input="x")


# --- Qwen3-Reranker ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen(
    family_dirs: FamilyDirs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    path = family_dirs.get("Qwen3-Reranker-0.6B")
    with serve(path, tmp_path_factory.mktemp("qwen"), "--max-input-tokens", "160") as http:
        yield http


@pytest.mark.parametrize("instruction", [None, "Given a claim, find documents that refute it"])
def test_qwen3_reranker_scores_as_the_model_card(
    qwen: httpx.Client, family_dirs: FamilyDirs, instruction: str | None
) -> None:
    path = family_dirs.get("Qwen3-Reranker-0.6B")
    want = families.qwen3_reranker_scores(path, [(QUERY, d) for d in DOCUMENTS], instruction)
    extra = {"instruction": instruction} if instruction else {}
    doc = post(qwen, "/v1/rerank", query=QUERY, documents=DOCUMENTS, top_n=3, **extra)
    results = doc["results"]
    assert isinstance(results, list)
    assert [r["index"] for r in results] == list(np.argsort(-want, kind="stable")[:3])
    np.testing.assert_allclose(
        [r["relevance_score"] for r in results], np.sort(want)[::-1][:3], atol=SCORE_TOLERANCE
    )
    pairs = post(qwen, "/v1/score", text_1=[QUERY] * 2, text_2=DOCUMENTS[:2], **extra)["data"]
    assert isinstance(pairs, list)
    np.testing.assert_allclose([d["score"] for d in pairs], want[:2], atol=SCORE_TOLERANCE)


def test_qwen3_reranker_long_documents_and_bad_input(qwen: httpx.Client) -> None:
    long = " ".join(families.TEXTS) * 3
    message = refused(qwen, "/v1/rerank", 400, query=QUERY, documents=[long])
    assert "limit of 160" in message
    doc = post(qwen, "/v1/rerank", query=QUERY, documents=[long, DOCUMENTS[0]], truncate=True)
    assert doc["usage"]["prompt_tokens"] <= 2 * 160  # type: ignore[index]
    assert "must not be empty" in refused(
        qwen, "/v1/rerank", 400, query=QUERY, documents=["d"], instruction=""
    )
    assert "'instruction'" in refused(
        qwen, "/v1/rerank", 400, query=QUERY, documents=["d"], instruction=3
    )


# --- SPLADE ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def splade(
    family_dirs: FamilyDirs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    # float32: top_k and threshold are compared with the reference's exact order of weights
    # (auto may keep bf16, whose vectors are within cosine 0.999 but reorder near-equal weights).
    path = family_dirs.get("splade")
    with serve(path, tmp_path_factory.mktemp("splade"), worker=("--dtype", "float32")) as http:
        yield http


def dense(entry: dict[str, object], dims: int) -> np.ndarray:
    vector = entry["embedding"]
    assert isinstance(vector, dict)
    indices, values = vector["indices"], vector["values"]
    assert indices == sorted(indices)
    out = np.zeros(dims, np.float64)
    out[indices] = values
    return out


def test_splade_sparse_embeddings(splade: httpx.Client, family_dirs: FamilyDirs) -> None:
    path = family_dirs.get("splade")
    model = load_model_dir(path)
    tok = model.tokenizer()
    seqs = [tok.encode(t).ids for t in families.TEXTS]
    want = families.splade_vectors(path, seqs)
    doc = post(splade, "/v1/sparse_embeddings", input=list(families.TEXTS))
    data = doc["data"]
    assert isinstance(data, list)
    assert [d["index"] for d in data] == list(range(len(seqs)))
    assert {d["object"] for d in data} == {"sparse_embedding"}
    assert {d["dimensions"] for d in data} == {model.vocab_size}
    got = np.stack([dense(d, model.vocab_size) for d in data])
    cosines = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosines.min() >= 0.999
    np.testing.assert_allclose(got, want, atol=SCORE_TOLERANCE)
    # top_k keeps the largest weights; threshold drops the small ones; token ids work too.
    top = post(splade, "/v1/sparse_embeddings", input=seqs[0], top_k=5)["data"]
    assert isinstance(top, list)
    kept = top[0]["embedding"]["indices"]
    assert sorted(kept) == sorted(np.argsort(-want[0], kind="stable")[:5].tolist())
    weights = np.sort(want[1][want[1] > 0])
    gap = next(i for i in range(weights.size // 2, weights.size - 1)
               if weights[i + 1] - weights[i] > 1e-3)  # fmt: skip
    cut = float(weights[gap] + weights[gap + 1]) / 2
    over = post(splade, "/v1/sparse_embeddings", input=families.TEXTS[1], threshold=cut)["data"]
    assert isinstance(over, list)
    assert over[0]["embedding"]["indices"] == np.flatnonzero(want[1] > cut).tolist()


def test_splade_bad_input(splade: httpx.Client) -> None:
    assert "/v1/sparse_embeddings" in refused(splade, "/v1/embeddings", 400, input="x")
    assert "threshold" in refused(splade, "/v1/sparse_embeddings", 400, input="x", threshold=-1)
    assert "top_k" in refused(splade, "/v1/sparse_embeddings", 400, input="x", top_k=0)
    assert "must not be empty" in refused(splade, "/v1/sparse_embeddings", 400, input=[])


# --- sequence classification (finbert shape) -----------------------------------------------------


@pytest.fixture(scope="module")
def finbert(
    family_dirs: FamilyDirs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    with serve(family_dirs.get("finbert"), tmp_path_factory.mktemp("finbert")) as http:
        yield http


def test_classify_labels_and_scores(finbert: httpx.Client, family_dirs: FamilyDirs) -> None:
    path = family_dirs.get("finbert")
    tok = load_model_dir(path).tokenizer()
    seqs = [tok.encode(t).ids for t in families.TEXTS]
    logits = families.classifier_logits(path, seqs)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    names = ["positive", "negative", "neutral"]
    doc = post(finbert, "/v1/classify", input=list(families.TEXTS))
    data = doc["data"]
    assert isinstance(data, list)
    for i, entry in enumerate(data):
        assert entry["index"] == i
        assert entry["num_classes"] == 3
        assert entry["label"] == names[int(np.argmax(probs[i]))]
        np.testing.assert_allclose(entry["probs"], probs[i], atol=SCORE_TOLERANCE)
        assert [x["label"] for x in entry["labels"]] == [names[k] for k in np.argsort(-probs[i])]
        assert entry["score"] == entry["labels"][0]["score"]
    raw = post(finbert, "/v1/classify", input=families.TEXTS[0], raw_scores=True, top_k=1)["data"]
    assert isinstance(raw, list)
    np.testing.assert_allclose(raw[0]["probs"], logits[0], atol=SCORE_TOLERANCE)
    assert len(raw[0]["labels"]) == 1


def test_classify_bad_input(finbert: httpx.Client) -> None:
    assert "empty string" in refused(finbert, "/v1/classify", 400, input="")
    assert "top_k" in refused(finbert, "/v1/classify", 400, input="x", top_k=0)
    assert "/v1/classify" in refused(finbert, "/v1/rerank", 400, query="q", documents=["d"])
    assert "/v1/classify" in refused(finbert, "/v1/sparse_embeddings", 400, input="x")
