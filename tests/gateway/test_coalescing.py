"""Merging Embed calls to a busy worker: who waits, what travels together, what each chunk gets."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import pack_tokens, unpack_tokens
from embedfleet.common.modeldir import ModelDir
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.gateway.coalescing import Coalescer, cut, inflight_for
from embedfleet.gateway.settings import GatewaySettings
from embedfleet.gateway.upstream import UpstreamError

from .fakes import FakeWorker
from .helpers import GatewayThread, wait_until

BAD = 999  # a token id the fake worker refuses


class HeldSend:
    """Answers each call when released; row i is [first token id of sequence i]."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []  # first ids of each call's sequences
        self.gate = asyncio.Event()
        self.cancelled = 0

    async def send(
        self, batch: pb.TokenBatch, dimensions: int, timeout: float, normalize: bool | None
    ) -> tuple[FloatArray, int]:
        tokens = unpack_tokens(batch)
        firsts = [int(s[0]) for s in tokens.sequences()]
        self.calls.append(firsts)
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if BAD in tokens.ids.tolist():
            raise UpstreamError(grpc.StatusCode.INVALID_ARGUMENT, "token id outside vocab")
        rows = np.asarray(firsts, dtype=np.float32).reshape(-1, 1)
        return rows, tokens.total


def batch(*firsts: int, length: int = 3) -> pb.TokenBatch:
    return pack_tokens([[f] + [1] * (length - 1) for f in firsts])


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _busy(max_tokens: int = 8192) -> tuple[HeldSend, Coalescer, asyncio.Future[Any]]:
    """A coalescer with one slot, taken by a held call of chunk [1]."""
    worker = HeldSend()
    c = Coalescer(worker.send, max_inflight=1, max_tokens=max_tokens, max_sequences=256)
    first = _embed(c, 1)
    await _settle()
    return worker, c, first


def _embed(c: Coalescer, *firsts: int, dimensions: int = 0) -> asyncio.Future[Any]:
    return asyncio.ensure_future(c.embed(batch(*firsts), dimensions, 5.0, None))


def test_cut_is_consecutive_blocks() -> None:
    rows = np.arange(6, dtype=np.float32).reshape(6, 1)
    parts = cut(rows, [1, 3, 2])
    assert [p[:, 0].tolist() for p in parts] == [[0.0], [1.0, 2.0, 3.0], [4.0, 5.0]]


async def test_below_the_limit_each_chunk_goes_alone_at_once() -> None:
    worker = HeldSend()
    c = Coalescer(worker.send, max_inflight=2, max_tokens=8192, max_sequences=256)
    a = _embed(c, 10)
    b = _embed(c, 20)
    await _settle()
    assert worker.calls == [[10], [20]]
    worker.gate.set()
    (ra, ta), (rb, _) = await asyncio.gather(a, b)
    assert ra[:, 0].tolist() == [10.0]
    assert rb[:, 0].tolist() == [20.0]
    assert ta == 3


async def test_chunks_behind_a_busy_worker_travel_in_one_message_and_get_their_own_rows() -> None:
    worker, c, first = await _busy()
    waiting = [asyncio.ensure_future(c.embed(batch(10 * i, 10 * i + 1), 0, 5.0, None))
               for i in range(1, 4)]  # fmt: skip
    await _settle()
    assert worker.calls == [[1]]  # the others wait for the call in flight
    worker.gate.set()
    results = await asyncio.gather(first, *waiting)
    assert worker.calls == [[1], [10, 11, 20, 21, 30, 31]]
    assert [r[:, 0].tolist() for r, _ in results] == [
        [1.0],
        [10.0, 11.0],
        [20.0, 21.0],
        [30.0, 31.0],
    ]
    assert [t for _, t in results] == [3, 6, 6, 6]


async def test_a_message_stays_within_the_chunk_budget_and_options_never_mix() -> None:
    worker, c, first = await _busy(max_tokens=6)
    rest = [
        _embed(c, 2),
        _embed(c, 3),
        _embed(c, 4),  # 9 tokens > 6: next message
        asyncio.ensure_future(c.embed(batch(5), 8, 5.0, None)),  # other dimensions: its own
    ]
    await _settle()
    worker.gate.set()
    await asyncio.gather(first, *rest)
    assert worker.calls == [[1], [2, 3], [4], [5]]


async def test_a_large_chunk_never_waits_nor_holds_small_ones_up() -> None:
    worker = HeldSend()
    c = Coalescer(worker.send, max_inflight=1, max_tokens=8192, max_sequences=256, small_tokens=8)
    large = [asyncio.ensure_future(c.embed(batch(i, length=8), 0, 5.0, None)) for i in (1, 2)]
    await _settle()
    small = _embed(c, 3)
    await _settle()
    assert worker.calls == [[1], [2], [3]]  # all at once: the large ones take no slot
    worker.gate.set()
    await asyncio.gather(*large, small)


async def test_an_invalid_chunk_fails_alone_the_others_of_its_message_succeed() -> None:
    worker, c, first = await _busy()
    good = _embed(c, 2)
    bad = _embed(c, BAD)
    await _settle()
    worker.gate.set()
    await first
    rows, _ = await good
    assert rows[:, 0].tolist() == [2.0]
    with pytest.raises(UpstreamError) as err:
        await bad
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert worker.calls == [[1], [2, BAD], [2], [BAD]]


async def test_a_failed_message_fails_each_chunk_retryably() -> None:
    async def unavailable(*_: object) -> tuple[FloatArray, int]:
        await asyncio.sleep(0)
        raise UpstreamError(grpc.StatusCode.UNAVAILABLE, "connection reset")

    c = Coalescer(unavailable, max_inflight=1, max_tokens=8192, max_sequences=256)
    calls = [_embed(c, i) for i in range(3)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(o, UpstreamError) and o.retryable for o in outcomes)
    assert len({id(o) for o in outcomes}) == 3  # each chunk its own error object


async def test_a_waiting_chunk_whose_caller_left_is_not_sent() -> None:
    worker, c, first = await _busy()
    gone = _embed(c, 2)
    await _settle()
    gone.cancel()
    await _settle()
    worker.gate.set()
    await first
    await _settle()
    assert worker.calls == [[1]]
    assert c.inflight == 0


async def test_a_merged_call_nobody_waits_for_is_cancelled_and_frees_its_slot() -> None:
    worker, c, head = await _busy()  # never answered
    tail = _embed(c, 2)
    await _settle()
    head.cancel()  # its own call, in its own task: cancelled; the slot goes to tail's message
    await _settle()
    assert worker.calls == [[1], [2]]
    tail.cancel()
    await _settle()
    assert worker.cancelled == 2
    assert c.inflight == 0


async def test_close_fails_waiting_chunks_retryably() -> None:
    _, c, first = await _busy()
    waiting = _embed(c, 2)
    await _settle()
    c.close()
    with pytest.raises(UpstreamError) as err:
        await waiting
    assert err.value.retryable
    first.cancel()


@pytest.mark.parametrize(
    ("device", "inflight"),
    [("", 1), ("cpu", 1), ("null", 1), ("cpu,cpu", 1), ("cuda", 2), ("cuda:0", 2),
     ("cuda:0,cuda:1", 2), ("cpu,cuda:1", 2), ("mps", 2)],
)  # fmt: skip
def test_the_device_sets_the_calls_in_flight(device: str, inflight: int) -> None:
    assert inflight_for(device) == inflight


# --- through the real gateway, in front of a fake gRPC worker ------------------------------------


@pytest.mark.parametrize("inflight", [2, 0])
def test_concurrent_queries_share_calls_and_each_gets_its_own_row(
    minilm: ModelDir, inflight: int
) -> None:
    worker = FakeWorker(0, delay=0.3).start()
    settings = GatewaySettings(
        workers=(worker.address,), probe_seconds=0.1, coalesce_inflight=inflight
    )
    gw = GatewayThread(settings, minilm).start()
    try:
        wait_until("worker ready", lambda: len(gw.app.balancer.usable()) == 1)
        # n words -> n + 2 tokens: each reply's row says whose input it embedded (fakes._rows)
        texts = [" ".join(["word"] * n) for n in range(1, 11)]

        def post(text: str) -> list[float]:
            reply = httpx.post(gw.url + "/v1/embeddings", json={"input": text}, timeout=30)
            assert reply.status_code == 200, reply.text
            embedding: list[float] = reply.json()["data"][0]["embedding"]
            return embedding

        with ThreadPoolExecutor(len(texts)) as pool:
            rows = list(pool.map(post, texts))
        assert [int(r[2]) for r in rows] == [n + 2 for n in range(1, 11)]
        if inflight:
            assert len(worker.calls) < len(texts)  # merged while the first calls were held
            assert sum(worker.calls) == len(texts)
        else:
            assert worker.calls == [1] * len(texts)
    finally:
        gw.stop()
        worker.stop()
