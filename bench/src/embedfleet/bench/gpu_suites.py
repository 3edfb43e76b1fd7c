"""The seed's suites end to end on a GPU, against the peers in the same run (issue 36).

    python -m embedfleet.bench.gpu_suites --prepared DIR --out DIR [--rehearsal]

For each stand-in model (gpu_models.py: MiniLM, BERT-base and Qwen3-0.6B shapes, random weights,
real tokenizers), three systems through the same points on the same texts, one at a time:

- embedfleet: HTTP to the Rust gateway (the carried binary), gRPC to one worker on the device
  (CUDA graphs, lazy mode with its start-up pre-capture), tokenization and network included;
- sentence-transformers in bf16 on the same device, its own process fed over a pipe (no HTTP);
- transformers-http: a plain `transformers` server (gpu_hf_server.py), the network-fair peer.

Every system's vectors are checked against `transformers` in float32 on the same device first
(fidelity.py's check). After embedfleet's points the worker's /metrics (captures, eager runs,
graph pool, GPU memory) is kept. `--rehearsal`: the same code on the CPU, tiny widths, short
points. Results: suites.json and suites.md in --out, metrics.txt, and the servers' logs.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
import traceback
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedfleet.bench import corpus as corpus_mod
from embedfleet.bench.fidelity import Reference
from embedfleet.bench.gpu_models import (
    FULL,
    MAX_TOKENS,
    REHEARSAL,
    StandIn,
    model_dir,
    prepare_tokenizers,
)
from embedfleet.bench.http_load import Measurement
from embedfleet.bench.peers import Server
from embedfleet.bench.suites import (
    QUERY_TOKENS,
    TINY,
    Point,
    SystemRun,
    Timing,
    plan,
    run_system,
)
from embedfleet.bench.targets import HttpTarget, PipeTarget, Target, cosine_scores
from embedfleet.common.arrays import FloatArray
from embedfleet.common.net import free_ports

SYSTEMS = ("embedfleet", "sentence-transformers", "transformers-http")
SUITES = ("latency", "scoring", "throughput", "concurrency", "queries")
#: the device's points: every suite, short (three systems x three models in ~5 minutes)
DEVICE = Timing(
    seconds=0.6,
    warmup=0.15,
    min_requests=3,
    throughput_seconds=1.5,
    scoring_docs=(5, 50),
    clients=(1, 4, 16),
    query_clients=(1, 16),
)
#: passages per length cut from CPython's own pydoc text (present on every Python)
CORPUS_COUNTS = {QUERY_TOKENS: 32, 128: 48, 512: 48}
#: the worker's /metrics lines kept in the snapshot
METRICS = (
    "embedfleet_worker_graph_",
    "embedfleet_worker_eager_runs",
    "embedfleet_worker_live_graphs",
    "embedfleet_worker_gpu_memory",
    "embedfleet_worker_capacity_tokens_per_second",
    "embedfleet_worker_engine_info",
    "embedfleet_worker_tokens_total",
)
SERVED_NAME = "stand-in"


@dataclass(frozen=True)
class Setup:
    device: str
    dtype: str  # of sentence-transformers and transformers-http
    models: tuple[StandIn, ...]
    timing: Timing
    ready_seconds: float


DEVICE_SETUP = Setup("cuda", "bfloat16", FULL, DEVICE, 300.0)
#: the rehearsal's points: the unit test's, every suite as small as it gets
REHEARSAL_SETUP = Setup("cpu", "float32", REHEARSAL, TINY, 300.0)


# --- here, before the device run -----------------------------------------------------------------

#: what the device run reads from the prepared folder (bench/gpu_check.sh --prepare)
GATEWAY = "bin/embedfleet-gateway"


def prepare(out: Path, gateway: Path) -> None:
    """Everything the device run needs that it cannot make: the real tokenizers, a corpus cut in
    each one's tokens, MiniLM's config and tokenizer (the gpu tests' stand-in), the gateway."""
    import shutil

    from embedfleet.common.modeldir import default_model_path

    shutil.rmtree(out, ignore_errors=True)
    prepare_tokenizers(out / "tokenizers")
    prepare_corpora(out / "tokenizers", out)
    weights = shutil.ignore_patterns("*.safetensors", "*.bin", "*.onnx", "onnx", "openvino")
    shutil.copytree(default_model_path(), out / "minilm", ignore=weights)
    (out / GATEWAY).parent.mkdir(parents=True)
    shutil.copy2(gateway, out / GATEWAY)


def prepare_corpora(tokenizers: Path, out: Path) -> None:
    """One corpus per tokenizer, passages of exact token lengths in that tokenizer."""
    import pydoc_data.topics

    from tokenizers import Tokenizer

    topics = pydoc_data.topics.topics
    paras = [p for name in sorted(topics) for p in corpus_mod.paragraphs(topics[name])]
    for folder in sorted(p for p in tokenizers.iterdir() if p.is_dir()):
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        texts = corpus_mod.passages(tok, paras, CORPUS_COUNTS)
        blob = json.dumps({str(k): v for k, v in sorted(texts.items())}, sort_keys=True)
        digest = hashlib.sha256(blob.encode()).hexdigest()
        built = corpus_mod.Corpus(f"pydoc_data ({folder.name} tokens)", digest, texts)
        corpus_mod.save(built, out / f"corpus-{folder.name}.json")


# --- the reference and the systems ---------------------------------------------------------------


def reference(model: StandIn, path: Path, device: str, corpus: corpus_mod.Corpus) -> Reference:
    """`transformers` in float32 on `device`, one text at a time (no padding involved)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    net = AutoModel.from_pretrained(str(path), torch_dtype=torch.float32).to(device).eval()

    def embed(items: Sequence[str]) -> FloatArray:
        rows = []
        with torch.inference_mode():
            for text in items:
                enc = tok(text, return_tensors="pt").to(device)
                hidden = net(**enc).last_hidden_state[0]
                pooled = hidden[-1] if model.pooling == "lasttoken" else hidden.mean(0)
                rows.append(torch.nn.functional.normalize(pooled, dim=0).cpu().numpy())
        return np.stack(rows).astype(np.float32)

    texts = corpus.texts[128][-4:] + corpus.texts[512][-4:]
    query, docs = corpus.texts[QUERY_TOKENS][-1], corpus.texts[512][-9:-4]
    vectors = embed(texts)
    return Reference(list(texts), vectors, query, docs, cosine_scores(embed([query, *docs])))


@contextmanager
def embedfleet(path: Path, setup: Setup, logs: Path) -> Iterator[tuple[Target, str]]:
    """The worker on the device and the Rust gateway in front: (target, metrics URL)."""
    from embedfleet.testing.gateway import running_gateway
    from embedfleet.testing.workers import running_worker

    args = ["--model", str(path), "--device", setup.device, "--max-input-tokens", str(MAX_TOKENS)]
    args += ["--capacity-measurement", "startup", "--warmup-seconds", "1"]
    with running_worker(logs, *args, name="worker", ready_timeout=setup.ready_seconds) as worker:
        flags = ["--model", str(path), "--served-model-name", SERVED_NAME]
        flags += ["--max-input-tokens", str(MAX_TOKENS), "--max-queue-seconds", "300"]
        flags += ["--upstream-timeout-seconds", "600"]
        with running_gateway(
            [worker.address], *flags, log=logs / "gateway.log", ready_timeout=60
        ) as gateway:
            target = HttpTarget(
                "embedfleet", "127.0.0.1", gateway.port, SERVED_NAME, "/v1/embeddings", "rerank",
                "/v1/rerank",
            )  # fmt: skip
            yield target, f"http://127.0.0.1:{worker.metrics_port}/metrics"


@contextmanager
def transformers_http(
    model: StandIn, path: Path, setup: Setup, logs: Path
) -> Iterator[tuple[Target, str]]:
    (port,) = free_ports(1)
    script = Path(__file__).with_name("gpu_hf_server.py")
    argv = [sys.executable, str(script), str(path), str(port), setup.device, setup.dtype]
    server = Server(
        "transformers-http",
        [*argv, model.pooling],
        {},
        f"http://127.0.0.1:{port}/health",
        logs / "transformers-http.log",
    )
    server.start(setup.ready_seconds)
    try:
        yield (
            HttpTarget(
                "transformers-http", "127.0.0.1", port, SERVED_NAME, "/v1/embeddings", "embed"
            ),
            "",
        )
    finally:
        server.stop()


@contextmanager
def sentence_transformers(path: Path, setup: Setup, logs: Path) -> Iterator[tuple[Target, str]]:
    pipe = PipeTarget(
        "sentence-transformers",
        Path(sys.executable),
        str(path),
        logs / "sentence-transformers.log",
        device=setup.device,
        dtype=setup.dtype,
    )
    yield pipe, ""


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as reply:
        text: str = reply.read().decode()
    return "\n".join(line for line in text.splitlines() if line.startswith(METRICS))


def run_model(
    model: StandIn, setup: Setup, prepared: Path, work: Path, points: Sequence[Point]
) -> dict[str, Any]:
    """Every system through `points` for one model; what failed is recorded, not raised."""
    corpus = corpus_mod.load(prepared / f"corpus-{model.tokenizer}.json")
    path = model_dir(work / "models", model, prepared / "tokenizers")
    ref = reference(model, path, setup.device, corpus)
    out: dict[str, Any] = {"systems": {}, "metrics": ""}
    for system in SYSTEMS:
        logs = work / "logs" / model.name
        run = SystemRun(system, "", "", "")
        started = time.monotonic()
        try:
            if system == "embedfleet":
                opened = embedfleet(path, setup, logs)
            elif system == "sentence-transformers":
                opened = sentence_transformers(path, setup, logs)
            else:
                opened = transformers_http(model, path, setup, logs)
            with opened as (target, metrics_url):
                run.seconds["start"] = time.monotonic() - started
                asyncio.run(_measure(target, run, points, corpus, ref))
                if metrics_url:
                    out["metrics"] = scrape(metrics_url)
        except Exception as exc:  # a system's failure is its result, not the run's end
            run.status = f"failed: {type(exc).__name__}: {exc}"[:400]
            traceback.print_exc()
        print(f"[gpu_suites] {model.name} {system}: {run.status}", flush=True)
        out["systems"][system] = _run_json(run)
    return out


async def _measure(
    target: Target,
    run: SystemRun,
    points: Sequence[Point],
    corpus: corpus_mod.Corpus,
    ref: Reference,
) -> None:
    try:
        await run_system(target, run, points, corpus, ref)
    finally:
        await target.close()


def _run_json(run: SystemRun) -> dict[str, Any]:
    return {
        "status": run.status,
        "fidelity": asdict(run.fidelity) if run.fidelity else None,
        "points": {key: {**asdict(m), **_rates(m)} for key, m in run.points.items()},
        "seconds": run.seconds,
    }


def _rates(m: Measurement) -> dict[str, float]:
    return {
        "texts_per_second": m.requests_per_second * m.inputs_per_request,
        "tokens_per_second": m.tokens_per_second,
    }


# --- the table ----------------------------------------------------------------------------------

#: end-to-end latency targets (issue 36), p50 ms of batch-1 points
P50_TARGETS = {("qwen3-0.6b", "latency/128 tokens"): 1.5, ("minilm", "latency/128 tokens"): 0.8}


def ratio(ours: dict[str, Any], peer: dict[str, Any], point: Point) -> float | None:
    """How many times better we are at `point`: texts/s for throughput and concurrency (several
    requests at once), p50 time for one client."""
    if point.clients > 1 or point.suite == "throughput":
        a, b = ours["texts_per_second"], peer["texts_per_second"]
        return a / b if b else None
    a, b = ours["p50_ms"], peer["p50_ms"]
    return b / a if a else None


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    return f"{row['p50_ms']:.2f} / {row['p99_ms']:.2f} ms, {row['texts_per_second']:,.0f}/s"


def markdown(result: dict[str, Any], points: Sequence[Point]) -> str:
    lines = [
        f"Device: {result.get('device', '?')}; mode: {result['mode']}; end to end over HTTP "
        "(ours: Rust gateway + worker), sentence-transformers over a pipe.",
        "",
    ]
    for name, model in result["models"].items():
        systems = model.get("systems", {})
        lines += [f"### {name}", ""]
        for system, run in systems.items():
            f = run.get("fidelity") or {}
            lines.append(
                f"- {system}: {run['status']}; min cosine vs transformers float32 "
                f"{f.get('min_cosine', float('nan')):.5f}, "
                f"start {run['seconds'].get('start', 0):.1f} s"
            )
        lines += [
            "",
            "| point | embedfleet p50 / p99, texts/s | sentence-transformers | transformers-http "
            "| vs ST | vs HTTP | target |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        rows = {s: systems.get(s, {}).get("points", {}) for s in SYSTEMS}
        for point in points:
            ours = rows["embedfleet"].get(point.key)
            st, hf = (
                rows["sentence-transformers"].get(point.key),
                rows["transformers-http"].get(point.key),
            )
            vs = [ratio(ours, p, point) if ours and p else None for p in (st, hf)]
            target = ">= 1.5x ST"
            if point.key == "concurrency/16 clients":
                target = ">= 3x ST texts/s at <= 0.5x its p99"
            if (name, point.key) in P50_TARGETS:
                target += f"; p50 <= {P50_TARGETS[(name, point.key)]} ms"
            lines.append(
                f"| {point.key} | {_cell(ours)} | {_cell(st)} | {_cell(hf)} | "
                + " | ".join(f"{v:.2f}x" if v else "-" for v in vs)
                + f" | {target} |"
            )
        lines.append("")
    for name, err in result.get("errors", {}).items():
        lines.append(f"- {name} FAILED: {err.strip().splitlines()[-1]}")
    return "\n".join(lines) + "\n"


def run(setup: Setup, prepared: Path, out: Path, work: Path, mode: str) -> dict[str, Any]:
    points = plan(SUITES, setup.timing)
    result: dict[str, Any] = {"mode": mode, "device": _device_name(setup), "models": {}}
    result["errors"] = {}
    metrics: list[str] = []
    for model in setup.models:
        t0 = time.monotonic()
        try:
            got = run_model(model, setup, prepared, work, points)
            metrics.append(f"# {model.name}\n{got.pop('metrics')}")
            result["models"][model.name] = got
        except Exception:
            result["errors"][model.name] = traceback.format_exc()
            print(result["errors"][model.name], flush=True)
        print(f"[gpu_suites] {model.name}: {time.monotonic() - t0:.0f} s", flush=True)
        _write(result, points, metrics, out)  # each model's figures kept if a later one hangs
    return result


def _device_name(setup: Setup) -> str:
    if setup.device != "cuda":
        return "cpu"
    import torch

    return str(torch.cuda.get_device_name())


def _write(result: dict[str, Any], points: Sequence[Point], metrics: list[str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "suites.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "suites.md").write_text(markdown(result, points))
    (out / "metrics.txt").write_text("\n".join(metrics) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.gpu_suites")
    parser.add_argument("--prepared", required=True, type=Path, help="bench/gpu_check.sh's")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--prepare", type=Path, metavar="GATEWAY", help="fill --prepared, here")
    parser.add_argument("--work", type=Path, default=None, help="models and logs (default: tmp)")
    rehearse = os.environ.get("GPU_CHECK_REHEARSAL", "") not in ("", "0")
    parser.add_argument("--rehearsal", action="store_true", default=rehearse)
    args = parser.parse_args(argv)
    if args.prepare:
        prepare(args.prepared, args.prepare)
        print(f"[gpu_suites] prepared {args.prepared}")
        return 0
    if args.out is None:
        parser.error("--out is required to run")
    setup = REHEARSAL_SETUP if args.rehearsal else DEVICE_SETUP
    mode = "rehearsal (cpu, tiny widths)" if args.rehearsal else "full"
    work = args.work or Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu_suites-{os.getpid()}"
    result = run(setup, args.prepared, args.out, work, mode)
    print((args.out / "suites.md").read_text())
    failed = [m for m, r in result["models"].items() if any(
        s["status"] != "ok" for s in r["systems"].values())]  # fmt: skip
    return 1 if result["errors"] or failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
