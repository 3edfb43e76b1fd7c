"""Output quantization against sentence-transformers' own `quantize_embeddings`, byte for byte,
and the calibration file's rules."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from embedfleet.gateway.quantization import (
    BUNDLED_CALIBRATION,
    CALIBRATION_KIND,
    ENCODINGS,
    Calibration,
    CalibrationError,
    bytes_per_vector,
    encode_rows,
    find_calibration,
    load_calibration,
    parse_calibration,
    quantize,
    ranges_of,
)
from embedfleet.gateway.schemas import EncodingFormat

PRECISIONS = ("int8", "uint8", "binary", "ubinary")


def _rows(n: int, d: int, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    out: np.ndarray = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return out


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("dims", [384, 13, 8, 1])
def test_quantize_matches_sentence_transformers(precision: str, dims: int) -> None:
    calib = _rows(200, dims, seed=1)
    # Half the rows from the calibration distribution, plus rows past its ranges (clipping).
    rows = np.concatenate([_rows(50, dims, seed=2), 3 * _rows(5, dims, seed=3)])
    ranges = ranges_of(calib)
    want = quantize_embeddings(rows, precision, calibration_embeddings=calib)  # type: ignore[arg-type]
    assert isinstance(want, np.ndarray)
    got = quantize(rows, precision, ranges)  # type: ignore[arg-type]
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_binary_packs_the_sign_of_8_dimensions_a_byte_msb_first() -> None:
    row = np.array([[1, -1, 1, -1, -1, -1, -1, 1, 0.5]], dtype=np.float32)
    ubinary = quantize(row, "ubinary", None)
    assert ubinary.tolist() == [[0b10100001, 0b10000000]]
    assert quantize(row, "binary", None).tolist() == [[0b10100001 - 128, 0]]


def test_int8_without_ranges_is_an_error_not_a_guess() -> None:
    with pytest.raises(CalibrationError):
        quantize(_rows(2, 8), "int8", None)


def test_every_encoding_format_of_the_api_has_an_encoding() -> None:
    assert set(get_args(EncodingFormat)) == set(ENCODINGS)


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_base64_carries_the_same_bytes_as_the_json_numbers(encoding: str) -> None:
    rows = _rows(3, 24)
    ranges = ranges_of(_rows(100, 24, seed=5))
    precision, as_base64 = ENCODINGS[encoding]
    encoded = encode_rows(rows, encoding, ranges)
    want = quantize(rows, precision, ranges)
    dtype = "<f4" if precision == "float32" else want.dtype
    for got, row in zip(encoded, want, strict=True):
        if as_base64:
            assert isinstance(got, str)
            decoded = np.frombuffer(base64.b64decode(got), dtype=dtype)
            np.testing.assert_array_equal(decoded, row)
            assert len(base64.b64decode(got)) == bytes_per_vector(precision, 24)
        else:
            np.testing.assert_array_equal(np.asarray(got), row)


def test_calibration_file_round_trips_and_is_checked(tmp_path: Path) -> None:
    cal = Calibration("m", "test rows", 100, {24: ranges_of(_rows(100, 24))})
    path = tmp_path / "q.json"
    path.write_text(json.dumps(cal.to_json()))
    back = load_calibration(path)
    assert back.model == "m"
    assert back.samples == 100
    got = back.for_dimensions(24)
    assert got is not None
    np.testing.assert_array_equal(got, cal.ranges[24])
    assert back.for_dimensions(12) is None
    bad = [
        {"kind": "other", "version": 1, "ranges": {}},
        {"kind": CALIBRATION_KIND, "version": 2, "ranges": {"2": {"min": [0, 0], "max": [1, 1]}}},
        {"kind": CALIBRATION_KIND, "version": 1, "ranges": {}},
        {"kind": CALIBRATION_KIND, "version": 1, "ranges": {"3": {"min": [0, 0], "max": [1, 1]}}},
        {"kind": CALIBRATION_KIND, "version": 1, "ranges": {"2": {"min": [2, 0], "max": [1, 1]}}},
        {"kind": CALIBRATION_KIND, "version": 1, "ranges": {"2": {"min": [0, 0]}}},
    ]
    for doc in bad:
        with pytest.raises(CalibrationError):
            parse_calibration(doc, "x")


def test_calibration_lookup_order(tmp_path: Path) -> None:
    named = tmp_path / "named.json"
    named.write_text(
        json.dumps(Calibration("named", "", 1, {2: np.zeros((2, 2), dtype=np.float32)}).to_json())
    )
    model = tmp_path / "model"
    model.mkdir()
    assert find_calibration("", model, bundled=False) is None
    bundled = find_calibration("", model, bundled=True)
    assert bundled is not None
    assert bundled.for_dimensions(384) is not None
    (model / "embedfleet_quantization.json").write_text(
        json.dumps(Calibration("own", "", 1, {2: np.zeros((2, 2), dtype=np.float32)}).to_json())
    )
    own = find_calibration("", model, bundled=True)
    assert own is not None
    assert own.model == "own"
    chosen = find_calibration(str(named), model, bundled=True)
    assert chosen is not None
    assert chosen.model == "named"
    with pytest.raises(CalibrationError):
        find_calibration(str(tmp_path / "missing.json"), model, bundled=True)


def test_the_bundled_calibration_is_for_the_bundled_model() -> None:
    cal = load_calibration(BUNDLED_CALIBRATION)
    assert cal.model == "sentence-transformers/all-MiniLM-L6-v2"
    assert cal.samples >= 200
    assert set(cal.ranges) == {384}
