"""What tests/gateway checks of the Python gateway's client path, checked of the Rust one: the
official `openai` client against both (the same answers and errors), no request text in its log
whatever the request did, and a request in flight at SIGTERM answered within its deadline."""

from __future__ import annotations

import base64
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from embedfleet.testing.gateway_rs import running_gateway_rs
from embedfleet.testing.otlp import SECRET_TEXT
from embedfleet.testing.workers import running_worker

from .pair import Pair

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
TEXTS = ["The quick brown fox.", "Kubernetes restarts a container.", SECRET_TEXT]


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_the_official_openai_client_gets_the_same_from_both(null_pair: Pair) -> None:
    python, rust = _client(null_pair.python_url), _client(null_pair.rust_url)
    assert [m.id for m in rust.models.list().data] == [m.id for m in python.models.list().data]
    # The client asks for base64 unless told otherwise and decodes it itself.
    got = [c.embeddings.create(model=MODEL, input=TEXTS) for c in (python, rust)]
    vectors = [np.array([d.embedding for d in g.data], dtype=np.float32) for g in got]
    np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-6)
    assert got[0].usage.prompt_tokens == got[1].usage.prompt_tokens > 0
    floats = rust.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, vectors[1][0], atol=1e-6)
    for client in (python, rust):
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="no-such-model", input="x")
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model=MODEL, input=[])


def test_no_request_text_reaches_the_log_whatever_the_request_did(tmp_path: Path) -> None:
    # A worker that refuses past 8 tokens, which the gateway (256 for the model) lets through:
    # answers, the gateway's refusals and the worker's alike.
    argv = ("--engine", "null", "--warmup-seconds", "0.2", "--max-input-tokens", "8")
    with running_worker(tmp_path, *argv) as worker:
        log = tmp_path / "gw.log"
        with running_gateway_rs([worker.address], "--log-level", "debug", log=log) as gw:
            secret_ids = base64.b64encode(SECRET_TEXT.encode()).decode()
            bodies: list[object] = [
                {"input": "short"},
                {"input": SECRET_TEXT},
                {"input": [SECRET_TEXT, "short"], "truncate": True},
                {"input": SECRET_TEXT, "dimensions": 0},
                {"input": SECRET_TEXT, "model": SECRET_TEXT},
                {"input": SECRET_TEXT, "encoding_format": SECRET_TEXT},
                {"input": [SECRET_TEXT] * 5000},
                {"input": {"text": SECRET_TEXT}},
                [SECRET_TEXT],
            ]
            with httpx.Client(base_url=gw.url, timeout=30) as http:
                statuses = [http.post("/v1/embeddings", json=b).status_code for b in bodies]
                bad = http.post("/v1/embeddings", content=f'{{"input": "{SECRET_TEXT}",'.encode())
        assert 200 in statuses
        assert bad.status_code == 400
        assert {s for s in statuses if s != 200} <= {400, 404, 413, 422}
    text = log.read_text()
    assert text.strip()
    for fragment in (SECRET_TEXT, "a secret sentence", secret_ids):
        assert fragment not in text


def test_a_request_in_flight_at_sigterm_finishes_within_its_deadline(tmp_path: Path) -> None:
    """As tests/gateway/test_serve.py's for the Python gateway: SIGTERM stops new requests, and a
    request already in flight is answered, however long past the old 10 s it runs."""
    argv = ("--engine", "null", "--warmup-seconds", "0.2", "--null-tokens-per-second", "100")
    with running_worker(tmp_path, *argv) as worker:
        flags = ("--upstream-timeout-seconds", "40")
        with running_gateway_rs([worker.address], *flags, log=tmp_path / "gw.log") as gw:
            texts = [" ".join(["word"] * 200)] * 6  # 6 x 202 tokens: ~12 s at 100 tokens/s
            replies: list[httpx.Response] = []
            sender = threading.Thread(
                target=lambda: replies.append(
                    httpx.post(gw.url + "/v1/embeddings", json={"input": texts}, timeout=60)
                )
            )
            sent = time.monotonic()
            sender.start()
            time.sleep(1.0)
            os.kill(gw.proc.pid, signal.SIGTERM)
            sender.join(60)
            (reply,) = replies
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["prompt_tokens"] == 6 * 202
            assert time.monotonic() - sent > 12  # it really was in flight beyond 10 s
            assert gw.proc.wait(timeout=30) == 0
