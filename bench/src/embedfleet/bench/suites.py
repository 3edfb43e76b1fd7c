"""The five suites as lists of points, and running one system through them.

(1) latency: batch 1 at 128 and 512 tokens, one client; (2) scoring: a 32-token query against 5, 25
and 50 documents of 512 tokens, one client; (3) throughput: batches of 100 texts of 512 tokens from
4 concurrent clients; (4) concurrency: 1, 2, 4, 8, 16 clients each sending one 128-token text;
(5) queries: 1 and 16 clients each sending one 32-token query (a search box's traffic, where the
harness around a small model costs the most).
Token counts include [CLS]/[SEP]; every input has exactly its nominal length (see corpus.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from embedfleet.bench.corpus import Corpus
from embedfleet.bench.fidelity import Fidelity, Reference, check
from embedfleet.bench.http_load import Call, Measurement, run_point
from embedfleet.bench.targets import Target

SUITES = ("latency", "scoring", "throughput", "concurrency", "queries")
QUERY_TOKENS = 32


@dataclass(frozen=True)
class Point:
    suite: str
    label: str
    kind: Literal["embed", "score"]
    clients: int
    batch: int  # texts (or documents) per request
    length: int  # tokens per text
    seconds: float
    warmup: float
    min_requests: int

    @property
    def key(self) -> str:
        return f"{self.suite}/{self.label}"

    @property
    def tokens_per_request(self) -> int:
        query = QUERY_TOKENS if self.kind == "score" else 0
        return query + self.batch * self.length


@dataclass(frozen=True)
class Timing:
    """Durations and sizes of a run; FULL follows the issue, the others shrink it."""

    seconds: float = 10.0  # measured per point (requests in flight then still finish)
    warmup: float = 2.0  # per point, discarded
    min_requests: int = 3  # per point, even when the deadline passed first
    throughput_seconds: float = 30.0
    throughput_length: int = 512
    throughput_batch: int = 100
    scoring_docs: tuple[int, ...] = (5, 25, 50)
    clients: tuple[int, ...] = (1, 2, 4, 8, 16)
    query_clients: tuple[int, ...] = (1, 16)


FULL = Timing()
#: a couple of minutes per system: every point runs, figures are not comparable with FULL
QUICK = Timing(
    seconds=1.0, warmup=0.3, min_requests=1, throughput_seconds=1.0, throughput_length=128
)
#: the unit test's: every suite present, each as small as it gets
TINY = Timing(
    seconds=0.2,
    warmup=0.05,
    min_requests=1,
    throughput_seconds=0.2,
    throughput_length=128,
    throughput_batch=4,
    scoring_docs=(5,),
    clients=(1, 4),
    query_clients=(4,),
)


def plan(suites: Sequence[str], timing: Timing) -> list[Point]:
    points: list[Point] = []
    t = timing
    s, w, r = t.seconds, t.warmup, t.min_requests
    if "latency" in suites:
        points += [Point("latency", f"{n} tokens", "embed", 1, 1, n, s, w, r) for n in (128, 512)]
    if "scoring" in suites:
        points += [
            Point("scoring", f"{n} docs", "score", 1, n, 512, s, w, r) for n in t.scoring_docs
        ]
    if "throughput" in suites:
        n, b = t.throughput_length, t.throughput_batch
        label = f"4x{b}x{n}"
        points.append(Point("throughput", label, "embed", 4, b, n, t.throughput_seconds, w, r))
    if "concurrency" in suites:
        points += [
            Point("concurrency", f"{c} clients", "embed", c, 1, 128, s, w, r) for c in t.clients
        ]
    if "queries" in suites:
        points += [
            Point("queries", f"{c} clients", "embed", c, 1, QUERY_TOKENS, s, w, r)
            for c in t.query_clients
        ]
    return points


def make_call(target: Target, point: Point, corpus: Corpus) -> Call:
    """Each request draws fresh texts (by client and request number), so none repeats soon."""
    pool = len(corpus.texts[point.length])
    query_pool = corpus.texts[QUERY_TOKENS]

    def texts(client: int, n: int) -> list[str]:
        offset = (client * 7919 + n * point.batch) % pool
        return corpus.take(point.length, point.batch, offset)

    if point.kind == "score":

        async def score(client: int, n: int) -> None:
            query = query_pool[(client + n) % len(query_pool)]
            await target.score(query, texts(client, n))

        return score

    async def embed(client: int, n: int) -> None:
        await target.embed(texts(client, n))

    return embed


@dataclass
class SystemRun:
    """One system's results; `status` is "ok" or why it has no figures."""

    name: str
    version: str
    setting: str
    score_via: str
    status: str = "ok"
    fidelity: Fidelity | None = None
    points: dict[str, Measurement] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    #: the sum of each of its processes' peak resident memory (VmHWM) after every suite, MiB;
    #: None where its processes are not ours to read (a fleet already running)
    peak_rss_mb: float | None = None


async def run_system(
    target: Target, run: SystemRun, points: Sequence[Point], corpus: Corpus, ref: Reference
) -> SystemRun:
    t0 = time.monotonic()
    run.fidelity = await check(target, ref)
    run.seconds["fidelity"] = time.monotonic() - t0
    for point in points:
        t0 = time.monotonic()
        m = await run_point(
            make_call(target, point, corpus),
            clients=point.clients,
            seconds=point.seconds,
            warmup_seconds=point.warmup,
            tokens_per_request=point.tokens_per_request,
            inputs_per_request=point.batch,
            min_requests=point.min_requests,
        )
        run.points[point.key] = m
        elapsed = time.monotonic() - t0
        run.seconds[point.suite] = run.seconds.get(point.suite, 0.0) + elapsed
        err = f"  ERRORS {m.errors}: {m.first_error}" if m.errors else ""
        print(
            f"  {run.name:22s} {point.key:28s} {m.tokens_per_second:9.0f} tok/s "
            f"{m.requests_per_second:8.1f} req/s  p50 {m.p50_ms:8.1f} ms  p99 {m.p99_ms:8.1f} ms"
            f"  n={m.requests} ({elapsed:.0f}s){err}",
            flush=True,
        )
    return run


def scaled(points: Sequence[Point], factor: float) -> list[Point]:
    """Every point's durations times `factor` (for --seconds-scale)."""
    return [replace(p, seconds=p.seconds * factor, warmup=p.warmup * factor) for p in points]
