"""`embedfleet serve` with several models: one gateway, each model on workers of its own (null
engine workers, as in test_serve.py), routed by the request's `model`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from embedfleet.common.modeldir import default_model_path
from embedfleet.common.net import free_ports
from embedfleet.gateway.fleet import served_model
from embedfleet.testing.workers import metric_value

from .test_serve import _children, _stop, _url


def test_served_model_reads_name_equals_path() -> None:
    assert served_model("a=/m/x") == ("a", "/m/x")
    assert served_model("/m/x") == ("", "/m/x")
    assert served_model("/m/a=b") == ("", "/m/a=b")


def test_serve_routes_each_model_to_its_own_workers() -> None:
    (port,) = free_ports(1)
    path = str(default_model_path())
    script = Path(sys.executable).parent / "embedfleet"
    env = {
        **os.environ,
        "EMBEDFLEET_WORKER_ENGINE": "null",
        "EMBEDFLEET_WORKER_WARMUP_SECONDS": "0.2",
    }
    argv = [str(script), "serve", "--workers", "1", "--port", str(port)]
    argv += ["--model", f"alpha={path}", "--model", f"beta={path}"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True
    )
    try:
        url = _url(proc)
        assert len(_children(proc.pid)) == 3  # a worker per model and the gateway
        models = httpx.get(url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["alpha", "beta"]
        for model in ("alpha", "beta", "beta"):
            reply = httpx.post(
                url + "/v1/embeddings", json={"model": model, "input": ["a", "b c"]}, timeout=30
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["model"] == model
        text = httpx.get(url + "/metrics", timeout=10).text
        requests = "embedfleet_gateway_requests_total"
        route = "/v1/embeddings"
        assert metric_value(text, requests, route=route, code="200", model="alpha") == 1
        assert metric_value(text, requests, route=route, code="200", model="beta") == 2
        unknown = httpx.post(url + "/v1/embeddings", json={"model": "gamma", "input": "a"})
        assert unknown.status_code == 404
        assert re.search(r"'alpha', 'beta'", unknown.json()["error"]["message"])
    finally:
        _stop(proc)
