"""A PyLate ColBERT that names PyLate's encoding rules (markers, query/document lengths, query
expansion, skip-list) through the gateway binary in front of a REAL torch worker: each route's
vectors against PyLate's rules applied in the test (families.pylate_encoded) and the model run
on `transformers`. Vectors cross the wire as float16."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from embedfleet.common.similarity import min_cosine
from embedfleet.testing import families
from embedfleet.testing.families import TEXTS, FamilyDirs
from embedfleet.testing.workers import WorkerProcess, running_worker

from .helpers import SMALL_CHUNKS, Gateway, serving

Vectors = npt.NDArray[np.float32]
QUERY, DOCUMENTS = TEXTS[0], [TEXTS[8], TEXTS[1]]  # "... Germany." keeps its "." under the cut


@pytest.fixture(scope="module")
def model(family_dirs: FamilyDirs) -> Path:
    return family_dirs.get("pylate-colbert-marked")


@pytest.fixture(scope="module")
def worker(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    workdir = tmp_path_factory.mktemp("pylate-worker")
    # float32: scores are held to 2e-2 (`auto` is bfloat16 on a CPU with native bf16: 2.6e-2)
    argv = (
        "--threads",
        "1",
        "--warmup-seconds",
        "0.2",
        "--model",
        str(model),
        "--dtype",
        "float32",
    )
    with running_worker(workdir, *argv) as worker:
        yield worker


@pytest.fixture(scope="module")
def pylate(
    model: Path, worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """The fixture's rules: its expansion tokens attended to."""
    with serve_model(model, worker, tmp_path_factory.mktemp("pylate")) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def unattended_model(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights with PyLate's default: no token attends to the expansion tokens."""
    return families.pylate_unattended(model, tmp_path_factory.mktemp("models") / "unattended")


@pytest.fixture(scope="module")
def unattended(
    unattended_model: Path, worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """A gateway of `unattended_model` before the same worker: the gateway reads the rule."""
    with serve_model(unattended_model, worker, tmp_path_factory.mktemp("unattended")) as gw:
        yield gw


@contextmanager
def serve_model(model: Path, worker: WorkerProcess, workdir: Path) -> Iterator[Gateway]:
    settings = {"model": model, **SMALL_CHUNKS}
    with serving(settings, workdir / "gateway.log", addresses=[worker.address]) as gateway:
        yield gateway


def reference(model: Path, texts: list[str], query: bool) -> list[Vectors]:
    """Each text's vectors as PyLate gives them: its encoded ids through the model (a query's
    expansion tokens attended to or not, as its config says), a document's skip-list tokens
    left out."""
    seqs = families.pylate_encoded(model, texts, query)
    keys = families.pylate_keys(model, seqs) if query else None
    vectors = families.pylate_colbert_vectors(model, seqs, keys)
    if query:
        return vectors
    return [v[families.pylate_kept(model, s)] for v, s in zip(vectors, seqs, strict=True)]


def vectors_of(doc: dict[str, object]) -> list[Vectors]:
    data = doc["data"]
    assert isinstance(data, list)
    return [np.asarray(d["embedding"], np.float32) for d in data]


def test_a_query_is_marked_and_expanded_to_its_length(pylate: Gateway, model: Path) -> None:
    body = {"input": [QUERY, TEXTS[1]], "input_type": "query"}
    got = vectors_of(pylate.ok("/v1/multi-vector", body))
    want = reference(model, [QUERY, TEXTS[1]], query=True)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape == (families.PYLATE_RULES["query_length"], 24)
        assert min_cosine(g, w) >= 0.999


def test_unattended_expansion_tokens_are_no_key_but_keep_their_vectors(
    unattended: Gateway, unattended_model: Path, model: Path
) -> None:
    texts = [QUERY, "Paris?"]
    got = vectors_of(unattended.ok("/v1/multi-vector", {"input": texts, "input_type": "query"}))
    want = reference(unattended_model, texts, query=True)
    attended = reference(model, texts, query=True)
    for g, w, a in zip(got, want, attended, strict=True):
        assert g.shape == w.shape == (families.PYLATE_RULES["query_length"], 24)
        assert min_cosine(g, w) >= 0.999
        assert np.abs(w - a).max() > 1e-2  # a result the attended fixture cannot give
    # Beside documents in one request (rerank): documents as without the query's key lengths.
    body = {"query": texts[1], "documents": DOCUMENTS}
    ours = {r["index"]: r["relevance_score"] for r in unattended.ok("/v1/rerank", body)["results"]}
    docs = reference(model, DOCUMENTS, query=False)
    want_scores = {i: float((want[1] @ d.T).max(axis=1).sum()) for i, d in enumerate(docs)}
    assert ours == pytest.approx(want_scores, abs=2e-2)


def test_a_document_is_marked_cut_and_skips_punctuation(pylate: Gateway, model: Path) -> None:
    doc = pylate.ok("/v1/multi-vector", {"input": DOCUMENTS})  # a document by default
    want = reference(model, DOCUMENTS, query=False)
    seqs = families.pylate_encoded(model, DOCUMENTS, query=False)
    assert not all(families.pylate_kept(model, seqs[0]))  # the test text has a skipped token
    for g, w in zip(vectors_of(doc), want, strict=True):
        assert g.shape == w.shape
        assert min_cosine(g, w) >= 0.999
    # usage counts the tokens the model ran, skipped ones included
    assert doc["usage"]["prompt_tokens"] == sum(len(s) for s in seqs)


def test_rerank_scores_the_query_against_documents(pylate: Gateway, model: Path) -> None:
    doc = pylate.ok("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
    [q] = reference(model, [QUERY], query=True)
    want = {
        i: float((q @ d.T).max(axis=1).sum())
        for i, d in enumerate(reference(model, DOCUMENTS, query=False))
    }
    got = {r["index"]: r["relevance_score"] for r in doc["results"]}
    assert got == pytest.approx(want, abs=2e-2)


def test_an_unknown_input_type_is_refused(pylate: Gateway) -> None:
    err = pylate.error("/v1/multi-vector", {"input": QUERY, "input_type": "passage"}, 400)
    assert err["param"] == "input_type"


def test_tei_embed_all_takes_the_query_side_from_prompt_name(pylate: Gateway) -> None:
    [query] = pylate.ok("/embed_all", {"inputs": QUERY, "prompt_name": "query"})
    [document] = pylate.ok("/embed_all", {"inputs": QUERY})
    assert len(query) == families.PYLATE_RULES["query_length"]
    assert len(document) < len(query)  # "?" skipped, no expansion
