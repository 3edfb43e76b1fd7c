"""CPU simulation of the CUDA graph cache over a synthetic arrival trace: captures and memory.

The trace: one simulated hour of requests (short queries, document batches and occasional bulk
jobs; a 10x burst of 30 s every 5 minutes), cut into the gateway's 8,192-token chunks, served FIFO
by one worker that batches what waits, up to the batch budget (16,384 tokens, 512 sequences),
with a GPU-like service time. Every batch goes
through the engine's own `BucketPolicy` and `GraphCache` (lazy: eager on a bucket's first use,
capture on its second; LRU of `--max-graphs`), so the figures are those of the code that ships.

Per policy: distinct buckets met, captures in the hour and in its second half (steady state), live
graphs at the end, the share of batches replayed, padding (tokens computed for nothing), and graph
memory for a 1024-wide model in bf16 (Qwen3-0.6B): the outputs each live graph kept before
(its own [T, H] hidden states and [S, H] head) against one shared pair of static buffers now,
plus the pool's working set, estimated as 20 H bytes per token of the largest live bucket.

    python -m embedfleet.bench.graph_sim [--seconds 3600] [--seed 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from embedfleet.worker.engine.graph_policy import Action, BucketPolicy, GraphCache, GraphKey

MAX_TOKENS = 16384
MAX_SEQUENCES = 512
MAX_SEQLEN = 512
HIDDEN = 1024
CHUNK_TOKENS = 8192  # the gateway's default chunkTokens


@dataclass(frozen=True)
class Request:
    arrival: float
    tokens: int
    sequences: int


def synthetic_trace(seconds: float, seed: int, base_rate: float = 40.0) -> list[Request]:
    """Poisson arrivals at `base_rate`/s, 10x for 30 s every 300 s; mixed request shapes."""
    rng = np.random.default_rng(seed)
    out: list[Request] = []
    t = 0.0
    while t < seconds:
        burst = (t % 300.0) < 30.0
        t += float(rng.exponential(1.0 / (base_rate * (10.0 if burst else 1.0))))
        kind = rng.random()
        if kind < 0.6:  # a search query
            n = 1
            lengths = np.clip(rng.lognormal(np.log(20), 0.6, n), 3, 128)
        elif kind < 0.97:  # a batch of documents or chunks
            n = int(min(64, rng.geometric(1 / 12)))
            lengths = np.clip(rng.lognormal(np.log(180), 0.7, n), 8, MAX_SEQLEN)
        else:  # a bulk indexing job
            n = int(rng.integers(64, 257))
            lengths = np.clip(rng.lognormal(np.log(300), 0.4, n), 16, MAX_SEQLEN)
        out.extend(_chunks(t, lengths.astype(int).tolist()))
    return out


def _chunks(arrival: float, lengths: list[int], chunk_tokens: int = CHUNK_TOKENS) -> list[Request]:
    """A request as the gateway forwards it: cut into chunks of at most `chunk_tokens`."""
    out, tokens, count = [], 0, 0
    for n in lengths:
        if count and tokens + n > chunk_tokens:
            out.append(Request(arrival, tokens, count))
            tokens = count = 0
        tokens += n
        count += 1
    out.append(Request(arrival, tokens, count))
    return out


def batches_of(trace: Sequence[Request]) -> list[tuple[float, int, int]]:
    """(launch time, tokens, sequences) of each batch one FIFO worker forms from `trace`."""
    queue: list[tuple[float, int, Request]] = []
    out: list[tuple[float, int, int]] = []
    now, i = 0.0, 0
    while i < len(trace) or queue:
        if not queue:
            now = max(now, trace[i].arrival)
        while i < len(trace) and trace[i].arrival <= now:
            heapq.heappush(queue, (trace[i].arrival, i, trace[i]))
            i += 1
        tokens = sequences = 0
        while queue:
            r = queue[0][2]
            if tokens and (
                tokens + r.tokens > MAX_TOKENS or sequences + r.sequences > MAX_SEQUENCES
            ):
                break
            heapq.heappop(queue)
            tokens += r.tokens
            sequences += r.sequences
        out.append((now, tokens, sequences))
        now += 0.00025 + tokens / 2.0e6  # launch overhead + ~2M tokens/s
    return out


@dataclass
class Figures:
    policy: str
    token_buckets: int
    buckets_met: int
    captures: int
    captures_second_half: int
    live_graphs: int
    replayed: float
    padding: float
    memory_before_mib: float
    memory_now_mib: float


def simulate(
    name: str,
    policy: BucketPolicy,
    batches: Sequence[tuple[float, int, int]],
    max_graphs: int,
    plan: Sequence[GraphKey] = (),
) -> Figures:
    """Lazy mode over `batches`, after pre-capturing `plan` (the worker's warm-up) if given;
    captures counts those client batches paid for."""
    cap = policy.capacity(MAX_TOKENS)
    cache = GraphCache(
        mode="lazy", max_graphs=max_graphs, max_tokens=cap.tokens, max_sequences=cap.sequences
    )
    for key in plan:
        cache.preload(key)
    half = batches[-1][0] / 2 if batches else 0.0
    met: set[GraphKey] = set()
    captures = late = replays = 0
    real = padded = 0
    peak_before = peak_now = 0.0
    for when, tokens, sequences in batches:
        # The longest sequence is not traced: at a 512-token limit (MAX_SEQLEN) the attention
        # length is the bucket's, up to 512, whatever it is.
        longest = min(tokens, MAX_SEQLEN)
        key = policy.key(tokens, sequences, longest)
        met.add(key)
        d = cache.decide(key, (tokens, sequences, longest))
        real += tokens
        padded += tokens if d.action is Action.EAGER or d.key is None else d.key.tokens
        if d.action is Action.CAPTURE:
            captures += 1
            late += when >= half
            live = cache.live
            work = max(k.tokens for k in live) * 20 * HIDDEN
            kept = sum(k.tokens * HIDDEN * 2 + k.sequences * HIDDEN * 4 for k in live)
            shared = cap.tokens * HIDDEN * 2 + cap.sequences * HIDDEN * 4
            peak_before = max(peak_before, (work + kept) / 2**20)
            peak_now = max(peak_now, (work + shared) / 2**20)
        elif d.action is Action.REPLAY:
            replays += 1
    return Figures(
        policy=name,
        token_buckets=len(policy.token_buckets(MAX_TOKENS)),
        buckets_met=len(met),
        captures=captures,
        captures_second_half=late,
        live_graphs=len(cache.live),
        replayed=replays / max(1, len(batches)),
        padding=(padded - real) / max(1, padded),
        memory_before_mib=peak_before,
        memory_now_mib=peak_now,
    )


POLICIES: dict[str, BucketPolicy] = {
    "linear+pow2 (before)": BucketPolicy(token_scheme="linear", sequence_scheme="pow2"),
    "linear+fixed": BucketPolicy(token_scheme="linear", sequence_scheme="fixed"),
    "geometric4+pow2": BucketPolicy(sequence_scheme="pow2"),
    "geometric4+fixed (default)": BucketPolicy(),
    "geometric2+fixed": BucketPolicy(per_octave=2),
    "geometric8+fixed": BucketPolicy(per_octave=8),
}


def run(seconds: float, seed: int, max_graphs: int) -> tuple[int, list[Figures]]:
    batches = batches_of(synthetic_trace(seconds, seed))
    scale = 3600.0 / seconds
    out = []
    for name, policy in POLICIES.items():
        p = dataclasses.replace(policy, max_seqlen=MAX_SEQLEN, max_sequences=MAX_SEQUENCES)
        f = simulate(name, p, batches, max_graphs)
        f.captures = round(f.captures * scale)
        f.captures_second_half = round(f.captures_second_half * scale)
        out.append(f)
    return len(batches), out


def table(batches: int, figures: Sequence[Figures]) -> str:
    rows = [
        f"{batches} batches; captures scaled to one hour; memory: peak graph memory, 1024-wide "
        "bf16 model",
        "",
        "| policy | token buckets | buckets met | captures/h | captures, 2nd half-hour | live "
        "graphs | replayed | padding | memory before (MiB) | memory now (MiB) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in figures:
        rows.append(
            f"| {f.policy} | {f.token_buckets} | {f.buckets_met} | {f.captures} | "
            f"{f.captures_second_half} | {f.live_graphs} | {f.replayed:.1%} | {f.padding:.1%} | "
            f"{f.memory_before_mib:,.0f} | {f.memory_now_mib:,.0f} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.graph_sim")
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-graphs", type=int, default=64)
    parser.add_argument("--json", default="", help="also write the figures here")
    args = parser.parse_args(argv)
    batches, figures = run(args.seconds, args.seed, args.max_graphs)
    print(table(batches, figures))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(f) for f in figures], fh, indent=1)
    return 0 if all(math.isfinite(f.padding) for f in figures) else 1


if __name__ == "__main__":
    raise SystemExit(main())
