"""The device check's measurements (issue 19), one JSON and one markdown table.

    python -m embedfleet.bench.gpu_check --out DIR [--rehearsal]

On CUDA: batch-1 latency at 128 and 512 tokens, CUDA graphs against eager, for MiniLM and a
Qwen3-0.6B-shaped model; throughput on 16k-token batches (32 x 512) for MiniLM, a BERT-base-shaped
110M model and the Qwen3 shape (random weights, bf16); aggregate throughput with 1 and 4 engine
processes on the one GPU (enginesPerGPU) for the two small models. Each figure sits next to the
issue's target.

`--rehearsal` (or GPU_CHECK_REHEARSAL=1): the same code paths on the CPU with tiny model shapes
and short runs, the graph figures marked skipped, engines 1 vs 2, so the script is known to run
before any device time is spent on it. A section that fails is recorded with its error and the
exit code is 1; the others still run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedfleet.bench.gpu_peak import Peak, dense_bf16_peak
from embedfleet.bench.random_models import (
    BERT_BASE,
    MINILM,
    QWEN3_06B,
    TINY_BERT,
    TINY_QWEN3,
    BertShape,
    Qwen3Shape,
    bert_dir,
    matmul_params,
    qwen3_dir,
)


@dataclass(frozen=True)
class Sizes:
    device: str
    models: dict[str, BertShape | Qwen3Shape]
    latency_tokens: tuple[int, ...]
    latency_runs: int
    batch: tuple[int, int]  # sequences x tokens per sequence: one 16k-token batch on a GPU
    batches: int
    engines: tuple[int, ...]
    engine_batch: tuple[int, int]
    engine_seconds: float
    engine_models: tuple[str, ...] = ("minilm", "bert-base")


FULL = Sizes(
    device="cuda",
    models={"minilm": MINILM, "bert-base": BERT_BASE, "qwen3-0.6b": QWEN3_06B},
    latency_tokens=(128, 512),
    latency_runs=200,
    batch=(32, 512),
    batches=20,
    engines=(1, 4),
    engine_batch=(16, 256),
    engine_seconds=8.0,
)
REHEARSAL = Sizes(
    device="cpu",
    models={"minilm": TINY_BERT, "bert-base": TINY_BERT, "qwen3-0.6b": TINY_QWEN3},
    latency_tokens=(128, 512),
    latency_runs=3,
    batch=(4, 128),
    batches=2,
    engines=(1, 2),
    engine_batch=(4, 64),
    engine_seconds=0.5,
    engine_models=("minilm",),
)
LATENCY_MODELS = ("minilm", "qwen3-0.6b")


def _vocab(shape: BertShape | Qwen3Shape) -> int:
    return shape.vocab


def _items(seqs: int, length: int, vocab: int, seed: int) -> list[Any]:
    from embedfleet.common.codec import Tokens
    from embedfleet.worker.contract import WorkItem

    rng = np.random.default_rng(seed)
    ids = rng.integers(min(1000, vocab - 1) // 2, vocab, seqs * length).astype(np.int32)
    return [WorkItem(Tokens(ids, np.full(seqs, length, np.int32)))]


def _engine(model: Path, device: str, graphs: str, fraction: float = 0.0, threads: int = 0) -> Any:
    from embedfleet.worker.engine.config import EngineConfig
    from embedfleet.worker.engine.torch_engine import TorchEngine

    return TorchEngine(
        EngineConfig(
            model=str(model),
            device=device,
            cuda_graphs=graphs,  # type: ignore[arg-type]
            max_input_tokens=512,
            cuda_memory_fraction=fraction,
            threads=threads,
        )
    )


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def latency(sizes: Sizes, dirs: dict[str, Path]) -> dict[str, Any]:
    """Median batch-1 time of one engine step + wait, graphs against eager."""
    from embedfleet.common.similarity import min_cosine

    out: dict[str, Any] = {}
    cuda = sizes.device == "cuda"
    for name in LATENCY_MODELS:
        vocab = _vocab(sizes.models[name])
        eager = _engine(dirs[name], sizes.device, "off")
        graphed = _engine(dirs[name], sizes.device, "lazy") if cuda else None
        for tokens in sizes.latency_tokens:
            items = _items(1, tokens, vocab, seed=tokens)
            row: dict[str, Any] = {}
            for label, engine in (("eager", eager), ("graphs", graphed)):
                if engine is None:
                    row[f"{label}_ms"] = "skipped (no CUDA)"
                    continue
                for _ in range(5):  # eager, capture, replays: graphs are warm before timing
                    engine.run(items)
                times = []
                for _ in range(sizes.latency_runs):
                    start = time.perf_counter()
                    engine.run(items)
                    times.append(time.perf_counter() - start)
                row[f"{label}_ms"] = 1e3 * statistics.median(times)
            if graphed is not None:
                row["speedup"] = row["eager_ms"] / row["graphs_ms"]
                row["cosine"] = min_cosine(graphed.run(items)[0], eager.run(items)[0])
                row["graph_rejects"] = graphed.counters().rejects
            out[f"{name}@{tokens}"] = row
        out[f"{name}_attention"] = eager.backend.name
    return out


def device_peak(device: str) -> Peak | None:
    """The dense bf16 peak of the device the figures run on (None on a CPU or an unknown GPU)."""
    if device != "cuda":
        return None
    import torch

    return dense_bf16_peak(torch.cuda.get_device_name())


def throughput(sizes: Sizes, dirs: dict[str, Path]) -> dict[str, Any]:
    """Tokens/s on full batches, every batch launched before the first is read (async path)."""
    out: dict[str, Any] = {}
    peak = device_peak(sizes.device)
    seqs, length = sizes.batch
    for name, shape in sizes.models.items():
        engine = _engine(dirs[name], sizes.device, "lazy" if sizes.device == "cuda" else "off")
        items = _items(seqs, length, _vocab(shape), seed=7)
        for _ in range(3):
            engine.run(items)
        _sync(sizes.device)
        start = time.perf_counter()
        pending = [engine.step(items) for _ in range(sizes.batches)]
        for p in pending:
            p.wait()
        seconds = time.perf_counter() - start
        tokens_s = seqs * length * sizes.batches / seconds
        tflops = 2 * matmul_params(shape) * tokens_s / 1e12
        out[name] = {
            "batch_tokens": seqs * length,
            "tokens_per_second": tokens_s,
            "tflops": tflops,
            "peak": peak.label if peak else None,
            "peak_tflops": peak.tflops if peak else None,
            "fraction_of_peak": tflops / peak.tflops if peak else None,
            "dtype": engine.info.dtype,
            "graphs": engine.counters().replays > 0,
        }
    return out


def _engine_process(
    args: tuple[str, str, float, int, tuple[int, int], int, float], start: Any, out: Any
) -> None:
    model, device, fraction, threads, (seqs, length), vocab, seconds = args
    graphs = "lazy" if device == "cuda" else "off"
    engine = _engine(Path(model), device, graphs, fraction, threads)
    items = _items(seqs, length, vocab, seed=os.getpid())
    for _ in range(3):
        engine.run(items)
    _sync(device)
    out.put("ready")
    start.wait()
    t0 = time.perf_counter()
    done = 0
    pending = [engine.step(items)]
    while time.perf_counter() - t0 < seconds:
        pending.append(engine.step(items))  # two in flight: launch the next, then read one
        pending.pop(0).wait()
        done += seqs * length
    for p in pending:
        p.wait()
        done += seqs * length
    out.put((done, time.perf_counter() - t0))


def _collect(results: Any, procs: Sequence[Any], n: int, seconds: float = 600.0) -> list[Any]:
    """n messages from the engine processes; an engine that dies first fails the section at
    once (the first device run waited out its whole timeout on an engine dead at start)."""
    got: list[Any] = []
    deadline = time.monotonic() + seconds
    while len(got) < n:
        try:
            got.append(results.get(timeout=1.0))
            continue
        except queue.Empty:
            pass
        dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError(f"an engine process exited with {dead[0]} before reporting")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n - len(got)} engine processes silent for {seconds:.0f} s")
    return got


def engines(sizes: Sizes, dirs: dict[str, Path]) -> dict[str, Any]:
    """Aggregate tokens/s of N engine processes on one device, as enginesPerGPU runs them."""
    ctx = mp.get_context("spawn")
    out: dict[str, Any] = {}
    for name in sizes.engine_models:
        row: dict[str, Any] = {}
        for n in sizes.engines:
            fraction = 0.9 / n if sizes.device == "cuda" else 0.0
            # On a CPU one thread per engine: torch counts the host's cores, not the cgroup's,
            # and oversubscribed OpenMP barriers would make the comparison meaningless.
            threads = 1 if sizes.device == "cpu" else 0
            vocab = _vocab(sizes.models[name])
            batch, seconds = sizes.engine_batch, sizes.engine_seconds
            args = (str(dirs[name]), sizes.device, fraction, threads, batch, vocab, seconds)
            start, results = ctx.Event(), ctx.Queue()
            procs = [
                ctx.Process(target=_engine_process, args=(args, start, results)) for _ in range(n)
            ]
            for p in procs:
                p.start()
            try:
                _collect(results, procs, n)  # every engine loaded and warm
                start.set()
                got = _collect(results, procs, n)
            finally:
                for p in procs:
                    p.join(timeout=10)
                    if p.is_alive():
                        p.kill()
            tokens = sum(t for t, _ in got)
            seconds = max(s for _, s in got)
            row[f"engines_{n}_tokens_per_second"] = tokens / seconds
        first, last = sizes.engines[0], sizes.engines[-1]
        row["gain"] = (
            row[f"engines_{last}_tokens_per_second"] / row[f"engines_{first}_tokens_per_second"]
        )
        out[name] = row
    return out


def environment(sizes: Sizes) -> dict[str, Any]:
    import torch

    from embedfleet.worker.engine.attention import available_backends

    dtype = torch.bfloat16 if sizes.device == "cuda" else torch.float32
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if sizes.device == "cuda" else "cpu",
        "attention_backends": [
            b.name for b in available_backends(torch.device(sizes.device), dtype)
        ],
    }
    for module in ("flash_attn", "flashinfer"):
        try:
            __import__(module)
            env[module] = True
        except Exception:
            env[module] = False
    return env


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, int | float) else str(value)


def markdown(result: dict[str, Any]) -> str:
    """The table for docs/benchmarks/gpu.md: figure, value, target."""
    env = result.get("environment", {})
    rows = [
        f"Device: {env.get('device', '?')}; torch {env.get('torch', '?')}; attention backends "
        f"{env.get('attention_backends', '?')}; mode: {result['mode']}",
        "",
        "| figure | value | target |",
        "| --- | --- | --- |",
    ]
    lat = result.get("latency", {})
    for key, row in lat.items():
        if not isinstance(row, dict):
            continue
        target = "<= 0.7 ms (graphs)" if key == "qwen3-0.6b@128" else ""
        rows.append(
            f"| batch-1 {key} tokens, graphs / eager (ms) | {_num(row.get('graphs_ms'), '.3f')} "
            f"/ {_num(row.get('eager_ms'), '.3f')} | {target} |"
        )
        if "speedup" in row:
            rows.append(
                f"| batch-1 {key}: graphs speedup, cosine | {row['speedup']:.2f}x, "
                f"{row['cosine']:.5f} | >= 3x, >= 0.999 |"
            )
    for name, row in result.get("throughput", {}).items():
        if not isinstance(row, dict):
            continue
        target = ">= 40% of peak" if name in ("bert-base", "qwen3-0.6b") else ""
        share = (
            f"{row['fraction_of_peak']:.1%} of {row['peak']} ({row['peak_tflops']:.0f})"
            if row.get("fraction_of_peak") is not None
            else "no share (no known peak for this device)"
        )
        rows.append(
            f"| {name} {row['batch_tokens']}-token batches ({row['dtype']}) | "
            f"{row['tokens_per_second']:,.0f} tok/s, {row['tflops']:.1f} TFLOP/s, {share} "
            f"| {target} |"
        )
    for name, row in result.get("engines", {}).items():
        if not isinstance(row, dict):
            continue
        counts = [k for k in row if k.startswith("engines_")]
        values = ", ".join(f"{k.split('_')[1]}: {row[k]:,.0f}" for k in counts)
        target = ">= 1.5M tok/s with engines" if name == "bert-base" else ""
        rows.append(
            f"| {name} engines per GPU (tok/s) | {values}; gain {row['gain']:.2f}x | {target} |"
        )
    for section, err in result.get("errors", {}).items():
        rows.append(f"| {section} | FAILED: {err.splitlines()[-1] if err else ''} | |")
    return "\n".join(rows) + "\n"


SECTIONS: dict[str, Callable[[Sizes, dict[str, Path]], dict[str, Any]]] = {
    "latency": latency,
    "throughput": throughput,
    "engines": engines,
}


def run(sizes: Sizes, out: Path, mode: str, only: Sequence[str] = ()) -> dict[str, Any]:
    result: dict[str, Any] = {"mode": mode, "errors": {}}
    result["environment"] = environment(sizes)
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        dirs = {}
        for name, shape in sizes.models.items():
            make = qwen3_dir if isinstance(shape, Qwen3Shape) else bert_dir
            dirs[name] = make(Path(tmp) / name, shape)  # type: ignore[arg-type]
        timings["models"] = time.perf_counter() - t0
        for section, measure in SECTIONS.items():
            if only and section not in only:
                continue
            t0 = time.perf_counter()
            try:
                result[section] = measure(sizes, dirs)
            except Exception:
                result["errors"][section] = traceback.format_exc()
            timings[section] = time.perf_counter() - t0
            print(f"[gpu_check] {section}: {timings[section]:.1f} s", flush=True)
            result["seconds"] = timings
            _write(result, out)  # each section's figures kept even if a later one hangs
    result["seconds"] = timings
    _write(result, out)
    return result


def _write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "gpu_check.md").write_text(markdown(result))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.gpu_check")
    parser.add_argument("--out", required=True)
    rehearse = os.environ.get("GPU_CHECK_REHEARSAL", "") not in ("", "0")
    parser.add_argument("--rehearsal", action="store_true", default=rehearse)
    parser.add_argument("--only", default="", help="comma-separated sections")
    args = parser.parse_args(argv)
    sizes = REHEARSAL if args.rehearsal else FULL
    mode = "rehearsal (cpu, tiny shapes)" if args.rehearsal else "full"
    only = [s for s in args.only.split(",") if s]
    result = run(sizes, Path(args.out), mode, only)
    print(markdown(result))
    for section, err in result["errors"].items():
        print(f"[gpu_check] {section} FAILED:\n{err}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
