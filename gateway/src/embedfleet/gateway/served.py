"""One model a gateway serves: its tokenizer, its workers and the parts that run its requests.

A one-model gateway has one; a shared gateway (`--models-file`, catalog.py) has one per model,
each with its own discovery, balancer, admission and hold, so that one model's saturation or
scale-to-zero never sheds or holds another's requests.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from embedfleet.common.modeldir import (
    DEFAULT_MODEL_NAME,
    ModelDir,
    load_model_dir,
    resolve_model_path,
)
from embedfleet.common.tracing import OFF, Tracer
from embedfleet.gateway import tracing
from embedfleet.gateway.admission import Admission
from embedfleet.gateway.balancer import Balancer
from embedfleet.gateway.client import Coalescing, WorkerClient
from embedfleet.gateway.discovery import Discovery
from embedfleet.gateway.dispatcher import Dispatcher
from embedfleet.gateway.hold import Hold
from embedfleet.gateway.metrics import Metrics
from embedfleet.gateway.pool import WorkerPool
from embedfleet.gateway.quantization import find_calibration
from embedfleet.gateway.schemas import (
    ClassifyRequest,
    EmbeddingRequest,
    RerankRequest,
    ScoreRequest,
    SparseEmbeddingRequest,
)
from embedfleet.gateway.service import Service
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.gateway.tokenization import Tokenization

Handler = tuple[type[BaseModel], Callable[[Any], Awaitable[Any]]]


class ServedModel:
    """Loads the model directory at once; the workers are found from `start()` on."""

    def __init__(self, settings: GatewaySettings, model: ModelDir | None = None) -> None:
        self.settings = settings
        self.model = model or load_model_dir(resolve_model_path(settings.model), settings.task)
        self.name = settings.served_model_name or self.model.name
        self.max_tokens = self.model.max_input_tokens(settings.max_input_tokens or None)
        self.balancer = Balancer(settings.eject_seconds)
        self.tokenization = Tokenization(
            self.model,
            self.max_tokens,
            settings.tokenize_threads,
            settings.tokenize_inline_chars,
            settings.tokenize_large_chars,
        )
        self.calibration = find_calibration(
            settings.quantization_file,
            self.model.path,
            bundled=self.model.name == DEFAULT_MODEL_NAME,
        )
        self.pool: WorkerPool | None = None
        self.admission: Admission | None = None
        self.service: Service | None = None
        self.discovery: Discovery | None = None
        self.posts: dict[str, Handler] = {}

    async def start(self, metrics: Metrics, tracer: Tracer = OFF) -> None:
        """Starts finding and probing the workers; `metrics` as this model's parts see them."""
        s = self.settings
        coalescing = Coalescing(
            s.coalesce_inflight, s.chunk_tokens, s.chunk_sequences, s.min_chunk_tokens
        )
        connect = functools.partial(_connect, tracer, coalescing)
        self.pool = WorkerPool(self.balancer, s.probe_seconds, connect)
        dispatcher = Dispatcher(self.pool, metrics, s.retry_after_seconds, tracer)
        self.service = Service(
            s,
            self.model,
            self.tokenization,
            self.pool,
            dispatcher,
            metrics,
            self.calibration,
            hold=Hold(self.pool, metrics, s.hold_requests, s.hold_seconds, s.retry_after_seconds),
            tracer=tracer,
        )
        self.posts = {
            "/v1/embeddings": (EmbeddingRequest, self.service.embeddings),
            "/v1/rerank": (RerankRequest, self.service.rerank),
            "/v1/score": (ScoreRequest, self.service.score),
            "/v1/classify": (ClassifyRequest, self.service.classify),
            "/v1/sparse_embeddings": (SparseEmbeddingRequest, self.service.sparse_embeddings),
        }
        self.admission = Admission(
            self.model,
            self.max_tokens,
            s.max_queue_seconds,
            s.retry_after_seconds,
            queued_elsewhere=self.pool.queued_elsewhere,
            capacity=self.pool.capacity,
            on_shed=metrics.shed.inc,
        )
        admission = self.admission
        metrics.queued_seconds.set_function(admission.queued_seconds)
        metrics.delivered_ratio.set_function(lambda: admission.delivered)
        self.discovery = Discovery(s, self.pool.update)
        await self.discovery.start()

    def ready(self) -> bool:
        """A worker is ready, or requests are held until one is (scale from zero)."""
        return self.service is not None and (
            self.service.hold.keeps_ready or self.service.pool.ready()
        )

    async def stop(self) -> None:
        if self.discovery:
            await self.discovery.stop()
        if self.pool:
            await self.pool.close()
        self.tokenization.close()


def _connect(tracer: Tracer, coalescing: Coalescing, address: str) -> WorkerClient:
    return WorkerClient(address, tracing.client_interceptors(tracer, address), coalescing)
