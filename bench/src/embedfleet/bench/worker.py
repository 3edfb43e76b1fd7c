"""Worker-only benchmark: the gRPC server against the same engine called in-process.

    python -m embedfleet.bench.worker            # all parts; --help for sizes
    python -m embedfleet.bench.worker --parts wire,null

Parts, each on the same seeded inputs:
- `wire`: token ids as packed little-endian bytes (the protocol) against `repeated int32`:
  bytes on the wire, client encode and server decode times.
- `null`: the server harness alone (`--engine null`): batch-1 latency at concurrency 1 and
  request rate with 4 clients sending batches of 100.
- `torch`: the real engine in a worker process over gRPC against the same engine in this process:
  4 clients x batches of 100 (throughput ratio) and batch-1 latency at 128 tokens (p50 overhead).

The in-process runs happen while the worker process idles, so the two never share the CPU; the
figures are still noisy on a shared machine. Targets (issue 3): <= 0.3 ms p50 added per request at
concurrency 1, >= 95% of in-process throughput at 4 clients.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from embedfleet.common.codec import Tokens, pack_tokens, unpack_floats, unpack_tokens
from embedfleet.common.proto import embedfleet_pb2 as pb

VOCAB = 30522
PARTS = ("wire", "null", "torch")


@dataclass(frozen=True)
class Sizes:
    clients: int = 4
    batch: int = 100
    #: batches each client sends in the throughput run
    rounds: int = 3
    #: sequential batch-1 requests in the latency run
    singles: int = 200
    single_tokens: int = 128
    warmup_seconds: float = 1.0


def mixed_batches(count: int, size: int, seed: int) -> list[list[list[int]]]:
    """`count` batches of `size` sequences, lengths mixed 8..256 (skewed short, like real text)."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        lengths = np.clip(rng.lognormal(4.0, 0.8, size).astype(int), 8, 256)
        batches.append([rng.integers(1000, VOCAB, n).tolist() for n in lengths])
    return batches


def fixed_sequences(count: int, tokens: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1000, VOCAB, tokens).tolist() for _ in range(count)]


def _p(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


# --- wire format ------------------------------------------------------------------------------


def _repeated_message_class() -> Any:
    """A `repeated int32` twin of TokenBatch, built at run time so the protocol stays unchanged."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="embedfleet_bench_repeated.proto", package="embedfleet.bench", syntax="proto3"
    )
    message = proto.message_type.add(name="RepeatedTokens")
    for number, name in ((1, "token_ids"), (2, "lengths")):
        message.field.add(
            name=name,
            number=number,
            type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
            label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("embedfleet.bench.RepeatedTokens")
    )


def _best_of(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def wire_figures(batch: list[list[int]], repeat: int = 50) -> dict[str, dict[str, float]]:
    """Encode (ids as Python lists, as a tokenizer returns them) and decode to a numpy array."""
    repeated_cls = _repeated_message_class()

    def encode_packed() -> bytes:
        return bytes(pack_tokens(batch).SerializeToString())

    def encode_repeated() -> bytes:
        msg = repeated_cls()
        for seq in batch:
            msg.token_ids.extend(seq)
        msg.lengths.extend(len(seq) for seq in batch)
        return bytes(msg.SerializeToString())

    packed, repeated = encode_packed(), encode_repeated()

    def decode_packed() -> Tokens:
        return unpack_tokens(pb.TokenBatch.FromString(packed))

    def decode_repeated() -> npt.NDArray[np.int32]:
        msg = repeated_cls.FromString(repeated)
        return np.asarray(msg.token_ids, dtype=np.int32)

    assert np.array_equal(decode_packed().ids, decode_repeated())
    return {
        "packed bytes": {
            "bytes": len(packed),
            "encode_ms": _best_of(encode_packed, repeat) * 1e3,
            "decode_ms": _best_of(decode_packed, repeat) * 1e3,
        },
        "repeated int32": {
            "bytes": len(repeated),
            "encode_ms": _best_of(encode_repeated, repeat) * 1e3,
            "decode_ms": _best_of(decode_repeated, repeat) * 1e3,
        },
    }


# --- over gRPC --------------------------------------------------------------------------------


def grpc_latencies(address: str, requests: Sequence[pb.EmbedRequest]) -> list[float]:
    import grpc

    from embedfleet.testing.workers import worker_stub

    with grpc.insecure_channel(address) as channel:
        stub = worker_stub(channel)
        stub.Embed(requests[0], timeout=60)  # connection set up outside the timing
        out = []
        for request in requests:
            t0 = time.perf_counter()
            stub.Embed(request, timeout=60)
            out.append(time.perf_counter() - t0)
    return out


def grpc_throughput(
    address: str, per_client: Sequence[Sequence[pb.EmbedRequest]]
) -> tuple[float, list[npt.NDArray[np.floating]]]:
    """Seconds for all clients (one thread and one connection each) to send their requests."""
    import grpc

    from embedfleet.testing.workers import worker_stub

    start = threading.Barrier(len(per_client) + 1)
    results: list[list[npt.NDArray[np.floating]]] = [[] for _ in per_client]

    def client(index: int) -> None:
        with grpc.insecure_channel(address) as channel:
            stub = worker_stub(channel)
            grpc.channel_ready_future(channel).result(timeout=30)
            start.wait()
            for request in per_client[index]:
                reply = stub.Embed(request, timeout=600)
                rows = unpack_floats(reply.embeddings, reply.count, reply.dimensions, reply.format)
                results[index].append(rows)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(per_client))]
    for thread in threads:
        thread.start()
    start.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - t0
    return elapsed, [rows for client_rows in results for rows in client_rows]


def _requests(batches: Sequence[Sequence[Sequence[int]]]) -> list[pb.EmbedRequest]:
    return [pb.EmbedRequest(batch=pack_tokens(b)) for b in batches]


# --- the parts --------------------------------------------------------------------------------


def _worker_args(sizes: Sizes, *extra: str) -> list[str]:
    return ["--warmup-seconds", str(sizes.warmup_seconds), *extra]


def run_null(sizes: Sizes, workdir: Path) -> dict[str, float]:
    from embedfleet.testing.workers import running_worker

    singles = _requests([[s] for s in fixed_sequences(sizes.singles, sizes.single_tokens, 1)])
    batches = mixed_batches(sizes.clients * sizes.rounds * 5, sizes.batch, 2)
    with running_worker(workdir, *_worker_args(sizes, "--engine", "null"), name="null") as worker:
        lat = grpc_latencies(worker.address, singles)
        per_client = [
            _requests(batches[i :: sizes.clients]) for i in range(sizes.clients)
        ]  # fmt: skip
        elapsed, _ = grpc_throughput(worker.address, per_client)
    requests = sum(len(c) for c in per_client)
    return {
        "batch-1 p50 ms": _p(lat, 50) * 1e3,
        "batch-1 p99 ms": _p(lat, 99) * 1e3,
        "4 clients x 100: req/s": requests / elapsed,
        "4 clients x 100: seq/s": requests * sizes.batch / elapsed,
    }


def run_torch(sizes: Sizes, workdir: Path, extra: Sequence[str]) -> dict[str, float]:
    """In-process first (no worker alive), then the worker over gRPC, each warmed up the same way.

    Not interleaved on purpose: on 2 cores, a request in one process right after a run in the
    other was measured several times slower (the idle side's OpenMP threads still spin), which
    would charge the in-process side for the worker's presence.
    """
    import grpc

    from embedfleet.common.settings import load
    from embedfleet.testing.workers import running_worker, worker_stub
    from embedfleet.worker.contract import WorkItem
    from embedfleet.worker.engine.torch_engine import TorchEngine
    from embedfleet.worker.settings import ENV_PREFIX, WorkerSettings

    singles = _requests([[s] for s in fixed_sequences(sizes.singles, sizes.single_tokens, 1)])
    batches = mixed_batches(sizes.clients * sizes.rounds, sizes.batch, 2)
    tokens = sum(len(s) for b in batches for s in b)
    per_client = [_requests(batches[c :: sizes.clients]) for c in range(sizes.clients)]
    engine = TorchEngine.from_settings(load(WorkerSettings, ENV_PREFIX, list(extra), env={}))
    # The worker gets the dtype this engine settled on: "auto" may decide otherwise elsewhere.
    dtype = engine.info.dtype
    _warm_up(engine, sizes.warmup_seconds)
    single_items = [WorkItem(unpack_tokens(r.batch)) for r in singles]
    for item in single_items[:_UNTIMED]:
        engine.step([item]).wait()
    local_lat = []
    for item in single_items:
        t0 = time.perf_counter()
        engine.step([item]).wait()
        local_lat.append(time.perf_counter() - t0)
    batch_items = [WorkItem(unpack_tokens(r.batch)) for c in per_client for r in c]
    t0 = time.perf_counter()
    local_rows = [engine.step([item]).wait()[0] for item in batch_items]
    local_s = time.perf_counter() - t0
    del engine

    args = _worker_args(sizes, *extra, "--dtype", dtype)
    with running_worker(workdir, *args, name="torch") as worker:
        with grpc.insecure_channel(worker.address) as channel:
            stub = worker_stub(channel)
            for request in singles[:_UNTIMED]:
                stub.Embed(request, timeout=60)
        served_lat = grpc_latencies(worker.address, singles)
        served_s, served_rows = grpc_throughput(worker.address, per_client)
    cos = 1.0
    for a, b in zip(served_rows, local_rows, strict=True):
        dots = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        cos = min(cos, float(dots.min()))
    served_tps, local_tps = tokens / served_s, tokens / local_s
    return {
        f"dtype {dtype}; batch-1 tokens": float(sizes.single_tokens),
        "batch-1 p50 ms (grpc)": _p(served_lat, 50) * 1e3,
        "batch-1 p50 ms (in-process)": _p(local_lat, 50) * 1e3,
        "batch-1 p50 overhead ms": (_p(served_lat, 50) - _p(local_lat, 50)) * 1e3,
        "4x100 tokens/s (grpc)": served_tps,
        "4x100 tokens/s (in-process)": local_tps,
        "4x100 throughput ratio": served_tps / local_tps,
        "min cosine grpc vs in-process": cos,
    }


#: runs of the batch-1 shape before timing it, on both sides (the first few dozen are slow on CPU)
_UNTIMED = 30


def _warm_up(engine: Any, seconds: float) -> None:
    """The worker's start-up warm-up, replayed in-process: the first runs of a shape are slow."""
    from embedfleet.worker.warmup import probe_items

    info = engine.info
    items = probe_items(16, info.vocab_size, info.max_input_tokens, 512)
    end = time.monotonic() + max(seconds, 1.0)
    while time.monotonic() < end:
        engine.step(items[:4]).wait()
        engine.step(items[4:5]).wait()


def _print(title: str, figures: dict[str, Any]) -> None:
    print(f"\n## {title}\n")
    for key, value in figures.items():
        if isinstance(value, dict):
            cells = ", ".join(f"{k} {v:,.3f}" for k, v in value.items())
            print(f"- {key}: {cells}")
        else:
            print(f"- {key}: {value:,.4f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embedfleet.bench.worker",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated of {PARTS}")
    parser.add_argument("--clients", type=int, default=Sizes.clients)
    parser.add_argument("--batch", type=int, default=Sizes.batch)
    parser.add_argument("--rounds", type=int, default=Sizes.rounds)
    parser.add_argument("--singles", type=int, default=Sizes.singles)
    parser.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        help="extra flag for the torch worker and the in-process engine (repeatable), "
        "e.g. --worker-arg=--dtype=float32",
    )
    args = parser.parse_args(argv)
    sizes = Sizes(args.clients, args.batch, args.rounds, args.singles)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    for part in parts:
        if part not in PARTS:
            parser.error(f"unknown part {part!r}")
    print(f"# worker benchmark: {sizes}")
    with tempfile.TemporaryDirectory(prefix="embedfleet-bench-worker-") as tmp:
        workdir = Path(tmp)
        if "wire" in parts:
            batch = mixed_batches(1, sizes.batch, 3)[0]
            _print(f"token ids on the wire (1 batch of {sizes.batch}, mixed lengths)",
                   wire_figures(batch))  # fmt: skip
        if "null" in parts:
            _print("null engine (server harness alone)", run_null(sizes, workdir))
        if "torch" in parts:
            figures = run_torch(sizes, workdir, args.worker_arg)
            _print("torch engine: worker over gRPC vs in-process", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
