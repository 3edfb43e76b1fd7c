"""The results: a JSON record of everything and a markdown table of figures and ratios.

Ratios are embedfleet's figure over each peer's on the same point, and over the best peer's
figure by figure (a row per point): tokens/s ratio > 1 and latency ratio < 1 mean embedfleet is
better. A peer without figures keeps its row with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from embedfleet.bench.fidelity import DRIFT_LIMIT, Fidelity
from embedfleet.bench.http_load import Measurement
from embedfleet.bench.suites import SUITES, Point, SystemRun
from embedfleet.bench.targets import SCORE_VIA_DOC

OURS = "embedfleet"


def to_json(
    runs: Sequence[SystemRun], points: Sequence[Point], meta: dict[str, Any]
) -> dict[str, Any]:
    def measurement(m: Measurement) -> dict[str, Any]:
        d = dataclasses.asdict(m)
        d["tokens_per_second"] = m.tokens_per_second
        d["requests_per_second"] = m.requests_per_second
        return d

    return {
        "meta": meta,
        "points": [dataclasses.asdict(p) | {"key": p.key} for p in points],
        "systems": [
            {
                "name": r.name,
                "version": r.version,
                "setting": r.setting,
                "score_via": r.score_via,
                "status": r.status,
                "fidelity": dataclasses.asdict(r.fidelity) if r.fidelity else None,
                "points": {k: measurement(m) for k, m in r.points.items()},
                "seconds": r.seconds,
                "peak_rss_mb": r.peak_rss_mb,
            }
            for r in runs
        ],
    }


def _num(x: float, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:,.{digits}f}"


def _ratio(ours: float, theirs: float) -> str:
    if not theirs or math.isnan(ours) or math.isnan(theirs) or theirs == 0:
        return "–"
    return f"{ours / theirs:.2f}×"


def _fidelity_cell(f: Fidelity | None) -> str:
    if f is None:
        return "–"
    flag = " **DRIFT > 0.1%**" if f.flagged else ""
    return f"{f.min_cosine:.6f}{flag}"


def systems_table(runs: Sequence[SystemRun]) -> str:
    rows = [
        "| system | version | setting | scoring via | min cosine vs transformers | "
        "max score error | peak RSS MiB | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        err = _num(r.fidelity.max_score_error, 6) if r.fidelity else "–"
        via = SCORE_VIA_DOC.get(r.score_via, r.score_via)  # type: ignore[call-overload]
        rss = _num(r.peak_rss_mb) if r.peak_rss_mb is not None else "–"
        rows.append(
            f"| {r.name} | {r.version} | {r.setting} | {via}"
            f" | {_fidelity_cell(r.fidelity)} | {err} | {rss} | {r.status} |"
        )
    return "\n".join(rows)


def best_peer(
    runs: Sequence[SystemRun], key: str, metric: str, higher: bool
) -> tuple[str, Measurement] | None:
    """The peer (not embedfleet) with the best figure of `metric` at point `key`; None if none
    measured it. Errored runs compete too: their rows say so."""
    peers = [
        (r.name, r.points[key])
        for r in runs
        if r.name != OURS and key in r.points and not math.isnan(_metric(r.points[key], metric))
    ]
    if not peers:
        return None
    pick = max if higher else min
    return pick(peers, key=lambda p: _metric(p[1], metric))


def least_memory(runs: Sequence[SystemRun]) -> SystemRun | None:
    """The peer (not embedfleet) whose processes peaked lowest; None if none was measured."""
    measured = [r for r in runs if r.name != OURS and r.peak_rss_mb is not None]
    return min(measured, key=lambda r: r.peak_rss_mb or 0.0, default=None)


def _versus_best(mine: Measurement, runs: Sequence[SystemRun], key: str) -> list[str]:
    """Cells of the "embedfleet ÷ best peer" row: tok/s, req/s, p50, p99, each against the peer
    best at that very figure."""
    cells = []
    for metric, higher in (
        ("tokens_per_second", True),
        ("requests_per_second", True),
        ("p50_ms", False),
        ("p99_ms", False),
    ):
        best = best_peer(runs, key, metric, higher)
        if best is None:
            cells.append("–")
            continue
        name, m = best
        cells.append(f"{_ratio(_metric(mine, metric), _metric(m, metric))} ({name})")
    return cells


def suite_table(suite: str, points: Sequence[Point], runs: Sequence[SystemRun]) -> str:
    """One row per (point, system); the ratio columns compare embedfleet with that row. Each
    point ends with a row of embedfleet's figures over the best peer's, figure by figure."""
    ours = next((r for r in runs if r.name == OURS), None)
    rows = [
        "| point | system | tok/s | req/s | p50 ms | p99 ms | embedfleet tok/s ratio | "
        "embedfleet p50 ratio | embedfleet p99 ratio |",
        "|" + " --- |" * 9,
    ]
    for p in (p for p in points if p.suite == suite):
        mine = ours.points.get(p.key) if ours else None
        for r in runs:
            m = r.points.get(p.key)
            if m is None:
                why = r.status if r.status != "ok" else "no result"
                rows.append(f"| {p.label} | {r.name} | {why} | | | | | | |")
                continue
            bad = f" ({m.errors} errors)" if m.errors else ""
            cells = [
                p.label,
                r.name,
                _num(m.tokens_per_second) + bad,
                _num(m.requests_per_second, 1),
                _num(m.p50_ms, 1),
                _num(m.p99_ms, 1),
            ]
            if mine is not None and r.name != OURS:
                cells += [
                    _ratio(mine.tokens_per_second, m.tokens_per_second),
                    _ratio(mine.p50_ms, m.p50_ms),
                    _ratio(mine.p99_ms, m.p99_ms),
                ]
            else:
                cells += [""] * 3
            rows.append("| " + " | ".join(cells) + " |")
        if mine is not None:
            versus = _versus_best(mine, runs, p.key)
            rows.append(
                f"| {p.label} | **embedfleet ÷ best peer** | " + " | ".join(versus) + " | | | |"
            )
    return "\n".join(rows)


#: the issue's targets: (point key, metric, higher is better, required ratio ours/best peer)
TARGETS = (
    ("throughput/4x100x512", "tokens_per_second", True, 1.3),
    ("concurrency/16 clients", "requests_per_second", True, 2.0),
    ("concurrency/16 clients", "p99_ms", False, 0.6),
    ("latency/128 tokens", "p50_ms", False, 0.7),
)
#: peak resident memory, all of a system's processes, over the leanest peer's (issue 18)
RSS_TARGET = 1.0


def _metric(m: Measurement, metric: str) -> float:
    return float(getattr(m, metric))


def targets_table(runs: Sequence[SystemRun]) -> str:
    """Each target against the best peer on that very metric (met or not, as measured)."""
    ours = next((r for r in runs if r.name == OURS), None)
    rows = [
        "| target | embedfleet | best peer | ratio | needed | met |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, metric, higher, needed in TARGETS:
        mine = ours.points.get(key) if ours else None
        found = best_peer(runs, key, metric, higher)
        if mine is None or found is None:
            rows.append(f"| {key} {metric} | – | – | – | {needed}× | not measured |")
            continue
        name, best = found
        ratio = _metric(mine, metric) / _metric(best, metric)
        met = ratio >= needed if higher else ratio <= needed
        rows.append(
            f"| {key} {metric} | {_num(_metric(mine, metric), 1)} | {name} "
            f"{_num(_metric(best, metric), 1)} | {ratio:.2f}× | {'≥' if higher else '≤'} "
            f"{needed}× | {'yes' if met else 'no'} |"
        )
    lean = least_memory(runs)
    if ours is None or ours.peak_rss_mb is None or lean is None or lean.peak_rss_mb is None:
        rows.append(f"| peak RSS MiB | – | – | – | {RSS_TARGET}× | not measured |")
    else:
        ratio = ours.peak_rss_mb / lean.peak_rss_mb
        rows.append(
            f"| peak RSS MiB | {_num(ours.peak_rss_mb)} | {lean.name} {_num(lean.peak_rss_mb)} "
            f"| {ratio:.2f}× | ≤ {RSS_TARGET}× | {'yes' if ratio <= RSS_TARGET else 'no'} |"
        )
    return "\n".join(rows)


SUITE_TITLES = {
    "latency": "1. Low-latency embedding (batch 1, one client)",
    "scoring": "2. Low-latency scoring (a 32-token query vs N documents of 512 tokens, one client)",
    "throughput": "3. High throughput (clients x texts per batch x tokens per text)",
    "concurrency": "4. High concurrency (single 128-token texts, N concurrent clients)",
    "queries": "5. Short queries (single 32-token texts, N concurrent clients)",
}


def markdown(
    runs: Sequence[SystemRun], points: Sequence[Point], meta: dict[str, Any], plots: Sequence[str]
) -> str:
    lines = [
        "# embedfleet benchmarks",
        "",
        f"Generated by `{meta['command']}` on {meta['date']} ({meta['mode']} mode).",
        f"Machine: {meta['machine']}.",
        f"Model: {meta['model']}; corpus: {meta['corpus']}.",
        "All calls end to end over HTTP on 127.0.0.1 with tokenization included (the "
        "sentence-transformers peers run in a process of their own and take texts over a pipe: no "
        "HTTP). Closed-loop clients, warm-up discarded; tokens include [CLS]/[SEP]. Ratios are "
        "embedfleet ÷ peer: tok/s above 1× and latency below 1× favour embedfleet. Peak RSS is "
        "the sum of the peak resident memory (VmHWM) of each of a system's processes, read after "
        "its last suite.",
        "",
    ]
    if meta.get("noisy"):
        lines += [f"> **Noisy figures:** {meta['noisy']}", ""]
    lines += ["## Systems and fidelity", "", systems_table(runs), ""]
    lines += [
        f"Fidelity: each system embeds {meta['fidelity_inputs']} corpus texts (128 and 512 tokens, "
        "one mixed batch and singles) and scores a query against 5 documents; compared with "
        "`transformers` float32 (mean pooling, normalized). Drift above "
        f"{DRIFT_LIMIT:.1%} (min cosine < {1 - DRIFT_LIMIT}) is flagged.",
        "",
    ]
    for suite in SUITES:
        if any(p.suite == suite for p in points):
            lines += [f"## {SUITE_TITLES[suite]}", "", suite_table(suite, points, runs), ""]
    lines += ["## Targets (issues 9 and 18) against the best peer per metric", ""]
    lines += [targets_table(runs), ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    lines += ["## Where the time went", "", timing_table(runs, meta), ""]
    return "\n".join(lines)


def timing_table(runs: Sequence[SystemRun], meta: dict[str, Any]) -> str:
    phases = ["install", "start", "fidelity", *SUITES, "stop"]
    rows = ["| system | " + " | ".join(phases) + " | total |", "|" + " --- |" * (len(phases) + 2)]
    for r in runs:
        cells = [_num(r.seconds[k]) if k in r.seconds else "–" for k in phases]
        rows.append(f"| {r.name} | " + " | ".join(cells) + f" | {_num(sum(r.seconds.values()))} |")
    rows.append(f"\nWhole run: {meta.get('total_seconds', 0):.0f} s (seconds per phase above).")
    return "\n".join(rows)


def write(out_dir: Path, doc: dict[str, Any], text: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out_dir / "results.md").write_text(text)
