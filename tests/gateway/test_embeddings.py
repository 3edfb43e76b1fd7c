"""/v1/embeddings in every input form and encoding, truncation and windows, through the binary in
front of FAKE workers (fakes.py), whose row of a sequence is [first id, last id, length, worker
number]: each answer's rows, usage and the calls the workers saw are the values expected."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedfleet.common.modeldir import ModelDir, default_model_path
from embedfleet.testing.gateway import bundled_calibration

from .fakes import FakeWorker
from .helpers import LIMITS, Gateway, fake_fleet, run_binary

LONG = "the quick brown fox jumps over the lazy dog " * 40  # 362 tokens: over 256
HUGE = "lorem ipsum dolor sit amet " * 4000  # past the first window
IDS = list(range(1000, 1020))
CLS, SEP = 101, 102


def windows(*spans: tuple[float, float, float]) -> list[float]:
    """The fake's row of a split input: the mean of its windows' rows (first id, last id,
    length), each weighted by its length."""
    rows = np.array(spans, dtype=np.float64)
    return list(np.average(rows, axis=0, weights=rows[:, 2]))


#: [CLS] 254 words [SEP] and [CLS] the last 138 (32 shared) [SEP]
LONG_SPLIT = windows((CLS, SEP, 256), (CLS, SEP, 140))

#: name -> (body, prompt tokens, each row's [first, last, length] (None: not compared), calls)
CASES: dict[str, tuple[dict[str, Any], int, list[list[float]] | None, list[int]]] = {
    "string": ({"input": "Hello, world!"}, 6, [[CLS, SEP, 6]], [1]),
    "strings": ({"input": ["one", "two words", "three short words here"]}, 13,
                [[CLS, SEP, 3], [CLS, SEP, 4], [CLS, SEP, 6]], [3]),
    "token ids": ({"input": IDS}, 20, [[1000, 1019, 20]], [1]),
    "lists of token ids": ({"input": [IDS, [CLS, SEP], list(range(3000, 3050))]}, 72,
                           [[1000, 1019, 20], [CLS, SEP, 2], [3000, 3049, 50]], [3]),
    "base64 string": ({"input": "Hello, world!", "encoding_format": "base64"}, 6,
                      [[CLS, SEP, 6]], [1]),
    "base64 token ids": ({"input": [IDS, IDS[:3]], "encoding_format": "base64"}, 23,
                         [[1000, 1019, 20], [1000, 1002, 3]], [2]),
    "explicit float": ({"input": "x", "encoding_format": "float"}, 3, [[CLS, SEP, 3]], [1]),
    # the signs of [101, 102, 3, 0]: 1110 then zeros, as ubinary 224 and binary 224 - 128
    "binary": ({"input": ["a", "b c"], "encoding_format": "binary"}, 7, [[96], [96]], [2]),
    "ubinary": ({"input": ["a", "b c"], "encoding_format": "ubinary"}, 7, [[224], [224]], [2]),
    "binary base64": ({"input": "a", "encoding_format": "binary_base64"}, 3, [[96]], [1]),
    "ubinary base64 below the model's dimensions": (
        {"input": "a", "encoding_format": "ubinary_base64", "dimensions": 2}, 3, [[224]], [1]),
    "served model named": ({"input": "x", "model": "sentence-transformers/all-MiniLM-L6-v2"}, 3,
                           [[CLS, SEP, 3]], [1]),
    "model null": ({"input": "x", "model": None}, 3, [[CLS, SEP, 3]], [1]),
    "dimensions below the model's": ({"input": "x", "dimensions": 2}, 3, None, [1]),
    "dimensions equal to the model's": ({"input": "x", "dimensions": 4}, 3, [[CLS, SEP, 3]], [1]),
    "unicode": ({"input": ["héllo wörld", "日本語のテキスト", "emoji 🙂 text"]}, 21,
                [[CLS, SEP, 4], [CLS, SEP, 10], [CLS, SEP, 7]], [3]),
    "truncate right": ({"input": LONG, "truncate": True}, 256, [[CLS, SEP, 256]], [1]),
    "truncate left": ({"input": LONG, "truncate": True, "truncation_side": "left"}, 256,
                      [[CLS, SEP, 256]], [1]),
    "truncate huge": ({"input": [HUGE, "short"], "truncate": True}, 259,
                      [[CLS, SEP, 256], [CLS, SEP, 3]], [2]),
    "truncate huge left": ({"input": HUGE, "truncate": True, "truncation_side": "left"}, 256,
                           [[CLS, SEP, 256]], [1]),
    "truncate token ids right": ({"input": list(range(1, 400)), "truncate": True}, 256,
                                 [[1, 256, 256]], [1]),
    "truncate token ids left": ({"input": [list(range(1, 400))], "truncate": True,
                                 "truncation_side": "left"}, 256, [[144, 399, 256]], [1]),
    "input_type query (MiniLM has no prompts)": ({"input": "x", "input_type": "query"}, 3,
                                                 [[CLS, SEP, 3]], [1]),
    "user and unknown fields": ({"input": "x", "user": "u", "something": [1, 2]}, 3,
                                [[CLS, SEP, 3]], [1]),
    "split_long_inputs false": ({"input": "x", "split_long_inputs": False}, 3, [[CLS, SEP, 3]],
                                [1]),
    "split a long text": ({"input": LONG, "split_long_inputs": True}, 396, [LONG_SPLIT], [2]),
    "split one of several": ({"input": ["short", LONG, "also short"], "split_long_inputs": True},
                             403, [[CLS, SEP, 3], LONG_SPLIT, [CLS, SEP, 4]], [4]),
    # ids 1..256, then 225..399 (32 shared): token ids get no special tokens of their own
    "split long token ids": ({"input": list(range(1, 400)), "split_long_inputs": True}, 431,
                             [windows((1, 256, 256), (225, 399, 175))], [2]),
    "split nothing over the limit": ({"input": ["a", "b"], "split_long_inputs": True}, 6,
                                     [[CLS, SEP, 3], [CLS, SEP, 3]], [2]),
    "split with a prompt": ({"input": LONG, "split_long_inputs": True, "input_type": "query"},
                            396, [LONG_SPLIT], [2]),
    "split then quantized": ({"input": LONG, "split_long_inputs": True,
                              "encoding_format": "binary"}, 396, [[96]], [2]),
    "many inputs": ({"input": [f"text number {i}" for i in range(64)]}, 320,
                    [[CLS, SEP, 5]] * 64, [64]),
}  # fmt: skip


def rows_of(doc: dict[str, Any], encoding: str) -> list[list[float]]:
    """Each row as numbers, base64 decoded: float32 little-endian, quantized one byte a value."""
    out = []
    for entry in doc["data"]:
        value = entry["embedding"]
        if isinstance(value, str):
            raw = base64.b64decode(value)
            value = np.frombuffer(raw, "<f4").tolist() if encoding == "base64" else list(raw)
        out.append(value)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_each_input_form_and_encoding(fakes: Gateway, name: str) -> None:
    body, tokens, rows, calls = CASES[name]
    doc = fakes.ok("/v1/embeddings", body)
    assert doc["object"] == "list"
    assert doc["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert doc["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert [d["index"] for d in doc["data"]] == list(range(len(doc["data"])))
    assert {d["object"] for d in doc["data"]} == {"embedding"}
    got = rows_of(doc, body.get("encoding_format", "float"))
    if rows is not None:
        width = len(rows[0])
        assert len(got) == len(rows)
        np.testing.assert_allclose([g[:width] for g in got], rows, rtol=0, atol=1e-3)
    assert fakes.calls() == calls


def test_a_long_request_is_chunked_over_both_workers(fakes: Gateway) -> None:
    """Over min_chunk_tokens (512) per worker: 9,000 tokens in two chunks of 30 inputs."""
    doc = fakes.ok("/v1/embeddings", {"input": [list(range(1, 151))] * 60})
    assert len(doc["data"]) == 60
    assert fakes.calls() == [30, 30]


def test_chunks_are_reassembled_in_input_order(tmp_path: Path) -> None:
    """A 10-token budget: three 3-token inputs a chunk, 14 chunks over both workers, each row
    back at its input's index."""
    settings = {**LIMITS, "chunk_tokens": 10, "min_chunk_tokens": 1}
    with fake_fleet(settings, tmp_path / "gateway.log", FakeWorker, (0, 1)) as gateway:
        doc = gateway.ok("/v1/embeddings", {"input": [[i + 1] * 3 for i in range(40)]})
        rows = [d["embedding"] for d in doc["data"]]
        assert [int(r[0]) for r in rows] == list(range(1, 41))
        assert {int(r[2]) for r in rows} == {3}
        assert {int(r[3]) for r in rows} == {0, 1}
        assert doc["usage"] == {"prompt_tokens": 120, "total_tokens": 120}
        assert [w.calls != [] for w in gateway.workers] == [True, True]
        assert gateway.calls() == sorted([3] * 13 + [1])


def test_chunks_hold_chunk_seconds_of_a_slow_workers_work(tmp_path: Path) -> None:
    """Workers that measured 2 tokens/s each: with `--chunk-seconds 3`, 6-token chunks (two
    3-token inputs), where the 10-token budget alone would make 3-input chunks."""
    settings = {**LIMITS, "chunk_tokens": 10, "min_chunk_tokens": 1, "chunk_seconds": 3.0}

    def make(number: int) -> FakeWorker:
        # Its one queued token shows in the gauge once the probe read the capacity.
        return FakeWorker(number, capacity=2.0, queued_tokens=1)

    with fake_fleet(settings, tmp_path / "gateway.log", make) as gateway:
        gateway.queued_seconds_are(2 / 4)
        doc = gateway.ok("/v1/embeddings", {"input": [[i + 1] * 3 for i in range(40)]})
        assert [int(d["embedding"][0]) for d in doc["data"]] == list(range(1, 41))
        assert gateway.calls() == [2] * 20


def test_a_calibration_file_given_is_the_one_int8_and_uint8_use(tmp_path: Path) -> None:
    """--quantization-file with ranges [0, 255] at the fakes' 4 dimensions: the row
    [101, 102, 3, 0] is its own uint8 buckets, and those less 128 as int8."""
    ranges = {"4": {"min": [0.0] * 4, "max": [255.0] * 4}}
    doc = {"kind": "embedfleet.dev/quantization-calibration", "version": 1, "model": "m",
           "source": "the test", "samples": 1, "ranges": ranges}  # fmt: skip
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(doc))
    with fake_fleet({**LIMITS, "quantization_file": path}, tmp_path / "gateway.log") as gateway:
        for encoding, row in (("uint8", [101, 102, 3, 0]), ("int8", [-27, -26, -125, -128])):
            got = gateway.ok("/v1/embeddings", {"input": "x", "encoding_format": encoding})
            assert got["data"][0]["embedding"] == row
        error = gateway.error("/v1/embeddings", {"input": "x", "encoding_format": "int8",
                                                 "dimensions": 2}, 400)  # fmt: skip
        assert "has ranges for [4]" in error["message"]
    path.write_text(json.dumps({**doc, "ranges": {"4": {"min": [1.0] * 4, "max": [0.0] * 4}}}))
    done = run_binary("--workers", "127.0.0.1:9", "--quantization-file", str(path))
    assert done.returncode == 2
    assert str(path) in done.stderr


def test_a_real_workers_rows_cut_quantized_and_refused(null: Gateway, minilm: ModelDir) -> None:
    """The null engine's row of "Hello, world!" is [its tokens, their sum, the first, 0, ...]
    over MiniLM's 384 dimensions: cut by `dimensions` at the worker, quantized with the bundled
    calibration as sentence-transformers quantizes it."""
    from sentence_transformers.util.quantization import quantize_embeddings

    ids = minilm.tokenizer().encode("Hello, world!").ids
    row = np.zeros(384, dtype=np.float32)
    row[:3] = [len(ids), sum(ids), ids[0]]
    (got,) = rows_of(null.ok("/v1/embeddings", {"input": "Hello, world!"}), "float")
    assert got == row.tolist()
    cut = null.ok("/v1/embeddings", {"input": "Hello, world!", "dimensions": 8})
    assert rows_of(cut, "float") == [row[:8].tolist()]
    error = null.error("/v1/embeddings", {"input": "x", "dimensions": 10_000}, 400)
    assert error["message"] == "'dimensions' must be between 1 and 384 for this model; got 10000."
    ranges = json.loads(bundled_calibration().read_text())["ranges"]["384"]
    bounds = np.array([ranges["min"], ranges["max"]], dtype=np.float32)
    for precision in ("int8", "uint8", "binary", "ubinary"):
        want = quantize_embeddings(row[None, :], precision, ranges=bounds)
        doc = null.ok("/v1/embeddings", {"input": "Hello, world!", "encoding_format": precision})
        assert rows_of(doc, precision) == np.asarray(want).astype(int).tolist(), precision


def test_a_model_directorys_own_prompts_and_calibration(tmp_path: Path, minilm: ModelDir) -> None:
    """MiniLM's files with E5-style prompts (a `passage` prompt, `query` the default) and its own
    embedfleet_quantization.json at the fakes' 4 dimensions: `input_type` picks the prompt put
    before the text (`document` falls back to `passage`), token ids get none, and int8 uses the
    directory's ranges."""
    model = tmp_path / "model"
    model.mkdir()
    for f in default_model_path().iterdir():
        if f.is_file() and f.name != "config_sentence_transformers.json":
            (model / f.name).symlink_to(f)
    prompts = {"query": "query: ", "passage": "passage: "}
    (model / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": prompts, "default_prompt_name": "query"})
    )
    ranges = {"4": {"min": [0.0] * 4, "max": [255.0] * 4}}
    calibration = {"kind": "embedfleet.dev/quantization-calibration", "version": 1,
                   "model": "m", "source": "the test", "samples": 1, "ranges": ranges}  # fmt: skip
    (model / "embedfleet_quantization.json").write_text(json.dumps(calibration))
    tok = minilm.tokenizer()
    with fake_fleet({**LIMITS, "model": model}, tmp_path / "gateway.log") as gateway:
        for input_type, prompt in (
            ("query", "query: "),
            ("document", "passage: "),
            (None, "query: "),
        ):
            body = {"input": "x", **({"input_type": input_type} if input_type else {})}
            (row,) = rows_of(gateway.ok("/v1/embeddings", body), "float")
            assert row[2] == len(tok.encode(prompt + "x").ids), input_type
        ids = {"input": [7, 8, 9], "input_type": "query"}
        assert rows_of(gateway.ok("/v1/embeddings", ids), "float")[0][:3] == [7, 9, 3]
        int8 = gateway.ok("/v1/embeddings", {"input": [[101, 102]], "encoding_format": "int8"})
        assert int8["data"][0]["embedding"] == [101 - 128, 102 - 128, 2 - 128, -128]
