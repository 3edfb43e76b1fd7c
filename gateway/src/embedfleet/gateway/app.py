"""The HTTP layer: a plain ASGI application (no framework; see docs/gateway.md for why).

It reads and caps the body, parses JSON with orjson, validates with pydantic, hands the request to
the Service, and writes orjson bytes. While a request runs, a watcher waits for the client's
disconnect and cancels the request's task, which cancels its chunks on the workers.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from embedfleet.common.modeldir import ModelDir
from embedfleet.common.tracing import NULL_SPAN
from embedfleet.gateway import errors, openapi, tracing
from embedfleet.gateway.admission import Admission, current_ticket
from embedfleet.gateway.auth import KeyFile, bearer
from embedfleet.gateway.catalog import Catalog, parse_models
from embedfleet.gateway.connection import PEER, Peer
from embedfleet.gateway.discovery import Discovery
from embedfleet.gateway.metrics import Metrics
from embedfleet.gateway.pool import WorkerPool
from embedfleet.gateway.served import Handler, ServedModel
from embedfleet.gateway.service import Service
from embedfleet.gateway.settings import GatewaySettings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger(__name__)

CLIENT_GONE = 499  # nginx's "client closed request", for metrics: nobody reads this response
_JSON = (b"content-type", b"application/json")
_OPTS = orjson.OPT_SERIALIZE_NUMPY
#: the served name of the model a request went to, for its request metrics ("" until routed)
_SERVED: contextvars.ContextVar[str] = contextvars.ContextVar("served", default="")
#: the POST routes, each served by every model (ServedModel.posts)
_POSTS = frozenset(
    {"/v1/embeddings", "/v1/rerank", "/v1/score", "/v1/classify", "/v1/sparse_embeddings"}
)

# What a wrong-typed top-level field should have been; pydantic's union errors are unreadable.
_EXPECTED = {
    "input": "a non-empty string, an array of strings, an array of token ids (integers) or an "
    "array of arrays of token ids",
    "documents": 'an array of strings or of {"text": string} objects',
    "text_1": "a string or an array of strings",
    "text_2": "a string or an array of strings",
    "query": "a string",
}


def validation_message(exc: ValidationError) -> errors.ApiError:
    first = exc.errors()[0]
    loc = first.get("loc", ())
    param = str(loc[0]) if loc else None
    if first.get("type") == "missing":
        return errors.invalid(f"'{param}' is required.", param=param)
    if param in _EXPECTED:
        return errors.invalid(f"'{param}' must be {_EXPECTED[param]}.", param=param)
    where = ".".join(str(p) for p in loc)
    return errors.invalid(f"'{where}': {first.get('msg', 'invalid value')}.", param=param)


def is_json(content_type: bytes) -> bool:
    """application/json or a +json type, any parameters; a body without a type is read as JSON."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (
        media.startswith(b"application/") and media.endswith(b"+json")
    )


def parse(body: bytes, model: type[BaseModel]) -> Any:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise errors.invalid(f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(doc, dict):
        raise errors.invalid("The request body must be a JSON object.")
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise validation_message(exc) from None


class ClientGoneError(Exception):
    """The client disconnected before its request was answered."""


class Gateway:
    """The ASGI app. Worker discovery starts with the ASGI lifespan (or `start()` in tests).

    One model (`settings`, or `model` given), or every model of `settings.models_file`; the
    single-model attributes (`model`, `balancer`, `pool`, `service`, ...) are the first model's.
    """

    def __init__(self, settings: GatewaySettings, model: ModelDir | None = None) -> None:
        self.settings = settings
        if settings.models_file:
            with open(settings.models_file) as f:
                self.served = [ServedModel(each) for each in parse_models(f.read(), settings)]
        else:
            self.served = [ServedModel(settings, model)]
        self.catalog = Catalog.of([m.name for m in self.served])
        self.by_name = {m.name: m for m in self.served}
        first = self.served[0]
        self.model = first.model
        self.max_tokens = first.max_tokens
        self.balancer = first.balancer
        self.tokenization = first.tokenization
        self.calibration = first.calibration
        several = len(self.served) > 1 or bool(settings.models_file)
        self.metrics = Metrics(
            lambda: self.balancer,
            (lambda: {m.name: m.balancer for m in self.served}) if several else None,
        )
        self.keys = (
            KeyFile(Path(settings.api_keys_file), settings.api_keys_reload_seconds)
            if settings.api_keys_file
            else None
        )
        self.tracer = tracing.from_settings(settings)
        self.pool: WorkerPool | None = None
        self.admission: Admission | None = None
        self.service: Service | None = None
        self.discovery: Discovery | None = None
        self._openapi = orjson.dumps(openapi.document(openapi.VERSION, auth=self.keys is not None))
        self._posts: dict[str, Handler] = {}
        #: (route, status, served model) -> its request count and duration children, resolved
        #: once: `labels()` per request took a lock and built a key each time (few series: the
        #: routes, the status codes, the served names)
        self._children: dict[tuple[str, int, str], tuple[Any, Any]] = {}

    async def start(self) -> None:
        for served in self.served:
            await served.start(self.metrics.for_model(served.name), self.tracer)
        first = self.served[0]
        self.pool, self.admission, self.service = first.pool, first.admission, first.service
        self.discovery = first.discovery
        self._posts = first.posts
        if self.keys is not None:
            self.keys.start()

    async def stop(self) -> None:
        if self.keys is not None:
            await self.keys.stop()
        for served in self.served:
            await served.stop()
        self.tracer.shutdown()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # --- HTTP ------------------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        start = time.perf_counter()
        route = path if path in _POSTS or path in _GETS else "other"
        routed = _SERVED.set("")
        self.metrics.inflight.inc()
        status = 500
        try:
            # Only the API routes are traced: probes and scrapes of /ready and /metrics are not.
            traced = self.tracer.enabled and route in _POSTS
            with (
                self.tracer.server_span(f"{method} {route}", scope["headers"])
                if traced
                else NULL_SPAN
            ) as span:
                status = await self._route(route, method, scope, receive, send)
                span.set_attribute("http.response.status_code", status)
        finally:
            self.metrics.inflight.dec()
            served = _SERVED.get()
            _SERVED.reset(routed)
            children = self._children.get((route, status, served))
            if children is None:
                children = self._request_children(route, status, served)
            children[0].inc()
            children[1].observe(time.perf_counter() - start)

    def _request_children(self, route: str, status: int, served: str) -> tuple[Any, Any]:
        model = self.metrics.model_labels(served)
        children = (
            self.metrics.requests.labels(route, str(status), *model),
            self.metrics.request_seconds.labels(route, *model),
        )
        self._children[(route, status, served)] = children
        return children

    async def _route(
        self, route: str, method: str, scope: Scope, receive: Receive, send: Send
    ) -> int:
        try:
            if self.keys is not None and scope["path"].startswith("/v1/"):
                self._authorize(route, scope)
            if route in _POSTS:
                if method != "POST":
                    raise errors.not_allowed(f"Use POST for {route}.", b"POST")
                return await self._post(route, scope, receive, send)
            if route in _GETS:
                if method not in ("GET", "HEAD"):
                    raise errors.not_allowed(f"Use GET for {route}.", b"GET, HEAD")
                return await self._get(route, send)
            raise errors.not_found(f"No route {scope['path']}.", code="not_found")
        except errors.ApiError as exc:
            await _respond(send, exc.status, exc.body(), exc.headers)
            return exc.status
        except ClientGoneError:
            self.metrics.cancelled.inc()
            return CLIENT_GONE

    def _authorize(self, route: str, scope: Scope) -> None:
        """401 unless the request carries a current API key; counts it per key when asked."""
        assert self.keys is not None
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        label = self.keys.keys.check(bearer(header))
        if label is None:
            raise errors.unauthorized(header is not None)
        if self.settings.api_key_metrics:
            self.metrics.key_requests.labels(label, route).inc()

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.settings.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise errors.too_large(f"The request body is over the limit of {limit} bytes.")
            if name == b"content-type" and not is_json(value):
                raise errors.ApiError(
                    415,
                    "The request body must be JSON (Content-Type: application/json).",
                    code="unsupported_media_type",
                )
        peer: Peer | None = scope.get("extensions", {}).get(PEER)
        if peer is not None and peer.body_in:
            return await self._receive_body(receive, limit)  # nothing to wait for: no deadline
        try:
            async with asyncio.timeout(self.settings.body_timeout_seconds):
                return await self._receive_body(receive, limit)
        except TimeoutError:
            raise errors.ApiError(
                408,
                "The request body did not arrive in time.",
                code="request_timeout",
                headers=((b"connection", b"close"),),
            ) from None

    async def _receive_body(self, receive: Receive, limit: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGoneError
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise errors.too_large(f"The request body is over the limit of {limit} bytes.")
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    async def _post(self, route: str, scope: Scope, receive: Receive, send: Send) -> int:
        started = time.perf_counter_ns()
        body = await self._read_body(scope, receive)
        if not self._posts:
            raise errors.unavailable("Starting up.")
        schema, _ = self._posts[route]  # every model's requests share the schemas
        request = parse(body, schema)
        self.metrics.parse_stage.observe((time.perf_counter_ns() - started) * 1e-9)
        served = self.by_name[self.catalog.pick(request.model)]
        _SERVED.set(served.name)
        _, handler = served.posts[route]
        assert served.admission is not None  # set with the routes
        ticket = served.admission.admit(request)
        # The service corrects the ticket once it tokenized (admission.tokenized).
        token = current_ticket.set(ticket)
        try:
            answered, doc = await _unless_gone(handler(request), receive, scope)
            if not answered:
                self.metrics.cancelled.inc()
                return CLIENT_GONE
            ticket.answered = True
        except errors.ApiError:
            raise
        except Exception:
            log.exception("request failed", extra={"route": route})
            raise errors.internal() from None
        finally:
            current_ticket.reset(token)
            ticket.release()
        started = time.perf_counter_ns()
        await _respond(send, 200, orjson.dumps(doc, option=_OPTS))
        self.metrics.respond_stage.observe((time.perf_counter_ns() - started) * 1e-9)
        return 200

    async def _get(self, route: str, send: Send) -> int:
        if route == "/health":
            await _respond(send, 200, b'{"status":"ok"}')
        elif route == "/ready":
            # Holding requests (scale from zero), the gateway is ready without a ready worker.
            # With several models: while any of them can answer.
            ready = any(served.ready() for served in self.served)
            status = 200 if ready else 503
            await _respond(send, status, b'{"ready":true}' if ready else b'{"ready":false}')
            return status
        elif route == "/metrics":
            body = generate_latest(self.metrics.registry)
            await _respond(send, 200, body, content_type=CONTENT_TYPE_LATEST.encode())
        elif route == "/openapi.json":
            await _respond(send, 200, self._openapi)
        elif route == "/v1/models":
            if self.service is None:
                raise errors.unavailable("Starting up.")
            models = [m.service.models()["data"] for m in self.served if m.service is not None]
            doc = {"object": "list", "data": [entry for each in models for entry in each]}
            await _respond(send, 200, orjson.dumps(doc))
        return 200


_GETS = frozenset({"/health", "/ready", "/metrics", "/openapi.json", "/v1/models"})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(
    work: Awaitable[Any], receive: Receive, scope: Scope | None = None
) -> tuple[bool, Any]:
    """(True, `work`'s result), or (False, None) once the client disconnected, which cancels
    `work`. It runs in this (the request's) task. Behind the gateway's own server
    (connection.py) the connection's `Peer` signal cancels it, with no task at all; under
    any other ASGI server a watcher task awaits `receive()` for the disconnect (docs/benchmarks,
    "Gateway CPU")."""
    task = asyncio.current_task()
    assert task is not None
    signal: Peer | None = scope.get("extensions", {}).get(PEER) if scope is not None else None
    gone = False

    def cancel() -> None:
        nonlocal gone
        gone = True
        task.cancel()

    watcher: asyncio.Future[None] | None = None
    if signal is not None:
        if signal.gone:
            close = getattr(work, "close", None)
            if close is not None:
                close()  # never started: nothing to cancel
            return False, None
        signal.callback = cancel
    else:

        async def watch() -> None:
            await _disconnected(receive)
            cancel()

        watcher = asyncio.ensure_future(watch())
    try:
        result = await work
    except BaseException:
        if not gone:
            raise
        result = None  # whatever the cancel turned into on its way out is dropped
    finally:
        if signal is not None:
            signal.callback = None
        if watcher is not None:
            watcher.cancel()
    if gone:
        if task.cancelling():
            task.uncancel()  # the disconnect's cancel, taken back: this task answers 499
        return False, None
    return True, result


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    headers: tuple[tuple[bytes, bytes], ...] = (),
    content_type: bytes = b"application/json",
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
