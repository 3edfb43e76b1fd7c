"""The HTTP contract the docs and /openapi.json promise, checked against the real app in front of
FAKE workers (fakes.py): strict types, JSON bodies only, 405 with Allow, a flat token-id list as
one input, and a document that states the rules the server enforces."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from embedfleet.gateway import openapi

from .helpers import GatewayThread


@pytest.fixture(scope="module")
def gateway(fake_fleet_gateway: GatewayThread) -> GatewayThread:
    return fake_fleet_gateway


def _post(gw: GatewayThread, path: str, body: object) -> httpx.Response:
    return httpx.post(gw.url + path, json=body, timeout=30)


def _error(reply: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_flat_token_list_over_the_batch_cap_is_one_input(gateway: GatewayThread) -> None:
    ids = [7] * 3000  # more than max_client_batch (2048) ids, and than MiniLM's 256 tokens
    cut = _post(gateway, "/v1/embeddings", {"input": ids, "truncate": True})
    assert cut.status_code == 200, cut.text
    assert len(cut.json()["data"]) == 1
    assert cut.json()["usage"]["prompt_tokens"] == 256
    refused = _post(gateway, "/v1/embeddings", {"input": ids})
    assert refused.status_code == 400, refused.text
    assert _error(refused)["code"] == "context_length_exceeded"
    # A list of lists still counts its items.
    many = _post(gateway, "/v1/embeddings", {"input": [[7]] * 2049})
    assert many.status_code == 413


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/embeddings", {"input": "x", "truncate": "yes"}, "truncate"),
        ("/v1/embeddings", {"input": "x", "truncate": 1}, "truncate"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "return_documents": "yes"}, None),
        ("/v1/score", {"text_1": "a", "text_2": "b", "truncate": "true"}, "truncate"),
    ],
)
def test_booleans_are_strict(
    gateway: GatewayThread, path: str, body: dict[str, object], param: str | None
) -> None:
    reply = _post(gateway, path, body)
    assert reply.status_code == 400, reply.text
    error = _error(reply)
    assert error["param"] == (param or "return_documents")


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
        ("text/json", 415),
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("Application/JSON", 200),
    ],
)
def test_a_body_that_is_not_json_is_refused(
    gateway: GatewayThread, content_type: str, status: int
) -> None:
    reply = httpx.post(
        gateway.url + "/v1/embeddings",
        content=b'{"input": "x"}',
        headers={"content-type": content_type},
        timeout=30,
    )
    assert reply.status_code == status, reply.text
    if status == 415:
        assert _error(reply)["code"] == "unsupported_media_type"


def test_wrong_method_names_the_allowed_ones(gateway: GatewayThread) -> None:
    get = httpx.get(gateway.url + "/v1/embeddings", timeout=30)
    assert get.status_code == 405
    assert get.headers["allow"] == "POST"
    assert _error(get)["code"] == "method_not_allowed"
    post = httpx.post(gateway.url + "/v1/models", timeout=30)
    assert post.status_code == 405
    assert post.headers["allow"] == "GET, HEAD"


def test_openapi_states_the_non_empty_rules_and_every_status() -> None:
    doc = openapi.document("test")
    schemas = doc["components"]["schemas"]
    branches = schemas["EmbeddingRequest"]["properties"]["input"]["anyOf"]
    text, texts, ids, lists = branches
    assert text == {"type": "string", "minLength": 1}
    assert texts["minItems"] == 1
    assert texts["items"]["minLength"] == 1
    assert ids["minItems"] == 1
    assert ids["items"] == {"type": "integer", "minimum": 0}
    assert lists["minItems"] == 1
    assert lists["items"]["minItems"] == 1
    rerank = schemas["RerankRequest"]["properties"]
    assert rerank["query"]["minLength"] == 1
    assert rerank["documents"]["minItems"] == 1
    assert schemas["Document"]["properties"]["text"]["minLength"] == 1
    for side in ("text_1", "text_2"):
        one, many = schemas["ScoreRequest"]["properties"][side]["anyOf"]
        assert one["minLength"] == 1
        assert many["minItems"] == 1
    assert schemas["EmbeddingRequest"]["properties"]["truncate"]["type"] == "boolean"
    for path in ("/v1/embeddings", "/v1/rerank", "/v1/score"):
        responses = doc["paths"][path]["post"]["responses"]
        assert {"200", "400", "404", "405", "408", "413", "415", "429", "502", "503", "504"} <= set(
            responses
        )
        assert "Allow" in responses["405"]["headers"]
        assert "Retry-After" in responses["429"]["headers"]
    assert "405" in doc["paths"]["/v1/models"]["get"]["responses"]
