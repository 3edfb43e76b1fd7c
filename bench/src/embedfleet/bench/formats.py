"""`python -m embedfleet.bench formats`: what each `encoding_format` costs and keeps.

Three measurements, on the benchmark corpus (the calibration's held-out half, corpus.py):
1. Bytes per vector on the wire: the HTTP response body of each format from a real gateway,
   divided by the vectors in it, and the worker -> gateway gRPC reply per vector as it is (float32)
   and as it would be if the worker quantized.
2. The gateway process's CPU per vector of each format, end to end (when this command starts the
   fleet).
3. Fidelity against float: int8/uint8 rows dequantized to bucket centres (cosine to the float row),
   and retrieval agreement, recall@10 of the float cosine top 10 for 64 query passages over the
   256 held-out documents, when ranking by the int8 dot product and by binary Hamming distance.
Quantization here is sentence-transformers' `quantize_embeddings` with the bundled model's
calibration, which the gateway matches byte for byte (tests/gateway/test_minilm.py).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from embedfleet.bench import corpus
from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import pack_floats
from embedfleet.common.net import free_ports
from embedfleet.common.proto import embedfleet_pb2 as pb
from embedfleet.fleet.supervisor import Fleet
from embedfleet.testing import procfs
from embedfleet.testing.gateway import bundled_calibration

PRECISIONS = ("int8", "uint8", "binary", "ubinary")
#: every encoding_format: float, base64, and each precision with and without _base64
FORMATS = ["float", "base64", *PRECISIONS, *(f"{p}_base64" for p in PRECISIONS)]
BATCH = 64


def quantize(rows: FloatArray, precision: str, ranges: FloatArray | None) -> np.ndarray:
    from sentence_transformers.util.quantization import quantize_embeddings

    out = quantize_embeddings(rows, precision, ranges=ranges)  # type: ignore[arg-type]
    return np.asarray(out)


def bundled_ranges() -> FloatArray:
    """The [min, max] of each of the bundled model's 384 dimensions the gateway quantizes with."""
    ranges: dict[str, Any] = json.loads(bundled_calibration().read_text())["ranges"]["384"]
    return np.array([ranges["min"], ranges["max"]], dtype=np.float32)


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


def grpc_bytes(rows: FloatArray, ranges: FloatArray) -> dict[str, float]:
    """The worker -> gateway reply per vector: float32 as it is, and each precision as it would
    be if the worker quantized."""
    n, dims = rows.shape
    out = {"float32": len(pb.EmbedResponse(embeddings=pack_floats(rows), count=n,
                                           dimensions=dims).SerializeToString()) / n}  # fmt: skip
    for precision in PRECISIONS:
        q = quantize(rows, precision, ranges if precision in ("int8", "uint8") else None)
        out[precision] = (
            len(pb.EmbedResponse(embeddings=q.tobytes(), count=n).SerializeToString()) / n
        )
    return out


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
    ranges = bundled_ranges()
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
    grpc = grpc_bytes(d_rows, ranges)
    fid = fidelity(q_rows, d_rows, ranges)
    print(
        f"corpus {c.source} sha256 {c.sha256[:12]}; {len(docs)} documents, {len(queries)} queries"
    )
    print(
        "| format | HTTP bytes/vector | vs float JSON | gRPC bytes/vector if the worker quantized |"
    )
    print("|---|---:|---:|---:|")
    for encoding in FORMATS:
        precision = encoding.removesuffix("_base64")
        print(
            f"| {encoding} | {wire[encoding]:.0f} | {wire['float'] / wire[encoding]:.1f}x | "
            f"{grpc.get(precision, grpc['float32']):.0f} |"
        )
    print(f"(gRPC reply today, float32: {grpc['float32']:.0f} bytes/vector)")
    if end_to_end:
        print("gateway process CPU per vector, end to end (64 x 32-token inputs a request):")
        for encoding, us in end_to_end.items():
            print(f"  {encoding}: {us:.1f} µs ({us / end_to_end['float']:.2f}x float)")
    for key, value in fid.items():
        print(f"{key}: {value:.4f}")
    if args.out:
        figures = {"wire": wire, "grpc": grpc, "gateway_cpu": end_to_end, "fidelity": fid}
        args.out.write_text(json.dumps(figures, indent=1))
    return 0
