"""The same request to the Python gateway and the Rust one, and what "the same answer" means:
equal status, equal JSON (floats within 1e-6), equal headers that matter (Allow, Retry-After)."""

from __future__ import annotations

import base64
import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.gateway_rs import running_gateway_rs
from embedfleet.testing.workers import metric_value
from tests.gateway.fakes import FakeWorker
from tests.gateway.helpers import GatewayThread

TOLERANCE = 1e-6
#: headers whose values must agree when either gateway sends them
COMPARED_HEADERS = ("allow", "retry-after", "content-type")


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


#: why the Rust gateway's /openapi.json can differ from the Python gateway's
STALE = (
    "gateway-rs/openapi/ is stale (the schemas changed): run "
    "`python -m embedfleet.gateway.openapi gateway-rs/openapi`"
)


def same(a: Any, b: Any, where: str = "$") -> None:
    """Equal JSON documents, floats within TOLERANCE; base64 float32 vectors compared decoded
    (quantized ones byte for byte)."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, int | float), f"{where}: {a!r} {b!r}"
        assert isinstance(b, int | float), f"{where}: {a!r} {b!r}"
        assert math.isclose(a, b, rel_tol=0, abs_tol=TOLERANCE), f"{where}: {a} != {b}"
        return
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__} ({a!r}, {b!r})"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, str) and where.endswith(".embedding"):
        raw_a, raw_b = base64.b64decode(a), base64.b64decode(b)
        if raw_a == raw_b:  # quantized rows (a byte a value) are equal to the byte
            return
        va = np.frombuffer(raw_a, dtype="<f4")
        vb = np.frombuffer(raw_b, dtype="<f4")
        assert va.shape == vb.shape, f"{where}: {va.shape} != {vb.shape}"
        assert np.allclose(va, vb, rtol=0, atol=TOLERANCE), f"{where}: {va} != {vb}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@dataclass
class Pair:
    python_url: str
    rust_url: str
    python_workers: list[FakeWorker]
    rust_workers: list[FakeWorker]
    _clients: list[httpx.Client] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._clients = [
            httpx.Client(base_url=u, timeout=30) for u in (self.python_url, self.rust_url)
        ]

    def close(self) -> None:
        for c in self._clients:
            c.close()

    def _send(self, client: httpx.Client, method: str, path: str, **kw: Any) -> Answer:
        reply = client.request(method, path, **kw)
        headers = {k.lower(): v for k, v in reply.headers.items()}
        return Answer(reply.status_code, headers, reply.content)

    def python(self) -> One:
        return One(self, 0)

    def rust(self) -> One:
        return One(self, 1)

    def both(self, method: str, path: str, **kw: Any) -> tuple[Answer, Answer]:
        return self.python().request(method, path, **kw), self.rust().request(method, path, **kw)

    def compare(self, method: str, path: str, **kw: Any) -> Any:
        """Sends the request to both; asserts equal answers; returns the (Python) document."""
        py, rs = self.both(method, path, **kw)
        assert py.status == rs.status, f"status {py.status} != {rs.status}: {py.body!r} {rs.body!r}"
        for name in COMPARED_HEADERS:
            assert py.headers.get(name) == rs.headers.get(name), f"header {name}"
        doc = py.json()
        same(doc, rs.json())
        return doc

    def models(self, **kw: Any) -> Any:
        """GET /v1/models from both: equal but for each entry's `created`, which is each
        process's own start time (two processes started a second apart differ there)."""
        py, rs = self.both("GET", "/v1/models", **kw)
        assert py.status == rs.status == 200, (py.body, rs.body)
        docs = [py.json(), rs.json()]
        for doc in docs:
            for entry in doc["data"]:
                assert isinstance(entry.pop("created"), int)
        assert docs[0] == docs[1]
        return docs[0]

    def embed(self, body: Any, **kw: Any) -> Any:
        return self.compare("POST", "/v1/embeddings", content=orjson.dumps(body), **kw)

    def metric_deltas(
        self, series: list[tuple[str, dict[str, str]]], requests: list[tuple[str, Any]]
    ) -> list[tuple[float, ...]]:
        """How far each gateway's `series` moved while `requests` (path, body) were compared."""

        def values() -> list[tuple[float, ...]]:
            texts = [one.request("GET", "/metrics").body.decode() for one in (self.python(),
                     self.rust())]  # fmt: skip
            return [tuple(metric_value(t, n, **labels) for n, labels in series) for t in texts]

        before = values()
        for path, body in requests:
            self.compare("POST", path, content=orjson.dumps(body))
        after = values()
        return [tuple(a - b for a, b in zip(x, y, strict=True)) for x, y in zip(after, before,
                strict=True)]  # fmt: skip

    def worker_counts(self) -> list[tuple[float, float]]:
        """(ready, all) workers each gateway counts in embedfleet_gateway_workers{state}."""
        out = []
        for one in (self.python(), self.rust()):
            text = one.request("GET", "/metrics").body.decode()
            states = [
                metric_value(text, "embedfleet_gateway_workers", state=s)
                for s in ("ready", "ejected", "unready")
            ]
            out.append((states[0], sum(states)))
        return out

    def served_by(self, inputs: list[Any]) -> list[set[int]]:
        """Which FAKE workers computed the rows of `inputs`, through each gateway (a fake's
        rows carry its number at index 3)."""
        body = orjson.dumps({"input": inputs})
        out = []
        for one in (self.python(), self.rust()):
            reply = one.request("POST", "/v1/embeddings", content=body)
            assert reply.status == 200, reply.body
            out.append({int(d["embedding"][3]) for d in reply.json()["data"]})
        return out

    def scrape(self) -> list[str]:
        """Each gateway's /metrics text."""
        out = []
        for one in (self.python(), self.rust()):
            reply = one.request("GET", "/metrics")
            assert reply.status == 200
            out.append(reply.body.decode())
        return out

    def set_workers(self, **fields: Any) -> None:
        """Each FAKE worker of both gateways takes `fields` (what its Info reports, say)."""
        for w in self.python_workers + self.rust_workers:
            for name, value in fields.items():
                setattr(w, name, value)

    def shed_alike(self, path: str, body: Any) -> tuple[str, str]:
        """The request sent to both until both shed it (their probes pick a worker's new Info
        up within --probe-seconds); asserts equal 429s; returns the message and Retry-After."""
        deadline = time.monotonic() + 5
        while True:
            py, rs = self.both("POST", path, content=orjson.dumps(body))
            if py.status == rs.status == 429 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert py.status == rs.status == 429, (py.body, rs.body)
        assert py.headers["retry-after"] == rs.headers["retry-after"]
        assert py.json() == rs.json()
        return py.json()["error"]["message"], py.headers["retry-after"]

    def served_alike(self) -> None:
        """A one-text request answered 200 by both, once their probes see the workers' Info."""
        deadline = time.monotonic() + 5
        while True:
            py, rs = self.both("POST", "/v1/embeddings", content=b'{"input":"x"}')
            if py.status == rs.status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert py.status == rs.status == 200, (py.body, rs.body)

    def queued_seconds_are(self, want: float) -> None:
        """Both gateways' queued-work gauges read `want` (their probes read the workers' Info)."""
        deadline = time.monotonic() + 5
        name = "embedfleet_gateway_queued_work_seconds"
        while True:
            gauges = [metric_value(t, name) for t in self.scrape()]
            if gauges == pytest.approx([want, want]) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert gauges == pytest.approx([want, want])

    def calls(self) -> tuple[list[int], list[int]]:
        """Sequences per Embed call each gateway's fakes saw, sorted, and forgets them."""
        out = []
        for workers in (self.python_workers, self.rust_workers):
            seen = sorted(n for w in workers for n in w.calls)
            for w in workers:
                w.calls.clear()
            out.append(seen)
        return out[0], out[1]


@dataclass
class One:
    """One gateway of a Pair: 0 the Python one, 1 the Rust one."""

    pair: Pair
    which: int

    def request(self, method: str, path: str, **kw: Any) -> Answer:
        return self.pair._send(self.pair._clients[self.which], method, path, **kw)

    def url(self) -> str:
        """This gateway's base URL (for a client of the test's own)."""
        return (self.pair.python_url, self.pair.rust_url)[self.which]


@contextlib.contextmanager
def gateways(
    minilm: ModelDir,
    python: GatewaySettings,
    rust_flags: list[str],
    log: Path,
    workers: tuple[list[FakeWorker], list[FakeWorker]] = ([], []),
    wait_ready: bool = True,
) -> Iterator[Pair]:
    """The Python gateway (in a thread) with `python` and the Rust one with `rust_flags`, as a
    Pair for the block; `workers`: each one's FAKE workers, when the test reads them."""
    gateway = GatewayThread(python, minilm).start()
    try:
        with running_gateway_rs([], *rust_flags, log=log, wait_ready=wait_ready) as rs:
            pair = Pair(gateway.url, rs.url, *workers)
            try:
                yield pair
            finally:
                pair.close()
    finally:
        gateway.stop()
