"""What each endpoint does, from a validated request to a response document (no HTTP here)."""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import pack_tokens
from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway import errors
from embedfleet.gateway.dispatcher import Dispatcher
from embedfleet.gateway.hold import Hold
from embedfleet.gateway.metrics import Metrics
from embedfleet.gateway.pool import Worker, WorkerPool
from embedfleet.gateway.schemas import (
    Document,
    EmbeddingRequest,
    RerankRequest,
    ScoreRequest,
    TruncationSide,
)
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.gateway.splitting import Chunk, chunk_budget, join, plan
from embedfleet.gateway.tokenization import Batch, Tokenization


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def _check_texts(texts: Sequence[str], param: str) -> None:
    for i, text in enumerate(texts):
        if not text:
            raise errors.invalid(f"'{param}' item {i} is an empty string.", param=param)


def score_pairs(text_1: str | list[str], text_2: str | list[str]) -> list[tuple[str, str]]:
    """One-to-one, one-to-many or many-to-one pairs; lists must be of equal length."""
    if isinstance(text_1, str) and isinstance(text_2, str):
        return [(text_1, text_2)]
    if isinstance(text_1, str):
        return [(text_1, b) for b in text_2]
    if isinstance(text_2, str):
        return [(a, text_2) for a in text_1]
    if len(text_1) != len(text_2):
        raise errors.invalid(
            f"text_1 and text_2 are lists of different lengths ({len(text_1)} and "
            f"{len(text_2)}); pass equal lengths, or a single text on one side.",
            param="text_2",
        )
    return list(zip(text_1, text_2, strict=True))


def cosine(a: FloatArray, b: FloatArray) -> FloatArray:
    """Row-wise cosine similarity of two [n, d] arrays."""
    num: FloatArray = np.einsum("ij,ij->i", a, b)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    out: FloatArray = (num / np.maximum(den, 1e-12)).astype(np.float32)
    return out


class Service:
    def __init__(
        self,
        settings: GatewaySettings,
        model: ModelDir,
        tokenization: Tokenization,
        pool: WorkerPool,
        dispatcher: Dispatcher,
        metrics: Metrics,
        hold: Hold,
    ) -> None:
        self.settings = settings
        self.model = model
        self.tokenization = tokenization
        self.pool = pool
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.hold = hold
        self.name = settings.served_model_name or model.name
        self.created = int(time.time())

    # --- shared steps ----------------------------------------------------------------------

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.name:
            raise errors.not_found(
                f"The model '{model}' does not exist; this server serves '{self.name}'.",
                param="model",
                code="model_not_found",
            )

    def _check_count(self, count: int, param: str) -> None:
        if count == 0:
            raise errors.invalid(f"'{param}' must not be empty.", param=param)
        if count > self.settings.max_client_batch:
            raise errors.too_large(
                f"'{param}' holds {count} items; at most {self.settings.max_client_batch} are "
                "allowed per request. Split the request.",
                param=param,
            )

    def _check_tokens(self, batch: Batch, param: str) -> None:
        total = batch.total
        if total > self.settings.max_request_tokens:
            raise errors.too_large(
                f"The request holds {total} tokens; at most {self.settings.max_request_tokens} "
                "are allowed per request. Split the request.",
                param=param,
            )
        self.metrics.input_tokens.inc(total)

    def _admit(self) -> None:
        """Refuse early what cannot be served; a request to be held (no worker ready yet) is
        let through, so it is tokenized and counted as demand before it waits."""
        if not self.hold.will_hold():
            self.dispatcher.admit()

    @property
    def dimensions(self) -> int:
        info = self.pool.info()
        return int(info.dimensions) if info and info.dimensions else self.model.hidden_size

    def _chunks(self, batch: Batch) -> list[Chunk]:
        s = self.settings
        workers = max(1, self.pool.usable_workers())
        budget = chunk_budget(batch.total, workers, s.chunk_tokens, s.min_chunk_tokens)
        return plan(batch.lengths, budget, s.chunk_sequences)

    async def _embed(self, batch: Batch, dimensions: int) -> FloatArray:
        timeout = self.settings.upstream_timeout_seconds

        async def call(chunk: Chunk, worker: Worker) -> FloatArray:
            packed = pack_tokens(batch.ids[chunk.start : chunk.stop])
            rows, _ = await worker.embed(packed, dimensions, timeout)
            return rows

        return join(await self.dispatcher.run(self._chunks(batch), call))

    async def _score(self, batch: Batch) -> FloatArray:
        timeout = self.settings.upstream_timeout_seconds
        type_ids = batch.type_ids

        async def call(chunk: Chunk, worker: Worker) -> FloatArray:
            types = type_ids[chunk.start : chunk.stop] if type_ids is not None else None
            packed = pack_tokens(batch.ids[chunk.start : chunk.stop], types)
            scores, _ = await worker.score(packed, timeout)
            return scores

        return join(await self.dispatcher.run(self._chunks(batch), call))

    async def _tokenize_texts(
        self, texts: Sequence[str], input_type: str | None, truncate: bool, side: TruncationSide
    ) -> Batch:
        start = time.perf_counter()
        batch = await self.tokenization.texts(texts, input_type, truncate, side)
        self.metrics.tokenize_seconds.observe(time.perf_counter() - start)
        return batch

    async def _pair_scores(
        self, pairs: list[tuple[str, str]], truncate: bool, side: TruncationSide, param: str
    ) -> tuple[FloatArray, int]:
        """Relevance of each pair: the cross-encoder's own score, else embedding cosine."""
        self._admit()
        if self.model.task == "score":
            start = time.perf_counter()
            batch = await self.tokenization.pairs(pairs, truncate, side)
            self.metrics.tokenize_seconds.observe(time.perf_counter() - start)
            self._check_tokens(batch, param)
            await self.hold.until_ready(batch.total)
            return await self._score(batch), batch.total
        firsts = list(dict.fromkeys(a for a, _ in pairs))
        seconds = list(dict.fromkeys(b for _, b in pairs))
        left = await self._tokenize_texts(firsts, "query", truncate, side)
        right = await self._tokenize_texts(seconds, "document", truncate, side)
        both = Batch(ids=left.ids + right.ids)
        self._check_tokens(both, param)
        await self.hold.until_ready(both.total)
        rows = await self._embed(both, 0)
        where_a = {t: i for i, t in enumerate(firsts)}
        where_b = {t: len(firsts) + i for i, t in enumerate(seconds)}
        a = rows[[where_a[x] for x, _ in pairs]]
        b = rows[[where_b[y] for _, y in pairs]]
        # Usage counts each distinct text once: that is what the workers ran.
        return cosine(a, b), both.total

    # --- endpoints -------------------------------------------------------------------------

    async def embeddings(self, req: EmbeddingRequest) -> dict[str, Any]:
        self._check_model(req.model)
        if self.model.task == "score":
            raise errors.invalid(
                f"'{self.name}' is a cross-encoder: it scores pairs. Use /v1/rerank or /v1/score.",
                param="model",
            )
        raw = req.input
        if isinstance(raw, str):
            raw = [raw]
        elif raw and isinstance(raw[0], int):
            # A flat list of token ids is one input, however long: `truncate` decides its fate.
            raw = [raw]
        self._check_count(len(raw), "input")
        dims = self.dimensions
        if req.dimensions is not None and req.dimensions > dims:
            raise errors.invalid(
                f"'dimensions' must be between 1 and {dims} for this model; got {req.dimensions}.",
                param="dimensions",
            )
        self._admit()
        if isinstance(raw[0], str):
            texts: list[str] = raw
            _check_texts(texts, "input")
            batch = await self._tokenize_texts(
                texts, req.input_type, req.truncate, req.truncation_side
            )
        else:
            seqs = cast(list[list[int]], raw)
            batch = self.tokenization.token_ids(seqs, req.truncate, req.truncation_side)
        self._check_tokens(batch, "input")
        await self.hold.until_ready(batch.total)
        requested = req.dimensions if req.dimensions is not None and req.dimensions < dims else 0
        rows = await self._embed(batch, requested)
        if req.encoding_format == "base64":
            little = rows.astype("<f4", copy=False)
            data: list[dict[str, Any]] = [
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": base64.b64encode(r.tobytes()).decode(),
                }
                for i, r in enumerate(little)
            ]
        else:
            data = [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]
        return {"object": "list", "data": data, "model": self.name, "usage": _usage(batch.total)}

    async def rerank(self, req: RerankRequest) -> dict[str, Any]:
        self._check_model(req.model)
        self._check_count(len(req.documents), "documents")
        docs = [d.text if isinstance(d, Document) else d for d in req.documents]
        if not req.query:
            raise errors.invalid("'query' must not be empty.", param="query")
        _check_texts(docs, "documents")
        scores, tokens = await self._pair_scores(
            [(req.query, d) for d in docs], req.truncate, req.truncation_side, "documents"
        )
        order = np.argsort(-scores, kind="stable")
        if req.top_n is not None:
            order = order[: req.top_n]
        results: list[dict[str, Any]] = []
        for i in order.tolist():
            result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
            if req.return_documents:
                result["document"] = {"text": docs[i]}
            results.append(result)
        return {"model": self.name, "results": results, "usage": _usage(tokens)}

    async def score(self, req: ScoreRequest) -> dict[str, Any]:
        self._check_model(req.model)
        pairs = score_pairs(req.text_1, req.text_2)
        self._check_count(len(pairs), "text_2")
        for a, b in pairs:
            if not a or not b:
                raise errors.invalid("Texts to score must not be empty.", param="text_1")
        scores, tokens = await self._pair_scores(pairs, req.truncate, req.truncation_side, "text_2")
        data = [
            {"object": "score", "index": i, "score": float(s)}
            for i, s in enumerate(scores.tolist())
        ]
        return {"object": "list", "data": data, "model": self.name, "usage": _usage(tokens)}

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "embedfleet",
                }
            ],
        }
