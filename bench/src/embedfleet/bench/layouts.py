"""How `embedfleet serve` should split a machine's cores: fleet layouts side by side in one run.

Run: ``python -m embedfleet.bench.layouts [--layout 2x1:default --layout 1x2:passive ...]
[--rounds 2] [--seconds 8]``. Each layout is WORKERSxTHREADS[:OMP_WAIT_POLICY] (see
stages.parse_shape); the layouts run one after the other, round after round (alternating, so a
change in the shared machine's load falls on all of them), each through the same points: a lone
request of 128 and of 512 tokens (p50), 16 clients of 32-token queries (texts/s, p99) and
4 clients x 100 texts of 128 tokens (tokens/s). The table gives each figure's ratio to the first
layout's. common.cpus.layout is the decision these figures back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from embedfleet.bench import corpus as corpus_mod
from embedfleet.bench import peers
from embedfleet.bench.http_load import run_point
from embedfleet.bench.stages import Shape, fleet_for, parse_shape
from embedfleet.bench.targets import HttpTarget

DEFAULT_LAYOUTS = ("2x1:default", "1x2:default", "1x2:active", "1x2:passive")
#: (key, what, higher is better)
FIGURES = (
    ("lone_128_p50_ms", "lone 128-token request p50 ms", False),
    ("lone_512_p50_ms", "lone 512-token request p50 ms", False),
    ("queries_16_texts_per_s", "16 clients × 32-token queries, texts/s", True),
    ("queries_16_p99_ms", "16 clients × 32-token queries, p99 ms", False),
    ("batches_4x100_tokens_per_s", "4 clients × 100 × 128 tokens, tok/s", True),
)


@dataclass
class LayoutRun:
    layout: str
    round: int
    figures: dict[str, float] = field(default_factory=dict)
    errors: int = 0
    first_error: str = ""


async def _lone(target: HttpTarget, texts: Sequence[str], n: int) -> float:
    for text in texts[-3:]:  # warm
        await target.embed([text])
    latencies = []
    for i in range(n):
        started = time.perf_counter()
        await target.embed([texts[i % len(texts)]])
        latencies.append(time.perf_counter() - started)
    return statistics.median(latencies) * 1e3


async def _points(
    port: int, corpus: corpus_mod.Corpus, lone: int, seconds: float
) -> tuple[dict[str, float], int, str]:
    target = HttpTarget(
        "embedfleet", "127.0.0.1", port, peers.SERVED_NAME, "/v1/embeddings", "embed"
    )
    figures: dict[str, float] = {}
    try:
        figures["lone_128_p50_ms"] = await _lone(target, corpus.texts[128], lone)
        figures["lone_512_p50_ms"] = await _lone(target, corpus.texts[512], lone)
        queries = corpus.texts[32]

        async def query(client: int, n: int) -> None:
            await target.embed([queries[(client * 7919 + n) % len(queries)]])

        m = await run_point(query, 16, seconds, 1.0, 32, 1)
        figures["queries_16_texts_per_s"] = m.requests_per_second
        figures["queries_16_p99_ms"] = m.p99_ms
        docs = corpus.texts[128]

        async def batch(client: int, n: int) -> None:
            await target.embed(corpus.take(128, 100, (client * 7919 + n * 100) % len(docs)))

        b = await run_point(batch, 4, seconds, 1.0, 100 * 128, 100, min_requests=2)
        figures["batches_4x100_tokens_per_s"] = b.tokens_per_second
        return figures, m.errors + b.errors, m.first_error or b.first_error
    finally:
        await target.close()


def measure(
    shape: Shape, round_no: int, corpus: corpus_mod.Corpus, lone: int, seconds: float, logs: Path
) -> LayoutRun:
    with fleet_for(shape, logs / f"round{round_no}") as fleet:
        figures, errors, first = asyncio.run(_points(fleet.port, corpus, lone, seconds))
    run = LayoutRun(shape.label, round_no, figures, errors, first)
    shown = "  ".join(f"{k} {v:.1f}" for k, v in figures.items())
    print(f"  round {round_no} {shape.label:12s} {shown}  errors {errors} {first}", flush=True)
    return run


def summary(runs: Sequence[LayoutRun]) -> dict[str, dict[str, float]]:
    """Pure: each layout's median figure over its rounds."""
    by: dict[str, list[LayoutRun]] = {}
    for r in runs:
        by.setdefault(r.layout, []).append(r)
    return {
        name: {
            k: statistics.median(r.figures[k] for r in rs if k in r.figures) for k, _, _ in FIGURES
        }
        for name, rs in by.items()
    }


def table(runs: Sequence[LayoutRun]) -> str:
    """Pure: per layout, the median of each figure over the rounds and its ratio to the first
    layout's (ratio > 1 is better for rates, < 1 for latencies)."""
    medians = summary(runs)
    names = list(medians)
    base = medians[names[0]]
    lines = [
        "| figure | " + " | ".join(names) + " |",
        "|" + " --- |" * (len(names) + 1),
    ]
    for key, what, _ in FIGURES:
        cells = []
        for name in names:
            value = medians[name][key]
            ratio = f" ({value / base[key]:.2f}×)" if name != names[0] and base[key] else ""
            cells.append(f"{value:,.1f}{ratio}")
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.layouts", description=__doc__)
    parser.add_argument("--layout", action="append", default=[], help="repeatable; see above")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (2)")
    parser.add_argument("--lone", type=int, default=12, help="lone requests per length (12)")
    parser.add_argument("--seconds", type=float, default=8.0, help="per load point (8)")
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    args = parser.parse_args(argv)
    shapes = [parse_shape(s) for s in (args.layout or DEFAULT_LAYOUTS)]
    corpus = corpus_mod.load()
    logs = corpus_mod.cache_dir() / "bench-runs" / time.strftime("%Y%m%dT%H%M%S") / "layouts"
    runs = [
        measure(shape, r, corpus, args.lone, args.seconds, logs)
        for r in range(1, args.rounds + 1)
        for shape in shapes
    ]
    print()
    print(table(runs))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
