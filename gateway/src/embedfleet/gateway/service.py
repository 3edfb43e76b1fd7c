"""What each endpoint does, from a validated request to a response document (no HTTP here)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import SparseVector, pack_tokens
from embedfleet.common.modeldir import ModelDir
from embedfleet.common.tracing import OFF, SpanLike, Tracer
from embedfleet.gateway import admission, errors
from embedfleet.gateway.dispatcher import Dispatcher
from embedfleet.gateway.hold import Hold
from embedfleet.gateway.long_inputs import merge, split
from embedfleet.gateway.metrics import Metrics
from embedfleet.gateway.pool import Worker, WorkerPool
from embedfleet.gateway.quantization import ENCODINGS, Calibration, encode_rows
from embedfleet.gateway.schemas import (
    ClassifyRequest,
    Document,
    EmbeddingInput,
    EmbeddingRequest,
    RerankRequest,
    ScoreRequest,
    SparseEmbeddingRequest,
    TruncationSide,
)
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.gateway.splitting import Chunk, chunk_budget, join, paced_chunk_tokens, plan
from embedfleet.gateway.tokenization import Batch, Tokenization

log = logging.getLogger(__name__)


#: what each task's model is, for the 400 that sends a request to the right route
_KINDS = {
    "embed": "an embedding model",
    "score": "a cross-encoder reranker (it scores query-document pairs)",
    "classify": "a sequence classifier",
    "sparse": "a sparse (SPLADE) embedding model",
}


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def _tokenized(span: SpanLike, batch: Batch) -> None:
    """What a trace keeps of tokenization: counts, never the text."""
    span.set_attribute("embedfleet.inputs", len(batch.ids))
    span.set_attribute("embedfleet.tokens", batch.total)


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
        calibration: Calibration | None = None,
        *,
        hold: Hold,
        tracer: Tracer = OFF,
    ) -> None:
        self.settings = settings
        self.calibration = calibration
        self.tracer = tracer
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
        admission.tokenized(batch.lengths)

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
        most = paced_chunk_tokens(
            s.chunk_tokens, self.pool.capacity() / workers, s.chunk_seconds, s.min_chunk_tokens
        )
        budget = chunk_budget(batch.total, workers, most, s.min_chunk_tokens)
        return plan(batch.lengths, budget, s.chunk_sequences)

    async def _embed(
        self, batch: Batch, dimensions: int, normalize: bool | None = None
    ) -> FloatArray:
        timeout = self.settings.upstream_timeout_seconds

        async def call(chunk: Chunk, worker: Worker) -> FloatArray:
            packed = pack_tokens(batch.ids[chunk.start : chunk.stop])
            rows, _ = await worker.embed(packed, dimensions, timeout, normalize)
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
        with self.tracer.span("tokenize") as span:
            batch = await self.tokenization.texts(texts, input_type, truncate, side)
            if self.tracer.enabled:
                _tokenized(span, batch)
        self.metrics.tokenize_seconds.observe(time.perf_counter() - start)
        return batch

    def _require(self, task: str, route: str) -> None:
        """A 400 naming the route that serves this model, when `route` cannot."""
        if self.model.task == task:
            return
        serves = {
            "embed": "/v1/embeddings (and /v1/rerank, /v1/score by cosine)",
            "score": "/v1/rerank or /v1/score",
            "classify": "/v1/classify",
            "sparse": "/v1/sparse_embeddings",
        }[self.model.task]
        raise errors.invalid(
            f"'{self.name}' is {_KINDS[self.model.task]}; {route} needs {_KINDS[task]}. "
            f"Use {serves}.",
            param="model",
        )

    async def _tokenize_input(
        self,
        raw: EmbeddingInput,
        input_type: str | None,
        truncate: bool,
        side: TruncationSide,
        windowed: bool = False,
    ) -> Batch:
        """Texts or token ids, checked and tokenized (the embedding endpoints' input); with
        `windowed`, over-long inputs stay whole (`Batch.ends` set) for splitting into windows."""
        if isinstance(raw, str):
            raw = [raw]
        elif raw and isinstance(raw[0], int):
            # A flat list of token ids is one input, however long: `truncate` decides its fate.
            raw = [raw]
        self._check_count(len(raw), "input")
        self._admit()
        if isinstance(raw[0], str):
            texts: list[str] = raw
            _check_texts(texts, "input")
            if windowed:
                start = time.perf_counter()
                batch = await self.tokenization.whole_texts(texts, input_type)
                self.metrics.tokenize_seconds.observe(time.perf_counter() - start)
            else:
                batch = await self._tokenize_texts(texts, input_type, truncate, side)
        else:
            seqs = cast(list[list[int]], raw)
            batch = self.tokenization.token_ids(seqs, truncate, side, windowed)
        if batch.ends is None:
            self._check_tokens(batch, "input")
            await self.hold.until_ready(batch.total)
        # else `_embed_windows` holds it, once its windows are checked and counted as demand.
        return batch

    async def _pair_scores(
        self,
        pairs: list[tuple[str, str]],
        truncate: bool,
        side: TruncationSide,
        param: str,
        instruction: str | None = None,
    ) -> tuple[FloatArray, int]:
        """Relevance of each pair: the reranker's own score, else embedding cosine."""
        if self.model.task not in ("score", "embed"):
            self._require("score", "/v1/rerank and /v1/score")
        if instruction is not None and self.model.head != "yes_no":
            raise errors.invalid(
                "'instruction' applies only to prompt-template rerankers (Qwen3-Reranker); "
                f"'{self.name}' takes none.",
                param="instruction",
            )
        if instruction is not None and not instruction:
            raise errors.invalid("'instruction' must not be empty.", param="instruction")
        self._admit()
        if self.model.task == "score":
            start = time.perf_counter()
            with self.tracer.span("tokenize") as span:
                if self.model.head == "yes_no":
                    batch = await self.tokenization.judged_pairs(pairs, instruction, truncate, side)
                else:
                    batch = await self.tokenization.pairs(pairs, truncate, side)
                if self.tracer.enabled:
                    _tokenized(span, batch)
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

    def _ranges(self, encoding: str, dimensions: int) -> FloatArray | None:
        """The calibration ranges an int8/uint8 `encoding` needs (400 when there are none)."""
        precision, _ = ENCODINGS[encoding]
        if precision not in ("int8", "uint8"):
            return None
        ranges = self.calibration.for_dimensions(dimensions) if self.calibration else None
        if ranges is None:
            have = sorted(self.calibration.ranges) if self.calibration else []
            raise errors.invalid(
                f"'{encoding}' needs this model's {precision} calibration at {dimensions} "
                f"dimensions, and the server has {'ranges for ' + str(have) if have else 'none'}. "
                "Use binary or float, or calibrate (embedfleet calibrate; docs/gateway.md).",
                param="encoding_format",
            )
        return ranges

    def _split_requested(self, req: EmbeddingRequest) -> bool:
        if req.truncate and req.split_long_inputs:
            raise errors.invalid(
                "'truncate' and 'split_long_inputs' are both true: pick one way to handle inputs "
                "over the model's limit.",
                param="split_long_inputs",
            )
        if req.truncate:
            return False
        wanted = req.split_long_inputs
        return self.settings.split_long_inputs if wanted is None else wanted

    async def embeddings(self, req: EmbeddingRequest) -> dict[str, Any]:
        self._check_model(req.model)
        self._require("embed", "/v1/embeddings")
        dims = self.dimensions
        if req.dimensions is not None and req.dimensions > dims:
            raise errors.invalid(
                f"'dimensions' must be between 1 and {dims} for this model; got {req.dimensions}.",
                param="dimensions",
            )
        ranges = self._ranges(req.encoding_format, req.dimensions or dims)
        windowed = self._split_requested(req)
        batch = await self._tokenize_input(
            req.input, req.input_type, req.truncate, req.truncation_side, windowed
        )
        requested = req.dimensions if req.dimensions is not None and req.dimensions < dims else 0
        if batch.ends is not None:
            rows, tokens = await self._embed_windows(batch, requested)
        else:
            rows, tokens = await self._embed(batch, requested), batch.total
        data = [
            {"object": "embedding", "index": i, "embedding": e}
            for i, e in enumerate(encode_rows(rows, req.encoding_format, ranges))
        ]
        return {"object": "list", "data": data, "model": self.name, "usage": _usage(tokens)}

    async def _embed_windows(self, batch: Batch, dimensions: int) -> tuple[FloatArray, int]:
        """Inputs over the limit as windows in one batch; each input's token-weighted mean."""
        assert batch.ends is not None
        limit = self.tokenization.max_tokens
        try:
            windows = split(batch.ids, batch.ends, limit, self.settings.split_overlap_tokens)
        except ValueError as exc:  # a limit too small for the special tokens (a server setting)
            raise errors.invalid(
                f"Cannot split inputs: {exc}.", param="split_long_inputs"
            ) from None
        flat = Batch(ids=windows.ids)
        self._check_tokens(flat, "input")
        await self.hold.until_ready(flat.total)
        if len(windows.ids) == len(batch.ids):
            return await self._embed(flat, dimensions), flat.total
        info = self.pool.info()
        normalize = bool(info.default_normalize) if info else self.model.normalize
        rows = await self._embed(flat, dimensions, normalize=False)
        self.metrics.split_inputs.inc(int((np.bincount(windows.owner) > 1).sum()))
        return merge(rows, windows, normalize), flat.total

    async def rerank(self, req: RerankRequest) -> dict[str, Any]:
        self._check_model(req.model)
        self._check_count(len(req.documents), "documents")
        docs = [d.text if isinstance(d, Document) else d for d in req.documents]
        if not req.query:
            raise errors.invalid("'query' must not be empty.", param="query")
        _check_texts(docs, "documents")
        scores, tokens = await self._pair_scores(
            [(req.query, d) for d in docs],
            req.truncate,
            req.truncation_side,
            "documents",
            req.instruction,
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
        scores, tokens = await self._pair_scores(
            pairs, req.truncate, req.truncation_side, "text_2", req.instruction
        )
        data = [
            {"object": "score", "index": i, "score": float(s)}
            for i, s in enumerate(scores.tolist())
        ]
        return {"object": "list", "data": data, "model": self.name, "usage": _usage(tokens)}

    async def classify(self, req: ClassifyRequest) -> dict[str, Any]:
        self._check_model(req.model)
        self._require("classify", "/v1/classify")
        texts = [req.input] if isinstance(req.input, str) else list(req.input)
        self._check_count(len(texts), "input")
        _check_texts(texts, "input")
        self._admit()
        batch = await self._tokenize_texts(texts, None, req.truncate, req.truncation_side)
        self._check_tokens(batch, "input")
        await self.hold.until_ready(batch.total)
        timeout = self.settings.upstream_timeout_seconds
        activate = not req.raw_scores

        async def call(chunk: Chunk, worker: Worker) -> FloatArray:
            packed = pack_tokens(batch.ids[chunk.start : chunk.stop])
            scores, _ = await worker.classify(packed, activate, timeout)
            return scores

        scores = join(await self.dispatcher.run(self._chunks(batch), call))
        labels = self.model.labels
        if scores.shape[1] != len(labels):
            # The gateway and its workers were given different models: a deployment error.
            log.error(
                "workers and gateway disagree on the label count",
                extra={"worker_labels": int(scores.shape[1]), "gateway_labels": len(labels)},
            )
            raise errors.internal()
        keep = req.top_k or len(labels)
        data: list[dict[str, Any]] = []
        for i, row in enumerate(scores.tolist()):
            order = sorted(range(len(labels)), key=lambda k: -row[k])
            data.append(
                {
                    "object": "classification",
                    "index": i,
                    "label": labels[order[0]],
                    "score": row[order[0]],
                    "labels": [{"label": labels[k], "score": row[k]} for k in order[:keep]],
                    "probs": row,
                    "num_classes": len(labels),
                }
            )
        return {"object": "list", "data": data, "model": self.name, "usage": _usage(batch.total)}

    async def sparse_embeddings(self, req: SparseEmbeddingRequest) -> dict[str, Any]:
        self._check_model(req.model)
        self._require("sparse", "/v1/sparse_embeddings")
        batch = await self._tokenize_input(
            req.input, req.input_type, req.truncate, req.truncation_side
        )
        timeout = self.settings.upstream_timeout_seconds
        top_k, threshold = req.top_k or 0, float(req.threshold or 0.0)

        async def call(chunk: Chunk, worker: Worker) -> list[SparseVector]:
            packed = pack_tokens(batch.ids[chunk.start : chunk.stop])
            rows, _ = await worker.sparse_embed(packed, top_k, threshold, timeout)
            return rows

        parts = await self.dispatcher.run(self._chunks(batch), call)
        dims = self.model.vocab_size
        data = [
            {
                "object": "sparse_embedding",
                "index": i,
                "embedding": {"indices": ids, "values": values},
                "dimensions": dims,
            }
            for i, (ids, values) in enumerate(row for part in parts for row in part)
        ]
        return {"object": "list", "data": data, "model": self.name, "usage": _usage(batch.total)}

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
