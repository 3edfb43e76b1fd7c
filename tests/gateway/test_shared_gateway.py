"""A shared gateway: one endpoint in front of several fleets, routed by the request's `model`.

Each test runs against both gateways: the Python one (the real app under uvicorn) and the Rust
binary, with one models file naming two fleets of FAKE workers (their "embedding" ends with the
worker's number, so each reply shows which fleet answered). Readiness is read from /metrics, as
an operator's dashboards read it, so both are driven through their HTTP API alone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from embedfleet.common.modeldir import ModelDir, default_model_path
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.gateway_rs import running_gateway_rs
from embedfleet.testing.workers import metric_value

from .fakes import FakeWorker
from .helpers import GatewayThread, wait_until

#: fleet "alpha" is workers 1 and 2; fleet "beta" is worker 7
ALPHA, BETA = (1, 2), (7,)


@dataclass
class Shared:
    url: str
    workers: dict[int, FakeWorker]

    def ready_workers(self, model: str) -> float:
        text = httpx.get(self.url + "/metrics").text
        return metric_value(text, "embedfleet_gateway_workers", state="ready", model=model)

    def wait_ready(self, what: str, alpha: int, beta: int) -> None:
        wait_until(
            what, lambda: [self.ready_workers(m) for m in ("alpha", "beta")] == [alpha, beta]
        )


@pytest.fixture(scope="module", params=["python", "rust"])
def shared(
    request: pytest.FixtureRequest, minilm: ModelDir, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Shared]:
    workers = {n: FakeWorker(n).start() for n in (*ALPHA, *BETA)}
    models = {
        "models": [
            {
                "served_model_name": "alpha",
                "model": str(default_model_path()),
                "workers": [workers[n].address for n in ALPHA],
            },
            {
                "served_model_name": "beta",
                "model": str(default_model_path()),
                "workers": [workers[n].address for n in BETA],
                # Per model: beta holds requests while it has no ready worker, alpha does not.
                "hold_requests": 8,
            },
        ]
    }
    tmp = Path(tmp_path_factory.mktemp("shared"))
    path = tmp / "models.json"
    path.write_bytes(orjson.dumps(models))
    with contextlib.ExitStack() as stack:
        for w in workers.values():
            stack.callback(w.stop)
        if request.param == "python":
            settings = GatewaySettings(models_file=str(path), probe_seconds=0.1)
            gw = GatewayThread(settings, minilm).start()
            stack.callback(gw.stop)
            url = gw.url
        else:
            flags = ("--models-file", str(path), "--probe-seconds", "0.1")
            url = stack.enter_context(running_gateway_rs([], *flags, log=tmp / "rs.log")).url
        served = Shared(url, workers)
        served.wait_ready("both fleets ready", 2, 1)
        yield served


def _embed(shared: Shared, **body: object) -> httpx.Response:
    return httpx.post(
        shared.url + "/v1/embeddings", json={"input": ["a b", "c"], **body}, timeout=30
    )


def test_each_model_is_served_by_its_own_fleet(shared: Shared) -> None:
    for model, fleet in (("alpha", ALPHA), ("beta", BETA), ("alpha", ALPHA)):
        reply = _embed(shared, model=model)
        assert reply.status_code == 200, reply.text
        doc = reply.json()
        assert doc["model"] == model
        # [first id, last id, length, worker number]: the worker is one of that fleet's.
        assert {int(d["embedding"][3]) for d in doc["data"]} <= set(fleet)
        assert doc["usage"]["prompt_tokens"] > 0


def test_models_lists_every_served_model(shared: Shared) -> None:
    doc = httpx.get(shared.url + "/v1/models").json()
    assert doc["object"] == "list"
    assert [m["id"] for m in doc["data"]] == ["alpha", "beta"]
    assert {m["object"] for m in doc["data"]} == {"model"}


def test_an_unknown_model_is_404_in_openais_shape(shared: Shared) -> None:
    reply = _embed(shared, model="gamma")
    assert reply.status_code == 404
    error = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "model_not_found",
        "model",
    )
    assert "'gamma' does not exist" in error["message"]
    assert "'alpha', 'beta'" in error["message"]
    # Every route routes the same way.
    rerank = httpx.post(
        shared.url + "/v1/rerank", json={"model": "gamma", "query": "q", "documents": ["d"]}
    )
    assert rerank.status_code == 404
    assert rerank.json()["error"]["code"] == "model_not_found"


def test_a_request_without_a_model_is_400_naming_the_models(shared: Shared) -> None:
    reply = _embed(shared)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "model"
    assert "'alpha', 'beta'" in error["message"]


def test_metrics_carry_the_served_model_only(shared: Shared) -> None:
    before = httpx.get(shared.url + "/metrics").text
    assert _embed(shared, model="beta").status_code == 200
    assert _embed(shared, model="nope-" + "x" * 40).status_code == 404
    text = httpx.get(shared.url + "/metrics").text

    def grew(name: str, **labels: str) -> float:
        return metric_value(text, name, **labels) - metric_value(before, name, **labels)

    route = "/v1/embeddings"
    requests = "embedfleet_gateway_requests_total"
    assert grew(requests, route=route, code="200", model="beta") == 1
    assert grew(requests, route=route, code="200", model="alpha") == 0
    # A name nobody serves is counted without it: the label's values are the served names.
    assert grew(requests, route=route, code="404", model="") == 1
    assert "nope-" not in text
    assert grew("embedfleet_gateway_input_tokens_total", model="beta") > 0
    assert grew("embedfleet_gateway_input_tokens_total", model="alpha") == 0
    assert metric_value(text, "embedfleet_gateway_workers", state="ready", model="alpha") == 2
    assert metric_value(text, "embedfleet_gateway_workers", state="ready", model="beta") == 1


def test_one_fleet_down_leaves_the_other_served(shared: Shared) -> None:
    for n in ALPHA:
        shared.workers[n].ready = False
    try:
        shared.wait_ready("alpha unready", 0, 1)
        reply = _embed(shared, model="alpha")
        # Alpha holds nothing (hold_requests is per model): 503 at once.
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["code"] == "no_workers"
        assert _embed(shared, model="beta").status_code == 200
        # Beta still answers, so the gateway stays in its Service.
        assert httpx.get(shared.url + "/ready").status_code == 200
    finally:
        for n in ALPHA:
            shared.workers[n].ready = True
        shared.wait_ready("alpha back", 2, 1)


def test_a_model_that_holds_keeps_its_requests_until_a_worker_is_ready(shared: Shared) -> None:
    """Beta's own hold_requests: its request waits (counted under its name) instead of a 503,
    and is answered once its worker is ready again."""
    (worker,) = (shared.workers[n] for n in BETA)
    worker.ready = False
    replies: list[httpx.Response] = []
    try:
        shared.wait_ready("beta unready", 2, 0)
        sender = threading.Thread(target=lambda: replies.append(_embed(shared, model="beta")))
        sender.start()

        def held() -> float:
            text = httpx.get(shared.url + "/metrics").text
            return metric_value(text, "embedfleet_gateway_held_requests", model="beta")

        wait_until("beta holds the request", lambda: held() == 1)
        text = httpx.get(shared.url + "/metrics").text
        assert metric_value(text, "embedfleet_gateway_held_requests", model="alpha") == 0
    finally:
        worker.ready = True
    sender.join(timeout=20)
    assert [r.status_code for r in replies] == [200], [r.text for r in replies]
    shared.wait_ready("beta back", 2, 1)
