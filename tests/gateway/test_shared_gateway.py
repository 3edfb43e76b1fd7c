"""A shared gateway: one endpoint in front of several fleets, routed by the request's `model`
(--models-file), each fleet FAKE workers (fakes.py) whose rows end with the worker's number, so
each reply shows which fleet answered; readiness read from /metrics, as dashboards read it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from embedfleet.common.modeldir import default_model_path

from .fakes import FakeWorker
from .helpers import Gateway, sample, serving, wait_until

#: fleet "alpha" is workers 1 and 2; fleet "beta" is worker 7
ALPHA, BETA = (1, 2), (7,)


@dataclass
class Shared:
    gateway: Gateway
    workers: dict[int, FakeWorker]

    @property
    def url(self) -> str:
        return self.gateway.url

    def ready_workers(self, model: str) -> float:
        return self.gateway.value("embedfleet_gateway_workers", state="ready", model=model)

    def wait_ready(self, what: str, alpha: int, beta: int) -> None:
        wait_until(
            what, lambda: [self.ready_workers(m) for m in ("alpha", "beta")] == [alpha, beta]
        )


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
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
        settings = {"models_file": path, "probe_seconds": 0.1}
        gateway = stack.enter_context(serving(settings, tmp / "gateway.log", ready=0))
        served = Shared(gateway, workers)
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
    before = shared.gateway.metrics()
    assert _embed(shared, model="beta").status_code == 200
    assert _embed(shared, model="nope-" + "x" * 40).status_code == 404
    text = shared.gateway.metrics()

    def grew(name: str, **labels: str) -> float:
        return sample(text, name, **labels) - sample(before, name, **labels)

    route = "/v1/embeddings"
    requests = "embedfleet_gateway_requests_total"
    assert grew(requests, route=route, code="200", model="beta") == 1
    assert grew(requests, route=route, code="200", model="alpha") == 0
    # A name nobody serves is counted without it: the label's values are the served names.
    assert grew(requests, route=route, code="404", model="") == 1
    assert "nope-" not in text
    assert grew("embedfleet_gateway_input_tokens_total", model="beta") > 0
    assert grew("embedfleet_gateway_input_tokens_total", model="alpha") == 0
    assert sample(text, "embedfleet_gateway_workers", state="ready", model="alpha") == 2
    assert sample(text, "embedfleet_gateway_workers", state="ready", model="beta") == 1


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

        def held(model: str) -> float:
            return shared.gateway.value("embedfleet_gateway_held_requests", model=model)

        wait_until("beta holds the request", lambda: held("beta") == 1)
        assert held("alpha") == 0
    finally:
        worker.ready = True
    sender.join(timeout=20)
    assert [r.status_code for r in replies] == [200], [r.text for r in replies]
    shared.wait_ready("beta back", 2, 1)
