"""Quantized outputs: what each `encoding_format` sends for a float32 row, and the calibration
that fixes the int8/uint8 ranges of a model.

The arithmetic is sentence-transformers' `quantize_embeddings` (6.x), so vectors a client stored
from it compare with ours: int8/uint8 cut each dimension's calibrated [min, max] into 256 buckets
(values outside the range clip to the end buckets), binary/ubinary keep the sign bit of each
dimension, packed 8 a byte, most significant bit first (np.packbits), binary as int8 (byte - 128).
Quantization happens in the gateway, after chunks are joined and long inputs' windows averaged:
see docs/gateway.md ("Output formats") for the measurement behind that choice.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from embedfleet.common.arrays import FloatArray

Precision = Literal["float32", "int8", "uint8", "binary", "ubinary"]

#: encoding_format -> (precision, base64 of the row's little-endian bytes)
ENCODINGS: dict[str, tuple[Precision, bool]] = {
    "float": ("float32", False),
    "base64": ("float32", True),
    "int8": ("int8", False),
    "uint8": ("uint8", False),
    "binary": ("binary", False),
    "ubinary": ("ubinary", False),
    "int8_base64": ("int8", True),
    "uint8_base64": ("uint8", True),
    "binary_base64": ("binary", True),
    "ubinary_base64": ("ubinary", True),
}

#: the calibration file's name in a model directory ("stored with the model config")
CALIBRATION_FILE = "embedfleet_quantization.json"
CALIBRATION_KIND = "embedfleet.dev/quantization-calibration"
#: the calibration shipped for the bundled all-MiniLM-L6-v2 (its package directory is read-only)
BUNDLED_CALIBRATION = Path(__file__).with_name("minilm_quantization.json")


class CalibrationError(ValueError):
    """A calibration file that cannot be used (malformed, or for other dimensions)."""


def quantize(rows: FloatArray, precision: Precision, ranges: FloatArray | None) -> npt.NDArray[Any]:
    """[n, d] float32 rows in `precision`; `ranges` is [2, d] (min, max) for int8 and uint8."""
    if precision == "float32":
        return rows
    if precision in ("int8", "uint8"):
        if ranges is None:
            raise CalibrationError(f"{precision} needs calibration ranges")
        starts = ranges[0]
        steps = (ranges[1] - starts) / np.float32(255)
        steps = np.where(steps == 0, np.float32(1), steps)
        buckets: FloatArray = np.clip(np.floor((rows - starts) / steps), 0, 255)
        return (buckets - 128).astype(np.int8) if precision == "int8" else buckets.astype(np.uint8)
    bits: npt.NDArray[np.uint8] = np.packbits(rows > 0, axis=-1)
    return (bits - 128).astype(np.int8) if precision == "binary" else bits


def encode_rows(
    rows: FloatArray, encoding: str, ranges: FloatArray | None
) -> list[npt.NDArray[Any]] | list[str]:
    """Each row as the response's `embedding`: an array (orjson writes numbers) or base64."""
    precision, as_base64 = ENCODINGS[encoding]
    return encode_quantized(quantize(rows, precision, ranges), precision, as_base64)


def encode_quantized(
    values: npt.NDArray[Any], precision: Precision, as_base64: bool
) -> list[npt.NDArray[Any]] | list[str]:
    """Rows already in `precision`, as the response's `embedding` values."""
    if as_base64:
        # int8/uint8 are one byte per value; float32 little-endian as OpenAI's base64.
        little = values.astype("<f4", copy=False) if precision == "float32" else values
        return [base64.b64encode(r.tobytes()).decode() for r in little]
    return list(values)


def bytes_per_vector(precision: Precision, dimensions: int) -> int:
    """Raw bytes of one quantized row (before JSON or base64)."""
    if precision == "float32":
        return 4 * dimensions
    if precision in ("int8", "uint8"):
        return dimensions
    return math.ceil(dimensions / 8)


# --- calibration ---------------------------------------------------------------------------


def ranges_of(rows: FloatArray) -> FloatArray:
    """Per-dimension [min, max] of calibration rows, as sentence-transformers computes them."""
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise CalibrationError("calibration needs at least one [n, d] row")
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

    def for_dimensions(self, dimensions: int) -> FloatArray | None:
        return self.ranges.get(dimensions)

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


def parse_calibration(doc: Any, where: str) -> Calibration:
    if not isinstance(doc, dict) or doc.get("kind") != CALIBRATION_KIND:
        raise CalibrationError(f"{where}: not a calibration file (kind {CALIBRATION_KIND!r})")
    if doc.get("version") != 1:
        raise CalibrationError(f"{where}: unsupported calibration version {doc.get('version')!r}")
    ranges: dict[int, FloatArray] = {}
    for key, value in (doc.get("ranges") or {}).items():
        try:
            dims = int(key)
            lo = np.asarray(value["min"], dtype=np.float32)
            hi = np.asarray(value["max"], dtype=np.float32)
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(f"{where}: ranges[{key!r}] is malformed ({exc})") from None
        if lo.shape != (dims,) or hi.shape != (dims,):
            raise CalibrationError(f"{where}: ranges[{key!r}] must hold {dims} min and max values")
        if not (np.isfinite(lo).all() and np.isfinite(hi).all() and (lo <= hi).all()):
            raise CalibrationError(f"{where}: ranges[{key!r}] needs finite min <= max")
        ranges[dims] = np.stack([lo, hi])
    if not ranges:
        raise CalibrationError(f"{where}: no ranges")
    return Calibration(
        model=str(doc.get("model", "")),
        source=str(doc.get("source", "")),
        samples=int(doc.get("samples", 0)),
        ranges=ranges,
    )


def load_calibration(path: Path) -> Calibration:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"{path}: {exc}") from None
    return parse_calibration(doc, str(path))


def find_calibration(setting: str, model_dir: Path, bundled: bool) -> Calibration | None:
    """The file named by the setting, else the model directory's own, else (bundled model only)
    the one shipped with the gateway; None when there is none (int8/uint8 are then refused)."""
    if setting:
        return load_calibration(Path(setting))
    own = model_dir / CALIBRATION_FILE
    if own.is_file():
        return load_calibration(own)
    if bundled and BUNDLED_CALIBRATION.is_file():
        return load_calibration(BUNDLED_CALIBRATION)
    return None
