"""A shared gateway: one endpoint in front of several fleets, routed by the request's `model`.

The real app under uvicorn with a models file naming two fleets of FAKE workers (their
"embedding" ends with the worker's number, so each reply shows which fleet answered).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from embedfleet.common.modeldir import ModelDir, default_model_path
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.testing.workers import metric_value

from .fakes import FakeWorker
from .helpers import GatewayThread, wait_until

#: fleet "alpha" is workers 1 and 2; fleet "beta" is worker 7
ALPHA, BETA = (1, 2), (7,)


@dataclass
class Shared:
    gw: GatewayThread
    workers: dict[int, FakeWorker]


@pytest.fixture(scope="module")
def shared(minilm: ModelDir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
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
    path = Path(tmp_path_factory.mktemp("shared")) / "models.json"
    path.write_bytes(orjson.dumps(models))
    gw = GatewayThread(GatewaySettings(models_file=str(path), probe_seconds=0.1), minilm).start()
    try:
        wait_until(
            "both fleets ready",
            lambda: [len(m.balancer.usable()) for m in gw.app.served] == [2, 1],
        )
        yield Shared(gw, workers)
    finally:
        gw.stop()
        for w in workers.values():
            w.stop()


def _embed(gw: GatewayThread, **body: object) -> httpx.Response:
    return httpx.post(gw.url + "/v1/embeddings", json={"input": ["a b", "c"], **body}, timeout=30)


def test_each_model_is_served_by_its_own_fleet(shared: Shared) -> None:
    for model, fleet in (("alpha", ALPHA), ("beta", BETA), ("alpha", ALPHA)):
        reply = _embed(shared.gw, model=model)
        assert reply.status_code == 200, reply.text
        doc = reply.json()
        assert doc["model"] == model
        # [first id, last id, length, worker number]: the worker is one of that fleet's.
        assert {int(d["embedding"][3]) for d in doc["data"]} <= set(fleet)
        assert doc["usage"]["prompt_tokens"] > 0


def test_models_lists_every_served_model(shared: Shared) -> None:
    doc = httpx.get(shared.gw.url + "/v1/models").json()
    assert doc["object"] == "list"
    assert [m["id"] for m in doc["data"]] == ["alpha", "beta"]
    assert {m["object"] for m in doc["data"]} == {"model"}


def test_an_unknown_model_is_404_in_openais_shape(shared: Shared) -> None:
    reply = _embed(shared.gw, model="gamma")
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
        shared.gw.url + "/v1/rerank", json={"model": "gamma", "query": "q", "documents": ["d"]}
    )
    assert rerank.status_code == 404
    assert rerank.json()["error"]["code"] == "model_not_found"


def test_a_request_without_a_model_is_400_naming_the_models(shared: Shared) -> None:
    reply = _embed(shared.gw)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "model"
    assert "'alpha', 'beta'" in error["message"]


def test_metrics_carry_the_served_model_only(shared: Shared) -> None:
    before = httpx.get(shared.gw.url + "/metrics").text
    assert _embed(shared.gw, model="beta").status_code == 200
    assert _embed(shared.gw, model="nope-" + "x" * 40).status_code == 404
    text = httpx.get(shared.gw.url + "/metrics").text

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
    alpha, beta = shared.gw.app.by_name["alpha"], shared.gw.app.by_name["beta"]
    for n in ALPHA:
        shared.workers[n].ready = False
    try:
        wait_until("alpha unready", lambda: not alpha.balancer.usable())
        reply = _embed(shared.gw, model="alpha")
        # Alpha holds nothing (hold_requests is per model): 503 at once.
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["code"] == "no_workers"
        assert _embed(shared.gw, model="beta").status_code == 200
        # Beta still answers, so the gateway stays in its Service.
        assert httpx.get(shared.gw.url + "/ready").status_code == 200
    finally:
        for n in ALPHA:
            shared.workers[n].ready = True
        wait_until("alpha back", lambda: len(alpha.balancer.usable()) == 2)
    assert beta.settings.hold_requests == 8
    assert alpha.settings.hold_requests == 0
