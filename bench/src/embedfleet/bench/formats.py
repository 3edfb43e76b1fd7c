"""`python -m embedfleet.bench formats`: what each `encoding_format` costs and keeps.

Three measurements, on the benchmark corpus (the calibration's held-out half, corpus.py):
1. Bytes per vector on the wire: the HTTP response body of each format from a real gateway,
   divided by the vectors in it, and the worker -> gateway gRPC reply per vector as it is (float32)
   and as it would be if the worker quantized.
2. Gateway CPU per vector, side by side in this process on the same rows: decoding the gRPC reply
   (float32, or already quantized), quantizing, and writing the JSON response. This is what
   decides where quantization happens (docs/gateway.md, "Output formats").
3. Fidelity against float: int8/uint8 rows dequantized to bucket centres (cosine to the float row),
   and retrieval agreement, recall@10 of the float cosine top 10 for 64 query passages over the
   256 held-out documents, when ranking by the int8 dot product and by binary Hamming distance.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import numpy as np
import orjson

from embedfleet.bench import corpus
from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import pack_floats, unpack_floats
from embedfleet.common.net import free_ports
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.gateway.fleet import Fleet
from embedfleet.gateway.quantization import (
    BUNDLED_CALIBRATION,
    ENCODINGS,
    encode_quantized,
    encode_rows,
    load_calibration,
    quantize,
)
from embedfleet.testing import procfs

FORMATS = list(ENCODINGS)
BATCH = 64


def held_out(c: corpus.Corpus) -> tuple[list[str], list[str]]:
    """(queries, documents): the 32-token passages, and the passages calibration did not see."""
    docs = [t for n in (128, 512) for t in c.texts[n][1::2]]
    return list(c.texts[32]), docs


def _post(client: httpx.Client, texts: Sequence[str], encoding: str) -> bytes:
    body = {"input": list(texts), "encoding_format": encoding, "truncate": True}
    reply = client.post("/v1/embeddings", json=body)
    reply.raise_for_status()
    return reply.content


def floats(client: httpx.Client, texts: Sequence[str]) -> FloatArray:
    rows = []
    for i in range(0, len(texts), BATCH):
        doc = orjson.loads(_post(client, texts[i : i + BATCH], "float"))
        rows += [d["embedding"] for d in sorted(doc["data"], key=lambda d: d["index"])]
    return np.asarray(rows, dtype=np.float32)


def wire_bytes(client: httpx.Client, texts: Sequence[str]) -> dict[str, float]:
    out = {}
    for encoding in FORMATS:
        sizes = [
            len(_post(client, texts[i : i + BATCH], encoding)) for i in range(0, len(texts), BATCH)
        ]
        out[encoding] = sum(sizes) / len(texts)
    return out


def _cpu(pid: int) -> float:
    seconds = procfs.cpu_seconds(pid)
    if seconds is None:
        raise RuntimeError(f"the gateway (pid {pid}) exited during the measurement")
    return seconds


def gateway_cpu(
    client: httpx.Client, texts: Sequence[str], pid: int, passes: int
) -> dict[str, float]:
    """The gateway process's CPU µs per vector, end to end (parse, tokenize, balance, decode,
    quantize, encode), for each format on the same requests."""
    out = {}
    for encoding in FORMATS:
        _post(client, texts, encoding)  # warm
        start = _cpu(pid)
        for _ in range(passes):
            _post(client, texts, encoding)
        out[encoding] = (_cpu(pid) - start) * 1e6 / (passes * len(texts))
    return out


def _best_of(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _cpu_of(encoding: str, rows: FloatArray, ranges: FloatArray, repeats: int) -> dict[str, float]:
    n = rows.shape[0]
    reply = pb.EmbedResponse(embeddings=pack_floats(rows), count=n, dimensions=rows.shape[1])
    wire = reply.SerializeToString()
    precision, as_base64 = ENCODINGS[encoding]
    quantized = quantize(rows, precision, ranges)
    small = pb.EmbedResponse(embeddings=quantized.tobytes(), count=n).SerializeToString()

    def decode_float() -> FloatArray:
        got = pb.EmbedResponse.FromString(wire)
        return unpack_floats(got.embeddings, got.count, got.dimensions, got.format)

    def respond(values: list[np.ndarray] | list[str]) -> bytes:
        data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(values)]
        return orjson.dumps({"data": data}, option=orjson.OPT_SERIALIZE_NUMPY)

    per = 1e6 / n
    return {
        "grpc_float32_bytes": len(wire) / n,
        "grpc_quantized_bytes": len(small) / n,
        "decode_float32_us": _best_of(decode_float, repeats) * per,
        "decode_quantized_us": _best_of(lambda: pb.EmbedResponse.FromString(small), repeats) * per,
        "quantize_us": _best_of(lambda: quantize(rows, precision, ranges), repeats) * per,
        "quantize_and_json_us": _best_of(
            lambda: respond(encode_rows(rows, encoding, ranges)), repeats
        )
        * per,
        "json_of_quantized_us": _best_of(
            lambda: respond(encode_quantized(quantized, precision, as_base64)), repeats
        )
        * per,
    }


def cpu_per_vector(
    rows: FloatArray, ranges: FloatArray, repeats: int
) -> dict[str, dict[str, float]]:
    """Microseconds per vector of each gateway step, for the gateway-side and worker-side plans."""
    return {encoding: _cpu_of(encoding, rows, ranges, repeats) for encoding in FORMATS}


def _dequantize(q: np.ndarray, ranges: FloatArray, precision: str) -> FloatArray:
    starts = ranges[0]
    steps = (ranges[1] - starts) / 255
    buckets = q.astype(np.float32) + (128 if precision == "int8" else 0)
    out: FloatArray = starts + (buckets + 0.5) * steps
    return out


def _cos_rows(a: FloatArray, b: FloatArray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    out: np.ndarray = np.einsum("ij,ij->i", a64, b64) / norms
    return out


def _recall(truth: np.ndarray, scores: np.ndarray, k: int) -> float:
    """Mean share of each query's true top k found in the top k by `scores` (higher is better)."""
    hits = []
    for t, s in zip(truth, scores, strict=True):
        want = set(np.argsort(-t, kind="stable")[:k].tolist())
        got = set(np.argsort(-s, kind="stable")[:k].tolist())
        hits.append(len(want & got) / k)
    return float(np.mean(hits))


def fidelity(queries: FloatArray, docs: FloatArray, ranges: FloatArray) -> dict[str, float]:
    out: dict[str, float] = {}
    for precision in ("int8", "uint8"):
        q = quantize(docs, precision, ranges)
        cos = _cos_rows(docs, _dequantize(q, ranges, precision))
        out[f"{precision}_cosine_min"] = float(cos.min())
        out[f"{precision}_cosine_mean"] = float(cos.mean())
    truth = queries.astype(np.float64) @ docs.astype(np.float64).T
    qi = quantize(queries, "int8", ranges).astype(np.int32)
    di = quantize(docs, "int8", ranges).astype(np.int32)
    out["int8_raw_dot_recall@10"] = _recall(truth, (qi @ di.T).astype(np.float64), 10)
    # As a vector database with per-dimension scalar quantization scores: dequantized rows.
    qd = _dequantize(qi, ranges, "int8").astype(np.float64)
    dd = _dequantize(di, ranges, "int8").astype(np.float64)
    out["int8_dequantized_dot_recall@10"] = _recall(truth, qd @ dd.T, 10)
    qb = np.unpackbits(quantize(queries, "ubinary", None), axis=1).astype(np.int32)
    db = np.unpackbits(quantize(docs, "ubinary", None), axis=1).astype(np.int32)
    hamming = (qb[:, None, :] != db[None, :, :]).sum(axis=2)
    out["binary_hamming_recall@10"] = _recall(truth, -hamming.astype(np.float64), 10)
    # Binary first pass, float rescoring of the best 40 (the usual way to use binary vectors).
    rescored = np.full_like(truth, -np.inf)
    for i, row in enumerate(hamming):
        keep = np.argsort(row, kind="stable")[:40]
        rescored[i, keep] = truth[i, keep]
    out["binary_top40_rescored_recall@10"] = _recall(truth, rescored, 10)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench formats")
    parser.add_argument("--url", default="", help="A running gateway (default: start a fleet).")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--passes",
        type=int,
        default=20,
        help="Requests of the 64 query passages per format for the gateway's end-to-end CPU "
        "(only when this command starts the fleet).",
    )
    parser.add_argument("--out", type=Path, default=None, help="Write the figures as JSON.")
    args = parser.parse_args(argv)
    c = corpus.load()
    queries, docs = held_out(c)
    ranges = load_calibration(BUNDLED_CALIBRATION).ranges[384]
    fleet = None
    url = args.url
    if not url:
        (port,) = free_ports(1)
        fleet = Fleet(workers=1, port=port).start()
        url = fleet.url
    end_to_end: dict[str, float] = {}
    try:
        with httpx.Client(base_url=url, timeout=300) as client:
            q_rows, d_rows = floats(client, queries), floats(client, docs)
            wire = wire_bytes(client, docs)
            gateway = fleet.children[-1].process if fleet is not None else None
            if gateway is not None:
                end_to_end = gateway_cpu(client, queries, gateway.pid, args.passes)
    finally:
        if fleet is not None:
            fleet.stop()
    cpu = cpu_per_vector(d_rows, ranges, args.repeats)
    fid = fidelity(q_rows, d_rows, ranges)
    print(
        f"corpus {c.source} sha256 {c.sha256[:12]}; {len(docs)} documents, {len(queries)} queries"
    )
    print(
        "| format | HTTP bytes/vector | vs float JSON | gRPC bytes/vector if the worker quantized |"
    )
    print("|---|---:|---:|---:|")
    for encoding in FORMATS:
        print(
            f"| {encoding} | {wire[encoding]:.0f} | {wire['float'] / wire[encoding]:.1f}x | "
            f"{cpu[encoding]['grpc_quantized_bytes']:.0f} |"
        )
    print(f"(gRPC reply today, float32: {cpu['float']['grpc_float32_bytes']:.0f} bytes/vector)")
    print(
        "| format | decode float32 µs | quantize µs | quantize+JSON µs | decode quantized µs "
        "| JSON of quantized µs |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for encoding in FORMATS:
        m = cpu[encoding]
        print(
            f"| {encoding} | {m['decode_float32_us']:.2f} | {m['quantize_us']:.2f} | "
            f"{m['quantize_and_json_us']:.2f} | {m['decode_quantized_us']:.2f} | "
            f"{m['json_of_quantized_us']:.2f} |"
        )
    if end_to_end:
        print("gateway process CPU per vector, end to end (64 x 32-token inputs a request):")
        for encoding, us in end_to_end.items():
            print(f"  {encoding}: {us:.1f} µs ({us / end_to_end['float']:.2f}x float)")
    for key, value in fid.items():
        print(f"{key}: {value:.4f}")
    if args.out:
        figures = {"wire": wire, "cpu": cpu, "gateway_cpu": end_to_end, "fidelity": fid}
        args.out.write_text(json.dumps(figures, indent=1))
    return 0
