"""What a suite drives: one system's embed and score calls, timed end to end.

HTTP systems get the same client: a minimal HTTP/1.1 keep-alive client on asyncio streams (httpx
costs a few hundred microseconds of the shared CPU per request by itself), one connection per
concurrent request, JSON floats (every API's default). A timed call checks the status and nothing
else; the vectors are parsed only by the `*_values` calls that the fidelity check uses, so
client-side JSON decoding stays out of the figures.
"""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, Protocol

import numpy as np

from embedfleet.common.arrays import FloatArray

#: how a system scores a query against documents with an embedding model
ScoreVia = Literal["rerank", "score", "embed"]

SCORE_VIA_DOC: dict[ScoreVia, str] = {
    "rerank": "server-side: POST /v1/rerank (cosine of embeddings)",
    "score": "server-side: POST /v1/score (cosine of embeddings)",
    "embed": "client-side: one /embeddings call with query + documents, cosine in the client",
}


class TargetError(RuntimeError):
    """The system answered a benchmark call with an error."""


class Target(Protocol):
    name: str
    score_via: ScoreVia

    async def embed(self, texts: Sequence[str]) -> None: ...
    async def score(self, query: str, documents: Sequence[str]) -> None: ...
    async def embed_values(self, texts: Sequence[str]) -> FloatArray: ...
    async def score_values(self, query: str, documents: Sequence[str]) -> FloatArray: ...
    async def close(self) -> None: ...


def cosine_scores(vectors: FloatArray) -> FloatArray:
    """Row 0 is the query; cosine of it with every other row."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    scores: FloatArray = (unit[1:] @ unit[0]).astype(np.float32)
    return scores


class _Connection:
    """One keep-alive HTTP/1.1 connection (responses must carry content-length)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self._reader, self._writer

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        fresh = self._writer is None
        try:
            return await self._post(path, body)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.close()
            if fresh:
                raise
            # the server closed an idle keep-alive connection: once more on a new one
            return await self._post(path, body)

    async def _post(self, path: str, body: bytes) -> tuple[int, bytes]:
        reader, writer = await self._open()
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        headers = await reader.readuntil(b"\r\n\r\n")
        status = int(headers[9:12])
        length = -1
        for line in headers.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        if length < 0:
            self.close()
            raise TargetError(f"{path}: response without content-length")
        return status, await reader.readexactly(length)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


@dataclass
class HttpTarget:
    """An OpenAI-style embeddings server; `embed_path` e.g. /v1/embeddings."""

    name: str
    host: str
    port: int
    model: str
    embed_path: str
    score_via: ScoreVia
    score_path: str = ""

    def __post_init__(self) -> None:
        self._idle: list[_Connection] = []

    async def _post(self, path: str, body: dict[str, Any]) -> bytes:
        conn = self._idle.pop() if self._idle else _Connection(self.host, self.port)
        try:
            status, content = await conn.post(path, json.dumps(body).encode())
        except BaseException:
            conn.close()
            raise
        self._idle.append(conn)
        if status != 200:
            text = content[:300].decode(errors="replace")
            raise TargetError(f"{self.name} {path}: HTTP {status}: {text}")
        return content

    def _embed_body(self, texts: Sequence[str]) -> dict[str, Any]:
        return {"model": self.model, "input": list(texts)}

    def _score_call(self, query: str, documents: Sequence[str]) -> tuple[str, dict[str, Any]]:
        if self.score_via == "rerank":
            return self.score_path, {"model": self.model, "query": query, "documents": documents}
        if self.score_via == "score":
            return self.score_path, {"model": self.model, "text_1": query, "text_2": documents}
        return self.embed_path, self._embed_body([query, *documents])

    async def embed(self, texts: Sequence[str]) -> None:
        await self._post(self.embed_path, self._embed_body(texts))

    async def score(self, query: str, documents: Sequence[str]) -> None:
        path, body = self._score_call(query, list(documents))
        content = await self._post(path, body)
        if self.score_via == "embed":
            # the cosine is part of this system's scoring cost
            cosine_scores(_embeddings(json.loads(content)))

    async def embed_values(self, texts: Sequence[str]) -> FloatArray:
        return _embeddings(json.loads(await self._post(self.embed_path, self._embed_body(texts))))

    async def score_values(self, query: str, documents: Sequence[str]) -> FloatArray:
        path, body = self._score_call(query, list(documents))
        doc = json.loads(await self._post(path, body))
        if self.score_via == "embed":
            return cosine_scores(_embeddings(doc))
        items = doc["results"] if self.score_via == "rerank" else doc["data"]
        key = "relevance_score" if self.score_via == "rerank" else "score"
        out = np.zeros(len(documents), dtype=np.float32)
        for item in items:
            out[int(item["index"])] = float(item[key])
        return out

    async def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


def _embeddings(doc: dict[str, Any]) -> FloatArray:
    rows = sorted(doc["data"], key=lambda d: int(d["index"]))
    return np.asarray([r["embedding"] for r in rows], dtype=np.float32)


class _InProcess:
    """A system called without a server: `_encode` (blocking, serialized by the subclass) runs on
    a thread; scoring is the cosine of the query's and documents' vectors, in the client."""

    score_via: ScoreVia = "embed"

    def _encode(self, texts: Sequence[str]) -> FloatArray:
        raise NotImplementedError

    async def embed(self, texts: Sequence[str]) -> None:
        await asyncio.to_thread(self._encode, texts)

    async def score(self, query: str, documents: Sequence[str]) -> None:
        await self.score_values(query, documents)

    async def embed_values(self, texts: Sequence[str]) -> FloatArray:
        return await asyncio.to_thread(self._encode, texts)

    async def score_values(self, query: str, documents: Sequence[str]) -> FloatArray:
        return cosine_scores(await asyncio.to_thread(self._encode, [query, *documents]))


class PipeError(RuntimeError):
    """A sentence-transformers peer's process failed or answered an error."""


class PipeTarget(_InProcess):
    """sentence-transformers `encode` in a process of its own (st_child.py, run by `python`, the
    environment that has the backend): texts go over a pipe, so it pays no HTTP and no JSON of
    vectors, only a pipe's copy, and its memory is measured apart from the benchmark's.

    Calls are serialized by a lock, as a one-model server without batching would run them: two
    concurrent `encode` calls would only split the same cores between them.
    """

    def __init__(
        self,
        name: str,
        python: Path,
        model_dir: str,
        log: Path,
        *,
        backend: str = "torch",
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 32,
    ) -> None:
        self.name = name
        self._lock = threading.Lock()
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log
        script = Path(__file__).with_name("st_child.py")
        argv = [str(python), str(script), model_dir, str(batch_size), backend, device, dtype]
        with log.open("ab") as err:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
        ready = self._stdout.readline()
        if ready != b"ready\n":
            self._proc.kill()
            self._proc.wait()
            tail = " | ".join(log.read_text(errors="replace").splitlines()[-4:])
            raise PipeError(f"{name} did not start: {tail}")

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def _stdout(self) -> IO[bytes]:
        assert self._proc.stdout is not None
        return self._proc.stdout

    def _read(self, n: int) -> bytes:
        data = self._stdout.read(n)
        if len(data) < n:
            raise PipeError(f"{self.name} exited (log {self._log})")
        return data

    def _encode(self, texts: Sequence[str]) -> FloatArray:
        body = json.dumps(list(texts)).encode()
        assert self._proc.stdin is not None
        with self._lock:
            self._proc.stdin.write(struct.pack("<I", len(body)) + body)
            self._proc.stdin.flush()
            rows, cols = struct.unpack("<II", self._read(8))
            if rows == 0:
                (size,) = struct.unpack("<I", self._read(4))
                raise PipeError(self._read(size).decode(errors="replace"))
            data = self._read(rows * cols * 4)
        return np.frombuffer(data, dtype="<f4").reshape(rows, cols).astype(np.float32)

    async def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
