"""The client's path: the official `openai` client (its base64 decoded to the null engine's rows,
its errors raised as its own exceptions), no request text in the log whatever the request did,
a request in flight at SIGTERM answered within its deadline, and SIGTERM heard from the start."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from embedfleet.common.modeldir import ModelDir, default_model_path
from embedfleet.testing.gateway import gateway_binary, running_gateway
from embedfleet.testing.otlp import SECRET_TEXT
from embedfleet.testing.workers import running_worker

from .helpers import Gateway

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
TEXTS = ["The quick brown fox.", "Kubernetes restarts a container.", SECRET_TEXT]


def test_the_official_openai_client(null: Gateway, minilm: ModelDir) -> None:
    client = openai.OpenAI(base_url=null.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    # The client asks for base64 unless told otherwise and decodes it itself.
    got = client.embeddings.create(model=MODEL, input=TEXTS)
    ids = [minilm.tokenizer().encode(t).ids for t in TEXTS]
    want = np.zeros((len(TEXTS), 384), dtype=np.float32)
    want[:, :3] = [[len(i), sum(i), i[0]] for i in ids]
    np.testing.assert_array_equal([d.embedding for d in got.data], want)
    assert got.usage.prompt_tokens == got.usage.total_tokens == sum(map(len, ids))
    floats = client.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
    np.testing.assert_array_equal(floats.data[0].embedding, want[0])
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
        with running_gateway([worker.address], "--log-level", "debug", log=log) as gw:
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
    """SIGTERM stops new requests; a request already in flight is answered within its deadline,
    however long past the 10 s it once had it runs."""
    argv = ("--engine", "null", "--warmup-seconds", "0.2", "--null-tokens-per-second", "100")
    with running_worker(tmp_path, *argv) as worker:
        flags = ("--upstream-timeout-seconds", "40")
        with running_gateway([worker.address], *flags, log=tmp_path / "gw.log") as gw:
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


def test_a_kept_alive_connection_is_served_after_sigterm_then_closed(tmp_path: Path) -> None:
    """After SIGTERM a client's idle kept-alive connection still takes its next request (the
    listener is closed, so a new connection could not), answered with `Connection: close`; then
    the gateway exits. Closing such connections at SIGTERM lost the request a client sent as the
    close crossed it (a rolled gateway pod, one request in 252 of the e2e rollout's load)."""
    argv = ("--engine", "null", "--warmup-seconds", "0.2")
    with running_worker(tmp_path, *argv) as worker:
        log = tmp_path / "gw.log"
        with running_gateway([worker.address], log=log) as gw:
            with httpx.Client(base_url=gw.url, timeout=30) as http:
                first = http.post("/v1/embeddings", json={"input": "before"})
                assert first.status_code == 200, first.text
                assert first.headers.get("connection") != "close"
                os.kill(gw.proc.pid, signal.SIGTERM)
                deadline = time.monotonic() + 10
                while "open connections finish" not in log.read_text():
                    assert time.monotonic() < deadline, "the gateway never heard SIGTERM"
                    time.sleep(0.05)
                second = http.post("/v1/embeddings", json={"input": "after"})
                assert second.status_code == 200, second.text
                assert second.headers["connection"] == "close"
            assert gw.proc.wait(timeout=10) == 0


def test_sigterm_right_after_start_stops_it_as_pid_1(tmp_path: Path) -> None:
    """As a pod stopped while it starts: the binary as PID 1 of a PID namespace of its own,
    SIGTERM sent the moment it says it listens, 30 times (1 in 3 were lost when the
    handler came after that line)."""
    argv = ["unshare", "--user", "--map-root-user", "--pid", "--fork", str(gateway_binary())]
    argv += ["--workers", "127.0.0.1:9", "--port", "0", "--model", str(default_model_path())]
    lost = 0
    for _ in range(30):
        proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        while (line := proc.stderr.readline()) and "listening on" not in line:
            pass
        (pid1,) = map(int, Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split())
        os.kill(pid1, signal.SIGTERM)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            lost += 1
            os.kill(pid1, signal.SIGKILL)
            proc.wait()
    assert lost == 0
