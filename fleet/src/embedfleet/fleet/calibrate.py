"""`embedfleet calibrate`: int8/uint8 ranges for a model, from a calibration set sent through a
running gateway, written as the calibration file the gateway reads (--quantization-file, or
embedfleet_quantization.json in the model directory; docs/gateway.md, "Output formats").

It asks the gateway for float vectors exactly as clients will get them (same model, pooling,
normalization and `dimensions`), so the ranges fit what is quantized later. Texts come one per line
from a file, or as a JSON array of strings.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from embedfleet.common.arrays import FloatArray

BATCH = 64
CALIBRATION_KIND = "embedfleet.dev/quantization-calibration"


def ranges_of(rows: FloatArray) -> FloatArray:
    """Per-dimension [min, max] of calibration rows, as sentence-transformers computes them."""
    out: FloatArray = np.stack([rows.min(axis=0), rows.max(axis=0)]).astype(np.float32)
    return out


@dataclass(frozen=True)
class Calibration:
    """int8/uint8 ranges of one model, per served dimension count (Matryoshka sizes differ)."""

    model: str
    #: what the ranges were computed from (a description; the file's reader shows it)
    source: str
    samples: int
    ranges: Mapping[int, FloatArray]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": CALIBRATION_KIND,
            "version": 1,
            "model": self.model,
            "source": self.source,
            "samples": self.samples,
            "ranges": {
                str(d): {"min": r[0].tolist(), "max": r[1].tolist()}
                for d, r in sorted(self.ranges.items())
            },
        }


def read_texts(path: Path) -> list[str]:
    raw = path.read_text()
    if path.suffix == ".json":
        doc = json.loads(raw)
        if not isinstance(doc, list) or not all(isinstance(t, str) for t in doc):
            raise SystemExit(f"{path}: expected a JSON array of strings")
        return [t for t in doc if t]
    return [line for line in raw.splitlines() if line.strip()]


def embed_all(
    client: httpx.Client, texts: Sequence[str], dimensions: int, input_type: str | None
) -> FloatArray:
    rows: list[FloatArray] = []
    for i in range(0, len(texts), BATCH):
        body: dict[str, object] = {
            "input": list(texts[i : i + BATCH]),
            "dimensions": dimensions,
            "truncate": True,
        }
        if input_type:
            body["input_type"] = input_type
        reply = client.post("/v1/embeddings", json=body)
        if reply.status_code != 200:
            raise SystemExit(f"the gateway answered {reply.status_code}: {reply.text}")
        data = sorted(reply.json()["data"], key=lambda d: d["index"])
        rows.append(np.asarray([d["embedding"] for d in data], dtype=np.float32))
    return np.concatenate(rows)


def calibrate(
    url: str,
    texts: Sequence[str],
    dimensions: Sequence[int],
    input_type: str | None = None,
    api_key: str = "",
) -> Calibration:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        model = str(client.get("/v1/models").json()["data"][0]["id"])
        ranges = {d: ranges_of(embed_all(client, texts, d, input_type)) for d in dimensions}
    return Calibration(
        model=model,
        source=f"{len(texts)} texts (input_type {input_type or 'default'}) via {url}",
        samples=len(texts),
        ranges=ranges,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="The gateway's base URL.")
    parser.add_argument(
        "--texts", required=True, type=Path, help="Calibration set: one text a line, or .json."
    )
    parser.add_argument(
        "--dimensions",
        required=True,
        help="Comma-separated dimension counts to calibrate (the full size, and any Matryoshka "
        "size clients will request with int8/uint8).",
    )
    parser.add_argument("--input-type", default=None, choices=("query", "document"))
    parser.add_argument("--api-key", default="", help="Bearer key, if the gateway wants one.")
    parser.add_argument(
        "--out", required=True, type=Path, help="Where to write embedfleet_quantization.json."
    )


def run(args: argparse.Namespace) -> None:
    texts = read_texts(args.texts)
    if not texts:
        raise SystemExit(f"{args.texts}: no texts")
    dims = [int(d) for d in str(args.dimensions).split(",") if d.strip()]
    result = calibrate(args.url, texts, dims, args.input_type, args.api_key)
    args.out.write_text(json.dumps(result.to_json(), indent=1) + "\n")
    print(f"wrote {args.out}: {result.model}, {len(texts)} texts, dimensions {dims}")
