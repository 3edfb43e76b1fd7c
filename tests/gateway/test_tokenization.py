"""Tokenization as the model's own tokenizer (`tokenizers`, which sentence-transformers runs) does
it, through a REAL null-engine worker whose row of an input is [its tokens, the sum of its ids,
its first id]: every line of this repository's docs (ASCII prose, code, tables, and lines with
other characters), random texts cut at a small limit from either side (a long text is cut to a
window before tokenizing, which must not change the result), and ten megabytes of text."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest
from tokenizers import Tokenizer

from embedfleet.common.modeldir import ModelDir
from embedfleet.testing.workers import WorkerProcess, running_worker

from .helpers import Gateway, serving, wait_until

ROOT = Path(__file__).resolve().parents[2]
PIECES = [
    "word", "Tokenization", "naïve", "café", "e\u0301", "日本語", "don't", "...", ",", "!!",
    "x" * 120, "http://example.com/a?b=c", "1234567", "ÆØÅ", "\u00a0", "\t", "\n\n", "  ",
]  # fmt: skip
LIMIT = 16


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    workdir = tmp_path_factory.mktemp("tokenization")
    with running_worker(workdir, "--engine", "null", "--warmup-seconds", "0.2") as running:
        yield running


def _gateway(worker: WorkerProcess, tmp: Path, **settings: object) -> Iterator[Gateway]:
    with serving({"probe_seconds": 0.1, **settings}, tmp / "gateway.log",
                 addresses=[worker.address]) as gateway:  # fmt: skip
        yield gateway


@pytest.fixture(scope="module")
def wide(worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The default limits (16 MiB bodies, the model's 256 tokens)."""
    yield from _gateway(worker, tmp_path_factory.mktemp("wide"))


@pytest.fixture(scope="module")
def narrow(worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A limit of 16 tokens: most texts here are cut."""
    yield from _gateway(worker, tmp_path_factory.mktemp("narrow"), max_input_tokens=LIMIT)


def _reference(minilm: ModelDir, limit: int = 0, side: str = "right") -> Tokenizer:
    tok = minilm.tokenizer()
    if limit:
        tok.enable_truncation(limit, strategy="longest_first", direction=side)
    return tok


def _rows(gateway: Gateway, texts: list[str], **extra: object) -> list[list[float]]:
    doc = gateway.ok("/v1/embeddings", {"input": texts, **extra})
    return [d["embedding"][:3] for d in doc["data"]]


def _summary(tok: Tokenizer, text: str) -> list[float]:
    ids = tok.encode(text).ids
    return [len(ids), sum(ids), ids[0]]


def test_every_line_of_the_docs_tokenizes_as_the_tokenizer(wide: Gateway, minilm: ModelDir) -> None:
    lines = sorted({
        line.strip()
        for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for line in doc.read_text().splitlines()
        if line.strip()
    })  # fmt: skip
    assert len(lines) > 1000
    assert sum(not line.isascii() for line in lines) > 50  # the general path is taken too
    tok = _reference(minilm, 256)
    for start in range(0, len(lines), 64):
        batch = lines[start : start + 64]
        assert _rows(wide, batch, truncate=True) == [_summary(tok, t) for t in batch], batch


def _text(rng: random.Random, pieces: int) -> str:
    out = []
    for _ in range(pieces):
        out.append(rng.choice(PIECES))
        out.append(rng.choice([" ", " ", " ", "", "   ", "\n"]))
    return "".join(out)


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_cut_text_tokenizes_as_the_whole_text_cut(
    narrow: Gateway, minilm: ModelDir, side: str
) -> None:
    rng = random.Random(f"window-{side}")
    texts = [_text(rng, rng.randrange(1, 800)) for _ in range(200)]
    cut = _reference(minilm, LIMIT, side)
    for start in range(0, len(texts), 50):
        batch = texts[start : start + 50]
        got = _rows(narrow, batch, truncate=True, truncation_side=side)
        assert got == [_summary(cut, t) for t in batch]
    whole = _reference(minilm)
    for text in texts[:60]:
        reply = narrow.post("/v1/embeddings", {"input": text, "truncation_side": side})
        if len(whole.encode(text).ids) > LIMIT:
            assert reply.status == 400
            assert reply.json()["error"]["code"] == "context_length_exceeded"
        else:
            assert reply.status == 200
            assert reply.json()["data"][0]["embedding"][:3] == _summary(whole, text)


def test_ten_megabytes_are_cut_quickly_and_small_requests_keep_their_lane(
    wide: Gateway, minilm: ModelDir
) -> None:
    words = ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "at", "dawn"]
    big = " ".join(words[i % len(words)] for i in range(2_000_000))[: 10 << 20]
    start = time.monotonic()
    (row,) = _rows(wide, [big], truncate=True)
    took = time.monotonic() - start
    # 256 tokens come from the first ~1,300 characters
    assert row == _summary(_reference(minilm, 256), big[:20_000])
    error = wide.error("/v1/embeddings", {"input": big}, 400)
    assert error["message"].startswith("Input 0 has at least ")
    # A text no window can shorten (one 10 MB "word": a single [UNK]) is tokenized whole, on the
    # large-request lane; four of them queue there while small requests go on. Timed once all
    # four bodies are parsed (reading 40 MB of JSON is the HTTP server's work, not the lane's).
    # encoded once: four client threads encoding 10 MB each would hold this process's GIL
    hard = orjson.dumps({"input": "x" * (10 << 20), "truncate": True})
    small = {"input": "a short query about embeddings and vectors " * 7, "truncate": True}
    parsed = ("embedfleet_gateway_stage_seconds_count", {"stage": "parse"})
    (before,) = wide.values([parsed])
    with ThreadPoolExecutor(4) as pool:
        heavy = [pool.submit(wide.post, "/v1/embeddings", hard) for _ in range(4)]
        wait_until("four bodies parsed", lambda: wide.values([parsed])[0] >= before + 4, 60)
        waits = []
        for _ in range(30):
            t = time.monotonic()
            assert wide.post("/v1/embeddings", small).status == 200
            waits.append(time.monotonic() - t)
            time.sleep(0.02)
        assert not all(h.done() for h in heavy)  # the small ones ran while the lane was busy
        assert [h.result(timeout=120).status for h in heavy] == [200] * 4
    print(f"10 MB cut in {took * 1e3:.1f} ms; small next to whole 10 MB: worst {max(waits):.3f} s")
    assert took < 2.0, took
    assert max(waits) < 0.5
