"""Overload and abuse figures for the gateway through a real local fleet (`Fleet`: the gateway and
worker processes on 127.0.0.1), the benchmark side of tests/stress/.

    python -m embedfleet.bench.overload [--suites overload,batch,slowloris,shapes]
        [--engine null|torch]

- overload: N clients (64) for S seconds (30) of mixed sizes (1-100 texts of 5-500 words),
  honouring Retry-After; goodput (tokens/s answered, first request to last answer) against the
  capacity the workers measured at warm-up in the same run, the 429 count, the work in flight when
  each 429 came, 5xx, timeouts, admitted latency, worker deadline drops, goodput against the
  capacity the workers reported while saturated (their own batches' figure); and where
  goodput went against the warm-up figure: the workers' busy fraction, computed tokens not
  answered, their rate while computing (`busy_capacity`) and the CPU they, the gateway and the
  load generator got.
- batch: issue 18's indexing load, 4 clients x 100 texts of 512 tokens on ONE worker, with the
  gateway's defaults: how many were queued and answered, how many refused.
- slowloris: short-query p50/p99 under 5,000 stalled connections from a process of their own,
  against an identical unattacked fleet loaded in the same seconds (the control).
- shapes: whether the capacity the overload suite holds goodput to fits its traffic: one-thread
  MiniLM's tokens per CPU-second (robust to the machine's other jobs) on the warm-up probe's
  requests, on 128-token sequences (the probe before it ran at the model's limit) and on the
  overload suite's own texts, interleaved in one process, batches of `--shape-batch-tokens`.

`--engine null` workers are paced (`--pace` tokens/s each, asleep), so their capacity does not move
with the machine's other jobs; `--engine torch` runs the bundled MiniLM on CPU. Figures print as
lines and, with `--out`, as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.common.net import free_ports
from embedfleet.fleet.supervisor import Fleet
from embedfleet.testing.overload import (
    NORMAL_INTERVAL,
    Outcome,
    closed_loop,
    mixed_bodies,
    short_requests,
    summarize,
    words_of,
)
from embedfleet.testing.procfs import tree_cpu_seconds
from embedfleet.testing.slowloris import raise_open_files, stalled
from embedfleet.testing.workers import metric_value, scrape

SUITES = ("overload", "batch", "slowloris", "shapes")
SATURATED = "embedfleet_worker_saturated_tokens_per_second"


def worker_args(engine: str, pace: float, max_tokens: int = 0) -> list[str]:
    # Capacity measured before the worker serves: the load starts at once, so a background
    # measurement (the default) would wait for an idle second that never comes, and admission
    # with no capacity to measure the queue by admits everything.
    args = ["--engine", engine, "--capacity-measurement", "startup"]
    if engine == "null":
        args += ["--warmup-seconds", "1", "--null-tokens-per-second", str(pace)]
    else:
        args += ["--device", "cpu"]
    if max_tokens:
        args += ["--max-input-tokens", str(max_tokens)]
    return args


def _fleet(workers: int, args: Sequence[str], gateway: Sequence[str], log_dir: Path) -> Fleet:
    (port,) = free_ports(1)
    return Fleet(workers, port=port, worker_args=args, gateway_args=gateway, log_dir=log_dir)


def worker_sum(fleet: Fleet, name: str, **labels: str) -> float:
    """One metric summed over the fleet's workers (each serves its own /metrics)."""
    ports = (int(c.argv[c.argv.index("--metrics-port") + 1]) for c in fleet.worker_children)
    return sum(metric_value(scrape(port), name, **labels) for port in ports)


def _capacity(fleet: Fleet) -> float:
    capacity = worker_sum(fleet, "embedfleet_worker_capacity_tokens_per_second")
    if capacity <= 0:
        raise RuntimeError("the workers report no measured capacity: nothing to hold goodput to")
    return capacity


@dataclass(frozen=True)
class WorkerWork:
    """What one worker computed in a run: tokens, seconds of compute, CPU seconds (its tree)."""

    tokens: float
    compute_seconds: float
    cpu_seconds: float

    def __sub__(self, other: WorkerWork) -> WorkerWork:
        return WorkerWork(
            self.tokens - other.tokens,
            self.compute_seconds - other.compute_seconds,
            self.cpu_seconds - other.cpu_seconds,
        )


def _work(fleet: Fleet) -> list[WorkerWork]:
    out = []
    for child in fleet.worker_children:
        text = scrape(int(child.argv[child.argv.index("--metrics-port") + 1]))
        pid = child.process.pid if child.process else 0
        out.append(
            WorkerWork(
                metric_value(text, "embedfleet_worker_tokens_total"),
                metric_value(text, "embedfleet_worker_compute_seconds_sum"),
                tree_cpu_seconds(pid) if pid else 0.0,
            )
        )
    return out


def busy_capacity(work: Sequence[WorkerWork]) -> float:
    """Tokens/s the workers computed while computing, together: their capacity in the run's own
    seconds, on whatever share of the machine they had then. Goodput against it leaves out what
    the machine's other jobs took and keeps what overload can waste: idle workers, and work
    computed for requests that were not answered."""
    return sum(w.tokens / w.compute_seconds for w in work if w.compute_seconds > 0)


async def _sampled(
    fleet: Fleet, args: argparse.Namespace, bodies: Sequence[bytes]
) -> tuple[list[Outcome], list[float]]:
    """The closed-loop load, and the workers' saturated figure summed once a second meanwhile."""
    samples: list[float] = []

    async def sample() -> None:
        while True:
            await asyncio.sleep(1.0)
            samples.append(await asyncio.to_thread(worker_sum, fleet, SATURATED))

    sampler = asyncio.create_task(sample())
    try:
        outcomes = await closed_loop(
            "127.0.0.1", fleet.port, args.clients, args.seconds, bodies, timeout=180
        )
    finally:
        sampler.cancel()
    return outcomes, samples


def overload(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    words = words_of(list(load_model_dir(default_model_path()).tokenizer().get_vocab()))
    bodies = mixed_bodies(words, seed=args.seed, count=300)
    gateway = []
    if args.max_queue_seconds:
        gateway += ["--max-queue-seconds", str(args.max_queue_seconds)]
    if args.upstream_timeout_seconds:
        gateway += ["--upstream-timeout-seconds", str(args.upstream_timeout_seconds)]
    with _fleet(args.workers, worker_args(args.engine, args.pace), gateway, log_dir) as fleet:
        capacity = _capacity(fleet)
        gateway_pid = fleet.children[-1].process.pid if fleet.children[-1].process else 0
        before, gateway_cpu, own_cpu = (
            _work(fleet),
            tree_cpu_seconds(gateway_pid),
            time.process_time(),
        )
        start = time.monotonic()
        outcomes, saturated_samples = asyncio.run(_sampled(fleet, args, bodies))
        wall = time.monotonic() - start
        work = [b - a for a, b in zip(before, _work(fleet), strict=True)]
        gateway_cpu = (tree_cpu_seconds(gateway_pid) - gateway_cpu) / wall
        own_cpu = (time.process_time() - own_cpu) / wall
        drops = worker_sum(fleet, "embedfleet_worker_dropped_requests_total", reason="deadline")
    # The figure admission queued by once the workers had been saturated, over the run (each
    # second's sum over the workers; 0 before any had been).
    known = [x for x in saturated_samples if x > 0]
    saturated = sum(known) / len(known) if known else 0.0
    s = summarize(outcomes, capacity)
    busy = busy_capacity(work)
    answered = sum(o.tokens for o in outcomes if o.status == 200)
    computed = sum(w.tokens for w in work)
    print(
        f"overload: {args.clients} clients x {args.seconds:.0f}s, {args.workers} {args.engine} "
        f"worker(s): {s.requests} requests, {s.ok} answered, {s.shed} shed (429, "
        f"{s.shed_without_retry_after} without Retry-After), 5xx {s.server_errors or 0}, "
        f"no answer {s.no_answer}; goodput {s.goodput:.0f} tokens/s = {s.goodput_ratio:.3f} x "
        f"measured capacity {capacity:.0f}; admitted p50 {s.ok_p50_seconds:.2f}s max "
        f"{s.ok_max_seconds:.2f}s; least work in flight at a 429 "
        f"{s.least_seconds_ahead_of_a_429:.2f}s; worker deadline drops {drops:.0f}",
        flush=True,
    )
    # Where goodput went, against the warm-up figure: the workers' idle time, work computed and
    # not answered, and their rate while computing (the machine's share: their CPU, the
    # gateway's, this load generator's).
    print(
        f"overload, where it went: workers busy "
        f"{', '.join(f'{w.compute_seconds / wall:.2f}' for w in work)} of the {wall:.0f}s; "
        f"{answered} of {computed:.0f} computed tokens answered; while computing "
        f"{busy:.0f} tokens/s = {busy / capacity if capacity else 0:.3f} x the warm-up "
        f"figure, on CPU s/s {', '.join(f'{w.cpu_seconds / wall:.2f}' for w in work)} "
        f"(gateway {gateway_cpu:.2f}, load generator {own_cpu:.2f}); goodput "
        f"{s.goodput / busy if busy else 0:.3f} x the workers' rate while computing",
        flush=True,
    )
    print(
        f"overload, against the capacity the workers reported while saturated on this traffic "
        f"(their own batches' figure, what admission queued by; mean of {len(known)} per-second "
        f"samples, min {min(known, default=0):.0f}, max {max(known, default=0):.0f}): "
        f"{saturated:.0f} tokens/s; goodput {s.goodput / saturated if saturated else 0:.3f} x "
        f"that",
        flush=True,
    )
    doc = asdict(s)
    doc.pop("shed_at")
    return {**doc, "goodput_ratio": s.goodput_ratio, "deadline_drops": drops,
            "busy_capacity": busy, "goodput_ratio_busy": s.goodput / busy if busy else 0.0,
            "saturated_capacity": saturated,
            "goodput_ratio_saturated": s.goodput / saturated if saturated else 0.0,
            "worker_busy": [w.compute_seconds / wall for w in work],
            "worker_cpu": [w.cpu_seconds / wall for w in work], "gateway_cpu": gateway_cpu,
            "load_generator_cpu": own_cpu, "computed_tokens": computed,
            "answered_tokens": answered}  # fmt: skip


def batch(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    text = " ".join(["word"] * 600)  # cut to 512 tokens
    body = orjson.dumps({"input": [text] * 100, "truncate": True})
    limit = ["--max-input-tokens", "512"]
    wargs = worker_args(args.engine, args.batch_pace, 512)
    with _fleet(1, wargs, limit, log_dir) as fleet:
        capacity = _capacity(fleet)
        start = time.monotonic()
        outcomes = asyncio.run(
            closed_loop("127.0.0.1", fleet.port, 4, args.batch_seconds, [body], timeout=600)
        )
        elapsed = time.monotonic() - start
    s = summarize(outcomes, capacity)
    print(
        f"batch: 4 clients x 100 texts of 512 tokens, one {args.engine} worker (capacity "
        f"{capacity:.0f} tokens/s), gateway defaults: {s.ok} answered, {s.shed} refused (429), "
        f"5xx {s.server_errors or 0}, no answer {s.no_answer}; {s.goodput:.0f} tokens/s; "
        f"latency p50 {s.ok_p50_seconds:.1f}s max {s.ok_max_seconds:.1f}s ({elapsed:.0f}s)",
        flush=True,
    )
    return {"answered": s.ok, "refused": s.shed, "server_errors": s.server_errors,
            "no_answer": s.no_answer, "tokens_per_second": s.goodput,
            "capacity": capacity}  # fmt: skip


def _ms(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) * 1e3


def slowloris(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """Short queries against two identical fleets in the same seconds, one of them under
    `--stalled` stalled connections (opened over the gateway's 10 s header bound, reopened as it
    closes them): the control is the unloaded figure a shared machine can give (the same test as
    tests/stress/test_slowloris.py, with the gateway's CPU seconds per second added)."""
    raise_open_files(args.stalled + 1024)
    body = b'{"input": "how do I reset my password"}'
    null = worker_args("null", 0)
    with (
        _fleet(1, null, (), log_dir / "attacked") as attacked,
        _fleet(1, null, (), log_dir / "control") as control,
    ):
        pids = [f.children[-1].process.pid for f in (attacked, control) if f.children[-1].process]

        def phase(seconds: float) -> tuple[list[list[float]], list[float], int]:
            t0, c0 = time.monotonic(), [tree_cpu_seconds(p) for p in pids]
            got = asyncio.run(_both(attacked.port, control.port, seconds, body))
            wall = time.monotonic() - t0
            cpu = [(tree_cpu_seconds(p) - c) / wall for p, c in zip(pids, c0, strict=True)]
            return [g[0] for g in got], cpu, sum(len(g[1]) for g in got)

        calm, calm_cpu, f1 = phase(12.0)
        with stalled(attacked.port, args.stalled, 10.0) as totals:
            during, during_cpu, f2 = phase(12.0)
    p = {
        "calm": [_ms(calm[0], 50), _ms(calm[0], 99)],
        "calm_control": [_ms(calm[1], 50), _ms(calm[1], 99)],
        "stalled": [_ms(during[0], 50), _ms(during[0], 99)],
        "control": [_ms(during[1], 50), _ms(during[1], 99)],
    }
    ratio = p["stalled"][1] / p["control"][1]
    print(
        f"slowloris: short queries p50/p99 under {args.stalled} stalled connections "
        f"{p['stalled'][0]:.1f}/{p['stalled'][1]:.1f} ms (n={len(during[0])}) vs the unattacked "
        f"control at the same time {p['control'][0]:.1f}/{p['control'][1]:.1f} ms (n="
        f"{len(during[1])}): p99 ratio {ratio:.2f}; before the attack {p['calm'][1]:.1f} vs "
        f"{p['calm_control'][1]:.1f} ms p99; gateway CPU s/s attacked/control "
        f"{during_cpu[0]:.2f}/{during_cpu[1]:.2f} (before {calm_cpu[0]:.2f}/{calm_cpu[1]:.2f}); "
        f"failed {f1 + f2}; attacker {totals}",
        flush=True,
    )
    doc: dict[str, Any] = {f"{k}_p50_p99_ms": v for k, v in p.items()}
    doc.update(p99_ratio=ratio, gateway_cpu_calm=calm_cpu, gateway_cpu_stalled=during_cpu,
               failed=f1 + f2, attacker=totals)  # fmt: skip
    return doc


async def _both(a: int, b: int, seconds: float, body: bytes) -> list[tuple[list[float], list[str]]]:
    return list(
        await asyncio.gather(
            short_requests(a, 4, seconds, body, interval=NORMAL_INTERVAL),
            short_requests(b, 4, seconds, body, interval=NORMAL_INTERVAL),
        )
    )


def shapes(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    import torch

    from embedfleet.common.codec import Tokens
    from embedfleet.worker.contract import WorkItem
    from embedfleet.worker.engine.torch_engine import TorchEngine
    from embedfleet.worker.settings import WorkerSettings
    from embedfleet.worker.warmup import probe_items, request_tokens_of

    torch.set_num_threads(1)
    engine = TorchEngine.from_settings(WorkerSettings(device="cpu", threads=1))
    limit, vocab = engine.info.max_input_tokens, engine.info.vocab_size
    tokenizer = load_model_dir(default_model_path()).tokenizer()
    tokenizer.no_padding()
    tokenizer.no_truncation()
    bodies = mixed_bodies(words_of(list(tokenizer.get_vocab())), seed=args.seed, count=20)
    texts = [t for b in bodies for t in orjson.loads(b)["input"]][: args.shape_texts]
    traffic = [np.asarray(e.ids[:limit], np.int32) for e in tokenizer.encode_batch(texts)]
    rng = np.random.default_rng(0)
    short = [rng.integers(1000, vocab, 128, dtype=np.int32) for _ in range(len(traffic))]

    def items(seqs: list[np.ndarray[Any, Any]], per: int) -> list[WorkItem]:
        return [
            WorkItem(Tokens(np.concatenate(part), np.array([len(s) for s in part], np.int32)))
            for part in (seqs[i : i + per] for i in range(0, len(seqs), per))
        ]

    request = request_tokens_of(16384)
    n = max(2, sum(len(t) for t in traffic) // request // 2)
    runs = {
        "128-token probe (before)": items(short[: n * request // 128], request // 128),
        f"{min(limit, request)}-token probe (now)": probe_items(n, vocab, limit, request),
        "overload traffic": items(traffic, 16),
    }

    def per_cpu_second(work: list[WorkItem]) -> float:
        done, tokens, c0 = 0, 0, time.process_time()
        batch: list[WorkItem] = []
        for item in [*work, None]:
            if batch and (item is None or tokens + item.total_tokens > args.shape_batch_tokens):
                engine.run(batch)
                done, batch, tokens = done + tokens, [], 0
            if item is not None:
                batch.append(item)
                tokens += item.total_tokens
        return done / (time.process_time() - c0)

    for work in runs.values():
        engine.run(work[:2])  # one-off costs
    got: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.shape_rounds):
        for name, work in runs.items():
            got[name].append(per_cpu_second(work))
    median = {name: float(np.median(v)) for name, v in got.items()}
    base = median["overload traffic"]
    print(
        f"shapes: one-thread MiniLM tokens per CPU-second, median of {args.shape_rounds} "
        f"interleaved rounds, batches of {args.shape_batch_tokens} tokens: "
        + "; ".join(f"{k} {v:.0f} ({v / base:.3f} x the traffic's)" for k, v in median.items())
        + f"; the traffic's sequences {np.mean([len(t) for t in traffic]):.0f} tokens on average",
        flush=True,
    )
    return {"tokens_per_cpu_second": median, "rounds": got}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.overload")
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--engine", default="null", choices=("null", "torch"))
    parser.add_argument("--pace", type=float, default=5000.0, help="null engine tokens/s")
    parser.add_argument(
        "--batch-pace",
        type=float,
        default=6700.0,
        help="null engine tokens/s of the batch suite's one worker: one CPU worker's MiniLM "
        "speed measured in issue 18",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--batch-seconds", type=float, default=30.0)
    parser.add_argument("--stalled", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--shape-texts", type=int, default=150, help="shapes: traffic texts")
    parser.add_argument("--shape-rounds", type=int, default=4, help="shapes: interleaved rounds")
    parser.add_argument("--shape-batch-tokens", type=int, default=4096, help="shapes: batch size")
    parser.add_argument("--max-queue-seconds", type=float, default=0.0, help="0: the default")
    parser.add_argument("--upstream-timeout-seconds", type=float, default=0.0, help="0: default")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/embedfleet-bench-overload"))
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    runs = {"overload": overload, "batch": batch, "slowloris": slowloris, "shapes": shapes}
    results: dict[str, Any] = {"engine": args.engine, "pace": args.pace}
    for name in args.suites.split(","):
        results[name] = runs[name](args, args.log_dir / name)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
