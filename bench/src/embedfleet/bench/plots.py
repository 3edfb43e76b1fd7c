"""PNG plots for docs/benchmarks: latency vs concurrency, throughput bars, batch-1 latency."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from embedfleet.bench.suites import Point, SystemRun


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    return plt


def latency_vs_concurrency(runs: Sequence[SystemRun], points: Sequence[Point], out: Path) -> bool:
    conc = [p for p in points if p.suite == "concurrency"]
    if not conc:
        return False
    plt = _pyplot()
    fig, (ax_lat, ax_rps) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in runs:
        xs = [p.clients for p in conc if p.key in r.points]
        if not xs:
            continue
        ms = [r.points[p.key] for p in conc if p.key in r.points]
        (line,) = ax_lat.plot(xs, [m.p50_ms for m in ms], marker="o", label=f"{r.name} p50")
        ax_lat.plot(
            xs,
            [m.p99_ms for m in ms],
            marker="x",
            ls="--",
            color=line.get_color(),
            label=f"{r.name} p99",
        )
        ax_rps.plot(xs, [m.requests_per_second for m in ms], marker="o", label=r.name)
    for ax in (ax_lat, ax_rps):
        ax.set_xscale("log", base=2)
        ax.set_xticks([p.clients for p in conc], [str(p.clients) for p in conc])
        ax.set_xlabel("concurrent clients (one 128-token text per request)")
        ax.grid(True, alpha=0.3)
    ax_lat.set_ylabel("latency (ms)")
    ax_lat.set_yscale("log")
    ax_rps.set_ylabel("requests/s")
    ax_lat.legend(fontsize=7)
    ax_rps.legend(fontsize=7)
    fig.suptitle("High concurrency: latency and requests/s vs clients")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def _bars(
    runs: Sequence[SystemRun],
    points: Sequence[Point],
    suite: str,
    metric: str,
    ylabel: str,
    title: str,
    out: Path,
) -> bool:
    chosen = [p for p in points if p.suite == suite]
    have = [r for r in runs if any(p.key in r.points for p in chosen)]
    if not chosen or not have:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(chosen) * len(have) / 2), 4.0))
    width = 0.8 / len(have)
    for i, r in enumerate(have):
        values = [getattr(r.points[p.key], metric) if p.key in r.points else 0.0 for p in chosen]
        xs = [j + i * width for j in range(len(chosen))]
        bars = ax.bar(xs, values, width, label=r.name)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(
        [j + width * (len(have) - 1) / 2 for j in range(len(chosen))], [p.label for p in chosen]
    )
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def write_all(runs: Sequence[SystemRun], points: Sequence[Point], out_dir: Path) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    target = out_dir / "latency_vs_concurrency.png"
    if latency_vs_concurrency(runs, points, target):
        written.append(str(target))
    for name, suite, metric, ylabel, title in (
        ("throughput.png", "throughput", "tokens_per_second", "tokens/s", "High throughput"),
        ("latency_batch1.png", "latency", "p50_ms", "p50 latency (ms)", "Batch-1 latency"),
        ("scoring.png", "scoring", "p50_ms", "p50 latency (ms)", "Scoring latency"),
    ):
        target = out_dir / name
        if _bars(runs, points, suite, metric, ylabel, title, target):
            written.append(str(target))
    return written
