"""Load against a running gateway for stress tests and benchmarks: mixed-size requests from many
closed-loop clients, every outcome recorded, and the invariants of an overloaded gateway.

    outcomes = asyncio.run(closed_loop("127.0.0.1", port, 64, 30.0, mixed_bodies(vocab, 7, 300)))
    summary = summarize(outcomes, capacity=10_000, bound_seconds=5)

Each client posts, waits for the answer, and on a 429 sleeps its Retry-After (as OpenAI's SDKs do)
before the next request. The client is plain asyncio streams on keep-alive connections, so its own
cost stays small next to the gateway's. Pure analysis (`summarize`, `work_in_flight`) is separate
from the I/O, so its rules are tested without a gateway.
"""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from embedfleet.common import heap

#: what an HTTP status of 0 means in an Outcome: no answer (the client's timeout, a reset)
NO_ANSWER = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request as its client saw it (times from time.monotonic)."""

    start: float
    end: float
    status: int
    #: usage.total_tokens of a 200; 0 otherwise
    tokens: int = 0
    #: Retry-After of a 429, seconds (-1: the header was missing)
    retry_after: int = -1
    #: the error body's code (429, 5xx), or what went wrong without an answer
    error: str = ""


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


class KeepAlive:
    """One keep-alive HTTP/1.1 connection, reopened after the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> Answer:
        """Send on the kept-alive connection; if the server had closed it while idle (its
        keep-alive bound, e.g. while this client waited out a Retry-After), send once more on a
        new one, as HTTP clients do: a request that met only a closed socket was never read."""
        reused = self._writer is not None and not self._writer.is_closing()
        if reused and self._reader is not None and self._reader.at_eof():
            self.close()
            reused = False
        try:
            return await self._post(path, body)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                raise
            self.close()
            return await self._post(path, body)

    async def _post(self, path: str, body: bytes) -> Answer:
        if self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        self._writer.write(head + body)
        lines = (await self._reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        status = int(lines[0][9:12])
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name:
                headers[name.strip().lower()] = value.strip()
        data = await self._reader.readexactly(int(headers.get(b"content-length", b"0")))
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return Answer(status, headers, data)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = None


def words_of(vocab: Sequence[str]) -> list[str]:
    """Whole words of a tokenizer's vocabulary (each one token): letters only, three or more."""
    return sorted(w for w in vocab if w.isascii() and w.isalpha() and len(w) >= 3)


def mixed_bodies(
    words: Sequence[str],
    seed: int,
    count: int,
    texts: tuple[int, int] = (1, 100),
    words_per_text: tuple[int, int] = (5, 500),
) -> list[bytes]:
    """`count` /v1/embeddings bodies of uniformly random sizes (texts per request, words per
    text), `truncate` on: the issue's "1-100 texts of 5-500 words"."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.randint(*texts)
        inputs = [" ".join(rng.choices(words, k=rng.randint(*words_per_text))) for _ in range(n)]
        out.append(orjson.dumps({"input": inputs, "truncate": True}))
    return out


async def _one(conn: KeepAlive, body: bytes, timeout: float) -> Outcome:
    start = time.monotonic()
    try:
        answer = await asyncio.wait_for(conn.post("/v1/embeddings", body), timeout)
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
        conn.close()
        return Outcome(start, time.monotonic(), NO_ANSWER, error=type(exc).__name__)
    end = time.monotonic()
    if answer.status == 200:
        usage = orjson.loads(answer.body)["usage"]
        return Outcome(start, end, 200, tokens=int(usage["total_tokens"]))
    try:
        code = str(orjson.loads(answer.body)["error"]["code"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        code = "unparsed error body"
    retry = answer.headers.get(b"retry-after")
    return Outcome(start, end, answer.status, retry_after=int(retry) if retry else -1, error=code)


async def one_request(host: str, port: int, body: bytes, timeout: float = 120.0) -> Outcome:
    """`body` posted once, on a connection of its own."""
    conn = KeepAlive(host, port)
    try:
        return await _one(conn, body, timeout)
    finally:
        conn.close()


async def closed_loop(
    host: str,
    port: int,
    clients: int,
    seconds: float,
    bodies: Sequence[bytes],
    timeout: float = 120.0,
) -> list[Outcome]:
    """`clients` clients sending `bodies` (in turn, each client from its own offset) for
    `seconds`; requests still in flight then are waited for (each up to `timeout`)."""
    outcomes: list[Outcome] = []
    deadline = time.monotonic() + seconds

    async def client(index: int) -> None:
        conn = KeepAlive(host, port)
        n = index * 7919
        try:
            while time.monotonic() < deadline:
                outcome = await _one(conn, bodies[n % len(bodies)], timeout)
                outcomes.append(outcome)
                n += 1
                if outcome.status == 429 and outcome.retry_after > 0:
                    await asyncio.sleep(min(outcome.retry_after, deadline - time.monotonic()))
        finally:
            conn.close()

    await asyncio.gather(*(client(i) for i in range(clients)))
    return outcomes


#: a normal client's pace in latency comparisons (slowloris): one request per 40 ms, 100/s for four
#: clients, well within what 2 cores serve, so the clients alone do not keep the cores busy
NORMAL_INTERVAL = 0.04


async def short_requests(
    port: int,
    clients: int,
    seconds: float,
    body: bytes,
    host: str = "127.0.0.1",
    interval: float = 0.0,
) -> tuple[list[float], list[str]]:
    """Latencies (seconds) of `clients` clients posting `body` for `seconds`, and a line per
    failed request (no answer within 30 s, or not 200). Each client sends one request at a time;
    with an `interval`, one every `interval` seconds (the clients' starts spread over the first;
    one answered late is followed at once), else the next as soon as the last is answered.

    The measuring process's heap is frozen while it times (heap.frozen): a test process holding
    torch and transformers paused 300+ ms in each full collection, and each pause landed on
    whichever timed request was in flight, one fleet's and not the other's."""
    with heap.frozen():
        return await _short_requests(port, clients, seconds, body, host, interval)


async def _short_requests(
    port: int, clients: int, seconds: float, body: bytes, host: str, interval: float
) -> tuple[list[float], list[str]]:
    latencies: list[float] = []
    failures: list[str] = []
    begin = time.monotonic()
    deadline = begin + seconds

    async def client(index: int) -> None:
        conn = KeepAlive(host, port)
        due = begin + interval * index / clients
        try:
            while time.monotonic() < deadline:
                if interval:
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    due += interval
                start = time.monotonic()
                try:
                    answer = await asyncio.wait_for(conn.post("/v1/embeddings", body), 30)
                except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
                    failures.append(type(exc).__name__)
                    conn.close()
                    continue
                if answer.status != 200:
                    failures.append(f"{answer.status} {answer.body[:100]!r}")
                latencies.append(time.monotonic() - start)
        finally:
            conn.close()

    await asyncio.gather(*(client(i) for i in range(clients)))
    return latencies, failures


# --- analysis (pure) -----------------------------------------------------------------------------


def work_in_flight(outcomes: Sequence[Outcome], at: Sequence[float]) -> list[int]:
    """For each time in `at`, the tokens of answered (200) requests in flight then: sent before
    it, answered after it. What the gateway counted ahead at that moment is at most this plus
    requests it was still tokenizing, at least this less the ones whose answer was on its way."""
    done = sorted((o for o in outcomes if o.status == 200), key=lambda o: o.start)
    starts = [o.start for o in done]
    out = []
    for t in at:
        upto = bisect.bisect_right(starts, t)
        out.append(sum(o.tokens for o in done[:upto] if o.end > t))
    return out


@dataclass(frozen=True)
class Summary:
    requests: int
    ok: int
    shed: int
    #: 5xx answers, by error code
    server_errors: dict[str, int]
    #: no answer within the client's timeout, or the connection failed
    no_answer: int
    #: other 4xx, by status
    other: dict[int, int]
    #: shed requests without a Retry-After header
    shed_without_retry_after: int
    #: tokens/s of answered requests, from the first request sent to the last answer
    goodput: float
    capacity: float
    #: latency of answered requests
    ok_p50_seconds: float
    ok_max_seconds: float
    #: the least work (seconds at capacity, client-side view) in flight when a 429 came
    least_seconds_ahead_of_a_429: float
    #: the 429s, for a report: (seconds into the run, seconds of work in flight then)
    shed_at: list[tuple[float, float]] = field(default_factory=list)

    @property
    def goodput_ratio(self) -> float:
        return self.goodput / self.capacity if self.capacity > 0 else 0.0


def summarize(outcomes: Sequence[Outcome], capacity: float) -> Summary:
    if not outcomes:
        raise ValueError("no requests were sent")
    t0 = min(o.start for o in outcomes)
    ok = [o for o in outcomes if o.status == 200]
    shed = [o for o in outcomes if o.status == 429]
    server: dict[str, int] = {}
    other: dict[int, int] = {}
    for o in outcomes:
        if o.status >= 500:
            server[f"{o.status} {o.error}"] = server.get(f"{o.status} {o.error}", 0) + 1
        elif o.status not in (200, 429, NO_ANSWER):
            other[o.status] = other.get(o.status, 0) + 1
    last = max((o.end for o in ok), default=t0)
    goodput = sum(o.tokens for o in ok) / (last - t0) if last > t0 else 0.0
    latencies = sorted(o.end - o.start for o in ok)
    # A 429 is decided when the request arrives; its answer comes right after.
    ahead = work_in_flight(outcomes, [o.start + (o.end - o.start) / 2 for o in shed])
    seconds_ahead = [a / capacity for a in ahead] if capacity > 0 else [0.0] * len(ahead)
    return Summary(
        requests=len(outcomes),
        ok=len(ok),
        shed=len(shed),
        server_errors=server,
        no_answer=sum(1 for o in outcomes if o.status == NO_ANSWER),
        other=other,
        shed_without_retry_after=sum(1 for o in shed if o.retry_after < 1),
        goodput=goodput,
        capacity=capacity,
        ok_p50_seconds=latencies[len(latencies) // 2] if latencies else 0.0,
        ok_max_seconds=latencies[-1] if latencies else 0.0,
        least_seconds_ahead_of_a_429=min(seconds_ahead, default=float("inf")),
        shed_at=[(o.start - t0, s) for o, s in zip(shed, seconds_ahead, strict=True)],
    )
