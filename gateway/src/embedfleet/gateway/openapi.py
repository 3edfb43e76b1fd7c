"""The OpenAPI 3.1 document, generated from the pydantic models in schemas.py."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from embedfleet.gateway import schemas

#: the API's version, as the document states it
VERSION = "0.1.0"
_REF = "#/components/schemas/{model}"


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(model)}}


_ERROR = {"content": _json(schemas.ErrorResponse)}


def _not_allowed(allow: str) -> dict[str, Any]:
    return {
        "description": "Wrong method for this route",
        "headers": {
            "Allow": {"description": f"The allowed methods: {allow}.", "schema": {"type": "string"}}
        },
        **_ERROR,
    }


def _post(summary: str, request: type[BaseModel], response: type[BaseModel]) -> dict[str, Any]:
    retry_after = {
        "Retry-After": {"description": "Seconds to wait.", "schema": {"type": "integer"}}
    }
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": _json(request)},
            "responses": {
                "200": {"description": "OK", "content": _json(response)},
                "400": {"description": "Invalid request", **_ERROR},
                "404": {"description": "Unknown model", **_ERROR},
                "405": _not_allowed("POST"),
                "408": {"description": "Headers or body too slow to arrive", **_ERROR},
                "413": {"description": "Request over a configured cap", **_ERROR},
                "415": {"description": "The body is not application/json", **_ERROR},
                "429": {
                    "description": "More work queued than the gateway takes (see Retry-After)",
                    "headers": retry_after,
                    **_ERROR,
                },
                "502": {"description": "A worker failed and a retry could not help", **_ERROR},
                "503": {"description": "No ready worker", **_ERROR},
                "504": {"description": "A worker did not answer in time", **_ERROR},
            },
        }
    }


def _get(
    summary: str, content: dict[str, Any] | None = None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "OK"}
    if content:
        ok["content"] = content
    responses = {"200": ok, "405": _not_allowed("GET, HEAD"), **(extra or {})}
    return {"get": {"summary": summary, "responses": responses}}


_UNAUTHORIZED = {
    "description": "Missing or wrong API key (only when the gateway has keys)",
    "headers": {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    **_ERROR,
}


def _secured(paths: dict[str, Any]) -> dict[str, Any]:
    """/v1/* operations need a bearer key: declared, with their 401."""
    for path, item in paths.items():
        if path.startswith("/v1/"):
            for operation in item.values():
                operation["security"] = [{"apiKey": []}]
                operation["responses"]["401"] = _UNAUTHORIZED
    return paths


def document(version: str, auth: bool = False) -> dict[str, Any]:
    """The document; with `auth` (the gateway has API keys) /v1/* declares its bearer key."""
    models: list[type[BaseModel]] = [
        schemas.EmbeddingRequest,
        schemas.EmbeddingResponse,
        schemas.RerankRequest,
        schemas.RerankResponse,
        schemas.Document,
        schemas.ScoreRequest,
        schemas.ScoreResponse,
        schemas.ClassifyRequest,
        schemas.ClassifyResponse,
        schemas.SparseEmbeddingRequest,
        schemas.SparseEmbeddingResponse,
        schemas.ModelList,
        schemas.ErrorResponse,
    ]
    _, defs = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    paths = {
        "/v1/embeddings": _post(
            "Embed texts or token ids (OpenAI-compatible).",
            schemas.EmbeddingRequest,
            schemas.EmbeddingResponse,
        ),
        "/v1/rerank": _post(
            "Rank documents against a query (Cohere/Jina-compatible).",
            schemas.RerankRequest,
            schemas.RerankResponse,
        ),
        "/v1/score": _post("Score text pairs.", schemas.ScoreRequest, schemas.ScoreResponse),
        "/v1/classify": _post(
            "Classify texts with a sequence-classification model (labels from its config).",
            schemas.ClassifyRequest,
            schemas.ClassifyResponse,
        ),
        "/v1/sparse_embeddings": _post(
            "SPLADE sparse embeddings of texts or token ids, as {indices, values}.",
            schemas.SparseEmbeddingRequest,
            schemas.SparseEmbeddingResponse,
        ),
        "/v1/models": _get(
            "The served model.",
            _json(schemas.ModelList),
            {"503": {"description": "Starting up", **_ERROR}},
        ),
        "/health": _get("The gateway process is up."),
        "/ready": _get(
            "At least one worker is ready (503 otherwise).",
            extra={"503": {"description": "No ready worker"}},
        ),
        "/openapi.json": _get("This document."),
        "/metrics": _get("Prometheus metrics."),
    }
    components: dict[str, Any] = {"schemas": defs.get("$defs", {})}
    if auth:
        components["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
        paths = _secured(paths)
    return {
        "openapi": "3.1.0",
        "info": {"title": "embedfleet gateway", "version": version},
        "paths": paths,
        "components": components,
    }


#: the files the Rust gateway serves as its /openapi.json (gateway-rs/openapi/), by `auth`
RUST_COPIES = {False: "open.json", True: "auth.json"}


def main(argv: list[str] | None = None) -> int:
    """`python -m embedfleet.gateway.openapi DIR`: writes the document, as the gateway sends it
    with and without API keys, into DIR for the Rust gateway to compile in (tests/gateway_rs
    compares what both gateways serve, so a stale copy fails there)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    for auth, name in RUST_COPIES.items():
        (args.dir / name).write_bytes(orjson.dumps(document(VERSION, auth=auth)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
