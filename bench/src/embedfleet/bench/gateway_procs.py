"""The processes and clients a gateway benchmark drives: a raw keep-alive HTTP client, calls
to a gateway or straight to a worker, a gateway process started and waited for, and the CPU a
process tree used (gateway.py and gateway_cpu.py share them)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import urllib.request
from pathlib import Path

import grpc

from embedfleet.bench.http_load import Call
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.common.proto import embedfleet_pb2_grpc as pb_grpc
from embedfleet.testing.polling import WaitTimeoutError, wait_for


class RawHttp:
    """One keep-alive HTTP/1.1 connection; requests are pre-encoded bytes."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> bytes:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        self._writer.write(head + body)
        status_and_headers = await self._reader.readuntil(b"\r\n\r\n")
        status = int(status_and_headers[9:12])
        length = 0
        for line in status_and_headers.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        data = await self._reader.readexactly(length)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
        return data

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def gateway_call(port: int, clients: int, body: bytes) -> tuple[Call, list[RawHttp]]:
    conns = [RawHttp("127.0.0.1", port) for _ in range(clients)]

    async def call(index: int, n: int) -> None:
        await conns[index].post("/v1/embeddings", body)

    return call, conns


def worker_call(address: str, batch: pb.TokenBatch) -> tuple[Call, grpc.aio.Channel]:
    channel = grpc.aio.insecure_channel(address)
    stub = pb_grpc.WorkerStub(channel)  # type: ignore[no-untyped-call]
    request = pb.EmbedRequest(batch=batch)

    async def call(index: int, n: int) -> None:
        await stub.Embed(request, timeout=30)

    return call, channel


def spawn_gateway(
    argv: list[str], env: dict[str, str], port: int, log: Path
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[:3]} exited; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        wait_for(f"{argv[:3]} to be ready", ready, timeout=60, interval=0.2)
    except WaitTimeoutError as exc:
        proc.kill()
        raise RuntimeError(f"{argv[:3]} not ready; see {log}") from exc
    return proc
