"""Soak: a local fleet under varied-shape traffic for minutes, its processes' RSS sampled.

    python -m embedfleet.bench.soak                    # 10 minutes, 2 workers, real MiniLM
    python -m embedfleet.bench.soak --minutes 2 --baseline

Closed-loop clients send /v1/embeddings requests whose shapes never settle: 1 to --max-texts
texts of 5 to --max-words words each, so nearly every batch a worker runs has a token count it has
not seen. Every --sample-seconds the RSS of the gateway and of each worker is read from /proc. The
figure is each process's growth after the first minute (warm-up, first batches, caches filling):
the median RSS of the last minute against that of the second minute; the target is < 10%. Medians,
because one sample lands inside a batch or between two and a worker's RSS swings by a large
batch's working set (hundreds of MB at 16k tokens); the peak and the floor are shown beside them.

`--baseline` runs worker-1 with the worker's memory settings off (`--library-cache-capacity 0
--malloc-trim-seconds 0`: the libraries' and glibc's defaults), so one run shows both side by
side under the same traffic.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from embedfleet.bench.targets import HttpTarget, TargetError
from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.common.net import free_ports
from embedfleet.fleet.supervisor import Fleet
from embedfleet.testing import procfs

#: worker flags that turn the memory settings off (for --baseline)
DEFAULTS_OFF = ("--library-cache-capacity", "0", "--malloc-trim-seconds", "0")
TARGET_GROWTH = 0.10
_SYLLABLES = ("ka", "lo", "mi", "ter", "an", "dus", "pre", "vo", "sim", "el", "qua", "nor", "ix")


@dataclass(frozen=True)
class Growth:
    process: str
    #: median RSS over the second minute (the first after warm-up)
    second_minute_mb: float
    #: median RSS over the last minute
    last_minute_mb: float
    #: lowest RSS of the last minute (between batches)
    last_floor_mb: float
    #: highest RSS after the first minute
    peak_mb: float

    @property
    def growth(self) -> float:
        return (self.last_minute_mb - self.second_minute_mb) / self.second_minute_mb


class _Truncating(HttpTarget):
    """Texts past the model's limit are cut (`truncate`), so long ones still vary the shapes."""

    def _embed_body(self, texts: Sequence[str]) -> dict[str, Any]:
        return {**super()._embed_body(texts), "truncate": True}


@dataclass
class Traffic:
    requests: int = 0
    texts: int = 0
    shed: int = 0  # 429: load beyond the fleet's queue bound, not an error
    errors: list[str] = field(default_factory=list)


def growth(samples: Sequence[tuple[float, dict[str, float]]], minute: float = 60.0) -> list[Growth]:
    """Pure: per process, the medians of its RSS samples in [minute, 2 minute) and in the last
    minute of the run, the last minute's floor and the peak after the first minute."""
    end = samples[-1][0] if samples else 0.0
    if end < 2 * minute:
        raise ValueError(f"the run ended at {end:.0f} s: it needs two minutes at least")

    def values(name: str, start: float, stop: float) -> list[float]:
        return [rss[name] for t, rss in samples if start <= t <= stop and name in rss]

    names = sorted({name for _, rss in samples for name in rss})
    rows = []
    for name in names:
        second, last = values(name, minute, 2 * minute), values(name, end - minute, end)
        if second and last:
            after = values(name, minute, end)
            rows.append(
                Growth(
                    name, statistics.median(second), statistics.median(last), min(last), max(after)
                )
            )
    return rows


def texts(rng: random.Random, max_texts: int, max_words: int) -> list[str]:
    def word() -> str:
        return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3)))

    return [
        " ".join(word() for _ in range(rng.randint(5, max_words)))
        for _ in range(rng.randint(1, max_texts))
    ]


async def _client(
    target: _Truncating, seed: int, deadline: float, args: argparse.Namespace, traffic: Traffic
) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        batch = texts(rng, args.max_texts, args.max_words)
        try:
            await target.embed(batch)
        except TargetError as exc:
            if "HTTP 429" in str(exc):
                traffic.shed += 1
                await asyncio.sleep(0.5)
                continue
            traffic.errors.append(str(exc)[:300])
            continue
        traffic.requests += 1
        traffic.texts += len(batch)


async def _sampler(
    fleet: Fleet,
    start: float,
    deadline: float,
    every: float,
    out: list[tuple[float, dict[str, float]]],
) -> None:
    while True:
        now = time.monotonic()
        rss = {}
        for child in fleet.children:
            if child.process is not None and child.process.poll() is None:
                mb = procfs.rss_mb(child.process.pid)
                if mb is not None:
                    rss[child.name] = mb
        out.append((now - start, rss))
        if now >= deadline:
            return
        await asyncio.sleep(min(every, max(deadline - now, 0.0)))


async def _soak(
    fleet: Fleet, args: argparse.Namespace
) -> tuple[list[tuple[float, dict[str, float]]], Traffic]:
    model = load_model_dir(default_model_path()).name
    target = _Truncating("embedfleet", "127.0.0.1", fleet.port, model, "/v1/embeddings", "rerank")
    start = time.monotonic()
    deadline = start + args.minutes * 60.0
    samples: list[tuple[float, dict[str, float]]] = []
    traffic = Traffic()
    clients = [_client(target, i, deadline, args, traffic) for i in range(args.clients)]
    await asyncio.gather(_sampler(fleet, start, deadline, args.sample_seconds, samples), *clients)
    await target.close()
    return samples, traffic


def tokens_served(fleet: Fleet) -> dict[str, float]:
    """Each worker's embedfleet_worker_tokens_total, read from its /metrics."""
    served = {}
    for child in fleet.worker_children:
        port = child.argv[child.argv.index("--metrics-port") + 1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith("embedfleet_worker_tokens_total "):
                    served[child.name] = float(line.split()[1])
    return served


def report(
    rows: list[Growth],
    traffic: Traffic,
    minutes: float,
    baseline: bool,
    served: dict[str, float],
) -> str:
    lines = [
        f"soak: {minutes:g} min, {traffic.requests} requests ({traffic.texts} texts) answered, "
        f"{traffic.shed} shed (429), {len(traffic.errors)} errors"
        + (" ; worker-1 with the memory settings off" if baseline else ""),
        "",
        "| process | RSS median, 2nd minute (MB) | RSS median, last minute (MB) | growth | < 10% "
        "| last minute's floor (MB) | peak after 1 min (MB) | tokens served |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for g in rows:
        ok = "yes" if g.growth < TARGET_GROWTH else "NO"
        tokens = f"{served[g.process]:.0f}" if g.process in served else ""
        lines.append(
            f"| {g.process} | {g.second_minute_mb:.0f} | {g.last_minute_mb:.0f} | {g.growth:+.1%} "
            f"| {ok} | {g.last_floor_mb:.0f} | {g.peak_mb:.0f} | {tokens} |"
        )
    if traffic.errors:
        lines.append(f"\nfirst error: {traffic.errors[0]}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the run (10)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--clients", type=int, default=4, help="closed-loop clients (4)")
    parser.add_argument("--max-texts", type=int, default=48, help="most texts per request (48)")
    parser.add_argument("--max-words", type=int, default=200, help="most words per text (200)")
    parser.add_argument("--sample-seconds", type=float, default=5.0, help="RSS sampling (5)")
    parser.add_argument(
        "--baseline", action="store_true", help="worker-1 with the memory settings off"
    )
    parser.add_argument("--json", type=Path, help="also write the samples and figures here")
    parser.add_argument("--logs", type=Path, help="the fleet's logs (default: none kept)")
    args = parser.parse_args(argv)
    if args.baseline and args.workers < 2:
        parser.error("--baseline needs at least 2 workers")
    (port,) = free_ports(1)
    fleet = Fleet(workers=args.workers, port=port, log_dir=args.logs)
    fleet.plan()  # the argv of each child, before any starts, so worker-1's can be changed
    if args.baseline:
        fleet.worker_children[1].argv.extend(DEFAULTS_OFF)
    with fleet:
        samples, traffic = asyncio.run(_soak(fleet, args))
        served = tokens_served(fleet)
    rows = growth(samples)
    print(report(rows, traffic, args.minutes, args.baseline, served))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "growth": [asdict(g) | {"growth": g.growth} for g in rows],
                    "traffic": asdict(traffic),
                    "tokens_served": served,
                    "samples": samples,
                },
                indent=1,
            )
        )
    judged = [g for g in rows if not (args.baseline and g.process == "worker-1")]
    return 0 if not traffic.errors and all(g.growth < TARGET_GROWTH for g in judged) else 1


if __name__ == "__main__":
    raise SystemExit(main())
